//! The device selection ops — `topk`, `markov_table`, `sample`, and `argmax` — vs the CPU
//! reference (`sparkling_cpu`), on BOTH reduction paths: the portable workgroup-memory kernels
//! (`Subgroups::Off`, always run) and the subgroup kernels (run too whenever the adapter
//! reports `wgpu::Features::SUBGROUP`; lavapipe does, subgroup size 8).
//!
//! What is asserted (measured errors are printed):
//! - topk: ids and values identical to the CPU's (the selection is exact integer work on the
//!   f32 bit patterns, so there are no near-ties to excuse); lse within
//!   `LSE_ABS + LSE_REL·|lse|` of the CPU's f64 value. Awkward sizes: 1 row, V = 1, k = 1, 7,
//!   64, 129, 600, k > V, V = 49152 and 151936, heavy ties, ±inf entries.
//! - markov_table: vals within `TABLE_ABS + TABLE_REL·|val|`; slots identical except where the
//!   two slots' CPU values are within the tolerance (a near-tie from f32 rounding of the bias,
//!   which the adapter may fuse into fma); every such case is printed.
//! - sample: the same token as the CPU for many seeds and uniforms at T ∈ {0.7, 1.0, 1.5} with
//!   top-k / top-p on and off. The device works in f32, the CPU in f64, so a draw may differ
//!   only when its uniform lies within `TIGHT` (relative to the kept mass) of a CDF boundary or
//!   top-p within `TIGHT` of a cumulative-mass boundary; every differing draw is printed with
//!   its margin and must be such a case. Draws within `BOUNDARY` = 1e-4 of a boundary are
//!   counted and reported (on 49k–152k-wide flat rows most uniforms are that close to some
//!   boundary, so they cannot all be avoided); the small-vocab cases redraw such uniforms.
//! - argmax: identical to the CPU on both paths.
//! - candidate_table (fused top-C → union → table, one read-back): candidates and slots
//!   identical to the CPU backend's default (topk + host union + markov_table), values within
//!   the markov_table tolerance; ld = 0 and 1, C = 1, C > 256, C ≥ V, saturating unions,
//!   V not a multiple of 32, V = 151936, the anchor inside and outside the top-C, with and
//!   without a Markov head, parent chunks under 64 KiB bindings; bad arguments are errors.
//!
//! Without an adapter every test skips loudly (fails with `SPARKLING_REQUIRE_GPU=1`).
use crate::common::*;
use crate::open;
use sparkling_core::{Backend, CandidateArgs, Error, ReadBack, SampleParams};
use sparkling_cpu::CpuBackend;
use sparkling_wgpu::{Subgroups, WgpuBackend, WgpuOptions};
use std::sync::OnceLock;

/// lse tolerance: absolute part.
const LSE_ABS: f32 = 2e-6;
/// lse tolerance: relative part (f32 rounding of `m + ln Σ`, the f32 `exp`s and the sum).
const LSE_REL: f32 = 2e-6;
/// Table log-probability tolerance: absolute part.
const TABLE_ABS: f32 = 1e-5;
/// Table log-probability tolerance: relative part.
const TABLE_REL: f32 = 2e-6;
/// Sampling: draws whose uniform (or top-p) lies within this margin (relative to the kept
/// mass) of a decision boundary are counted and reported as boundary cases.
const BOUNDARY: f64 = 1e-4;
/// Sampling: a draw may differ from the CPU's only within this margin of a boundary
/// (sample.wgsl documents an f32 CDF error of about 4e-6 relative at 152k ids).
const TIGHT: f64 = 1e-5;

/// Every reduction path this adapter offers: `[("workgroup", off)]`, plus `("subgroup", auto)`
/// when the adapter uses subgroups. Empty after a loud skip when there is no adapter.
fn paths() -> &'static [(&'static str, WgpuBackend)] {
    static P: OnceLock<Vec<(&'static str, WgpuBackend)>> = OnceLock::new();
    P.get_or_init(|| {
        let mut v = Vec::new();
        if let Some(off) = open(&WgpuOptions { subgroups: Subgroups::Off, ..Default::default() }, "workgroup path") {
            assert!(!off.uses_subgroups(), "Subgroups::Off must disable subgroups");
            v.push(("workgroup", off));
            let auto = open(&WgpuOptions::default(), "subgroup path").expect("adapter vanished");
            eprintln!(
                "select tests on {}: subgroup path {}",
                auto.name(),
                if auto.uses_subgroups() { "ENABLED (both paths tested)" } else { "not available (workgroup path only)" }
            );
            if auto.uses_subgroups() {
                v.push(("subgroup", auto));
            }
        }
        v
    })
}

macro_rules! paths_or_skip {
    () => {{
        let p = paths();
        if p.is_empty() {
            eprintln!("SKIPPED {}: no wgpu adapter", module_path!());
            return;
        }
        p
    }};
}

/// Logits with a realistic spread (about ±`scale`).
fn logits(r: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| r.uniform() * scale + r.uniform() * r.uniform() * scale).collect()
}

// ---------------------------------------------------------------------------------------- topk

