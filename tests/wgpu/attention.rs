//! Attention on the wgpu backend vs the CPU backend — causal prefill, tree verify with random
//! parents, full (drafter) — with GQA and awkward sizes, plus the bit-exact invariants the
//! engine relies on within one backend (chain tree = causal; a tree node = the 1-row decode
//! of its path after compaction).
//!
//! Tolerance: `|Δ| ≤ 2e-6 + 2e-5 · |want|`. Scores differ by dot-product rounding (~1e-7
//! relative for head_dim ≤ 128 with ±1 inputs) and the GPU's online softmax rescales per
//! 64-key chunk where the CPU uses one global max; outputs are convex combinations of values
//! in [-1, 1].
use crate::common::*;
use sparkling_core::{AttnMask, AttnShape, Backend, Error, RaggedSeq, ReadBack, NO_PARENT};
use sparkling_cpu::CpuBackend;
use sparkling_wgpu::WgpuBackend;

/// Random parents: row 0 is the root, row i's parent is a uniformly chosen earlier row.
fn random_parents(r: &mut Rng, t: usize) -> Vec<u32> {
    (0..t).map(|i| if i == 0 { NO_PARENT } else { r.below(i) as u32 }).collect()
}

struct Case {
    t: usize,
    prefix: usize,
    cap_extra: usize,
    shape: AttnShape,
}

/// Run one attention call on both backends with the same random q/K/V and compare.
fn compare(g: &WgpuBackend, cpu: &CpuBackend, c: &Case, mask: AttnMask<'_>, seed: u64, what: &str) {
    let AttnShape { n_heads, n_kv_heads, head_dim } = c.shape;
    let kv_len = c.prefix + c.t;
    let cap = kv_len + c.cap_extra;
    let mut r = Rng(seed);
    let q = r.vec(c.t * n_heads * head_dim);
    let k = r.vec(cap * n_kv_heads * head_dim);
    let v = r.vec(cap * n_kv_heads * head_dim);
    let kvc = n_kv_heads * head_dim;
    let got = g
        .attention(&g.upload(&q, c.t, n_heads * head_dim).unwrap(), &g.upload(&k, cap, kvc).unwrap(), &g.upload(&v, cap, kvc).unwrap(), kv_len, c.shape, mask)
        .unwrap();
    let want = cpu
        .attention(
            &cpu.upload(&q, c.t, n_heads * head_dim).unwrap(),
            &cpu.upload(&k, cap, kvc).unwrap(),
            &cpu.upload(&v, cap, kvc).unwrap(),
            kv_len,
            c.shape,
            mask,
        )
        .unwrap();
    assert_close(&format!("{what}: t {} prefix {} {:?}", c.t, c.prefix, c.shape), &g.download(&got).unwrap(), &want.data, 2e-6, 2e-5);
}

fn shapes() -> [AttnShape; 4] {
    [
        AttnShape { n_heads: 9, n_kv_heads: 3, head_dim: 64 },  // SmolLM2-135M
        AttnShape { n_heads: 4, n_kv_heads: 2, head_dim: 16 },  // tiny test targets
        AttnShape { n_heads: 2, n_kv_heads: 2, head_dim: 6 },   // MHA, tiny head
        AttnShape { n_heads: 4, n_kv_heads: 1, head_dim: 128 }, // MQA, Qwen-sized head
    ]
}

#[test]
fn causal_prefill_and_decode_match_cpu() {
    let g = gpu_or_skip!();
    let cpu = CpuBackend::new();
    for (si, shape) in shapes().into_iter().enumerate() {
        for (ci, &(t, prefix)) in [(1usize, 0usize), (1, 130), (7, 0), (65, 0), (33, 64), (3, 200)].iter().enumerate() {
            let c = Case { t, prefix, cap_extra: 5, shape };
            compare(g, &cpu, &c, AttnMask::Causal, (si * 100 + ci) as u64, "causal");
        }
    }
}

