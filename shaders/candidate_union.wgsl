// The SparklingTree candidate union on the device (reference §5.2 b, design §3), between the
// per-depth top-C (topk.wgsl, left on the device) and the candidate table (markov_gather /
// markov_bias / table_topk.wgsl): the sorted, deduplicated set
//   cand = { top[d, j] : d < ld, j < C } ∪ { anchor }
// where top is topk.wgsl's output [ld, stride] (stride = 2C + 1; the ids are the first C words
// of each row). Output: cand_out = [n, id_0, id_1, ..., id_{n-1}] — the header word n, then
// the n distinct ids in ascending order (1 ≤ n ≤ min(ld·C + 1, V)); words beyond 1 + n are
// left untouched. Every id must be < vocab (topk ids are; the host checks the anchor).
//
// ONE workgroup of WG invocations, for any vocab and any C:
// 1. zero the bitmap `bits` (ceil(vocab / 32) words of storage scratch), storageBarrier;
// 2. atomicOr every top-C id of every row, and the anchor, into the bitmap; storageBarrier;
// 3. each invocation owns a contiguous chunk of bitmap words: popcount → workgroup exclusive
//    prefix sum (scan_excl_u of reduce.wgsl) → writes its ids in ascending order from there.
// Integer work only: the result is exact and independent of timing.

struct Params {
    ld: u32,
    c: u32,
    stride: u32,
    vocab: u32,
    anchor: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> top: array<u32>;
@group(0) @binding(2) var<storage, read_write> bits: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read_write> cand_out: array<u32>;

@compute @workgroup_size(WG)
fn main(lane: Lane) {
    let li = lane.li;
    let words = (p.vocab + 31u) / 32u;
    for (var w = li; w < words; w = w + WG) {
        atomicStore(&bits[w], 0u);
    }
    storageBarrier();
    let total = p.ld * p.c;
    for (var e = li; e < total; e = e + WG) {
        let id = top[(e / p.c) * p.stride + e % p.c];
        atomicOr(&bits[id >> 5u], 1u << (id & 31u));
    }
    if (li == 0u) {
        atomicOr(&bits[p.anchor >> 5u], 1u << (p.anchor & 31u));
    }
    storageBarrier();
    let chunk = (words + WG - 1u) / WG;
    let lo = min(words, li * chunk);
    let hi = min(words, lo + chunk);
    var cnt = 0u;
    for (var w = lo; w < hi; w = w + 1u) {
        cnt = cnt + countOneBits(atomicLoad(&bits[w]));
    }
    var at = scan_excl_u(lane, cnt);
    if (li == WG - 1u) {
        cand_out[0] = at + cnt;
    }
    for (var w = lo; w < hi; w = w + 1u) {
        var m = atomicLoad(&bits[w]);
        while (m != 0u) {
            let b = firstTrailingBit(m);
            cand_out[1u + at] = w * 32u + b;
            at = at + 1u;
            m = m & (m - 1u);
        }
    }
}
