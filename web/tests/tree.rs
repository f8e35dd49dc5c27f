//! The data of the demo page's live tree view: `generate(…, on_round)` hands JavaScript one
//! plain object per verified round — the draft tree, the accepted path and the bonus token.
//! Checked here through the JavaScript API as a page uses it: the objects are the engine's own
//! rounds (the same generation run directly on the CPU backend through
//! `Engine::generate_observed_async`), they rebuild the committed tokens round after round
//! (accepted nodes' tokens + bonus), WebGPU gives the CPU backend's rounds in the same page,
//! and a callback that throws or returns `false` behaves as `on_tokens` does.
#![cfg(target_arch = "wasm32")]

use js_sys::{Array, Function, Object, Reflect};
use sparkling::core::NO_PARENT;
use sparkling::cpu::CpuBackend;
use sparkling::decode::budget::BudgetChoice;
use sparkling::decode::{Engine, GenParams, LookupGraft, Method};
use sparkling::loader::safetensors_source::SafetensorsSource;
use sparkling::model::config::{Arch, DrafterConfig, DrafterKind, TargetConfig};
use sparkling::model::drafter::Drafter;
use sparkling::model::synth::{random_drafter_bytes, random_target_bytes, tiny_target_config, DrafterInit, StoreDtype};
use sparkling::model::target::Target;
use sparkling_web::Session;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

const VOCAB: usize = 48;
const PROMPT: [u32; 6] = [3, 17, 5, 9, 22, 1];
const MAX_NEW: usize = 24;
const BUDGET: usize = 16;

/// A tiny Qwen3-shaped target and its DSpark drafter (block 7), as files.
fn files() -> (TargetConfig, Vec<u8>, DrafterConfig, Vec<u8>) {
    let cfg = tiny_target_config(Arch::Qwen3, VOCAB);
    let t = random_target_bytes(&cfg, 21, StoreDtype::F32).unwrap();
    let init = DrafterInit { kind: DrafterKind::DSpark, layers: 1, block_size: 7, markov_rank: 8, taps: 2, mask_token_id: None, confidence_head: true };
    let (dcfg, dbytes) = random_drafter_bytes(&cfg, &init, 6, StoreDtype::Bf16).unwrap();
    (cfg, t, dcfg, dbytes)
}

/// A word-level tokenizer whose token `i` is the word `w{i}`.
fn tokenizer_json() -> String {
    let vocab: serde_json::Map<String, serde_json::Value> = (0..VOCAB).map(|i| (format!("w{i}"), serde_json::json!(i))).collect();
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"}
    })
    .to_string()
}

async fn session(backend: &str, f: &(TargetConfig, Vec<u8>, DrafterConfig, Vec<u8>)) -> Session {
    let s = Session::create(backend.into()).await.unwrap_or_else(|_| panic!("{backend} session (WebGPU needs Chromium with --enable-unsafe-webgpu)"));
    s.load_target(&f.0.to_hf_json().to_string(), f.1.clone(), None).unwrap_or_else(|_| panic!("load_target"));
    s.add_drafter(&f.2.to_hf_json(f.0.layers).to_string(), f.3.clone(), None).unwrap_or_else(|_| panic!("add_drafter"));
    s
}

/// The options every run here uses: greedy, no stop tokens, a fixed budget and length.
/// Without the lookup graft (`"lookup": 0`), whose default differs between the CPU backend and
/// WebGPU (fallback vs always), so both backends verify the same trees of at most `BUDGET` nodes.
fn options(method: &str, max_new: usize) -> JsValue {
    options_lookup(method, max_new, 0)
}

