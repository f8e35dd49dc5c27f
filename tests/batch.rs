//! Batch decoding: every sequence of a batch decodes exactly the tokens it decodes
//! alone (`Engine::generate`, `ar`) — at T = 0 and at T > 0 with the same seed — whatever its
//! neighbours, the batch size, when it joins (continuous batching), whether its prompt is
//! prefilled in chunks, and whether a neighbour stops early. On random targets of every
//! architecture (f32 and Q4_1 weights) and on SmolLM2-135M-Instruct (real GGUF, native Q4_1
//! weights and f16; skipped without the asset unless `SPARKLING_REQUIRE_ASSETS=1`). The
//! speculative methods batched (each sequence its own drafter state, round policy and tree
//! block; fixed budgets and `--budget auto`, with and without a lookup graft) equal the same
//! method decoded alone, and so `ar`.

mod common;

use common::*;
use sparkling::core::{AttnMask, AttnShape, Backend, RaggedSeq, ReadBack, NO_PARENT};
use sparkling::cpu::{CpuBackend, KvDtype, WeightDtype};
use sparkling::decode::batch::{Batch, BatchOptions, SeqId};
use sparkling::decode::propose::{TreeParams, TreePrep};
use sparkling::decode::{Engine, GenParams, LookupGraft, Method, Platform};
use sparkling::loader::gguf_source::GgufSource;
use sparkling::model::config::{Arch, DrafterKind, TargetConfig};
use sparkling::model::drafter::{DraftJob, Drafter};
use sparkling::model::synth::{tiny_target_config, write_random_target, StoreDtype};
use sparkling::model::target::{LogitRows, SeqInput, Target};
use std::collections::HashMap;

/// One request of a schedule: prompt, parameters, and the first step at which it may join.
struct Req {
    prompt: Vec<u32>,
    params: GenParams,
    join_at: usize,
}

/// Decode `reqs` through one [`Batch`] with at most `max_in_flight` sequences at a time (a
/// request joins at the first step ≥ its `join_at` with a free slot, in order). Returns each
/// request's tokens and stop flag, and the largest number of sequences that shared a step.
fn run_batched<B: Backend>(b: &B, t: &Target<B>, reqs: &[Req], max_in_flight: usize, opts: BatchOptions) -> (Vec<(Vec<u32>, bool)>, usize) {
    let mut batch = Batch::new(b, t, opts).unwrap();
    let mut owner: HashMap<SeqId, usize> = HashMap::new();
    let mut results: Vec<Option<(Vec<u32>, bool)>> = vec![None; reqs.len()];
    let mut next = 0;
    let mut step = 0;
    let mut widest = 0;
    while next < reqs.len() || !batch.is_empty() {
        while next < reqs.len() && batch.len() < max_in_flight && reqs[next].join_at <= step {
            let id = batch.add(&reqs[next].prompt, &reqs[next].params).unwrap();
            owner.insert(id, next);
            next += 1;
        }
        let out = batch.step().unwrap();
        widest = widest.max(out.seqs.len());
        for f in out.finished {
            assert!(!f.cancelled);
            assert_eq!(f.stats.new_tokens, f.tokens.len());
            results[owner[&f.id]] = Some((f.tokens, f.stopped));
        }
        step += 1;
        assert!(step < 10_000, "batch never drained");
    }
    (results.into_iter().map(|r| r.expect("every request finished")).collect(), widest)
}

/// Each request decoded alone.
fn run_alone<B: Backend>(b: &B, t: &Target<B>, reqs: &[Req]) -> Vec<(Vec<u32>, bool)> {
    let e = Engine { backend: b, target: t, drafter: None };
    reqs.iter()
        .map(|r| {
            let g = e.generate(&r.prompt, &r.params, &mut |_| {}).unwrap();
            (g.tokens, g.stopped)
        })
        .collect()
}

/// Every schedule of `reqs` (batch sizes 1, 2, 3 and all; all at once or staggered joins;
/// whole or chunked prefill) gives each request its alone tokens.
fn check_schedules<B: Backend>(b: &B, t: &Target<B>, reqs: &mut [Req], what: &str) {
    let want = run_alone(b, t, reqs);
    let n = reqs.len();
    for stagger in [false, true] {
        for (i, r) in reqs.iter_mut().enumerate() {
            r.join_at = if stagger { 3 * i } else { 0 };
        }
        for max_in_flight in [1usize, 2, 3, n] {
            for chunk in [0usize, 3] {
                let opts = BatchOptions { taps: vec![], max_prefill_rows: chunk };
                let (got, widest) = run_batched(b, t, reqs, max_in_flight, opts);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g, w, "{what}: request {i} (batch ≤ {max_in_flight}, stagger {stagger}, prefill chunk {chunk})");
                }
                if max_in_flight > 1 {
                    assert!(widest > 1, "{what}: the schedule never packed two sequences into one step");
                }
            }
        }
    }
}

const PROMPTS: [&[u32]; 5] = [&[3, 17, 5, 9, 22, 1], &[40, 2, 2, 7], &[1], &[9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11, 12, 13], &[5, 5]];

