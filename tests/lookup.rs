//! `lookup` (prompt lookup, no drafter): every generation equals `ar`'s — at T = 0, at T > 0
//! with the same seed, under `--budget auto`, with stop tokens and length cuts inside an
//! accepted chain — on random targets of each arch, whose greedy texts repeat, so the chains
//! are accepted often; the same for a lookup chain grafted onto a drafter's tree (`--lookup`,
//! both drafter policies); and what they refuse.

mod common;

use common::*;
use sparkling::cpu::CpuBackend;
use sparkling::decode::batch::{Batch, BatchOptions};
use sparkling::decode::budget::AutoBudget;
use sparkling::decode::{Engine, GenParams, LookupGraft, Method, Platform};
use sparkling::model::config::DrafterKind;

const PROMPTS: [&[u32]; 3] = [&[3, 17, 5, 9, 22, 1], &[40, 2, 2, 7], &[5, 6, 7, 5, 6, 7, 5, 6]];

#[test]
fn lookup_emits_exactly_the_ar_tokens() {
    let b = CpuBackend::new();
    let (mut rounds, mut tokens) = (0usize, 0usize);
    for (ai, arch) in ARCHS.into_iter().enumerate() {
        let dir = tmpdir("target");
        let target = random_target(dir.path(), arch, 48, 21 + ai as u64);
        let e = Engine { backend: &b, target: &target, drafter: None };
        for prompt in PROMPTS {
            for (temperature, seed) in [(0.0f32, 0u64), (0.9, 7)] {
                for max_new in [17usize, 60] {
                    let want = e.generate(prompt, &params(Method::Ar, 1, temperature, seed, max_new, vec![]), &mut |_| {}).unwrap();
                    let auto = GenParams { auto_budget: Some(AutoBudget::default()), ..params(Method::Lookup, 16, temperature, seed, max_new, vec![]) };
                    let runs = [1usize, 2, 4, 8].map(|k| params(Method::Lookup, k, temperature, seed, max_new, vec![]));
                    for p in runs.iter().chain([&auto]) {
                        let what =
                            format!("{arch:?} prompt {prompt:?} T {temperature} max_new {max_new} budget {} auto {}", p.tree.budget, p.auto_budget.is_some());
                        // No chain outgrows the tokens still to generate (less the bonus).
                        let g = e
                            .generate_observed(prompt, p, &mut |_| {}, &mut |r| {
                                let generated = r.root_pos - prompt.len() + 1;
                                assert!(
                                    r.tree.len() - 1 <= max_new.saturating_sub(generated + 1),
                                    "{what}: a {}-token chain with {generated} of {max_new} generated",
                                    r.tree.len() - 1
                                );
                            })
                            .unwrap();
                        assert_eq!(g.tokens, want.tokens, "{what}");
                        // τ counts kept tokens, also when max-new-tokens cut the last chain.
                        assert_eq!(g.stats.committed + 1, g.tokens.len(), "{what}");
                        assert!(g.stats.rounds >= 1, "{what}");
                        rounds += g.stats.rounds;
                        tokens += g.stats.committed;
                    }
                }
            }
        }
    }
    // The random targets' texts repeat, so chains are proposed and accepted: the runs above
    // exercised multi-token commits (and KV compaction to an accepted chain).
    let tau = tokens as f64 / rounds as f64;
    assert!(tau > 1.2, "lookup's mean τ over the matrix was only {tau:.2}");
}

#[test]
fn a_stop_token_inside_an_accepted_chain_ends_generation_there() {
    let b = CpuBackend::new();
    let dir = tmpdir("target");
    let target = random_target(dir.path(), ARCHS[0], 48, 5);
    let e = Engine { backend: &b, target: &target, drafter: None };
    let prompt = PROMPTS[2];
    let free = e.generate(prompt, &params(Method::Ar, 1, 0.0, 0, 60, vec![]), &mut |_| {}).unwrap();
    for pos in [3usize, 10, 25, 40] {
        let stop = free.tokens[pos];
        let first = free.tokens.iter().position(|&t| t == stop).unwrap();
        let want = &free.tokens[..=first];
        let g = e.generate(prompt, &params(Method::Lookup, 8, 0.0, 0, 60, vec![stop]), &mut |_| {}).unwrap();
        assert_eq!(g.tokens, want, "stop {stop}");
        assert!(g.stopped);
    }
}

