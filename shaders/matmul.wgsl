// y[M, N] = x[M, K] · W[N, K]ᵀ (+ bias[N]) for one chunk of weight rows n0 .. n0+nc
// (a weight larger than one storage binding is split into row chunks; one dispatch per chunk).
// Each chunk is stored transposed, Wᵀ[K, stride] (element (j, k) at k * stride + j, stride =
// nc rounded up to 4), so consecutive invocations (columns) read consecutive addresses.
//
// The host prepends prelude.wgsl, a weight prelude (weights_f32/f16/bf16.wgsl: binding 1 and
// `load_w`) and the tile constants WX, WY (workgroup size), TM, TN (outputs per thread) and BK
// (K tile). A workgroup computes a BM x BN = (WY*TM) x (WX*TN) output tile, staging x and W
// tiles of BK columns in workgroup memory.
//
// Numerics: every output is ONE sequential chain acc = fma(x[i,k], W[j,k], acc) over
// k = 0, 1, ..., K-1 with an f32 accumulator, then + bias. The chain does not depend on the
// tile shape or on M, so all tile variants give bit-identical results and a row of a 65-row
// call equals the same row computed alone (the Backend determinism contract).

struct Params {
    m: u32,        // rows of x
    n_total: u32,  // columns of y (all chunks)
    k: u32,        // inner dimension
    n0: u32,       // first weight row of this chunk
    nc: u32,       // weight rows in this chunk
    tiles_n: u32,  // ceil(nc / BN)
    total: u32,    // number of workgroups (tiles_n * ceil(m / BM))
    has_bias: u32, // 1 when bias is bound with N values
    stride: u32,   // row stride of the stored Wᵀ chunk (nc rounded up to 4)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

const BM: u32 = WY * TM;
const BN: u32 = WX * TN;
const THREADS: u32 = WX * WY;

var<workgroup> xs: array<f32, BM * BK>; // [row][k]
var<workgroup> ws: array<f32, BK * BN>; // [k][col]

@compute @workgroup_size(WX, WY, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let g = linear_group(wid, nwg);
    if (g >= p.total) {
        return;
    }
    let row0 = (g / p.tiles_n) * BM;
    let col0 = (g % p.tiles_n) * BN;
    var acc: array<f32, TM * TN>;
    for (var i = 0u; i < TM * TN; i++) {
        acc[i] = 0.0;
    }
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        for (var e = li; e < BM * BK; e += THREADS) {
            let r = row0 + e / BK;
            let kk = k0 + e % BK;
            var v = 0.0;
            if (r < p.m && kk < p.k) {
                v = x[r * p.k + kk];
            }
            xs[e] = v;
        }
        for (var e = li; e < BN * BK; e += THREADS) {
            let kk = e / BN;
            let c = col0 + e % BN;
            var v = 0.0;
            if (c < p.nc && k0 + kk < p.k) {
                v = load_w(k0 + kk, c);
            }
            ws[e] = v;
        }
        workgroupBarrier();
        let kend = min(BK, p.k - k0);
        for (var kk = 0u; kk < kend; kk++) {
            for (var tm = 0u; tm < TM; tm++) {
                if (row0 + lid.y * TM + tm >= p.m) {
                    break;
                }
                let xv = xs[(lid.y * TM + tm) * BK + kk];
                for (var tn = 0u; tn < TN; tn++) {
                    let idx = tm * TN + tn;
                    acc[idx] = fma(xv, ws[kk * BN + lid.x + tn * WX], acc[idx]);
                }
            }
        }
        workgroupBarrier();
    }
    for (var tm = 0u; tm < TM; tm++) {
        let r = row0 + lid.y * TM + tm;
        for (var tn = 0u; tn < TN; tn++) {
            let c = col0 + lid.x + tn * WX;
            if (r < p.m && c < p.nc) {
                var b = 0.0;
                if (p.has_bias == 1u) {
                    b = bias[p.n0 + c];
                }
                y[r * p.n_total + p.n0 + c] = acc[tm * TN + tn] + b;
            }
        }
    }
}
