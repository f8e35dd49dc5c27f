//! The exactness matrix under `--budget auto` (issue 13): whatever the policy chooses — the
//! whole tree, a prefix of its pop order, or no drafter at all (a plain AR step whose taps the
//! drafter catches up on later) — every method emits the `ar` tokens at T = 0 and the same
//! seed's `ar` tokens at T > 0. Cost models: measured on the spot, and synthetic ones that
//! force each branch (skip + probes, truncation on a staircase, free verification).

mod common;

use common::*;
use sparkling::core::{Backend, ReadBack};
use sparkling::cpu::CpuBackend;
use sparkling::decode::budget::{AutoBudget, CostModel};
use sparkling::decode::{Engine, GenParams, Method, Stats};
use sparkling::model::config::{Arch, DrafterKind};

const PROMPTS: [&[u32]; 2] = [&[3, 17, 5, 9, 22, 1], &[40, 2, 2, 7]];

/// Synthetic cost models: `None` = measured by the engine.
fn cost_models() -> Vec<(&'static str, Option<CostModel>)> {
    vec![
        ("measured", None),
        // Any node costs a fortune: n = 0 every drafted round, so the drafter is skipped with
        // probes after 4, 8, ... rounds (multi-round catch-up of the drafter's context).
        ("hopeless", Some(CostModel::from_points(vec![1, 2], vec![0.01, 1e6], 0.0))),
        // Steps of 4 rows: truncation to 3, 7, ... nodes.
        ("staircase", Some(CostModel::from_points(vec![1, 4, 5, 8, 9, 65], vec![0.01, 0.01, 0.02, 0.02, 0.03, 0.5], 0.0))),
        // Free verification: every node with any probability.
        ("flat", Some(CostModel::from_points(vec![1, 65], vec![0.01, 0.01], 0.0))),
    ]
}

fn auto_params(method: Method, n_max: usize, temperature: f32, seed: u64, max_new: usize, cost: &Option<CostModel>) -> GenParams {
    GenParams { auto_budget: Some(AutoBudget { cost: cost.clone(), ..AutoBudget::default() }), ..params(method, n_max, temperature, seed, max_new, vec![]) }
}

#[test]
fn every_method_matches_ar_at_temperature_zero_with_budget_auto() {
    let b = CpuBackend::new();
    let vocab = 48;
    let mut all = Stats::default();
    let mut measured = 0usize;
    for (ai, arch) in [Arch::Llama, Arch::Qwen3].into_iter().enumerate() {
        let tdir = tmpdir("target");
        let target = random_target(tdir.path(), arch, vocab, 31 + ai as u64);
        for block in [7usize, 16] {
            let d1 = tmpdir("dflash");
            let dflash = random_drafter(d1.path(), &target.cfg, DrafterKind::DFlash, block, 0, 5);
            let d2 = tmpdir("dspark");
            let dspark = random_drafter(d2.path(), &target.cfg, DrafterKind::DSpark, block, 8, 6);
            for prompt in PROMPTS {
                let max_new = 40;
                let ar = Engine { backend: &b, target: &target, drafter: None };
                let want = ar.generate(prompt, &params(Method::Ar, 1, 0.0, 0, max_new, vec![]), &mut |_| {}).unwrap();
                for method in Method::ALL.into_iter().skip(1) {
                    let drafter = if method.drafter_kind() == Some(DrafterKind::DFlash) { &dflash } else { &dspark };
                    let e = Engine { backend: &b, target: &target, drafter: Some(drafter) };
                    for (name, cost) in cost_models() {
                        for n_max in [4usize, 16] {
                            let g = e.generate(prompt, &auto_params(method, n_max, 0.0, 0, max_new, &cost), &mut |_| {}).unwrap();
                            assert_eq!(g.tokens, want.tokens, "{arch:?} block {block} {} auto ({name}, N_max {n_max}) prompt {prompt:?}", method.name());
                            assert!(g.stats.tree_sizes.len() <= n_max + 1, "a round verified more than N_max nodes");
                            if cost.is_none() {
                                let c = g.cost_model.as_ref().expect("the engine measured a cost model");
                                assert!(c.is_valid() && c.max_rows() == n_max + 1, "{c:?}");
                                measured += 1;
                            } else {
                                assert!(g.cost_model.is_none());
                            }
                            all.merge(&g.stats);
                        }
                    }
                }
            }
        }
    }
    assert!(measured > 0);
    // Every branch was exercised: skipped drafters (catch-up), truncated and multi-node trees.
    assert!(all.drafts_skipped > 50, "skipped {}", all.drafts_skipped);
    let multi: usize = all.tree_sizes.iter().skip(2).sum();
    assert!(multi > 50, "rounds with ≥ 2 nodes: {multi} ({:?})", all.tree_sizes);
    assert!(all.predicted_rounds > 0 && all.policy_us > 0.0);
}

