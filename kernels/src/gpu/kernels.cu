// braid GPU kernels, compiled at run time with NVRTC (see launch.rs).
// Every kernel takes its element count and guards its indices, so sizes that
// are not multiples of the block size are fine.

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
typedef unsigned char u8;

#define GRID_STRIDE(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)blockDim.x * gridDim.x)

extern "C" __global__ void gather_u8(const u8* in, const u32* idx, u8* out, u64 n) {
    GRID_STRIDE(i, n) { out[i] = in[idx[i]]; }
}

extern "C" __global__ void gather_u16(const unsigned short* in, const u32* idx, unsigned short* out, u64 n) {
    GRID_STRIDE(i, n) { out[i] = in[idx[i]]; }
}

extern "C" __global__ void gather_u32(const u32* in, const u32* idx, u32* out, u64 n) {
    GRID_STRIDE(i, n) { out[i] = in[idx[i]]; }
}

extern "C" __global__ void gather_u64(const u64* in, const u32* idx, u64* out, u64 n) {
    GRID_STRIDE(i, n) { out[i] = in[idx[i]]; }
}

extern "C" __global__ void iota_u32(u32* out, u64 n) {
    GRID_STRIDE(i, n) { out[i] = (u32)i; }
}

// SplitMix64's finaliser: the same mixing as the CPU side's hash of an i64.
__device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// part[i] = mix64(key) % nparts; counts[p] += 1 (counts zeroed by the caller).
extern "C" __global__ void hash_partition_i64(const i64* keys, u64 n, u32 nparts, u32* part, u32* counts) {
    GRID_STRIDE(i, n) {
        u32 p = (u32)(mix64((u64)keys[i]) % (u64)nparts);
        part[i] = p;
        atomicAdd(&counts[p], 1u);
    }
}

// Order-preserving maps to u64 (unsigned comparison = numeric order).
extern "C" __global__ void order_key_i64(const i64* in, u64* out, u64 n) {
    GRID_STRIDE(i, n) { out[i] = (u64)in[i] ^ 0x8000000000000000ULL; }
}

// Floats: negative values reversed, positives after them; every NaN last.
extern "C" __global__ void order_key_f64(const double* in, u64* out, u64 n) {
    GRID_STRIDE(i, n) {
        double x = in[i];
        u64 b = (u64)__double_as_longlong(x);
        if (x != x) {
            out[i] = 0xFFFFFFFFFFFFFFFFULL;
        } else if (b >> 63) {
            out[i] = ~b;
        } else {
            out[i] = b | 0x8000000000000000ULL;
        }
    }
}

// ---------------------------------------------------------------------------
// LSD radix sort, 8-bit digits, stable. Before the passes, one read of the
// keys finds their min and max (u64_min_max): bytes above the highest byte
// where they differ are the same in every key, and those passes are
// skipped. One pass:
//
//   radix_histogram:   tile b counts its digits       -> hist[d * B + b]
//   radix_row_totals:  keys per digit                 -> totals[d]
//   radix_scan_digits: block d scans row d of hist and adds the number of
//                      keys with a smaller digit      -> hist[d * B + b] =
//                      first output slot of tile b's digit-d keys
//   radix_scatter:     tile b ranks its keys by digit in shared memory
//                      (stable), then writes them out in digit order, so
//                      keys of one digit go to consecutive addresses
//
// A tile is RADIX_TILE consecutive keys; warp w of a tile owns the
// RADIX_ITEMS * 32 keys starting at w * RADIX_ITEMS * 32 (lane-striped), so
// warp order, then item order, then lane order is input order.
// ---------------------------------------------------------------------------

#define RADIX_THREADS 256
#define RADIX_ITEMS 16
#define RADIX_TILE (RADIX_THREADS * RADIX_ITEMS)
#define RADIX_WARPS (RADIX_THREADS / 32)