fn check_topk(g: &WgpuBackend, label: &str, x: &[f32], rows: usize, cols: usize, k: usize) -> f32 {
    let cpu = CpuBackend::new();
    let want = cpu.topk(&cpu.upload(x, rows, cols).unwrap(), k).unwrap();
    let got = g.topk(&g.upload(x, rows, cols).unwrap(), k).unwrap();
    let what = format!("topk [{rows}, {cols}] k={k} ({label})");
    assert_eq!(got.k, want.k, "{what}: k");
    assert_eq!(got.ids, want.ids, "{what}: ids");
    assert_eq!(got.vals.len(), want.vals.len(), "{what}: vals length");
    for (i, (a, b)) in got.vals.iter().zip(&want.vals).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "{what}: value {i}: {a} vs {b}");
    }
    assert_eq!(got.lse.len(), want.lse.len(), "{what}: lse length");
    let mut worst = 0.0f32;
    for (i, (a, b)) in got.lse.iter().zip(&want.lse).enumerate() {
        if a.is_infinite() || b.is_infinite() {
            assert_eq!(a, b, "{what}: lse row {i}");
            continue;
        }
        let err = (a - b).abs();
        assert!(err <= LSE_ABS + LSE_REL * b.abs(), "{what}: lse row {i}: {a} vs {b} (error {err:e})");
        worst = worst.max(err);
    }
    worst
}

#[test]
fn topk_matches_cpu_on_awkward_sizes() {
    let paths = paths_or_skip!();
    let mut r = Rng(4001);
    let cases: Vec<(usize, usize, usize)> = vec![
        (1, 1, 1),
        (1, 1, 7),
        (3, 5, 7),
        (1, 7, 7),
        (4, 1000, 1),
        (3, 333, 7),
        (2, 2000, 600),
        (15, 49152, 64),
        (15, 49152, 128),
        (2, 49152, 129),
        (1, 151936, 64),
        (2, 151936, 129),
    ];
    for (label, g) in paths {
        let mut worst = 0.0f32;
        for &(rows, cols, k) in &cases {
            let x = logits(&mut r, rows * cols, 8.0);
            worst = worst.max(check_topk(g, label, &x, rows, cols, k));
        }
        eprintln!("topk ({label}): ids and values identical to the CPU; max |Δlse| = {worst:e} (tolerance {LSE_ABS:e} + {LSE_REL:e}·|lse|)");
    }
}

#[test]
fn topk_breaks_ties_by_lower_id_and_handles_special_values() {
    let paths = paths_or_skip!();
    let mut r = Rng(4002);
    let inf = f32::INFINITY;
    for (label, g) in paths {
        // Quantised logits: thousands of exact ties, the k-th value shared by many ids.
        for &(rows, cols, k) in &[(3usize, 5000usize, 64usize), (2, 49152, 129), (1, 300, 299)] {
            let x: Vec<f32> = (0..rows * cols).map(|_| (r.uniform() * 8.0).round() * 0.25).collect();
            check_topk(g, label, &x, rows, cols, k);
        }
        // All equal: the k lowest ids.
        let x = vec![0.5f32; 3000];
        check_topk(g, label, &x, 1, 3000, 100);
        let got = g.topk(&g.upload(&x, 1, 3000).unwrap(), 5).unwrap();
        assert_eq!(got.ids, vec![0, 1, 2, 3, 4]);
        // -inf entries, -0 vs +0 (total order: -0 < +0), a +inf row and an all -inf row.
        let rows = [vec![-inf, 1.0, -0.0, 0.0, -inf, 3.0, 0.0, -0.0], vec![1.0, inf, 2.0, inf, -inf, 0.0, 5.0, 5.0], vec![-inf; 8]];
        let x: Vec<f32> = rows.concat();
        check_topk(g, label, &x, 3, 8, 5);
        check_topk(g, label, &x, 3, 8, 8);
    }
}

#[test]
fn topk_bad_input_and_empty_shapes() {
    let paths = paths_or_skip!();
    for (_, g) in paths {
        let t = g.upload(&[1.0, 2.0], 1, 2).unwrap();
        assert!(matches!(g.topk(&t, 0), Err(Error::Invalid(_))));
        let e = g.zeros(0, 5).unwrap();
        let got = g.topk(&e, 3).unwrap();
        assert_eq!((got.k, got.ids.len(), got.lse.len()), (3, 0, 0));
        let e = g.zeros(2, 0).unwrap();
        let cpu = CpuBackend::new();
        assert_eq!(g.topk(&e, 3).unwrap(), cpu.topk(&cpu.zeros(2, 0).unwrap(), 3).unwrap());
    }
}

// -------------------------------------------------------------------------------- markov_table

struct TableCase {
    vocab: usize,
    rank: usize,
    n: usize,
    ld: usize,
    k: usize,
    markov: bool,
}

