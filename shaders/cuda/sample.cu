// Row-wise sampling (Backend::sample at T >= 1e-5; the host routes T < 1e-5 to argmax). The CPU
// reference is backends/cpu/src/kernels.rs `sample_row`; this kernel draws the same token for
// the same logits and uniform except where the uniform falls within f64 rounding of a CDF
// boundary (a measure-zero event):
//
//   m = max_i x_i (f32, NaN ignored);  p_i = exp((f64(x_i) - m) * inv_t) in f64 (inv_t = 1/T in
//   f64, from the host; a NaN p counts as 0);
//   filtering (top_k > 0 && top_k < cols, or top_p < 1): the kept set is the first n tokens in
//   the order (x desc in f32 total order, id asc) with n = min(top_k, n_p), n_p the smallest
//   count whose probability mass reaches top_p of the total. The order is the CPU's (p desc,
//   id asc) except where two different logits round to the same f64 probability (the CPU then
//   orders them by id).
//   draw: target = u * Σ_kept p; the first kept id (ascending) whose cumulative p exceeds
//   target; if rounding leaves none, the last kept id with p > 0 (0 if none).
//
// Summation precision: every sum is f64, but in the prelude's block order (per-thread strided
// partials, shuffle trees, per-tile scans added tile by tile) instead of the CPU's sequential
// order; the sums agree to ~1e-16 relative, so the drawn token differs only when u·total lies
// within that distance of a cumulative boundary.
//
// One block of SAMPLE_THREADS per row. With top_p < 1 the host passes `pbuf` [rows, cols] (f64)
// to hold the probabilities; the count n_p is found by bisection over the 32-bit order key
// (32 passes over the row), then the kept set by the radix select of block_topk.cuh.

#define SAMPLE_THREADS 1024

struct XKeySrc {
    const float* x;
    __device__ __forceinline__ u32 key(u32 i) const { return order_key(x[i]); }
};

