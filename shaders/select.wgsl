// Row-wise exact top-k selection for one workgroup per row (used by topk.wgsl and
// table_topk.wgsl). Needs reduce.wgsl or reduce_subgroup.wgsl before it.
//
// Order: by a u32 key descending (`f32_key` of prelude.wgsl maps f32 to a key whose unsigned order is Rust's
// `f32::total_cmp`, the CPU reference's order), ties by the lower element index.
//
// Algorithm for `k` of `n` elements (1 <= k <= n):
// 1. radix select of the k-th key: up to 4 passes over the row, 8 bits each (most significant
//    first); a 256-bin histogram of the keys that match the digits chosen so far (workgroup
//    atomics: exact integer counts), then a descending scan over the bins finds the bin that
//    holds the k-th element. The selection stops early once every element of that bin belongs
//    to the top k (`need == cnt`), else after the last digit with `thr`, the k-th key itself.
//    The first passes can ride along with the kernel's own passes over the row (`sel_count`
//    per element, then `sel_decide`), so topk.wgsl reads a 152k row about 4 times, not 7.
// 2. gather (2 words per entry: key, index; in workgroup memory for k <= 256, else in
//    `scratch`): every key above the chosen bin via
//    an atomic slot counter, and the bin itself when all of it is taken; otherwise (exact key
//    ties at the k-th place) the `need` lowest indices equal to `thr` (contiguous index chunks
//    per invocation + an exclusive scan of chunk counts rank each tie in index order).
// 3. sort the k gathered entries by rank counting (entry e's rank = number of entries before
//    it in the order; entries are distinct, so ranks are a permutation) and hand each to
//    `sel_emit(rank, key, index)`.
// Everything is exact integer work: the selection equals the CPU's for every input.
//
// Use: `var s = sel_begin(lane, k);` then any number of passes `sel_count(s, key)` over every
// element followed by `s = sel_decide(lane, s);`, then `s = sel_run(lane, s, n);` and
// `sel_finish(lane, s, n, k, sbase);` — all from uniform control flow.
// The kernel provides: `fn sel_key(i: u32) -> u32` (key of element i of the current row),
// `fn sel_emit(rank: u32, key: u32, i: u32)` and the binding
// `scratch: array<u32>` (read_write; 2·k words per row starting at `sbase`).

// Selection state (uniform: every invocation holds the same copy).
struct SelState {
    // Key bits chosen so far (the bits at and above `shift` once a pass decided).
    prefix: u32,
    // Bit position of the current digit (24, 16, 8, 0).
    shift: u32,
    // Elements still to take from the chosen bin.
    need: u32,
    // Elements in the chosen bin.
    cnt: u32,
    // 1 once the threshold is known.
    done: u32,
}

var<workgroup> sel_hist: array<array<atomic<u32>, 256>, 2>;
var<workgroup> sel_ws: SelState;
var<workgroup> sel_slot: atomic<u32>;

// Gathered entries live in workgroup memory when k <= SEL_WCAP, else in `scratch`.
const SEL_WCAP: u32 = 256u;
var<workgroup> sel_buf: array<u32, 512>;

fn sel_put(k: u32, sbase: u32, slot: u32, key: u32, i: u32) {
    if (k <= SEL_WCAP) {
        sel_buf[2u * slot] = key;
        sel_buf[2u * slot + 1u] = i;
    } else {
        scratch[sbase + 2u * slot] = key;
        scratch[sbase + 2u * slot + 1u] = i;
    }
}

fn sel_get(k: u32, sbase: u32, slot: u32) -> vec2<u32> {
    if (k <= SEL_WCAP) {
        return vec2<u32>(sel_buf[2u * slot], sel_buf[2u * slot + 1u]);
    }
    return vec2<u32>(scratch[sbase + 2u * slot], scratch[sbase + 2u * slot + 1u]);
}

// Histogram of the current pass (two alternate, so the next one is cleared during a decision).
fn sel_parity(s: SelState) -> u32 {
    return (s.shift >> 3u) & 1u;
}

// Start selecting k of the row's elements (clears the histograms; ends with a barrier).
fn sel_begin(lane: Lane, k: u32) -> SelState {
    for (var b = lane.li; b < 256u; b = b + WG) {
        atomicStore(&sel_hist[0][b], 0u);
        atomicStore(&sel_hist[1][b], 0u);
    }
    if (lane.li == 0u) {
        atomicStore(&sel_slot, 0u);
    }
    workgroupBarrier();
    return SelState(0u, 24u, k, 0u, 0u);
}