/// Compare one markov_table call with the CPU. Returns (max |Δval|, near-tie count).
fn check_table(g: &WgpuBackend, label: &str, c: &TableCase, seed: u64) -> (f32, usize) {
    let cpu = CpuBackend::new();
    let mut r = Rng(seed);
    let base = logits(&mut r, c.ld * c.vocab, 6.0);
    let w1: Vec<f32> = r.vec(c.vocab * c.rank).iter().map(|v| v * 0.5).collect();
    let w2: Vec<f32> = r.vec(c.vocab * c.rank).iter().map(|v| v * 0.5).collect();
    let mut cand: Vec<u32> = (0..c.n).map(|_| r.below(c.vocab) as u32).collect();
    cand.sort_unstable();
    cand.dedup();
    while cand.len() < c.n.min(c.vocab) {
        let extra = r.below(c.vocab) as u32;
        if let Err(at) = cand.binary_search(&extra) {
            cand.insert(at, extra);
        }
    }
    let (cb, c1, c2) = (cpu.upload(&base, c.ld, c.vocab).unwrap(), cpu.upload(&w1, c.vocab, c.rank).unwrap(), cpu.upload(&w2, c.vocab, c.rank).unwrap());
    let want = cpu.markov_table(&cb, c.markov.then_some((&c1, &c2)), &cand, c.k).unwrap();
    let (gb, g1, g2) = (g.upload(&base, c.ld, c.vocab).unwrap(), g.upload(&w1, c.vocab, c.rank).unwrap(), g.upload(&w2, c.vocab, c.rank).unwrap());
    let got = g.markov_table(&gb, c.markov.then_some((&g1, &g2)), &cand, c.k).unwrap();
    let what = format!("markov_table V={} r={} n={} ld={} k={} markov={} ({label})", c.vocab, c.rank, cand.len(), c.ld, c.k, c.markov);
    assert_eq!(got.k, want.k, "{what}: k");
    assert_eq!(got.vals.len(), want.vals.len(), "{what}: vals length");
    assert_eq!(got.slots.len(), want.slots.len(), "{what}: slots length");
    let kk = want.k.max(1);
    // The CPU's value of every slot (k = n), built only if a slot differs.
    let mut full: Option<sparkling_core::CandidateTable> = None;
    let n = cand.len();
    let mut worst = 0.0f32;
    let mut ties = 0;
    for (row, (gs, ws)) in got.slots.chunks(kk).zip(want.slots.chunks(kk)).enumerate() {
        let gv = &got.vals[row * kk..(row + 1) * kk];
        let wv = &want.vals[row * kk..(row + 1) * kk];
        for j in 0..kk {
            let tol = TABLE_ABS + TABLE_REL * wv[j].abs();
            let err = (gv[j] - wv[j]).abs();
            assert!(err <= tol, "{what}: row {row} entry {j}: value {} vs {} (error {err:e} > {tol:e})", gv[j], wv[j]);
            worst = worst.max(err);
            if gs[j] != ws[j] {
                // A near-tie: the CPU's own value of the device's slot is within tolerance of
                // the CPU's value at this rank.
                let f = full.get_or_insert_with(|| cpu.markov_table(&cb, c.markov.then_some((&c1, &c2)), &cand, n).unwrap());
                let frow = &f.slots[row * n..(row + 1) * n];
                let at = frow.iter().position(|&s| s == gs[j]).expect("slot in the full row");
                let alt = f.vals[row * n + at];
                assert!(
                    (alt - wv[j]).abs() <= 2.0 * tol,
                    "{what}: row {row} rank {j}: slot {} ({alt}) vs CPU slot {} ({}) is not a near-tie",
                    gs[j],
                    ws[j],
                    wv[j]
                );
                eprintln!("NEAR-TIE {what}: row {row} rank {j}: device slot {} vs CPU slot {} (CPU values {alt} / {})", gs[j], ws[j], wv[j]);
                ties += 1;
            }
        }
    }
    (worst, ties)
}

#[test]
fn markov_table_matches_cpu() {
    let paths = paths_or_skip!();
    let cases = [
        TableCase { vocab: 1, rank: 1, n: 1, ld: 1, k: 1, markov: true },
        TableCase { vocab: 50, rank: 3, n: 1, ld: 2, k: 4, markov: true },
        TableCase { vocab: 300, rank: 8, n: 37, ld: 3, k: 64, markov: true },
        TableCase { vocab: 2000, rank: 16, n: 129, ld: 7, k: 7, markov: false },
        TableCase { vocab: 5000, rank: 32, n: 1000, ld: 15, k: 64, markov: true },
        TableCase { vocab: 49152, rank: 64, n: 2000, ld: 3, k: 64, markov: true },
        TableCase { vocab: 151936, rank: 8, n: 250, ld: 2, k: 129, markov: true },
    ];
    for (label, g) in paths {
        let (mut worst, mut ties) = (0.0f32, 0usize);
        for (i, c) in cases.iter().enumerate() {
            let (w, t) = check_table(g, label, c, 5000 + i as u64);
            worst = worst.max(w);
            ties += t;
        }
        eprintln!("markov_table ({label}): max |Δval| = {worst:e} (tolerance {TABLE_ABS:e} + {TABLE_REL:e}·|val|), {ties} near-tie slot swaps");
    }
}

#[test]
fn markov_table_splits_parents_across_small_bindings() {
    // 64 KiB bindings: the bias [chunk, n] holds 81 parents at a time (3 chunks).
    let Some(g) = open(&WgpuOptions { max_binding_bytes: Some(64 << 10), subgroups: Subgroups::Off, ..Default::default() }, "small bindings") else {
        return;
    };
    let (w, t) = check_table(&g, "64 KiB bindings", &TableCase { vocab: 700, rank: 5, n: 200, ld: 4, k: 9, markov: true }, 77);
    eprintln!("markov_table with parent chunks: max |Δval| = {w:e}, {t} near-ties");
    // A table that cannot fit is a clear error, not a panic.
    let base = g.upload(&vec![0.0; 2 * 700], 2, 700).unwrap();
    let cand: Vec<u32> = (0..700).collect();
    let err = g.markov_table(&base, None, &cand, 64).unwrap_err();
    assert!(matches!(err, Error::Device(ref m) if m.contains("markov_table")), "{err}");
}

