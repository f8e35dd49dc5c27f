//! Fuzz harnesses that run under `cargo test` (issue 15): seeded mutation of valid inputs (a
//! tiny GGUF, a tiny safetensors + config.json checkpoint, a GGUF vocabulary) and arbitrary
//! logits / budgets for the tree builders. Every input must give `Ok` or an `Err` — never a
//! panic — and every tree must satisfy the `DraftTree` invariants.
//!
//! Bounded and deterministic: a fixed seed and a fixed number of executions per target
//! (`SPARKLING_FUZZ_ITERS` scales them for a longer run, `SPARKLING_FUZZ_SEED` changes the
//! seed). No wall-clock limits are asserted.

mod common;

use common::Rng;
use sparkling::cpu::CpuBackend;
use sparkling::decode::{Engine, Method};
use sparkling::loader::gguf::GgufFile;
use sparkling::loader::gguf_source::GgufSource;
use sparkling::loader::safetensors_source::SafetensorsSource;
use sparkling::model::config::{Arch, DrafterConfig, DrafterKind, TargetConfig};
use sparkling::model::drafter::Drafter;
use sparkling::model::synth::{random_drafter_bytes, random_target_bytes, tiny_target_config, DrafterInit, StoreDtype};
use sparkling::model::target::Target;
use sparkling::tokenizer::TextTokenizer;
use sparkling::tree::{self, DraftTree, MarkovHead};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

fn iters(base: usize) -> usize {
    let scale: usize = std::env::var("SPARKLING_FUZZ_ITERS").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    base * scale.max(1)
}

fn seed(target: u64) -> Rng {
    let s: u64 = std::env::var("SPARKLING_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(15);
    Rng(s.wrapping_mul(1_000_003) ^ target)
}

const INTERESTING_U32: [u32; 10] = [0, 1, 2, 3, 7, 0x7f, 0xff, 0x7fff_ffff, 0x8000_0000, 0xffff_ffff];
const INTERESTING_U64: [u64; 8] = [0, 1, 32, 1 << 31, 1 << 32, 1 << 40, i64::MAX as u64, u64::MAX];

/// 1–4 random edits: bit flips, interesting bytes / u32 / u64, truncation, chunk copies.
/// Offsets are drawn from `0..hot` most of the time (the header, where parsing happens).
fn mutate(rng: &mut Rng, data: &mut Vec<u8>, hot: usize) {
    for _ in 0..1 + rng.below(4) {
        if data.is_empty() {
            return;
        }
        let span = if rng.below(4) == 0 { data.len() } else { hot.clamp(1, data.len()) };
        let at = rng.below(span);
        match rng.below(7) {
            0 => data[at] ^= 1 << rng.below(8),
            1 => data[at] = rng.pick(&[0u8, 1, 0x7f, 0x80, 0xff, b'"', b'{', b'[', b'0', b'-']),
            2 => {
                let v = rng.pick(&INTERESTING_U32).to_le_bytes();
                let end = (at + 4).min(data.len());
                data[at..end].copy_from_slice(&v[..end - at]);
            }
            3 => {
                let v = rng.pick(&INTERESTING_U64).to_le_bytes();
                let end = (at + 8).min(data.len());
                data[at..end].copy_from_slice(&v[..end - at]);
            }
            4 => data.truncate(at),
            5 => {
                let len = rng.below(16).min(data.len() - at);
                let to = rng.below(data.len() - len + 1);
                let chunk = data[at..at + len].to_vec();
                data[to..to + len].copy_from_slice(&chunk);
            }
            _ => {
                let len = rng.below(8).min(data.len() - at);
                data.drain(at..at + len);
            }
        }
    }
}

/// Run `f`; a panic fails the test with the target name, the case number and the input size.
fn no_panic(target: &str, case: usize, input: &[u8], f: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        let p = std::env::temp_dir().join(format!("sparkling-fuzz-{target}-{case}.bin"));
        let _ = std::fs::write(&p, input);
        panic!("fuzz target {target}: case {case} panicked (input saved to {})", p.display());
    }
}

