// Scaled dot-product attention with GQA and an f32 softmax (Backend::attention; reference
// §1.3; tree masks DDTree §4.8; the drafter's non-causal block DFlash §2.4).
//
// The keys query row i may see form its "visible sequence", in ascending slot order:
//   causal (mode 0): slots 0 ..= prefix + i
//   full   (mode 1): slots 0 .. kv_len
//   tree   (mode 2): slots 0 .. prefix, then prefix + a for each ancestor-or-self a of i in
//                    ascending order, from `tree` = [off_0 .. off_t, entries...] (host-built)
// The sequence is cut by ordinal (never by slot) into chunks of ATT_CHUNK keys, and the chunks
// into at most ATT_MAX_SPLITS contiguous splits; both cuts depend only on the length n_vis of
// the sequence (att_splits below). So a row's result depends only on its visible keys: a tree
// node reproduces the 1-row decode of the same path after KV compaction bit for bit, and a
// chain-shaped tree reproduces the causal mask.
//
// attention_split: one block per (row, query head, split). Per chunk: slots; scores
//   s = (q · k) * scale, one warp per key (lane-strided fma chains + the warp shuffle tree);
//   chunk max; p = exp(s - m_new); chunk sum (block tree); online rescale
//   o = o * exp(m_old - m_new) + Σ_j p_j v_j with thread d owning output dim d and summing keys
//   in ordinal order. Writes the split's (m, l, o[head_dim]).
// attention_combine: one block per (row, head): M = max_s m_s, L = Σ_s l_s e^(m_s - M),
//   out = (Σ_s o_s e^(m_s - M)) * (1 / L), splits in ascending order. With one split this is
//   exactly o / l of the single pass.

#define ATT_THREADS 256
#define ATT_CHUNK 256
#define ATT_MAX_HD 256
#define ATT_MAX_SPLITS 16

struct AttParams {
    u32 t;          // query rows of the whole call
    u32 kv_len;     // valid cache rows (the last t are the query block)
    u32 prefix;     // kv_len - t
    u32 n_heads;
    u32 group;      // n_heads / n_kv_heads
    u32 head_dim;
    u32 q_cols;     // n_heads * head_dim
    u32 kv_cols;    // n_kv_heads * head_dim
    u32 mode;       // 0 causal, 1 full, 2 tree
    float scale;    // head_dim^-0.5
    u32 row0;       // first query row of this launch
    u32 splits_max; // splits per (row, head) in the partial buffers of this launch
};

__device__ __forceinline__ u32 att_nvis(const AttParams& p, const u32* tree, u32 i) {
    if (p.mode == 0) return p.prefix + i + 1;
    if (p.mode == 1) return p.kv_len;
    return p.prefix + (tree[i + 1] - tree[i]);
}

__device__ __forceinline__ u32 att_slot(const AttParams& p, const u32* tree, u32 i, u32 v) {
    if (p.mode == 2 && v >= p.prefix) return p.prefix + tree[p.t + 1 + tree[i] + (v - p.prefix)];
    return v;
}