// Count one element's key in the current pass (no-op once done).
fn sel_count(s: SelState, key: u32) {
    if (s.done == 0u) {
        var mask = 0u;
        if (s.shift < 24u) {
            mask = 0xffffffffu << (s.shift + 8u);
        }
        if ((key & mask) == s.prefix) {
            atomicAdd(&sel_hist[sel_parity(s)][(key >> s.shift) & 255u], 1u);
        }
    }
}

// End a pass: choose the bin holding the k-th element (after every element was counted).
fn sel_decide(lane: Lane, s: SelState) -> SelState {
    if (s.done != 0u) {
        return s;
    }
    workgroupBarrier();
    let h = sel_parity(s);
    // Invocation li owns the descending bins 255 - (li·bpt + j), j < bpt (WG divides 256).
    let bpt = 256u / WG;
    var local = 0u;
    for (var j = 0u; j < bpt; j = j + 1u) {
        local = local + atomicLoad(&sel_hist[h][255u - (lane.li * bpt + j)]);
    }
    var before = scan_excl_u(lane, local);
    for (var j = 0u; j < bpt; j = j + 1u) {
        let b = 255u - (lane.li * bpt + j);
        let c = atomicLoad(&sel_hist[h][b]);
        if (before < s.need && s.need <= before + c) {
            sel_ws = SelState(s.prefix | (b << s.shift), s.shift, s.need - before, c, 0u);
        }
        before = before + c;
    }
    for (var b = lane.li; b < 256u; b = b + WG) {
        atomicStore(&sel_hist[1u - h][b], 0u);
    }
    var r = workgroupUniformLoad(&sel_ws);
    if (r.need == r.cnt || r.shift == 0u) {
        r.done = 1u;
    } else {
        r.shift = r.shift - 8u;
    }
    return r;
}

// The remaining passes over the row (keys from `sel_key`) until the threshold is known.
fn sel_run(lane: Lane, s0: SelState, n: u32) -> SelState {
    var s = s0;
    loop {
        if (s.done != 0u) {
            break;
        }
        for (var i = lane.li; i < n; i = i + WG) {
            sel_count(s, sel_key(i));
        }
        s = sel_decide(lane, s);
    }
    return s;
}

// Gather the k selected elements and emit them in order (after `sel_run`).
fn sel_finish(lane: Lane, s: SelState, n: u32, k: u32, sbase: u32) {
    let li = lane.li;
    let mask = 0xffffffffu << s.shift;
    // Every element of the chosen bin is taken, or (shift 0) `need` of the `cnt` keys equal
    // to the threshold `prefix`, lowest indices first.
    let whole = s.need == s.cnt;
    for (var i = li; i < n; i = i + WG) {
        let key = sel_key(i);
        let top = key & mask;
        if (top > s.prefix || (whole && top == s.prefix)) {
            sel_put(k, sbase, atomicAdd(&sel_slot, 1u), key, i);
        }
    }
    if (!whole) {
        let n_gt = k - s.need;
        let chunk = (n + WG - 1u) / WG;
        let lo = min(n, li * chunk);
        let hi = min(n, lo + chunk);
        var c = 0u;
        for (var i = lo; i < hi; i = i + 1u) {
            if (sel_key(i) == s.prefix) {
                c = c + 1u;
            }
        }
        var r = scan_excl_u(lane, c);
        for (var i = lo; i < hi && r < s.need; i = i + 1u) {
            if (sel_key(i) == s.prefix) {
                sel_put(k, sbase, n_gt + r, s.prefix, i);
                r = r + 1u;
            }
        }
    }
    storageBarrier();
    workgroupBarrier();
    for (var e = li; e < k; e = e + WG) {
        let ee = sel_get(k, sbase, e);
        let ke = ee.x;
        let ie = ee.y;
        var rank = 0u;
        for (var j = 0u; j < k; j = j + 1u) {
            let jj = sel_get(k, sbase, j);
            let kj = jj.x;
            let ij = jj.y;
            if (kj > ke || (kj == ke && ij < ie)) {
                rank = rank + 1u;
            }
        }
        sel_emit(rank, ke, ie);
    }
}