/// A mix of greedy and sampled requests with their own lengths, seeds and temperatures, and
/// one request that stops early on a token its alone run emits at step 3.
fn mixed_requests(b: &CpuBackend, t: &Target<CpuBackend>) -> Vec<Req> {
    let e = Engine { backend: b, target: t, drafter: None };
    let free = e.generate(PROMPTS[0], &params(Method::Ar, 1, 0.0, 0, 20, vec![]), &mut |_| {}).unwrap();
    let stop = free.tokens[3];
    let req = |p: &[u32], temp: f32, seed: u64, max_new: usize, stop: Vec<u32>| Req {
        prompt: p.to_vec(),
        params: params(Method::Ar, 1, temp, seed, max_new, stop),
        join_at: 0,
    };
    vec![
        req(PROMPTS[0], 0.0, 0, 20, vec![stop]),
        req(PROMPTS[1], 1.0, 7, 17, vec![]),
        req(PROMPTS[2], 0.0, 0, 12, vec![]),
        req(PROMPTS[3], 0.7, 3, 25, vec![]),
        req(PROMPTS[4], 1.0, 7, 9, vec![]),
        req(PROMPTS[1], 0.0, 0, 14, vec![]),
    ]
}

#[test]
fn batched_equals_alone_on_random_targets_of_every_arch() {
    let b = CpuBackend::new();
    for (ai, arch) in ARCHS.into_iter().enumerate() {
        let dir = tmpdir("target");
        let t = random_target(dir.path(), arch, 48, 31 + ai as u64);
        let mut reqs = mixed_requests(&b, &t);
        // The early stop really is early.
        let alone = run_alone(&b, &t, &reqs[..1]);
        assert!(alone[0].1 && alone[0].0.len() <= 4, "{arch:?}: {:?}", alone[0]);
        check_schedules(&b, &t, &mut reqs, &format!("{arch:?} f32"));
    }
}

#[test]
fn batched_equals_alone_with_quantized_targets() {
    // f32 KV caches, and Q4_1 with the f16 (the CLI's default) and q8_0 caches too.
    for (weights, kv) in [("q8_0", KvDtype::F32), ("q4_1", KvDtype::F32), ("q4_1", KvDtype::F16), ("q4_1", KvDtype::Q8_0)] {
        for (ai, arch) in ARCHS.into_iter().enumerate() {
            let dir = tmpdir("qtarget");
            let t = random_quant_target(dir.path(), arch, 48, 41 + ai as u64, weights);
            let b = CpuBackend::with_weight_dtype(if weights == "q8_0" { WeightDtype::Q8_0 } else { WeightDtype::Native }).with_kv_dtype(kv);
            let mut reqs = mixed_requests(&b, &t);
            check_schedules(&b, &t, &mut reqs, &format!("{arch:?} {weights} kv {kv:?}"));
        }
    }
}