#[test]
fn full_drafter_attention_matches_cpu() {
    let g = gpu_or_skip!();
    let cpu = CpuBackend::new();
    for (si, shape) in shapes().into_iter().enumerate() {
        for (ci, &(t, prefix)) in [(16usize, 0usize), (16, 150), (7, 33), (1, 0)].iter().enumerate() {
            let c = Case { t, prefix, cap_extra: 16, shape };
            compare(g, &cpu, &c, AttnMask::Full, (1000 + si * 100 + ci) as u64, "full");
        }
    }
}

#[test]
fn tree_attention_matches_cpu_with_random_parents() {
    let g = gpu_or_skip!();
    let cpu = CpuBackend::new();
    for (si, shape) in shapes().into_iter().enumerate() {
        for (ci, &(t, prefix)) in [(1usize, 10usize), (65, 0), (65, 512), (17, 63), (100, 30)].iter().enumerate() {
            let mut r = Rng((2000 + si * 100 + ci) as u64);
            let parents = random_parents(&mut r, t);
            let c = Case { t, prefix, cap_extra: 3, shape };
            compare(g, &cpu, &c, AttnMask::Tree { parents: &parents }, (3000 + si * 100 + ci) as u64, "tree");
        }
    }
}

#[test]
fn chain_tree_is_bit_identical_to_causal_and_nodes_equal_compacted_decoding() {
    let g = gpu_or_skip!();
    let shape = AttnShape { n_heads: 9, n_kv_heads: 3, head_dim: 64 };
    let (t, prefix) = (40usize, 90usize);
    let kv_len = prefix + t;
    let kvc = shape.n_kv_heads * shape.head_dim;
    let qc = shape.n_heads * shape.head_dim;
    let mut r = Rng(77);
    let q = r.vec(t * qc);
    let k = r.vec(kv_len * kvc);
    let v = r.vec(kv_len * kvc);
    let (gq, gk, gv) = (g.upload(&q, t, qc).unwrap(), g.upload(&k, kv_len, kvc).unwrap(), g.upload(&v, kv_len, kvc).unwrap());

    // A chain is causal.
    let chain: Vec<u32> = (0..t).map(|i| if i == 0 { NO_PARENT } else { i as u32 - 1 }).collect();
    let causal = g.download(&g.attention(&gq, &gk, &gv, kv_len, shape, AttnMask::Causal).unwrap()).unwrap();
    let tree = g.download(&g.attention(&gq, &gk, &gv, kv_len, shape, AttnMask::Tree { parents: &chain }).unwrap()).unwrap();
    assert_bits("chain tree vs causal", &tree, &causal);

    // A bushy tree: node i equals a 1-row causal decode over [prefix ; path to i] compacted.
    let parents = random_parents(&mut r, t);
    let tree = g.download(&g.attention(&gq, &gk, &gv, kv_len, shape, AttnMask::Tree { parents: &parents }).unwrap()).unwrap();
    for node in [0usize, 1, 17, 39] {
        let mut path = vec![node];
        while parents[*path.last().unwrap()] != NO_PARENT {
            path.push(parents[*path.last().unwrap()] as usize);
        }
        path.reverse();
        let mut kc = g.upload(&k, kv_len, kvc).unwrap();
        let mut vc = g.upload(&v, kv_len, kvc).unwrap();
        g.compact_rows(&mut kc, prefix, &path).unwrap();
        g.compact_rows(&mut vc, prefix, &path).unwrap();
        let q1 = g.upload(&q[node * qc..(node + 1) * qc], 1, qc).unwrap();
        let one = g.download(&g.attention(&q1, &kc, &vc, prefix + path.len(), shape, AttnMask::Causal).unwrap()).unwrap();
        assert_bits(&format!("tree node {node} (path {path:?}) vs compacted decode"), &one, &tree[node * qc..(node + 1) * qc]);
    }
}

