// Row gather (Backend::gather_rows, and the read half of compact_rows):
// out[i, :] = x[base + idx[i], :]. The host has checked every index.

extern "C" __global__ void gather_rows(const float* __restrict__ x, const u32* __restrict__ idx, u32 n_idx,
                                       u32 cols, u32 base, float* __restrict__ out) {
    const u64 total = (u64)n_idx * cols;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (u64)gridDim.x * blockDim.x) {
        const u64 i = e / cols, c = e % cols;
        out[e] = x[((u64)base + idx[i]) * cols + c];
    }
}