#[test]
fn markov_table_bad_input_is_an_error() {
    let paths = paths_or_skip!();
    for (_, g) in paths {
        let base = g.upload(&[0.0; 20], 2, 10).unwrap();
        let w = g.upload(&[0.0; 30], 10, 3).unwrap();
        let w_bad = g.upload(&[0.0; 27], 9, 3).unwrap();
        assert!(matches!(g.markov_table(&base, None, &[], 2), Err(Error::Invalid(_))));
        assert!(matches!(g.markov_table(&base, None, &[1, 2], 0), Err(Error::Invalid(_))));
        assert!(matches!(g.markov_table(&base, None, &[3, 1], 1), Err(Error::Invalid(_))));
        assert!(matches!(g.markov_table(&base, None, &[1, 10], 1), Err(Error::Invalid(_))));
        assert!(matches!(g.markov_table(&base, Some((&w, &w_bad)), &[1, 2], 1), Err(Error::Shape { .. })));
        // ld = 0: an empty table.
        let empty = g.zeros(0, 10).unwrap();
        let t = g.markov_table(&empty, Some((&w, &w)), &[1, 2], 5).unwrap();
        assert_eq!((t.k, t.vals.len()), (2, 0));
    }
}

// ----------------------------------------------------------------------------- candidate_table

/// One `candidate_table` case: `ld` rows of `vocab` logits, top-`c` per row, `k` children,
/// a Markov head of rank `rank` or none, and where the anchor sits.
struct UnionCase {
    vocab: usize,
    ld: usize,
    c: usize,
    k: usize,
    rank: usize,
    markov: bool,
    anchor: Anchor,
}

#[derive(Clone, Copy, Debug)]
enum Anchor {
    /// Row 0's argmax: already in the top-C (the union must not duplicate it).
    InTopC,
    /// A token made the minimum of every row: never in a top-C (C < V), added by the union.
    Outside,
}

/// Compare wgpu `candidate_table` with the CPU backend's (the default topk + host union +
/// markov_table): candidates identical, slots identical, values within
/// `TABLE_ABS + TABLE_REL·|val|`. Returns the largest |Δval| and the union size.
fn check_union(g: &WgpuBackend, label: &str, c: &UnionCase, seed: u64) -> (f32, usize) {
    let cpu = CpuBackend::new();
    let mut r = Rng(seed);
    let mut base = logits(&mut r, c.ld * c.vocab, 6.0);
    let rank = c.rank.max(1);
    let w1: Vec<f32> = r.vec(c.vocab * rank).iter().map(|v| v * 0.5).collect();
    let w2: Vec<f32> = r.vec(c.vocab * rank).iter().map(|v| v * 0.5).collect();
    let anchor = match c.anchor {
        Anchor::InTopC if c.ld > 0 => (0..c.vocab).max_by(|&a, &b| base[a].total_cmp(&base[b]).then(b.cmp(&a))).unwrap() as u32,
        _ => {
            let a = (c.vocab * 2 / 3) as u32;
            for d in 0..c.ld {
                base[d * c.vocab + a as usize] = -100.0;
            }
            a
        }
    };
    let (cb, c1, c2) = (cpu.upload(&base, c.ld, c.vocab).unwrap(), cpu.upload(&w1, c.vocab, rank).unwrap(), cpu.upload(&w2, c.vocab, rank).unwrap());
    let want = cpu.candidate_table(CandidateArgs { base: &cb, markov: c.markov.then_some((&c1, &c2)), candidates: c.c, anchor, k: c.k }).unwrap();
    let (gb, g1, g2) = (g.upload(&base, c.ld, c.vocab).unwrap(), g.upload(&w1, c.vocab, rank).unwrap(), g.upload(&w2, c.vocab, rank).unwrap());
    // (The one-sync property is tests/wgpu/syncs.rs's: these backends are shared by parallel tests.)
    let got = g.candidate_table(CandidateArgs { base: &gb, markov: c.markov.then_some((&g1, &g2)), candidates: c.c, anchor, k: c.k }).unwrap();
    let what = format!("candidate_table V={} ld={} C={} k={} r={} markov={} anchor {anchor} {:?} ({label})", c.vocab, c.ld, c.c, c.k, rank, c.markov, c.anchor);
    assert_eq!(got.cand, want.cand, "{what}: candidates");
    assert!(got.cand.binary_search(&anchor).is_ok(), "{what}: anchor missing");
    assert_eq!(got.k, want.k, "{what}: k");
    assert_eq!(got.k, c.k.min(want.cand.len()), "{what}: k clamped to n");
    assert_eq!(got.slots.len(), c.ld * want.cand.len() * want.k, "{what}: table size");
    assert_eq!(got.slots, want.slots, "{what}: slots");
    assert_eq!(got.vals.len(), want.vals.len(), "{what}: vals length");
    let mut worst = 0.0f32;
    for (i, (a, b)) in got.vals.iter().zip(&want.vals).enumerate() {
        let err = (a - b).abs();
        let tol = TABLE_ABS + TABLE_REL * b.abs();
        assert!(err <= tol, "{what}: value {i}: {a} vs {b} (error {err:e} > {tol:e})");
        worst = worst.max(err);
    }
    (worst, want.cand.len())
}