#[test]
fn same_seed_same_output_at_t1_with_budget_auto() {
    let b = CpuBackend::new();
    let dir = tmpdir("t");
    let t = random_target(dir.path(), Arch::Qwen3, 32, 5);
    let d = tmpdir("d");
    let dspark = random_drafter(d.path(), &t.cfg, DrafterKind::DSpark, 7, 8, 1);
    let d2 = tmpdir("d2");
    let dflash = random_drafter(d2.path(), &t.cfg, DrafterKind::DFlash, 7, 0, 1);
    let prompt = [3u32, 1, 4, 1, 5];
    for seed in [1u64, 2] {
        let ar = Engine { backend: &b, target: &t, drafter: None };
        let want = ar.generate(&prompt, &params(Method::Ar, 1, 1.0, seed, 30, vec![]), &mut |_| {}).unwrap();
        for method in Method::ALL.into_iter().skip(1) {
            let drafter = if method.drafter_kind() == Some(DrafterKind::DFlash) { &dflash } else { &dspark };
            let e = Engine { backend: &b, target: &t, drafter: Some(drafter) };
            for (name, cost) in cost_models() {
                let g = e.generate(&prompt, &auto_params(method, 16, 1.0, seed, 30, &cost), &mut |_| {}).unwrap();
                assert_eq!(g.tokens, want.tokens, "{} auto ({name}) seed {seed}", method.name());
            }
        }
    }
}

/// The skip is exact for the drafter too: context taps fed over several rounds or all at once
/// (after skipped rounds) give the same draft logits, since each context row's K/V depends on
/// that row alone.
#[test]
fn drafter_catch_up_equals_round_by_round_feeding() {
    use sparkling::core::AttnMask;
    use sparkling::model::drafter::DraftJob;
    use sparkling::model::target::{LogitRows, SeqInput};
    let b = CpuBackend::new();
    let dir = tmpdir("t");
    let t = random_target(dir.path(), Arch::Qwen3, 40, 7);
    for kind in [DrafterKind::DSpark, DrafterKind::DFlash] {
        let d = tmpdir("d");
        let dr = random_drafter(d.path(), &t.cfg, kind, 7, if kind == DrafterKind::DSpark { 8 } else { 0 }, 3);
        let ids: Vec<u32> = (0..12u32).map(|i| (i * 7 + 3) % 40).collect();
        let pos: Vec<u32> = (0..12).collect();
        let mut cache = t.new_cache(&b, 32).unwrap();
        let taps = t
            .forward(&b, &mut cache, SeqInput { ids: &ids, positions: &pos, mask: AttnMask::Causal, logits: Some(LogitRows::Last) }, &dr.cfg.target_layer_ids)
            .unwrap()
            .taps
            .unwrap();
        let rows = |r: std::ops::Range<usize>| b.gather_rows(&taps, &r.collect::<Vec<_>>()).unwrap();
        // Round by round: 5 rows, then 1, 1, 1 (three AR-like rounds), then 4.
        let mut c1 = dr.new_cache(&b, 40).unwrap();
        let mut last = None;
        for (s, e) in [(0, 5), (5, 6), (6, 7), (7, 8), (8, 12)] {
            last = Some(
                dr.draft(&b, &t, DraftJob { cache: &mut c1, taps: &rows(s..e), anchor: ids[e.min(11)], root_pos: e, depth: dr.cfg.draft_depth() }).unwrap(),
            );
        }
        // Catch-up: 5 rows, then the 7 rows of the skipped rounds at once.
        let mut c2 = dr.new_cache(&b, 40).unwrap();
        dr.draft(&b, &t, DraftJob { cache: &mut c2, taps: &rows(0..5), anchor: ids[5], root_pos: 5, depth: dr.cfg.draft_depth() }).unwrap();
        let parts = [rows(5..6), rows(6..7), rows(7..8), rows(8..12)];
        let ctx = b.concat_rows(&parts.iter().collect::<Vec<_>>()).unwrap();
        let caught_up = dr.draft(&b, &t, DraftJob { cache: &mut c2, taps: &ctx, anchor: ids[11], root_pos: 12, depth: dr.cfg.draft_depth() }).unwrap();
        let (x, y) = (b.download(&last.unwrap()).unwrap(), b.download(&caught_up).unwrap());
        let worst = x.iter().zip(&y).map(|(a, c)| (a - c).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-4, "{kind:?}: catch-up logits differ by {worst}");
    }
}