#[test]
fn lookup_refuses_a_zero_budget_and_a_graft_without_a_drafter() {
    let b = CpuBackend::new();
    let dir = tmpdir("target");
    let target = random_target(dir.path(), ARCHS[1], 48, 9);
    let e = Engine { backend: &b, target: &target, drafter: None };
    let err = e.generate(PROMPTS[0], &params(Method::Lookup, 0, 0.0, 0, 8, vec![]), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("tree budget 0") && err.contains("lookup"), "{err}");
    // A grafted chain needs a drafter method; `ar` and `lookup` refuse it (lookup's chain is its budget).
    for m in [Method::Ar, Method::Lookup] {
        let g = GenParams { lookup: LookupGraft { len: 4, skip_drafter: true }, ..params(m, 4, 0.0, 0, 8, vec![]) };
        let err = e.generate(PROMPTS[0], &g, &mut |_| {}).unwrap_err().to_string();
        assert!(err.contains("lookup.len 4") && err.contains(m.name()) && err.contains("drafter"), "{err}");
        let mut batch = Batch::new(&b, &target, BatchOptions::default()).unwrap();
        assert!(batch.add(PROMPTS[0], &g).is_err());
        assert!(batch.is_empty(), "nothing was queued");
    }
    // Chains longer than MAX_CHAIN are refused, naming the parameter.
    let long = GenParams { lookup: LookupGraft { len: 65, skip_drafter: true }, ..params(Method::Sparkling, 4, 0.0, 0, 8, vec![]) };
    let err = long.validate().unwrap_err().to_string();
    assert!(err.contains("lookup.len 65") && err.contains("at most 64"), "{err}");
    let err = params(Method::Lookup, 65, 0.0, 0, 8, vec![]).validate().unwrap_err().to_string();
    assert!(err.contains("tree.budget") && err.contains(" 65") && err.contains("at most 64"), "{err}");
    assert!(params(Method::Lookup, 64, 0.0, 0, 8, vec![]).validate().is_ok());
    // The defaults: sparkling grafts (fallback on the CPU, always on a device), the others not.
    assert_eq!(GenParams::new(Method::Sparkling, &Platform::HOST).lookup, LookupGraft { len: 16, skip_drafter: true });
    assert_eq!(GenParams::new(Method::Sparkling, &Platform::DEVICE).lookup, LookupGraft { len: 8, skip_drafter: false });
    for m in [Method::Ar, Method::Lookup, Method::DFlash, Method::DDTree, Method::DSpark, Method::TreeSpark] {
        assert_eq!(GenParams::new(m, &Platform::HOST).lookup, LookupGraft::OFF, "{m:?}");
    }
    assert_eq!(Method::parse("lookup").unwrap(), Method::Lookup);
    assert_eq!(Method::Lookup.name(), "lookup");
    assert!(!Method::ALL.contains(&Method::Lookup), "ALL lists the published methods the tables compare");
}