#[test]
fn candidate_table_matches_cpu() {
    let paths = paths_or_skip!();
    use Anchor::*;
    let u = |vocab, ld, c, k, rank, markov, anchor| UnionCase { vocab, ld, c, k, rank, markov, anchor };
    let cases = [
        // ld = 1, C = 1: n = 1 (anchor = the top-1) or 2.
        u(37, 1, 1, 4, 3, true, InTopC),
        u(37, 1, 1, 4, 3, true, Outside),
        u(37, 1, 1, 1, 3, false, Outside),
        // V not a multiple of 32; a union that saturates (ld·C + 1 > V) and one that takes
        // all but the anchor.
        u(100, 4, 40, 16, 4, true, Outside),
        u(100, 4, 99, 7, 4, false, Outside),
        u(61, 7, 30, 64, 2, true, InTopC),
        // C ≥ V: the whole vocabulary (host union path).
        u(45, 3, 45, 5, 3, true, InTopC),
        u(45, 3, 1000, 5, 3, false, Outside),
        // ld = 0: the anchor alone, an empty table.
        u(50, 0, 8, 4, 2, true, Outside),
        // Model-like sizes: C > 256 (select scratch path), n > 2048 (global z path), V = 151936.
        u(5003, 7, 300, 9, 16, true, Outside),
        u(20000, 9, 250, 8, 8, false, InTopC),
        u(49152, 16, 128, 64, 32, true, InTopC),
        u(151936, 16, 128, 32, 8, true, Outside),
    ];
    for (label, g) in paths {
        let mut worst = 0.0f32;
        for (i, c) in cases.iter().enumerate() {
            let t = std::time::Instant::now();
            let (w, n) = check_union(g, label, c, 9100 + i as u64);
            worst = worst.max(w);
            eprintln!(
                "candidate_table V={} ld={} C={} k={} markov={} ({label}): n = {n}, max |Δval| = {w:e} ({:.2} s)",
                c.vocab,
                c.ld,
                c.c,
                c.k,
                c.markov,
                t.elapsed().as_secs_f64()
            );
        }
        eprintln!(
            "candidate_table ({label}): candidates and slots identical to the CPU; max |Δval| = {worst:e} (tolerance {TABLE_ABS:e} + {TABLE_REL:e}·|val|)"
        );
    }
}

#[test]
fn candidate_table_splits_parents_across_small_bindings() {
    // 64 KiB bindings: the union of 4 × 50 ids + anchor (n_max = 201) is chunked 81 parents
    // at a time, with chunks sized for n_max while the kernels see the actual n.
    let Some(g) = open(&WgpuOptions { max_binding_bytes: Some(64 << 10), subgroups: Subgroups::Off, ..Default::default() }, "small bindings") else {
        return;
    };
    for (i, anchor) in [Anchor::Outside, Anchor::InTopC].into_iter().enumerate() {
        let (w, n) = check_union(&g, "64 KiB bindings", &UnionCase { vocab: 700, ld: 4, c: 50, k: 9, rank: 5, markov: true, anchor }, 78 + i as u64);
        eprintln!("candidate_table with parent chunks: n = {n}, max |Δval| = {w:e}");
    }
    // Heavy overlap between rows (every row the same): n ≤ C + 1, far below n_max = ld·C + 1
    // (buffers and the read-back are sized for n_max = 241; the table is packed for n).
    let cpu = CpuBackend::new();
    let mut r = Rng(79);
    let row = logits(&mut r, 700, 6.0);
    let base: Vec<f32> = (0..6).flat_map(|_| row.iter().copied()).collect();
    let got = g.candidate_table(CandidateArgs { base: &g.upload(&base, 6, 700).unwrap(), markov: None, candidates: 40, anchor: 3, k: 4 }).unwrap();
    let want = cpu.candidate_table(CandidateArgs { base: &cpu.upload(&base, 6, 700).unwrap(), markov: None, candidates: 40, anchor: 3, k: 4 }).unwrap();
    assert!(want.cand.len() <= 41);
    assert_eq!(got.cand, want.cand);
    assert_eq!(got.slots, want.slots);
    assert_close_vals("candidate_table overlapping rows", &got.vals, &want.vals);
    // A table that cannot fit is a clear error, not a panic.
    let base = g.upload(&vec![0.0; 2 * 700], 2, 700).unwrap();
    let err = g.candidate_table(CandidateArgs { base: &base, markov: None, candidates: 600, anchor: 0, k: 64 }).unwrap_err();
    assert!(matches!(err, Error::Device(ref m) if m.contains("candidate_table")), "{err}");
}

#[test]
fn candidate_table_grids_fold_within_small_dispatch_limits() {
    // The table kernels' grids are written on the device (candidate_union.wgsl) for the actual
    // union size; with a 5-workgroup limit per dimension they fold into 2-D grids (x ≤ 5,
    // y = the rest: real limits are ≥ 65 535, so y never exceeds them) and the kernels'
    // linear workgroup index must still cover every (depth, parent) row, chunks included.
    let opts = WgpuOptions { max_binding_bytes: Some(64 << 10), max_workgroups_per_dim: Some(5), subgroups: Subgroups::Off, ..Default::default() };
    let Some(g) = open(&opts, "5 workgroups per dimension") else { return };
    for (i, anchor) in [Anchor::Outside, Anchor::InTopC].into_iter().enumerate() {
        let (w, n) = check_union(&g, "folded grids", &UnionCase { vocab: 700, ld: 4, c: 50, k: 9, rank: 5, markov: true, anchor }, 90 + i as u64);
        eprintln!("candidate_table with folded indirect grids: n = {n}, max |Δval| = {w:e}");
    }
}

