// Workgroup-wide reductions and scans WITHOUT subgroup operations: the portable path, compiled
// on every adapter and always tested (platform.md §1/§4). reduce_subgroup.wgsl is its
// twin built on subgroup operations, used only when the adapter reports
// `wgpu::Features::SUBGROUP`; both define the same `Lane` struct and functions.
//
// Contract (both files):
// - the kernel source defines `const WG: u32` (invocations per workgroup, a power of two
//   <= 256) and `const NB: u32` (bins of `red_bins`, 1 <= NB <= WG) before this file (the host
//   generates these lines, backends/wgpu/src/pipelines.rs);
// - the entry point takes `lane: Lane` as an input;
// - every function is called from uniform control flow by all WG invocations.
//
// Results: `red_max`, `red_sum*`, `red_argmax` and `red_bins` return the same value to every
// invocation; `scan_excl_*` return each invocation's exclusive prefix in invocation-index order.
// Every f32 sum has a fixed shape (a pairwise tree over invocation indices here), so a result
// never depends on timing, only on the inputs. Integer results and max / argmax are exact and
// equal on both paths; f32 sums differ between the paths only by summation order (a few ulp).

struct Lane {
    @builtin(local_invocation_index) li: u32,
}

var<workgroup> red_f: array<f32, WG>;
var<workgroup> red_u: array<u32, WG>;
var<workgroup> red_bf: array<f32, NB * WG>;
var<workgroup> red_bu: array<u32, NB * WG>;

// Per-invocation bin partials reduced in place by `red_bins`.
var<private> bins_f: array<f32, NB>;
var<private> bins_u: array<u32, NB>;

// "No index" marker of `red_argmax`.
const RED_NONE: u32 = 0xffffffffu;

// Maximum over the workgroup (WGSL `max`, so NaN handling is the adapter's).
fn red_max(lane: Lane, v: f32) -> f32 {
    let li = lane.li;
    red_f[li] = v;
    workgroupBarrier();
    for (var h = WG / 2u; h > 0u; h = h / 2u) {
        if (li < h) {
            red_f[li] = max(red_f[li], red_f[li + h]);
        }
        workgroupBarrier();
    }
    return workgroupUniformLoad(&red_f[0]);
}

// Sum over the workgroup: pairwise tree, element i + h folded into element i.
fn red_sum(lane: Lane, v: f32) -> f32 {
    let li = lane.li;
    red_f[li] = v;
    workgroupBarrier();
    for (var h = WG / 2u; h > 0u; h = h / 2u) {
        if (li < h) {
            red_f[li] = red_f[li] + red_f[li + h];
        }
        workgroupBarrier();
    }
    return workgroupUniformLoad(&red_f[0]);
}

// Exclusive prefix sum of `v` over invocation indices (Hillis-Steele over the shifted values:
// a fixed tree of log2(WG) levels per prefix).
fn scan_excl_f(lane: Lane, v: f32) -> f32 {
    let li = lane.li;
    red_f[li] = v;
    workgroupBarrier();
    var x = 0.0;
    if (li > 0u) {
        x = red_f[li - 1u];
    }
    workgroupBarrier();
    red_f[li] = x;
    workgroupBarrier();
    for (var off = 1u; off < WG; off = off * 2u) {
        var y = 0.0;
        if (li >= off) {
            y = red_f[li - off];
        }
        workgroupBarrier();
        x = y + x;
        red_f[li] = x;
        workgroupBarrier();
    }
    return x;
}

// Exclusive prefix sum of u32 counts (exact, so a serial pass by invocation 0 costs 3
// barriers instead of the 2·log2(WG) + 2 of a tree).
fn scan_excl_u(lane: Lane, v: u32) -> u32 {
    let li = lane.li;
    red_u[li] = v;
    workgroupBarrier();
    if (li == 0u) {
        var acc = 0u;
        for (var j = 0u; j < WG; j = j + 1u) {
            let t = red_u[j];
            red_u[j] = acc;
            acc = acc + t;
        }
    }
    workgroupBarrier();
    let r = red_u[li];
    workgroupBarrier();
    return r;
}

// Index of the largest value; on equal values the lower index; `i == RED_NONE` marks an
// invocation without a candidate (its `v` is ignored). Returns RED_NONE when nobody has one.
fn red_argmax(lane: Lane, v: f32, i: u32) -> u32 {
    let li = lane.li;
    red_f[li] = v;
    red_u[li] = i;
    workgroupBarrier();
    for (var h = WG / 2u; h > 0u; h = h / 2u) {
        if (li < h) {
            let ov = red_f[li + h];
            let oi = red_u[li + h];
            let mv = red_f[li];
            let mi = red_u[li];
            if (oi != RED_NONE && (mi == RED_NONE || ov > mv || (ov == mv && oi < mi))) {
                red_f[li] = ov;
                red_u[li] = oi;
            }
        }
        workgroupBarrier();
    }
    return workgroupUniformLoad(&red_u[0]);
}

// Sum `bins_f[b]` and `bins_u[b]` over the workgroup for every bin b < NB, in place: afterwards
// every invocation holds the totals. One pairwise tree per bin, all bins per level at once.
fn red_bins(lane: Lane) {
    let li = lane.li;
    for (var b = 0u; b < NB; b = b + 1u) {
        red_bf[b * WG + li] = bins_f[b];
        red_bu[b * WG + li] = bins_u[b];
    }
    workgroupBarrier();
    for (var h = WG / 2u; h > 0u; h = h / 2u) {
        for (var t = li; t < NB * h; t = t + WG) {
            let at = (t / h) * WG + t % h;
            red_bf[at] = red_bf[at] + red_bf[at + h];
            red_bu[at] = red_bu[at] + red_bu[at + h];
        }
        workgroupBarrier();
    }
    for (var b = 0u; b < NB; b = b + 1u) {
        bins_f[b] = red_bf[b * WG];
        bins_u[b] = red_bu[b * WG];
    }
    workgroupBarrier();
}
