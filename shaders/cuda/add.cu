// Residual add (Backend::add_assign): x += y, elementwise, IEEE-rounded (exact match with the
// CPU backend).

extern "C" __global__ void add_assign(float* __restrict__ x, const float* __restrict__ y, u32 n) {
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (u64)gridDim.x * blockDim.x) {
        x[e] = __fadd_rn(x[e], y[e]);
    }
}
