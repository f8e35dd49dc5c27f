// The SparklingTree candidate-union transition table (Backend::markov_table, reference §5.2 c;
// the CPU reference is backends/cpu/src/select.rs `markov_table`). Two kernels:
//
// markov_bias: B[p, c] = Σ_j W1[cand[p], j] · W2[cand[c], j] (DSpark §3.6) for all candidate
//   pairs, [n, n]. Every output is one sequential f32 chain over j = 0..r with separately
//   rounded multiply and add (no fma), exactly the CPU's `dot_seq`, so B is bit-identical to
//   the CPU's. 16x16 output tiles; W1/W2 rows staged through shared memory 32 columns at a time.
//
// markov_rows: one block per (depth d, parent p) row: z_c = U[d, cand[c]] + B[p, c] (no add
//   without a head, so -0 stays -0 as on the CPU), lse = max + ln Σ exp(z - max) with the sum in
//   f64, the top-k slots by (z desc, slot asc), vals = (f32)((f64)z - lse). Without a head every
//   parent row of a depth is the same, so one block per depth writes all n parent rows.
//   z is kept in dynamic shared memory when it fits (markov_rows_shared) and recomputed from
//   global memory otherwise (markov_rows_global); both give identical results.
//
// The candidate list is a header-word buffer cand = [n, id_0, ..., id_{n-1}] (the layout of
// candidate_union.cu; the host markov_table op uploads it), so n may be known only on the
// device. Grids are sized by the host for a capacity n_max >= n: markov_bias tiles over
// n_max × n_max and markov_rows over ld·n_max rows (ld with no head); blocks past n exit at
// once, and every stride uses the actual n and k' = min(k, n), so bias [n, n] and the outputs
// [ld, n, k'] are packed at the front of their (n_max-sized) buffers.

#define MB_TILE 16
#define MB_KCHUNK 32
#define MARKOV_THREADS 256

extern "C" __global__ void __launch_bounds__(MB_TILE * MB_TILE) markov_bias(
    const float* __restrict__ w1, const float* __restrict__ w2, u32 r,
    const u32* __restrict__ cand_hdr, float* __restrict__ bias) {
    __shared__ float a[MB_TILE][MB_KCHUNK + 1];
    __shared__ float b[MB_TILE][MB_KCHUNK + 1];
    const u32 n = cand_hdr[0];
    const u32* cand = cand_hdr + 1;
    const u32 tx = threadIdx.x % MB_TILE, ty = threadIdx.x / MB_TILE;
    const u32 p0 = blockIdx.y * MB_TILE, c0 = blockIdx.x * MB_TILE;
    if (p0 >= n || c0 >= n) return;  // the whole tile is past n (uniform over the block)
    const u32 p = p0 + ty, c = c0 + tx;
    float acc = 0.0f;
    for (u32 j0 = 0; j0 < r; j0 += MB_KCHUNK) {
        for (u32 e = threadIdx.x; e < MB_TILE * MB_KCHUNK; e += blockDim.x) {
            u32 rr = e / MB_KCHUNK, jj = e % MB_KCHUNK;
            bool in_k = j0 + jj < r;
            a[rr][jj] = (p0 + rr < n && in_k) ? w1[(u64)cand[p0 + rr] * r + j0 + jj] : 0.0f;
            b[rr][jj] = (c0 + rr < n && in_k) ? w2[(u64)cand[c0 + rr] * r + j0 + jj] : 0.0f;
        }
        __syncthreads();
        const u32 jn = umin32(MB_KCHUNK, r - j0);
        for (u32 jj = 0; jj < jn; ++jj) acc = __fadd_rn(acc, __fmul_rn(a[ty][jj], b[tx][jj]));
        __syncthreads();
    }
    if (p < n && c < n) bias[(u64)p * n + c] = acc;
}

// z of one row, read from global memory.
struct MarkovGlobalSrc {
    const float* u;     // U[d, :]
    const u32* cand;
    const float* brow;  // B[p, :] or null
    __device__ __forceinline__ float z(u32 c) const {
        float v = u[cand[c]];
        return brow ? v + brow[c] : v;
    }
    __device__ __forceinline__ u32 key(u32 c) const { return order_key(z(c)); }
    __device__ __forceinline__ u32 id(u32 c) const { return c; }
};