/// Greedy AR generation of two tokens: exercises the forward pass of a model that loaded.
fn smoke<B: sparkling::core::Backend>(b: &B, t: &Target<B>, d: Option<&Drafter<B>>) {
    let e = Engine { backend: b, target: t, drafter: None };
    let _ = e.generate(&[1, 2], &common::params(Method::Ar, 1, 0.0, 0, 2, vec![]), &mut |_| {});
    if let Some(d) = d {
        let e = Engine { backend: b, target: t, drafter: Some(d) };
        let _ = e.generate(&[1, 2], &common::params(Method::Sparkling, 8, 0.0, 0, 4, vec![]), &mut |_| {});
    }
}

// ---- GGUF ------------------------------------------------------------------------------------

enum Meta {
    U32(u32),
    F32(f32),
    Str(&'static str),
}

/// A GGUF v3 file: metadata and F32 tensors (dims fastest first), alignment 32; and the length
/// of its header (metadata and tensor infos).
fn gguf(kvs: &[(&str, Meta)], tensors: &[(String, Vec<u64>)], rng: &mut Rng) -> (Vec<u8>, usize) {
    let put_str = |o: &mut Vec<u8>, s: &str| {
        o.extend_from_slice(&(s.len() as u64).to_le_bytes());
        o.extend_from_slice(s.as_bytes());
    };
    let mut o = b"GGUF".to_vec();
    o.extend_from_slice(&3u32.to_le_bytes());
    o.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    o.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    for (k, v) in kvs {
        put_str(&mut o, k);
        match v {
            Meta::U32(x) => {
                o.extend_from_slice(&4u32.to_le_bytes());
                o.extend_from_slice(&x.to_le_bytes());
            }
            Meta::F32(x) => {
                o.extend_from_slice(&6u32.to_le_bytes());
                o.extend_from_slice(&x.to_le_bytes());
            }
            Meta::Str(s) => {
                o.extend_from_slice(&8u32.to_le_bytes());
                put_str(&mut o, s);
            }
        }
    }
    let mut rel = 0u64;
    for (name, dims) in tensors {
        put_str(&mut o, name);
        o.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| o.extend_from_slice(&d.to_le_bytes()));
        o.extend_from_slice(&0u32.to_le_bytes()); // F32
        o.extend_from_slice(&rel.to_le_bytes());
        rel += (dims.iter().product::<u64>() * 4).div_ceil(32) * 32;
    }
    o.resize(o.len().div_ceil(32) * 32, 0);
    let header = o.len();
    for (_, dims) in tensors {
        for _ in 0..dims.iter().product::<u64>() {
            o.extend_from_slice(&((rng.unit() - 0.5) * 0.2).to_le_bytes());
        }
        o.resize(o.len().div_ceil(32) * 32, 0);
    }
    (o, header)
}

/// A tiny one-layer llama GGUF (hidden 16, 2 heads of 8, 1 KV head, vocab 32).
fn tiny_gguf(rng: &mut Rng) -> (Vec<u8>, usize) {
    let (h, v, f, kv) = (16u64, 32u64, 32u64, 8u64);
    let kvs = [
        ("general.architecture", Meta::Str("llama")),
        ("llama.embedding_length", Meta::U32(h as u32)),
        ("llama.block_count", Meta::U32(1)),
        ("llama.attention.head_count", Meta::U32(2)),
        ("llama.attention.head_count_kv", Meta::U32(1)),
        ("llama.feed_forward_length", Meta::U32(f as u32)),
        ("llama.attention.layer_norm_rms_epsilon", Meta::F32(1e-5)),
        ("llama.rope.freq_base", Meta::F32(10000.0)),
        ("llama.context_length", Meta::U32(64)),
        ("tokenizer.ggml.eos_token_id", Meta::U32(2)),
    ];
    let t = |n: &str, d: &[u64]| (n.to_string(), d.to_vec());
    let tensors = [
        t("token_embd.weight", &[h, v]),
        t("blk.0.attn_norm.weight", &[h]),
        t("blk.0.attn_q.weight", &[h, h]),
        t("blk.0.attn_k.weight", &[h, kv]),
        t("blk.0.attn_v.weight", &[h, kv]),
        t("blk.0.attn_output.weight", &[h, h]),
        t("blk.0.ffn_norm.weight", &[h]),
        t("blk.0.ffn_gate.weight", &[h, f]),
        t("blk.0.ffn_up.weight", &[h, f]),
        t("blk.0.ffn_down.weight", &[f, h]),
        t("output_norm.weight", &[h]),
    ];
    gguf(&kvs, &tensors, rng)
}

