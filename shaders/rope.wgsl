// In-place NeoX (rotate-half) RoPE with one explicit position per row (reference §1.3):
//   for each head and j < half:  (a, b) = (x[j], x[j+half])
//   x[j] = a*cos - b*sin,  x[j+half] = b*cos + a*sin,   angle = pos * inv_freq[j]
// cos/sin come from a host-built table `cs` ([max_pos][2*half]: cos then sin), computed on the
// host in f32 exactly as the CPU backend does (inv_freq in f64 cast to f32, angle = f32(pos) *
// inv_freq, f32 cos/sin), because WGSL bounds sin/cos error only on [-pi, pi].

struct Params {
    rows: u32,
    cols: u32,
    head_dim: u32,
    half: u32,
    n_pos: u32,  // rows of the cos/sin table
    total: u32,  // workgroups
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> pos: array<u32>;
@group(0) @binding(3) var<storage, read> cs: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let g = linear_group(wid, nwg);
    if (g >= p.total) {
        return;
    }
    // One invocation per (row, head, j): rows * cols / 2 in all.
    let e = g * 256u + li;
    let per_row = p.cols / 2u;
    if (e >= p.rows * per_row) {
        return;
    }
    let r = e / per_row;
    let rem = e % per_row;
    let head = rem / p.half;
    let j = rem % p.half;
    let ps = min(pos[r], p.n_pos - 1u);
    let c = cs[ps * 2u * p.half + j];
    let s = cs[ps * 2u * p.half + p.half + j];
    let i0 = r * p.cols + head * p.head_dim + j;
    let a = x[i0];
    let b = x[i0 + p.half];
    x[i0] = a * c - b * s;
    x[i0 + p.half] = b * c + a * s;
}
