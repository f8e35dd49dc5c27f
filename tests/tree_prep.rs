//! Device-side candidate selection (`TreePrep::Device`, design §3): the Backend's `topk` and
//! `markov_table` give the same trees as the host builders, and every method decoding with
//! device selection still emits exactly the `ar` tokens at T = 0 (and per seed at T > 0).

mod common;

use common::*;
use sparkling::core::{Backend, ReadBack};
use sparkling::cpu::CpuBackend;
use sparkling::decode::propose::{propose, DraftLogits, TreePrep};
use sparkling::decode::{Engine, Method};
use sparkling::model::config::DrafterKind;
use sparkling::tree::{self, MarkovHead};

#[test]
fn backend_topk_matches_host_depth_topk() {
    let b = CpuBackend::new();
    let (rows, vocab) = (5, 301);
    let logits = values(rows * vocab, 1, 4.0);
    let t = b.upload(&logits, rows, vocab).unwrap();
    for k in [1usize, 7, 64, 301, 500] {
        let got = b.topk(&t, k).unwrap();
        let want = tree::depth_topk(&logits, rows, vocab, k);
        assert_eq!(got.k, k.min(vocab));
        assert_eq!(got.ids, want.ids, "k = {k}");
        for i in 0..got.ids.len() {
            let (g, lp) = (got.logp(i), want.logp(i));
            assert!((g - lp).abs() < 1e-5, "k = {k} entry {i}: {g} vs {lp}");
        }
    }
    assert!(b.topk(&t, 0).is_err(), "k = 0 must be refused");
}

#[test]
fn backend_markov_table_matches_host_candidate_table() {
    let b = CpuBackend::new();
    let (ld, vocab, rank) = (6, 97, 5);
    let base = values(ld * vocab, 2, 3.0);
    let head = MarkovHead { vocab, rank, w1: values(vocab * rank, 3, 1.0), w2: values(vocab * rank, 4, 1.0) };
    let anchor = 11u32;
    for (c, fanout) in [(8usize, 64usize), (20, 5), (vocab, 64)] {
        let want = tree::candidate_table(&base, ld, vocab, Some(&head), anchor, c, fanout.min(64));
        let u = b.upload(&base, ld, vocab).unwrap();
        let w1 = b.upload(&head.w1, vocab, rank).unwrap();
        let w2 = b.upload(&head.w2, vocab, rank).unwrap();
        let got = b.markov_table(&u, Some((&w1, &w2)), &want.cand, want.k).unwrap();
        assert_eq!(got.k, want.k);
        assert_eq!(got.slots, want.slots, "C = {c}");
        for (g, w) in got.vals.iter().zip(&want.vals) {
            assert!((g - w).abs() < 2e-5, "C = {c}: {g} vs {w}");
        }
        // No head: each parent row is the depth's log-softmax over the union.
        let plain = b.markov_table(&u, None, &want.cand, want.k).unwrap();
        let want0 = tree::candidate_table(&base, ld, vocab, None, anchor, c, fanout.min(64));
        assert_eq!(plain.slots, want0.slots);
    }
    // Bad input is refused with an error, not a panic.
    let u = b.upload(&base, ld, vocab).unwrap();
    assert!(b.markov_table(&u, None, &[3, 3], 1).is_err(), "duplicate candidates");
    assert!(b.markov_table(&u, None, &[5, vocab as u32], 1).is_err(), "candidate outside the vocabulary");
    assert!(b.markov_table(&u, None, &[], 1).is_err(), "no candidates");
    let short = b.upload(&values(4 * rank, 5, 1.0), 4, rank).unwrap();
    assert!(b.markov_table(&u, Some((&short, &short)), &[1, 2], 1).is_err(), "W1/W2 not [V, r]");
}

#[test]
fn device_and_host_selection_build_the_same_trees() {
    let b = CpuBackend::new();
    let (depth, vocab, rank) = (8, 120, 6);
    let logits = values(depth * vocab, 7, 5.0);
    let head = MarkovHead { vocab, rank, w1: values(vocab * rank, 8, 1.5), w2: values(vocab * rank, 9, 1.5) };
    let t = b.upload(&logits, depth, vocab).unwrap();
    let w1 = b.upload(&head.w1, vocab, rank).unwrap();
    let w2 = b.upload(&head.w2, vocab, rank).unwrap();
    let mut p = params(Method::Sparkling, 1, 0.0, 0, 1, vec![]).tree;
    for method in [Method::DFlash, Method::DDTree, Method::DSpark, Method::Sparkling, Method::TreeSpark] {
        for (budget, cands) in [(1usize, 16usize), (16, 16), (64, 32), (64, vocab)] {
            p.budget = budget;
            p.candidates = cands;
            let draft = DraftLogits { logits: &t, depth, vocab, markov: Some(&head), markov_dev: Some((&w1, &w2)), map: None, markov_w1_target: None };
            p.prep = TreePrep::Host;
            let host = pollster::block_on(propose(&b, method, &draft, 3, &p)).unwrap().tree;
            p.prep = TreePrep::Device;
            let dev = pollster::block_on(propose(&b, method, &draft, 3, &p)).unwrap().tree;
            assert_eq!(dev.tokens, host.tokens, "{} budget {budget} C {cands}", method.name());
            assert_eq!(dev.parents, host.parents, "{} budget {budget} C {cands}", method.name());
            assert!(dev.is_well_formed());
        }
    }
}

#[test]
fn every_method_with_device_selection_matches_ar() {
    let b = CpuBackend::new();
    let vocab = 48;
    let mut taus = Vec::new();
    for (ai, arch) in ARCHS.into_iter().enumerate() {
        let tdir = tmpdir("target");
        let target = random_target(tdir.path(), arch, vocab, 31 + ai as u64);
        let d1 = tmpdir("dflash");
        let dflash = random_drafter(d1.path(), &target.cfg, DrafterKind::DFlash, 7, 0, 5);
        let d2 = tmpdir("dspark");
        let dspark = random_drafter(d2.path(), &target.cfg, DrafterKind::DSpark, 16, 8, 6);
        let prompt = [3u32, 17, 5, 9, 22, 1];
        for temperature in [0.0f32, 1.0] {
            for seed in [0u64, 5] {
                let ar = Engine { backend: &b, target: &target, drafter: None };
                let want = ar.generate(&prompt, &params(Method::Ar, 1, temperature, seed, 30, vec![]), &mut |_| {}).unwrap();
                for method in Method::ALL.into_iter().skip(1) {
                    let drafter = if method.drafter_kind() == Some(DrafterKind::DFlash) { &dflash } else { &dspark };
                    let e = Engine { backend: &b, target: &target, drafter: Some(drafter) };
                    for budget in [4usize, 64] {
                        let mut gp = params(method, budget, temperature, seed, 30, vec![]);
                        gp.tree.prep = TreePrep::Device;
                        let g = e.generate(&prompt, &gp, &mut |_| {}).unwrap();
                        assert_eq!(g.tokens, want.tokens, "{arch:?} {} budget {budget} T {temperature} seed {seed}", method.name());
                        if budget == 64 && method == Method::Sparkling {
                            taus.push(g.stats.tau());
                        }
                    }
                }
            }
        }
    }
    let mean = taus.iter().sum::<f64>() / taus.len() as f64;
    assert!(mean > 1.3, "device-selected sparkling trees accepted too little to exercise compaction (mean τ {mean:.2})");
}