#[test]
fn candidate_table_without_indirect_dispatch_gives_the_same_table() {
    // Adapters without indirect execution run the table kernels on grids sized for n_max
    // (extra workgroups exit); the result must not change.
    let opts = WgpuOptions { no_indirect: true, max_binding_bytes: Some(64 << 10), subgroups: Subgroups::Off, ..Default::default() };
    let Some(g) = open(&opts, "no indirect dispatch") else { return };
    for (i, anchor) in [Anchor::Outside, Anchor::InTopC].into_iter().enumerate() {
        let (w, n) = check_union(&g, "n_max-sized grids", &UnionCase { vocab: 700, ld: 4, c: 50, k: 9, rank: 5, markov: true, anchor }, 95 + i as u64);
        eprintln!("candidate_table without indirect dispatch: n = {n}, max |Δval| = {w:e}");
    }
}

fn assert_close_vals(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= TABLE_ABS + TABLE_REL * b.abs(), "{what}: value {i}: {a} vs {b}");
    }
}

#[test]
fn candidate_table_bad_input_is_an_error() {
    let paths = paths_or_skip!();
    let cpu = CpuBackend::new();
    for (_, g) in paths {
        let base = g.upload(&[0.0; 20], 2, 10).unwrap();
        let w = g.upload(&[0.0; 30], 10, 3).unwrap();
        let w_bad = g.upload(&[0.0; 27], 9, 3).unwrap();
        let invalid = |r: sparkling_core::Result<sparkling_core::CandidateTable>, arg: &str| match r {
            Err(Error::Invalid(m)) => assert!(m.contains(arg), "{m} should name {arg}"),
            other => panic!("expected Error::Invalid naming {arg}, got {other:?}"),
        };
        invalid(g.candidate_table(CandidateArgs { base: &base, markov: None, candidates: 3, anchor: 1, k: 0 }), "k");
        invalid(g.candidate_table(CandidateArgs { base: &base, markov: None, candidates: 0, anchor: 1, k: 2 }), "candidates");
        invalid(g.candidate_table(CandidateArgs { base: &base, markov: None, candidates: 3, anchor: 10, k: 2 }), "anchor");
        invalid(g.candidate_table(CandidateArgs { base: &base, markov: None, candidates: 30, anchor: 10, k: 2 }), "anchor");
        assert!(matches!(
            g.candidate_table(CandidateArgs { base: &base, markov: Some((&w, &w_bad)), candidates: 3, anchor: 1, k: 2 }),
            Err(Error::Shape { .. })
        ));
        // The CPU default reports the same errors.
        let cb = cpu.upload(&[0.0; 20], 2, 10).unwrap();
        invalid(cpu.candidate_table(CandidateArgs { base: &cb, markov: None, candidates: 3, anchor: 1, k: 0 }), "k");
        invalid(cpu.candidate_table(CandidateArgs { base: &cb, markov: None, candidates: 0, anchor: 1, k: 2 }), "candidates");
        invalid(cpu.candidate_table(CandidateArgs { base: &cb, markov: None, candidates: 3, anchor: 10, k: 2 }), "anchor");
    }
}

/// Timing of the fused op vs the two-call path (topk + host union + markov_table) at
/// SmolLM2-like draft sizes; prints, asserts nothing about wall-clock.
/// Run: `cargo test --release --features wgpu --test wgpu -- --ignored --nocapture select::candidate_table_timing`.
#[test]
#[ignore]
fn candidate_table_timing() {
    let paths = paths_or_skip!();
    let (ld, vocab, c, k) = (16usize, 49152usize, 128usize, 64usize);
    let mut r = Rng(4242);
    let base = logits(&mut r, ld * vocab, 6.0);
    for (label, g) in paths {
        let gb = g.upload(&base, ld, vocab).unwrap();
        for rank in [32usize, 256] {
            let w1 = g.upload(&r.vec(vocab * rank), vocab, rank).unwrap();
            let w2 = g.upload(&r.vec(vocab * rank), vocab, rank).unwrap();
            let m = Some((&w1, &w2));
            let two = || {
                let mut cand = g.topk(&gb, c).unwrap().ids;
                cand.push(5);
                cand.sort_unstable();
                cand.dedup();
                let t = g.markov_table(&gb, m, &cand, k.min(cand.len())).unwrap();
                (cand, t)
            };
            let one = || g.candidate_table(CandidateArgs { base: &gb, markov: m, candidates: c, anchor: 5, k }).unwrap();
            // Warm-up (pipelines, pool) and a check that both agree.
            let (cand, t) = two();
            let u = one();
            assert_eq!(u.cand, cand);
            assert_eq!(u, t);
            let reps = 3;
            let time = |f: &dyn Fn()| {
                let t0 = std::time::Instant::now();
                for _ in 0..reps {
                    f();
                }
                t0.elapsed().as_secs_f64() * 1e3 / reps as f64
            };
            let t_two = time(&|| {
                two();
            });
            let t_one = time(&|| {
                one();
            });
            eprintln!(
                "TIMING ({label}) ld={ld} V={vocab} C={c} k={k} r={rank}: candidate_table {t_one:.1} ms (1 sync), topk + markov_table {t_two:.1} ms (2 syncs)"
            );
        }
    }
}