#[test]
fn a_lookup_chain_grafted_onto_drafted_trees_emits_exactly_the_ar_tokens() {
    let b = CpuBackend::new();
    // Σ committed tokens and rounds with the graft, and the same runs without it.
    let (mut with, mut without) = ((0usize, 0usize), (0usize, 0usize));
    let (mut lookup_rounds, mut skipped_drafter) = (0usize, 0usize);
    for (ai, arch) in ARCHS.into_iter().enumerate() {
        let (td, sd, fd) = (tmpdir("target"), tmpdir("dspark"), tmpdir("dflash"));
        let target = random_target(td.path(), arch, 48, 31 + ai as u64);
        let dspark = random_drafter(sd.path(), &target.cfg, DrafterKind::DSpark, 8, 4, 3 + ai as u64);
        let dflash = random_drafter(fd.path(), &target.cfg, DrafterKind::DFlash, 8, 0, 4 + ai as u64);
        let ar = Engine { backend: &b, target: &target, drafter: None };
        for prompt in PROMPTS {
            for (temperature, seed) in [(0.0f32, 0u64), (0.9, 7)] {
                let max_new = 50;
                let want = ar.generate(prompt, &params(Method::Ar, 1, temperature, seed, max_new, vec![]), &mut |_| {}).unwrap();
                for (method, drafter) in [(Method::Sparkling, &dspark), (Method::DDTree, &dflash), (Method::DSpark, &dspark)] {
                    let e = Engine { backend: &b, target: &target, drafter: Some(drafter) };
                    for (budget, auto) in [(2usize, false), (6, false), (8, true)] {
                        let base = params(method, budget, temperature, seed, max_new, vec![]);
                        let base = GenParams { auto_budget: auto.then(AutoBudget::default), ..base };
                        let off = e.generate(prompt, &base, &mut |_| {}).unwrap();
                        assert_eq!(off.tokens, want.tokens);
                        without = (without.0 + off.stats.committed, without.1 + off.stats.rounds);
                        for (len, skip_drafter) in [(4usize, true), (4, false), (1, true), (8, false)] {
                            let g = GenParams { lookup: LookupGraft { len, skip_drafter }, ..base.clone() };
                            let mut trees_ok = true;
                            let got = e
                                .generate_observed(prompt, &g, &mut |_| {}, &mut |r| {
                                    trees_ok &= r.tree.is_well_formed() && r.tree.len() <= 1 + budget.max(8) + len;
                                })
                                .unwrap();
                            let what =
                                format!("{arch:?} {method:?} prompt {prompt:?} T {temperature} budget {budget} auto {auto} lookup {len} skip {skip_drafter}");
                            assert_eq!(got.tokens, want.tokens, "{what}");
                            assert!(trees_ok, "{what}: a verified tree was malformed or over its size");
                            assert_eq!(got.stats.committed + 1, got.tokens.len(), "{what}");
                            assert!(got.stats.lookup_rounds <= got.stats.rounds && got.stats.lookup_committed <= got.stats.committed, "{what}");
                            with = (with.0 + got.stats.committed, with.1 + got.stats.rounds);
                            lookup_rounds += got.stats.lookup_rounds;
                            if skip_drafter && got.stats.lookup_rounds > 0 {
                                skipped_drafter += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    // The random targets repeat themselves and their random drafters rarely agree with them, so
    // the grafted chains carry the acceptance: a graft that did nothing would fail this.
    let (tau_with, tau_without) = (with.0 as f64 / with.1 as f64, without.0 as f64 / without.1 as f64);
    assert!(lookup_rounds > 0 && skipped_drafter > 0);
    assert!(tau_with > tau_without + 0.2, "τ with the lookup graft {tau_with:.2} vs without {tau_without:.2}");
}

/// `--budget auto` with a lookup graft that skips the drafter on a match (the CPU default) on
/// a steep and a flat cost curve, and without the graft: the tokens are `ar`'s every time, the
/// chains are verified (the random targets repeat themselves), and `Stats::merge` carries
/// every counter.
#[test]
fn auto_with_the_lookup_graft_emits_ar_tokens() {
    use sparkling::decode::budget::CostModel;
    let b = CpuBackend::new();
    let (td, sd) = (tmpdir("target"), tmpdir("dspark"));
    let target = random_target(td.path(), ARCHS[0], 48, 31);
    let dspark = random_drafter(sd.path(), &target.cfg, DrafterKind::DSpark, 8, 4, 3);
    let ar = Engine { backend: &b, target: &target, drafter: None };
    let e = Engine { backend: &b, target: &target, drafter: Some(&dspark) };
    let rows: Vec<usize> = (1..=17).collect();
    let curve = |per_row: f64| CostModel::from_points(rows.clone(), rows.iter().map(|&r| 10.0 + per_row * (r - 1) as f64).collect(), 5.0);
    let (mut verified, mut finals) = (0usize, 0usize);
    for prompt in PROMPTS {
        let max_new = 50;
        let want = ar.generate(prompt, &params(Method::Ar, 1, 0.0, 0, max_new, vec![]), &mut |_| {}).unwrap();
        // A run without the graft on the steep curve takes AR steps up to the last token, so
        // its last round has only its bonus left (`final_rounds`, which the merge must carry).
        for (per_row, len) in [(10.0, 8), (0.001, 8), (10.0, 0)] {
            let p = GenParams {
                auto_budget: Some(AutoBudget { cost: Some(curve(per_row)), ..AutoBudget::default() }),
                lookup: LookupGraft { len, skip_drafter: true },
                ..params(Method::Sparkling, 8, 0.0, 0, max_new, vec![])
            };
            let got = e.generate(prompt, &p, &mut |_| {}).unwrap();
            let what = format!("prompt {prompt:?} per-row cost {per_row} ms");
            assert_eq!(got.tokens, want.tokens, "{what}");
            let s = &got.stats;
            // `Stats::merge` (bench's totals) carries every counter: merged into nothing, the
            // stats come back whole.
            let mut merged = sparkling::decode::stats::Stats::default();
            merged.merge(s);
            assert_eq!(serde_json::to_value(&merged).unwrap(), serde_json::to_value(s).unwrap(), "{what}");
            finals += s.final_rounds;
            verified += s.lookup_rounds;
        }
    }
    assert!(verified > 10, "verified {verified}");
    assert!(finals > 0, "no run ended on a last-token round: the merge check did not see final_rounds");
}