// z of one row, staged in shared memory.
struct MarkovSharedSrc {
    const float* zs;
    __device__ __forceinline__ float z(u32 c) const { return zs[c]; }
    __device__ __forceinline__ u32 key(u32 c) const { return order_key(zs[c]); }
    __device__ __forceinline__ u32 id(u32 c) const { return c; }
};

template <typename Src>
__device__ void markov_row(const Src& src, u32 n, u32 k, u32 d, u32 p_first, u32 p_count,
                           float* __restrict__ out_val, u32* __restrict__ out_slot, TopkShared& sh,
                           float* fscratch, double* dscratch) {
    float m = SPK_NEG_INF;
    for (u32 c = threadIdx.x; c < n; c += blockDim.x) m = fmaxf(m, src.z(c));
    m = block_max_f32(m, fscratch);
    double s = 0.0;
    for (u32 c = threadIdx.x; c < n; c += blockDim.x) {
        float v = src.z(c);
        s += (m == SPK_NEG_INF) ? (is_nan_f32(v) ? SPK_NAN_F64 : 0.0) : exp((double)v - (double)m);
    }
    s = block_sum_f64(s, dscratch);
    const double lse = is_finite_f32(m) ? (double)m + log(s) : (double)m;
    block_topk(src, n, k, sh);
    for (u32 p = p_first; p < p_first + p_count; ++p) {
        const u64 out = ((u64)d * n + p) * k;
        for (u32 j = threadIdx.x; j < k; j += blockDim.x) {
            const u32 slot = sh.id[j];
            out_slot[out + j] = slot;
            out_val[out + j] = (float)((double)key_to_f32(sh.key[j]) - lse);
        }
    }
}

// Row of block b: with a head (has_bias = 1) b = d * n_max + p (blocks with p >= n exit);
// without, b = d and the block writes every parent row p = 0..n of depth d.
__device__ __forceinline__ void markov_row_of(u32 b, u32 n_max, u32 has_bias, u32* d, u32* p) {
    *d = has_bias ? b / n_max : b;
    *p = has_bias ? b % n_max : 0u;
}

extern "C" __global__ void __launch_bounds__(MARKOV_THREADS) markov_rows_shared(
    const float* __restrict__ base, u32 vocab, const u32* __restrict__ cand_hdr, u32 n_max,
    const float* __restrict__ bias, u32 has_bias, u32 k_req,
    float* __restrict__ out_val, u32* __restrict__ out_slot) {
    extern __shared__ float zs[];
    __shared__ TopkShared sh;
    __shared__ float fscratch[32];
    __shared__ double dscratch[32];
    const u32 n = cand_hdr[0];
    const u32* cand = cand_hdr + 1;
    const u32 k = umin32(k_req, n);
    u32 d, p;
    markov_row_of(blockIdx.x, n_max, has_bias, &d, &p);
    if (p >= n) return;  // a parent slot past the actual n (uniform over the block)
    const float* u = base + (u64)d * vocab;
    const float* brow = has_bias ? bias + (u64)p * n : 0;
    MarkovGlobalSrc g{u, cand, brow};
    for (u32 c = threadIdx.x; c < n; c += blockDim.x) zs[c] = g.z(c);
    __syncthreads();
    markov_row(MarkovSharedSrc{zs}, n, k, d, p, has_bias ? 1u : n, out_val, out_slot, sh, fscratch, dscratch);
}

extern "C" __global__ void __launch_bounds__(MARKOV_THREADS) markov_rows_global(
    const float* __restrict__ base, u32 vocab, const u32* __restrict__ cand_hdr, u32 n_max,
    const float* __restrict__ bias, u32 has_bias, u32 k_req,
    float* __restrict__ out_val, u32* __restrict__ out_slot) {
    __shared__ TopkShared sh;
    __shared__ float fscratch[32];
    __shared__ double dscratch[32];
    const u32 n = cand_hdr[0];
    const u32* cand = cand_hdr + 1;
    const u32 k = umin32(k_req, n);
    u32 d, p;
    markov_row_of(blockIdx.x, n_max, has_bias, &d, &p);
    if (p >= n) return;  // a parent slot past the actual n (uniform over the block)
    const float* u = base + (u64)d * vocab;
    const float* brow = has_bias ? bias + (u64)p * n : 0;
    markov_row(MarkovGlobalSrc{u, cand, brow}, n, k, d, p, has_bias ? 1u : n, out_val, out_slot, sh, fscratch, dscratch);
}