__device__ __forceinline__ double sample_p(float x, float m, double inv_t) {
    double p = exp(((double)x - (double)m) * inv_t);
    return p != p ? 0.0 : p;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) sample_rows(
    const float* __restrict__ logits, u32 cols, double inv_t, u32 top_k, float top_p,
    const float* __restrict__ uniforms, double* __restrict__ pbuf, u32* __restrict__ out) {
    __shared__ u32 hist[256];
    __shared__ u32 misc[8];
    __shared__ u32 uscratch[32];
    __shared__ float fscratch[32];
    __shared__ double dscratch[32];
    const u32 row = blockIdx.x;
    const float* x = logits + (u64)row * cols;
    double* pr = pbuf ? pbuf + (u64)row * cols : 0;

    float m = SPK_NEG_INF;
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) m = fmaxf(m, x[i]);
    m = block_max_f32(m, fscratch);

    const bool use_p = top_p < 1.0f;
    const bool use_k = top_k > 0 && top_k < cols;
    // Keep-all unless filtering leaves fewer than `cols` tokens.
    bool keep_all = true;
    u32 tau = 0, cut = 0xffffffffu;
    if (use_p || use_k) {
        double total = 0.0;
        for (u32 i = threadIdx.x; i < cols; i += blockDim.x) {
            double p = sample_p(x[i], m, inv_t);
            if (pr) pr[i] = p;
            total += p;
        }
        total = block_sum_f64(total, dscratch);
        u32 n = use_k ? top_k : cols;
        if (use_p && total > 0.0) {
            // Largest key threshold whose mass S(t) = Σ_{key >= t} p still reaches top_p.
            u64 lo = 0, hi = 0x100000000ull;
            while (hi - lo > 1) {
                const u64 mid = lo + (hi - lo) / 2;
                double s = 0.0;
                for (u32 i = threadIdx.x; i < cols; i += blockDim.x) {
                    if ((u64)order_key(x[i]) >= mid) s += pr[i];
                }
                s = block_sum_f64(s, dscratch);
                if (s / total >= (double)top_p) lo = mid; else hi = mid;
            }
            const u32 t = (u32)lo;
            // Tokens above t, their mass, and the tokens at t (all with the same p).
            u32 c_gt = 0, c_eq = 0;
            double s_gt = 0.0, p_eq = 0.0;
            for (u32 i = threadIdx.x; i < cols; i += blockDim.x) {
                const u32 key = order_key(x[i]);
                if (key > t) { c_gt += 1; s_gt += pr[i]; }
                if (key == t) { c_eq += 1; p_eq = pr[i]; }
            }
            c_gt = block_sum_u32(c_gt, uscratch);
            c_eq = block_sum_u32(c_eq, uscratch);
            s_gt = block_sum_f64(s_gt, dscratch);
            {
                // Every tie has the same p (same logit): broadcast it from any thread that saw one.
                __shared__ double s_peq;
                if (threadIdx.x == 0) s_peq = 0.0;
                __syncthreads();
                if (p_eq > 0.0) s_peq = p_eq;
                __syncthreads();
                p_eq = s_peq;
                __syncthreads();
            }
            u32 j = c_eq;
            if (p_eq > 0.0) {
                const double need = ((double)top_p * total - s_gt) / p_eq;
                double jc = ceil(need);
                if (jc < 1.0) jc = 1.0;
                if (jc < (double)c_eq) j = (u32)jc;
            }
            const u32 n_p = c_gt + umax32(j, 1u);
            if (n_p < n) n = n_p;
        }
        if (n < cols) {
            keep_all = false;
            u32 want;
            block_radix_select(XKeySrc{x}, cols, n, hist, misc, &tau, &want);
            // The id of the want-th token equal to tau, in id order.
            u32 seen = 0;
            if (threadIdx.x == 0) misc[2] = 0xffffffffu;
            __syncthreads();
            for (u32 base = 0; base < cols && seen < want; base += blockDim.x) {
                const u32 i = base + threadIdx.x;
                const bool eq = i < cols && order_key(x[i]) == tau;
                u32 tile;
                const u32 r = block_rank(eq, uscratch, &tile);
                if (eq && seen + r + 1 == want) misc[2] = i;
                seen += tile;
            }
            __syncthreads();
            cut = misc[2];
            __syncthreads();
        }
    }

    // Draw: inverse CDF over the kept tokens in ascending id order.
    double kept_total = 0.0;
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) {
        const float xi = x[i];
        const u32 key = order_key(xi);
        const bool kept = keep_all || key > tau || (key == tau && i <= cut);
        if (kept) kept_total += pr ? pr[i] : sample_p(xi, m, inv_t);
    }
    kept_total = block_sum_f64(kept_total, dscratch);
    const double target = (double)uniforms[row] * kept_total;
    double running = 0.0;
    u32 found = 0;         // 1 + the drawn id, 0 while none
    u32 last = 0;          // 1 + the last kept id with p > 0
    for (u32 base = 0; base < cols && found == 0; base += blockDim.x) {
        const u32 i = base + threadIdx.x;
        double q = 0.0;
        if (i < cols) {
            const float xi = x[i];
            const u32 key = order_key(xi);
            const bool kept = keep_all || key > tau || (key == tau && i <= cut);
            if (kept) q = pr ? pr[i] : sample_p(xi, m, inv_t);
        }
        double tile_total;
        const double cum = running + block_inclusive_scan_f64(q, dscratch, &tile_total);
        const bool hit = q > 0.0 && cum > target;
        // Lowest hit id of the tile (as 0xffffffff - id in a max), and the last positive one.
        const u32 hit_code = block_max_u32(hit ? 0xffffffffu - i : 0u, uscratch);
        if (hit_code != 0u) found = 0xffffffffu - hit_code + 1;
        const u32 l = block_max_u32(q > 0.0 ? i + 1 : 0u, uscratch);
        if (l > last) last = l;
        running += tile_total;
    }
    if (threadIdx.x == 0) out[row] = found ? found - 1 : (last ? last - 1 : 0u);
}
