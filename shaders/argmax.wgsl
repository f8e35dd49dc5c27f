// Row-wise argmax: the index of the largest value, lowest index on ties, NaN never wins, and 0
// for a row with no value above -inf (the CPU backend's `argmax` exactly). One workgroup per
// row: each invocation scans a strided slice in ascending order keeping the first strict
// maximum, then `red_argmax` (reduce.wgsl: a shared-memory tree; reduce_subgroup.wgsl:
// subgroupMax / subgroupMin per subgroup, then the subgroups in order) merges the
// (value, index) pairs preferring the larger value and, on equal values, the lower index.
// Both variants are exact and give identical results.

struct Params {
    rows: u32,
    cols: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, lane: Lane) {
    let row = linear_group(wid, nwg);
    if (row >= p.rows) {
        return;
    }
    var bv = 0.0;
    var bi = RED_NONE;
    for (var c = lane.li; c < p.cols; c += WG) {
        let v = x[row * p.cols + c];
        // First candidate: any value that is neither NaN nor -inf; then strictly greater only.
        let first = bi == RED_NONE && v == v && v >= NEG_BIG;
        if (first || (bi != RED_NONE && v > bv)) {
            bv = v;
            bi = c;
        }
    }
    let best = red_argmax(lane, bv, bi);
    if (lane.li == 0u) {
        out[row] = select(best, 0u, best == RED_NONE);
    }
}
