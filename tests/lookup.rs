//! `lookup` (prompt lookup, no drafter): every generation equals `ar`'s — at T = 0, at T > 0
//! with the same seed, under `--budget auto`, with stop tokens and length cuts inside an
//! accepted chain — on random targets of each arch, whose greedy texts repeat, so the chains
//! are accepted often; and what it refuses.

mod common;

use common::*;
use sparkling::cpu::CpuBackend;
use sparkling::decode::batch::{Batch, BatchOptions};
use sparkling::decode::budget::AutoBudget;
use sparkling::decode::{Engine, GenParams, Method};

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
                        let g = e.generate(prompt, p, &mut |_| {}).unwrap();
                        let what =
                            format!("{arch:?} prompt {prompt:?} T {temperature} max_new {max_new} budget {} auto {}", p.tree.budget, p.auto_budget.is_some());
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
fn lookup_refuses_a_zero_budget_and_batching() {
    let b = CpuBackend::new();
    let dir = tmpdir("target");
    let target = random_target(dir.path(), ARCHS[1], 48, 9);
    let e = Engine { backend: &b, target: &target, drafter: None };
    let err = e.generate(PROMPTS[0], &params(Method::Lookup, 0, 0.0, 0, 8, vec![]), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("tree budget 0") && err.contains("lookup"), "{err}");
    let mut batch = Batch::new(&b, &target, BatchOptions::default()).unwrap();
    let err = batch.add(PROMPTS[0], &params(Method::Lookup, 4, 0.0, 0, 8, vec![])).unwrap_err().to_string();
    assert!(err.contains("`lookup` is not batched"), "{err}");
    assert!(batch.is_empty(), "nothing was queued");
    assert_eq!(Method::parse("lookup").unwrap(), Method::Lookup);
    assert_eq!(Method::Lookup.name(), "lookup");
    assert!(!Method::ALL.contains(&Method::Lookup), "ALL lists the published methods the tables compare");
}