fn options_lookup(method: &str, max_new: usize, lookup: usize) -> JsValue {
    let lookup = if method == "ar" { String::new() } else { format!(r#", "lookup": {lookup}"#) };
    JsValue::from_str(&format!(r#"{{"method": "{method}", "budget": {BUDGET}, "max_new_tokens": {max_new}, "stop": []{lookup}}}"#))
}

fn field(o: &JsValue, k: &str) -> JsValue {
    Reflect::get(o, &JsValue::from_str(k)).unwrap()
}

fn nums(v: &JsValue) -> Vec<i64> {
    v.clone().dyn_into::<Array>().unwrap_or_else(|_| panic!("expected an array, got {v:?}")).iter().map(|x| x.as_f64().unwrap() as i64).collect()
}

fn u32s(v: &JsValue) -> Vec<u32> {
    nums(v).into_iter().map(|x| x as u32).collect()
}

/// One round as `on_round` received it.
#[derive(Debug, Clone, PartialEq)]
struct Round {
    round: usize,
    root_pos: usize,
    tokens: Vec<u32>,
    parents: Vec<i64>,
    depths: Vec<u32>,
    accepted: Vec<usize>,
    bonus: u32,
    committed: usize,
}

fn round_of(o: &JsValue) -> Round {
    let n = |k: &str| field(o, k).as_f64().unwrap_or_else(|| panic!("round.{k} is not a number: {o:?}")) as usize;
    Round {
        round: n("round"),
        root_pos: n("root_pos"),
        tokens: u32s(&field(o, "tokens")),
        parents: nums(&field(o, "parents")),
        depths: u32s(&field(o, "depths")),
        accepted: nums(&field(o, "accepted")).into_iter().map(|x| x as usize).collect(),
        bonus: n("bonus") as u32,
        committed: n("committed"),
    }
}

/// Run `generate` with an `on_round` that collects the round objects; returns the result and
/// the raw objects.
async fn generate_rounds(s: &Session, method: &str, max_new: usize) -> (JsValue, Vec<JsValue>) {
    let got = Array::new();
    let push = Function::new_with_args("round", "this.push(round)").bind0(&got);
    let r = JsFuture::from(s.generate(PROMPT.iter().map(|&x| JsValue::from(x)).collect::<Array>().into(), options(method, max_new), None, Some(push)))
        .await
        .unwrap_or_else(|e| panic!("generate: {e:?}"));
    (r, got.iter().collect())
}

/// The tree invariants of each round and the committed tokens they rebuild: the first token
/// (the prefill's, round 0's anchor), then per round the accepted nodes' tokens after the
/// root and the bonus, `committed` of them.
fn rebuild(rounds: &[Round]) -> Vec<u32> {
    let mut out = vec![rounds[0].tokens[0]];
    for (i, r) in rounds.iter().enumerate() {
        let n = r.tokens.len();
        assert_eq!(r.round, i, "rounds arrive in order");
        assert!((1..=BUDGET + 1).contains(&n) && r.parents.len() == n && r.depths.len() == n, "round {i}: {r:?}");
        assert_eq!((r.parents[0], r.depths[0]), (-1, 0), "round {i}: node 0 is the root");
        for j in 1..n {
            let p = r.parents[j];
            assert!(p >= 0 && (p as usize) < j, "round {i}: node {j}'s parent {p} precedes it");
            assert_eq!(r.depths[j], r.depths[p as usize] + 1, "round {i}: node {j}'s depth");
        }
        assert_eq!(r.accepted[0], 0, "round {i}: the accepted path starts at the root");
        for w in r.accepted.windows(2) {
            assert_eq!(r.parents[w[1]], w[0] as i64, "round {i}: accepted {w:?} is a parent-child step");
        }
        assert_eq!(r.tokens[0], *out.last().unwrap(), "round {i}: the anchor is the last committed token");
        assert_eq!(r.root_pos, PROMPT.len() + out.len() - 1, "round {i}: root_pos is the anchor's sequence position");
        let mut new: Vec<u32> = r.accepted[1..].iter().map(|&j| r.tokens[j]).collect();
        new.push(r.bonus);
        assert!(r.committed <= new.len(), "round {i}: committed {} of {}", r.committed, new.len());
        if i + 1 < rounds.len() {
            assert_eq!(r.committed, new.len(), "round {i}: only the last round is cut");
        }
        out.extend_from_slice(&new[..r.committed]);
    }
    out
}

#[wasm_bindgen_test]
async fn rounds_are_the_engines_and_rebuild_the_tokens_on_cpu_and_webgpu() {
    let f = files();
    let cpu = session("cpu", &f).await;
    cpu.set_tokenizer(&tokenizer_json(), None).unwrap_or_else(|_| panic!("set_tokenizer"));
    let (r, objs) = generate_rounds(&cpu, "sparkling", MAX_NEW).await;
    let rounds: Vec<Round> = objs.iter().map(round_of).collect();
    let tokens = u32s(&field(&r, "tokens"));
    assert_eq!(tokens.len(), MAX_NEW);
    assert_eq!(rounds.len(), field(&r, "rounds").as_f64().unwrap() as usize, "one object per round");
    assert_eq!(rebuild(&rounds), tokens, "the rounds rebuild the committed tokens");
    // Real trees: branching (a node with two children) and drafted tokens accepted.
    let branching = rounds.iter().filter(|r| (1..r.tokens.len()).any(|j| r.parents[j + 1..].contains(&r.parents[j]))).count();
    let drafted: usize = rounds.iter().map(|r| r.accepted.len() - 1).sum();
    web_sys::console::log_1(&format!("cpu: {} rounds, {branching} branching, {drafted} drafted tokens accepted", rounds.len()).into());
    assert!(branching > 0 && drafted > 0, "{branching} branching rounds, {drafted} drafted tokens accepted");
    // Texts from the tokenizer: each node's token and the bonus as the word they stand for.
    for o in &objs {
        let texts: Vec<String> = field(o, "texts").dyn_into::<Array>().unwrap().iter().map(|x| x.as_string().unwrap()).collect();
        let want: Vec<String> = u32s(&field(o, "tokens")).iter().map(|t| format!("w{t}")).collect();
        assert_eq!(texts, want);
        assert_eq!(field(o, "bonus_text").as_string().unwrap(), format!("w{}", field(o, "bonus").as_f64().unwrap()));
    }

    // The engine itself, run directly on the CPU backend with the same files and parameters:
    // its RoundViews are what the API handed over.
    let b = CpuBackend::new();
    let target = Target::load(&b, &SafetensorsSource::from_bytes("t", f.1.clone()).unwrap(), f.0.clone(), &|_, _| {}).unwrap();
    let drafter = Drafter::load(&b, &SafetensorsSource::from_bytes("d", f.3.clone()).unwrap(), f.2.clone(), &f.0).unwrap();
    let mut p = GenParams::new(Method::Sparkling, &sparkling::decode::Platform::HOST).with_budget(BudgetChoice::Fixed(BUDGET));
    (p.max_new_tokens, p.stop, p.lookup) = (MAX_NEW, vec![], LookupGraft::OFF);
    let mut engine_rounds = Vec::new();
    let e = Engine { backend: &b, target: &target, drafter: Some(&drafter) };
    let g = e
        .generate_observed_async(&PROMPT, &p, &mut |_| {}, &mut |v| {
            engine_rounds.push(Round {
                round: v.round,
                root_pos: v.root_pos,
                tokens: v.tree.tokens.clone(),
                parents: v.tree.parents.iter().map(|&x| if x == NO_PARENT { -1 } else { i64::from(x) }).collect(),
                depths: v.tree.depths.clone(),
                accepted: v.accepted.to_vec(),
                bonus: v.bonus,
                committed: 0,
            })
        })
        .await
        .unwrap();
    assert_eq!(g.tokens, tokens);
    let without_committed: Vec<Round> = rounds.iter().map(|r| Round { committed: 0, ..r.clone() }).collect();
    assert_eq!(without_committed, engine_rounds, "on_round's objects are the engine's rounds");

    // WebGPU in the same page: the same rounds (trees, paths, bonus tokens) as the CPU backend.
    let gpu = session("webgpu", &f).await;
    let (gr, gobjs) = generate_rounds(&gpu, "sparkling", MAX_NEW).await;
    let grounds: Vec<Round> = gobjs.iter().map(round_of).collect();
    assert_eq!(u32s(&field(&gr, "tokens")), tokens, "WebGPU tokens");
    assert_eq!(rebuild(&grounds), tokens, "the WebGPU rounds rebuild the committed tokens");
    assert!(field(&gobjs[0], "texts").is_null(), "no tokenizer: texts is null");
    assert_eq!(grounds, rounds, "WebGPU's rounds equal the CPU backend's");

    // With a lookup chain grafted onto the trees (the `lookup` option; each backend's default
    // drafter policy): the same tokens, trees larger by at most the chain.
    for s in [&cpu, &gpu] {
        let got = Array::new();
        let push = Function::new_with_args("round", "this.push(round)").bind0(&got);
        let ids: JsValue = PROMPT.iter().map(|&x| JsValue::from(x)).collect::<Array>().into();
        let r = JsFuture::from(s.generate(ids, options_lookup("sparkling", MAX_NEW, 4), None, Some(push))).await.unwrap_or_else(|e| panic!("generate: {e:?}"));
        assert_eq!(u32s(&field(&r, "tokens")), tokens, "tokens with the lookup graft");
        assert!(got.iter().all(|o| u32s(&field(&o, "tokens")).len() <= BUDGET + 1 + 4), "trees of at most the budget + the chain");
    }
}

#[wasm_bindgen_test]
async fn on_round_errors_reject_stops_end_and_ar_rounds_are_roots() {
    let f = files();
    let s = session("cpu", &f).await;
    let ids: JsValue = PROMPT.iter().map(|&x| JsValue::from(x)).collect::<Array>().into();
    // A throwing on_round rejects with its message; the session stays usable.
    let thrower = Function::new_with_args("round", "throw new Error('boom from on_round')");
    let e = JsFuture::from(s.generate(ids.clone(), options("sparkling", 8), None, Some(thrower))).await.expect_err("must reject");
    let m = field(&e, "message").as_string().unwrap_or_default();
    assert!(m.contains("on_round callback threw") && m.contains("boom from on_round"), "{m}");
    // Returning false stops at that round's end: the first token and round 0's tokens.
    let seen = Object::new();
    let stop = Function::new_with_args("round", "this.r = round; return false;").bind0(&seen);
    let r = JsFuture::from(s.generate(ids.clone(), options("sparkling", 20), None, Some(stop))).await.unwrap();
    assert_eq!(field(&r, "cancelled"), JsValue::TRUE);
    let r0 = round_of(&field(&seen, "r"));
    assert_eq!(u32s(&field(&r, "tokens")).len(), 1 + r0.committed, "stops after round 0");
    // The plain method verifies the root alone: accepted [0], one token (the bonus) per round.
    let (r, objs) = generate_rounds(&s, "ar", 5).await;
    let rounds: Vec<Round> = objs.iter().map(round_of).collect();
    assert_eq!(rounds.len(), 4);
    assert!(rounds.iter().all(|r| r.tokens.len() == 1 && r.accepted == [0] && r.committed == 1), "{rounds:?}");
    assert_eq!(rebuild(&rounds), u32s(&field(&r, "tokens")));
}
