// Column concatenation (Backend::concat_cols): copy one part [rows, part_cols] into the column
// band [off, off + part_cols) of out [rows, out_cols]. The host launches once per part.

extern "C" __global__ void copy_cols(const float* __restrict__ part, u32 rows, u32 part_cols,
                                     float* __restrict__ out, u32 out_cols, u32 off) {
    const u64 total = (u64)rows * part_cols;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (u64)gridDim.x * blockDim.x) {
        const u64 r = e / part_cols, c = e % part_cols;
        out[r * out_cols + off + c] = part[e];
    }
}
