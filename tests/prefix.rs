//! Prompt-prefix reuse in a batch (`Batch::with_prefix_cache`, `decode::prefix`): a sequence
//! whose prompt starts with rows an earlier sequence fed takes them from the cache, and its
//! first token's logits (bit for bit) and all its tokens equal a cold prefill's — for every CPU
//! KV cache kind (f32, f16, q8_0), whole and chunked prefill, reuse lengths that match no chunk
//! or attention-block boundary, `ar` and `sparkling` (fixed budget and `--budget auto`), at
//! T = 0 and at T > 0 with a seed; a conversation's next turn reuses the previous prompt and
//! answer; a budget of 0 reuses nothing.

mod common;

use common::*;
use sparkling::core::{Backend, ReadBack};
use sparkling::cpu::{CpuBackend, KvDtype};
use sparkling::decode::batch::{Batch, BatchOptions};
use sparkling::decode::prefix::PrefixCache;
use sparkling::decode::{GenParams, Method, Platform};
use sparkling::model::config::{Arch, DrafterKind};
use sparkling::model::drafter::Drafter;
use sparkling::model::target::Target;

/// What one sequence gave: its tokens, the bits of its first token's logits row, and the
/// prompt tokens it reused.
#[derive(Debug, PartialEq)]
struct Run {
    tokens: Vec<u32>,
    first_logits: Vec<u32>,
    cached: usize,
}

/// Decode `prompt` alone through `batch` (which may hold a prefix cache from earlier calls).
fn run<B: Backend>(b: &B, batch: &mut Batch<'_, B>, prompt: &[u32], p: &GenParams) -> Run {
    let id = batch.add(prompt, p).unwrap();
    let cached = batch.cached_tokens(id).unwrap();
    let mut first_logits = None;
    loop {
        let out = batch.step().unwrap();
        for s in &out.seqs {
            if let (true, Some(row), None) = (s.id == id, s.logit_row, &first_logits) {
                assert!(s.tree.is_none(), "the first logits row is the prefill's");
                let l = b.download_rows(out.logits.as_ref().unwrap(), row, 1).unwrap();
                first_logits = Some(l.iter().map(|x| x.to_bits()).collect());
            }
        }
        if let Some(f) = out.finished.into_iter().find(|f| f.id == id) {
            assert_eq!(f.cached_tokens, cached);
            return Run { tokens: f.tokens, first_logits: first_logits.expect("a prefill row"), cached };
        }
    }
}

fn batch<'a>(b: &'a CpuBackend, t: &'a Target<CpuBackend>, d: &'a Drafter<CpuBackend>, chunk: usize, prefix: Option<usize>) -> Batch<'a, CpuBackend> {
    let batch = Batch::new(b, t, BatchOptions { taps: Vec::new(), max_prefill_rows: chunk }).unwrap().with_drafter(d).unwrap();
    match prefix {
        Some(bytes) => batch.with_prefix_cache(PrefixCache::new(bytes)).unwrap(),
        None => batch,
    }
}

