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

extern "C" __global__ void iota_i64(i64* out, i64 base, u64 n) {
    GRID_STRIDE(i, n) { out[i] = base + (i64)i; }
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

// Floats: negative values reversed, positives after them; -0.0 ties with
// 0.0 and every NaN (of either sign) is last, as DuckDB and Polars order.
extern "C" __global__ void order_key_f64(const double* in, u64* out, u64 n) {
    GRID_STRIDE(i, n) {
        double x = in[i];
        u64 b = (u64)__double_as_longlong(x);
        if (x != x) {
            out[i] = 0xFFFFFFFFFFFFFFFFULL;
        } else if (x == 0.0) {
            out[i] = 0x8000000000000000ULL;
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
        // Lanes with the same digit (9 bits: dead lanes have digit 256),
        // from one ballot per bit (cheaper than match.any).
        u32 peers = 0xFFFFFFFFu;
#pragma unroll
        for (u32 bit = 0; bit < 9; bit++) {
            u32 on = __ballot_sync(0xFFFFFFFFu, (d >> bit) & 1u);
            peers &= ((d >> bit) & 1u) ? on : ~on;
        }
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
// The tile pass's geometry (launch.rs, `Build`): by default blocks of 256
// threads on 1024-row tiles, four blocks an SM (a barrier stalls a quarter
// of the SM's warps, not half: 6-7% faster on an H200 than two blocks of
// 512 on 2048 rows); the module for long windows keeps two blocks of 512
// on 2048-row tiles with a larger region (-DROLL_TILE=2048 ... ; 25-30%
// faster there than small blocks, whose region would not fit four an SM).
#ifndef ROLL_TILE
#define ROLL_TILE 1024  // output rows per block of the tile pass
#endif
#define ROLL_EXTRA 64     // rows past the tile (ties of its last rows)
// Region rows (halo up to ROLL_OFF, tile, extra): 1536 by default (a
// lookback of 448 rows), 3456 in the module for long windows (rolling.rs:
// it takes the tiles the default one leaves).
#ifndef ROLL_CAP
#define ROLL_CAP 1536
#endif
// Flags (tiles left to a later pass, `only`) are kept per 1024 output rows
// (the default tile) whatever the build, so every pass reads and writes
// the same array; a block of a larger tile covers ROLL_SUB of them.
#define ROLL_FLAG_TILE 1024
#define ROLL_SUB (ROLL_TILE / ROLL_FLAG_TILE)
static_assert(ROLL_TILE % ROLL_FLAG_TILE == 0, "a tile must cover whole flag tiles");
#define ROLL_OFF (ROLL_CAP - ROLL_TILE - ROLL_EXTRA)
#define ROLL_FIRST_HALO 64
#define ROLL_MAX_LEVELS 8
#define ROLL_NAN __longlong_as_double(0x7ff8000000000000LL)
// The tile pass's ts and key (8-byte) and window (4-byte) arrays are
// padded by one slot per 16 and per 32 entries: the window bounds give
// each thread 4 consecutive rows, and with the padding lanes 4 rows apart
// hit distinct banks, while a warp on consecutive rows (aligned to 16 or
// 32) still reads one contiguous span. Every other shared array is only
// read by lanes on consecutive rows and is not padded (padding would cost
// those reads a second wavefront whenever a pad falls inside a span).
#define ROLL_PT(k) ((k) + ((k) >> 4))
#define ROLL_PW(k) ((k) + ((k) >> 5))

// A level entry: count, sum (with its compensation), mean as a
// double-double (mean + mlo), sum of squared deviations, min, max.
struct RollAgg {
    double n, sum, comp, mean, mlo, m2, mn, mx;
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

// (h, l) += x, normalised (the mean's double-double update).
__device__ __forceinline__ void roll_mean_add(double* h, double* l, double x) {
    double s, e;
    two_sum(*h, x, &s, &e);
    e += *l;
    double r = s + e;
    *l = e - (r - s);
    *h = r;
}

// Welford's step: one value x into the count n (already counted), mean
// (mh + ml) and sum of squared deviations m2. Deviations are taken from the
// running mean, as on the CPU, never from a fixed shift: a shift far from
// the values (a huge first value) would overflow the squares where m2
// itself does not. The mean is a double-double: in one double, a mean of
// 1e9 rounds each step to 1.2e-7, which a spread of 1 feels at 1e-9 in the
// variance (and a spread of 1e-3 at 1e-5). Finite values whose m2
// overflows give +inf; an infinity or NaN gives NaN (inf * (inf - inf)),
// as on the CPU.
__device__ __forceinline__ void roll_welford(double n, double x, double* mh, double* ml, double* m2) {
    double d = (x - *mh) - *ml;
    roll_mean_add(mh, ml, d / n);
    *m2 += d * ((x - *mh) - *ml);
}

// Chan et al.'s merge of (nb, mb, m2b) into (na, ma, m2a); na > 0, nb > 0;
// means as double-doubles.
__device__ __forceinline__ void roll_chan(double na, double* mah, double* mal, double* m2a, double nb,
                                          double mbh, double mbl, double m2b) {
    double n = na + nb, d = (mbh - *mah) + (mbl - *mal);
    roll_mean_add(mah, mal, d * (nb / n));
    *m2a += m2b + d * (d * (na * nb / n));
}

// Level 1 from rows (valid may be null: no nulls).
extern "C" __global__ void roll_level_rows(const double* v, const u8* valid, RollAgg* out, u64 nout) {
    GRID_STRIDE(b, nout) {
        double n = 0, s = 0, c = 0, mean = 0, mlo = 0, m2 = 0, mn = ROLL_NAN, mx = ROLL_NAN;
        for (u32 j = 0; j < ROLL_FAN; j++) {
            u64 i = b * ROLL_FAN + j;
            if (valid && !valid[i]) continue;
            double x = v[i];
            n += 1;
            double e;
            two_sum(s, x, &s, &e);
            c += e;
            roll_welford(n, x, &mean, &mlo, &m2);
            mn = fmin(mn, x);
            mx = fmax(mx, x);
        }
        RollAgg a;
        a.n = n; a.sum = s; a.comp = c;
        a.mean = mean;
        a.mlo = mlo;
        a.m2 = m2;
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
            double e;
            two_sum(a.sum, o.sum, &a.sum, &e);
            a.comp += o.comp + e;
            roll_chan(a.n, &a.mean, &a.mlo, &a.m2, o.n, o.mean, o.mlo, o.m2);
            a.n += o.n;
            a.mn = fmin(a.mn, o.mn);
            a.mx = fmax(a.mx, o.mx);
        }
        out[b] = a;
    }
}

struct RollAcc {
    double n, sum, comp, mean, mlo, m2, mn, mx;
};

__device__ __forceinline__ void acc_row(RollAcc* a, double x) {
    a->n += 1;
    double e;
    two_sum(a->sum, x, &a->sum, &e);
    a->comp += e;
    roll_welford(a->n, x, &a->mean, &a->mlo, &a->m2);
    a->mn = fmin(a->mn, x);
    a->mx = fmax(a->mx, x);
}

__device__ __forceinline__ void acc_block(RollAcc* a, const RollAgg& o) {
    if (o.n == 0) return;
    double e;
    two_sum(a->sum, o.sum, &a->sum, &e);
    a->comp += o.comp + e;
    if (a->n == 0) {
        a->mean = o.mean;
        a->mlo = o.mlo;
        a->m2 = o.m2;
    } else {
        roll_chan(a->n, &a->mean, &a->mlo, &a->m2, o.n, o.mean, o.mlo, o.m2);
    }
    a->n += o.n;
    a->mn = fmin(a->mn, o.mn);
    a->mx = fmax(a->mx, o.mx);
}

// Where entry j of a row array lives: at j, or at ROLL_PT(j) in the tile
// pass's padded shared arrays (PAD). I is the index type (u64 in global
// memory, u32 in shared memory).
template <bool PAD, typename I>
__device__ __forceinline__ I roll_slot(I j) {
    return PAD ? ROLL_PT(j) : j;
}

// Whether a key column takes part: KM 0 asks the pointer at run time, 1
// says there is one, 2 that there is none (the tile pass is compiled once
// per case, so its searches carry no test).
template <int KM>
__device__ __forceinline__ bool roll_keyed(const i64* key) {
    return KM == 0 ? key != 0 : KM == 1;
}

// (key[j], ts[j]) < (k, x)
template <bool PAD = false, int KM = 0, typename I = u64>
__device__ __forceinline__ bool roll_before(const i64* ts, const i64* key, I j, i64 k, i64 x) {
    I p = roll_slot<PAD>(j);
    if (roll_keyed<KM>(key)) {
        i64 kj = key[p];
        if (kj != k) return kj < k;
    }
    return ts[p] < x;
}

// (key[j], ts[j]) > (k, x)
template <bool PAD = false, int KM = 0, typename I = u64>
__device__ __forceinline__ bool roll_after(const i64* ts, const i64* key, I j, i64 k, i64 x) {
    I p = roll_slot<PAD>(j);
    if (roll_keyed<KM>(key)) {
        i64 kj = key[p];
        if (kj != k) return kj > k;
    }
    return ts[p] > x;
}

// First j in [from, i] with !before(j, k, x), given !before(i, k, x):
// gallop back from i, then bisect.
template <bool PAD = false, int KM = 0, typename I = u64>
__device__ I roll_lower(const i64* ts, const i64* key, I from, I i, i64 k, i64 x) {
    I hi = i, step = 1, lo;
    while (true) {
        if (hi < from + step) { lo = from; break; }
        I p = hi - step;
        if (roll_before<PAD, KM>(ts, key, p, k, x)) { lo = p + 1; break; }
        hi = p;
        step <<= 1;
    }
    while (lo < hi) {  // answer in [lo, hi]; !before(hi)
        I mid = lo + (hi - lo) / 2;
        if (roll_before<PAD, KM>(ts, key, mid, k, x)) lo = mid + 1; else hi = mid;
    }
    return hi;
}

// First j in (i, end) with after(j, k, x), or end; given !after(i, k, x).
template <bool PAD = false, int KM = 0, typename I = u64>
__device__ I roll_upper(const i64* ts, const i64* key, I end, I i, i64 k, i64 x) {
    I lo = i + 1, step = 1, hi;  // !after(lo - 1)
    while (true) {
        I p = lo - 1 + step;
        if (p >= end) { hi = end; break; }
        if (roll_after<PAD, KM>(ts, key, p, k, x)) { hi = p; break; }
        lo = p + 1;
        step <<= 1;
    }
    while (lo < hi) {  // answer in [lo, hi]
        I mid = lo + (hi - lo) / 2;
        if (roll_after<PAD, KM>(ts, key, mid, k, x)) hi = mid; else lo = mid + 1;
    }
    return lo;
}

// How far back a row's window reaches (braid_kernels::window::Window):
// `len` units back (a fixed window: months 0), or `months` calendar months
// back on the civil date (the day clamped to the month's end, the time of
// day kept), then `len` units more, on a column with `per` units a day.
// Passed by value (the constant bank). The general pass tests `months`
// at run time (a branch every thread takes alike); the tile pass has
// separate entry points for each kind (CAL below).
struct RollWin {
    i64 len;
    i64 per;
    i64 qmin;    // i64::MIN / per, truncated (roll_cal_edge)
    double inv;  // 1.0 / per (roll_cal_lower)
    u32 months;
    u32 pad;
};

template <typename I>
__device__ __forceinline__ I roll_floor_div(I a, I b) {
    I q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

// Days since 1970-01-01 of a proleptic Gregorian date, and back (H.
// Hinnant's algorithms, as window.rs). I = i64 holds every day count of
// an i64 order column and its year; roll_days_back takes I = int (each
// division by a constant a multiply, not a 64-bit sequence) where the day
// count and the months allow.
template <typename I>
__device__ __forceinline__ I roll_days_from_civil(I y, u32 m, u32 d) {
    if (m <= 2) y -= 1;
    I era = roll_floor_div<I>(y, 400);
    I yoe = y - era * 400;
    I mp = (I)((m + 9) % 12);
    I doy = (153 * mp + 2) / 5 + (I)d - 1;
    I doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

template <typename I>
__device__ __forceinline__ void roll_civil_from_days(I z, I* y, u32* m, u32* d) {
    z += 719468;
    I era = roll_floor_div<I>(z, 146097);
    I doe = z - era * 146097;
    I yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    I doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    I mp = (5 * doy + 2) / 153;
    *d = (u32)(doy - (153 * mp + 2) / 5 + 1);
    *m = (u32)(mp < 10 ? mp + 3 : mp - 9);
    I yy = yoe + era * 400;
    *y = *m <= 2 ? yy + 1 : yy;
}

template <typename I>
__device__ __forceinline__ I roll_days_back_in(I day, u32 months) {
    I y;
    u32 m, d;
    roll_civil_from_days<I>(day, &y, &m, &d);
    I total = y * 12 + (I)(m - 1) - (I)months;
    I y2 = roll_floor_div<I>(total, 12);
    u32 m2 = (u32)(total - y2 * 12) + 1;
    bool leap = (y2 % 4 == 0 && y2 % 100 != 0) || y2 % 400 == 0;
    u32 dim = m2 == 2 ? (leap ? 29u : 28u) : (m2 == 4 || m2 == 6 || m2 == 9 || m2 == 11) ? 30u : 31u;
    return roll_days_from_civil<I>(y2, m2, d < dim ? d : dim);
}

// Day `day` moved `months` calendar months back, its day of month clamped
// to the target month's last. In 32 bits for days within 2^28 of 1970
// (735000 years) and fewer than 2^24 months: every intermediate (years
// times 12, eras times 146097) stays below 2^31.
__device__ i64 roll_days_back(i64 day, u32 months) {
    const i64 R = 1LL << 28;
    if (day > -R && day < R && months < (1u << 24)) return (i64)roll_days_back_in<int>((int)day, months);
    return roll_days_back_in<i64>(day, months);
}

// day * per + tod - len, given tod in [0, per), len >= 0 and day * per +
// tod <= i64::MAX (day is at most the row's own day); *none when that lies
// below i64::MIN (the window has no lower edge), computed without
// overflowing.
__device__ i64 roll_cal_edge(i64 day, i64 tod, i64 per, i64 qmin, i64 len, bool* none) {
    const i64 MIN = (i64)0x8000000000000000LL;
    *none = false;
    i64 q = qmin;  // MIN / per, truncated: q * per >= MIN
    i64 a;
    if (day >= q) {
        a = day * per + tod;
    } else if (day + 1 == q) {
        a = q * per + tod;
        if (a < MIN + per) { *none = true; return MIN; }
        a -= per;
    } else {
        *none = true;
        return MIN;
    }
    if (a < MIN + len) { *none = true; return MIN; }
    return a - len;
}

// A calendar window's edge t - w (reach: of the start of t's day, which
// bounds the edge of every later row; see Window::reach).
__device__ i64 roll_cal_lower(i64 t, const RollWin& w, bool reach, bool* none) {
    // t's day: for a day count (per 1) t itself; otherwise the quotient
    // in double, off by at most one from the floor (|t| / per carries less
    // than 0.1 of error for per >= 86400), then corrected (in u64: day *
    // per may pass i64::MAX by less than per, and t - day * per is in
    // [-per, 2 per) either way). An i64 division by a run-time divisor
    // costs about ten times as much.
    i64 day = w.per == 1 ? t : (i64)floor((double)t * w.inv);
    i64 tod = (i64)((u64)t - (u64)day * (u64)w.per);
    if (tod < 0) {
        day -= 1;
        tod += w.per;
    } else if (tod >= w.per) {
        day += 1;
        tod -= w.per;
    }
    if (reach) tod = 0;
    return roll_cal_edge(roll_days_back(day, w.months), tod, w.per, w.qmin, w.len, none);
}

// The smallest ts inside the window of a row at t (len >= 0); *empty
// when no row can be inside (window 0 with the lower end open). When
// t - w is below i64::MIN there is no lower cut at all. With `reach`, the
// least such ts of any row at t or later (a calendar window's edge can
// move back at a clamped month end; a fixed one's never does). CAL: the
// window may be a calendar one (months != 0); the tile pass compiles its
// fixed-window entry points without that code (with it their register
// allocation cost 3-6% at window 64 on an H200).
template <bool CAL = true>
__device__ __forceinline__ i64 roll_start(i64 t, const RollWin& w, bool incl_lo, bool* empty,
                                          bool reach = false) {
    const i64 MIN = (i64)0x8000000000000000LL;
    *empty = false;
    i64 st;
    if (!CAL || w.months == 0) {
        if (t < MIN + w.len) return MIN;
        st = t - w.len;
    } else {
        bool none;
        st = roll_cal_lower(t, w, reach, &none);
        if (none) return MIN;
    }
    if (!incl_lo) {
        if (st == t) *empty = true;
        else st += 1;
    }
    return st;
}

// Writes row r's outputs: slots per the ptrs table below.
__device__ __forceinline__ void roll_write(const u64* ptrs, u64 r, double cnt, double sum, double mean,
                                           double mn, double mx, double var) {
    if (var < 0) var = 0;
    double outv[7] = {sum, mean, mn, mx, 0, sqrt(var), var};
    bool ok[7] = {cnt > 0, cnt > 0, cnt > 0, cnt > 0, true, cnt >= 2, cnt >= 2};
#pragma unroll
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

// ptrs: [0, 8) level pointers (level L at ptrs[L], L >= 1), [8, 15) output
// values per slot, [15, 22) output validity per slot (null: not wanted).
// The general path: every output row of the tiles flagged in `only` (all
// rows when `only` is null).
extern "C" __global__ void rolling_window(const i64* ts, const i64* key, const double* v, const u8* valid,
                                          u64 n, u64 emit_from, const RollWin win, u32 closed,
                                          const u64* ptrs, u32 nlevels, const u32* only) {
    GRID_STRIDE(r, n - emit_from) {
        if (only && !only[r / ROLL_FLAG_TILE]) continue;
        u64 i = emit_from + r;
        i64 t = ts[i];
        i64 k = key ? key[i] : 0;
        bool incl_hi = closed <= 1;
        bool incl_lo = closed == 1 || closed == 2;
        u64 hi = incl_hi ? roll_upper(ts, key, n, i, k, t) : roll_lower(ts, key, (u64)0, i, k, t);
        bool empty;
        i64 start = roll_start(t, win, incl_lo, &empty);
        u64 lo = empty ? hi : roll_lower(ts, key, (u64)0, i, k, start);
        RollAcc a;
        a.n = 0; a.sum = 0; a.comp = 0; a.mean = 0; a.mlo = 0; a.m2 = 0;
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
        double var = cnt >= 2 ? a.m2 / (cnt - 1) : 0;
        roll_write(ptrs, r, cnt, s, cnt > 0 ? s / cnt : 0, a.mn, a.mx, var);
    }
}

// ---------------------------------------------------------------------------
// The fast path: one block per tile of ROLL_TILE output rows with the rows
// its windows reach in shared memory. Every per-row step is O(1) or one
// sparse-table level, and the same for all lanes of a warp: no lane loops
// over its window (the previous form did, and lost half its issue slots to
// lanes waiting on the longest window of their warp).
//
//   1 load     region = [ halo (up to ROLL_OFF rows) | tile | ROLL_EXTRA ]:
//              ts (and key), values (NaN marks a null); 64 halo rows
//              first, all of them when the first row's window reaches
//              further back (a calendar window: the edge of the start of
//              that row's day, below every later row's edge); values
//              checked as they arrive; each thread's loads issued together
//   2 bounds   no key column: a bucket index of the region's ts (first
//              row per bucket, roll_lb), then every row's lo and hi by
//              lookups, row-parallel (where a bucket is one ts value, the
//              region's span being under ROLL_NB, in 32 bits and one
//              index read each: 6% faster on an H200 at window 64,
//              where the general lookup's range checks, 64-bit shifts and
//              ts compares had been 15% of the kernel's instructions);
//              with a key column (or a gap in ts
//              too wide for the index) each thread walks 4 consecutive
//              rows: the first window by galloping, the rest by monotone
//              pointers (for a calendar window also back, at a clamped
//              month end); the least lo and greatest hi bound every later
//              pass. A calendar window's edge: civil-date arithmetic per
//              row (roll_cal_lower), in entry points of its own
//   3 sums     exclusive prefix sums over [least lo, greatest hi] in
//              double-double (odd-length thread chunks, their totals
//              scanned raked by one warp, see roll_block_scan);
//              per row: sum = P[hi] - P[lo]; non-null counts the same way
//              when there are nulls (hi - lo otherwise)
//   4 squares  the same scan over x^2 (taken exactly with an fma; its
//              chunk sums and block scan done in phase 3's pass, which
//              keeps each thread's offset: here only its writes); the
//              variance from both window sums in double-double
//   5 min/max  a sparse table over pairs of rows, built in place: level L
//              holds the min/max of pairs [b, b + 2^L); only even levels
//              are built, each from four entries of the one two below; a
//              window reads its first and last rows and, for the m pairs
//              wholly inside it, two entries of level floor(log2 m), or
//              four of the level below when that one is odd, as it is
//              built (against a table over rows: half the entries and a
//              level less)
//   outputs    row-parallel (tile row t + ROLL_THREADS k): every store is
//              coalesced
//
// Shared-memory banks: only ts/key (read 4 rows apart in phase 2) and the
// bounds (written 4 rows apart) are padded (ROLL_PT, ROLL_PW); every
// other array is read by lanes on consecutive rows, or at odd strides (the
// scan chunks), and is left unpadded (a pad inside a warp's span costs it a
// second wavefront: ncu showed ~2x the ideal wavefronts with one pad per
// 8 slots everywhere).
//
// Tile size: see ROLL_TILE. (The fifth session's kernel was 2-3% faster
// on an H100 with 2048 rows and 512 threads than with 1024 and 256; the
// nineteenth session's is 6-7% faster on an H200 with the smaller blocks.)
//
// Cost per output row: ~1.05 region rows loaded and scanned twice; two
// prefix differences; one reciprocal and one square root; log2(w / 2) / 2
// table passes over half as many entries as rows. Prefix differences are
// exact to ~2^-100 of the region's magnitude, which is why a tile that
// holds a NaN, an infinity, a value above 1e150, or values more than 2^40
// apart in magnitude, or whose windows reach past the region (long
// windows, long runs of one ts), is flagged and left to the general path
// (rolling_window with `only`).
// ---------------------------------------------------------------------------

#ifndef ROLL_THREADS
#define ROLL_THREADS 256
#endif
#ifndef ROLL_MINB
#define ROLL_MINB 4  // blocks an SM (caps registers at 64 a thread either way)
#endif
#define ROLL_R (ROLL_TILE / ROLL_THREADS)                          // rows per thread
// Min/max table entries (pairs of region rows) a thread builds per level,
// all at once in registers.
#define ROLL_PCH ((ROLL_CAP / 2 + 2 + ROLL_THREADS - 1) / ROLL_THREADS)
// Region slots (ts/key padded), P[end] included; even, so s_a and s_b together are
// ROLL_SLOTS 16-byte (min, max) pairs in the min/max phase.
#define ROLL_SLOTS (ROLL_PT(ROLL_CAP) + 2)
// Slots of the unpadded region arrays (values, prefix counts): every row
// and one past the last; even, so the arrays after them stay 16-byte
// aligned. Unpadded, they keep the default build's shared memory at four
// blocks within an SM's 196 KiB carve-out (1 KiB a block reserved), which
// leaves the L1 60 KiB instead of 28.
#define ROLL_XS (ROLL_CAP + 2)
static_assert(ROLL_CAP % 2 == 0, "the region arrays must stay 16-byte aligned");
#define ROLL_FULL 0xFFFFFFFFu
#define ROLL_LOADS 5  // rows a thread loads at once in the load phase
#define ROLL_INF __longlong_as_double(0x7ff0000000000000LL)
// The high word of 1e150's bit pattern (0x5F138D35_2E5096AF).
#define ROLL_HI_1E150 0x5F138D35u

// Min and max of two non-NaN values: a compare and a select (fmin and
// fmax also order NaNs, at about five times the instructions). In the
// table a null is +inf for min and -inf for max; NaN values never reach
// this pass (their tiles are flagged).
__device__ __forceinline__ double roll_min(double a, double b) { return b < a ? b : a; }
__device__ __forceinline__ double roll_max(double a, double b) { return b > a ? b : a; }

// (ah, al) += (bh, bl), double-double, normalised.
__device__ __forceinline__ void dd_acc(double* ah, double* al, double bh, double bl) {
    double s, e;
    two_sum(*ah, bh, &s, &e);
    e += *al + bl;
    double h = s + e;
    *al = e - (h - s);
    *ah = h;
}

// Adds one row's term to the unnormalised pair (s, e): x, or x^2 taken
// exactly (SQ).
template <bool SQ>
__device__ __forceinline__ void roll_term(double* s, double* e, double x) {
    double t, err;
    if (SQ) {
        double p = x * x;
        double pe = fma(x, x, -p);
        two_sum(*s, p, &t, &err);
        *e += err + pe;
    } else {
        two_sum(*s, x, &t, &err);
        *e += err;
    }
    *s = t;
}

// The bucket index of ts (tile pass, no key column): the region's rows
// [base, end), their ts from t0 to tl, fall in buckets b = (ts - t0) >>
// shift, and first[b] is the first row of bucket b or of a later one
// (first[nbk] = end), so bucket b's rows are [first[b], first[b + 1]).
// It lives in s_cnt (free until phase 3) as u16 entries: ROLL_NB buckets
// and the sentinel. A lookup is one index read and one ts compare when a
// bucket is one ts value (shift 0), a bisection of one bucket otherwise.
#define ROLL_NB (2 * ROLL_XS - 1)
// A row that is the first of more buckets than this (a gap in ts much
// wider than the region's typical step) leaves its tile to the walks,
// so no lane loops long filling the index.
#define ROLL_GAP 64

// Row j (as jv) is the first row of the g buckets from f on: f[0, g) = jv.
// Most rows start 0 to 3 buckets: predicated stores, not a loop whose trip
// count differs between lanes; a row that starts more than ROLL_GAP sets
// *gaps and writes nothing (its tile takes the walks).
__device__ __forceinline__ void roll_fill(unsigned short* f, u32 g, unsigned short jv, u32* gaps) {
    if (g <= 4) {
        if (g > 0) f[0] = jv;
        if (g > 1) f[1] = jv;
        if (g > 2) f[2] = jv;
        if (g > 3) f[3] = jv;
    } else if (g > ROLL_GAP) {
        *gaps = 1;
    } else {
#pragma unroll 1
        for (u32 q = 0; q < g; q++) f[q] = jv;
    }
}

// The first region row in [base, end) with ts >= q: base when q <= t0,
// end when q > tl.
__device__ __forceinline__ u32 roll_lb(const i64* s_ts, const unsigned short* first, u32 base, u32 end,
                                       i64 t0, i64 tl, u32 shift, i64 q) {
    if (q <= t0) return base;
    if (q > tl) return end;
    u32 b = (u32)(((u64)q - (u64)t0) >> shift);
    u32 j = first[b];
    if (s_ts[ROLL_PT(j)] >= q) return j;
    u32 lo = j + 1, hi = first[b + 1];  // the answer is in [lo, hi]
    while (lo < hi) {
        u32 mid = (lo + hi) >> 1;
        if (s_ts[ROLL_PT(mid)] < q) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// A thread's chunk of the region for the scans: rows [j0, j1), odd
// length (lanes c rows apart then touch distinct banks).
__device__ __forceinline__ void roll_chunk(u32 base, u32 end, u32* j0, u32* j1) {
    u32 c = (end - base + ROLL_THREADS - 1) / ROLL_THREADS;
    c |= 1;
    *j0 = base + threadIdx.x * c;
    *j1 = *j0 + c < end ? *j0 + c : end;
}

// Slot of thread t's entry in the raked block scan's arrays: one pad per
// 16 entries, so the 32 lanes that each walk 16 consecutive entries (the
// long-window module's 512 threads) touch distinct banks. With 256
// threads a lane walks 8, and lanes 2k and 2k + 1 share banks; a pad per
// lane's run removed those conflicts but was level in time on an H200
// (thirty-second session, BENCHMARKS.md), so the layout stays one.
#define ROLL_RK(t) ((t) + ((t) >> 4))
// The entries live in the prefix arrays (RollRake): a pair of doubles per
// entry in ph and in pl, a count in pc, each ROLL_SLOTS long and 16-byte
// aligned (ROLL_SLOTS is even).
static_assert(2 * ROLL_RK(ROLL_THREADS) <= ROLL_SLOTS, "raked scan entries exceed the prefix arrays");
static_assert(ROLL_SLOTS % 2 == 0, "the prefix arrays must stay 16-byte aligned");

// The tile pass's small shared state (one copy whichever body runs).
struct RollShared {
    u32 halo, levels, lmin, hmax;
    u32 amax, amin;  // high words of |x|'s bit patterns (order-preserving)
    u32 sgn;         // bit 0: a value below 0; bit 1: a value above 0
};

// The raked scan's entries: in the prefix arrays themselves (ph, pl, pc),
// which hold nothing until the scan's write pass.
struct RollRake {
    double2* a;
    double2* b;
    u32* c;
};

// Exclusive block scan of every thread's chunk totals: (h, l) with the
// count n (CNT), and a second pair (h2, l2) (TWO); this thread's offsets
// come back in (xh, xl, xn) and (x2h, x2l). Raked: each thread stores its
// totals, warp 0 (warp 1 for the second pair) scans 16 entries per lane in
// order, then the 32 lane totals by shuffles, and writes the offsets in
// place. Against a shuffle scan on every warp (9 double-double steps per
// thread and pair), 2 warps do ~37 steps each. Two __syncthreads.
template <bool CNT, bool TWO>
__device__ __forceinline__ void roll_block_scan(double h, double l, u32 n, double h2, double l2, RollRake rk,
                                                double* xh, double* xl, u32* xn, double* x2h, double* x2l) {
    const u32 PER = ROLL_THREADS / 32;
    u32 t = threadIdx.x, warp = t >> 5, lane = t & 31, p = ROLL_RK(t);
    rk.a[p] = make_double2(h, l);
    if (CNT) rk.c[p] = n;
    if (TWO) rk.b[p] = make_double2(h2, l2);
    __syncthreads();
    if (warp == 0 || (TWO && warp == 1)) {
        double2* a = warp == 0 ? rk.a : rk.b;
        bool cnt = CNT && warp == 0;
        u32* c = rk.c;
        u32 b0 = ROLL_RK(lane * PER);
        double ih = 0, il = 0;  // inclusive sums of this lane's entries, in place
        u32 in = 0;
#pragma unroll
        for (u32 j = 0; j < PER; j++) {
            double2 v = a[b0 + j];
            dd_acc(&ih, &il, v.x, v.y);
            a[b0 + j] = make_double2(ih, il);
            if (cnt) {
                in += c[b0 + j];
                c[b0 + j] = in;
            }
        }
        // The earlier lanes' totals: an inclusive shuffle scan, then one up.
        double th = ih, tl = il;
        u32 tn = in;
#pragma unroll
        for (u32 d = 1; d < 32; d <<= 1) {
            double oh = __shfl_up_sync(ROLL_FULL, th, d), ol = __shfl_up_sync(ROLL_FULL, tl, d);
            u32 on = __shfl_up_sync(ROLL_FULL, tn, d);
            if (lane >= d) {
                dd_acc(&th, &tl, oh, ol);
                tn += on;
            }
        }
        double oh = __shfl_up_sync(ROLL_FULL, th, 1), ol = __shfl_up_sync(ROLL_FULL, tl, 1);
        u32 on = __shfl_up_sync(ROLL_FULL, tn, 1);
        if (lane == 0) { oh = 0; ol = 0; on = 0; }
        // Entry j's offset: the lane's offset plus its entries before j
        // (from the top down, so entry j - 1 is still the inclusive sum).
#pragma unroll
        for (u32 j = PER - 1; j >= 1; j--) {
            double2 v = a[b0 + j - 1];
            double rh = oh, rl = ol;
            dd_acc(&rh, &rl, v.x, v.y);
            a[b0 + j] = make_double2(rh, rl);
            if (cnt) c[b0 + j] = on + c[b0 + j - 1];
        }
        a[b0] = make_double2(oh, ol);
        if (cnt) c[b0] = on;
    }
    __syncthreads();
    double2 o = rk.a[p];
    *xh = o.x;
    *xl = o.y;
    *xn = CNT ? rk.c[p] : 0;
    if (TWO) {
        double2 o2 = rk.b[p];
        *x2h = o2.x;
        *x2l = o2.y;
    }
    __syncthreads();  // every offset is read before the write pass reuses the entries
}

// Writes P[j] = (s, e) + the terms of rows [j0, j), for j in [j0, j1] (j1
// only when it is the region's end): pass 2 of a scan, from the thread's
// exclusive offset (s, e, n).
template <bool SQ, bool CNT, bool NUL, bool SH = false>
__device__ __forceinline__ void roll_scan_write(const double* s_x, double* ph, double* pl, u32* pc, u32 j0,
                                           u32 j1, u32 end, double s, double e, u32 n, double sh) {
    for (u32 j = j0; j < j1; j++) {
        ph[j] = s;
        pl[j] = e;
        if (CNT) pc[j] = n;
        double x = s_x[j];
        bool ok = !NUL || x == x;
        if (CNT) n += ok;
        roll_term<SQ>(&s, &e, ok ? (SH ? x - sh : x) : 0.0);
    }
    if (j0 < end && j1 == end) {
        ph[end] = s;
        pl[end] = e;
        if (CNT) pc[end] = n;
    }
}

// Exclusive prefix sums over region rows [base, end): P[j] = sum of the
// terms of rows [base, j) for j in [base, end], at slot j of (ph, pl) as
// an unnormalised pair; with CNT also pc[j] = non-null rows in [base, j).
// Nulls (NaN) add nothing; without NUL there are none (the check is
// skipped). With SQ2 the same block scan also yields this thread's offset
// for the scan of x^2 into (*q2h, *q2l) (roll_scan_write<true> writes that
// one later): both chunk sums in one pass and both block scans at once.
// The block scan's entries live in ph, pl, pc until the write pass.
// Callers sync before reading P.
template <bool CNT, bool NUL, bool SQ2, bool SH = false>
__device__ void roll_prefix(const double* s_x, double* ph, double* pl, u32* pc, u32 base, u32 end,
                            double sh, double* q2h, double* q2l) {
    u32 j0, j1;
    roll_chunk(base, end, &j0, &j1);
    double s = 0, e = 0, s2 = 0, e2 = 0;
    u32 n = 0;
    for (u32 j = j0; j < j1; j++) {
        double x = s_x[j];
        bool ok = !NUL || x == x;
        if (CNT) n += ok;
        roll_term<false>(&s, &e, ok ? x : 0.0);
        if (SQ2) roll_term<true>(&s2, &e2, ok ? (SH ? x - sh : x) : 0.0);
    }
    double xh, xl;
    u32 xn;
    double h = s + e, l = e - (h - s);
    double h2 = s2 + e2, l2 = e2 - (h2 - s2);
    roll_block_scan<CNT, SQ2>(h, l, n, h2, l2, RollRake{(double2*)ph, (double2*)pl, pc}, &xh, &xl, &xn, q2h, q2l);
    roll_scan_write<false, CNT, NUL>(s_x, ph, pl, pc, j0, j1, end, xh, xl, xn, 0.0);
}

// The plain scans (the tile pass's first form, `PL`): prefix sums in one
// double each, of x - sh and of (x - sh)^2 together, and the counts.
// Every result taken from them is checked against a bound of its
// rounding error (roll_plain_bounds) and kept only within ROLL_PL_TAU of
// itself; a short window that fails is summed directly from its rows
// (roll_direct_*), a longer one sends the tile to the double-double pass.
// Against the double-double scans: one add (or fma) a row instead of
// ~17 dependent operations, one scan for both sums instead of two, and
// 7% less time for the whole pass at ~43-row windows on an H200, 6%
// at ~200 (the checks and the direct sums take part of what the scans
// save; BENCHMARKS.md).
//
// Exclusive block scan of every thread's chunk totals (s, s2, n), raked as
// roll_block_scan: the pairs live in ra (the P1 array), counts in rc.
template <bool CNT, bool SQ>
__device__ __forceinline__ void roll_block_scan_pl(double s, double s2, u32 n, double2* ra, u32* rc,
                                                   double* xs, double* xs2, u32* xn) {
    const u32 PER = ROLL_THREADS / 32;
    u32 t = threadIdx.x, warp = t >> 5, lane = t & 31, p = ROLL_RK(t);
    ra[p] = make_double2(s, s2);
    if (CNT) rc[p] = n;
    __syncthreads();
    if (warp == 0) {
        u32 b0 = ROLL_RK(lane * PER);
        double i1 = 0, i2 = 0;
        u32 in = 0;
#pragma unroll
        for (u32 j = 0; j < PER; j++) {
            double2 v = ra[b0 + j];
            i1 += v.x;
            if (SQ) i2 += v.y;
            ra[b0 + j] = make_double2(i1, i2);
            if (CNT) {
                in += rc[b0 + j];
                rc[b0 + j] = in;
            }
        }
        double t1 = i1, t2 = i2;
        u32 tn = in;
#pragma unroll
        for (u32 d = 1; d < 32; d <<= 1) {
            double o1 = __shfl_up_sync(ROLL_FULL, t1, d);
            double o2 = SQ ? __shfl_up_sync(ROLL_FULL, t2, d) : 0.0;
            u32 on = CNT ? __shfl_up_sync(ROLL_FULL, tn, d) : 0u;
            if (lane >= d) {
                t1 += o1;
                if (SQ) t2 += o2;
                tn += on;
            }
        }
        double o1 = __shfl_up_sync(ROLL_FULL, t1, 1);
        double o2 = SQ ? __shfl_up_sync(ROLL_FULL, t2, 1) : 0.0;
        u32 on = CNT ? __shfl_up_sync(ROLL_FULL, tn, 1) : 0u;
        if (lane == 0) { o1 = 0; o2 = 0; on = 0; }
#pragma unroll
        for (u32 j = PER - 1; j >= 1; j--) {
            double2 v = ra[b0 + j - 1];
            ra[b0 + j] = make_double2(o1 + v.x, o2 + v.y);
            if (CNT) rc[b0 + j] = on + rc[b0 + j - 1];
        }
        ra[b0] = make_double2(o1, o2);
        if (CNT) rc[b0] = on;
    }
    __syncthreads();
    double2 o = ra[p];
    *xs = o.x;
    *xs2 = o.y;
    *xn = CNT ? rc[p] : 0;
    __syncthreads();
}

// P1[j] = sum of x - sh and P2[j] = sum of (x - sh)^2 (SQ) over region rows
// [base, j), for j in [base, end], and pc[j] the non-null rows (CNT); nulls
// (NaN) add nothing. Callers sync before reading them.
template <bool CNT, bool NUL, bool SQ, bool SH>
__device__ void roll_prefix_pl(const double* s_x, double* p1, double* p2, u32* pc, u32 base, u32 end, double sh) {
    u32 j0, j1;
    roll_chunk(base, end, &j0, &j1);
    double s = 0, s2 = 0;
    u32 n = 0;
    for (u32 j = j0; j < j1; j++) {
        double x = s_x[j];
        bool ok = !NUL || x == x;
        if (CNT) n += ok;
        double d = ok ? (SH ? x - sh : x) : 0.0;
        s += d;
        if (SQ) s2 = fma(d, d, s2);
    }
    double xs, xs2;
    u32 xn;
    roll_block_scan_pl<CNT, SQ>(s, s2, n, (double2*)p1, pc, &xs, &xs2, &xn);
    s = xs;
    s2 = xs2;
    n = xn;
    for (u32 j = j0; j < j1; j++) {
        p1[j] = s;
        if (SQ) p2[j] = s2;
        if (CNT) pc[j] = n;
        double x = s_x[j];
        bool ok = !NUL || x == x;
        if (CNT) n += ok;
        double d = ok ? (SH ? x - sh : x) : 0.0;
        s += d;
        if (SQ) s2 = fma(d, d, s2);
    }
    if (j0 < end && j1 == end) {
        p1[end] = s;
        if (SQ) p2[end] = s2;
        if (CNT) pc[end] = n;
    }
}


// The plain scans' error bound. Each prefix is a sum whose terms pass
// through at most ROLL_PL_DEPTH roundings (chunk, the raked lane's run,
// the shuffle levels, the offset, the write pass), so |P^[j] - P[j]| <=
// ROLL_PL_G * (the terms' magnitudes summed over the region), with
// ROLL_PL_G >= gamma(depth) = depth u / (1 - depth u), u = 2^-53; a
// difference of two prefixes is off by twice that plus its own rounding.
// Three more roundings cover each term's own: x - shift, and its square.
#define ROLL_PL_DEPTH (2 * (((ROLL_CAP + ROLL_THREADS - 1) / ROLL_THREADS) | 1) + 2 * (ROLL_THREADS / 32) + 8)
#define ROLL_U 1.1102230246251565e-16
#define ROLL_PL_G ((double)(ROLL_PL_DEPTH + 3) * ROLL_U)
// A plain result is kept when its bound is within 2^-36 of it.
#define ROLL_PL_TAU 1.4551915228366852e-11
// Windows of up to this many rows that fail the bound are summed directly.
#define ROLL_DIRECT 32

// Error bounds of window sums from the plain prefixes: e1 for sums of x -
// shift, e2 for sums of squares (sq; else 0). The terms' magnitudes summed
// over the region: with the squares (which are never negative: their sum
// is P2[end]) sqrt(rows * P2[end]) (Cauchy-Schwarz); without them (no
// shift) same-sign values sum to |P1[end]|, others to at most rows times
// the largest |x| (amax: the high word of its bit pattern).
__device__ __forceinline__ void roll_plain_bounds(const double* p1, const double* p2, u32 base, u32 end,
                                                  bool sq, u32 sgn, u32 amax, double* e1, double* e2) {
    const double up = 1.0 + 1e-12;  // the computed sums' own rounding
    double L = (double)(end - base);
    double a2 = sq ? p2[end] * up : 0.0;
    double a1 = sq          ? sqrt(L * a2) * up
                : sgn != 3u ? fabs(p1[end]) * up
                            : L * __hiloint2double((int)(amax + 1u), 0);
    *e1 = 2.0 * ROLL_PL_G * a1;
    *e2 = 2.0 * ROLL_PL_G * a2;
}

// The sum of a window's non-null values [lo, hi) from its rows, compensated
// (Neumaier), as exact as the CPU kernel's merges.
template <bool NUL>
__device__ __noinline__ double roll_direct_sum(const double* s_x, u32 lo, u32 hi) {
    double s = 0, c = 0;
    for (u32 j = lo; j < hi; j++) {
        double x = s_x[j];
        if (NUL && x != x) continue;
        double t = s + x;
        c += fabs(s) >= fabs(x) ? (s - t) + x : (x - t) + s;
        s = t;
    }
    return s + c;
}

// The sum of squared deviations of a window's c >= 2 non-null values from
// its rows: deviations about its first value, then about their mean (two
// passes; a window of equal values gives exactly 0, as on the CPU).
template <bool NUL>
__device__ __noinline__ double roll_direct_m2(const double* s_x, u32 lo, u32 hi, u32 c) {
    double x0 = ROLL_NAN, s = 0;
    for (u32 j = lo; j < hi; j++) {
        double x = s_x[j];
        if (NUL && x != x) continue;
        if (x0 != x0) x0 = x;
        s += x - x0;
    }
    double m = s / (double)c, q = 0;
    for (u32 j = lo; j < hi; j++) {
        double x = s_x[j];
        if (NUL && x != x) continue;
        double d = (x - x0) - m;
        q = fma(d, d, q);
    }
    return q;
}

// (h, l) = P[b] - P[a], normalised.
__device__ __forceinline__ void roll_diff(const double* ph, const double* pl, u32 a, u32 b,
                                          double* h, double* l) {
    u32 pa = a, pb = b;
    double s, e;
    two_sum(ph[pb], -ph[pa], &s, &e);
    e += pl[pb] - pl[pa];
    double r = s + e;
    *l = e - (r - s);
    *h = r;
}

// 1 / c for a count c >= 1: the hardware estimate and two Newton steps
// (each doubles the correct bits); within an ulp of 1 / c.
__device__ __forceinline__ double roll_rcp(double c) {
    double r;
    asm("rcp.approx.ftz.f64 %0, %1;" : "=d"(r) : "d"(c));
#pragma unroll
    for (int i = 0; i < 2; i++) r = fma(r, fma(-c, r, 1.0), r);
    return r;
}

// Flag tiles for n - emit_from output rows.
__device__ __forceinline__ u64 roll_flag_tiles(u64 n, u64 emit_from) {
    return (n - emit_from + ROLL_FLAG_TILE - 1) / ROLL_FLAG_TILE;
}

// Why a tile pass left a tile (its flag's value): a reason every tile
// pass of the default region has (a window past the region, ties past it,
// NaN, infinity, magnitudes 2^40 apart), for the long-window build; or a
// plain-scan result past its bound, for the double-double pass. That pass
// runs on the plain pass's flags (`only` == `flags`) and writes ROLL_LEFT
// over a tile it leaves; a tile it takes keeps ROLL_BOUND, which the
// long-window pass (mask ROLL_LEFT) skips. (A block reads its flags at its
// start and writes them after its load phase's barriers. Clearing them at
// the start instead took a barrier there that cost the plain pass 12%.)
#define ROLL_LEFT 1u
#define ROLL_BOUND 2u

// Leaves this block's rows to a later pass: its flag tiles, as many as
// exist, marked `why`; flagged[why - 1] counts the calls.
__device__ __forceinline__ void roll_flag(u32* flags, u32* flagged, u64 nft, u32 why = ROLL_LEFT) {
    for (u32 i = 0; i < ROLL_SUB; i++) {
        u64 f = (u64)blockIdx.x * ROLL_SUB + i;
        if (f < nft) flags[f] = why;
    }
    atomicAdd(flagged + (why - 1), 1u);
}

// Whether a later pass runs this block: one of its flag tiles is marked
// with a reason in `mask`.
__device__ __forceinline__ bool roll_only(const u32* only, u64 nft, u32 mask) {
    if (!only) return true;
    for (u32 i = 0; i < ROLL_SUB; i++) {
        u64 f = (u64)blockIdx.x * ROLL_SUB + i;
        if (f < nft && (only[f] & mask)) return true;
    }
    return false;
}

// Stores vals[k] as row o0 + t + T k of the output column at p (0: not
// wanted), for the rows the tile has: one address per column and thread,
// its rows at constant offsets from it (one test per column, not per row).
template <typename V>
__device__ __forceinline__ void roll_put(u64 p, u64 o0, u32 rows, const V (&vals)[ROLL_R]) {
    if (!p) return;
    V* q = (V*)p + o0 + threadIdx.x;
    if (rows == ROLL_TILE) {
#pragma unroll
        for (u32 k = 0; k < ROLL_R; k++) q[ROLL_THREADS * k] = vals[k];
    } else {
#pragma unroll
        for (u32 k = 0; k < ROLL_R; k++)
            if (threadIdx.x + ROLL_THREADS * k < rows) q[ROLL_THREADS * k] = vals[k];
    }
}

// The output pointers of the tile pass, by value (they live in the
// constant bank: no loads): values per slot, then validity per slot
// (slot order as in `ptrs` of rolling_window; 0 = not wanted).
struct RollOut {
    u64 p[14];
};

// Phase 2's block-wide results from each thread's: the highest table
// level any window needs (only when min/max are wanted), and [least lo,
// greatest hi], the rows the windows reach, which bound every scan and
// table level after it (the region also holds rows for the first halo
// guess and ties past the tile that no window uses).
__device__ __forceinline__ void roll_bounds_reduce(bool need_mm, u32 top, u32 lmn, u32 hmx, RollShared& sh) {
    u32 t = threadIdx.x;
    top = __reduce_max_sync(ROLL_FULL, top);
    if (need_mm && (t & 31) == 0 && top > 0) atomicMax(&sh.levels, top);
    u32 wl = __reduce_min_sync(ROLL_FULL, lmn);
    u32 wh = __reduce_max_sync(ROLL_FULL, hmx);
    if ((t & 31) == 0) {
        atomicMin(&sh.lmin, wl);
        atomicMax(&sh.hmax, wh);
    }
}

// The plain tile pass's short windows past their bound (`redo`, bit k: row
// t + T k's sum and mean; bit 4 + k: its var and std), summed from their
// rows and written over what the plain scans wrote there (this thread
// wrote those, so these land last). Out of line and after the rows'
// writes, where the unrolled loops' registers are free: called from
// inside those loops it made the pass spill (56 bytes, against 20) and
// cost 4% at the default window where no window needs it.
template <bool NUL>
__device__ __noinline__ void roll_redo(const double* s_x, const u32* s_cnt, const u32* s_win, u64 p0, u64 p1,
                                      u64 p5, u64 p6, u64 o0, u32 redo) {
    for (u32 k = 0; k < ROLL_R; k++) {
        if (!(redo & (17u << k))) continue;
        u32 r = threadIdx.x + ROLL_THREADS * k;
        u32 w = s_win[ROLL_PW(r)], lo = w & 0xFFFFu, hi = w >> 16;
        u32 c = NUL ? s_cnt[hi] - s_cnt[lo] : hi - lo;
        u64 o = o0 + r;
        if (redo & (1u << k)) {
            double s = roll_direct_sum<NUL>(s_x, lo, hi);
            if (p0) ((double*)p0)[o] = s;
            if (p1) ((double*)p1)[o] = s * roll_rcp((double)c);
        }
        if (redo & (16u << k)) {
            double v2 = roll_direct_m2<NUL>(s_x, lo, hi, c) * roll_rcp((double)c - 1.0);
            double var = v2 < 0 ? 0.0 : v2;
            if (p5) ((double*)p5)[o] = sqrt(var);
            if (p6) ((double*)p6)[o] = var;
        }
    }
}

// The tile pass for one case: KEY, a key column; NUL, a validity column.
template <bool KEY, bool NUL, bool CAL, bool PL>
__device__ __forceinline__ void roll_tile(const i64* ts, const i64* key, const double* v, const u8* valid,
                                          u64 n, u64 emit_from, const RollWin win, u32 closed,
                                          const RollOut& out, u32* flags, u32* flagged, RollShared& sh) {
    const u32 T = ROLL_THREADS, R = ROLL_R;
    constexpr int KM = KEY ? 1 : 2;
    extern __shared__ double smem[];
    double* s_x = smem;                          // values (NaN: null)
    double* s_a = s_x + ROLL_XS;                 // ts, then P (hi), then level min
    double* s_b = s_a + ROLL_SLOTS;              // key, then P (lo), then level max
    u32* s_cnt = (u32*)(s_b + ROLL_SLOTS);       // prefix counts of non-null rows
    u32* s_win = s_cnt + ROLL_XS;                // per tile row: lo | hi << 16
    i64* s_ts = (i64*)s_a;
    i64* s_key = (i64*)s_b;
    u32 &s_halo = sh.halo, &s_levels = sh.levels, &s_lmin = sh.lmin, &s_hmax = sh.hmax;
    u32 &s_amax = sh.amax, &s_amin = sh.amin, &s_sgn = sh.sgn;

    u32 t = threadIdx.x;
    u64 a = emit_from + (u64)blockIdx.x * ROLL_TILE;     // first output row
    u64 b = a + ROLL_TILE < n ? a + ROLL_TILE : n;        // end of output rows
    u64 e = b + ROLL_EXTRA < n ? b + ROLL_EXTRA : n;      // end of the region
    bool incl_hi = closed <= 1;
    bool incl_lo = closed == 1 || closed == 2;
    bool need1 = out.p[0] || out.p[1] || out.p[5] || out.p[6];   // sum, mean, std, var
    bool need2 = out.p[5] || out.p[6];                            // std, var
    bool need_mm = out.p[2] || out.p[3];                          // min, max
    if (t == 0) { s_amax = 0; s_amin = 0x7FEFFFFFu; s_sgn = 0; s_levels = 0; s_lmin = 0xFFFFFFFFu; s_hmax = 0; }

    // 1. Tile rows and the first halo guess; then the whole halo if the
    //    first row's window reaches further back.
    bool bad = false;
    // High words of |x| (order-preserving on magnitudes; 2^-20 relative is
    // plenty for the checks below): largest, and smallest non-zero.
    u32 amax = 0, amin = 0x7FEFFFFFu, sgn = 0;
    u64 h = a < ROLL_FIRST_HALO ? a : ROLL_FIRST_HALO;
    u64 lo_row = a - h;
    for (u32 pass = 0; pass < 2; pass++) {
        u64 hi_row = pass == 0 ? e : lo_row;  // pass 1: only the new halo rows
        u64 from = a - h;
        // Loads first, then stores: ROLL_LOADS rows' loads in flight per
        // thread instead of one.
        for (u64 j0 = from + t; j0 < hi_row; j0 += T * ROLL_LOADS) {
            i64 tv[ROLL_LOADS], kv[ROLL_LOADS];
            double xv[ROLL_LOADS];
            bool okv[ROLL_LOADS];
#pragma unroll
            for (u32 m = 0; m < ROLL_LOADS; m++) {
                u64 j = j0 + T * m;
                if (j < hi_row) {
                    okv[m] = !NUL || valid[j];
                    xv[m] = v[j];
                    tv[m] = ts[j];
                    kv[m] = KEY ? key[j] : 0;
                }
            }
#pragma unroll
            for (u32 m = 0; m < ROLL_LOADS; m++) {
                u64 j = j0 + T * m;
                if (j >= hi_row) break;
                u32 k = (u32)(ROLL_OFF + j - a), kt = ROLL_PT(k);
                double x = xv[m];
                s_ts[kt] = tv[m];
                if (KEY) s_key[kt] = kv[m];
                s_x[k] = okv[m] ? x : ROLL_NAN;
                if (okv[m]) {
                    u32 hw = (u32)__double2hiint(x) & 0x7FFFFFFFu;
                    // Sums: nothing above 1e150 (nor inf, nor NaN); min/max
                    // alone: no NaN (NaN marks nulls here).
                    if (need1 ? hw > ROLL_HI_1E150 : x != x) bad = true;
                    amax = max(amax, hw);
                    // A value too small for its high word to show (a
                    // subnormal) counts as high word 1, so the spread
                    // test below still sees it.
                    if (x != 0) amin = min(amin, max(hw, 1u));
                    sgn |= x < 0 ? 1u : x > 0 ? 2u : 0u;
                }
            }
        }
        lo_row = from;
        __syncthreads();
        if (t == 0) {
            // Can the window of row a, or of a later row (a calendar
            // window's edge moves back at most to the start of a's day),
            // start before the first loaded row?
            u32 f = (u32)(ROLL_OFF - h);
            i64 t0 = s_ts[ROLL_PT(ROLL_OFF)];
            i64 k0 = KEY ? s_key[ROLL_PT(ROLL_OFF)] : 0;
            bool empty0;
            i64 st = roll_start<CAL>(t0, win, incl_lo, &empty0, true);
            bool more = false;
            if (h < a && !empty0) more = !roll_before<true, KM>(s_ts, s_key, f, k0, st);
            s_halo = more ? 1u : 0u;
        }
        __syncthreads();
        if (!s_halo) break;
        u64 full = a < ROLL_OFF ? a : ROLL_OFF;
        if (pass == 1 || full == h) {
            // The window starts before anything this block can hold.
            if (t == 0) roll_flag(flags, flagged, roll_flag_tiles(n, emit_from));
            return;
        }
        h = full;
    }
    // Prefix differences lose digits of windows 2^40 below the region's
    // magnitude: such tiles go to the general pass.
    u32 wmax = __reduce_max_sync(ROLL_FULL, amax);
    u32 wmin = __reduce_min_sync(ROLL_FULL, amin);
    u32 wsgn = __reduce_or_sync(ROLL_FULL, sgn);
    if (need1 && (t & 31) == 0) {
        atomicMax(&s_amax, wmax);
        atomicMin(&s_amin, wmin);
        atomicOr(&s_sgn, wsgn);
    }
    __syncthreads();
    if (need1 && s_amax > 0 &&
        __longlong_as_double((long long)((u64)s_amax << 32)) >
            1099511627776.0 * __longlong_as_double((long long)((u64)s_amin << 32)))
        bad = true;
    if (__syncthreads_or(bad)) {
        if (t == 0) roll_flag(flags, flagged, roll_flag_tiles(n, emit_from));
        return;
    }

    // 2. Window bounds (region indices [lo, hi)) of every tile row, into
    //    s_win; the highest table level any needs. Without a key column
    //    through the bucket index of ts (roll_lb; rows row-parallel);
    //    with one, or when a gap in ts is too wide for the index, each
    //    thread walks 4 consecutive rows with monotone pointers.
    u32 base = (u32)(ROLL_OFF - h);           // region index of row a - h
    u32 end = (u32)(ROLL_OFF + (e - a));      // one past the region's last row
    u32 rows = (u32)(b - a);
    u64 o0 = a - emit_from;
    bool over = false;
    bool walks = KEY;
    if (!KEY) {
        // The index lives in s_cnt (free until phase 3) as u16 entries.
        unsigned short* first = (unsigned short*)s_cnt;
        i64 t0 = s_ts[ROLL_PT(base)], tl = s_ts[ROLL_PT(end - 1)];
        u64 span = (u64)tl - (u64)t0;
        u32 shift = span < ROLL_NB ? 0u : 64u - (u32)__clzll(span / ROLL_NB);
        u32 nbk = (u32)(span >> shift) + 1;  // <= ROLL_NB
        bool wide = false;
        if (shift == 0) {
            // One ts value a bucket: bucket numbers are ts - t0, which fit
            // in 32 bits (span < ROLL_NB), so the low words suffice.
            // Only the low words of ts are read (little-endian: the first
            // 4 bytes of each slot), through word offsets that advance by
            // a constant: T is a multiple of 16, so ROLL_PT(j + T) =
            // ROLL_PT(j) + ROLL_PT(T), and row j - 1's slot is 1 or 2 slots
            // below row j's (2 where j starts a group of 16).
            static_assert(ROLL_THREADS % 16 == 0, "the index build steps by whole pad groups");
            const u32* ts32 = (const u32*)s_ts;
            u32 t032 = (u32)t0, gaps = 0;
            u32 j = base + t;
            u32 wj = 2 * ROLL_PT(j), back = (j & 15) == 0 ? 4u : 2u;
#pragma unroll 1
            for (; j < end; j += T, wj += 2 * ROLL_PT(T)) {
                u32 bj = ts32[wj] - t032;
                u32 from = j == base ? 0u : ts32[wj - back] - t032 + 1;
                u32 g = bj + 1 - from;  // buckets row j is the first of
                roll_fill(first + from, g, (unsigned short)j, &gaps);
            }
            wide = gaps != 0;
        } else {
            u32 gaps = 0;
#pragma unroll 1
            for (u32 j = base + t; j < end; j += T) {
                u32 bj = (u32)(((u64)s_ts[ROLL_PT(j)] - (u64)t0) >> shift);
                u32 from = j == base ? 0u : (u32)(((u64)s_ts[ROLL_PT(j - 1)] - (u64)t0) >> shift) + 1;
                // Row j is the first of buckets [from, bj].
                roll_fill(first + from, bj + 1 - from, (unsigned short)j, &gaps);
            }
            wide = gaps != 0;
        }
        if (t == 0) first[nbk] = (unsigned short)end;
        walks = __syncthreads_or(wide);
        if (!walks) {
            const i64 MAX = (i64)0x7FFFFFFFFFFFFFFFLL;
            u32 top = 0, lmn = 0xFFFFFFFFu, hmx = 0;  // level, least lo, greatest hi
            if (!CAL && shift == 0) {
                // One ts value a bucket: first[d] is the lower bound of t0 + d
                // for d in [0, nbk] (nbk: past tl, the region's end). With d
                // = ts - t0 of the row, the upper end is first[d + 1]
                // (closed on the right) or first[d]; the lower end's query
                // t - w (+ 1 when open) lies c = w (or w - 1) below t, so
                // it is first[d - c] when d > c and the region's first row
                // otherwise (t - w at or below t0, or below i64::MIN).
                u32 t032 = (u32)t0;
                u64 wl = (u64)win.len;
                bool none = !incl_lo && wl == 0;                 // window 0, open below
                u64 c64 = incl_lo ? wl : (wl == 0 ? 0 : wl - 1);
                u32 c = c64 > 0xFFFFFFFFull ? 0xFFFFFFFFu : (u32)c64;
                // Row t + T k reads word 2 ROLL_PT(ROLL_OFF + t) + k * 2
                // ROLL_PT(T) of ts (T is a multiple of 16); the longest
                // window's rows give the level (floor(log2) is monotone).
                const u32* ts32 = (const u32*)s_ts;
                u32 w0 = 2 * ROLL_PT(ROLL_OFF + t), hi1 = incl_hi ? 1u : 0u, span = 0;
                bool tail = e < n;  // rows past the region exist
#pragma unroll
                for (u32 k = 0; k < R; k++) {
                    u32 r = t + T * k;
                    if (r < rows) {
                        u32 d = ts32[w0 + k * 2 * ROLL_PT(T)] - t032;
                        u32 hp = first[d + hi1];
                        u32 lp = none ? hp : (d > c ? (u32)first[d - c] : base);
                        if (hp == end && tail) over = true;  // ties past the region
                        s_win[ROLL_PW(r)] = lp | (hp << 16);
                        span = max(span, hp - lp);
                        lmn = min(lmn, lp);
                        hmx = max(hmx, hp);
                    }
                }
                if (span >= 2) top = 31u - __clz(span);
            } else {
#pragma unroll 1
                for (u32 k = 0; k < R; k++) {
                    u32 r = t + T * k;
                    if (r >= rows) break;
                    i64 ti = s_ts[ROLL_PT(ROLL_OFF + r)];
                    bool empty;
                    i64 st = roll_start<CAL>(ti, win, incl_lo, &empty);
                    u32 hp = incl_hi ? (ti == MAX ? end : roll_lb(s_ts, first, base, end, t0, tl, shift, ti + 1))
                                     : roll_lb(s_ts, first, base, end, t0, tl, shift, ti);
                    u32 lp = empty ? hp : roll_lb(s_ts, first, base, end, t0, tl, shift, st);
                    if (hp == end && e < n) over = true;  // ties past the region
                    s_win[ROLL_PW(r)] = lp | (hp << 16);
                    if (hp - lp >= 2) top = max(top, 31u - __clz(hp - lp));
                    lmn = min(lmn, lp);
                    hmx = max(hmx, hp);
                }
            }
            roll_bounds_reduce(need_mm, top, lmn, hmx, sh);
        }
    }
    if (walks) {
        u32 r0 = ROLL_OFF + t * R;            // region index of the first own row
        u32 nact = t * R >= rows ? 0 : (rows - t * R < R ? rows - t * R : R);
        u32 hp = 0, lp = 0, top = 0, lmn = 0xFFFFFFFFu;
#pragma unroll 1
        for (u32 j = 0; j < nact; j++) {
            u32 ri = r0 + j;
            i64 ti = s_ts[ROLL_PT(ri)];
            i64 ki = KEY ? s_key[ROLL_PT(ri)] : 0;
            bool empty;
            i64 st = roll_start<CAL>(ti, win, incl_lo, &empty);
            if (j == 0) {
                hp = incl_hi ? roll_upper<true, KM>(s_ts, s_key, end, ri, ki, ti) : roll_lower<true, KM>(s_ts, s_key, base, ri, ki, ti);
                lp = empty ? hp : roll_lower<true, KM>(s_ts, s_key, base, ri, ki, st);
            } else {
                if (incl_hi) {
                    if (hp < ri + 1) hp = ri + 1;
                    while (hp < end && !roll_after<true, KM>(s_ts, s_key, hp, ki, ti)) hp++;
                } else {
                    while (hp < ri && roll_before<true, KM>(s_ts, s_key, hp, ki, ti)) hp++;
                }
                if (empty) {
                    lp = hp;
                } else {
                    while (lp < ri && roll_before<true, KM>(s_ts, s_key, lp, ki, st)) lp++;
                    // A calendar window's edge can move back (a clamped
                    // month end), never below the region's first row (the
                    // halo check above reached back for it).
                    if (CAL)
                        while (lp > base && !roll_before<true, KM>(s_ts, s_key, lp - 1, ki, st)) lp--;
                }
            }
            if (hp == end && e < n) over = true;  // ties past the region
            s_win[ROLL_PW(t * R + j)] = lp | (hp << 16);
            if (hp - lp >= 2) top = max(top, 31u - __clz(hp - lp));
            // (Fixed windows: lp never moves back, the first is least.)
            if (CAL || j == 0) lmn = min(lmn, lp);
        }
        roll_bounds_reduce(need_mm, top, lmn, hp, sh);
    }
    if (__syncthreads_or(over)) {
        if (t == 0) roll_flag(flags, flagged, roll_flag_tiles(n, emit_from));
        return;
    }

    // 3. Counts and sums; sum, mean, count and the validity that only
    //    depends on the count. Tile row t + T k is this thread's k-th row.
    //    PL: plain prefixes, each result checked against its error bound
    //    (a short window past it summed from its rows; a longer one flags
    //    the tile, whose outputs the double-double pass then rewrites).
    base = s_lmin;
    end = s_hmax;
    u32 cnt[ROLL_R];
    double s1h[ROLL_R], s1l[ROLL_R];
    double q2h = 0, q2l = 0;  // this thread's offset in the scan of x^2
    // When every non-zero value of the region has one sign and they lie
    // within a factor of 2 of each other (high words less than one
    // exponent step apart), the squares are summed about the first valid
    // value of the tile's first 32 rows (the same in every warp): x - shift
    // is then exact (Sterbenz), and the variance of data far from 0 with a
    // small spread keeps its digits (about 0, a mean of 1e9 and a spread of
    // 1e-3 lost 1e-8 of it). Otherwise about 0, where no digits are lost
    // to an inexact x - shift.
    // The plain scans (PL) take any shift (their bounds count what x -
    // shift rounds away): the mean of those rows' valid values, which
    // makes the squares' sum, and so its error bound, small next to the
    // variance of data far from 0 (a shift of 0 left windows of ~11 rows
    // of values in [0, 1000) to the direct sums in one row of three).
    // Every lane of every warp gets the same bits (a butterfly of the same
    // values in the same order).
    double shift = 0.0;
    if (PL && need2) {
        u32 j = ROLL_OFF + (t & 31);
        double xj = j < end ? s_x[j] : ROLL_NAN;
        bool okj = xj == xj;
        u32 m = __ballot_sync(ROLL_FULL, okj);
        double sum = okj ? xj : 0.0;
#pragma unroll
        for (u32 d = 16; d >= 1; d >>= 1) sum += __shfl_xor_sync(ROLL_FULL, sum, d);
        shift = m ? sum / (double)__popc(m) : 0.0;
    } else if (need2 && s_sgn != 3u && s_amax > 0 && s_amax - s_amin < 0x100000u) {
        u32 j = ROLL_OFF + (t & 31);
        double xj = j < end ? s_x[j] : ROLL_NAN;
        u32 m = __ballot_sync(ROLL_FULL, xj == xj);
        shift = m ? __shfl_sync(ROLL_FULL, xj, __ffs(m) - 1) : 0.0;
    }
    bool worse = false;  // (PL) a result past its bound: the tile goes to the double-double pass
    // (PL) Short windows past their bound, for `roll_redo`: bit k the sum
    // of row k, bit 4 + k its squares.
    u32 redo = 0;
    double e1 = 0, e2 = 0;
    if (PL && (need1 || NUL)) {
        if (need2 && shift != 0.0) roll_prefix_pl<NUL, NUL, true, true>(s_x, s_a, s_b, s_cnt, base, end, shift);
        else if (need2) roll_prefix_pl<NUL, NUL, true, false>(s_x, s_a, s_b, s_cnt, base, end, 0.0);
        else roll_prefix_pl<NUL, NUL, false, false>(s_x, s_a, s_b, s_cnt, base, end, 0.0);
        __syncthreads();
        if (need1) roll_plain_bounds(s_a, s_b, base, end, need2, s_sgn, s_amax, &e1, &e2);
    } else if (need1 || NUL) {
        // (Shifted or not as separate instances: the subtraction in the
        // scans cost 3.6% at window 64 on an H100 where it was 0.)
        if (need2 && shift != 0.0) roll_prefix<NUL, NUL, true, true>(s_x, s_a, s_b, s_cnt, base, end, shift, &q2h, &q2l);
        else if (need2) roll_prefix<NUL, NUL, true>(s_x, s_a, s_b, s_cnt, base, end, 0.0, &q2h, &q2l);
        else roll_prefix<NUL, NUL, false>(s_x, s_a, s_b, s_cnt, base, end, 0.0, &q2h, &q2l);
        __syncthreads();
    }
    u8 ok1[ROLL_R];
#pragma unroll
    for (u32 k = 0; k < R; k++) {
        u32 r = t + T * k;
        cnt[k] = 0;
        s1h[k] = 0;
        s1l[k] = 0;
        if (r < rows) {
            u32 w = s_win[ROLL_PW(r)], lo = w & 0xFFFFu, hi = w >> 16;
            u32 c = NUL ? s_cnt[hi] - s_cnt[lo] : hi - lo;
            if (need1 && c > 0) {
                if (PL) {
                    double d1 = s_a[hi] - s_a[lo];
                    double s = fma(shift, (double)c, d1);
                    if (!(e1 + ROLL_U * fabs(d1) <= ROLL_PL_TAU * fabs(s))) {
                        if (hi - lo <= ROLL_DIRECT) redo |= 1u << k;
                        else worse = true;
                    }
                    s1h[k] = s;
                } else {
                    roll_diff(s_a, s_b, lo, hi, &s1h[k], &s1l[k]);
                }
            }
            cnt[k] = c;
        }
        ok1[k] = cnt[k] > 0;
    }
    roll_put(out.p[0], o0, rows, s1h);
    if (out.p[1]) {
        double mean[ROLL_R];
#pragma unroll
        for (u32 k = 0; k < R; k++) mean[k] = cnt[k] > 0 ? s1h[k] * roll_rcp((double)cnt[k]) : 0.0;
        roll_put(out.p[1], o0, rows, mean);
    }
    if (out.p[4]) {
        i64 c64[ROLL_R];
#pragma unroll
        for (u32 k = 0; k < R; k++) c64[k] = cnt[k];
        roll_put(out.p[4], o0, rows, c64);
    }
#pragma unroll
    for (u32 slot = 7; slot <= 10; slot++) roll_put(out.p[slot], o0, rows, ok1);
    if (out.p[11]) {
        u8 one[ROLL_R];
#pragma unroll
        for (u32 k = 0; k < R; k++) one[k] = 1;
        roll_put(out.p[11], o0, rows, one);
    }

    // 4. Sums of squares: var = (S2 - S1 * (S1 / c)) / (c - 1), both sums
    //    about the shift; from the plain prefixes (PL), or all of it in
    //    double-double but the last step.
    if (need2) {
        if (!PL) {
            __syncthreads();  // every read of the first prefix is done
            u32 j0, j1;
            roll_chunk(base, end, &j0, &j1);
            if (shift != 0.0) roll_scan_write<true, false, NUL, true>(s_x, s_a, s_b, s_cnt, j0, j1, end, q2h, q2l, 0, shift);
            else roll_scan_write<true, false, NUL>(s_x, s_a, s_b, s_cnt, j0, j1, end, q2h, q2l, 0, 0.0);
            __syncthreads();
        }
        double var[ROLL_R];
        u8 ok2[ROLL_R];
#pragma unroll
        for (u32 k = 0; k < R; k++) {
            u32 c = cnt[k];  // 0 past the tile's rows
            ok2[k] = c >= 2;
            var[k] = 0;
            if (ok2[k]) {
                u32 w = s_win[ROLL_PW(t + T * k)], lo = w & 0xFFFFu, hi = w >> 16;
                double cd = (double)c, rc = roll_rcp(cd);
                double m2;
                if (PL) {
                    // m2 = S2 - S1 (S1 / c), both about the shift. Its bound:
                    // S2's, S1's carried through S1^2 / c, and the last steps'.
                    double d1 = s_a[hi] - s_a[lo], s2 = s_b[hi] - s_b[lo];
                    double q = d1 * rc;
                    m2 = fma(-d1, q, s2);
                    double ad1 = fabs(d1), f1 = e1 + ROLL_U * ad1;
                    double bound = e2 + ROLL_U * s2 + (2.0 * ad1 + f1) * f1 * rc + 4.0 * ROLL_U * (ad1 * fabs(q) + fabs(m2));
                    if (!(bound <= ROLL_PL_TAU * m2)) {
                        if (hi - lo <= ROLL_DIRECT) redo |= 16u << k;
                        else worse = true;
                    }
                } else {
                    double s2h, s2l;
                    roll_diff(s_a, s_b, lo, hi, &s2h, &s2l);
                    // S1 about the shift: S1 - shift * c (taken exactly).
                    double d1h = s1h[k], d1l = s1l[k];
                    if (shift != 0.0) {
                        double p = shift * cd, pe = fma(shift, cd, -p), a, ae;
                        two_sum(s1h[k], -p, &a, &ae);
                        ae += s1l[k] - pe;
                        d1h = a + ae;
                        d1l = ae - (d1h - a);
                    }
                    double qh = d1h * rc;                         // S1 / c ...
                    double ql = (fma(-qh, cd, d1h) + d1l) * rc;   // ... and its remainder
                    double p = d1h * qh;                          // S1 * (S1 / c)
                    double pe = fma(d1h, qh, -p) + (d1h * ql + d1l * qh);
                    double m, me;
                    two_sum(s2h, -p, &m, &me);
                    me += s2l - pe;
                    m2 = m + me;
                }
                double v2 = m2 * roll_rcp(cd - 1.0);
                var[k] = v2 < 0 ? 0.0 : v2;
            }
        }
        if (out.p[5]) {
            double sd[ROLL_R];
#pragma unroll
            for (u32 k = 0; k < R; k++) sd[k] = sqrt(var[k]);
            roll_put(out.p[5], o0, rows, sd);
        }
        roll_put(out.p[6], o0, rows, var);
        roll_put(out.p[12], o0, rows, ok2);
        roll_put(out.p[13], o0, rows, ok2);
    }
    if (PL && redo) roll_redo<NUL>(s_x, s_cnt, s_win, out.p[0], out.p[1], out.p[5], out.p[6], o0, redo);
    // (Every thread that saw one flags the tile: the writes are the same.)
    if (PL && worse) roll_flag(flags, flagged, roll_flag_tiles(n, emit_from), ROLL_BOUND);
    if (!need_mm) return;

    // 5. Min and max through a table over pairs of rows (pair b: region
    //    slots 2b and 2b + 1). A window [lo, hi) is its first and last rows
    //    (read from s_x) and the pairs wholly inside it, [pb, pe) with pb =
    //    ceil(lo / 2) and pe = floor(hi / 2): rows lo and hi - 1 cover the
    //    one row at each end that no such pair holds, and overlap does not
    //    change a min or a max. Level 0 holds each pair's (min, max); even
    //    levels L >= 2, built in place over s_a and s_b each from four
    //    entries of the one two below, hold pairs [b, b + 2^L). With m = pe
    //    - pb pairs and k = floor(log2 m), a window reads two entries of
    //    level k when k is even, four of level k - 1 when it is odd (the
    //    four spans from pb and back from pe cover it). Entry b of a level
    //    is only right when its pairs end by pend, and only such entries
    //    are read. Against the former table over rows (every row an entry,
    //    levels from 2 rows up): half the entries per level and a level
    //    less for a window of the same rows.
    double2* s_mm = (double2*)s_a;
    u32 lvl = 0;  // byte k: 1 + floor(log2 m) of row k (0: answered without the table)
#pragma unroll
    for (u32 k = 0; k < R; k++) {
        u32 r = t + T * k;
        if (r >= rows) continue;
        u32 w = s_win[ROLL_PW(r)], lo = w & 0xFFFFu, hi = w >> 16;
        if (cnt[k] > 0 && hi - lo >= 4) {  // m >= 1
            u32 pb = (lo + 1) >> 1, pe = hi >> 1;
            lvl |= (32u - __clz(pe - pb)) << (8 * k);
        } else {
            // One to three rows, or nothing but nulls (0, as the general
            // pass): no table.
            double mn = 0.0, mx = 0.0;
            if (cnt[k] > 0) {
                double a = s_x[lo], b = s_x[lo + 1 < hi ? lo + 1 : lo], c2 = s_x[hi - 1];
                bool oa = !NUL || a == a, ob = !NUL || b == b, oc = !NUL || c2 == c2;
                mn = roll_min(roll_min(oa ? a : ROLL_INF, ob ? b : ROLL_INF), oc ? c2 : ROLL_INF);
                mx = roll_max(roll_max(oa ? a : -ROLL_INF, ob ? b : -ROLL_INF), oc ? c2 : -ROLL_INF);
            }
            u64 o = o0 + r;
            if (out.p[2]) ((double*)out.p[2])[o] = mn;
            if (out.p[3]) ((double*)out.p[3])[o] = mx;
        }
    }
    // k <= floor(log2 of the longest window's rows) - 1 = s_levels - 1.
    u32 top = s_levels;
    if (top < 2) return;  // no window of 4 rows or more: no table
    __syncthreads();  // every read of the prefixes is done
    u32 pbase = base >> 1, pend = (end + 1) >> 1;
    {
        const double2* px = (const double2*)s_x;
#pragma unroll 1
        for (u32 b = pbase + t; b < pend; b += T) {
            double2 v = px[b];
            bool oa = !NUL || v.x == v.x, ob = !NUL || v.y == v.y;  // a null adds nothing
            s_mm[b] = make_double2(roll_min(oa ? v.x : ROLL_INF, ob ? v.y : ROLL_INF),
                                   roll_max(oa ? v.x : -ROLL_INF, ob ? v.y : -ROLL_INF));
        }
    }
    __syncthreads();
#pragma unroll 1
    for (u32 L = 0;; L += 2) {
        if (L > 0) {
            // Entries [pbase, lim) of level L; lanes on consecutive slots
            // (no bank conflicts): this thread's m-th is slot jt + T m.
            u32 q = 1u << (L - 2);
            u32 lim = pend > pbase + 3 * q ? pend - 3 * q : pbase;
            u32 jt = pbase + t;
            u32 rem = lim > jt ? lim - jt : 0;  // own entries: T m < rem
            const double2* p = s_mm + jt;
            double2 nm[ROLL_PCH];
#pragma unroll
            for (u32 m = 0; m < ROLL_PCH; m++) {
                if (T * m < rem) {
                    double2 x = p[T * m], y = p[T * m + q], z = p[T * m + 2 * q], u = p[T * m + 3 * q];
                    nm[m] = make_double2(roll_min(roll_min(x.x, y.x), roll_min(z.x, u.x)),
                                         roll_max(roll_max(x.y, y.y), roll_max(z.y, u.y)));
                }
            }
            __syncthreads();  // every read of level L - 2 is done
            double2* dst = s_mm + jt;
#pragma unroll
            for (u32 m = 0; m < ROLL_PCH; m++) {
                if (T * m < rem) dst[T * m] = nm[m];
            }
            __syncthreads();
        }
#pragma unroll
        for (u32 k = 0; k < R; k++) {
            u32 lk = (lvl >> (8 * k)) & 0xFFu;
            if (lk != 0 && ((lk - 1) & ~1u) == L) {
                u32 r = t + T * k;
                u32 w = s_win[ROLL_PW(r)], lo = w & 0xFFFFu, hi = w >> 16;
                u32 pb = (lo + 1) >> 1, pe = hi >> 1;
                double2 x = s_mm[pb], y = s_mm[pe - (1u << L)];
                if (lk - 1 != L) {  // odd level: four spans of 2^L pairs
                    double2 z = s_mm[pb + (1u << L)], u = s_mm[pe - (2u << L)];
                    x = make_double2(roll_min(x.x, z.x), roll_max(x.y, z.y));
                    y = make_double2(roll_min(y.x, u.x), roll_max(y.y, u.y));
                }
                double a = s_x[lo], c2 = s_x[hi - 1];
                bool oa = !NUL || a == a, oc = !NUL || c2 == c2;
                double mn = roll_min(roll_min(x.x, y.x), roll_min(oa ? a : ROLL_INF, oc ? c2 : ROLL_INF));
                double mx = roll_max(roll_max(x.y, y.y), roll_max(oa ? a : -ROLL_INF, oc ? c2 : -ROLL_INF));
                u64 o = o0 + r;
                if (out.p[2]) ((double*)out.p[2])[o] = mn;
                if (out.p[3]) ((double*)out.p[3])[o] = mx;
            }
        }
        if (L + 3 > top) break;  // no row needs level L + 2
    }
}

// The tile pass, one entry point per key case, window kind (fixed or
// calendar) and scan (plain or double-double) so that each gets its own
// register allocation (the keyed walks need more registers than the
// unkeyed index; in one function they made both spill).
#define ROLL_TILE_ENTRY(NAME, KEY, CAL, PL)                                                          \
    extern "C" __global__ void __launch_bounds__(ROLL_THREADS, ROLL_MINB)                           \
    NAME(const i64* ts, const i64* key, const double* v, const u8* valid, u64 n, u64 emit_from,      \
         const RollWin win, u32 closed, const RollOut out, u32* flags, u32* flagged,                 \
         const u32* only, u32 mask) {                                                                \
        __shared__ RollShared sh;                                                                    \
        u64 nft = roll_flag_tiles(n, emit_from);                                                     \
        if (!roll_only(only, nft, mask)) return;                                                     \
        if (valid)                                                                                   \
            roll_tile<KEY, true, CAL, PL>(ts, key, v, valid, n, emit_from, win, closed, out, flags,  \
                                          flagged, sh);                                              \
        else                                                                                         \
            roll_tile<KEY, false, CAL, PL>(ts, key, v, valid, n, emit_from, win, closed, out, flags, \
                                           flagged, sh);                                             \
    }

// Input without a key column, and with one (sorted by key, then ts); the
// plain scans first (`_pl`), the double-double ones over the tiles those
// leave.
ROLL_TILE_ENTRY(rolling_tile_pl, false, false, true)
ROLL_TILE_ENTRY(rolling_tile_keyed_pl, true, false, true)
ROLL_TILE_ENTRY(rolling_tile_cal_pl, false, true, true)
ROLL_TILE_ENTRY(rolling_tile_keyed_cal_pl, true, true, true)
ROLL_TILE_ENTRY(rolling_tile, false, false, false)
ROLL_TILE_ENTRY(rolling_tile_keyed, true, false, false)
ROLL_TILE_ENTRY(rolling_tile_cal, false, true, false)
ROLL_TILE_ENTRY(rolling_tile_keyed_cal, true, true, false)

// ---------------------------------------------------------------------------
// NVLink SendRecv: SMs copy through staging slots in the receiver's memory.
//
//   sender S, block b (of NV_BLOCKS; NV_BLOCKS, NV_SLOTS, NV_SLOT are launch parameters)         receiver R, block b
//   b = 0: R.hdr_in[S][seq & 1] = {seq, len}  b = 0: S.hdr_back[R][seq & 1] = {seq, len}
//   wait own hdr_back[R] = seq; lengths equal  wait own hdr_in[S] = seq; lengths equal
//   chunk c = b, b + NB, ... (`chunk` bytes, at most NV_SLOT), its g-th
//   through block b:
//     slot = g % NS, round = g / NS + 1
//     wait own free[R][b][slot] >= round - 1
//     copy chunk -> R.staging[S][b][slot]     wait own ready[S][b][slot] >= round
//     fence; R.ready[S][b][slot] = round       copy staging slot -> out
//                                              fence; S.free[R][b][slot] = round
//
// Chunk counts per (peer, block) persist in device memory between calls.
// The length handshake costs one one-way NVLink latency and turns a
// mismatched call into an error (err = 1) on both sides, never a hang; a
// peer that never comes turns into err = 2 after 10 s.
// ---------------------------------------------------------------------------

#define NV_THREADS 512
#define NV_TIMEOUT_NS 10000000000ULL

__device__ __forceinline__ u64 nv_now() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Spins until *p >= v (wrap-safe); false on timeout or error.
__device__ bool nv_wait(volatile u32* p, u32 v, volatile u32* err) {
    u64 start = nv_now();
    while ((int)(*p - v) < 0) {
        if (*err) return false;
        if (nv_now() - start > NV_TIMEOUT_NS) {
            *err = 2;
            return false;
        }
        __nanosleep(64);
    }
    return true;
}

// Header: words {seq, len lo, len hi, unused} per parity.
__device__ void nv_hdr_put(volatile u32* h, u32 seq, u64 len) {
    volatile u32* w = h + 4 * (seq & 1);
    w[1] = (u32)len;
    w[2] = (u32)(len >> 32);
    __threadfence_system();
    w[0] = seq;
}

__device__ bool nv_hdr_check(volatile u32* h, u32 seq, u64 len, volatile u32* err) {
    volatile u32* w = h + 4 * (seq & 1);
    u64 start = nv_now();
    while (w[0] != seq) {
        if (*err) return false;
        if (nv_now() - start > NV_TIMEOUT_NS) {
            *err = 2;
            return false;
        }
        __nanosleep(64);
    }
    __threadfence_system();
    u64 theirs = (u64)w[1] | ((u64)w[2] << 32);
    if (theirs != len) {
        *err = 1;
        return false;
    }
    return true;
}

// Copies len bytes, 16 at a time with 4 loads in flight per thread.
__device__ __forceinline__ void nv_copy(u8* dst, const u8* src, u64 len, bool from_peer_writes) {
    u64 vec = len / 16;
    const uint4* s = (const uint4*)src;
    uint4* d = (uint4*)dst;
    u64 i = threadIdx.x;
    for (; i + 3 * blockDim.x < vec; i += 4 * blockDim.x) {
        uint4 x[4];
#pragma unroll
        for (u32 u = 0; u < 4; u++) x[u] = from_peer_writes ? __ldcg(s + i + u * blockDim.x) : s[i + u * blockDim.x];
#pragma unroll
        for (u32 u = 0; u < 4; u++) d[i + u * blockDim.x] = x[u];
    }
    for (; i < vec; i += blockDim.x) {
        d[i] = from_peer_writes ? __ldcg(s + i) : s[i];
    }
    for (u64 j = vec * 16 + threadIdx.x; j < len; j += blockDim.x) {
        dst[j] = from_peer_writes ? __ldcg(src + j) : src[j];
    }
}

extern "C" __global__ void __launch_bounds__(NV_THREADS)
nvlink_sendrecv(const u8* send, u64 send_len, u8* r_staging, u32* r_hdr_in, u32* r_ready,
                u32* l_free, u32* l_hdr_back, u32* send_cnt, u32 send_seq,
                u8* recv, u64 recv_len, const u8* l_staging, u32* l_hdr_in, u32* l_ready,
                u32* r_free, u32* r_hdr_back, u32* recv_cnt, u32 recv_seq, u32* err, u32 NV_BLOCKS,
                u32 NV_SLOTS, u64 NV_SLOT, u64 send_chunk, u64 recv_chunk) {
    __shared__ u32 s_ok, s_base;
    volatile u32* verr = err;
    u32 t = threadIdx.x;
    bool sending = blockIdx.x < NV_BLOCKS;
    u32 b = sending ? blockIdx.x : blockIdx.x - NV_BLOCKS;
    if (sending ? r_staging == 0 : l_staging == 0) return;
    u64 len = sending ? send_len : recv_len;
    if (t == 0) {
        bool ok;
        if (sending) {
            if (b == 0) nv_hdr_put(r_hdr_in, send_seq, send_len);
            ok = nv_hdr_check(l_hdr_back, send_seq, send_len, verr);
        } else {
            if (b == 0) nv_hdr_put(r_hdr_back, recv_seq, recv_len);
            ok = nv_hdr_check(l_hdr_in, recv_seq, recv_len, verr);
        }
        s_ok = ok ? 1u : 0u;
        s_base = sending ? send_cnt[b] : recv_cnt[b];
    }
    __syncthreads();
    if (!s_ok) return;
    u64 chunk = sending ? send_chunk : recv_chunk;  // equal on both ends of a pair
    u64 chunks = (len + chunk - 1) / chunk;
    u32 k = 0;
    for (u64 c = b; c < chunks; c += NV_BLOCKS, k++) {
        u32 g = s_base + k;
        u32 slot = b * NV_SLOTS + g % NV_SLOTS;
        u32 round = g / NV_SLOTS + 1;
        u64 off = c * chunk;
        u64 n = len - off < chunk ? len - off : chunk;
        if (sending) {
            if (t == 0) s_ok = nv_wait((volatile u32*)&l_free[slot], round - 1, verr) ? 1u : 0u;
            __syncthreads();
            if (!s_ok) return;
            nv_copy(r_staging + (u64)slot * NV_SLOT, send + off, n, false);
            // The barrier makes every thread's stores visible to thread 0;
            // its system fence (cumulative) orders them before the flag.
            __syncthreads();
            if (t == 0) {
                __threadfence_system();
                ((volatile u32*)r_ready)[slot] = round;
            }
        } else {
            if (t == 0) {
                s_ok = nv_wait((volatile u32*)&l_ready[slot], round, verr) ? 1u : 0u;
                __threadfence();
            }
            __syncthreads();
            if (!s_ok) return;
            nv_copy(recv + off, l_staging + (u64)slot * NV_SLOT, n, true);
            __syncthreads();
            if (t == 0) {
                __threadfence_system();
                ((volatile u32*)r_free)[slot] = round;
            }
        }
    }
    if (t == 0) {
        if (sending) send_cnt[b] = s_base + k;
        else recv_cnt[b] = s_base + k;
    }
}
