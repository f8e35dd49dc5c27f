// In-place NeoX (rotate-half) RoPE with one explicit position per row (Backend::rope,
// reference §1.3): for each head and j < half, with (a, b) = (x[j], x[j + half]):
//   x[j] = a*cos - b*sin,   x[j + half] = b*cos + a*sin,   angle = f32(pos) * inv_freq[j]
// inv_freq comes from the host (theta^(-2j/head_dim) evaluated in f64 and rounded to f32, the
// CPU backend's expression); the angle is the same f32 product as on the CPU; cos and sin are
// evaluated in f64 and rounded to f32 (correctly rounded in all but astronomically rare
// cases, which is what the CPU's libm cosf/sinf deliver to within an ulp); the rotation is
// computed with separately rounded products, as on the CPU (no fma contraction).
// One thread per (row, head, j).

extern "C" __global__ void rope(float* __restrict__ x, u32 rows, u32 cols, u32 head_dim,
                                const u32* __restrict__ pos, const float* __restrict__ inv_freq) {
    const u32 half = head_dim / 2;
    const u32 per_row = cols / 2;
    const u64 total = (u64)rows * per_row;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (u64)gridDim.x * blockDim.x) {
        const u32 r = (u32)(e / per_row);
        const u32 rem = (u32)(e % per_row);
        const u32 head = rem / half, j = rem % half;
        const float angle = (float)pos[r] * inv_freq[j];
        const float c = (float)cos((double)angle);
        const float s = (float)sin((double)angle);
        const u64 i0 = (u64)r * cols + (u64)head * head_dim + j;
        const float a = x[i0], b = x[i0 + half];
        x[i0] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        x[i0 + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    }
}
