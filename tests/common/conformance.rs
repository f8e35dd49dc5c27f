//! Backend-generic conformance checks against the CPU reference backend (docs/design.md §5): every
//! op on awkward sizes, and every method's greedy tokens on the random models of the exactness
//! matrix. A device backend's test binary implements [`Device`] (how to open the backend, which
//! weight storages it offers) and stamps out one `#[test]` per check with
//! [`conformance_tests!`](crate::conformance_tests); the checks are the functions of [`check`].
//!
//! Tolerances (printed with the measured error by every check):
//! - matmul: `|Δ| ≤ 1e-6 + 2e-6 · Σ_k |x_ik · w_jk|` — both sides accumulate in f32 in
//!   different orders; the rounding error of either is bounded by a multiple of `Σ|x·w|`
//!   (Higham, dot products). [`Weights::round_x`] / [`Weights::round_w`] give the reference the
//!   operands as the device sees them (f16/bf16 weights, bf16 activations on a bf16 tensor-core
//!   backend; products of such values are exact in f32). Against the CPU's own f16 weights:
//!   `1e-5 + 1e-5·|want|`.
//! - rms_norm `1e-6 + 1e-5·|want|`; rope `1e-5` absolute; silu_mul `1e-6 + 1e-5·|want|`;
//!   attention `2e-6 + 2e-5·|want|`; topk lse and markov values `1e-5` absolute.
//! - embedding, add_assign, concat, gather, write_rows, compact_rows, gathered weight rows,
//!   argmax, topk ids, markov slots, candidate_table candidates and slots, sample: exact.
//! - Row independence (the engine invariant): bit-exact, within the device backend itself and
//!   across its forced kernel choices.
//! - Target logits and taps: `LOGIT_ABS + LOGIT_REL·max|row|`; a differing argmax must be a
//!   near-tie.
#![allow(dead_code)]

use super::{assert_bits, assert_close, load_drafter, load_target, params, tmpdir, write_drafter, Rng, ARCHS};
use sparkling::core::{AttnMask, AttnShape, Backend, CandidateArgs, Error, ReadBack, SampleParams, NO_PARENT};
use sparkling::cpu::{CpuBackend, WeightDtype as CpuDtype};
use sparkling::decode::{Engine, Method};
use sparkling::model::config::{DrafterKind, TargetConfig};
use sparkling::model::synth::{tiny_target_config, write_random_target, StoreDtype};
use sparkling::model::target::{LogitRows, SeqInput, Target};
use std::path::Path;

/// How the device stores an operand: identity for f32, f16/bf16 rounding otherwise.
pub type Round = fn(f32) -> f32;

/// Identity rounding (f32 weights).
pub fn exact(v: f32) -> f32 {
    v
}

