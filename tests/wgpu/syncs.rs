//! Host-sync audit (issue 4: "one host sync per round at most, besides the small acceptance
//! read-back; no per-op `device.poll(Wait)` in the hot path"): a decoder-layer-shaped sequence
//! of every non-read-back op — embedding, rms_norm, matmul, rope, KV write, tree attention,
//! silu_mul, add_assign, concat, gather, compaction — makes the host wait zero times
//! (`WgpuBackend::host_syncs`), and each read-back op (topk, markov_table, candidate_table, sparkling_tree,
//! sample, argmax, download) waits exactly once, on both reduction paths — candidate_table
//! (SparklingTree tree prep) once where topk + markov_table wait twice. The backend is this test's own (a
//! counter shared with other tests would race).
use crate::common::*;
use crate::open;
use sparkling_core::{AttnMask, AttnShape, Backend, CandidateArgs, ReadBack, SampleParams, NO_PARENT};
use sparkling_wgpu::{Subgroups, WgpuOptions};

#[test]
fn only_read_back_ops_wait_for_the_gpu() {
    for sg in [Subgroups::Off, Subgroups::Auto] {
        let Some(g) = open(&WgpuOptions { subgroups: sg, ..Default::default() }, "sync audit") else { return };
        let mut r = Rng(9001);
        let (d, vocab, t) = (64usize, 500usize, 9usize);
        let shape = AttnShape { n_heads: 4, n_kv_heads: 2, head_dim: 16 };
        let emb = g.upload_weight(r.vec(vocab * d), vocab, d).unwrap();
        let wq = g.upload_weight(r.vec(d * d), d, d).unwrap();
        let wkv = g.upload_weight(r.vec(32 * d), 32, d).unwrap();
        let wup = g.upload_weight(r.vec(96 * d), 96, d).unwrap();
        let wdown = g.upload_weight(r.vec(d * 96), d, 96).unwrap();
        let lm = g.upload_weight(r.vec(vocab * d), vocab, d).unwrap();
        let norm = g.upload(&r.vec(d), 1, d).unwrap();
        let mut kcache = g.zeros(64, 32).unwrap();
        let mut vcache = g.zeros(64, 32).unwrap();
        let w1 = g.upload(&r.vec(vocab * 8), vocab, 8).unwrap();
        let w2 = g.upload(&r.vec(vocab * 8), vocab, 8).unwrap();
        let before = g.host_syncs();

        // A tree-verify-shaped layer over t rows (no read-back anywhere).
        let ids: Vec<u32> = (0..t as u32).map(|i| i * 37 % vocab as u32).collect();
        let positions: Vec<u32> = (20..20 + t as u32).collect();
        let parents: Vec<u32> = (0..t as u32).map(|i| if i == 0 { NO_PARENT } else { (i - 1) / 2 }).collect();
        let mut x = g.embedding(&emb, &ids).unwrap();
        let h = g.rms_norm(&x, &norm, d, 1e-5).unwrap();
        let mut q = g.matmul(&h, &wq, None).unwrap();
        let mut kv = g.matmul(&h, &wkv, None).unwrap();
        g.rope(&mut q, &positions, shape.head_dim, 10000.0).unwrap();
        g.rope(&mut kv, &positions, shape.head_dim, 10000.0).unwrap();
        g.write_rows(&mut kcache, 20, &kv).unwrap();
        g.write_rows(&mut vcache, 20, &kv).unwrap();
        let a = g.attention(&q, &kcache, &vcache, 20 + t, shape, AttnMask::Tree { parents: &parents }).unwrap();
        g.add_assign(&mut x, &a).unwrap();
        let up = g.matmul(&x, &wup, None).unwrap();
        let gate = g.matmul(&x, &wup, None).unwrap();
        let act = g.silu_mul(&gate, &up).unwrap();
        let down = g.matmul(&act, &wdown, None).unwrap();
        g.add_assign(&mut x, &down).unwrap();
        let both = g.concat_rows(&[&x, &x]).unwrap();
        let wide = g.concat_cols(&[&x, &down]).unwrap();
        let picked = g.gather_rows(&both, &[0, 3, 17]).unwrap();
        g.compact_rows(&mut kcache, 20, &[0, 2, 5]).unwrap();
        let logits = g.matmul(&x, &lm, None).unwrap();
        assert_eq!(g.host_syncs(), before, "{sg:?}: a non-read-back op waited for the GPU");
        assert_eq!((g.shape(&wide), g.shape(&picked)), ((t, 2 * d), (3, d)));

        // Each read-back op: exactly one wait.
        let step = |what: &str, f: &dyn Fn()| {
            let s0 = g.host_syncs();
            f();
            assert_eq!(g.host_syncs(), s0 + 1, "{sg:?}: {what} must wait exactly once");
        };
        step("topk", &|| {
            g.topk(&logits, 16).unwrap();
        });
        step("markov_table", &|| {
            g.markov_table(&logits, Some((&w1, &w2)), &[1, 5, 9, 200, 499], 3).unwrap();
        });
        // SparklingTree tree prep fused: top-C → union → table in one wait (with and without
        // a Markov head), where the two-call path (topk, host union, markov_table) waits twice.
        let fused =
            |head: bool| g.candidate_table(CandidateArgs { base: &logits, markov: head.then_some((&w1, &w2)), candidates: 16, anchor: 7, k: 5 }).unwrap();
        step("candidate_table (Markov head)", &|| {
            fused(true);
        });
        step("candidate_table (no head)", &|| {
            fused(false);
        });
        step("sparkling_tree (the tree built on the device)", &|| {
            let t = g
                .sparkling_tree(CandidateArgs { base: &logits, markov: Some((&w1, &w2)), candidates: 16, anchor: 7, k: 5 }, 12)
                .unwrap()
                .expect("wgpu builds the tree on the device");
            assert_eq!(t.num_nodes(), 12);
        });
        for head in [true, false] {
            let s0 = g.host_syncs();
            let mut cand = g.topk(&logits, 16).unwrap().ids;
            cand.push(7);
            cand.sort_unstable();
            cand.dedup();
            let two = g.markov_table(&logits, head.then_some((&w1, &w2)), &cand, 5).unwrap();
            assert_eq!(g.host_syncs(), s0 + 2, "{sg:?}: the two-call path waits twice");
            let one = fused(head);
            assert_eq!(one.cand, cand, "{sg:?} head {head}: fused candidates");
            assert_eq!(one, two, "{sg:?} head {head}: fused table vs the two-call path (same kernels, bit for bit)");
        }
        step("sample", &|| {
            g.sample(&logits, SampleParams { temperature: 0.8, top_k: 20, top_p: 0.9 }, &[0.3; 9]).unwrap();
        });
        step("argmax", &|| {
            g.argmax(&logits).unwrap();
        });
        step("download", &|| {
            g.download(&x).unwrap();
        });
        eprintln!("sync audit ({sg:?}, subgroups in use: {}): 0 waits for the layer, 1 per read-back op", g.uses_subgroups());
    }
}

