// In-place residual add: x += y, elementwise.

struct Params {
    len: u32,
    total: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let g = linear_group(wid, nwg);
    if (g >= p.total) {
        return;
    }
    let e = g * 256u + li;
    if (e < p.len) {
        x[e] = x[e] + y[e];
    }
}
