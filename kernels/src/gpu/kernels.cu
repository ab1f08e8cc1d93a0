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
// LSD radix sort, 8-bit digits, stable. One pass = histogram, scan, scatter.
//
//   radix_histogram: block b counts the digits of its tile; hist[d * B + b]
//   radix_scan:      exclusive scan of hist (digit-major), one block
//   radix_scatter:   block b places its tile's elements at hist[d * B + b]
//                    onwards, in input order within each digit (stable)
//
// A tile is RADIX_THREADS * RADIX_ITEMS consecutive elements.
// ---------------------------------------------------------------------------

#define RADIX_THREADS 256
#define RADIX_ITEMS 16
#define RADIX_TILE (RADIX_THREADS * RADIX_ITEMS)
#define RADIX_WARPS (RADIX_THREADS / 32)

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

// Exclusive scan of `len` u32 in place, by one block of 1024 threads: each
// thread sums a contiguous chunk, the block scans the chunk sums, each
// thread rewrites its chunk.
extern "C" __global__ void radix_scan(u32* data, u64 len) {
    __shared__ u32 sums[1024];
    u64 chunk = (len + blockDim.x - 1) / blockDim.x;
    u64 lo = (u64)threadIdx.x * chunk;
    u64 hi = lo + chunk < len ? lo + chunk : len;
    u32 s = 0;
    for (u64 i = lo; i < hi; i++) s += data[i];
    sums[threadIdx.x] = s;
    __syncthreads();
    // Hillis-Steele inclusive scan of the chunk sums.
    for (u32 off = 1; off < blockDim.x; off <<= 1) {
        u32 v = threadIdx.x >= off ? sums[threadIdx.x - off] : 0;
        __syncthreads();
        sums[threadIdx.x] += v;
        __syncthreads();
    }
    u32 run = threadIdx.x == 0 ? 0 : sums[threadIdx.x - 1];
    for (u64 i = lo; i < hi; i++) {
        u32 v = data[i];
        data[i] = run;
        run += v;
    }
}

extern "C" __global__ void radix_scatter(const u64* keys, const u32* vals, u64 n, u32 shift,
                                         const u32* offsets, u32 nblocks, u64* keys_out, u32* vals_out) {
    __shared__ u32 next[256];              // next output position per digit
    __shared__ u32 wcount[RADIX_WARPS][256]; // per-warp digit counts of one round
    u32 t = threadIdx.x;
    u32 lane = t & 31;
    u32 warp = t >> 5;
    next[t] = offsets[(u64)t * nblocks + blockIdx.x];
    u64 base = (u64)blockIdx.x * RADIX_TILE;
    for (u32 k = 0; k < RADIX_ITEMS; k++) {
        for (u32 w = 0; w < RADIX_WARPS; w++) wcount[w][t] = 0;
        __syncthreads();
        u64 i = base + (u64)k * RADIX_THREADS + t;
        bool live = i < n;
        u64 key = live ? keys[i] : 0;
        // Dead lanes take digit 256 (out of range) so they match only each other.
        u32 d = live ? ((u32)(key >> shift) & 0xFF) : 256u;
        u32 peers = __match_any_sync(0xFFFFFFFFu, d);
        u32 lower = peers & ((1u << lane) - 1u);
        u32 rank = __popc(lower);
        if (live && lower == 0) {
            wcount[warp][d] = __popc(peers);
        }
        __syncthreads();
        if (live) {
            u32 before = 0;
            for (u32 w = 0; w < warp; w++) before += wcount[w][d];
            u32 pos = next[d] + before + rank;
            keys_out[pos] = key;
            vals_out[pos] = vals[i];
        }
        __syncthreads();
        u32 total = 0;
        for (u32 w = 0; w < RADIX_WARPS; w++) total += wcount[w][t];
        next[t] += total;
        __syncthreads();
    }
}
