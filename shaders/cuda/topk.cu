// Row-wise top-k + log-sum-exp of logits [rows, cols] (Backend::topk; DDTree §5.1 step 2, the
// SparklingTree candidate union §5.2 b). Two kernels:
//
// topk_segments: grid (rows, n_seg); block (row, s) takes the columns [s*seg_len, ...) of its
//   row, selects their top-min(k, len) (block_topk.cuh) into part_key/part_id [rows, n_seg, k],
//   and writes the segment's log-sum-exp partials: max m_s (f32, NaN ignored) and
//   sum_s = Σ exp(x - m_s) accumulated in f64.
// topk_merge: one block per row; top-k of the concatenated segment winners (the global top-k is
//   a subset of them because the order is total), values read back from the logits, and
//   lse = M + ln Σ_s sum_s·exp(m_s - M) with M = max_s m_s, in f64, rounded to f32 once.
// seg_len >= k (host), so only the last segment can hold fewer than k winners, and its unused
// slots are past `count`: the merge never sees them.

#define TOPK_THREADS 256

struct DenseSrc {
    const float* x;
    u32 start;
    __device__ __forceinline__ u32 key(u32 i) const { return order_key(x[start + i]); }
    __device__ __forceinline__ u32 id(u32 i) const { return start + i; }
};

struct ListSrc {
    const u32* keys;
    const u32* ids;
    __device__ __forceinline__ u32 key(u32 i) const { return keys[i]; }
    __device__ __forceinline__ u32 id(u32 i) const { return ids[i]; }
};

extern "C" __global__ void __launch_bounds__(TOPK_THREADS) topk_segments(
    const float* __restrict__ logits, u32 cols, u32 seg_len, u32 k,
    u32* __restrict__ part_key, u32* __restrict__ part_id,
    float* __restrict__ part_max, double* __restrict__ part_sum) {
    __shared__ TopkShared sh;
    __shared__ float fscratch[32];
    __shared__ double dscratch[32];
    const u32 row = blockIdx.x, seg = blockIdx.y, n_seg = gridDim.y;
    const float* x = logits + (u64)row * cols;
    const u32 start = seg * seg_len;
    const u32 len = umin32(seg_len, cols - start);
    const u32 kk = umin32(k, len);
    block_topk(DenseSrc{x, start}, len, kk, sh);
    const u64 out = ((u64)row * n_seg + seg) * k;
    for (u32 j = threadIdx.x; j < kk; j += blockDim.x) {
        part_key[out + j] = sh.key[j];
        part_id[out + j] = sh.id[j];
    }
    // Log-sum-exp partials of the segment.
    float m = SPK_NEG_INF;
    for (u32 i = threadIdx.x; i < len; i += blockDim.x) m = fmaxf(m, x[start + i]);
    m = block_max_f32(m, fscratch);
    double s = 0.0;
    for (u32 i = threadIdx.x; i < len; i += blockDim.x) {
        float v = x[start + i];
        if (m == SPK_NEG_INF) {
            // Only -inf and NaN here: NaN must still poison the row's sum, as on the CPU.
            s += is_nan_f32(v) ? SPK_NAN_F64 : 0.0;
        } else {
            s += exp((double)v - (double)m);
        }
    }
    s = block_sum_f64(s, dscratch);
    if (threadIdx.x == 0) {
        part_max[(u64)row * n_seg + seg] = m;
        part_sum[(u64)row * n_seg + seg] = s;
    }
}

extern "C" __global__ void __launch_bounds__(TOPK_THREADS) topk_merge(
    const float* __restrict__ logits, u32 cols, u32 n_seg, u32 k, u32 count,
    const u32* __restrict__ part_key, const u32* __restrict__ part_id,
    const float* __restrict__ part_max, const double* __restrict__ part_sum,
    u32* __restrict__ out_id, float* __restrict__ out_val, float* __restrict__ out_lse) {
    __shared__ TopkShared sh;
    const u32 row = blockIdx.x;
    const u64 base = (u64)row * n_seg * k;
    block_topk(ListSrc{part_key + base, part_id + base}, count, k, sh);
    for (u32 j = threadIdx.x; j < k; j += blockDim.x) {
        u32 id = sh.id[j];
        out_id[(u64)row * k + j] = id;
        out_val[(u64)row * k + j] = logits[(u64)row * cols + id];
    }
    if (threadIdx.x == 0) {
        const float* pm = part_max + (u64)row * n_seg;
        const double* ps = part_sum + (u64)row * n_seg;
        float mx = SPK_NEG_INF;
        for (u32 s = 0; s < n_seg; ++s) mx = fmaxf(mx, pm[s]);
        float lse;
        if (!is_finite_f32(mx)) {
            lse = mx;
        } else {
            double total = 0.0;
            for (u32 s = 0; s < n_seg; ++s) total += ps[s] * exp((double)pm[s] - (double)mx);
            lse = (float)((double)mx + log(total));
        }
        out_lse[row] = lse;
    }
}
