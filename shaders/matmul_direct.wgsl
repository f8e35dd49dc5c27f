// Barrier-free variant of matmul.wgsl (same op, same bindings, same Params): y[M, N] =
// x[M, K] · W[N, K]ᵀ (+ bias) for one chunk of weight rows n0 .. n0+nc.
//
// Each invocation owns 4 consecutive output columns (one vec4 of the transposed, 4-padded
// chunk Wᵀ[K, stride]) and 4 consecutive rows, and reads x and W straight from storage: no
// workgroup memory, no barriers. Used for decode-shaped calls (M ≤ 4: a GEMV, memory bound,
// nothing to share) and for every call on CPU adapters (lavapipe/llvmpipe emulate barriers at
// a high cost and load vec4s much faster than scalars, platform.md §1). The host prepends
// prelude.wgsl and a weight prelude (binding 1, `load_w4`, `load_w16`).
//
// Numerics are those of matmul.wgsl: each output is ONE sequential chain
// acc = fma(x[i,k], W[j,k], acc) over k = 0..K-1, then + bias (a vec4 fma is four independent
// scalar fmas), so this variant and the tiled one are bit-identical and the choice between
// them never changes a result. Rows past M re-read row M-1 and are never written.

struct Params {
    m: u32,
    n_total: u32,
    k: u32,
    n0: u32,
    nc: u32,
    tiles_n: u32,  // ceil(nc / 256)
    total: u32,    // tiles_n * ceil(m / 4)
    has_bias: u32,
    stride: u32,   // row stride of the stored Wᵀ chunk (nc rounded up to 4)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

// Columns per workgroup: 64 invocations x 4.
const WGN: u32 = 256u;

fn store_row(row: u32, c: u32, v: vec4<f32>, b: vec4<f32>) {
    let o = row * p.n_total + p.n0 + c;
    let r = v + b;
    for (var j = 0u; j < 4u; j++) {
        if (c + j < p.nc) {
            y[o + j] = r[j];
        }
    }
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let g = linear_group(wid, nwg);
    if (g >= p.total) {
        return;
    }
    let c = (g % p.tiles_n) * WGN + li * 4u;
    let row0 = (g / p.tiles_n) * 4u;
    if (c >= p.nc) {
        return;
    }
    let rows = min(4u, p.m - row0);
    let last = p.m - 1u;
    let x0 = row0 * p.k;
    let x1 = min(row0 + 1u, last) * p.k;
    let x2 = min(row0 + 2u, last) * p.k;
    let x3 = min(row0 + 3u, last) * p.k;
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    // Four k at a time (`load_w16`: a quantized block's scales and payload word read once for
    // four values), then the tail; the chain per output is still k = 0, 1, 2, … in order.
    let k4 = p.k & ~3u;
    var kk = 0u;
    for (; kk < k4; kk += 4u) {
        let wm = load_w16(kk, c);
        for (var t = 0u; t < 4u; t++) {
            let wv = wm[t];
            a0 = fma(vec4<f32>(x[x0 + kk + t]), wv, a0);
            a1 = fma(vec4<f32>(x[x1 + kk + t]), wv, a1);
            a2 = fma(vec4<f32>(x[x2 + kk + t]), wv, a2);
            a3 = fma(vec4<f32>(x[x3 + kk + t]), wv, a3);
        }
    }
    for (; kk < p.k; kk++) {
        let wv = load_w4(kk, c);
        a0 = fma(vec4<f32>(x[x0 + kk]), wv, a0);
        a1 = fma(vec4<f32>(x[x1 + kk]), wv, a1);
        a2 = fma(vec4<f32>(x[x2 + kk]), wv, a2);
        a3 = fma(vec4<f32>(x[x3 + kk]), wv, a3);
    }
    var b = vec4<f32>(0.0);
    if (p.has_bias == 1u) {
        for (var j = 0u; j < 4u; j++) {
            if (c + j < p.nc) {
                b[j] = bias[p.n0 + c + j];
            }
        }
    }
    store_row(row0, c, a0, b);
    if (rows > 1u) {
        store_row(row0 + 1u, c, a1, b);
    }
    if (rows > 2u) {
        store_row(row0 + 2u, c, a2, b);
    }
    if (rows > 3u) {
        store_row(row0 + 3u, c, a3, b);
    }
}
