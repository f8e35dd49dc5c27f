// Row-wise argmax (Backend::argmax): the lowest index of the largest value, NaN never wins,
// and 0 for a row with no value above -inf — the CPU backend's `kernels::argmax` exactly.
// One block per row: each thread scans a strided slice in ascending order keeping the first
// strict maximum, then a shared-memory tree merges (value, index) pairs preferring the larger
// value and, on equal values, the lower index.

#define ARGMAX_THREADS 256
#define ARGMAX_NONE 0xffffffffu

extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS) argmax_rows(
    const float* __restrict__ x, u32 cols, u32* __restrict__ out) {
    __shared__ float sv[ARGMAX_THREADS];
    __shared__ u32 si[ARGMAX_THREADS];
    const u32 row = blockIdx.x;
    const float* r = x + (u64)row * cols;
    float bv = SPK_NEG_INF;
    u32 bi = ARGMAX_NONE;
    for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = r[c];
        // `v > bv` is false for NaN and for -inf against the initial -inf.
        if (v > bv) {
            bv = v;
            bi = c;
        }
    }
    sv[threadIdx.x] = bv;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (u32 half = ARGMAX_THREADS / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) {
            float ov = sv[threadIdx.x + half];
            u32 oi = si[threadIdx.x + half];
            float mv = sv[threadIdx.x];
            u32 mi = si[threadIdx.x];
            bool take = oi != ARGMAX_NONE && (mi == ARGMAX_NONE || ov > mv || (ov == mv && oi < mi));
            if (take) {
                sv[threadIdx.x] = ov;
                si[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[row] = si[0] == ARGMAX_NONE ? 0u : si[0];
}