// Chunks per split and the number of splits for a visible sequence of n keys.
__device__ __forceinline__ void att_splits(u32 n, u32* chunks_per_split, u32* n_splits) {
    const u32 chunks = (n + ATT_CHUNK - 1) / ATT_CHUNK;
    const u32 cps = (chunks + ATT_MAX_SPLITS - 1) / ATT_MAX_SPLITS;
    *chunks_per_split = cps;
    *n_splits = (chunks + cps - 1) / cps;
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS) attention_split(
    AttParams p, const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc,
    const u32* __restrict__ tree, float* __restrict__ part_m, float* __restrict__ part_l,
    float* __restrict__ part_o) {
    __shared__ float qs[ATT_MAX_HD];
    __shared__ float sc[ATT_CHUNK];
    __shared__ u32 slots[ATT_CHUNK];
    __shared__ float scratch[32];
    const u32 b = blockIdx.x;
    const u32 split = b % p.splits_max;
    const u32 h = (b / p.splits_max) % p.n_heads;
    const u32 il = b / (p.splits_max * p.n_heads);
    const u32 i = p.row0 + il;
    const u32 kh = h / p.group;
    const u32 hd = p.head_dim;
    const u32 n_vis = att_nvis(p, tree, i);
    u32 cps, n_splits;
    att_splits(n_vis, &cps, &n_splits);
    if (split >= n_splits) return;  // uniform over the block
    for (u32 d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = q[(u64)i * p.q_cols + h * hd + d];
    const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    float m = SPK_NEG_INF, l = 0.0f, acc = 0.0f;
    const u32 c_begin = split * cps;
    const u32 c_end = umin32(c_begin + cps, (n_vis + ATT_CHUNK - 1) / ATT_CHUNK);
    for (u32 ch = c_begin; ch < c_end; ++ch) {
        const u32 v0 = ch * ATT_CHUNK;
        const u32 nc = umin32(ATT_CHUNK, n_vis - v0);
        for (u32 t = threadIdx.x; t < nc; t += blockDim.x) slots[t] = att_slot(p, tree, i, v0 + t);
        __syncthreads();
        for (u32 t = warp; t < nc; t += n_warps) {
            const float* kr = kc + (u64)slots[t] * p.kv_cols + kh * hd;
            float part = 0.0f;
            for (u32 d = lane; d < hd; d += 32) part = fmaf(qs[d], kr[d], part);
            part = warp_sum_f32(part);
            if (lane == 0) sc[t] = part * p.scale;
        }
        __syncthreads();
        float cm = SPK_NEG_INF;
        for (u32 t = threadIdx.x; t < nc; t += blockDim.x) cm = fmaxf(cm, sc[t]);
        cm = block_max_f32(cm, scratch);
        const float m_new = fmaxf(m, cm);
        const float alpha = expf(m - m_new);
        for (u32 t = threadIdx.x; t < nc; t += blockDim.x) sc[t] = expf(sc[t] - m_new);
        __syncthreads();
        float cs = 0.0f;
        for (u32 t = threadIdx.x; t < nc; t += blockDim.x) cs += sc[t];
        cs = block_sum_f32(cs, scratch);
        l = l * alpha + cs;
        if (threadIdx.x < hd) {
            const float* vb = vc + kh * hd + threadIdx.x;
            float a = acc * alpha;
            for (u32 t = 0; t < nc; ++t) a = fmaf(sc[t], vb[(u64)slots[t] * p.kv_cols], a);
            acc = a;
        }
        m = m_new;
        __syncthreads();
    }
    const u64 pidx = ((u64)il * p.n_heads + h) * p.splits_max + split;
    if (threadIdx.x == 0) {
        part_m[pidx] = m;
        part_l[pidx] = l;
    }
    if (threadIdx.x < hd) part_o[pidx * hd + threadIdx.x] = acc;
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS) attention_combine(
    AttParams p, const u32* __restrict__ tree, const float* __restrict__ part_m,
    const float* __restrict__ part_l, const float* __restrict__ part_o, float* __restrict__ out) {
    const u32 b = blockIdx.x;
    const u32 h = b % p.n_heads;
    const u32 il = b / p.n_heads;
    const u32 i = p.row0 + il;
    const u32 hd = p.head_dim;
    u32 cps, n_splits;
    att_splits(att_nvis(p, tree, i), &cps, &n_splits);
    const u64 base = ((u64)il * p.n_heads + h) * p.splits_max;
    float mx = SPK_NEG_INF;
    for (u32 s = 0; s < n_splits; ++s) mx = fmaxf(mx, part_m[base + s]);
    float l = 0.0f;
    for (u32 s = 0; s < n_splits; ++s) l += part_l[base + s] * expf(part_m[base + s] - mx);
    const float inv = 1.0f / l;
    for (u32 d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (u32 s = 0; s < n_splits; ++s) o += part_o[(base + s) * hd + d] * expf(part_m[base + s] - mx);
        out[(u64)i * p.q_cols + h * hd + d] = o * inv;
    }
}