fn load_gguf(bytes: Vec<u8>) {
    let Ok(g) = GgufFile::from_bytes("fuzz.gguf", bytes) else { return };
    let cfg = TargetConfig::from_gguf(&g);
    let _ = TextTokenizer::from_gguf(&g);
    let Ok(src) = GgufSource::from_file(g) else { return };
    let Ok(cfg) = cfg else { return };
    let b = CpuBackend::new();
    if let Ok(t) = Target::load(&b, &src, cfg, &|_, _| {}) {
        smoke(&b, &t, None);
    }
}

#[test]
fn fuzz_gguf_reader_and_target_loader() {
    let mut rng = seed(1);
    let (valid, header) = tiny_gguf(&mut rng);
    // The unmutated file loads and runs.
    {
        let g = GgufFile::from_bytes("tiny.gguf", valid.clone()).expect("valid tiny GGUF");
        let cfg = TargetConfig::from_gguf(&g).expect("tiny config");
        let src = GgufSource::from_file(g).unwrap();
        Target::load(&CpuBackend::new(), &src, cfg, &|_, _| {}).expect("tiny target loads");
    }
    let n = iters(1500);
    for case in 0..n {
        let mut b = valid.clone();
        mutate(&mut rng, &mut b, header);
        no_panic("gguf", case, &b.clone(), || load_gguf(b));
    }
    eprintln!("fuzz gguf: {n} executions, no panic");
}

/// Inputs that once panicked (committed under `tests/data/fuzz/`): each must now load or fail
/// with an error.
#[test]
fn fuzz_regression_corpus() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("tests/data/fuzz") {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "gguf") {
            let b = std::fs::read(&p).unwrap();
            no_panic(&p.display().to_string().replace('/', "_"), n, &b.clone(), || load_gguf(b));
            n += 1;
        }
    }
    assert!(n > 0, "no corpus in {}", dir.display());
}

#[test]
fn fuzz_gguf_vocabulary_tokenizer() {
    let p = sparkling::assets::path("ggml-vocab-gpt-2.gguf");
    let Ok(valid) = std::fs::read(&p) else {
        assert!(!std::env::var("SPARKLING_REQUIRE_ASSETS").is_ok_and(|v| v == "1"), "{} not found and SPARKLING_REQUIRE_ASSETS is set", p.display());
        eprintln!("skipping: {} not found (scripts/fetch-assets llama-vocab)", p.display());
        return;
    };
    let mut rng = seed(2);
    let n = iters(40);
    for case in 0..n {
        let mut b = valid.clone();
        mutate(&mut rng, &mut b, valid.len());
        no_panic("gguf-vocab", case, &b.clone(), || {
            let Ok(g) = GgufFile::from_bytes("vocab.gguf", b) else { return };
            if let Ok(t) = TextTokenizer::from_gguf(&g) {
                if let Ok(ids) = t.encode_raw("Hello, wörld! 123") {
                    let _ = t.decode(&ids, false);
                }
            }
        });
    }
    eprintln!("fuzz gguf-vocab: {n} executions, no panic");
}

// ---- safetensors + config.json ----------------------------------------------------------------

