// SwiGLU (reference §1.3): out = silu(gate) * up = gate / (1 + exp(-gate)) * up, elementwise.

struct Params {
    len: u32,
    total: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gate: array<f32>;
@group(0) @binding(2) var<storage, read> up: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let g = linear_group(wid, nwg);
    if (g >= p.total) {
        return;
    }
    let e = g * 256u + li;
    if (e < p.len) {
        let v = gate[e];
        out[e] = v / (1.0 + exp(-v)) * up[e];
    }
}
