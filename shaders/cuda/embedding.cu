// Embedding gather (Backend::embedding): out[i, c] = table[ids[i], c] for a [N, K] table stored
// as f32 or as bfloat16 bits (widened exactly). The host has already rejected ids >= N.
// One thread per output element (grid-stride).

extern "C" __global__ void embedding_f32(const float* __restrict__ table, const u32* __restrict__ ids,
                                         u32 n_ids, u32 k, float* __restrict__ out) {
    const u64 total = (u64)n_ids * k;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (u64)gridDim.x * blockDim.x) {
        const u64 i = e / k, c = e % k;
        out[e] = table[(u64)ids[i] * k + c];
    }
}

extern "C" __global__ void embedding_bf16(const u16* __restrict__ table, const u32* __restrict__ ids,
                                          u32 n_ids, u32 k, float* __restrict__ out) {
    const u64 total = (u64)n_ids * k;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (u64)gridDim.x * blockDim.x) {
        const u64 i = e / k, c = e % k;
        out[e] = bf16_to_f32(table[(u64)ids[i] * k + c]);
    }
}
