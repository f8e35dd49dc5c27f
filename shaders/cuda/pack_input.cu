// Matmul input packing (Backend::matmul). cuBLAS runs every GEMM on blocks of exactly
// `row_block` rows (see backends/cuda/src/linear.rs for why), so the activations x[M, K] are
// copied into a [Mp, K] buffer, Mp = M rounded up to the block, with zero rows after row M:
// - pack_bf16: rounded to bfloat16 (nearest even) for the bf16-weight GEMM (cublasGemmEx with
//   bf16 inputs, f32 accumulation and output);
// - pack_f32: unchanged, for the f32-weight GEMM (cublasSgemm, pedantic math, no TF32).

extern "C" __global__ void pack_bf16(const float* __restrict__ x, u32 rows, u32 cols, u32 padded_rows,
                                     u16* __restrict__ out) {
    const u64 valid = (u64)rows * cols, total = (u64)padded_rows * cols;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (u64)gridDim.x * blockDim.x) {
        out[e] = e < valid ? f32_to_bf16(x[e]) : (u16)0;
    }
}

extern "C" __global__ void pack_f32(const float* __restrict__ x, u32 rows, u32 cols, u32 padded_rows,
                                    float* __restrict__ out) {
    const u64 valid = (u64)rows * cols, total = (u64)padded_rows * cols;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (u64)gridDim.x * blockDim.x) {
        out[e] = e < valid ? x[e] : 0.0f;
    }
}
