// Column-band copy for concat_cols: dst[r, off + c] = src[r, c] for c < src_cols.

struct Params {
    rows: u32,
    src_cols: u32,
    dst_cols: u32,
    off: u32,
    total: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let g = linear_group(wid, nwg);
    if (g >= p.total) {
        return;
    }
    let e = g * 256u + li;
    if (e < p.rows * p.src_cols) {
        let r = e / p.src_cols;
        let c = e % p.src_cols;
        dst[r * p.dst_cols + p.off + c] = src[e];
    }
}
