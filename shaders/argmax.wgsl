// Row-wise argmax: the index of the largest value, lowest index on ties, NaN never wins, and 0
// for a row with no value above -inf (the CPU backend's `argmax` exactly). One workgroup per
// row: each thread scans a strided slice in ascending order keeping the first strict maximum,
// then a shared-memory tree merges (value, index) pairs preferring the larger value and, on
// equal values, the lower index. Subgroup variant: would merge with subgroup shuffles.

struct Params {
    rows: u32,
    cols: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;
var<workgroup> rv: array<f32, WG>;
var<workgroup> ri: array<u32, WG>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = linear_group(wid, nwg);
    if (row >= p.rows) {
        return;
    }
    var bv = 0.0;
    var bi = NONE;
    for (var c = li; c < p.cols; c += WG) {
        let v = x[row * p.cols + c];
        // First candidate: any value that is neither NaN nor -inf; then strictly greater only.
        let first = bi == NONE && v == v && v >= NEG_BIG;
        if (first || (bi != NONE && v > bv)) {
            bv = v;
            bi = c;
        }
    }
    rv[li] = bv;
    ri[li] = bi;
    workgroupBarrier();
    for (var half = WG / 2u; half > 0u; half >>= 1u) {
        if (li < half) {
            let ov = rv[li + half];
            let oi = ri[li + half];
            let mv = rv[li];
            let mi = ri[li];
            let take = oi != NONE && (mi == NONE || ov > mv || (ov == mv && oi < mi));
            if (take) {
                rv[li] = ov;
                ri[li] = oi;
            }
        }
        workgroupBarrier();
    }
    if (li == 0u) {
        out[row] = select(ri[0], 0u, ri[0] == NONE);
    }
}
