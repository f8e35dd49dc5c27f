//! Real weights (issue 2): greedy tokens of SmolLM2-135M-Instruct (and Qwen2.5-Coder-0.5B-Instruct
//! when cached) equal llama.cpp's greedy tokens on an F16 copy of the same GGUF
//! (`tests/data/llamacpp_greedy_*.json`, provenance inside), and every speculative method emits
//! the `ar` tokens on real prompts. Assets come from `scripts/fetch-assets`; without them the
//! tests skip with a message, or fail when `SPARKLING_REQUIRE_ASSETS=1` (CI).
//!
//! Near-ties (design §5): our f16 weights equal llama.cpp's F16 copy, but the two engines reduce
//! in different orders, so where llama.cpp's own top-2 logit gap at a step is below
//! `NEAR_TIE` logits a different argmax is reported as a near-tie, not a failure, and the
//! comparison of that case stops there.

mod common;

use sparkling::cpu::{CpuBackend, WeightDtype};
use sparkling::decode::{Engine, Method};
use sparkling::loader::gguf_source::GgufSource;
use sparkling::model::config::{DrafterKind, TargetConfig};
use sparkling::model::target::Target;
use sparkling::tokenizer::TextTokenizer;
use std::path::PathBuf;

/// Logit gap below which two candidates count as tied.
const NEAR_TIE: f64 = 0.05;

fn asset_or_skip(name: &str, required_in_ci: bool) -> Option<PathBuf> {
    match common::asset(name) {
        Some(p) => Some(p),
        None => {
            if required_in_ci && std::env::var("SPARKLING_REQUIRE_ASSETS").is_ok_and(|v| v == "1") {
                panic!("asset {name} missing under {} (run scripts/fetch-assets)", sparkling::assets::dir().display());
            }
            eprintln!("SKIPPED: asset {name} not found under {} (run scripts/fetch-assets)", sparkling::assets::dir().display());
            None
        }
    }
}

struct Loaded {
    b: CpuBackend,
    target: Target<CpuBackend>,
    tok: TextTokenizer,
}

fn load(path: &std::path::Path) -> Loaded {
    let src = GgufSource::open(path).expect("open gguf");
    let cfg = TargetConfig::from_gguf(&src.file).expect("config");
    let b = CpuBackend::with_weight_dtype(WeightDtype::F16);
    let target = Target::load(&b, &src, cfg, &|_, _| {}).expect("load target");
    let tok = TextTokenizer::from_gguf(&src.file).expect("tokenizer");
    Loaded { b, target, tok }
}

