// RMSNorm over groups of `group` consecutive values (Backend::rms_norm, reference §1.3):
//   out = x * (1 / sqrt(mean(x²) + eps)) * w,   w: [group]
// One block per group (`group = cols`: a row norm; `group = head_dim`: Qwen3's per-head q/k
// norm). The sum of squares is one fixed-shape block reduction (per-thread strided fma chains,
// then the prelude's shuffle tree), so a group's result never depends on how many groups the
// call has. sqrt and the division are IEEE-rounded; the two products are rounded separately,
// in the CPU's order ((x * inv) * w).

#define RMS_THREADS 256

extern "C" __global__ void __launch_bounds__(RMS_THREADS) rms_norm(
    const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out, u32 group, float eps) {
    __shared__ float scratch[32];
    const u64 base = (u64)blockIdx.x * group;
    float s = 0.0f;
    for (u32 c = threadIdx.x; c < group; c += blockDim.x) {
        float v = x[base + c];
        s = fmaf(v, v, s);
    }
    s = block_sum_f32(s, scratch);
    const float inv = 1.0f / sqrtf(s / (float)group + eps);
    for (u32 c = threadIdx.x; c < group; c += blockDim.x) {
        out[base + c] = __fmul_rn(__fmul_rn(x[base + c], inv), w[c]);
    }
}