/// Replace the value of a random key of `v` (nested objects included) by an interesting one.
fn mutate_json(rng: &mut Rng, v: &mut serde_json::Value) {
    let vals = [
        serde_json::json!(0),
        serde_json::json!(1),
        serde_json::json!(-1),
        serde_json::json!(3),
        serde_json::json!(1_000_000_000u64),
        serde_json::json!(4_294_967_295u64),
        serde_json::json!(u64::MAX),
        serde_json::json!(1e300),
        serde_json::json!(-0.0),
        serde_json::json!(1e-45),
        serde_json::json!(null),
        serde_json::json!("x"),
        serde_json::json!([]),
        serde_json::json!([0, 99, 1_000_000]),
        serde_json::json!({}),
        serde_json::json!(true),
    ];
    let mut cur = v;
    loop {
        let Some(o) = cur.as_object_mut() else { return };
        if o.is_empty() {
            return;
        }
        let keys: Vec<String> = o.keys().cloned().collect();
        let k = keys[rng.below(keys.len())].clone();
        if o[&k].is_object() && rng.below(2) == 0 {
            cur = o.get_mut(&k).unwrap();
            continue;
        }
        match rng.below(6) {
            0 => {
                o.remove(&k);
            }
            _ => {
                o.insert(k, vals[rng.below(vals.len())].clone());
            }
        }
        return;
    }
}

#[test]
fn fuzz_safetensors_and_config_loader() {
    let mut rng = seed(3);
    let mut cfg = tiny_target_config(Arch::Qwen3, 32);
    cfg.layers = 2;
    cfg.hidden = 32;
    cfg.intermediate = 32;
    cfg.n_heads = 2;
    cfg.n_kv_heads = 1;
    let weights = random_target_bytes(&cfg, 5, StoreDtype::Bf16).unwrap();
    let config = cfg.to_hf_json();
    let init = DrafterInit { kind: DrafterKind::DSpark, layers: 1, block_size: 4, markov_rank: 4, taps: 1, mask_token_id: None, confidence_head: true };
    let (dcfg, dweights) = random_drafter_bytes(&cfg, &init, 6, StoreDtype::Bf16).unwrap();
    let dconfig = dcfg.to_hf_json(cfg.layers);
    let header = 8 + u64::from_le_bytes(weights[..8].try_into().unwrap()) as usize;
    let n = iters(1500);
    for case in 0..n {
        let (mut c, mut w, mut dc, mut dw) = (config.clone(), weights.clone(), dconfig.clone(), dweights.clone());
        match rng.below(4) {
            0 => mutate_json(&mut rng, &mut c),
            1 => mutate(&mut rng, &mut w, header),
            2 => mutate_json(&mut rng, &mut dc),
            _ => {
                let dh = 8 + u64::from_le_bytes(dw[..8].try_into().unwrap()) as usize;
                mutate(&mut rng, &mut dw, dh)
            }
        }
        let input = format!("{c}\n{dc}").into_bytes();
        no_panic("safetensors", case, &input, || {
            let p = Path::new("fuzz/config.json");
            let Ok(tcfg) = TargetConfig::from_hf_json(p, &c) else { return };
            let Ok(src) = SafetensorsSource::from_bytes("fuzz/model.safetensors", w) else { return };
            let b = CpuBackend::new();
            let Ok(t) = Target::load(&b, &src, tcfg, &|_, _| {}) else { return };
            let d = DrafterConfig::from_hf_json(Path::new("fuzz-d/config.json"), &dc).ok().and_then(|dcfg| {
                let dsrc = SafetensorsSource::from_bytes("fuzz-d/model.safetensors", dw).ok()?;
                Drafter::load(&b, &dsrc, dcfg, &t.cfg).ok()
            });
            smoke(&b, &t, d.as_ref());
        });
    }
    eprintln!("fuzz safetensors+config: {n} executions, no panic");
}

// ---- tree builders ---------------------------------------------------------------------------