#[test]
fn attention_rejects_bad_geometry_and_parents() {
    let g = gpu_or_skip!();
    let shape = AttnShape { n_heads: 4, n_kv_heads: 2, head_dim: 8 };
    let q = g.upload(&[0.0; 2 * 32], 2, 32).unwrap();
    let kv = g.upload(&[0.0; 10 * 16], 10, 16).unwrap();
    let shape_err = |r: sparkling_core::Result<_>| matches!(r, Err(Error::Shape { .. }));
    assert!(shape_err(g.attention(&q, &kv, &kv, 11, shape, AttnMask::Causal).map(|_| ())));
    assert!(shape_err(g.attention(&q, &kv, &kv, 1, shape, AttnMask::Causal).map(|_| ())));
    assert!(shape_err(g.attention(&q, &kv, &kv, 5, AttnShape { n_kv_heads: 3, ..shape }, AttnMask::Full).map(|_| ())));
    assert!(shape_err(g.attention(&q, &kv, &kv, 5, shape, AttnMask::Tree { parents: &[NO_PARENT] }).map(|_| ())));
    assert!(matches!(g.attention(&q, &kv, &kv, 5, shape, AttnMask::Tree { parents: &[NO_PARENT, 1] }), Err(Error::Invalid(_))));
    let big = AttnShape { n_heads: 1, n_kv_heads: 1, head_dim: 512 };
    let q = g.upload(&[0.0; 512], 1, 512).unwrap();
    assert!(shape_err(g.attention(&q, &q, &q, 1, big, AttnMask::Causal).map(|_| ())));
}

/// `attention_ragged` on wgpu: one attention dispatch per sequence writing its rows of one
/// output (no gathers, no concatenation) — each sequence's rows bit-identical to `attention`
/// on that sequence alone (a causal prompt chunk after a prefix, a 1-row decode step, a tree
/// block), and refused with the sequence named when one does not fit.
#[test]
fn ragged_attention_equals_each_sequence_alone() {
    let Some(g) = crate::gpu("ragged attention") else { return };
    let shape = AttnShape { n_heads: 9, n_kv_heads: 3, head_dim: 64 };
    let (qc, kvc) = (9 * 64, 3 * 64);
    let mut r = Rng(515);
    let parents = random_parents(&mut r, 5);
    // (query rows, kv_len, mask) per sequence.
    let seqs: [(usize, usize, AttnMask<'_>); 3] = [(4, 70, AttnMask::Causal), (1, 9, AttnMask::Causal), (5, 133, AttnMask::Tree { parents: &parents })];
    let rows: usize = seqs.iter().map(|s| s.0).sum();
    let q = r.vec(rows * qc);
    let caches: Vec<(_, _)> = seqs
        .iter()
        .map(|&(_, kv, _)| (g.upload(&r.vec((kv + 3) * kvc), kv + 3, kvc).unwrap(), g.upload(&r.vec((kv + 3) * kvc), kv + 3, kvc).unwrap()))
        .collect();
    let ragged: Vec<RaggedSeq<'_, _>> =
        seqs.iter().zip(&caches).map(|(&(t, kv_len, mask), (k, v))| RaggedSeq { k_cache: k, v_cache: v, kv_len, q_rows: t, mask }).collect();
    let qt = g.upload(&q, rows, qc).unwrap();
    let before = g.op_counts().unwrap();
    let got = g.attention_ragged(&qt, &ragged, shape).unwrap();
    assert_eq!(g.op_counts().unwrap().since(before).kernels, 3, "one dispatch per sequence");
    let got = g.download(&got).unwrap();
    let mut r0 = 0;
    for (i, (s, (k, v))) in seqs.iter().zip(&caches).enumerate() {
        let qs = g.upload(&q[r0 * qc..(r0 + s.0) * qc], s.0, qc).unwrap();
        let alone = g.download(&g.attention(&qs, k, v, s.1, shape, s.2).unwrap()).unwrap();
        assert_bits(&format!("sequence {i} ragged vs alone"), &got[r0 * qc..(r0 + s.0) * qc], &alone);
        r0 += s.0;
    }
    // A sequence whose cache is shorter than its query block is refused, naming it.
    let bad: Vec<RaggedSeq<'_, _>> = seqs
        .iter()
        .zip(&caches)
        .enumerate()
        .map(|(i, (&(t, kv_len, mask), (k, v)))| RaggedSeq { k_cache: k, v_cache: v, kv_len: if i == 1 { 0 } else { kv_len }, q_rows: t, mask })
        .collect();
    let Err(e) = g.attention_ragged(&qt, &bad, shape) else { panic!("kv_len below q_rows is refused") };
    let e = e.to_string();
    assert!(e.contains("sequence 1"), "{e}");
}
