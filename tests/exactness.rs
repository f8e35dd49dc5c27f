//! The exactness matrix (issue 2): for random targets of each arch × every method × budgets
//! {1, 4, 32, 64} × block sizes {7, 16} × both drafter kinds, greedy output equals `ar` token
//! for token — including generations cut mid-round by max-new-tokens and stop tokens that land
//! inside an accepted path.

mod common;

use common::*;
use sparkling::core::{AttnMask, ReadBack};
use sparkling::cpu::{CpuBackend, KvDtype};
use sparkling::decode::{Engine, Method};
use sparkling::model::config::{Arch, DrafterKind};
use sparkling::model::target::{LogitRows, SeqInput};

const PROMPTS: [&[u32]; 2] = [&[3, 17, 5, 9, 22, 1], &[40, 2, 2, 7]];

#[test]
fn every_method_matches_ar_at_temperature_zero() {
    let b = CpuBackend::new();
    let vocab = 48;
    let mut tree_tau_sum = 0.0;
    let mut tree_runs = 0usize;
    for (ai, arch) in ARCHS.into_iter().enumerate() {
        let tdir = tmpdir("target");
        let target = random_target(tdir.path(), arch, vocab, 11 + ai as u64);
        for block in [7usize, 16] {
            let d1 = tmpdir("dflash");
            let dflash = random_drafter(d1.path(), &target.cfg, DrafterKind::DFlash, block, 0, 5);
            let d2 = tmpdir("dspark");
            let dspark = random_drafter(d2.path(), &target.cfg, DrafterKind::DSpark, block, 8, 6);
            for prompt in PROMPTS {
                for max_new in [13usize, 40] {
                    let ar = Engine { backend: &b, target: &target, drafter: None };
                    let want = ar.generate(prompt, &params(Method::Ar, 1, 0.0, 0, max_new, vec![]), &mut |_| {}).unwrap();
                    assert_eq!(want.tokens.len(), max_new);
                    for method in Method::ALL.into_iter().skip(1) {
                        let drafter = if method.drafter_kind() == Some(DrafterKind::DFlash) { &dflash } else { &dspark };
                        let e = Engine { backend: &b, target: &target, drafter: Some(drafter) };
                        for budget in [1usize, 4, 32, 64] {
                            let g = e.generate(prompt, &params(method, budget, 0.0, 0, max_new, vec![]), &mut |_| {}).unwrap();
                            assert_eq!(g.tokens, want.tokens, "{arch:?} block {block} {} budget {budget} prompt {prompt:?} max_new {max_new}", method.name());
                            // τ counts kept tokens: the rounds' tokens plus the prefill's first are
                            // the output, also when max_new_tokens cut the last round.
                            assert_eq!(g.stats.committed + 1, g.tokens.len(), "{} budget {budget} max_new {max_new}", method.name());
                            if budget == 64 && matches!(method, Method::DDTree | Method::Sparkling | Method::TreeSpark) {
                                tree_tau_sum += g.stats.tau();
                                tree_runs += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    // With a 48-token vocabulary, 64-node trees catch the target's token often; this makes sure
    // the matrix exercised multi-token acceptance (and hence real KV compaction moves).
    let mean_tau = tree_tau_sum / tree_runs as f64;
    assert!(mean_tau > 1.3, "mean τ of tree methods at budget 64 was only {mean_tau:.2}");
}

#[test]
fn stop_token_inside_an_accepted_path_ends_generation_there() {
    let b = CpuBackend::new();
    let tdir = tmpdir("target");
    let target = random_target(tdir.path(), sparkling::model::config::Arch::Qwen3, 24, 3);
    let d = tmpdir("dspark");
    let dspark = random_drafter(d.path(), &target.cfg, DrafterKind::DSpark, 16, 8, 9);
    let d2 = tmpdir("dflash");
    let dflash = random_drafter(d2.path(), &target.cfg, DrafterKind::DFlash, 16, 0, 9);
    let prompt = [1u32, 2, 3, 4];
    let ar = Engine { backend: &b, target: &target, drafter: None };
    let free = ar.generate(&prompt, &params(Method::Ar, 1, 0.0, 0, 60, vec![]), &mut |_| {}).unwrap();
    // Pick stop tokens that first occur at several places of the free-running output.
    let mut checked = 0;
    for pos in [3usize, 10, 25, 40] {
        let stop = free.tokens[pos];
        let first = free.tokens.iter().position(|&t| t == stop).unwrap();
        let want = &free.tokens[..=first];
        for method in Method::ALL {
            let drafter = if method.drafter_kind() == Some(DrafterKind::DFlash) { &dflash } else { &dspark };
            let e = Engine { backend: &b, target: &target, drafter: Some(drafter) };
            let g = e.generate(&prompt, &params(method, 64, 0.0, 0, 60, vec![stop]), &mut |_| {}).unwrap();
            assert_eq!(g.tokens, want, "{} stop {stop}", method.name());
            assert!(g.stopped);
            checked += 1;
        }
    }
    assert_eq!(checked, 24);
}

/// Issue 10: the exactness matrix with quantized targets (Q8_0 quantized at load, Q4_0,
/// Q4_1 and Q5_0 kept in their ggml blocks): the int8 kernels' rows do not depend on the verify's row
/// count, so every method still emits the `ar` tokens at temperature zero.
#[test]
fn every_method_matches_ar_with_quantized_targets() {
    let vocab = 48;
    // The f16 KV cache (the CLI's default on the CPU) with every format; the f32 and q8_0 ones
    // with Q4_1.
    for (weights, kv) in
        [("q8_0", KvDtype::F16), ("q4_0", KvDtype::F16), ("q4_1", KvDtype::F16), ("q5_0", KvDtype::F16), ("q4_1", KvDtype::F32), ("q4_1", KvDtype::Q8_0)]
    {
        let b = CpuBackend::new().with_kv_dtype(kv);
        for (ai, arch) in ARCHS.into_iter().enumerate() {
            let tdir = tmpdir("qtarget");
            let target = random_quant_target(tdir.path(), arch, vocab, 21 + ai as u64, weights);
            let d1 = tmpdir("dflash");
            let dflash = random_drafter(d1.path(), &target.cfg, DrafterKind::DFlash, 16, 0, 5);
            let d2 = tmpdir("dspark");
            let dspark = random_drafter(d2.path(), &target.cfg, DrafterKind::DSpark, 16, 8, 6);
            for prompt in PROMPTS {
                let max_new = 40;
                let ar = Engine { backend: &b, target: &target, drafter: None };
                let want = ar.generate(prompt, &params(Method::Ar, 1, 0.0, 0, max_new, vec![]), &mut |_| {}).unwrap();
                for method in Method::ALL.into_iter().skip(1) {
                    let drafter = if method.drafter_kind() == Some(DrafterKind::DFlash) { &dflash } else { &dspark };
                    let e = Engine { backend: &b, target: &target, drafter: Some(drafter) };
                    for budget in [1usize, 8, 64] {
                        let g = e.generate(prompt, &params(method, budget, 0.0, 0, max_new, vec![]), &mut |_| {}).unwrap();
                        assert_eq!(g.tokens, want.tokens, "{weights} kv {kv:?} {arch:?} {} budget {budget} prompt {prompt:?}", method.name());
                    }
                }
            }
        }
    }
}

#[test]
fn round_observer_sees_the_verified_tree_and_the_committed_path() {
    // Issue 16: the per-round view (tree + accepted path + bonus) is what the loop committed:
    // the accepted nodes' tokens plus the bonus, round after round, rebuild the generation
    // (after the prefill's first token), and every view is a well-formed tree.
    let b = CpuBackend::new();
    let tdir = tmpdir("target");
    let target = random_target(tdir.path(), sparkling::model::config::Arch::Llama, 24, 5);
    let d = tmpdir("dspark");
    let dspark = random_drafter(d.path(), &target.cfg, DrafterKind::DSpark, 7, 8, 3);
    let d2 = tmpdir("dflash");
    let dflash = random_drafter(d2.path(), &target.cfg, DrafterKind::DFlash, 7, 0, 3);
    let prompt = [4u32, 9, 1, 7];
    let mut multi_total = 0usize;
    let mut last_total = 0usize;
    for method in [Method::Ar, Method::DDTree, Method::Sparkling, Method::DSpark] {
        let drafter = match method.drafter_kind() {
            Some(DrafterKind::DFlash) => Some(&dflash),
            Some(DrafterKind::DSpark) => Some(&dspark),
            None => None,
        };
        let e = Engine { backend: &b, target: &target, drafter };
        let mut rebuilt: Vec<u32> = Vec::new();
        let mut rounds = 0usize;
        let mut multi = 0usize;
        let mut last_rounds = 0usize;
        let g = e
            .generate_observed(&prompt, &params(method, 64, 0.0, 0, 30, vec![]), &mut |_| {}, &mut |r| {
                assert_eq!(r.round, rounds, "{}", method.name());
                assert_eq!(r.root_pos, prompt.len() + rebuilt.len(), "{}: the root sits after the committed tokens", method.name());
                let t = r.tree;
                assert_eq!(r.accepted[0], 0);
                for w in r.accepted.windows(2) {
                    assert_eq!(t.parents[w[1]] as usize, w[0], "{}: accepted path is a parent chain", method.name());
                }
                if method == Method::Ar {
                    assert_eq!(t.len(), 1);
                }
                // No node deeper than the tokens still to generate less the bonus: the commit
                // is cut at max-new-tokens (30), so deeper nodes would be verified for nothing.
                let generated = 1 + rebuilt.len();
                let deepest = t.depths.iter().copied().max().unwrap_or(0) as usize;
                assert!(deepest <= 30usize.saturating_sub(generated + 1), "{}: a depth-{deepest} tree with {generated} of 30 generated", method.name());
                // Only the round that writes the 30th token (its bonus) is marked as such, and
                // it drafts nothing.
                assert_eq!(r.last_token, method != Method::Ar && generated + 1 == 30, "{}: round {} of {generated}", method.name(), r.round);
                assert!(!r.last_token || (t.len() == 1 && !r.drafted), "{}", method.name());
                last_rounds += usize::from(r.last_token);
                multi += usize::from(r.accepted.len() > 1);
                rebuilt.extend(r.accepted[1..].iter().map(|&i| t.tokens[i]));
                rebuilt.push(r.bonus);
                rounds += 1;
            })
            .unwrap();
        assert_eq!(rounds, g.stats.rounds, "{}", method.name());
        assert_eq!(g.stats.final_rounds, last_rounds, "{}", method.name());
        last_total += last_rounds;
        assert_eq!(&rebuilt[..g.tokens.len() - 1], &g.tokens[1..], "{}", method.name());
        if method == Method::Ar {
            assert_eq!(rounds, 29);
        }
        multi_total += multi;
    }
    assert!(multi_total > 0, "some round should accept a drafted node (vocabulary 24, 64 nodes)");
    assert!(last_total > 0, "some drafter method should reach a round with only its bonus left");
}

/// The decode loop prefills in chunks (`BatchOptions::max_prefill_rows`; host backends in the
/// browser, so the page gets a turn between them). Rows are computed independently of their
/// block, so any chunk size gives the same last-row logits, taps and cache bit for bit — for
/// f32, f16 and q8_0 caches and a 4-bit target.
#[test]
fn chunked_prefill_equals_one_forward_bit_for_bit() {
    let vocab = 48;
    let dir = tmpdir("prefill");
    let target = random_quant_target(dir.path(), Arch::Llama, vocab, 41, "q4_1");
    let prompt: Vec<u32> = (0..45u32).map(|i| (i * 7 + 3) % vocab as u32).collect();
    let taps = [0usize, 1];
    for kv in [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0] {
        let b = CpuBackend::new().with_kv_dtype(kv);
        let run = |chunk: usize| {
            let mut cache = target.new_cache(&b, prompt.len() + 1).unwrap();
            let (mut logits, mut tap_rows) = (Vec::new(), Vec::new());
            for (ci, ids) in prompt.chunks(chunk).enumerate() {
                let positions: Vec<u32> = (ci * chunk..ci * chunk + ids.len()).map(|x| x as u32).collect();
                let out = target
                    .forward(&b, &mut cache, SeqInput { ids, positions: &positions, mask: AttnMask::Causal, logits: Some(LogitRows::Last) }, &taps)
                    .unwrap();
                logits = b.download(&out.logits).unwrap();
                tap_rows.extend(b.download(out.taps.as_ref().unwrap()).unwrap());
            }
            let k: Vec<Vec<f32>> = cache.k.iter().map(|t| b.download(t).unwrap()).collect();
            (logits, tap_rows, k, cache.len)
        };
        let whole = run(prompt.len());
        assert_eq!(whole.1.len(), prompt.len() * 2 * target.cfg.hidden);
        for chunk in [1usize, 7, 32, 44] {
            let c = run(chunk);
            let same = |a: &[f32], b: &[f32]| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same(&c.0, &whole.0), "{kv:?} chunk {chunk}: logits");
            assert!(same(&c.1, &whole.1), "{kv:?} chunk {chunk}: taps");
            assert!(c.2.iter().zip(&whole.2).all(|(x, y)| same(x, y)) && c.3 == whole.3, "{kv:?} chunk {chunk}: cache");
        }
    }
}
