// The SparklingTree best-first tree on the device (reference §5.2 c, the precompute heap of
// src/tree/sparkling_table.rs `build_sparkling_precompute`), after the candidate table:
//   heap ← (logw = T[0, root, 0], depth 1, rank 0)
//   repeat until `budget` nodes or the heap is empty:
//     pop the entry e with the largest logw (ties: lower push counter first); the node is the
//     e.rank-th best child of parent e.parent at depth row e.depth - 1;
//     push its next sibling (rank + 1 < k): logw - T[.., rank] + T[.., rank + 1];
//     push its first child (depth < ld):   logw + T[depth, slot, 0].
// cand = [n, ascending candidate ids] (candidate_union.wgsl or a host upload); table = the
// packed [ld, n, 2k'] rows of table_topk.wgsl ([slots: k'][log-probs: k'], k' = min(k, n)).
// Path weights are f32 here (f64 on the host): on near-ties (~1e-7 relative) the trees may
// differ, each a valid draft.
// Output: out[0] = node count c (0xffffffff if the anchor is not a candidate), then 4 words per
// node in pop order: token, parent node index (0 = anchor), depth, bitcast(logw).
// One invocation does the whole (sequential, O(budget · log budget)) search; heap and node
// slots live in storage scratch sized by the host (5 words × (2·budget + 1), budget + 1).

struct Params {
    ld: u32,
    k: u32,
    budget: u32,
    anchor: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> cand: array<u32>;
@group(0) @binding(2) var<storage, read> tab: array<u32>;
@group(0) @binding(3) var<storage, read_write> heap: array<u32>;
@group(0) @binding(4) var<storage, read_write> node_slot: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<u32>;

struct Entry {
    logw: f32,
    counter: u32,
    parent: u32,
    depth: u32,
    rank: u32,
}

fn load(i: u32) -> Entry {
    let b = 5u * i;
    return Entry(bitcast<f32>(heap[b]), heap[b + 1u], heap[b + 2u], heap[b + 3u], heap[b + 4u]);
}

fn store(i: u32, e: Entry) {
    let b = 5u * i;
    heap[b] = bitcast<u32>(e.logw);
    heap[b + 1u] = e.counter;
    heap[b + 2u] = e.parent;
    heap[b + 3u] = e.depth;
    heap[b + 4u] = e.rank;
}

// The host comparator: heavier first, then the earlier push.
fn heavier(a: Entry, b: Entry) -> bool {
    if (a.logw != b.logw) {
        return a.logw > b.logw;
    }
    return a.counter < b.counter;
}

var<private> heap_len: u32;

fn push(e: Entry) {
    var i = heap_len;
    heap_len = heap_len + 1u;
    while (i > 0u) {
        let up = (i - 1u) / 2u;
        let pe = load(up);
        if (!heavier(e, pe)) {
            break;
        }
        store(i, pe);
        i = up;
    }
    store(i, e);
}

fn pop() -> Entry {
    let top = load(0u);
    heap_len = heap_len - 1u;
    if (heap_len > 0u) {
        let last = load(heap_len);
        var i = 0u;
        loop {
            let l = 2u * i + 1u;
            if (l >= heap_len) {
                break;
            }
            var c = l;
            if (l + 1u < heap_len && heavier(load(l + 1u), load(l))) {
                c = l + 1u;
            }
            let ce = load(c);
            if (!heavier(ce, last)) {
                break;
            }
            store(i, ce);
            i = c;
        }
        store(i, last);
    }
    return top;
}

@compute @workgroup_size(1)
fn main() {
    let n = cand[0];
    let k = min(p.k, n);
    out[0] = 0u;
    if (p.budget == 0u || p.ld == 0u || k == 0u || n == 0u) {
        return;
    }
    // The anchor's slot (binary search in the ascending candidate ids).
    var lo = 0u;
    var hi = n;
    while (lo < hi) {
        let mid = (lo + hi) / 2u;
        if (cand[1u + mid] < p.anchor) {
            lo = mid + 1u;
        } else {
            hi = mid;
        }
    }
    if (lo >= n || cand[1u + lo] != p.anchor) {
        out[0] = 0xffffffffu;
        return;
    }
    let row_words = 2u * k;
    node_slot[0] = lo;
    heap_len = 0u;
    var counter = 0u;
    push(Entry(bitcast<f32>(tab[lo * row_words + k]), 0u, 0u, 1u, 0u));
    var count = 0u;
    while (count < p.budget && heap_len > 0u) {
        let e = pop();
        let base = ((e.depth - 1u) * n + node_slot[e.parent]) * row_words;
        let slot = tab[base + e.rank];
        let v = bitcast<f32>(tab[base + k + e.rank]);
        let idx = count + 1u;
        let o = 1u + 4u * count;
        out[o] = cand[1u + slot];
        out[o + 1u] = e.parent;
        out[o + 2u] = e.depth;
        out[o + 3u] = bitcast<u32>(e.logw);
        node_slot[idx] = slot;
        count = idx;
        if (e.rank + 1u < k) {
            counter = counter + 1u;
            let v1 = bitcast<f32>(tab[base + k + e.rank + 1u]);
            push(Entry(e.logw - v + v1, counter, e.parent, e.depth, e.rank + 1u));
        }
        if (e.depth < p.ld) {
            counter = counter + 1u;
            let cb = (e.depth * n + slot) * row_words;
            push(Entry(e.logw + bitcast<f32>(tab[cb + k]), counter, idx, e.depth + 1u, 0u));
        }
    }
    out[0] = count;
}
