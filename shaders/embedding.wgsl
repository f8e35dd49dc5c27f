// out[i, :] = table[ids[i], :] for the ids that fall in one chunk of table rows
// (row0 .. row0+rows); the host dispatches once per chunk and has already rejected ids >= N.
// Chunks are stored transposed (Wᵀ[K, stride], see matmul.wgsl): element (id, c) of the chunk
// is at c * stride + (id - row0). The host prepends prelude.wgsl and a weight prelude (binding 1,
// `load_w`).

struct Params {
    n_ids: u32,
    k: u32,     // columns
    row0: u32,  // first table row of this chunk
    rows: u32,  // table rows in this chunk
    total: u32, // workgroups
    stride: u32, // row stride of the stored Wᵀ chunk
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let g = linear_group(wid, nwg);
    if (g >= p.total) {
        return;
    }
    let e = g * 256u + li;
    if (e >= p.n_ids * p.k) {
        return;
    }
    let i = e / p.k;
    let c = e % p.k;
    let id = ids[i];
    if (id >= p.row0 && id < p.row0 + p.rows) {
        out[e] = load_w(c, id - p.row0);
    }
}
