// Exact block-wide top-k by (value descending, id ascending), shared by topk.cu and
// markov_table.cu. Values are compared by their order key (prelude.cuh `order_key`), i.e. in
// Rust's `f32::total_cmp` order, so the selection is the CPU backend's (`select::topk_indices`)
// exactly, ties included.
//
// Method: MSB-first radix select (4 passes of 8 bits, integer histograms) finds the k-th largest
// key; then every item above it and the first items equal to it in index order are gathered
// into shared memory and sorted with a bitonic network. Index order must be ascending id order
// among equal keys (true for a dense row, for the candidate slots of a Markov row, and for the
// concatenated per-segment winners of topk.cu).

#define TOPK_MAX 2048u

// Does (ka, ia) come before (kb, ib) in the output order?
__device__ __forceinline__ bool topk_before(u32 ka, u32 ia, u32 kb, u32 ib) {
    return ka > kb || (ka == kb && ia < ib);
}

__device__ __forceinline__ u32 next_pow2(u32 x) {
    u32 p = 1;
    while (p < x) p <<= 1;
    return p;
}

// Bitonic sort of `n` (a power of two) pairs into topk_before order. Every thread must call it.
__device__ void bitonic_sort_pairs(u32* key, u32* id, u32 n) {
    for (u32 size = 2; size <= n; size <<= 1) {
        for (u32 stride = size >> 1; stride > 0; stride >>= 1) {
            for (u32 t = threadIdx.x; t < n / 2; t += blockDim.x) {
                u32 lo = 2 * t - (t & (stride - 1));
                u32 hi = lo + stride;
                bool ascending = (lo & size) == 0;
                bool swap = ascending ? topk_before(key[hi], id[hi], key[lo], id[lo])
                                      : topk_before(key[lo], id[lo], key[hi], id[hi]);
                if (swap) {
                    u32 tk = key[lo]; key[lo] = key[hi]; key[hi] = tk;
                    u32 ti = id[lo]; id[lo] = id[hi]; id[hi] = ti;
                }
            }
            __syncthreads();
        }
    }
}

// Shared scratch of block_topk.
struct TopkShared {
    u32 key[TOPK_MAX];
    u32 id[TOPK_MAX];
    u32 hist[256];
    u32 misc[8];
    u32 warp[32];
};

// Radix select: the k-th largest order key among `count` items of `src` (1 <= k <= count),
// returned in *kth, and in *want how many items equal to it are among the k largest (the rest,
// k - *want, are above it). Every thread of the block must call it; the result is the same for
// all threads. `hist`: 256 entries, `misc`: 2 entries of shared memory.
template <typename Src>
__device__ void block_radix_select(const Src& src, u32 count, u32 k, u32* hist, u32* misc, u32* kth, u32* want_out) {
    u32 prefix = 0, mask = 0, want = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (u32 b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        for (u32 i = threadIdx.x; i < count; i += blockDim.x) {
            u32 key = src.key(i);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            u32 w = want, digit = 0;
            for (int b = 255; b >= 0; --b) {
                u32 c = hist[b];
                if (w <= c) {
                    digit = (u32)b;
                    break;
                }
                w -= c;
            }
            misc[0] = digit;
            misc[1] = w;
        }
        __syncthreads();
        prefix |= misc[0] << shift;
        mask |= 255u << shift;
        want = misc[1];
        __syncthreads();
    }
    *kth = prefix;
    *want_out = want;
}

// Select the k largest of `count` items of `src` (`src.key(i)`: order key, `src.id(i)`: the id
// reported for item i), 1 <= k <= min(count, TOPK_MAX). On return sh.key[0..k) / sh.id[0..k) hold
// the winners in topk_before order. Every thread of the block must call it.
template <typename Src>
__device__ void block_topk(const Src& src, u32 count, u32 k, TopkShared& sh) {
    // 1. The k-th largest key; `want` items equal to it are taken, k - want are above it.
    u32 kth, want;
    block_radix_select(src, count, k, sh.hist, sh.misc, &kth, &want);
    const u32 n_gt = k - want;
    if (threadIdx.x == 0) sh.misc[2] = 0;
    __syncthreads();
    // 2. Gather: items above kth (slots claimed in any order; sorted below), then the first
    //    `want` items equal to kth in index order (block-wide ranks per tile of blockDim items).
    u32 eq_seen = 0;
    for (u32 base = 0; base < count; base += blockDim.x) {
        u32 i = base + threadIdx.x;
        bool valid = i < count;
        u32 key = valid ? src.key(i) : 0u;
        if (valid && key > kth) {
            u32 slot = atomicAdd(&sh.misc[2], 1u);
            sh.key[slot] = key;
            sh.id[slot] = src.id(i);
        }
        bool eq = valid && key == kth;
        u32 tile_eq;
        u32 r = block_rank(eq, sh.warp, &tile_eq);
        if (eq && eq_seen + r < want) {
            u32 slot = n_gt + eq_seen + r;
            sh.key[slot] = key;
            sh.id[slot] = src.id(i);
        }
        eq_seen += tile_eq;
    }
    // 3. Pad to a power of two with entries that sort last, then sort.
    u32 cap = next_pow2(k);
    for (u32 i = k + threadIdx.x; i < cap; i += blockDim.x) {
        sh.key[i] = 0u;
        sh.id[i] = 0xffffffffu;
    }
    __syncthreads();
    bitonic_sort_pairs(sh.key, sh.id, cap);
}
