// Matmul bias (Backend::matmul with a bias): y[r, j] += b[j] for the valid rows r < rows,
// after the GEMM — the CPU backend adds its bias after the dot product too.

extern "C" __global__ void add_bias(float* __restrict__ y, const float* __restrict__ b, u32 rows, u32 n) {
    const u64 total = (u64)rows * n;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (u64)gridDim.x * blockDim.x) {
        y[e] = __fadd_rn(y[e], b[e % n]);
    }
}
