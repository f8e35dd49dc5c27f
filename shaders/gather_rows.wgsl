// Row gather: out[i, :] = x[base + idx[i], :]. Used by gather_rows (base = 0) and by KV
// compaction (reference §4.10), which gathers into a temporary first and copies back, so the
// reads of all kept rows happen before any write (overlap safe).

struct Params {
    n: u32,
    cols: u32,
    base: u32,
    total: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> idx: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let g = linear_group(wid, nwg);
    if (g >= p.total) {
        return;
    }
    let e = g * 256u + li;
    if (e < p.n * p.cols) {
        let i = e / p.cols;
        let c = e % p.cols;
        out[e] = x[(p.base + idx[i]) * p.cols + c];
    }
}
