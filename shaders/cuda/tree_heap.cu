// The SparklingTree best-first tree on the device (Backend::sparkling_tree, reference §5.2 c;
// the CUDA twin of shaders/tree_heap.wgsl and of src/tree/sparkling_table.rs
// `build_sparkling_precompute`), after the candidate table (markov_table.cu):
//   heap ← (logw = T[0, root, 0], depth 1, rank 0)
//   repeat until `budget` nodes or the heap is empty:
//     pop the entry e with the largest logw (ties: lower push counter first); the node is the
//     e.rank-th best child of parent e.parent at depth row e.depth - 1;
//     push its next sibling (rank + 1 < k): (logw - T[.., rank]) + T[.., rank + 1];
//     push its first child (depth < ld):     logw + T[depth, slot, 0].
// cand = [n, ascending candidate ids] (candidate_union.cu); vals / slots = the packed
// [ld, n, k'] table of markov_rows_* (k' = min(k, n)). Path weights are f32 here (f64 on the
// host): on near-ties (~1e-7 relative) the trees may differ, each a valid draft.
// Output: out[0] = node count (0xffffffff if the anchor is not a candidate), then 4 words per
// node in pop order: token, parent node index (0 = anchor), depth, f32 bits of logw.
// ONE thread does the whole (sequential, O(budget · log budget)) search; the heap (5 words ×
// (2·budget + 1)) and the node slots (budget + 1) live in global scratch sized by the host.

struct HeapEntry {
    float logw;
    u32 counter;
    u32 parent;
    u32 depth;
    u32 rank;
};

__device__ __forceinline__ HeapEntry heap_load(const u32* heap, u32 i) {
    const u32* h = heap + 5u * i;
    HeapEntry e;
    e.logw = __uint_as_float(h[0]);
    e.counter = h[1];
    e.parent = h[2];
    e.depth = h[3];
    e.rank = h[4];
    return e;
}

__device__ __forceinline__ void heap_store(u32* heap, u32 i, HeapEntry e) {
    u32* h = heap + 5u * i;
    h[0] = __float_as_uint(e.logw);
    h[1] = e.counter;
    h[2] = e.parent;
    h[3] = e.depth;
    h[4] = e.rank;
}

// The host comparator: heavier first, then the earlier push.
__device__ __forceinline__ bool heap_heavier(HeapEntry a, HeapEntry b) {
    if (a.logw != b.logw) return a.logw > b.logw;
    return a.counter < b.counter;
}

__device__ void heap_push(u32* heap, u32* len, HeapEntry e) {
    u32 i = *len;
    *len = i + 1u;
    while (i > 0u) {
        const u32 up = (i - 1u) / 2u;
        const HeapEntry pe = heap_load(heap, up);
        if (!heap_heavier(e, pe)) break;
        heap_store(heap, i, pe);
        i = up;
    }
    heap_store(heap, i, e);
}

__device__ HeapEntry heap_pop(u32* heap, u32* len) {
    const HeapEntry top = heap_load(heap, 0u);
    const u32 n = *len - 1u;
    *len = n;
    if (n > 0u) {
        const HeapEntry last = heap_load(heap, n);
        u32 i = 0u;
        for (;;) {
            const u32 l = 2u * i + 1u;
            if (l >= n) break;
            u32 c = l;
            if (l + 1u < n && heap_heavier(heap_load(heap, l + 1u), heap_load(heap, l))) c = l + 1u;
            const HeapEntry ce = heap_load(heap, c);
            if (!heap_heavier(ce, last)) break;
            heap_store(heap, i, ce);
            i = c;
        }
        heap_store(heap, i, last);
    }
    return top;
}

extern "C" __global__ void __launch_bounds__(1) tree_heap(
    const u32* __restrict__ cand, const float* __restrict__ vals, const u32* __restrict__ slots,
    u32 ld, u32 k_req, u32 budget, u32 anchor,
    u32* __restrict__ heap, u32* __restrict__ node_slot, u32* __restrict__ out) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const u32 n = cand[0];
    const u32 k = umin32(k_req, n);
    out[0] = 0u;
    if (budget == 0u || ld == 0u || k == 0u || n == 0u) return;
    // The anchor's slot (binary search in the ascending candidate ids).
    u32 lo = 0u, hi = n;
    while (lo < hi) {
        const u32 mid = lo + (hi - lo) / 2u;
        if (cand[1u + mid] < anchor) lo = mid + 1u;
        else hi = mid;
    }
    if (lo >= n || cand[1u + lo] != anchor) {
        out[0] = 0xffffffffu;
        return;
    }
    node_slot[0] = lo;
    u32 len = 0u, counter = 0u, count = 0u;
    HeapEntry root;
    root.logw = vals[(u64)lo * k];
    root.counter = 0u;
    root.parent = 0u;
    root.depth = 1u;
    root.rank = 0u;
    heap_push(heap, &len, root);
    while (count < budget && len > 0u) {
        const HeapEntry e = heap_pop(heap, &len);
        const u64 base = ((u64)(e.depth - 1u) * n + node_slot[e.parent]) * k;
        const u32 slot = slots[base + e.rank];
        const float v = vals[base + e.rank];
        const u32 idx = count + 1u;
        u32* o = out + 1u + 4u * count;
        o[0] = cand[1u + slot];
        o[1] = e.parent;
        o[2] = e.depth;
        o[3] = __float_as_uint(e.logw);
        node_slot[idx] = slot;
        count = idx;
        if (e.rank + 1u < k) {
            ++counter;
            HeapEntry s = e;
            s.logw = __fadd_rn(__fsub_rn(e.logw, v), vals[base + e.rank + 1u]);
            s.counter = counter;
            s.rank = e.rank + 1u;
            heap_push(heap, &len, s);
        }
        if (e.depth < ld) {
            ++counter;
            HeapEntry ch;
            ch.logw = __fadd_rn(e.logw, vals[((u64)e.depth * n + slot) * k]);
            ch.counter = counter;
            ch.parent = idx;
            ch.depth = e.depth + 1u;
            ch.rank = 0u;
            heap_push(heap, &len, ch);
        }
    }
    out[0] = count;
}