// out[0] = min, out[1] = max of the keys (out preset to {~0, 0}).
extern "C" __global__ void u64_min_max(const u64* keys, u64 n, u64* out) {
    u64 lo = 0xFFFFFFFFFFFFFFFFULL, hi = 0;
    GRID_STRIDE(i, n) {
        u64 k = keys[i];
        lo = k < lo ? k : lo;
        hi = k > hi ? k : hi;
    }
#pragma unroll
    for (u32 o = 16; o > 0; o >>= 1) {
        u64 a = __shfl_down_sync(0xFFFFFFFFu, lo, o);
        u64 b = __shfl_down_sync(0xFFFFFFFFu, hi, o);
        lo = a < lo ? a : lo;
        hi = b > hi ? b : hi;
    }
    if ((threadIdx.x & 31) == 0) {
        atomicMin(&out[0], lo);
        atomicMax(&out[1], hi);
    }
}

// totals[d] = sum of row d of hist (block d of 256).
extern "C" __global__ void radix_row_totals(const u32* hist, u32 nblocks, u32* totals) {
    __shared__ u32 part[32];
    const u32* row = hist + (u64)blockIdx.x * nblocks;
    u32 s = 0;
    for (u32 j = threadIdx.x; j < nblocks; j += blockDim.x) s += row[j];
#pragma unroll
    for (u32 o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xFFFFFFFFu, s, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 t = 0;
        for (u32 w = 0; w < (blockDim.x >> 5); w++) t += part[w];
        totals[blockIdx.x] = t;
    }
}

extern "C" __global__ void radix_histogram(const u64* keys, u64 n, u32 shift, u32* hist, u32 nblocks) {
    __shared__ u32 counts[256];
    counts[threadIdx.x] = 0;
    __syncthreads();
    u64 base = (u64)blockIdx.x * RADIX_TILE;
    for (u32 k = 0; k < RADIX_ITEMS; k++) {
        u64 i = base + (u64)k * RADIX_THREADS + threadIdx.x;
        if (i < n) {
            atomicAdd(&counts[(u32)(keys[i] >> shift) & 0xFF], 1u);
        }
    }
    __syncthreads();
    hist[(u64)threadIdx.x * nblocks + blockIdx.x] = counts[threadIdx.x];
}