/// Ragged attention on the CPU equals one single-sequence attention call per sequence, bit for
/// bit, for causal, full and tree blocks of different lengths over caches of different lengths.
#[test]
fn cpu_ragged_attention_equals_per_sequence_attention() {
    let b = CpuBackend::new();
    let shape = AttnShape { n_heads: 4, n_kv_heads: 2, head_dim: 8 };
    let pseudo = |n: usize, seed: u64| -> Vec<f32> {
        let mut s = seed;
        (0..n).map(|_| (sparkling::decode::rng::splitmix64_next(&mut s) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0).collect()
    };
    let parents = [NO_PARENT, 0, 0, 1, 2];
    let specs: [(usize, usize, AttnMask<'_>); 4] =
        [(9, 1, AttnMask::Causal), (20, 5, AttnMask::Tree { parents: &parents }), (4, 4, AttnMask::Causal), (7, 3, AttnMask::Full)];
    let caches: Vec<_> = specs
        .iter()
        .enumerate()
        .map(|(i, &(kv, _, _))| {
            (b.upload(&pseudo(kv * 16 + 32, 10 + i as u64), kv + 2, 16).unwrap(), b.upload(&pseudo(kv * 16 + 32, 20 + i as u64), kv + 2, 16).unwrap())
        })
        .collect();
    let rows: usize = specs.iter().map(|s| s.1).sum();
    let q = b.upload(&pseudo(rows * 32, 99), rows, 32).unwrap();
    let seqs: Vec<RaggedSeq<'_, _>> =
        specs.iter().zip(&caches).map(|(&(kv, qr, mask), (k, v))| RaggedSeq { k_cache: k, v_cache: v, kv_len: kv, q_rows: qr, mask }).collect();
    let all = b.attention_ragged(&q, &seqs, shape).unwrap();
    let mut r0 = 0;
    for s in &seqs {
        let qs = b.gather_rows(&q, &(r0..r0 + s.q_rows).collect::<Vec<_>>()).unwrap();
        let one = b.attention(&qs, s.k_cache, s.v_cache, s.kv_len, shape, s.mask).unwrap();
        assert_eq!(one.data, all.data[r0 * 32..(r0 + s.q_rows) * 32].to_vec());
        r0 += s.q_rows;
    }
    // Blocks that do not cover q, or an empty block, are errors.
    assert!(b.attention_ragged(&q, &seqs[..3], shape).is_err());
    let mut bad = seqs.clone();
    bad[0].q_rows = 0;
    assert!(b.attention_ragged(&q, &bad, shape).is_err());
    assert!(b.attention_ragged(&q, &[], shape).is_err());
}

/// A packed drafter forward (`Drafter::draft_batch`: jobs of different context lengths, cache
/// lengths and depths) gives each job the logits of its forward alone, bit for bit, and leaves
/// its draft cache as the forward alone does (the next round, alone, agrees too); for both
/// drafter kinds, on random models.
#[test]
fn packed_drafter_forward_equals_each_forward_alone() {
    let b = CpuBackend::new();
    let td = tmpdir("target");
    let t = random_target(td.path(), Arch::Llama, 48, 17);
    let pseudo = |n: usize, seed: u64| -> Vec<f32> {
        let mut s = seed;
        (0..n).map(|_| (sparkling::decode::rng::splitmix64_next(&mut s) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0).collect()
    };
    for (kind, rank) in [(DrafterKind::DSpark, 4), (DrafterKind::DFlash, 0)] {
        let dd = tmpdir("drafter");
        let d = random_drafter(dd.path(), &t.cfg, kind, 8, rank, 23);
        let width = d.cfg.target_layer_ids.len() * t.cfg.hidden;
        // (context rows of round 1, of round 2, depth of round 2, anchor).
        // The second job has no new context this round (its taps have no rows).
        let jobs = [(3usize, 2usize, 8usize, 5u32), (2, 0, 3, 7), (1, 1, 2, 9), (6, 4, 5, 11)];
        let taps = |rows: usize, seed: u64| b.upload(&pseudo(rows * width, seed), rows, width).unwrap();
        let (mut alone, mut packed) = (Vec::new(), Vec::new());
        for (i, &(l1, _, _, anchor)) in jobs.iter().enumerate() {
            for caches in [&mut alone, &mut packed] {
                let mut c = d.new_cache(&b, 64).unwrap();
                d.draft(&b, &t, DraftJob { cache: &mut c, taps: &taps(l1, 100 + i as u64), anchor, root_pos: l1, depth: 8 }).unwrap();
                caches.push(c);
            }
        }
        let round2: Vec<_> = jobs.iter().enumerate().map(|(i, &(_, l2, _, _))| taps(l2, 200 + i as u64)).collect();
        let want: Vec<Vec<f32>> = jobs
            .iter()
            .zip(alone.iter_mut())
            .zip(&round2)
            .map(|((&(l1, l2, depth, anchor), c), tp)| {
                b.download(&d.draft(&b, &t, DraftJob { cache: c, taps: tp, anchor: anchor + 1, root_pos: l1 + l2, depth }).unwrap()).unwrap()
            })
            .collect();
        let mut batch: Vec<DraftJob<'_, CpuBackend>> = jobs
            .iter()
            .zip(packed.iter_mut())
            .zip(&round2)
            .map(|((&(l1, l2, depth, anchor), cache), taps)| DraftJob { cache, taps, anchor: anchor + 1, root_pos: l1 + l2, depth })
            .collect();
        let got: Vec<_> = d.draft_batch(&b, &t, &mut batch).unwrap().into_iter().map(|(logits, _hidden)| logits).collect();
        drop(batch);
        assert_eq!(got.len(), jobs.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(&b.download(g).unwrap(), w, "{kind:?} job {i}: packed logits differ from the forward alone");
            assert_eq!(packed[i].len, alone[i].len, "{kind:?} job {i}: cache length");
        }
        for (i, &(l1, l2, _, anchor)) in jobs.iter().enumerate() {
            let next = taps(1, 300 + i as u64);
            let a = b.download(&d.draft(&b, &t, DraftJob { cache: &mut alone[i], taps: &next, anchor, root_pos: l1 + l2 + 1, depth: 3 }).unwrap()).unwrap();
            let p = b.download(&d.draft(&b, &t, DraftJob { cache: &mut packed[i], taps: &next, anchor, root_pos: l1 + l2 + 1, depth: 3 }).unwrap()).unwrap();
            assert_eq!(a, p, "{kind:?} job {i}: the round after the packed one");
        }
        // A job whose context does not end at its root is refused, naming it.
        let mut bad: Vec<DraftJob<'_, CpuBackend>> = packed
            .iter_mut()
            .zip(&round2)
            .map(|(cache, taps)| {
                let root_pos = cache.len + 9;
                DraftJob { cache, taps, anchor: 1, root_pos, depth: 2 }
            })
            .collect();
        let e = d.draft_batch(&b, &t, &mut bad).expect_err("a misplaced context is an error").to_string();
        assert!(e.contains("drafter job 0"), "{e}");
    }
}

/// With taps requested, every token of prompt + answer gets its tap row (a finished sequence
/// feeds its last token once more), equal bit for bit to one causal forward over the whole
/// sequence — what `sparkling-train gen-data` stores — and the logits rows that chose the
/// tokens equal that forward's rows.
#[test]
fn batched_taps_and_logits_equal_one_forward_over_the_whole_sequence() {
    let b = CpuBackend::new();
    let dir = tmpdir("target");
    let t = random_target(dir.path(), Arch::Qwen2, 48, 5);
    let taps = vec![0usize, 1];
    let width = taps.len() * t.cfg.hidden;
    let vocab = t.cfg.vocab;
    let mut batch = Batch::new(&b, &t, BatchOptions { taps: taps.clone(), max_prefill_rows: 4 }).unwrap();
    let mut ids = Vec::new();
    for (i, p) in PROMPTS.iter().enumerate() {
        ids.push(batch.add(p, &params(Method::Ar, 1, 0.0, 0, 6 + 3 * i, vec![])).unwrap());
    }
    let mut rows: HashMap<SeqId, Vec<f32>> = HashMap::new();
    let mut logits: HashMap<SeqId, Vec<f32>> = HashMap::new();
    let mut finished = Vec::new();
    while !batch.is_empty() {
        let out = batch.step().unwrap();
        let tp = b.download(out.taps.as_ref().unwrap()).unwrap();
        for s in &out.seqs {
            rows.entry(s.id).or_default().extend_from_slice(&tp[s.input_rows.start * width..s.input_rows.end * width]);
            if let Some(r) = s.logit_row {
                logits.entry(s.id).or_default().extend(b.download_rows(out.logits.as_ref().unwrap(), r, 1).unwrap());
            }
        }
        finished.extend(out.finished);
    }
    assert_eq!(finished.len(), PROMPTS.len());
    for f in finished {
        let mut all = f.prompt.clone();
        all.extend_from_slice(&f.tokens);
        let mut cache = t.new_cache(&b, all.len()).unwrap();
        let pos: Vec<u32> = (0..all.len() as u32).collect();
        let one = t.forward(&b, &mut cache, SeqInput { ids: &all, positions: &pos, mask: AttnMask::Causal, logits: Some(LogitRows::All) }, &taps).unwrap();
        assert_eq!(rows[&f.id], b.download(one.taps.as_ref().unwrap()).unwrap(), "taps of sequence {}", f.id);
        let pl = f.prompt.len();
        let want = b.download_rows(&one.logits, pl - 1, f.tokens.len()).unwrap();
        assert_eq!(logits[&f.id].len(), f.tokens.len() * vocab);
        assert_eq!(logits[&f.id], want, "logits of sequence {}", f.id);
    }
}

/// `max_prefill_rows` is one budget per step over every joining sequence, first come first
/// served: three 5-token prompts queued together with a budget of 4 feed 4, then 1 + 3, then
/// 2 + 2, then 3 prompt rows, so their first tokens come at steps 1, 2 and 3 (0-based) instead
/// of all at step 1 — and each still decodes its tokens alone.
#[test]
fn prompt_rows_are_one_budget_per_step_first_come_first_served() {
    let b = CpuBackend::new();
    let dir = tmpdir("target");
    let t = random_target(dir.path(), Arch::Llama, 32, 9);
    let prompts: [Vec<u32>; 3] = [vec![1, 2, 3, 4, 5], vec![6, 7, 8, 9, 10], vec![11, 12, 13, 14, 15]];
    let p = params(Method::Ar, 1, 0.0, 0, 6, vec![]);
    let mut batch = Batch::new(&b, &t, BatchOptions { taps: vec![], max_prefill_rows: 4 }).unwrap();
    let ids: Vec<SeqId> = prompts.iter().map(|q| batch.add(q, &p).unwrap()).collect();
    let mut first_token_step: HashMap<SeqId, usize> = HashMap::new();
    let mut prompt_rows_per_step = Vec::new();
    let mut finished = HashMap::new();
    let mut step = 0;
    while !batch.is_empty() {
        let out = batch.step().unwrap();
        let mut rows = 0;
        for s in &out.seqs {
            if s.first_position < 5 {
                rows += s.input_rows.len();
            }
            if s.token.is_some() {
                first_token_step.entry(s.id).or_insert(step);
            }
        }
        prompt_rows_per_step.push(rows);
        for f in out.finished {
            finished.insert(f.id, f.tokens);
        }
        step += 1;
        assert!(step < 100, "batch never drained");
    }
    assert_eq!(&prompt_rows_per_step[..4], &[4, 4, 4, 3], "prompt rows fed per step");
    assert!(prompt_rows_per_step[4..].iter().all(|&r| r == 0));
    assert_eq!(ids.iter().map(|id| first_token_step[id]).collect::<Vec<_>>(), vec![1, 2, 3]);
    for (id, q) in ids.iter().zip(&prompts) {
        let mut alone = Batch::new(&b, &t, BatchOptions::default()).unwrap();
        alone.add(q, &p).unwrap();
        let want = alone.run_to_end().unwrap().remove(0).tokens;
        assert_eq!(finished[id], want, "sequence {id} batched with a shared prompt budget");
    }
}

#[test]
fn joins_leaves_cancels_and_bad_requests() {
    let b = CpuBackend::new();
    let dir = tmpdir("target");
    let t = random_target(dir.path(), Arch::Llama, 32, 9);
    let mut batch = Batch::new(&b, &t, BatchOptions::default()).unwrap();
    // Every layer can be tapped, the last one's raw output included; past it is refused.
    assert!(Batch::new(&b, &t, BatchOptions { taps: vec![t.cfg.layers - 1], max_prefill_rows: 0 }).is_ok());
    assert!(Batch::new(&b, &t, BatchOptions { taps: vec![t.cfg.layers], max_prefill_rows: 0 }).is_err());
    // Refused up front, nothing queued.
    assert!(batch.add(&[], &params(Method::Ar, 1, 0.0, 0, 4, vec![])).is_err());
    assert!(batch.add(&[99], &params(Method::Ar, 1, 0.0, 0, 4, vec![])).is_err());
    assert!(batch.add(&[1], &params(Method::Sparkling, 8, 0.0, 0, 4, vec![])).is_err(), "no drafter in this batch");
    assert!(batch.add(&[1], &params(Method::Ar, 1, -1.0, 0, 4, vec![])).is_err());
    assert!(batch.add(&[1], &params(Method::Ar, 1, 0.0, 0, 1 << 30, vec![])).is_err());
    assert!(batch.is_empty());
    // max-new-tokens 0 leaves at the first step with nothing, as `generate` returns nothing.
    let z = batch.add(&[1, 2], &params(Method::Ar, 1, 0.0, 0, 0, vec![])).unwrap();
    let a = batch.add(&[1, 2, 3], &params(Method::Ar, 1, 0.0, 0, 50, vec![])).unwrap();
    let out = batch.step().unwrap();
    assert_eq!(out.seqs.len(), 1);
    assert_eq!(out.finished.len(), 1);
    assert_eq!((out.finished[0].id, out.finished[0].tokens.len()), (z, 0));
    batch.step().unwrap();
    let c = batch.cancel(a).unwrap();
    assert!(c.cancelled && c.tokens.len() == 2);
    assert!(batch.cancel(a).is_none());
    assert!(batch.is_empty());
    assert_eq!(batch.stats().steps, 2);
    assert!(batch.step().unwrap().seqs.is_empty(), "an empty batch steps without a forward");
}

/// One round of a speculative sequence: the tree's tokens and parents, and the accepted path.
type Round = (Vec<u32>, Vec<u32>, Vec<usize>);

/// Speculative requests (every drafter method, fixed budgets, host and device tree prep,
/// T = 0 and T > 0, an early stop, one new token only) mixed with `ar` ones, batched at once or
/// staggered, whole or chunked prefill: each request emits its alone tokens, which are the `ar`
/// tokens, and verifies the very trees it verifies alone, round by round (so its drafter saw
/// the same context), accepting the same paths; trees of different sizes share steps.
/// `method` under the library's defaults (`--budget auto`, the CPU's lookup graft) with the
/// given sampling and length.
fn auto(method: Method, temperature: f32, seed: u64, max_new_tokens: usize) -> GenParams {
    let mut p = GenParams::new(method, &Platform::HOST);
    p.sampling.temperature = temperature;
    p.seed = seed;
    p.max_new_tokens = max_new_tokens;
    p
}

#[test]
fn speculative_methods_batched_equal_alone_and_ar() {
    let b = CpuBackend::new();
    for (ai, arch) in [Arch::Llama, Arch::Qwen3].into_iter().enumerate() {
        let (td, dd, fd) = (tmpdir("target"), tmpdir("dspark"), tmpdir("dflash"));
        let t = random_target(td.path(), arch, 48, 71 + ai as u64);
        let dspark = random_drafter(dd.path(), &t.cfg, DrafterKind::DSpark, 8, 4, 5 + ai as u64);
        let dflash = random_drafter(fd.path(), &t.cfg, DrafterKind::DFlash, 8, 0, 6 + ai as u64);
        let drafter_of = |m: Method| -> Option<&Drafter<CpuBackend>> {
            match m.drafter_kind() {
                Some(DrafterKind::DSpark) => Some(&dspark),
                Some(DrafterKind::DFlash) => Some(&dflash),
                None => None,
            }
        };
        let ar = Engine { backend: &b, target: &t, drafter: None };
        let free = ar.generate(PROMPTS[0], &params(Method::Ar, 1, 0.0, 0, 20, vec![]), &mut |_| {}).unwrap();
        let stop = free.tokens[5];
        let reqs: Vec<(Vec<u32>, GenParams)> = vec![
            (PROMPTS[0].to_vec(), params(Method::Sparkling, 8, 0.0, 0, 20, vec![stop])),
            (PROMPTS[1].to_vec(), params(Method::DSpark, 4, 1.0, 7, 17, vec![])),
            (PROMPTS[2].to_vec(), params(Method::Ar, 1, 0.0, 0, 12, vec![])),
            (PROMPTS[3].to_vec(), params(Method::DFlash, 6, 0.0, 0, 25, vec![])),
            (PROMPTS[4].to_vec(), params(Method::DDTree, 8, 0.7, 3, 15, vec![])),
            (PROMPTS[1].to_vec(), params(Method::TreeSpark, 8, 0.0, 0, 14, vec![])),
            (PROMPTS[2].to_vec(), params(Method::Sparkling, 3, 1.0, 9, 18, vec![])),
            (
                PROMPTS[3].to_vec(),
                GenParams {
                    tree: TreeParams { prep: TreePrep::Device, ..params(Method::Sparkling, 6, 0.0, 0, 16, vec![]).tree },
                    ..params(Method::Sparkling, 6, 0.0, 0, 16, vec![])
                },
            ),
            (PROMPTS[0].to_vec(), params(Method::DSpark, 8, 0.0, 0, 1, vec![])),
            // Prompt lookup: alone, and grafted onto drafted trees (both drafter policies).
            (PROMPTS[2].to_vec(), params(Method::Lookup, 4, 0.0, 0, 22, vec![])),
            (PROMPTS[4].to_vec(), GenParams { lookup: LookupGraft { len: 4, skip_drafter: true }, ..params(Method::Sparkling, 4, 0.0, 0, 24, vec![]) }),
            (PROMPTS[1].to_vec(), GenParams { lookup: LookupGraft { len: 3, skip_drafter: false }, ..params(Method::DFlash, 4, 0.8, 5, 20, vec![]) }),
            // `--budget auto` (each sequence's own policy state and cost model), with and
            // without a lookup graft, greedy and sampled.
            (PROMPTS[0].to_vec(), auto(Method::Sparkling, 0.0, 0, 21)),
            (PROMPTS[3].to_vec(), auto(Method::DFlash, 0.0, 0, 19)),
            (PROMPTS[4].to_vec(), auto(Method::DDTree, 0.9, 4, 16)),
            (PROMPTS[1].to_vec(), auto(Method::TreeSpark, 0.0, 0, 15)),
            (PROMPTS[2].to_vec(), GenParams { lookup: LookupGraft { len: 4, skip_drafter: false }, ..auto(Method::DSpark, 0.0, 0, 23) }),
            (PROMPTS[4].to_vec(), auto(Method::Lookup, 1.0, 2, 20)),
        ];
        // `--budget auto` decides from measured times, so its trees may differ between runs;
        // its tokens may not.
        let timed = |i: usize| reqs[i].1.auto_budget.is_some();
        // Alone, with the request's method, and as `ar` with the same sampling.
        let mut alone_rounds: Vec<Vec<Round>> = Vec::new();
        let mut alone_lookup_rounds: Vec<usize> = Vec::new();
        let alone: Vec<(Vec<u32>, bool)> = reqs
            .iter()
            .map(|(p, g)| {
                let e = Engine { backend: &b, target: &t, drafter: drafter_of(g.method) };
                let mut rounds = Vec::new();
                let got = e
                    .generate_observed(p, g, &mut |_| {}, &mut |r| {
                        if r.drafted {
                            rounds.push((r.tree.tokens.clone(), r.tree.parents.clone(), r.accepted.to_vec()));
                        }
                    })
                    .unwrap();
                alone_rounds.push(rounds);
                alone_lookup_rounds.push(got.stats.lookup_rounds);
                let as_ar = ar.generate(p, &GenParams { method: Method::Ar, lookup: LookupGraft::OFF, ..g.clone() }, &mut |_| {}).unwrap();
                assert_eq!((&got.tokens, got.stopped), (&as_ar.tokens, as_ar.stopped), "{arch:?} {:?} alone vs ar", g.method);
                (got.tokens, got.stopped)
            })
            .collect();
        assert!(alone[0].1 && alone[0].0.len() <= 6, "{arch:?}: the stop comes early");
        // The three lookup requests found matches (so the lookup-step count below is tested).
        assert!(alone_lookup_rounds[9..12].iter().all(|&n| n > 0), "{arch:?}: {alone_lookup_rounds:?}");
        let mut multi_token_steps = 0;
        for stagger in [false, true] {
            for max_in_flight in [2usize, reqs.len()] {
                for chunk in [0usize, 3] {
                    let mut batch = Batch::new(&b, &t, BatchOptions { taps: vec![], max_prefill_rows: chunk })
                        .unwrap()
                        .with_drafter(&dspark)
                        .unwrap()
                        .with_drafter(&dflash)
                        .unwrap();
                    let mut owner: HashMap<SeqId, usize> = HashMap::new();
                    let mut got: Vec<Option<(Vec<u32>, bool)>> = vec![None; reqs.len()];
                    let mut rounds: Vec<Vec<Round>> = vec![Vec::new(); reqs.len()];
                    let (mut next, mut step) = (0, 0);
                    while next < reqs.len() || !batch.is_empty() {
                        while next < reqs.len() && batch.len() < max_in_flight && (!stagger || 2 * next <= step) {
                            owner.insert(batch.add(&reqs[next].0, &reqs[next].1).unwrap(), next);
                            next += 1;
                        }
                        let out = batch.step().unwrap();
                        for st in &out.seqs {
                            assert_eq!(st.token, st.tokens.last().copied());
                            if let Some(tree) = st.tree.as_ref().filter(|_| st.drafted) {
                                rounds[owner[&st.id]].push((tree.tokens.clone(), tree.parents.clone(), st.accepted.clone()));
                            }
                            multi_token_steps += usize::from(st.tokens.len() > 1);
                            if let Some(r) = &st.tree_rows {
                                assert_eq!(r.len(), st.input_rows.len(), "a tree block asks for logits of every node");
                            }
                        }
                        for f in out.finished {
                            assert_eq!(f.stats.new_tokens, f.tokens.len());
                            // The same rounds verified a lookup chain as alone.
                            if !timed(owner[&f.id]) {
                                assert_eq!(f.stats.lookup_rounds, alone_lookup_rounds[owner[&f.id]], "{arch:?} request {}: lookup rounds", owner[&f.id]);
                            }
                            got[owner[&f.id]] = Some((f.tokens, f.stopped));
                        }
                        step += 1;
                        assert!(step < 10_000, "batch never drained");
                    }
                    for (i, (g, w)) in got.into_iter().map(|g| g.expect("finished")).zip(&alone).enumerate() {
                        let what = format!("{arch:?} request {i} ({:?}) stagger {stagger} in flight {max_in_flight} chunk {chunk}", reqs[i].1.method);
                        assert_eq!(&g, w, "{what}");
                        if !timed(i) {
                            assert_eq!(rounds[i], alone_rounds[i], "{what}: trees and accepted paths");
                        }
                    }
                }
            }
        }
        assert!(multi_token_steps > 0, "{arch:?}: some tree round accepted a drafted token");
    }
}

#[test]
fn speculative_batch_requests_are_checked() {
    let b = CpuBackend::new();
    let (td, dd) = (tmpdir("target"), tmpdir("dspark"));
    let t = random_target(td.path(), Arch::Llama, 32, 9);
    let d = random_drafter(dd.path(), &t.cfg, DrafterKind::DSpark, 8, 4, 1);
    // A method whose drafter kind the batch lacks is refused up front.
    let mut batch = Batch::new(&b, &t, BatchOptions::default()).unwrap().with_drafter(&d).unwrap();
    let e = batch.add(&[1, 2], &params(Method::DFlash, 4, 0.0, 0, 4, vec![])).unwrap_err().to_string();
    assert!(e.contains("DFlash drafter") && e.contains("with_drafter"), "{e}");
    assert!(batch.is_empty());
    // One drafter per kind; none with gen-data's taps.
    let e = Batch::new(&b, &t, BatchOptions::default()).unwrap().with_drafter(&d).unwrap().with_drafter(&d).err().unwrap().to_string();
    assert!(e.contains("already"), "{e}");
    let taps = BatchOptions { taps: vec![0], max_prefill_rows: 0 };
    assert!(Batch::new(&b, &t, taps).unwrap().with_drafter(&d).is_err());
    // A speculative sequence beside an `ar` one: both finish with their alone tokens.
    let s = batch.add(&[1, 2, 3], &params(Method::Sparkling, 8, 0.0, 0, 10, vec![])).unwrap();
    let a = batch.add(&[4, 5], &params(Method::Ar, 1, 0.0, 0, 10, vec![])).unwrap();
    let done = batch.run_to_end().unwrap();
    assert_eq!(done.len(), 2);
    let want_s =
        Engine { backend: &b, target: &t, drafter: Some(&d) }.generate(&[1, 2, 3], &params(Method::Sparkling, 8, 0.0, 0, 10, vec![]), &mut |_| {}).unwrap();
    let want_a = Engine { backend: &b, target: &t, drafter: None }.generate(&[4, 5], &params(Method::Ar, 1, 0.0, 0, 10, vec![]), &mut |_| {}).unwrap();
    for f in done {
        let want = if f.id == s { &want_s.tokens } else { &want_a.tokens };
        assert!(f.id == s || f.id == a);
        assert_eq!(&f.tokens, want);
    }
    assert!(batch.stats().draft_ms > 0.0);
}

/// SmolLM2-135M-Instruct: chat prompts of mixed lengths, one request that joins mid-flight and
/// one that stops early, batched at once and staggered, against each decoded alone.
#[test]
fn smollm2_batched_equals_alone() {
    let Some(path) = asset("smollm2-135m-instruct-q4_1.gguf") else {
        if std::env::var("SPARKLING_REQUIRE_ASSETS").is_ok_and(|v| v == "1") {
            panic!("asset smollm2-135m-instruct-q4_1.gguf missing under {} (run scripts/fetch-assets)", sparkling::assets::dir().display());
        }
        eprintln!("SKIPPED: asset smollm2-135m-instruct-q4_1.gguf not found under {} (run scripts/fetch-assets)", sparkling::assets::dir().display());
        return;
    };
    for dtype in [WeightDtype::Native, WeightDtype::F16] {
        let src = GgufSource::open(&path).expect("open gguf");
        let cfg = TargetConfig::from_gguf(&src.file).expect("config");
        let b = CpuBackend::with_weight_dtype(dtype);
        let t = Target::load(&b, &src, cfg, &|_, _| {}).expect("load target");
        let tok = sparkling::tokenizer::TextTokenizer::from_gguf(&src.file).expect("tokenizer");
        let stop = sparkling::decode::stop_tokens(&t.cfg.eos, &tok.stop);
        let chats = [
            "What is the capital of France?",
            "Write a Python function that returns the n-th Fibonacci number, with a docstring and a short explanation of its complexity.",
            "Hi",
            "List three colours.",
            "Explain in two sentences why the sky is blue, as you would to a child who has just asked you on a sunny afternoon walk.",
        ];
        let prompts: Vec<Vec<u32>> = chats.iter().map(|c| tok.encode_chat(c, None).unwrap()).collect();
        let e = Engine { backend: &b, target: &t, drafter: None };
        // The early stopper: a stop token its free run emits at step 2.
        let free = e.generate(&prompts[3], &params(Method::Ar, 1, 0.0, 0, 24, stop.clone()), &mut |_| {}).unwrap();
        let mut early = stop.clone();
        early.push(free.tokens[2]);
        let mut reqs = vec![
            Req { prompt: prompts[0].clone(), params: params(Method::Ar, 1, 0.0, 0, 24, stop.clone()), join_at: 0 },
            Req { prompt: prompts[1].clone(), params: params(Method::Ar, 1, 0.8, 5, 24, stop.clone()), join_at: 0 },
            Req { prompt: prompts[2].clone(), params: params(Method::Ar, 1, 0.0, 0, 16, stop.clone()), join_at: 0 },
            Req { prompt: prompts[3].clone(), params: params(Method::Ar, 1, 0.0, 0, 24, early), join_at: 0 },
            // Joins mid-flight.
            Req { prompt: prompts[4].clone(), params: params(Method::Ar, 1, 0.0, 0, 20, stop.clone()), join_at: 6 },
        ];
        let want = run_alone(&b, &t, &reqs);
        assert!(want[3].1 && want[3].0.len() <= 3, "the early stopper stops early: {:?}", want[3]);
        let lens: Vec<usize> = reqs.iter().map(|r| r.prompt.len()).collect();
        for (max_in_flight, chunk) in [(5usize, 0usize), (3, 0), (5, 16)] {
            let (got, widest) = run_batched(&b, &t, &reqs, max_in_flight, BatchOptions { taps: vec![], max_prefill_rows: chunk });
            assert!(widest >= 3.min(max_in_flight));
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g, w, "{dtype:?} request {i} (prompt of {} tokens), batch ≤ {max_in_flight}, chunk {chunk}", lens[i]);
            }
        }
        reqs[4].join_at = 0;
        let (got, _) = run_batched(&b, &t, &reqs, 5, BatchOptions::default());
        assert_eq!(got, want, "{dtype:?} all at once");
        eprintln!("{dtype:?}: {} requests (prompts of {lens:?} tokens) batched == alone", reqs.len());
    }
}

/// `sparkling bench --batch`: the JSON splits off the decode-only steps (no prompt row fed).
/// At batch 1 every token after each sequence's first comes from such a step; at batch 2 a step
/// that prefills one prompt beside another's decode is not one, so they hold at most that many.
#[test]
fn bench_batch_reports_decode_only_steps() {
    let d = tmpdir("bench-batch-decode");
    let mut cfg = tiny_target_config(Arch::Qwen3, 64);
    cfg.layers = 2;
    let t = d.path().join("tiny");
    write_random_target(&t, &cfg, 3, StoreDtype::F32).unwrap();
    let tok = d.path().join("tokenizer.json");
    common::cli::word_tokenizer(&tok, cfg.vocab);
    let prompts = d.path().join("p.txt");
    std::fs::write(&prompts, "w1 w2 w3\nw4 w5\nw6 w7 w8 w9 w10\nw11\n").unwrap();
    let j = d.path().join("b.json");
    let p = |x: &std::path::Path| x.to_str().unwrap().to_string();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_sparkling"))
        .env("SPARKLING_ASSETS", d.path())
        // The same prompt file twice runs its prompts once; method names ignore case.
        .args(["bench", "--target", &p(&t), "--tokenizer", &p(&tok), "--prompts", &p(&prompts), "--prompts", &p(&prompts), "--methods", "AR"])
        .args(["--max-new-tokens", "6", "--batch", "1,2", "--json", &p(&j)])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("is the file"), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&j).unwrap()).unwrap();
    assert_eq!(v["prompts"], 4, "{v}");
    // `plot` reads the one-sequence bench's JSON and says what this file is.
    let o =
        std::process::Command::new(env!("CARGO_BIN_EXE_sparkling")).args(["plot", "--input", &p(&j), "--out", &p(&d.path().join("plots"))]).output().unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.code() == Some(1) && e.contains("a `sparkling bench --batch` file"), "{e}");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        assert_eq!(r["budget"], 0, "ar's budget is the number 0, as in the one-sequence bench: {r}");
        assert_eq!(r["lookup"], "-", "{r}");
        let (n, seqs, new) = (r["batch"].as_u64().unwrap(), r["sequences"].as_u64().unwrap(), r["new_tokens"].as_u64().unwrap());
        let dec = &r["decode_only"];
        let (tokens, steps, occ) = (dec["tokens"].as_u64().unwrap(), dec["steps"].as_u64().unwrap(), dec["mean_sequences_per_step"].as_f64().unwrap());
        assert_eq!(seqs, 4);
        assert!(steps > 0 && dec["tokens_per_s"].as_f64().unwrap() > 0.0 && dec["seconds"].as_f64().unwrap() > 0.0, "{r}");
        assert!((1.0..=n as f64).contains(&occ), "occupancy {occ} at batch {n}");
        if n == 1 {
            // One sequence per step: its first token ends its prefill, every other one decodes.
            assert_eq!(tokens, new - seqs, "{r}");
            assert_eq!(steps, tokens, "ar commits one token per decode step: {r}");
            assert_eq!(dec["speedup_vs_ar_batch_1"].as_f64(), Some(1.0));
            // Each short prompt is one prefill step, which the decode-only steps leave out.
            assert_eq!(steps, r["steps"].as_u64().unwrap() - seqs, "{r}");
        } else {
            // Some steps fed prompt rows (a prompt joins when a slot frees), so not all are counted.
            assert!(steps < r["steps"].as_u64().unwrap(), "{r}");
            assert!(tokens <= new - seqs && tokens as f64 <= occ * steps as f64 + 1e-9, "{r}");
        }
    }
}
