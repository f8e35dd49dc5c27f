// RMSNorm over groups of `group` consecutive values (reference §1.3):
//   out = x * (1 / sqrt(mean(x²) + eps)) * w,   w: [group]
// One workgroup per group; `group = cols` normalises whole rows, `group = head_dim` is the
// Qwen3 per-head q/k norm. The sum of squares is a fixed-shape reduction (strided per-thread
// sums, then a shared-memory tree), so a group's result never depends on how many groups the
// call has. Subgroup variant: would replace the tree with subgroupAdd.

struct Params {
    group: u32,
    n_groups: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> wt: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const WG: u32 = 64u;
var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let g = linear_group(wid, nwg);
    if (g >= p.n_groups) {
        return;
    }
    let base = g * p.group;
    var s = 0.0;
    for (var c = li; c < p.group; c += WG) {
        let v = x[base + c];
        s = fma(v, v, s);
    }
    red[li] = s;
    workgroupBarrier();
    for (var half = WG / 2u; half > 0u; half >>= 1u) {
        if (li < half) {
            red[li] = red[li] + red[li + half];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(red[0] / f32(p.group) + p.eps);
    for (var c = li; c < p.group; c += WG) {
        out[base + c] = x[base + c] * inv * wt[c];
    }
}