// Exclusive scan of one value per thread across a block of blockDim.x
// threads (a multiple of 32, at most 1024); returns the block total too.
__device__ u32 block_exclusive_scan(u32 v, u32* total) {
    __shared__ u32 warp_sums[32];
    u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    u32 x = v;
#pragma unroll
    for (u32 o = 1; o < 32; o <<= 1) {
        u32 y = __shfl_up_sync(0xFFFFFFFFu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        u32 w = lane < nw ? warp_sums[lane] : 0;
#pragma unroll
        for (u32 o = 1; o < 32; o <<= 1) {
            u32 y = __shfl_up_sync(0xFFFFFFFFu, w, o);
            if (lane >= o) w += y;
        }
        warp_sums[lane] = w;  // inclusive
    }
    __syncthreads();
    u32 before = (warp == 0 ? 0 : warp_sums[warp - 1]) + x - v;
    *total = warp_sums[nw - 1];
    __syncthreads();
    return before;
}

// Block d (of 256): hist[d * B + b] becomes the first output slot of tile
// b's digit-d keys: (keys with digit < d) + (digit-d keys of tiles < b).
// `digit_counts` holds the 256 digit totals of this pass.
extern "C" __global__ void radix_scan_digits(u32* hist, u32 nblocks, const u32* digit_counts) {
    __shared__ u32 base_s;
    u32 d = blockIdx.x;
    if (threadIdx.x == 0) {
        u32 b = 0;
        for (u32 j = 0; j < d; j++) b += digit_counts[j];
        base_s = b;
    }
    __syncthreads();
    u32 run = base_s;
    u32* row = hist + (u64)d * nblocks;
    for (u32 start = 0; start < nblocks; start += blockDim.x) {
        u32 j = start + threadIdx.x;
        u32 v = j < nblocks ? row[j] : 0;
        u32 total;
        u32 before = block_exclusive_scan(v, &total);
        if (j < nblocks) row[j] = run + before;
        run += total;
    }
}

extern "C" __global__ void __launch_bounds__(RADIX_THREADS)
radix_scatter(const u64* keys, const u32* vals, u64 n, u32 shift,
              const u32* offsets, u32 nblocks, u64* keys_out, u32* vals_out) {
    __shared__ u64 s_buf[RADIX_TILE];            // keys, then payloads, in tile order
    __shared__ u8 s_digit[RADIX_TILE];           // digit of each slot
    __shared__ u32 wcount[RADIX_WARPS][256];     // per-warp digit counts, then offsets
    __shared__ u32 gbase[256];                   // global slot of the tile's slot 0 per digit
    u32 t = threadIdx.x, lane = t & 31, warp = t >> 5;
    u64 tile0 = (u64)blockIdx.x * RADIX_TILE;
    u64 wbase = tile0 + (u64)warp * (RADIX_ITEMS * 32);
    for (u32 w = 0; w < RADIX_WARPS; w++) wcount[w][t] = 0;
    __syncthreads();
    u64 key[RADIX_ITEMS];
    u32 pos[RADIX_ITEMS];
    u32 dig[RADIX_ITEMS];
    // 1. Rank within the warp, items in input order (no block barrier).
#pragma unroll
    for (u32 k = 0; k < RADIX_ITEMS; k++) {
        u64 i = wbase + (u64)k * 32 + lane;
        bool live = i < n;
        key[k] = live ? keys[i] : 0;
        u32 d = live ? ((u32)(key[k] >> shift) & 0xFF) : 256u;
        dig[k] = d;
        u32 peers = __match_any_sync(0xFFFFFFFFu, d);
        u32 lower = peers & ((1u << lane) - 1u);
        u32 old = live ? wcount[warp][d] : 0;
        __syncwarp();
        if (live && lower == 0) wcount[warp][d] = old + __popc(peers);
        __syncwarp();
        pos[k] = old + __popc(lower);
    }
    __syncthreads();
    // 2. Per digit t: warps' offsets, and the tile's digit offsets.
    u32 tot = 0;
    for (u32 w = 0; w < RADIX_WARPS; w++) {
        u32 c = wcount[w][t];
        wcount[w][t] = tot;
        tot += c;
    }
    u32 tile_total;
    u32 start = block_exclusive_scan(tot, &tile_total);
    for (u32 w = 0; w < RADIX_WARPS; w++) wcount[w][t] += start;
    gbase[t] = offsets[(u64)t * nblocks + blockIdx.x] - start;
    __syncthreads();
    // 3. Keys into tile slots in digit order, then out.
#pragma unroll
    for (u32 k = 0; k < RADIX_ITEMS; k++) {
        if (dig[k] < 256u) {
            u32 p = wcount[warp][dig[k]] + pos[k];
            pos[k] = p;
            s_buf[p] = key[k];
            s_digit[p] = (u8)dig[k];
        }
    }
    __syncthreads();
    u32 tile_n = (u32)(n - tile0 < (u64)RADIX_TILE ? n - tile0 : (u64)RADIX_TILE);
    for (u32 j = t; j < tile_n; j += RADIX_THREADS) {
        keys_out[gbase[s_digit[j]] + j] = s_buf[j];
    }
    __syncthreads();
    // 4. The payload the same way.
    u32* s_val = (u32*)s_buf;
#pragma unroll
    for (u32 k = 0; k < RADIX_ITEMS; k++) {
        if (dig[k] < 256u) {
            s_val[pos[k]] = vals[wbase + (u64)k * 32 + lane];
        }
    }
    __syncthreads();
    for (u32 j = t; j < tile_n; j += RADIX_THREADS) {
        vals_out[gbase[s_digit[j]] + j] = s_val[j];
    }
}

// out[q] = first index i in sorted[0..n) with sorted[i] >= queries[q].
extern "C" __global__ void lower_bound_u64(const u64* sorted, u64 n, const u64* queries, u64 m, u64* out) {
    GRID_STRIDE(q, m) {
        u64 x = queries[q], lo = 0, hi = n;
        while (lo < hi) {
            u64 mid = lo + (hi - lo) / 2;
            if (sorted[mid] < x) lo = mid + 1; else hi = mid;
        }
        out[q] = lo;
    }
}

// ---------------------------------------------------------------------------
// Casts of numeric columns. Type codes (NumType in cast.rs):
//   0 i8, 1 i16, 2 i32, 3 i64, 4 u8, 5 u16, 6 u32, 7 u64, 8 f32, 9 f64
// ---------------------------------------------------------------------------

__device__ __forceinline__ double load_as_f64(const void* in, u32 ty, u64 i) {
    switch (ty) {
        case 0: return (double)((const signed char*)in)[i];
        case 1: return (double)((const short*)in)[i];
        case 2: return (double)((const int*)in)[i];
        case 3: return (double)((const i64*)in)[i];
        case 4: return (double)((const u8*)in)[i];
        case 5: return (double)((const unsigned short*)in)[i];
        case 6: return (double)((const u32*)in)[i];
        case 7: return (double)((const u64*)in)[i];
        case 8: return (double)((const float*)in)[i];
        default: return ((const double*)in)[i];
    }
}

extern "C" __global__ void cast_to_f64(const void* in, u32 ty, double* out, u64 n) {
    GRID_STRIDE(i, n) { out[i] = load_as_f64(in, ty, i); }
}

// Integer types only (codes 0..7); u64 wraps like Rust's `as i64`.
extern "C" __global__ void cast_to_i64(const void* in, u32 ty, i64* out, u64 n) {
    GRID_STRIDE(i, n) {
        i64 v;
        switch (ty) {
            case 0: v = ((const signed char*)in)[i]; break;
            case 1: v = ((const short*)in)[i]; break;
            case 2: v = ((const int*)in)[i]; break;
            case 4: v = ((const u8*)in)[i]; break;
            case 5: v = ((const unsigned short*)in)[i]; break;
            case 6: v = ((const u32*)in)[i]; break;
            case 7: v = (i64)((const u64*)in)[i]; break;
            default: v = ((const i64*)in)[i]; break;
        }
        out[i] = v;
    }
}

// ---------------------------------------------------------------------------
// Rolling time-window aggregations over rows sorted by (key, ts).
//
//   level 1 entry b: the aggregate of rows [32b, 32b + 32)
//   level L entry b: the merge of level L-1 entries [32b, 32b + 32)
//
// A row's window [lo, hi) is found by galloping from the row (O(log w));
// its aggregate merges rows up to the first 32-aligned boundary, then whole
// blocks of rising levels, then falling levels down to single rows: at most
// 2 * 31 merges per level, O(log n) levels. Values are only merged, never
// subtracted, so nothing drifts (as on the CPU side). Window moments use a
// shift K (the window's first value): sums of (x - K) and (x - K)^2.
//
// Aggregation slots (Agg's declaration order): 0 sum, 1 mean, 2 min,
// 3 max, 4 count (i64, never null), 5 std, 6 var.
// Closed codes: 0 right, 1 both, 2 left, 3 none.
// ---------------------------------------------------------------------------

#define ROLL_FAN 32
#define ROLL_MAX_LEVELS 8
#define ROLL_NAN __longlong_as_double(0x7ff8000000000000LL)

struct RollAgg {
    double n, sum, comp, mean, m2, mn, mx;
};

__device__ __forceinline__ void two_sum(double a, double b, double* s, double* e) {
    double x = a + b;
    double bb = x - a;
    *e = (a - (x - bb)) + (b - bb);
    *s = x;
}

__device__ __forceinline__ double finish_sum(double s, double c) {
    return (s - s == 0.0) ? s + c : s;  // finite
}

// Level 1 from rows (valid may be null: no nulls).
extern "C" __global__ void roll_level_rows(const double* v, const u8* valid, RollAgg* out, u64 nout) {
    GRID_STRIDE(b, nout) {
        double n = 0, s = 0, c = 0, K = 0, s1 = 0, s2 = 0, mn = ROLL_NAN, mx = ROLL_NAN;
        for (u32 j = 0; j < ROLL_FAN; j++) {
            u64 i = b * ROLL_FAN + j;
            if (valid && !valid[i]) continue;
            double x = v[i];
            if (n == 0) K = x;
            n += 1;
            double e;
            two_sum(s, x, &s, &e);
            c += e;
            double d = x - K;
            s1 += d;
            s2 += d * d;
            mn = fmin(mn, x);
            mx = fmax(mx, x);
        }
        RollAgg a;
        a.n = n; a.sum = s; a.comp = c;
        a.mean = n > 0 ? K + s1 / n : 0;
        a.m2 = n > 0 ? s2 - s1 * s1 / n : 0;
        a.mn = mn; a.mx = mx;
        out[b] = a;
    }
}

// Level L from level L-1 (Chan et al.'s pairwise merge of moments).
extern "C" __global__ void roll_level_up(const RollAgg* in, RollAgg* out, u64 nout) {
    GRID_STRIDE(b, nout) {
        RollAgg a = in[b * ROLL_FAN];
        for (u32 j = 1; j < ROLL_FAN; j++) {
            RollAgg o = in[b * ROLL_FAN + j];
            if (o.n == 0) continue;
            if (a.n == 0) { a = o; continue; }
            double n = a.n + o.n, d = o.mean - a.mean, e;
            two_sum(a.sum, o.sum, &a.sum, &e);
            a.comp += o.comp + e;
            a.mean += d * (o.n / n);
            a.m2 += o.m2 + d * d * (a.n * o.n / n);
            a.n = n;
            a.mn = fmin(a.mn, o.mn);
            a.mx = fmax(a.mx, o.mx);
        }
        out[b] = a;
    }
}

struct RollAcc {
    double n, sum, comp, K, s1, s2, mn, mx;
};

__device__ __forceinline__ void acc_row(RollAcc* a, double x) {
    if (a->n == 0) a->K = x;
    a->n += 1;
    double e;
    two_sum(a->sum, x, &a->sum, &e);
    a->comp += e;
    double d = x - a->K;
    a->s1 += d;
    a->s2 += d * d;
    a->mn = fmin(a->mn, x);
    a->mx = fmax(a->mx, x);
}

__device__ __forceinline__ void acc_block(RollAcc* a, const RollAgg& o) {
    if (o.n == 0) return;
    if (a->n == 0) a->K = o.mean;
    a->n += o.n;
    double e;
    two_sum(a->sum, o.sum, &a->sum, &e);
    a->comp += o.comp + e;
    double d = o.mean - a->K;
    a->s1 += o.n * d;
    a->s2 += o.m2 + o.n * d * d;
    a->mn = fmin(a->mn, o.mn);
    a->mx = fmax(a->mx, o.mx);
}

// (key[j], ts[j]) < (k, x)
__device__ __forceinline__ bool roll_before(const i64* ts, const i64* key, u64 j, i64 k, i64 x) {
    if (key) {
        i64 kj = key[j];
        if (kj != k) return kj < k;
    }
    return ts[j] < x;
}

// (key[j], ts[j]) > (k, x)
__device__ __forceinline__ bool roll_after(const i64* ts, const i64* key, u64 j, i64 k, i64 x) {
    if (key) {
        i64 kj = key[j];
        if (kj != k) return kj > k;
    }
    return ts[j] > x;
}

// First j with !before(j, k, x), given !before(i, k, x): gallop back from i.
__device__ u64 roll_lower(const i64* ts, const i64* key, u64 i, i64 k, i64 x) {
    u64 hi = i, step = 1, lo;
    while (true) {
        if (step > hi) { lo = 0; break; }
        u64 p = hi - step;
        if (roll_before(ts, key, p, k, x)) { lo = p + 1; break; }
        hi = p;
        step <<= 1;
    }
    while (lo < hi) {  // answer in [lo, hi]; !before(hi)
        u64 mid = lo + (hi - lo) / 2;
        if (roll_before(ts, key, mid, k, x)) lo = mid + 1; else hi = mid;
    }
    return hi;
}

// First j > i with after(j, k, x) (or n), given !after(i, k, x).
__device__ u64 roll_upper(const i64* ts, const i64* key, u64 n, u64 i, i64 k, i64 x) {
    u64 lo = i + 1, step = 1, hi;  // !after(lo - 1)
    while (true) {
        u64 p = lo - 1 + step;
        if (p >= n) { hi = n; break; }
        if (roll_after(ts, key, p, k, x)) { hi = p; break; }
        lo = p + 1;
        step <<= 1;
    }
    while (lo < hi) {  // answer in [lo, hi]
        u64 mid = lo + (hi - lo) / 2;
        if (roll_after(ts, key, mid, k, x)) hi = mid; else lo = mid + 1;
    }
    return lo;
}

__device__ __forceinline__ i64 sat_sub(i64 a, i64 b) {  // b >= 0
    return a < (i64)0x8000000000000000LL + b ? (i64)0x8000000000000000LL : a - b;
}

// ptrs: [0, 8) level pointers (level L at ptrs[L], L >= 1), [8, 15) output
// values per slot, [15, 22) output validity per slot (null: not wanted).
extern "C" __global__ void rolling_window(const i64* ts, const i64* key, const double* v, const u8* valid,
                                          u64 n, u64 emit_from, i64 window, u32 closed,
                                          const u64* ptrs, u32 nlevels) {
    GRID_STRIDE(r, n - emit_from) {
        u64 i = emit_from + r;
        i64 t = ts[i];
        i64 k = key ? key[i] : 0;
        bool incl_hi = closed <= 1;
        bool incl_lo = closed == 1 || closed == 2;
        u64 hi = incl_hi ? roll_upper(ts, key, n, i, k, t) : roll_lower(ts, key, i, k, t);
        i64 start = sat_sub(t, window);
        bool empty = false;
        if (!incl_lo) {
            if (start == t) empty = true;  // window 0, open below: nothing
            else start += 1;
        }
        u64 lo = empty ? hi : roll_lower(ts, key, i, k, start);
        RollAcc a;
        a.n = 0; a.sum = 0; a.comp = 0; a.K = 0; a.s1 = 0; a.s2 = 0;
        a.mn = ROLL_NAN; a.mx = ROLL_NAN;
        if (lo < hi) {
            u64 p = lo, size = 1;
            u32 L = 0;
            // Rising: whole blocks of level L up to a boundary of level L+1.
            while (L + 1 < nlevels) {
                u64 up = size * ROLL_FAN;
                while ((p & (up - 1)) != 0 && p + size <= hi) {
                    if (L == 0) { if (!valid || valid[p]) acc_row(&a, v[p]); }
                    else acc_block(&a, ((const RollAgg*)ptrs[L])[p / size]);
                    p += size;
                }
                if ((p & (up - 1)) != 0 || p + up > hi) break;
                L++;
                size = up;
            }
            // Falling: whole blocks of each level while they fit.
            while (true) {
                while (p + size <= hi) {
                    if (L == 0) { if (!valid || valid[p]) acc_row(&a, v[p]); }
                    else acc_block(&a, ((const RollAgg*)ptrs[L])[p / size]);
                    p += size;
                }
                if (L == 0) break;
                L--;
                size /= ROLL_FAN;
            }
        }
        double cnt = a.n, s = finish_sum(a.sum, a.comp);
        double var = cnt >= 2 ? (a.s2 - a.s1 * a.s1 / cnt) / (cnt - 1) : 0;
        if (var < 0) var = 0;
        double outv[7] = {s, cnt > 0 ? s / cnt : 0, a.mn, a.mx, 0, sqrt(var), var};
        bool ok[7] = {cnt > 0, cnt > 0, cnt > 0, cnt > 0, true, cnt >= 2, cnt >= 2};
        for (u32 slot = 0; slot < 7; slot++) {
            if (!ptrs[8 + slot]) continue;
            if (slot == 4) {
                ((i64*)ptrs[8 + slot])[r] = (i64)cnt;
            } else {
                ((double*)ptrs[8 + slot])[r] = ok[slot] ? outv[slot] : 0.0;
            }
            if (ptrs[15 + slot]) ((u8*)ptrs[15 + slot])[r] = ok[slot] ? 1 : 0;
        }
    }
}