/// IEEE half round-to-nearest-even.
pub fn f16(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

/// bf16 round-to-nearest-even.
pub fn bf16(v: f32) -> f32 {
    half::bf16::from_f32(v).to_f32()
}

/// One weight storage a device backend offers, with how the CPU reference sees it.
#[derive(Debug, Clone)]
pub struct Weights<O> {
    /// Printed with every measurement ("f32", "bf16").
    pub name: &'static str,
    /// The options that open the device backend with these weights.
    pub opts: O,
    /// How a matmul rounds its activations on the device.
    pub round_x: Round,
    /// How the device stores weights.
    pub round_w: Round,
    /// The CPU backend's weight dtype that stores weights the same way, where there is one: the
    /// checks that run whole models against the CPU (logits) run on these storages only.
    pub cpu: Option<CpuDtype>,
}

/// A device backend under test.
pub trait Device {
    type B: Backend;
    type Options;
    /// Every weight storage the device offers, f32 first.
    fn weights() -> Vec<Weights<Self::Options>>;
    /// Forced kernel choices with f32 weights (name, options): each must give the default
    /// choice's results bit for bit, and matches the CPU on the shapes it is cheap at.
    fn kernel_variants() -> Vec<(&'static str, Self::Options)> {
        Vec::new()
    }
    /// The backend with `opts`, or `None` after a loud skip when the device is absent (a
    /// failure where the device's require variable is set).
    fn open(opts: &Self::Options, test: &str) -> Option<Self::B>;
    /// How many of the two prompts each case of the engine-level checks runs.
    const PROMPTS: Prompts;
    /// Tree budgets of the reduced-vocabulary check.
    const REDUCED_VOCAB_BUDGETS: &'static [usize];
}

/// `conformance_tests!(MyDevice);` — one `#[test]` per function of [`check`], run on the
/// [`Device`] `MyDevice`.
#[macro_export]
macro_rules! conformance_tests {
    ($device:ty) => {
        $crate::conformance_tests!(@each $device;
            matmul_matches_cpu,
            rows_do_not_depend_on_the_batch,
            attention_matches_cpu,
            elementwise_and_copies_match_cpu,
            gathered_weight_rows_are_the_rows,
            zeros_upload_and_download_round_trip,
            bad_shapes_are_errors_not_panics,
            selection_matches_cpu,
            candidate_table_matches_cpu,
            sparkling_tree_on_the_device_matches_the_host_heap,
            target_logits_match_cpu,
            every_method_gives_the_cpu_greedy_tokens,
            every_method_matches_its_own_ar_on_reduced_precision_weights,
            every_method_matches_ar_with_a_reduced_draft_vocabulary
        );
    };
    (@each $device:ty; $($check:ident),*) => {
        $(
            #[test]
            fn $check() {
                $crate::common::conformance::check::$check::<$device>();
            }
        )*
    };
}

/// The matmul shapes (m, k, n, bias): 1 row, 7×33, 65×576·1536, 33 and 129 rows (across the
/// 32-row tile and the 128-row GEMM block), 1×3·5, vocab-wide N.
const MATMUL_SHAPES: [(usize, usize, usize, bool); 12] = [
    (1, 1, 1, false),
    (1, 3, 5, true),
    (1, 33, 7, true),
    (1, 576, 1536, false),
    (7, 33, 19, true),
    (5, 17, 3, false),
    (65, 576, 96, false),
    (65, 576, 1536, false),
    (33, 64, 65, true),
    (129, 64, 65, true),
    (2, 64, 49152, false),
    (1, 16, 151936, true),
];

/// matmul vs the CPU on [`MATMUL_SHAPES`] with and without bias, those of at most `max_work`
/// multiply-adds. `round_x`/`round_w`: how the device sees activations and weights.
pub fn matmul_matches_cpu<B: Backend>(g: &B, round_x: Round, round_w: Round, max_work: usize) {
    let cpu = CpuBackend::new();
    for (i, &(m, k, n, bias)) in MATMUL_SHAPES.iter().enumerate().filter(|(_, &(m, k, n, _))| m * k * n <= max_work) {
        let mut r = Rng(100 + i as u64);
        let x = r.vec(m * k);
        let w = r.vec(n * k);
        let bv = r.vec(n);
        let got = g
            .download(
                &g.matmul(&g.upload(&x, m, k).unwrap(), &g.upload_weight(w.clone(), n, k).unwrap(), bias.then_some(&g.upload(&bv, 1, n).unwrap())).unwrap(),
            )
            .unwrap();
        let xr: Vec<f32> = x.iter().map(|&v| round_x(v)).collect();
        let wr: Vec<f32> = w.iter().map(|&v| round_w(v)).collect();
        let want = cpu
            .matmul(&cpu.upload(&xr, m, k).unwrap(), &cpu.upload_weight(wr.clone(), n, k).unwrap(), bias.then_some(&cpu.upload(&bv, 1, n).unwrap()))
            .unwrap()
            .data;
        let mut worst = 0.0f32;
        for (e, (a, b)) in got.iter().zip(&want).enumerate() {
            let (row, col) = (e / n, e % n);
            let s: f32 = (0..k).map(|t| (xr[row * k + t] * wr[col * k + t]).abs()).sum();
            let tol = 1e-6 + 2e-6 * s;
            assert!((a - b).abs() <= tol, "matmul [{m},{k}]·[{n},{k}]ᵀ: element {e}: {a} vs {b} (tol {tol:e})");
            worst = worst.max((a - b).abs() / (1e-6 + s));
        }
        eprintln!("matmul [{m},{k}]·[{n},{k}]ᵀ bias={bias} on {}: max |Δ|/Σ|x·w| = {worst:e} (tolerance 2e-6)", g.name());
    }
}

/// A matmul on `g` vs the CPU backend storing its weights as `dtype` (the CPU's own rounding
/// of the weights, f32 activations): within `1e-5 + 1e-5·|want|`.
pub fn matmul_matches_cpu_weights<B: Backend>(g: &B, dtype: CpuDtype) {
    let cpu = CpuBackend::with_weight_dtype(dtype);
    let mut r = Rng(7);
    let (m, k, n) = (3, 40, 21);
    let (x, w) = (r.vec(m * k), r.vec(n * k));
    let got = g.download(&g.matmul(&g.upload(&x, m, k).unwrap(), &g.upload_weight(w.clone(), n, k).unwrap(), None).unwrap()).unwrap();
    let want = cpu.matmul(&cpu.upload(&x, m, k).unwrap(), &cpu.upload_weight(w, n, k).unwrap(), None).unwrap().data;
    assert_close(&format!("matmul vs the CPU's {dtype:?} weights"), &got, &want, 1e-5, 1e-5);
}

/// The engine invariant for matmul and attention: a row (and a 5-row block) computed alone
/// equals the same rows of a 65-row (and a 200-row) call bit for bit; a tree row equals the
/// causal decode of its path. Returns the full calls' outputs (to compare kernel choices).
pub fn rows_do_not_depend_on_the_batch<B: Backend>(g: &B) -> Vec<f32> {
    let mut r = Rng(31);
    let (k, n) = (96, 130);
    let x = r.vec(200 * k);
    let w = g.upload_weight(r.vec(n * k), n, k).unwrap();
    let bias = g.upload(&r.vec(n), 1, n).unwrap();
    let run = |rows: std::ops::Range<usize>| {
        g.download(&g.matmul(&g.upload(&x[rows.start * k..rows.end * k], rows.len(), k).unwrap(), &w, Some(&bias)).unwrap()).unwrap()
    };
    let mut outputs = Vec::new();
    for total in [65usize, 200] {
        let all = run(0..total);
        for i in [0usize, 1, 31, 32, 64, total - 1] {
            assert_bits(&format!("matmul row {i} alone vs in {total} rows"), &run(i..i + 1), &all[i * n..(i + 1) * n]);
            let s = i.min(total - 5);
            assert_bits(&format!("matmul 5-row block at {s} vs in {total} rows"), &run(s..s + 5), &all[s * n..(s + 5) * n]);
        }
        outputs.extend(all);
    }
    // Attention: tree row i == causal attention over [prefix ; path of i].
    let shape = AttnShape { n_heads: 4, n_kv_heads: 2, head_dim: 32 };
    let (prefix, t) = (300usize, 9usize);
    let parents = [NO_PARENT, 0, 0, 1, 1, 2, 3, 6, 7];
    let kv = prefix + t;
    let kc = r.vec(kv * 64);
    let vc = r.vec(kv * 64);
    let q = r.vec(t * 128);
    let (gk, gv) = (g.upload(&kc, kv, 64).unwrap(), g.upload(&vc, kv, 64).unwrap());
    let tree = g.download(&g.attention(&g.upload(&q, t, 128).unwrap(), &gk, &gv, kv, shape, AttnMask::Tree { parents: &parents }).unwrap()).unwrap();
    for i in [0usize, 4, 8] {
        let mut path = vec![i];
        while parents[*path.last().unwrap()] != NO_PARENT {
            path.push(parents[*path.last().unwrap()] as usize);
        }
        path.reverse();
        let rows: Vec<usize> = (0..prefix).chain(path.iter().map(|&a| prefix + a)).collect();
        let (k2, v2) = (g.gather_rows(&gk, &rows).unwrap(), g.gather_rows(&gv, &rows).unwrap());
        let one =
            g.download(&g.attention(&g.upload(&q[i * 128..(i + 1) * 128], 1, 128).unwrap(), &k2, &v2, rows.len(), shape, AttnMask::Causal).unwrap()).unwrap();
        assert_bits(&format!("tree row {i} vs causal decode of its path"), &one, &tree[i * 128..(i + 1) * 128]);
    }
    outputs.extend(tree);
    outputs
}

/// attention vs the CPU: causal / tree / full masks, GQA, long prefixes (several key splits).
pub fn attention_matches_cpu<B: Backend>(g: &B) {
    let cpu = CpuBackend::new();
    for (ci, &(heads, kvh, hd, prefix, t)) in
        [(2usize, 1usize, 4usize, 2usize, 3usize), (4, 2, 32, 300, 9), (8, 2, 64, 5000, 17), (3, 3, 128, 0, 33)].iter().enumerate()
    {
        let mut r = Rng(900 + ci as u64);
        let shape = AttnShape { n_heads: heads, n_kv_heads: kvh, head_dim: hd };
        let kv = prefix + t;
        let (kc, vc, q) = (r.vec(kv * kvh * hd), r.vec(kv * kvh * hd), r.vec(t * heads * hd));
        let mut parents = vec![NO_PARENT];
        for i in 1..t as u32 {
            parents.push((i * 7 + 3) % i);
        }
        for (name, mask) in [("causal", AttnMask::Causal), ("full", AttnMask::Full), ("tree", AttnMask::Tree { parents: &parents })] {
            let got = g
                .download(
                    &g.attention(
                        &g.upload(&q, t, heads * hd).unwrap(),
                        &g.upload(&kc, kv, kvh * hd).unwrap(),
                        &g.upload(&vc, kv, kvh * hd).unwrap(),
                        kv,
                        shape,
                        mask,
                    )
                    .unwrap(),
                )
                .unwrap();
            let want = cpu
                .attention(
                    &cpu.upload(&q, t, heads * hd).unwrap(),
                    &cpu.upload(&kc, kv, kvh * hd).unwrap(),
                    &cpu.upload(&vc, kv, kvh * hd).unwrap(),
                    kv,
                    shape,
                    mask,
                )
                .unwrap()
                .data;
            assert_close(&format!("attention {name} {heads}x{hd}/{kvh} prefix {prefix} t {t}"), &got, &want, 2e-6, 2e-5);
        }
    }
    let q = g.upload(&[0.0; 8], 1, 8).unwrap();
    let k = g.upload(&[0.0; 8], 2, 4).unwrap();
    let bad = g.attention(&q, &k, &k, 2, AttnShape { n_heads: 2, n_kv_heads: 1, head_dim: 4 }, AttnMask::Tree { parents: &[3] });
    assert!(matches!(bad, Err(Error::Invalid(_))), "a bad parent is an error");
}

/// Every other op vs the CPU (exact where the CPU's arithmetic can be reproduced).
pub fn elementwise_and_copies_match_cpu<B: Backend>(g: &B, round_w: Round) {
    let cpu = CpuBackend::new();
    let mut r = Rng(5);
    // embedding (the table as the device stores it)
    let (v, k) = (97, 33);
    let table = r.vec(v * k);
    let tr: Vec<f32> = table.iter().map(|&x| round_w(x)).collect();
    let ids = [0u32, 96, 5, 5, 44, 1, 95];
    assert_bits(
        "embedding",
        &g.download(&g.embedding(&g.upload_weight(table, v, k).unwrap(), &ids).unwrap()).unwrap(),
        &cpu.embedding(&cpu.upload_weight(tr, v, k).unwrap(), &ids).unwrap().data,
    );
    assert!(matches!(g.embedding(&g.upload_weight(vec![0.0; 6], 2, 3).unwrap(), &[2]), Err(Error::Invalid(_))));
    for (i, &(rows, cols, group)) in [(1usize, 1usize, 1usize), (7, 33, 33), (65, 576, 576), (5, 64, 16), (3, 200, 200), (3, 2560, 128)].iter().enumerate() {
        let mut r = Rng(300 + i as u64);
        let x = r.vec(rows * cols);
        let w: Vec<f32> = (0..group).map(|_| 1.0 + 0.1 * r.uniform()).collect();
        let got = g.download(&g.rms_norm(&g.upload(&x, rows, cols).unwrap(), &g.upload(&w, 1, group).unwrap(), group, 1e-6).unwrap()).unwrap();
        let want = cpu.rms_norm(&cpu.upload(&x, rows, cols).unwrap(), &cpu.upload(&w, 1, group).unwrap(), group, 1e-6).unwrap().data;
        assert_close(&format!("rms_norm [{rows},{cols}] group {group}"), &got, &want, 1e-6, 1e-5);
    }
    for (i, &(rows, heads, hd, theta, max_pos)) in
        [(1usize, 1usize, 2usize, 10000.0f32, 1u32), (7, 4, 16, 10000.0, 40), (65, 9, 64, 100000.0, 4000), (5, 2, 128, 1_000_000.0, 40000)].iter().enumerate()
    {
        let mut r = Rng(400 + i as u64);
        let cols = heads * hd;
        let x = r.vec(rows * cols);
        let pos: Vec<u32> = (0..rows).map(|_| r.below(max_pos as usize + 1) as u32).collect();
        let mut gx = g.upload(&x, rows, cols).unwrap();
        g.rope(&mut gx, &pos, hd, theta).unwrap();
        let mut cx = cpu.upload(&x, rows, cols).unwrap();
        cpu.rope(&mut cx, &pos, hd, theta).unwrap();
        assert_close(&format!("rope [{rows},{cols}] hd {hd} pos ≤ {max_pos}"), &g.download(&gx).unwrap(), &cx.data, 1e-5, 0.0);
    }
    for (i, &(rows, cols)) in [(1usize, 1usize), (7, 33), (65, 1536)].iter().enumerate() {
        let mut r = Rng(500 + i as u64);
        let a: Vec<f32> = r.vec(rows * cols).iter().map(|v| v * 8.0).collect();
        let b = r.vec(rows * cols);
        let got = g.download(&g.silu_mul(&g.upload(&a, rows, cols).unwrap(), &g.upload(&b, rows, cols).unwrap()).unwrap()).unwrap();
        let want = cpu.silu_mul(&cpu.upload(&a, rows, cols).unwrap(), &cpu.upload(&b, rows, cols).unwrap()).unwrap().data;
        assert_close(&format!("silu_mul [{rows},{cols}]"), &got, &want, 1e-6, 1e-5);
        let mut gx = g.upload(&a, rows, cols).unwrap();
        g.add_assign(&mut gx, &g.upload(&b, rows, cols).unwrap()).unwrap();
        let mut cx = cpu.upload(&a, rows, cols).unwrap();
        cpu.add_assign(&mut cx, &cpu.upload(&b, rows, cols).unwrap()).unwrap();
        assert_bits(&format!("add_assign [{rows},{cols}]"), &g.download(&gx).unwrap(), &cx.data);
    }
    // concat / gather / write_rows / compact_rows (overlapping source and destination)
    let (a, b, c) = (r.vec(7 * 33), r.vec(7 * 5), r.vec(7));
    let pg = [g.upload(&a, 7, 33).unwrap(), g.upload(&b, 7, 5).unwrap(), g.upload(&c, 7, 1).unwrap()];
    let pc = [cpu.upload(&a, 7, 33).unwrap(), cpu.upload(&b, 7, 5).unwrap(), cpu.upload(&c, 7, 1).unwrap()];
    let got = g.concat_cols(&pg.iter().collect::<Vec<_>>()).unwrap();
    assert_eq!(g.shape(&got), (7, 39));
    assert_bits("concat_cols", &g.download(&got).unwrap(), &cpu.concat_cols(&pc.iter().collect::<Vec<_>>()).unwrap().data);
    assert_bits("concat_cols single", &g.download(&g.concat_cols(&[&pg[0]]).unwrap()).unwrap(), &a);
    let (d, e) = (r.vec(4 * 33), r.vec(33));
    let got = g.concat_rows(&[&g.upload(&d, 4, 33).unwrap(), &pg[0]]).unwrap();
    assert_bits("concat_rows", &g.download(&got).unwrap(), &cpu.concat_rows(&[&cpu.upload(&d, 4, 33).unwrap(), &pc[0]]).unwrap().data);
    let got = g.concat_rows(&[&g.upload(&e, 1, 33).unwrap(), &g.upload(&d, 4, 33).unwrap(), &pg[0]]).unwrap();
    assert_eq!(g.shape(&got), (12, 33));
    let want = cpu.concat_rows(&[&cpu.upload(&e, 1, 33).unwrap(), &cpu.upload(&d, 4, 33).unwrap(), &pc[0]]).unwrap().data;
    assert_bits("concat_rows of 3", &g.download(&got).unwrap(), &want);
    let idx = [6usize, 0, 0, 3, 6];
    assert_bits("gather_rows", &g.download(&g.gather_rows(&pg[0], &idx).unwrap()).unwrap(), &cpu.gather_rows(&pc[0], &idx).unwrap().data);
    let cache0 = r.vec(40 * 24);
    let src = r.vec(9 * 24);
    let (mut gc, mut cc) = (g.upload(&cache0, 40, 24).unwrap(), cpu.upload(&cache0, 40, 24).unwrap());
    g.write_rows(&mut gc, 20, &g.upload(&src, 9, 24).unwrap()).unwrap();
    cpu.write_rows(&mut cc, 20, &cpu.upload(&src, 9, 24).unwrap()).unwrap();
    assert_bits("write_rows", &g.download(&gc).unwrap(), &cc.data);
    for keep in [vec![0usize, 2, 3, 7], vec![0, 1, 2], vec![0, 8], vec![1, 0, 5, 2]] {
        g.compact_rows(&mut gc, 20, &keep).unwrap();
        cpu.compact_rows(&mut cc, 20, &keep).unwrap();
        assert_bits(&format!("compact_rows {keep:?}"), &g.download(&gc).unwrap(), &cc.data);
    }
    assert_eq!(g.download_rows(&gc, 20, 3).unwrap(), cc.data[20 * 24..23 * 24].to_vec());
    let z = g.zeros(65, 576).unwrap();
    assert!(g.download(&z).unwrap().iter().all(|&v| v == 0.0));
}

/// A bad shape is an [`Error::Shape`], not a panic or a wrong result.
pub fn bad_shapes_are_errors_not_panics<B: Backend>(g: &B) {
    let x = g.upload(&[0.0; 6], 2, 3).unwrap();
    let y = g.upload(&[0.0; 8], 2, 4).unwrap();
    let w = g.upload_weight(vec![0.0; 12], 3, 4).unwrap();
    let shape = |r: sparkling::core::Result<()>| matches!(r, Err(Error::Shape { .. }));
    assert!(shape(g.upload(&[0.0; 5], 2, 3).map(|_| ())));
    assert!(shape(g.upload_weight(vec![0.0; 5], 2, 3).map(|_| ())));
    assert!(shape(g.matmul(&x, &w, None).map(|_| ())));
    assert!(shape(g.matmul(&y, &w, Some(&x)).map(|_| ())));
    assert!(shape(g.rms_norm(&x, &y, 3, 1e-6).map(|_| ())));
    assert!(shape(g.rms_norm(&x, &x, 0, 1e-6).map(|_| ())));
    let mut x2 = g.upload(&[0.0; 6], 2, 3).unwrap();
    assert!(shape(g.rope(&mut x2, &[0, 1], 3, 1e4)));
    assert!(shape(g.rope(&mut x2, &[0], 2, 1e4)));
    assert!(shape(g.silu_mul(&x, &y).map(|_| ())));
    assert!(shape(g.add_assign(&mut x2, &y)));
    assert!(shape(g.concat_cols(&[&x, &g.upload(&[0.0; 3], 1, 3).unwrap()]).map(|_| ())));
    assert!(shape(g.concat_rows(&[&x, &y]).map(|_| ())));
    assert!(shape(g.gather_rows(&x, &[2]).map(|_| ())));
    assert!(shape(g.write_rows(&mut x2, 1, &x)));
    assert!(shape(g.compact_rows(&mut x2, 1, &[1])));
    assert!(shape(g.download_rows(&x, 1, 2).map(|_| ())));
    // An overflowing row range is a shape error, not a wrap-around.
    assert!(shape(g.download_rows(&x, usize::MAX, 2).map(|_| ())));
}

/// Uploads and downloads round-trip exactly, empty tensors included, and `zeros` is zero even
/// where the allocation reuses a buffer a dropped tensor filled.
pub fn zeros_upload_and_download_round_trip<B: Backend>(g: &B) {
    for &(rows, cols) in &[(1usize, 1usize), (7, 33), (0, 5), (65, 576)] {
        let data: Vec<f32> = (0..rows * cols).map(|i| i as f32 + 0.5).collect();
        let t = g.upload(&data, rows, cols).unwrap();
        assert_eq!(g.download(&t).unwrap(), data, "[{rows},{cols}] round trip");
        drop(t);
        let z = g.zeros(rows, cols).unwrap();
        assert_eq!(g.shape(&z), (rows, cols));
        assert!(g.download(&z).unwrap().iter().all(|&v| v == 0.0), "zeros [{rows},{cols}]");
    }
}

/// A reduced draft vocabulary's output layer: [`Backend::gather_weight_rows_async`] awaited (the
/// browser's path, which may not block) and the blocking [`ReadBack::gather_weight_rows`] give
/// the same weight, whose rows are the chosen rows (read through `embedding`, exactly); bad
/// rows are errors.
pub fn gathered_weight_rows_are_the_rows<B: Backend>(g: &B) {
    let mut r = Rng(9);
    let (v, k) = (41, 64);
    let w = g.upload_weight(r.vec(v * k), v, k).unwrap();
    let rows = [40u32, 0, 7, 7, 3];
    let want = g.download(&g.embedding(&w, &rows).unwrap()).unwrap();
    let all: Vec<u32> = (0..rows.len() as u32).collect();
    let sync = g.gather_weight_rows(&w, &rows).unwrap();
    let asy = pollster::block_on(g.gather_weight_rows_async(&w, &rows)).unwrap();
    for (name, gw) in [("sync", &sync), ("async", &asy)] {
        assert_eq!(g.weight_shape(gw), (rows.len(), k), "{name}");
        assert_bits(&format!("gathered rows {name}"), &g.download(&g.embedding(gw, &all).unwrap()).unwrap(), &want);
    }
    assert!(matches!(pollster::block_on(g.gather_weight_rows_async(&w, &[41])), Err(Error::Invalid(_))));
    assert!(matches!(pollster::block_on(g.gather_weight_rows_async(&w, &[])), Err(Error::Invalid(_))));
}

/// argmax, sample, topk and markov_table vs the CPU (ids and slots exact).
pub fn selection_matches_cpu<B: Backend>(g: &B) {
    let cpu = CpuBackend::new();
    let mut r = Rng(700);
    let cols = 49152;
    let mut x = r.vec(2 * cols);
    for &i in &[100usize, 30000, 49151] {
        x[i] = 5.0;
    }
    for &i in &[cols + 49151, cols + 7, cols + 8] {
        x[i] = 9.0;
    }
    // Vocab-wide rows whose maximum occurs several times: the lowest index wins.
    assert_eq!(g.argmax(&g.upload(&x, 2, cols).unwrap()).unwrap(), vec![100, 7]);
    assert_eq!(cpu.argmax(&cpu.upload(&x, 2, cols).unwrap()).unwrap(), vec![100, 7]);
    let (nan, ninf) = (f32::NAN, f32::NEG_INFINITY);
    for (rows, cols, data) in [
        (1usize, 1usize, vec![-3.0f32]),
        (3, 4, vec![nan, 1.0, nan, 2.0, ninf, ninf, ninf, ninf, nan, nan, nan, nan]),
        (2, 3, vec![ninf, -1e30, -1e30, f32::INFINITY, 1.0, f32::INFINITY]),
        (7, 33, r.vec(7 * 33)),
        (1, 151936, r.vec(151936)),
    ] {
        assert_eq!(
            g.argmax(&g.upload(&data, rows, cols).unwrap()).unwrap(),
            cpu.argmax(&cpu.upload(&data, rows, cols).unwrap()).unwrap(),
            "argmax [{rows},{cols}]"
        );
    }
    // sample: every filter, several uniforms; ties broken as the CPU does
    for (rows, cols) in [(5usize, 300usize), (3, 151936)] {
        let mut xs: Vec<f32> = r.vec(rows * cols).iter().map(|v| v * 4.0).collect();
        xs[3] = xs[7]; // a tie
        let (gx, cx) = (g.upload(&xs, rows, cols).unwrap(), cpu.upload(&xs, rows, cols).unwrap());
        for p in [
            SampleParams { temperature: 0.0, top_k: 0, top_p: 1.0 },
            SampleParams { temperature: 1.0, top_k: 0, top_p: 1.0 },
            SampleParams { temperature: 0.7, top_k: 20, top_p: 1.0 },
            SampleParams { temperature: 1.3, top_k: 0, top_p: 0.8 },
            SampleParams { temperature: 0.9, top_k: 50, top_p: 0.5 },
        ] {
            for trial in 0..4 {
                let u: Vec<f32> = (0..rows).map(|_| (r.uniform() + 1.0) / 2.0).collect();
                assert_eq!(g.sample(&gx, p, &u).unwrap(), cpu.sample(&cx, p, &u).unwrap(), "sample [{rows},{cols}] {p:?} trial {trial}");
            }
        }
        assert!(matches!(g.sample(&gx, SampleParams { temperature: 1.0, top_k: 0, top_p: 1.0 }, &[0.5]), Err(Error::Shape { .. })));
    }
    // topk: vocab-wide rows (several segments), ties, k = 1, k = cols, k > cols
    for (rows, cols, k) in [(16usize, 151936usize, 128usize), (3, 1000, 1), (2, 50, 50), (2, 50, 80), (4, 20000, 2048), (1, 9000, 3000)] {
        let mut xs: Vec<f32> = r.vec(rows * cols).iter().map(|v| (v * 64.0).round() / 8.0).collect();
        xs[0] = f32::NEG_INFINITY;
        let got = g.topk(&g.upload(&xs, rows, cols).unwrap(), k).unwrap();
        let want = cpu.topk(&cpu.upload(&xs, rows, cols).unwrap(), k).unwrap();
        assert_eq!((got.k, &got.ids), (want.k, &want.ids), "topk ids [{rows},{cols}] k {k}");
        assert_bits(&format!("topk vals [{rows},{cols}] k {k}"), &got.vals, &want.vals);
        assert_close(&format!("topk lse [{rows},{cols}]"), &got.lse, &want.lse, 1e-5, 1e-6);
    }
    assert!(matches!(g.topk(&g.upload(&[0.0; 4], 1, 4).unwrap(), 0), Err(Error::Invalid(_))));
    // markov_table: with and without a head, awkward candidate counts (shared and global paths)
    for (ld, vocab, rank, n, k, head) in
        [(2usize, 40usize, 3usize, 7usize, 7usize, true), (16, 5000, 32, 2049, 64, true), (2, 20000, 8, 9000, 16, true), (4, 300, 0, 33, 5, false)]
    {
        let base: Vec<f32> = r.vec(ld * vocab).iter().map(|v| (v * 32.0).round() / 4.0).collect();
        let (w1, w2) = (r.vec(vocab * rank.max(1)), r.vec(vocab * rank.max(1)));
        let mut cand: Vec<u32> = (0..n).map(|_| r.below(vocab) as u32).collect();
        cand.sort_unstable();
        cand.dedup();
        let gb = g.upload(&base, ld, vocab).unwrap();
        let (gw1, gw2) = (g.upload(&w1, vocab, rank.max(1)).unwrap(), g.upload(&w2, vocab, rank.max(1)).unwrap());
        let cb = cpu.upload(&base, ld, vocab).unwrap();
        let (cw1, cw2) = (cpu.upload(&w1, vocab, rank.max(1)).unwrap(), cpu.upload(&w2, vocab, rank.max(1)).unwrap());
        let got = g.markov_table(&gb, head.then_some((&gw1, &gw2)), &cand, k).unwrap();
        let want = cpu.markov_table(&cb, head.then_some((&cw1, &cw2)), &cand, k).unwrap();
        assert_eq!(got.k, want.k);
        assert_eq!(got.slots, want.slots, "markov slots ld {ld} n {} k {k} head {head}", cand.len());
        assert_close(&format!("markov vals ld {ld} n {} k {k} head {head}", cand.len()), &got.vals, &want.vals, 1e-5, 0.0);
    }
    let gb = g.upload(&[0.0; 10], 1, 10).unwrap();
    assert!(g.markov_table(&gb, None, &[3, 2], 1).is_err(), "unsorted candidates are an error");
    assert!(g.markov_table(&gb, None, &[10], 1).is_err(), "a candidate outside the vocabulary is an error");
}

/// candidate_table (SparklingTree tree prep: per-row top-C → union with the anchor → Markov
/// table) vs the CPU backend's (the trait default: topk + host union + markov_table):
/// candidates and slots exact, values within `1e-5`. Covers ld = 1 with C = 1, a union that
/// saturates the vocabulary, C ≥ V, V not a multiple of 32, the anchor inside and outside the
/// top-C, with and without a Markov head, SmolLM2-sized rows, and the argument errors.
pub fn candidate_table_matches_cpu<B: Backend>(g: &B) {
    let cpu = CpuBackend::new();
    let mut r = Rng(710);
    // (ld, vocab, rank, C, k, head, anchor inside the top-C)
    for (ld, vocab, rank, c, k, head, inside) in [
        (1usize, 37usize, 3usize, 1usize, 4usize, true, true),
        (1, 37, 3, 1, 4, false, false),
        (4, 100, 4, 40, 16, true, false),
        (3, 45, 2, 45, 5, true, false),
        (7, 5003, 16, 300, 9, true, false),
        (16, 49152, 32, 128, 64, true, true),
        (5, 20000, 8, 200, 8, false, true),
    ] {
        let mut base: Vec<f32> = r.vec(ld * vocab).iter().map(|v| (v * 64.0).round() / 8.0).collect();
        let anchor = if inside {
            (0..vocab).max_by(|&a, &b| base[a].total_cmp(&base[b]).then(b.cmp(&a))).unwrap() as u32
        } else {
            let a = (vocab / 2) as u32;
            for d in 0..ld {
                base[d * vocab + a as usize] = -50.0;
            }
            a
        };
        let (w1, w2) = (r.vec(vocab * rank), r.vec(vocab * rank));
        let gb = g.upload(&base, ld, vocab).unwrap();
        let (gw1, gw2) = (g.upload(&w1, vocab, rank).unwrap(), g.upload(&w2, vocab, rank).unwrap());
        let cb = cpu.upload(&base, ld, vocab).unwrap();
        let (cw1, cw2) = (cpu.upload(&w1, vocab, rank).unwrap(), cpu.upload(&w2, vocab, rank).unwrap());
        let got = g.candidate_table(CandidateArgs { base: &gb, markov: head.then_some((&gw1, &gw2)), candidates: c, anchor, k }).unwrap();
        let want = cpu.candidate_table(CandidateArgs { base: &cb, markov: head.then_some((&cw1, &cw2)), candidates: c, anchor, k }).unwrap();
        let what = format!("candidate_table ld {ld} V {vocab} C {c} k {k} head {head} anchor {anchor}");
        assert_eq!(got.cand, want.cand, "{what}: candidates");
        assert!(want.cand.binary_search(&anchor).is_ok(), "{what}: anchor in the union");
        assert_eq!(got.k, want.k, "{what}: k");
        assert_eq!(got.slots, want.slots, "{what}: slots");
        assert_close(&format!("{what}: vals (n {})", want.cand.len()), &got.vals, &want.vals, 1e-5, 0.0);
    }
    let gb = g.upload(&[0.0; 20], 2, 10).unwrap();
    assert!(matches!(g.candidate_table(CandidateArgs { base: &gb, markov: None, candidates: 3, anchor: 1, k: 0 }), Err(Error::Invalid(_))), "k = 0");
    assert!(matches!(g.candidate_table(CandidateArgs { base: &gb, markov: None, candidates: 0, anchor: 1, k: 2 }), Err(Error::Invalid(_))), "candidates = 0");
    assert!(
        matches!(g.candidate_table(CandidateArgs { base: &gb, markov: None, candidates: 3, anchor: 10, k: 2 }), Err(Error::Invalid(_))),
        "anchor outside the vocabulary"
    );
}

/// Absolute part of the logit tolerance (f32 accumulation-order differences through 4 layers).
pub const LOGIT_ABS: f32 = 1e-4;
/// Relative part, times the largest |logit| of the row.
pub const LOGIT_REL: f32 = 1e-5;

/// Gap between the two largest logits of a row.
pub fn top2_gap(row: &[f32]) -> f32 {
    let mut best = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in row {
        if v > best.0 {
            best = (v, best.0);
        } else if v > best.1 {
            best.1 = v;
        }
    }
    best.0 - best.1
}

/// Logit tolerance of a row: `LOGIT_ABS + LOGIT_REL · max|logit|`.
pub fn logit_tol(row: &[f32]) -> f32 {
    LOGIT_ABS + LOGIT_REL * row.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// Last-row logits of `t` after prefilling `ids` (one causal forward).
pub fn last_logits<B: Backend>(b: &B, t: &Target<B>, ids: &[u32]) -> Vec<f32> {
    let mut cache = t.new_cache(b, ids.len() + 1).unwrap();
    let pos: Vec<u32> = (0..ids.len() as u32).collect();
    let out = t.forward(b, &mut cache, SeqInput { ids, positions: &pos, mask: AttnMask::Causal, logits: Some(LogitRows::Last) }, &[]).unwrap();
    b.download(&out.logits).unwrap()
}

/// Length of the prefix of the CPU and device greedy runs that must agree; at the first
/// difference the CPU logits of that step must be a near-tie (reported), else panic.
pub fn agreed_prefix(cpu: &CpuBackend, ct: &Target<CpuBackend>, prompt: &[u32], want: &[u32], got: &[u32], what: &str) -> usize {
    let Some(i) = want.iter().zip(got).position(|(a, b)| a != b) else {
        assert_eq!(want.len(), got.len(), "{what}: lengths");
        return want.len();
    };
    let ctx: Vec<u32> = prompt.iter().chain(&want[..i]).copied().collect();
    let row = last_logits(cpu, ct, &ctx);
    let (gap, tol) = (top2_gap(&row), logit_tol(&row));
    assert!(
        gap < tol,
        "{what}: device token {} != CPU token {} at step {i}, and the CPU top-2 gap {gap:e} is not a near-tie (tolerance {tol:e})",
        got[i],
        want[i]
    );
    eprintln!("NEAR-TIE {what}: step {i}: CPU {} vs device {} with top-2 gap {gap:e} < {tol:e}; comparing the first {i} tokens only", want[i], got[i]);
    i
}

/// Which of a matrix's two prompts a case runs. A case's generations on a slow device
/// (lavapipe, SwiftShader: tens of ms per round) dominate the test suite's time, and the two
/// prompts exercise the same kernels, so a device test may run one prompt per case, taking
/// turns across the cases so that both prompts stay covered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prompts {
    /// Every case runs both prompts.
    Both,
    /// Case `c` runs prompt `c % 2` only.
    Alternate,
}

impl Prompts {
    /// Does case `case` run prompt `prompt` (0 or 1)?
    pub fn runs(self, prompt: usize, case: usize) -> bool {
        self == Prompts::Both || prompt == case % 2
    }
}

/// Every method's greedy tokens on `g` equal the CPU's on the exactness-matrix models (three
/// archs, DFlash and DSpark drafters, blocks 7 and 16, budgets 1 and 32), and equal `g`'s own
/// `ar` exactly. Near-ties between the two backends' `ar` runs are reported, not hidden.
/// `prompts_per_case`: see [`Prompts`] (cases: architecture × block).
pub fn every_method_gives_the_cpu_greedy_tokens<B: Backend>(g: &B, prompts_per_case: Prompts) {
    let cpu = CpuBackend::new();
    let prompts: [&[u32]; 2] = [&[3, 17, 5, 9, 22, 1], &[40, 2, 2, 7]];
    let (vocab, max_new) = (48, 32);
    let (mut compared, mut near_ties) = (0usize, 0usize);
    for (ai, arch) in ARCHS.into_iter().enumerate() {
        let tdir = tmpdir("conf-target");
        let cfg = tiny_target_config(arch, vocab);
        write_random_target(tdir.path(), &cfg, 11 + ai as u64, StoreDtype::F32).unwrap();
        let (ct, gt) = (load_target(&cpu, tdir.path()), load_target(g, tdir.path()));
        for (bi, block) in [7usize, 16].into_iter().enumerate() {
            let (d1, d2) = (tmpdir("conf-dflash"), tmpdir("conf-dspark"));
            write_drafter(d1.path(), &cfg, DrafterKind::DFlash, block, 5);
            write_drafter(d2.path(), &cfg, DrafterKind::DSpark, block, 6);
            let (cdf, gdf) = (load_drafter(&cpu, d1.path(), &cfg), load_drafter(g, d1.path(), &cfg));
            let (cds, gds) = (load_drafter(&cpu, d2.path(), &cfg), load_drafter(g, d2.path(), &cfg));
            for (pi, prompt) in prompts.into_iter().enumerate() {
                if !prompts_per_case.runs(pi, ai + bi) {
                    continue;
                }
                let p_ar = params(Method::Ar, 1, 0.0, 0, max_new, vec![]);
                let c_ar = Engine { backend: &cpu, target: &ct, drafter: None }.generate(prompt, &p_ar, &mut |_| {}).unwrap().tokens;
                let g_ar = Engine { backend: g, target: &gt, drafter: None }.generate(prompt, &p_ar, &mut |_| {}).unwrap().tokens;
                let n = agreed_prefix(&cpu, &ct, prompt, &c_ar, &g_ar, &format!("{arch:?} block {block} prompt {prompt:?} ar"));
                near_ties += usize::from(n < c_ar.len());
                for method in Method::ALL.into_iter().skip(1) {
                    let (cd, gd) = if method.drafter_kind() == Some(DrafterKind::DSpark) { (&cds, &gds) } else { (&cdf, &gdf) };
                    for budget in [1usize, 32] {
                        let p = params(method, budget, 0.0, 0, max_new, vec![]);
                        let what = format!("{arch:?} block {block} {} budget {budget} prompt {prompt:?}", method.name());
                        let gg = Engine { backend: g, target: &gt, drafter: Some(gd) }.generate(prompt, &p, &mut |_| {}).unwrap().tokens;
                        assert_eq!(gg, g_ar, "{what}: device tokens differ from the device's own ar");
                        let cc = Engine { backend: &cpu, target: &ct, drafter: Some(cd) }.generate(prompt, &p, &mut |_| {}).unwrap().tokens;
                        assert_eq!(cc, c_ar, "{what}: CPU tokens differ from CPU ar");
                        assert_eq!(&gg[..n], &cc[..n], "{what}: device vs CPU");
                        compared += 1;
                    }
                }
            }
        }
    }
    eprintln!("greedy conformance on {}: {compared} generations equal to the CPU tokens ({near_ties} near-tie divergences reported)", g.name());
}

/// The engine invariant on `g` alone: every method (budgets 1, 4, 32, 64) emits exactly `g`'s
/// own `ar` tokens on the exactness-matrix models. `prompts_per_case`: see [`Prompts`] (cases:
/// architectures).
pub fn every_method_matches_its_own_ar<B: Backend>(g: &B, prompts_per_case: Prompts) {
    let prompts: [&[u32]; 2] = [&[3, 17, 5, 9, 22, 1], &[40, 2, 2, 7]];
    let mut runs = 0usize;
    for (ai, arch) in ARCHS.into_iter().enumerate() {
        let tdir = tmpdir("own-target");
        let cfg = tiny_target_config(arch, 48);
        write_random_target(tdir.path(), &cfg, 11 + ai as u64, StoreDtype::F32).unwrap();
        let gt = load_target(g, tdir.path());
        let (d1, d2) = (tmpdir("own-dflash"), tmpdir("own-dspark"));
        write_drafter(d1.path(), &cfg, DrafterKind::DFlash, 16, 5);
        write_drafter(d2.path(), &cfg, DrafterKind::DSpark, 16, 6);
        let (gdf, gds) = (load_drafter(g, d1.path(), &cfg), load_drafter(g, d2.path(), &cfg));
        for (pi, prompt) in prompts.into_iter().enumerate() {
            if !prompts_per_case.runs(pi, ai) {
                continue;
            }
            let ar =
                Engine { backend: g, target: &gt, drafter: None }.generate(prompt, &params(Method::Ar, 1, 0.0, 0, 40, vec![]), &mut |_| {}).unwrap().tokens;
            assert_eq!(ar.len(), 40);
            for method in Method::ALL.into_iter().skip(1) {
                let d = if method.drafter_kind() == Some(DrafterKind::DSpark) { &gds } else { &gdf };
                for budget in [1usize, 4, 32, 64] {
                    let got = Engine { backend: g, target: &gt, drafter: Some(d) }
                        .generate(prompt, &params(method, budget, 0.0, 0, 40, vec![]), &mut |_| {})
                        .unwrap()
                        .tokens;
                    assert_eq!(got, ar, "{arch:?} {} budget {budget} prompt {prompt:?} on {}", method.name(), g.name());
                    runs += 1;
                }
            }
        }
    }
    eprintln!("own-ar invariant on {}: {runs} generations equal to ar", g.name());
}

/// Target logits (a causal prefill, then a 17-node tree verify with random parents) and the
/// prefill's taps within `LOGIT_ABS + LOGIT_REL·max|row|` of `cpu`'s, for all three archs;
/// rows whose argmax differ must be near-ties (reported).
pub fn target_logits_match_cpu<B: Backend>(g: &B, cpu: &CpuBackend) {
    for (ai, arch) in ARCHS.into_iter().enumerate() {
        let dir = tmpdir("conf-logits");
        let cfg = tiny_target_config(arch, 200);
        write_random_target(dir.path(), &cfg, 40 + ai as u64, StoreDtype::F32).unwrap();
        let (ct, gt) = (load_target(cpu, dir.path()), load_target(g, dir.path()));
        let prompt: Vec<u32> = (0..23u32).map(|i| (i * 37 + 5) % 200).collect();
        let pos: Vec<u32> = (0..prompt.len() as u32).collect();
        // A 17-node tree after the prompt: random parents, depths from the parents.
        let mut parents = vec![NO_PARENT];
        let mut depth = vec![0u32];
        for i in 1..17u32 {
            let p = (i * 7 + 3) % i;
            parents.push(p);
            depth.push(depth[p as usize] + 1);
        }
        let tree_ids: Vec<u32> = (0..17u32).map(|i| (i * 13 + 1) % 200).collect();
        let tree_pos: Vec<u32> = depth.iter().map(|d| prompt.len() as u32 + d).collect();
        let c = forward_pair(cpu, &ct, &prompt, &pos, &tree_ids, &tree_pos, &parents);
        let w = forward_pair(g, &gt, &prompt, &pos, &tree_ids, &tree_pos, &parents);
        let what = format!("{arch:?} on {} vs {}", g.name(), cpu.name());
        for (part, c, w) in [("prefill", &c.0, &w.0), ("tree verify", &c.1, &w.1), ("taps", &c.2, &w.2)] {
            let mut worst = 0.0f32;
            let width = if part == "taps" { c.len() / prompt.len() } else { cfg.vocab };
            for (ri, (cr, wr)) in c.chunks(width).zip(w.chunks(width)).enumerate() {
                let tol = logit_tol(cr);
                let err = cr.iter().zip(wr).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                assert!(err <= tol, "{what} {part} row {ri}: max |Δ| {err:e} > tolerance {tol:e}");
                worst = worst.max(err);
                if part != "taps" {
                    let (ca, wa) = (argmax(cr), argmax(wr));
                    if ca != wa {
                        let gap = top2_gap(cr);
                        assert!(gap < tol, "{what} {part} row {ri}: argmax {ca} vs {wa} with a top-2 gap {gap:e} ≥ tolerance {tol:e}");
                        eprintln!("NEAR-TIE {what} {part} row {ri}: argmax CPU {ca} vs device {wa}, top-2 gap {gap:e} < {tol:e}");
                    }
                }
            }
            eprintln!("{what} {part}: max |Δ| = {worst:e} (tolerance {LOGIT_ABS:e} + {LOGIT_REL:e}·max|row|)");
        }
    }
}

fn argmax(row: &[f32]) -> usize {
    row.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0
}

/// Prefill logits `[P, V]` (all rows), then tree-verify logits `[N, V]`, and the prefill taps.
fn forward_pair<B: Backend>(
    b: &B,
    t: &Target<B>,
    prompt: &[u32],
    pos: &[u32],
    tree_ids: &[u32],
    tree_pos: &[u32],
    parents: &[u32],
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut cache = t.new_cache(b, prompt.len() + tree_ids.len()).unwrap();
    let pre = t.forward(b, &mut cache, SeqInput { ids: prompt, positions: pos, mask: AttnMask::Causal, logits: Some(LogitRows::All) }, &[0, 2]).unwrap();
    let ver =
        t.forward(b, &mut cache, SeqInput { ids: tree_ids, positions: tree_pos, mask: AttnMask::Tree { parents }, logits: Some(LogitRows::All) }, &[]).unwrap();
    (b.download(&pre.logits).unwrap(), b.download(&ver.logits).unwrap(), b.download(pre.taps.as_ref().unwrap()).unwrap())
}

/// [`Backend::sparkling_tree`] (the best-first heap run on the device) builds the tree that the
/// host precompute heap builds from the same backend's [`Backend::candidate_table`]: same
/// tokens, parents and depths, scores within f32 accumulation error. The device accumulates
/// path weights in f32, the host in f64, so a divergence is accepted only at a near-tie (the
/// two competing weights within 1e-5), and reported. Returns false when `g` does not offer
/// the op (the default `None`).
pub fn sparkling_tree_matches_host_heap<B: Backend>(g: &B) -> bool {
    use sparkling::tree::build_sparkling_precompute;
    let mut r = Rng(915);
    let (mut compared, mut near_ties) = (0usize, 0usize);
    // (ld, vocab, rank, C, k, budget, head)
    for (ld, vocab, rank, c, k, budget, head) in [
        (1usize, 37usize, 3usize, 1usize, 4usize, 3usize, true),
        (4, 100, 4, 40, 16, 16, true),
        (4, 100, 4, 40, 16, 200, false),
        (7, 5003, 16, 300, 9, 64, true),
        (16, 49152, 32, 128, 64, 64, true),
        (16, 49152, 32, 128, 8, 8, true),
        (5, 2000, 8, 20, 1, 12, true),
    ] {
        let base: Vec<f32> = r.vec(ld * vocab).iter().map(|v| v * 6.0).collect();
        let anchor = (r.below(vocab)) as u32;
        let (w1, w2) = (r.vec(vocab * rank), r.vec(vocab * rank));
        let gb = g.upload(&base, ld, vocab).unwrap();
        let (gw1, gw2) = (g.upload(&w1, vocab, rank).unwrap(), g.upload(&w2, vocab, rank).unwrap());
        let m = head.then_some((&gw1, &gw2));
        let what = format!("sparkling_tree ld {ld} V {vocab} C {c} k {k} budget {budget} head {head}");
        let Some(dev) = g.sparkling_tree(CandidateArgs { base: &gb, markov: m, candidates: c, anchor, k }, budget).unwrap() else {
            eprintln!("{}: sparkling_tree not offered (host heap used); skipped", g.name());
            return false;
        };
        let table = g.candidate_table(CandidateArgs { base: &gb, markov: m, candidates: c, anchor, k }).unwrap();
        let host = build_sparkling_precompute(&table, anchor, budget);
        let n = dev.num_nodes();
        assert_eq!(n, host.num_nodes(), "{what}: node count");
        // Structural validity of the device tree on its own.
        assert_eq!((dev.tokens[0], dev.parents[0], dev.depths[0]), (anchor, NO_PARENT, 0), "{what}: root");
        for node in 1..=n {
            let par = dev.parents[node] as usize;
            assert!(par < node, "{what}: node {node} parent {par}");
            assert_eq!(dev.depths[node], dev.depths[par] + 1, "{what}: node {node} depth");
            assert!(table.cand.binary_search(&dev.tokens[node]).is_ok(), "{what}: node {node} token not a candidate");
        }
        match (1..=n).find(|&j| (dev.tokens[j], dev.parents[j], dev.depths[j]) != (host.tokens[j], host.parents[j], host.depths[j])) {
            None => {
                let tol = |s: f32| 1e-5 * (1.0 + s.abs());
                for j in 1..=n {
                    assert!((dev.scores[j] - host.scores[j]).abs() <= tol(host.scores[j]), "{what}: node {j} score {} vs {}", dev.scores[j], host.scores[j]);
                }
            }
            Some(j) => {
                let gap = (dev.scores[j] - host.scores[j]).abs();
                assert!(
                    gap <= 1e-5 * (1.0 + host.scores[j].abs()),
                    "{what}: trees differ at node {j} (device {:?}, host {:?}) without a near-tie (weights {} vs {})",
                    (dev.tokens[j], dev.parents[j], dev.depths[j]),
                    (host.tokens[j], host.parents[j], host.depths[j]),
                    dev.scores[j],
                    host.scores[j]
                );
                eprintln!("{what}: near-tie at node {j} (weights {} vs {}): trees diverge from there, both valid", dev.scores[j], host.scores[j]);
                near_ties += 1;
            }
        }
        compared += 1;
    }
    eprintln!("sparkling_tree on {}: {compared} trees compared with the host heap ({near_ties} near-tie divergences)", g.name());
    assert!(near_ties <= 1, "{near_ties} near-ties in {compared} random cases is not chance");
    true
}

/// Write a random drafter of `kind` for `target` into `full`, then its reduced copy over `v_d`
/// pseudo-random target ids (seeded; draft id order shuffled) into `out`. Returns the map.
pub fn write_reduced_drafter(full: &Path, out: &Path, target: &TargetConfig, kind: DrafterKind, block: usize, v_d: usize, seed: u64) -> Vec<u32> {
    write_drafter(full, target, kind, block, seed);
    let mut r = Rng(seed ^ 0x5EED);
    let mut ids: Vec<u32> = (0..target.vocab as u32).collect();
    for i in (1..ids.len()).rev() {
        let j = r.below(i + 1);
        ids.swap(i, j);
    }
    ids.truncate(v_d);
    sparkling::model::reduce::write_reduced_drafter(full, out, &ids, StoreDtype::Bf16, &[]).expect("reduce drafter");
    ids
}

/// Reduced draft vocabulary (issue 12): with DSpark and DFlash drafters reduced to 20 of 48
/// target tokens (so anchors fall outside the draft vocabulary in many rounds), every method,
/// host and device tree prep, every budget of `budgets`, emits exactly `g`'s own `ar` tokens at
/// T = 0 and at T = 1 (same seed), and the drafted trees do accept tokens.
/// `prompts_per_case`: see [`Prompts`] (cases: architecture × temperature).
pub fn reduced_vocab_methods_match_ar<B: Backend>(g: &B, budgets: &[usize], prompts_per_case: Prompts) {
    use sparkling::decode::propose::TreePrep;
    let prompts: [&[u32]; 2] = [&[3, 17, 5, 9, 22, 1], &[40, 2, 2, 7]];
    let (mut runs, mut accepted_rounds) = (0usize, 0usize);
    for (ai, arch) in ARCHS.into_iter().enumerate() {
        let tdir = tmpdir("red-target");
        let cfg = tiny_target_config(arch, 48);
        write_random_target(tdir.path(), &cfg, 11 + ai as u64, StoreDtype::F32).unwrap();
        let gt = load_target(g, tdir.path());
        let (f1, f2, r1, r2) = (tmpdir("red-full1"), tmpdir("red-full2"), tmpdir("red-dflash"), tmpdir("red-dspark"));
        let m1 = write_reduced_drafter(f1.path(), r1.path(), &cfg, DrafterKind::DFlash, 16, 20, 5 + ai as u64);
        write_reduced_drafter(f2.path(), r2.path(), &cfg, DrafterKind::DSpark, 16, 20, 6 + ai as u64);
        let (gdf, gds) = (load_drafter(g, r1.path(), &cfg), load_drafter(g, r2.path(), &cfg));
        assert_eq!((gdf.draft_vocab(), gds.draft_vocab()), (20, 20));
        assert_eq!(gdf.vocab_map.as_ref().unwrap().draft_to_target(), &m1[..]);
        for (pi, prompt) in prompts.into_iter().enumerate() {
            for (ti, temperature) in [0.0f32, 1.0].into_iter().enumerate() {
                if !prompts_per_case.runs(pi, ai + ti) {
                    continue;
                }
                let p_ar = params(Method::Ar, 1, temperature, 3, 40, vec![]);
                let ar = Engine { backend: g, target: &gt, drafter: None }.generate(prompt, &p_ar, &mut |_| {}).unwrap().tokens;
                assert_eq!(ar.len(), 40);
                for method in Method::ALL.into_iter().skip(1) {
                    let d = if method.drafter_kind() == Some(DrafterKind::DSpark) { &gds } else { &gdf };
                    for prep in [TreePrep::Host, TreePrep::Device] {
                        for &budget in budgets {
                            let mut p = params(method, budget, temperature, 3, 40, vec![]);
                            p.tree.prep = prep;
                            let gen = Engine { backend: g, target: &gt, drafter: Some(d) }.generate(prompt, &p, &mut |_| {}).unwrap();
                            assert_eq!(gen.tokens, ar, "{arch:?} {} {prep:?} budget {budget} T {temperature} prompt {prompt:?} on {}", method.name(), g.name());
                            accepted_rounds += gen.stats.accepted_at_depth.first().copied().unwrap_or(0);
                            runs += 1;
                        }
                    }
                }
            }
        }
    }
    eprintln!("reduced draft vocabulary on {}: {runs} generations equal to ar ({accepted_rounds} rounds accepted ≥ 1 drafted token)", g.name());
    assert!(accepted_rounds > 0, "no drafted token was ever accepted: the reduced drafters drafted nothing useful");
}

/// The checks, one `#[test]` each in every device's binary ([`conformance_tests!`](crate::conformance_tests)).
/// A check that opens the device more than once skips as a whole at the first `None`.
pub mod check {
    use super::*;

    /// Open the f32 backend of `D`, or `None` after a loud skip.
    fn f32_backend<D: Device>(test: &str) -> Option<D::B> {
        let w = D::weights().into_iter().next().expect("a device offers f32 weights");
        let g = D::open(&w.opts, test)?;
        eprintln!("{test}: {} weights on {}", w.name, g.name());
        Some(g)
    }

    /// Run `f` on `D` opened with each weight storage of `storages` in turn.
    fn each<D: Device>(test: &str, storages: Vec<Weights<D::Options>>, mut f: impl FnMut(&Weights<D::Options>, &D::B)) {
        for w in storages {
            let Some(g) = D::open(&w.opts, test) else { return };
            eprintln!("{test}: {} weights on {}", w.name, g.name());
            f(&w, &g);
        }
    }

    /// matmul vs the CPU for every weight storage (against the CPU's own rounding of the weights
    /// too, where the CPU has that storage), and for every forced kernel choice on the shapes
    /// of at most 10 M multiply-adds.
    pub fn matmul_matches_cpu<D: Device>() {
        each::<D>("matmul_matches_cpu", D::weights(), |w, g| {
            super::matmul_matches_cpu(g, w.round_x, w.round_w, usize::MAX);
            if let Some(dt) = w.cpu.filter(|&dt| dt != CpuDtype::F32) {
                matmul_matches_cpu_weights(g, dt);
            }
        });
        for (name, opts) in D::kernel_variants() {
            let Some(g) = D::open(&opts, "matmul_matches_cpu") else { return };
            eprintln!("matmul_matches_cpu: {name} on {}", g.name());
            super::matmul_matches_cpu(&g, exact, exact, 10_000_000);
        }
    }

    /// Row independence for every weight storage and kernel choice; every kernel choice gives
    /// the default's results bit for bit.
    pub fn rows_do_not_depend_on_the_batch<D: Device>() {
        let mut default = None;
        each::<D>("rows_do_not_depend_on_the_batch", D::weights(), |_, g| {
            let out = super::rows_do_not_depend_on_the_batch(g);
            default.get_or_insert(out);
        });
        let Some(default) = default else { return };
        for (name, opts) in D::kernel_variants() {
            let Some(g) = D::open(&opts, "rows_do_not_depend_on_the_batch") else { return };
            assert_bits(&format!("{name} vs the default kernels"), &super::rows_do_not_depend_on_the_batch(&g), &default);
        }
    }

    pub fn attention_matches_cpu<D: Device>() {
        let Some(g) = f32_backend::<D>("attention_matches_cpu") else { return };
        super::attention_matches_cpu(&g);
    }

    /// Every other op vs the CPU, for every weight storage (the embedding table as stored).
    pub fn elementwise_and_copies_match_cpu<D: Device>() {
        each::<D>("elementwise_and_copies_match_cpu", D::weights(), |w, g| super::elementwise_and_copies_match_cpu(g, w.round_w));
    }

    pub fn gathered_weight_rows_are_the_rows<D: Device>() {
        each::<D>("gathered_weight_rows_are_the_rows", D::weights(), |_, g| super::gathered_weight_rows_are_the_rows(g));
    }

    pub fn zeros_upload_and_download_round_trip<D: Device>() {
        let Some(g) = f32_backend::<D>("zeros_upload_and_download_round_trip") else { return };
        super::zeros_upload_and_download_round_trip(&g);
    }

    pub fn bad_shapes_are_errors_not_panics<D: Device>() {
        let Some(g) = f32_backend::<D>("bad_shapes_are_errors_not_panics") else { return };
        super::bad_shapes_are_errors_not_panics(&g);
    }

    pub fn selection_matches_cpu<D: Device>() {
        let Some(g) = f32_backend::<D>("selection_matches_cpu") else { return };
        super::selection_matches_cpu(&g);
    }

    pub fn candidate_table_matches_cpu<D: Device>() {
        let Some(g) = f32_backend::<D>("candidate_table_matches_cpu") else { return };
        super::candidate_table_matches_cpu(&g);
    }

    /// Every device backend builds SparklingTree trees on the device.
    pub fn sparkling_tree_on_the_device_matches_the_host_heap<D: Device>() {
        let Some(g) = f32_backend::<D>("sparkling_tree_on_the_device_matches_the_host_heap") else { return };
        assert!(super::sparkling_tree_matches_host_heap(&g), "the {} backend must build SparklingTree trees on the device", g.name());
    }

    /// Target logits vs the CPU for every weight storage the CPU backend also has.
    pub fn target_logits_match_cpu<D: Device>() {
        let storages = D::weights().into_iter().filter(|w| w.cpu.is_some()).collect();
        each::<D>("target_logits_match_cpu", storages, |w, g| super::target_logits_match_cpu(g, &CpuBackend::with_weight_dtype(w.cpu.unwrap())));
    }

    pub fn every_method_gives_the_cpu_greedy_tokens<D: Device>() {
        let Some(g) = f32_backend::<D>("every_method_gives_the_cpu_greedy_tokens") else { return };
        super::every_method_gives_the_cpu_greedy_tokens(&g, D::PROMPTS);
    }

    /// Reduced-precision logits differ from the CPU's f32 ones by design; the engine invariant
    /// must still hold on the device itself: every method emits exactly the device's own `ar`.
    pub fn every_method_matches_its_own_ar_on_reduced_precision_weights<D: Device>() {
        let storages = D::weights().into_iter().skip(1).collect();
        each::<D>("every_method_matches_its_own_ar_on_reduced_precision_weights", storages, |_, g| super::every_method_matches_its_own_ar(g, D::PROMPTS));
    }

    /// Device top-k, Markov table and device tree over V_d columns, the virtual anchor column,
    /// gathered lm_head rows: every method equals the device's own `ar`, with f32 weights and
    /// with the device's lowest-precision ones.
    pub fn every_method_matches_ar_with_a_reduced_draft_vocabulary<D: Device>() {
        let mut storages = D::weights();
        if storages.len() > 2 {
            storages.drain(1..storages.len() - 1);
        }
        each::<D>("every_method_matches_ar_with_a_reduced_draft_vocabulary", storages, |_, g| {
            reduced_vocab_methods_match_ar(g, D::REDUCED_VOCAB_BUDGETS, D::PROMPTS)
        });
    }
}