fn check_against_llamacpp(model_file: &str, data: &str, required: bool) {
    let Some(path) = asset_or_skip(model_file, required) else { return };
    let m = load(&path);
    let v: serde_json::Value = serde_json::from_str(data).unwrap();
    let cases = v["cases"].as_array().unwrap();
    assert!(cases.len() >= 5);
    let mut exact = 0;
    for case in cases {
        let prompt = case["prompt"].as_str().unwrap();
        let want_prompt: Vec<u32> = case["prompt_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let want: Vec<u32> = case["generated_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let gaps: Vec<f64> = case["top2_gap"].as_array().map(|a| a.iter().map(|x| x.as_f64().unwrap_or(f64::INFINITY)).collect()).unwrap_or_default();
        let ids = m.tok.encode_raw(prompt).unwrap();
        assert_eq!(ids, want_prompt, "tokenization of {prompt:?}");
        let e = Engine { backend: &m.b, target: &m.target, drafter: None };
        let stop = if case["stopped_at_eog"].as_bool() == Some(true) { m.tok.stop.clone() } else { vec![] };
        let g = e.generate(&ids, &common::params(Method::Ar, 1, 0.0, 0, want.len(), stop), &mut |_| {}).unwrap();
        match g.tokens.iter().zip(&want).position(|(a, b)| a != b) {
            None => {
                assert_eq!(g.tokens.len(), want.len(), "{prompt:?}: length");
                exact += 1;
            }
            Some(i) => {
                let gap = gaps.get(i).copied().unwrap_or(f64::INFINITY);
                assert!(
                    gap < NEAR_TIE,
                    "{prompt:?}: token {i} is {} but llama.cpp chose {} with a top-2 gap of {gap} (not a near-tie)\nours {:?}\nllama.cpp {:?}",
                    g.tokens[i],
                    want[i],
                    g.tokens,
                    want
                );
                eprintln!("NEAR-TIE: {prompt:?} diverges from llama.cpp at token {i} where llama.cpp's top-2 gap is {gap:.4} < {NEAR_TIE}");
            }
        }
    }
    eprintln!("{model_file}: {exact}/{} cases token-identical to llama.cpp", cases.len());
    assert!(exact * 2 > cases.len(), "most cases must match exactly");
}

#[test]
fn smollm2_greedy_tokens_equal_llamacpp() {
    check_against_llamacpp("smollm2-135m-instruct-q4_1.gguf", include_str!("data/llamacpp_greedy_smollm2.json"), true);
}

#[test]
fn qwen25_coder_greedy_tokens_equal_llamacpp_when_cached() {
    check_against_llamacpp("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", include_str!("data/llamacpp_greedy_qwen2.5-coder-0.5b.json"), false);
}

#[test]
fn smollm2_every_method_emits_ar_tokens_on_real_prompts() {
    let Some(path) = asset_or_skip("smollm2-135m-instruct-q4_1.gguf", true) else { return };
    let m = load(&path);
    // Untrained drafters sized for SmolLM2 (as `init-drafter` writes them) and the trained ones
    // committed under models/ (issue 3).
    let d1 = common::tmpdir("dflash");
    let d2 = common::tmpdir("dspark");
    let random = (
        common::random_drafter(d1.path(), &m.target.cfg, DrafterKind::DFlash, 16, 0, 1),
        common::random_drafter(d2.path(), &m.target.cfg, DrafterKind::DSpark, 16, 32, 2),
    );
    let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    let trained = (
        common::load_drafter(&m.b, &models.join("smollm2-135m-dflash-b16"), &m.target.cfg),
        common::load_drafter(&m.b, &models.join("smollm2-135m-dspark-b16"), &m.target.cfg),
    );
    let mut tau_trained = 0.0;
    for (label, (dflash, dspark), text) in [
        ("random", &random, "What is the capital of France?"),
        ("random", &random, "Write a Python function that reverses a string."),
        ("trained", &trained, "What is the capital of France?"),
        ("trained", &trained, "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether?"),
    ] {
        let prompt = m.tok.encode_chat(text, None).unwrap();
        let ar = Engine { backend: &m.b, target: &m.target, drafter: None };
        let want = ar.generate(&prompt, &common::params(Method::Ar, 1, 0.0, 0, 20, m.tok.stop.clone()), &mut |_| {}).unwrap();
        let text_out = m.tok.decode(&want.tokens, false).unwrap();
        assert!(!text_out.trim().is_empty());
        for method in Method::ALL.into_iter().skip(1) {
            let d = if method.drafter_kind() == Some(DrafterKind::DFlash) { &dflash } else { &dspark };
            let e = Engine { backend: &m.b, target: &m.target, drafter: Some(d) };
            let budget = if label == "trained" { 16 } else { 6 };
            let g = e.generate(&prompt, &common::params(method, budget, 0.0, 0, 20, m.tok.stop.clone()), &mut |_| {}).unwrap();
            assert_eq!(g.tokens, want.tokens, "{} with {label} drafters on {text:?}", method.name());
            if label == "trained" && method == Method::Sparkling {
                tau_trained += g.stats.tau();
            }
        }
    }
    eprintln!("sparkling τ with the trained DSpark drafter (budget 16, 2 prompts): mean {:.2}", tau_trained / 2.0);
}
