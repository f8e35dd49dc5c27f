// The SparklingTree candidate union on the device (Backend::candidate_table, reference §5.2 b;
// the CUDA twin of shaders/candidate_union.wgsl), between topk.cu (the per-depth top-C ids,
// left on the device as [ld, C]) and the candidate table (markov_table.cu):
//   cand = { top[d, j] : d < ld, j < C } ∪ { anchor }, sorted ascending, distinct.
// Output: cand_out = [n, id_0, ..., id_{n-1}] (1 <= n <= min(ld·C + 1, V)); words beyond 1 + n
// are left untouched. Every id must be < vocab (topk ids are; the host checks the anchor).
//
// ONE block of UNION_THREADS threads, for any vocab and any C:
// 1. zero the bitmap `bits` (ceil(vocab / 32) words of global scratch), __syncthreads;
// 2. atomicOr every top-C id of every row, and the anchor, into the bitmap; __syncthreads;
// 3. each thread owns a contiguous chunk of bitmap words: __popc → block exclusive prefix sum
//    (a Hillis–Steele scan in shared memory) → writes its ids in ascending order from there;
//    the last thread (its inclusive sum is n) writes the header word.
// Integer work only: the result is exact and independent of timing. The bitmap is read back
// through volatile loads (the atomics complete in L2; no stale L1 line can be used).

#define UNION_THREADS 1024

extern "C" __global__ void __launch_bounds__(UNION_THREADS) candidate_union(
    const u32* __restrict__ top, u32 ld, u32 c, u32 vocab, u32 anchor,
    u32* bits, u32* __restrict__ cand_out) {
    __shared__ u32 scan[UNION_THREADS];
    const u32 t = threadIdx.x, nt = blockDim.x;
    const u32 words = (vocab + 31u) / 32u;
    for (u32 w = t; w < words; w += nt) bits[w] = 0u;
    __syncthreads();
    const u64 total = (u64)ld * c;
    for (u64 e = t; e < total; e += nt) {
        const u32 id = top[e];
        atomicOr(&bits[id >> 5], 1u << (id & 31u));
    }
    if (t == 0) atomicOr(&bits[anchor >> 5], 1u << (anchor & 31u));
    __syncthreads();
    const volatile u32* vbits = bits;
    const u32 chunk = (words + nt - 1u) / nt;
    const u32 lo = umin32(words, t * chunk);
    const u32 hi = umin32(words, lo + chunk);
    u32 cnt = 0;
    for (u32 w = lo; w < hi; ++w) cnt += __popc(vbits[w]);
    scan[t] = cnt;
    __syncthreads();
    for (u32 off = 1; off < nt; off <<= 1) {
        const u32 v = t >= off ? scan[t - off] : 0u;
        __syncthreads();
        scan[t] += v;
        __syncthreads();
    }
    u32 at = scan[t] - cnt;
    if (t == nt - 1u) cand_out[0] = scan[t];
    for (u32 w = lo; w < hi; ++w) {
        u32 m = vbits[w];
        while (m != 0u) {
            const u32 b = (u32)(__ffs((int)m) - 1);
            cand_out[1u + at] = w * 32u + b;
            ++at;
            m &= m - 1u;
        }
    }
}