// ------------------------------------------------------------------------------------- sample

/// The CPU rule in f64 (backends/cpu/src/kernels.rs `sample_row`), returning the distance of
/// this draw from the nearest decision boundary relative to the kept mass: the uniform's
/// distance to the CDF boundaries of the chosen token, and top-p's distance to the cumulative
/// mass at the cut. Small margins are where an f32 device may legitimately differ.
fn boundary_margin(row: &[f32], p: SampleParams, u: f32) -> f64 {
    let inv_t = 1.0 / p.temperature as f64;
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut probs: Vec<f64> = row.iter().map(|&v| ((v as f64 - max) * inv_t).exp()).collect();
    let mut margin = f64::INFINITY;
    if (p.top_k > 0 && p.top_k < row.len()) || p.top_p < 1.0 {
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        let total: f64 = probs.iter().sum();
        let mut keep = if p.top_k > 0 { p.top_k.min(row.len()) } else { row.len() };
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            for (n, &i) in order.iter().enumerate().take(keep) {
                acc += probs[i] / total;
                margin = margin.min((acc - p.top_p as f64).abs());
                if acc >= p.top_p as f64 {
                    keep = n + 1;
                    break;
                }
            }
        }
        for &i in &order[keep..] {
            probs[i] = 0.0;
        }
    }
    let total: f64 = probs.iter().sum();
    let target = u as f64 * total;
    let mut acc = 0.0;
    for &q in &probs {
        if q > 0.0 {
            let before = acc;
            acc += q;
            if acc > target {
                margin = margin.min((target - before).abs() / total).min((acc - target).abs() / total);
                break;
            }
        }
    }
    margin
}

#[test]
fn sample_matches_cpu_draws() {
    let paths = paths_or_skip!();
    let cpu = CpuBackend::new();
    let filters = [(0usize, 1.0f32), (50, 1.0), (0, 0.9), (40, 0.8), (1, 1.0), (0, 0.0), (5000, 0.95)];
    let temps = [0.7f32, 1.0, 1.5];
    for (label, g) in paths {
        let mut r = Rng(6001);
        let (mut draws, mut near, mut tight, mut differ) = (0usize, 0usize, 0usize, 0usize);
        for &(rows, cols, scale) in &[(16usize, 1000usize, 6.0f32), (8, 49152, 10.0), (2, 151936, 12.0), (4, 7, 2.0), (3, 1, 1.0)] {
            let x = logits(&mut r, rows * cols, scale);
            let (gx, cx) = (g.upload(&x, rows, cols).unwrap(), cpu.upload(&x, rows, cols).unwrap());
            for &t in &temps {
                for &(top_k, top_p) in &filters {
                    let p = SampleParams { temperature: t, top_k, top_p };
                    let seeds = if cols > 100_000 { 2 } else { 4 };
                    for seed in 0..seeds {
                        // Uniforms: on rows of ≤ 1000 tokens, redrawn (up to 50 times) while within
                        // BOUNDARY of a decision boundary.
                        let u: Vec<f32> = (0..rows)
                            .map(|i| {
                                let row = &x[i * cols..(i + 1) * cols];
                                let mut u = (r.uniform() + 1.0) / 2.0;
                                for _ in 0..50 {
                                    if cols > 1000 || boundary_margin(row, p, u) >= BOUNDARY {
                                        break;
                                    }
                                    u = (r.uniform() + 1.0) / 2.0;
                                }
                                u
                            })
                            .collect();
                        let got = g.sample(&gx, p, &u).unwrap();
                        let want = cpu.sample(&cx, p, &u).unwrap();
                        for i in 0..rows {
                            draws += 1;
                            let margin = boundary_margin(&x[i * cols..(i + 1) * cols], p, u[i]);
                            if margin < BOUNDARY {
                                near += 1;
                            }
                            if margin < TIGHT {
                                tight += 1;
                            }
                            if got[i] != want[i] {
                                eprintln!(
                                    "BOUNDARY sample ({label}) [{rows},{cols}] {p:?} seed {seed} row {i}: u = {} margin {margin:e}: device {} CPU {}",
                                    u[i], got[i], want[i]
                                );
                                assert!(
                                    margin < TIGHT,
                                    "sample ({label}) [{rows},{cols}] {p:?} seed {seed} row {i} u = {}: device {} vs CPU {} with margin {margin:e} ≥ {TIGHT:e}",
                                    u[i],
                                    got[i],
                                    want[i]
                                );
                                differ += 1;
                            }
                        }
                    }
                }
            }
        }
        eprintln!(
            "sample ({label}): {draws} draws; {near} with a margin < {BOUNDARY:e} (unavoidable on wide flat rows), {tight} < {TIGHT:e}; \
             {differ} differ from the CPU (each printed above, all within {TIGHT:e} of a boundary)"
        );
        assert!(differ * 100 <= draws, "too many differing draws: {differ} of {draws}");
    }
}