/// The `DraftTree` invariants: parents before children, depths = parent + 1 (≤ `ld`), siblings
/// with distinct tokens, tokens in the vocabulary, at most `budget` nodes beyond the root.
fn check_tree(what: &str, t: &DraftTree, anchor: u32, vocab: usize, ld: usize, budget: usize) {
    let n = t.tokens.len();
    assert!(n >= 1 && t.parents.len() == n && t.depths.len() == n && t.scores.len() == n, "{what}: ragged tree");
    assert!(t.tokens[0] == anchor && t.depths[0] == 0, "{what}: bad root");
    assert!(n - 1 <= budget, "{what}: {} nodes for budget {budget}", n - 1);
    let mut seen = std::collections::HashSet::new();
    for i in 1..n {
        let p = t.parents[i] as usize;
        assert!(p < i, "{what}: node {i} has parent {p}");
        assert_eq!(t.depths[i], t.depths[p] + 1, "{what}: depth of node {i}");
        assert!(t.depths[i] as usize <= ld, "{what}: depth {} > {ld}", t.depths[i]);
        assert!((t.tokens[i] as usize) < vocab, "{what}: token {} ≥ vocab {vocab}", t.tokens[i]);
        assert!(seen.insert((p, t.tokens[i])), "{what}: duplicate sibling token {} under {p}", t.tokens[i]);
    }
}

#[test]
fn fuzz_tree_builders() {
    let mut rng = seed(4);
    let n = iters(600);
    for case in 0..n {
        let big = rng.below(8) == 0;
        let vocab = 1 + rng.below(if big { 2000 } else { 64 });
        let ld = 1 + rng.below(20);
        let anchor = rng.below(vocab) as u32;
        let scale = rng.pick(&[0.0f32, 1e-3, 1.0, 10.0, 1e4, 1e30]);
        let quant = rng.below(3) == 0; // ties
        let logits: Vec<f32> = (0..ld * vocab)
            .map(|_| {
                let x = (rng.unit() - 0.5) * scale;
                if quant {
                    x.round()
                } else {
                    x
                }
            })
            .collect();
        let markov = if rng.below(2) == 0 {
            let rank = 1 + rng.below(8);
            let mut w = || (0..vocab * rank).map(|_| (rng.unit() - 0.5) * 2.0).collect::<Vec<f32>>();
            Some(MarkovHead { vocab, rank, w1: w(), w2: w() })
        } else {
            None
        };
        let m = markov.as_ref();
        let budget = rng.pick(&[0usize, 1, 2, 7, 64, 300, 2048]);
        let c = rng.pick(&[0usize, 1, 3, 16, 128, 5000]);
        let fanout = rng.pick(&[0usize, 1, 2, 8, 64, 10_000]);
        let k = rng.pick(&[0usize, 1, 2, 4, 8]);
        let input = format!(
            "vocab {vocab} ld {ld} anchor {anchor} scale {scale} quant {quant} markov {} budget {budget} c {c} fanout {fanout} k {k}",
            m.map_or(0, |m| m.rank)
        );
        no_panic("trees", case, input.as_bytes(), || {
            let top = tree::depth_topk(&logits, ld, vocab, budget.min(vocab).max(1));
            check_tree("ddtree", &tree::build_ddtree(&top, anchor, budget), anchor, vocab, ld, budget);
            let lc = tree::LazyCandidates::new(&logits, ld, vocab, m, anchor, c);
            check_tree("sparkling_lazy", &tree::build_sparkling_lazy(&lc, m, anchor, fanout, budget), anchor, vocab, ld, budget);
            let table = tree::candidate_table(&logits, ld, vocab, m, anchor, c, fanout.min(budget));
            check_tree("sparkling_precompute", &tree::build_sparkling_precompute(&table, anchor, budget), anchor, vocab, ld, budget);
            check_tree("treespark", &tree::build_treespark(&logits, ld, vocab, m, anchor, k, budget), anchor, vocab, ld, budget);
            let chain = tree::markov_greedy_chain(&logits, ld, vocab, m, anchor, budget);
            check_tree("chain", &DraftTree::chain(anchor, &chain), anchor, vocab, ld, budget);
            if vocab * budget.min(64) <= 20_000 {
                let b = budget.min(64);
                check_tree("sparkling_reference", &tree::build_sparkling_reference(&logits, ld, vocab, m, anchor, b), anchor, vocab, ld, b);
            }
        });
    }
    eprintln!("fuzz trees: {n} executions, no panic");
}
