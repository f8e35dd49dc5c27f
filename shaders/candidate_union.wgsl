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
// 4. the last invocation (it holds n) writes the dispatch grids of the table kernels into
//    `grids` (`write_grids`), so they run exactly as many workgroups as n needs.
// Integer work only: the result is exact and independent of timing.

struct Params {
    ld: u32,
    c: u32,
    stride: u32,
    vocab: u32,
    anchor: u32,
    // For the indirect grids of the table kernels that follow (see `write_grids`):
    rank: u32,
    pc: u32,
    chunks: u32,
    max_groups: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> top: array<u32>;
@group(0) @binding(2) var<storage, read_write> bits: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read_write> cand_out: array<u32>;
@group(0) @binding(4) var<storage, read_write> grids: array<u32>;

// One dispatch grid (x, y, 1) of `groups` workgroups at word `at`, folded into 2-D so neither
// dimension exceeds max_groups (kernels index workgroups with linear_group; extra ones exit).
fn put_grid(at: u32, groups: u32) {
    var gy = 1u;
    if (groups > p.max_groups) {
        gy = (groups + p.max_groups - 1u) / p.max_groups;
    }
    grids[at] = (groups + gy - 1u) / gy;
    grids[at + 1u] = gy;
    grids[at + 2u] = 1u;
}

// The grids of the table kernels for the actual union size n (the host could only size them
// for n_max): markov_gather.wgsl (n·r outputs, 256 per group) at word 0, then per parent chunk
// i (pc parents from p0 = i·pc): markov_bias.wgsl (ceil(rows/4)·ceil(n/64)) at 3 + 6i and
// table_topk.wgsl (ld·rows) at 6 + 6i, rows = min(pc, n - p0) (0 past n).
fn write_grids(n: u32) {
    put_grid(0u, (n * p.rank + 255u) / 256u);
    for (var i = 0u; i < p.chunks; i = i + 1u) {
        let p0 = i * p.pc;
        var rows = 0u;
        if (p0 < n) {
            rows = min(p.pc, n - p0);
        }
        put_grid(3u + 6u * i, ((rows + 3u) / 4u) * ((n + 63u) / 64u));
        put_grid(6u + 6u * i, p.ld * rows);
    }
}

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
        write_grids(at + cnt);
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
