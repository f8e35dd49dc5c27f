// Shared definitions of the CUDA kernels (backends/cuda). The backend compiles one NVRTC
// program made of this prelude, block_topk.cuh and every op file under shaders/cuda/; NVRTC has
// no system headers here, so everything a kernel needs beyond CUDA's built-in device functions
// is defined below.
//
// Determinism rules every kernel follows (the Backend contract: an output row never depends on
// how many rows share the call):
// - a reduction has a fixed shape that depends only on the reduced length and the (constant)
//   block size: per-thread strided partial sums in ascending index order, then the fixed
//   shuffle-down tree of warp_sum / block_sum below;
// - no floating-point atomics (atomics are used for integer counts and slot claims only, and
//   everything they place is re-sorted by a total order afterwards).

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

#define FULL_MASK 0xffffffffu

// +inf / -inf / quiet NaN without <math.h>.
#define SPK_INF __int_as_float(0x7f800000)
#define SPK_NEG_INF __int_as_float(0xff800000)
#define SPK_NAN_F64 __longlong_as_double(0x7ff8000000000000LL)

__device__ __forceinline__ u32 umin32(u32 a, u32 b) { return a < b ? a : b; }
__device__ __forceinline__ u32 umax32(u32 a, u32 b) { return a > b ? a : b; }
__device__ __forceinline__ bool is_nan_f32(float x) { return x != x; }
__device__ __forceinline__ bool is_finite_f32(float x) { return fabsf(x) < SPK_INF; }

// bfloat16 (bit pattern in a u16) -> f32: exact.
__device__ __forceinline__ float bf16_to_f32(u16 b) { return __uint_as_float(((u32)b) << 16); }

// f32 -> bfloat16 bits, round to nearest even; NaN stays a (quiet) NaN. The same rounding as
// `half::bf16::from_f32` on the host.
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (u16)((u >> 16) | 0x40u);
    }
    u32 rounding = 0x7fffu + ((u >> 16) & 1u);
    return (u16)((u + rounding) >> 16);
}

// A u32 whose unsigned order is Rust's `f32::total_cmp` order
// (-NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN).
__device__ __forceinline__ u32 order_key(float f) {
    u32 u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The float of an order key (inverse of order_key).
__device__ __forceinline__ float key_to_f32(u32 k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Warp reductions: a fixed shuffle-down tree; the result is valid in lane 0 only.
__device__ __forceinline__ float warp_sum_f32(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum_f64(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ float warp_max_f32(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(FULL_MASK, v, o));
    return v;
}
__device__ __forceinline__ u32 warp_sum_u32(u32 v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ u32 warp_max_u32(u32 v) {
    for (int o = 16; o > 0; o >>= 1) v = umax32(v, __shfl_down_sync(FULL_MASK, v, o));
    return v;
}

// Block reductions (blockDim.x a multiple of 32, at most 1024; every thread must call them).
// Warp trees, then warp 0 reduces the per-warp results with the same tree; the result is
// returned to every thread. `scratch` needs 32 entries; it is free again on return.
__device__ __forceinline__ float block_sum_f32(float v, float* scratch) {
    u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_f32(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < nw ? scratch[lane] : 0.0f;
        w = warp_sum_f32(w);
        if (lane == 0) scratch[0] = w;
    }
    __syncthreads();
    float r = scratch[0];
    __syncthreads();
    return r;
}
__device__ __forceinline__ double block_sum_f64(double v, double* scratch) {
    u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_f64(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        double w = lane < nw ? scratch[lane] : 0.0;
        w = warp_sum_f64(w);
        if (lane == 0) scratch[0] = w;
    }
    __syncthreads();
    double r = scratch[0];
    __syncthreads();
    return r;
}
// Max ignoring NaN (fmaxf), like Rust's `f32::max` fold from -inf.
__device__ __forceinline__ float block_max_f32(float v, float* scratch) {
    u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max_f32(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < nw ? scratch[lane] : SPK_NEG_INF;
        w = warp_max_f32(w);
        if (lane == 0) scratch[0] = w;
    }
    __syncthreads();
    float r = scratch[0];
    __syncthreads();
    return r;
}
__device__ __forceinline__ u32 block_sum_u32(u32 v, u32* scratch) {
    u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_u32(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        u32 w = lane < nw ? scratch[lane] : 0u;
        w = warp_sum_u32(w);
        if (lane == 0) scratch[0] = w;
    }
    __syncthreads();
    u32 r = scratch[0];
    __syncthreads();
    return r;
}
__device__ __forceinline__ u32 block_max_u32(u32 v, u32* scratch) {
    u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max_u32(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        u32 w = lane < nw ? scratch[lane] : 0u;
        w = warp_max_u32(w);
        if (lane == 0) scratch[0] = w;
    }
    __syncthreads();
    u32 r = scratch[0];
    __syncthreads();
    return r;
}

// Exclusive rank of this thread's `flag` among the set flags of the block, in thread order;
// `*total` receives the number of set flags. Every thread must call it. `scratch`: 32 entries.
__device__ __forceinline__ u32 block_rank(bool flag, u32* scratch, u32* total) {
    u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    u32 ballot = __ballot_sync(FULL_MASK, flag);
    u32 rank = __popc(ballot & ((1u << lane) - 1u));
    if (lane == 0) scratch[warp] = __popc(ballot);
    __syncthreads();
    u32 before = 0, all = 0;
    for (u32 w = 0; w < nw; ++w) {
        u32 c = scratch[w];
        if (w < warp) before += c;
        all += c;
    }
    __syncthreads();
    *total = all;
    return before + rank;
}

// Inclusive prefix sum of `v` over the block in thread order (f64). Warp scans by shuffles,
// then the per-warp totals are added in ascending warp order by every thread (the same order
// for all). `*total` receives the block total. `scratch`: 32 entries.
__device__ __forceinline__ double block_inclusive_scan_f64(double v, double* scratch, double* total) {
    u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        double t = __shfl_up_sync(FULL_MASK, v, o);
        if ((int)lane >= o) v += t;
    }
    if (lane == 31) scratch[warp] = v;
    __syncthreads();
    double before = 0.0, all = 0.0;
    for (u32 w = 0; w < nw; ++w) {
        double c = scratch[w];
        if (w < warp) before += c;
        all += c;
    }
    __syncthreads();
    *total = all;
    return before + v;
}