#[test]
fn sample_edge_cases() {
    let paths = paths_or_skip!();
    let cpu = CpuBackend::new();
    let inf = f32::INFINITY;
    for (label, g) in paths {
        let p = SampleParams { temperature: 1.0, top_k: 0, top_p: 1.0 };
        // Ties everywhere + top-k / top-p cutting through a run of equal values; u at 0 and
        // just below 1; -inf entries never drawn; non-finite max rows give 0 like the CPU.
        let x = [
            vec![1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
            vec![-inf, 2.0, -inf, 2.0, 0.0, -inf, 2.0, 1.0],
            vec![-inf; 8],
            vec![0.0, inf, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        ]
        .concat();
        let (gx, cx) = (g.upload(&x, 4, 8).unwrap(), cpu.upload(&x, 4, 8).unwrap());
        for (top_k, top_p) in [(0, 1.0), (3, 1.0), (0, 0.3), (2, 0.9), (8, 0.5)] {
            for u in [0.0f32, 0.26, 0.74, 0.99999994] {
                let pp = SampleParams { top_k, top_p, ..p };
                let got = g.sample(&gx, pp, &[u; 4]).unwrap();
                let want = cpu.sample(&cx, pp, &[u; 4]).unwrap();
                // Rows 0 and 1 may sit exactly on a CDF boundary for these uniforms (equal
                // probabilities): a difference there is allowed only at such a boundary.
                for i in 0..4 {
                    let margin = boundary_margin(&x[i * 8..(i + 1) * 8], pp, u);
                    if got[i] != want[i] {
                        eprintln!("BOUNDARY sample_edge_cases ({label}) row {i} {pp:?} u {u}: margin {margin:e}, device {} CPU {}", got[i], want[i]);
                        assert!(i < 2 && margin < TIGHT, "({label}) row {i} {pp:?} u {u}: device {} vs CPU {}", got[i], want[i]);
                    }
                }
            }
        }
        // Errors and trivial shapes.
        assert!(matches!(g.sample(&gx, p, &[0.5]), Err(Error::Shape { .. })));
        assert!(matches!(g.sample(&gx, SampleParams { temperature: f32::NAN, ..p }, &[0.5; 4]), Err(Error::Invalid(_))));
        assert!(g.sample(&g.zeros(0, 8).unwrap(), p, &[]).unwrap().is_empty());
        assert_eq!(g.sample(&g.upload(&[3.0], 1, 1).unwrap(), p, &[0.7]).unwrap(), vec![0]);
    }
}

// ------------------------------------------------------------------------------------- argmax

#[test]
fn argmax_identical_on_both_paths() {
    let paths = paths_or_skip!();
    let cpu = CpuBackend::new();
    let mut r = Rng(7001);
    let nan = f32::NAN;
    let ninf = f32::NEG_INFINITY;
    let mut cases: Vec<(usize, usize, Vec<f32>)> = vec![
        (1, 1, vec![-3.0]),
        (3, 4, vec![nan, 1.0, nan, 2.0, ninf, ninf, ninf, ninf, nan, nan, nan, nan]),
        (2, 3, vec![ninf, -1e30, -1e30, f32::INFINITY, 1.0, f32::INFINITY]),
        (2, 5, vec![-0.0, 0.0, -0.0, 0.0, -1.0, 0.0, -0.0, 0.0, -0.0, -2.0]),
        (7, 33, r.vec(7 * 33)),
        (1, 151936, r.vec(151936)),
    ];
    let mut q: Vec<f32> = (0..3 * 49152).map(|_| (r.uniform() * 4.0).round()).collect();
    q[49152 + 40000] = 9.0;
    cases.push((3, 49152, q));
    for (label, g) in paths {
        for (rows, cols, x) in &cases {
            let got = g.argmax(&g.upload(x, *rows, *cols).unwrap()).unwrap();
            assert_eq!(got, cpu.argmax(&cpu.upload(x, *rows, *cols).unwrap()).unwrap(), "argmax [{rows},{cols}] ({label})");
        }
    }
}

#[test]
fn subgroup_switch_is_honoured() {
    let paths = paths_or_skip!();
    // The portable path is always there; the subgroup path exactly when the adapter has it.
    assert_eq!(paths[0].0, "workgroup");
    let auto = &paths.last().unwrap().1;
    let env_off = std::env::var("SPARKLING_WGPU_SUBGROUPS").is_ok_and(|v| v.trim() == "0");
    if env_off {
        assert_eq!(paths.len(), 1, "SPARKLING_WGPU_SUBGROUPS=0 must force the workgroup path");
    }
    eprintln!("adapter {}: {} path(s) tested", auto.name(), paths.len());
    if paths.len() == 2 {
        // Both paths agree with each other: selections exactly, sums within the tolerance.
        let mut r = Rng(8001);
        let x = logits(&mut r, 5 * 49152, 9.0);
        let a = paths[0].1.topk(&paths[0].1.upload(&x, 5, 49152).unwrap(), 64).unwrap();
        let b = paths[1].1.topk(&paths[1].1.upload(&x, 5, 49152).unwrap(), 64).unwrap();
        assert_eq!(a.ids, b.ids);
        assert_eq!(a.vals, b.vals);
        for (p, q) in a.lse.iter().zip(&b.lse) {
            assert!((p - q).abs() <= 2.0 * (LSE_ABS + LSE_REL * p.abs()), "lse {p} vs {q}");
        }
    }
}
