// The SparklingTree candidate table (reference §5.2 c, design §3): for depth row d < ld and
// parent slot p (a chunk p0 .. p0 + pc of parents per dispatch), over the n candidates
//   z[c]   = U[d, id_c] + bias[p - p0, c]     (f32 add; no bias: z[c] = U[d, id_c])
//   lse    = m + ln Σ_c exp(z[c] - m),  m = max_c z[c]
//   output the k' = min(k, n) largest z (f32::total_cmp order, ties: lower slot c first,
//   select.wgsl) as (slot c, log-probability z[c] - lse).
// The candidate buffer is [n, id_0, ..., id_{n-1}] (header word n, from the host or from
// candidate_union.wgsl), so n is read on the device (through workgroupUniformLoad: it controls
// barriers); the host sizes the grid for an upper bound n_max ≥ n and workgroups of parents
// at or beyond n exit. One workgroup per (d, p) row; output row d·n + p holds 2k' words
// [slots: k' u32][vals: k' f32], so the whole table is packed at the front of `out` with the
// actual n and k'.
// Precision: z and the selection are exact (same f32 adds as the CPU reference); lse has the
// two-level sum of topk.wgsl (relative error of Σ a few ulp), so vals differ from the CPU's
// f64 log-softmax by about 1e-6·(1 + |val|) plus the adapter's `exp` error.

struct Params {
    ld: u32,
    k: u32,
    vocab: u32,
    p0: u32,
    pc: u32,
    has_bias: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> base: array<f32>;
@group(0) @binding(2) var<storage, read> cand: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;
@group(0) @binding(5) var<storage, read_write> scratch: array<u32>;

// z of the row, cached in workgroup memory when n <= ZCAP (computed once in the first pass;
// later passes read it instead of gathering U[d, cand[c]] and the bias row again).
const ZCAP: u32 = 2048u;
var<workgroup> zbuf: array<f32, ZCAP>;

var<workgroup> wg_n: u32;

var<private> u_base: u32;
var<private> row_n: u32;
var<private> row_k: u32;
var<private> b_base: u32;
var<private> out_base: u32;
var<private> row_lse: f32;

fn z(c: u32) -> f32 {
    if (row_n <= ZCAP) {
        return zbuf[c];
    }
    return z_global(c);
}

fn z_global(c: u32) -> f32 {
    let u = base[u_base + cand[1u + c]];
    if (p.has_bias != 0u) {
        return u + bias[b_base + c];
    }
    return u;
}

fn sel_key(i: u32) -> u32 {
    return f32_key(z(i));
}

fn sel_emit(rank: u32, key: u32, i: u32) {
    out[out_base + rank] = i;
    out[out_base + row_k + rank] = bitcast<u32>(key_f32(key) - row_lse);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, lane: Lane) {
    let g = linear_group(wid, nwg);
    if (g >= p.ld * p.pc) {
        return;
    }
    let li = lane.li;
    if (li == 0u) {
        wg_n = cand[0];
    }
    let n = workgroupUniformLoad(&wg_n);
    // Parents of this chunk that exist (the chunk holds up to pc from p0; the grid is
    // ld·rows workgroups, or more when sized for n_max — those exit here).
    if (p.p0 >= n) {
        return;
    }
    let rows = min(p.pc, n - p.p0);
    if (g >= p.ld * rows) {
        return;
    }
    let d = g / rows;
    let pl = g % rows;
    let k = min(p.k, n);
    row_n = n;
    row_k = k;
    u_base = d * p.vocab;
    b_base = pl * n;
    out_base = (d * n + p.p0 + pl) * 2u * k;

    // Pass 1: max and the first radix digit; pass 2: Σ exp(z - m) and the second digit.
    var s = sel_begin(lane, k);
    var m = z_global(0u);
    for (var i = li; i < n; i = i + WG) {
        let v = z_global(i);
        if (n <= ZCAP) {
            zbuf[i] = v;
        }
        m = max(m, v);
        sel_count(s, f32_key(v));
    }
    // (red_max's barrier also publishes zbuf.)
    m = red_max(lane, m);
    s = sel_decide(lane, s);
    var sum = 0.0;
    for (var i0 = li; i0 < n; i0 = i0 + 32u * WG) {
        var blk = 0.0;
        for (var j = 0u; j < 32u; j = j + 1u) {
            let i = i0 + j * WG;
            if (i < n) {
                let v = z(i);
                blk = blk + exp(v - m);
                sel_count(s, f32_key(v));
            }
        }
        sum = sum + blk;
    }
    sum = red_sum(lane, sum);
    s = sel_decide(lane, s);
    row_lse = m;
    if (abs(m) <= MAX_F32) {
        row_lse = m + log(sum);
    }
    s = sel_run(lane, s, n);
    sel_finish(lane, s, n, k, g * 2u * k);
}
