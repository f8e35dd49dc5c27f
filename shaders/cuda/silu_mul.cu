// SwiGLU (Backend::silu_mul): out = silu(gate) * up = gate / (1 + exp(-gate)) * up, elementwise.
// exp is evaluated in f64 and rounded to f32 (the CPU's expf to within an ulp, usually
// exactly); the add, division and product are IEEE-rounded in the CPU's order.

extern "C" __global__ void silu_mul(const float* __restrict__ gate, const float* __restrict__ up,
                                    float* __restrict__ out, u32 n) {
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (u64)gridDim.x * blockDim.x) {
        const float g = gate[e];
        const float ex = (float)exp(-(double)g);
        out[e] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, ex)), up[e]);
    }
}