/// `op_counts` (what `sparkling profile` reports per decode step and round): one kernel per
/// compute op, the bytes of each host upload (uniforms excepted), one host sync per read-back,
/// and no buffer created once the pool holds what a repeated op needs.
#[test]
fn op_counts_count_kernels_uploads_syncs_and_new_buffers() {
    let Some(g) = open(&WgpuOptions::default(), "op counts") else { return };
    let mut r = Rng(77);
    let (n, k) = (48usize, 40usize);
    let w = g.upload_weight(r.vec(n * k), n, k).unwrap();
    let data = r.vec(3 * k);
    let run = || {
        let x = g.upload(&data, 3, k).unwrap();
        let y = g.matmul(&x, &w, None).unwrap();
        let z = g.silu_mul(&y, &y).unwrap();
        g.download(&z).unwrap()
    };
    let first = run(); // fills the pool
    let before = g.op_counts().expect("wgpu counts its work");
    let again = run();
    let c = g.op_counts().unwrap().since(before);
    assert_eq!(again, first);
    assert_eq!(c.kernels, 2, "matmul + silu_mul");
    assert_eq!(c.bytes_uploaded, (3 * k * 4) as u64, "the input tensor only");
    assert_eq!(c.host_syncs, 1, "the download");
    assert_eq!(c.buffers_created, 0, "steady state: every buffer recycled");
    // A larger tensor than the pool has seen needs a new buffer, and is counted.
    let before = g.op_counts().unwrap();
    let big = g.upload(&vec![1.0; 1 << 16], 1 << 8, 1 << 8).unwrap();
    let c = g.op_counts().unwrap().since(before);
    assert_eq!((c.kernels, c.bytes_uploaded, c.host_syncs, c.buffers_created), (0, 1 << 18, 0, 1));
    drop(big);
}
