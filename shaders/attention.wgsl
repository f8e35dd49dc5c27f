// Scaled dot-product attention with GQA and an f32 softmax (reference §1.3; tree masks
// DDTree §4.8, drafter's non-causal block DFlash §2.4).
//
// One workgroup per (query row i, query head h); KV head = h / group. The keys query i may see
// form a "visible sequence" in ascending slot order:
//   causal (mode 0): slots 0 ..= prefix + i
//   full   (mode 1): slots 0 .. kv_len
//   tree   (mode 2): slots 0 .. prefix, then prefix + a for each ancestor-or-self a of i in
//                    ascending order, read from `tree` = [off_0 .. off_t, entries...]
// The kernel walks that sequence in chunks of 64 ordinals with an online softmax (running max
// and sum, rescaled per chunk). Chunks are cut by ordinal, never by slot, so the result depends
// only on the visible keys themselves: a chain-shaped tree reproduces the causal mask, and a
// tree node reproduces the 1-row decode of the same path after KV compaction, bit for bit.
//
// Per key: score = (q · k) * scale with one sequential fma chain over head_dim; per chunk: max
// and sum of the 64 probabilities scanned in ordinal order; per output dim:
// o = o * alpha + sum_j p_j v_j in ascending ordinal order; finally o * (1 / l).
// Subgroup variant: would replace the per-invocation scans of the chunk's scores and
// probabilities with subgroupMax / subgroupAdd.

struct Params {
    t: u32,         // query rows
    kv_len: u32,    // valid cache rows (the last t are the query block)
    prefix: u32,    // kv_len - t
    n_heads: u32,
    group: u32,     // n_heads / n_kv_heads
    head_dim: u32,
    q_cols: u32,    // n_heads * head_dim
    kv_cols: u32,   // n_kv_heads * head_dim
    mode: u32,      // 0 causal, 1 full, 2 tree
    scale: f32,     // head_dim^-0.5
    total: u32,     // t * n_heads workgroups
    row0: u32,      // first row of this block in q and out (a ragged batch's sequence)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> kc: array<f32>;
@group(0) @binding(3) var<storage, read> vc: array<f32>;
@group(0) @binding(4) var<storage, read> tree: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

const WG: u32 = 64u;
const MAX_HD: u32 = 256u;
const DPT: u32 = MAX_HD / WG;

var<workgroup> qs: array<f32, MAX_HD>;
var<workgroup> ps: array<f32, WG>;
var<workgroup> slots: array<u32, WG>;
var<workgroup> nvis_shared: u32;

fn slot_of(i: u32, v: u32) -> u32 {
    if (p.mode == 2u && v >= p.prefix) {
        return p.prefix + tree[p.t + 1u + tree[i] + (v - p.prefix)];
    }
    return v;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let g = linear_group(wid, nwg);
    if (g >= p.total) {
        return;
    }
    let i = g / p.n_heads;
    let h = g % p.n_heads;
    let kh = h / p.group;
    let hd = p.head_dim;
    for (var d = li; d < hd; d += WG) {
        qs[d] = q[(p.row0 + i) * p.q_cols + h * hd + d];
    }
    if (li == 0u) {
        var n = p.kv_len;
        if (p.mode == 0u) {
            n = p.prefix + i + 1u;
        } else if (p.mode == 2u) {
            n = p.prefix + (tree[i + 1u] - tree[i]);
        }
        nvis_shared = n;
    }
    let n_vis = workgroupUniformLoad(&nvis_shared);

    var m = NEG_BIG;
    var l = 0.0;
    var acc: array<f32, DPT>;
    for (var r = 0u; r < DPT; r++) {
        acc[r] = 0.0;
    }
    for (var c0 = 0u; c0 < n_vis; c0 += WG) {
        let v = c0 + li;
        let valid = v < n_vis;
        var s = NEG_BIG;
        var slot = 0u;
        if (valid) {
            slot = slot_of(i, v);
            let kb = slot * p.kv_cols + kh * hd;
            var dot = 0.0;
            for (var d = 0u; d < hd; d++) {
                dot = fma(qs[d], kc[kb + d], dot);
            }
            s = dot * p.scale;
        }
        slots[li] = slot;
        ps[li] = s;
        workgroupBarrier();
        // Chunk max and sum: every invocation scans the 64 shared values itself, in ordinal
        // order (3 barriers per chunk instead of two shared-memory trees; barriers are the
        // expensive part on CPU adapters, and the scan order is fixed, so all invocations and
        // all calls agree bit for bit).
        let n_here = min(WG, n_vis - c0);
        var cm = NEG_BIG;
        for (var j = 0u; j < n_here; j++) {
            cm = max(cm, ps[j]);
        }
        let m_new = max(m, cm);
        let alpha = exp(m - m_new);
        var pv = 0.0;
        if (valid) {
            pv = exp(s - m_new);
        }
        workgroupBarrier();
        ps[li] = pv;
        workgroupBarrier();
        var cs = 0.0;
        for (var j = 0u; j < n_here; j++) {
            cs = cs + ps[j];
        }
        l = l * alpha + cs;
        for (var r = 0u; r < DPT; r++) {
            let d = li + r * WG;
            if (d < hd) {
                var a = acc[r] * alpha;
                for (var j = 0u; j < n_here; j++) {
                    a = fma(ps[j], vc[slots[j] * p.kv_cols + kh * hd + d], a);
                }
                acc[r] = a;
            }
        }
        m = m_new;
        workgroupBarrier();
    }
    let inv = 1.0 / l;
    for (var r = 0u; r < DPT; r++) {
        let d = li + r * WG;
        if (d < hd) {
            out[(p.row0 + i) * p.q_cols + h * hd + d] = acc[r] * inv;
        }
    }
}