fn common(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn pseudo_prompt(n: usize, seed: u64, vocab: u32) -> Vec<u32> {
    let mut s = seed;
    (0..n).map(|_| (sparkling::decode::rng::splitmix64_next(&mut s) % (vocab as u64 - 1)) as u32).collect()
}

#[test]
fn a_reused_prefix_gives_the_cold_logits_and_tokens() {
    const VOCAB: usize = 64;
    let (td, dd) = (tmpdir("prefix-target"), tmpdir("prefix-dspark"));
    let cfg = random_target(td.path(), Arch::Llama, VOCAB, 23).cfg;
    write_drafter(dd.path(), &cfg, DrafterKind::DSpark, 8, 29);
    // A 71-token first prompt; the second shares its first 67 tokens (no multiple of the chunk
    // of 5 or of the attention's 64-key blocks), the third is the first conversation turn
    // (prompt + answer) and more.
    let first = pseudo_prompt(71, 1, VOCAB as u32);
    let second: Vec<u32> = first[..67].iter().copied().chain(pseudo_prompt(9, 2, VOCAB as u32)).collect();
    assert!(common(&first, &second) >= 67);
    let mut checked = 0;
    for kv in [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0] {
        let b = CpuBackend::new().with_kv_dtype(kv);
        let t = load_target(&b, td.path());
        let d = load_drafter(&b, dd.path(), &t.cfg);
        let cases: Vec<(&str, GenParams)> = vec![
            ("ar T=0", params(Method::Ar, 1, 0.0, 0, 12, vec![])),
            ("sparkling budget 6, T=0.8 seed 5", params(Method::Sparkling, 6, 0.8, 5, 14, vec![])),
            ("sparkling auto T=0", {
                let mut p = GenParams::new(Method::Sparkling, &Platform::HOST);
                p.max_new_tokens = 13;
                p
            }),
            ("sparkling auto T=1 seed 3", {
                let mut p = GenParams::new(Method::Sparkling, &Platform::HOST);
                (p.max_new_tokens, p.sampling.temperature, p.seed) = (11, 1.0, 3);
                p
            }),
        ];
        for chunk in [0, 5] {
            for (what, p) in &cases {
                let what = format!("{what}, {} cache, chunk {chunk}", kv.name());
                let mut warm = batch(&b, &t, &d, chunk, Some(64 << 20));
                let a = run(&b, &mut warm, &first, p);
                assert_eq!(a.cached, 0, "{what}: nothing cached yet");
                let got = run(&b, &mut warm, &second, p);
                let cold = run(&b, &mut batch(&b, &t, &d, chunk, None), &second, p);
                assert_eq!(got.cached, common(&first, &second), "{what}: the shared prefix");
                assert_eq!((&got.tokens, &got.first_logits), (&cold.tokens, &cold.first_logits), "{what}: second prompt");
                // The next turn: the first prompt, its answer, and a new message. Its rows up to
                // the answer's last fed token (all but its last token) are reused.
                let third: Vec<u32> = first.iter().chain(&a.tokens).copied().chain(pseudo_prompt(6, 3, VOCAB as u32)).collect();
                let got = run(&b, &mut warm, &third, p);
                let cold = run(&b, &mut batch(&b, &t, &d, chunk, None), &third, p);
                assert_eq!(got.cached, first.len() + a.tokens.len() - 1, "{what}: the earlier turn");
                assert_eq!((&got.tokens, &got.first_logits), (&cold.tokens, &cold.first_logits), "{what}: next turn");
                // The same prompt again: everything but its last token.
                let again = run(&b, &mut warm, &second, p);
                assert_eq!((again.cached, &again.tokens), (second.len() - 1, &cold_tokens(&b, &t, &d, chunk, &second, p)), "{what}: repeat");
                let stats = warm.prefix_cache().unwrap().stats();
                assert_eq!((stats.lookups, stats.hits), (4, 3), "{what}: {stats:?}");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 24);
}

fn cold_tokens(b: &CpuBackend, t: &Target<CpuBackend>, d: &Drafter<CpuBackend>, chunk: usize, prompt: &[u32], p: &GenParams) -> Vec<u32> {
    run(b, &mut batch(b, t, d, chunk, None), prompt, p).tokens
}

/// Sequences in flight together: one that joins while another with the same prefix is still
/// prefilling reuses nothing; one that joins after that prefill reuses it, and both decode their
/// cold tokens. A zero budget reuses nothing; a batch with taps refuses a prefix cache.
#[test]
fn reuse_follows_prefills_in_flight_and_a_zero_budget_disables_it() {
    const VOCAB: usize = 48;
    let (td, dd) = (tmpdir("prefix-target"), tmpdir("prefix-dspark"));
    let t = random_target(td.path(), Arch::Qwen3, VOCAB, 31);
    let b = CpuBackend::new();
    write_drafter(dd.path(), &t.cfg, DrafterKind::DSpark, 8, 37);
    let d = load_drafter(&b, dd.path(), &t.cfg);
    let sys = pseudo_prompt(30, 4, VOCAB as u32);
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| sys.iter().copied().chain(pseudo_prompt(5 + i, 10 + i as u64, VOCAB as u32)).collect()).collect();
    let p = params(Method::Sparkling, 4, 0.0, 0, 10, vec![]);
    let cold: Vec<Vec<u32>> = prompts.iter().map(|x| cold_tokens(&b, &t, &d, 8, x, &p)).collect();
    let mut warm = batch(&b, &t, &d, 8, Some(16 << 20));
    let a = warm.add(&prompts[0], &p).unwrap();
    let bb = warm.add(&prompts[1], &p).unwrap();
    assert_eq!((warm.cached_tokens(a), warm.cached_tokens(bb)), (Some(0), Some(0)));
    // Four steps prefill 32 of 35 and 36 rows; the fifth ends both prefills.
    let mut done = Vec::new();
    for _ in 0..5 {
        done.extend(warm.step().unwrap().finished);
    }
    let c = warm.add(&prompts[2], &p).unwrap();
    let shared = common(&prompts[0], &prompts[2]).max(common(&prompts[1], &prompts[2]));
    assert!(shared >= 30);
    assert_eq!(warm.cached_tokens(c), Some(shared), "the shared system prompt");
    done.extend(warm.run_to_end().unwrap());
    for (id, want) in [(a, &cold[0]), (bb, &cold[1]), (c, &cold[2])] {
        assert_eq!(&done.iter().find(|f| f.id == id).unwrap().tokens, want);
    }
    let mut off = batch(&b, &t, &d, 8, Some(0));
    for x in [&prompts[0], &prompts[0]] {
        let r = run(&b, &mut off, x, &p);
        assert_eq!((r.cached, &r.tokens), (0, &cold[0]));
    }
    assert_eq!(off.prefix_cache().unwrap().stats().bytes, 0);
    let taps = Batch::new(&b, &t, BatchOptions { taps: vec![1], max_prefill_rows: 0 }).unwrap();
    assert!(taps.with_prefix_cache(PrefixCache::new(1 << 20)).is_err());
}
