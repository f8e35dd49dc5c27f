//! The JavaScript API (`Session`) as a page uses it: byte loaders, options as an object or as
//! JSON text, token ids as an array, streamed tokens, and the errors of common mistakes (a
//! misspelt option, a non-numeric id, a throwing callback, a drafter before its target).
#![cfg(target_arch = "wasm32")]

use js_sys::{Array, Function, Object, Reflect, Uint32Array};
use sparkling::model::config::{Arch, DrafterKind};
use sparkling::model::synth::{random_drafter_bytes, random_target_bytes, tiny_target_config, DrafterInit, StoreDtype};
use sparkling_web::Session;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

async fn cpu_session_with_models() -> Session {
    let s = Session::create("cpu".into()).await.unwrap_or_else(|_| panic!("cpu session"));
    let cfg = tiny_target_config(Arch::Qwen3, 48);
    let init = DrafterInit { kind: DrafterKind::DSpark, layers: 1, block_size: 7, markov_rank: 8, taps: 2, mask_token_id: None, confidence_head: true };
    let (dcfg, dbytes) = random_drafter_bytes(&cfg, &init, 6, StoreDtype::Bf16).unwrap();
    // A drafter before its target is refused with a message naming both load calls.
    let early = s.add_drafter(&dcfg.to_hf_json(cfg.layers).to_string(), dbytes.clone(), None);
    assert!(early.is_err(), "a drafter before the target must be an error");
    s.load_target(&cfg.to_hf_json().to_string(), random_target_bytes(&cfg, 21, StoreDtype::F32).unwrap(), None).unwrap_or_else(|_| panic!("load_target"));
    s.add_drafter(&dcfg.to_hf_json(cfg.layers).to_string(), dbytes, None).unwrap_or_else(|_| panic!("add_drafter"));
    s
}

fn ids(v: &[u32]) -> JsValue {
    v.iter().map(|&x| JsValue::from(x)).collect::<Array>().into()
}

fn field(o: &JsValue, k: &str) -> JsValue {
    Reflect::get(o, &JsValue::from_str(k)).unwrap()
}

fn tokens(r: &JsValue) -> Vec<u32> {
    field(r, "tokens").dyn_into::<Array>().unwrap().iter().map(|x| x.as_f64().unwrap() as u32).collect()
}

async fn message_of(p: js_sys::Promise) -> String {
    let e = JsFuture::from(p).await.expect_err("the promise must reject");
    let m = field(&e, "message");
    m.as_string().unwrap_or_else(|| format!("{e:?}"))
}

#[wasm_bindgen_test]
async fn options_as_object_or_json_give_the_same_tokens() {
    let s = cpu_session_with_models().await;
    let prompt = [3u32, 17, 5, 9, 22, 1];
    let ar = JsFuture::from(s.generate(ids(&prompt), JsValue::from_str(r#"{"method": "ar", "max_new_tokens": 12}"#), None, None)).await.unwrap();
    let opts = Object::new();
    Reflect::set(&opts, &"method".into(), &"sparkling".into()).unwrap();
    Reflect::set(&opts, &"budget".into(), &JsValue::from(8)).unwrap();
    Reflect::set(&opts, &"max_new_tokens".into(), &JsValue::from(12)).unwrap();
    // Streamed tokens arrive through the callback, round by round.
    let streamed = Array::new();
    let push = Function::new_with_args("ids, text", "this.push(...ids)").bind0(&streamed);
    let sp = JsFuture::from(s.generate(Uint32Array::from(&prompt[..]).into(), opts.into(), Some(push), None)).await.unwrap();
    assert_eq!(tokens(&ar).len(), 12);
    assert_eq!(tokens(&sp), tokens(&ar), "sparkling must emit the ar tokens");
    let got: Vec<u32> = streamed.iter().map(|x| x.as_f64().unwrap() as u32).collect();
    assert_eq!(got, tokens(&ar), "the callback streams exactly the committed tokens");
    assert!(field(&sp, "tau").as_f64().unwrap() >= 1.0);
    assert_eq!(field(&sp, "method").as_string().unwrap(), "sparkling");
}

#[wasm_bindgen_test]
async fn mistakes_give_messages_not_crashes() {
    let s = cpu_session_with_models().await;
    let m = message_of(s.generate(ids(&[1, 2]), JsValue::from_str(r#"{"maxNewTokens": 4}"#), None, None)).await;
    assert!(m.contains("unknown option `maxNewTokens`") && m.contains("did you mean `max_new_tokens`"), "{m}");
    let bad_ids: JsValue = ["a", "b"].iter().map(|x| JsValue::from_str(x)).collect::<Array>().into();
    let m = message_of(s.generate(bad_ids, JsValue::UNDEFINED, None, None)).await;
    assert!(m.contains("prompt_ids[0]"), "{m}");
    let m = message_of(s.generate(ids(&[1, 2]), JsValue::from(42), None, None)).await;
    assert!(m.contains("options must be an object or a JSON string"), "{m}");
    let m = message_of(s.generate_text(JsValue::from(42), JsValue::UNDEFINED, None, None)).await;
    assert!(m.contains("must be a string"), "{m}");
    // Huge numbers fail the context check instead of wrapping around it (usize is 32 bits here).
    let m = message_of(s.generate(ids(&[1, 2]), JsValue::from_str(r#"{"method": "sparkling", "budget": 4294967295}"#), None, None)).await;
    assert!(m.contains("exceeds the target context"), "{m}");
    let m = message_of(s.generate(ids(&[1, 2]), JsValue::from_str(r#"{"budget": 4294967296}"#), None, None)).await;
    assert!(m.contains("budget") && m.contains("below 2^32"), "{m}");
    let m = message_of(s.generate(ids(&[1, 2]), JsValue::from_str(r#"{"method": "ar", "temperature": 1e39}"#), None, None)).await;
    assert!(m.contains("temperature") && m.contains("finite"), "{m}");
    let thrower = Function::new_with_args("ids, text", "throw new Error('boom from callback')");
    let m = message_of(s.generate(ids(&[1, 2]), JsValue::from_str(r#"{"method": "ar", "max_new_tokens": 3}"#), Some(thrower), None)).await;
    assert!(m.contains("on_tokens callback threw") && m.contains("boom from callback"), "{m}");
    // The session still works after every one of them.
    let r = JsFuture::from(s.generate(ids(&[1, 2]), JsValue::from_str(r#"{"method": "ar", "max_new_tokens": 3}"#), None, None)).await.unwrap();
    assert_eq!(tokens(&r).len(), 3);
}

#[wasm_bindgen_test]
async fn stop_from_the_callback_or_cancel_ends_a_generation_early() {
    let s = cpu_session_with_models().await;
    let long = JsValue::from_str(r#"{"method": "ar", "max_new_tokens": 40}"#);
    // `on_tokens` returning false stops at the end of that round: prefill + 2 ar rounds.
    let counter = Object::new();
    let stop_at_3 = Function::new_with_args("ids, text", "this.n = (this.n || 0) + 1; return this.n < 3;").bind0(&counter);
    let r = JsFuture::from(s.generate(ids(&[1, 2]), long.clone(), Some(stop_at_3), None)).await.unwrap();
    assert_eq!(field(&r, "cancelled"), JsValue::TRUE);
    assert_eq!(tokens(&r).len(), 3, "stops after the round whose callback returned false");
    assert!(field(&r, "tau").is_null(), "a stopped run has no statistics");
    // cancel() stops every running generation, before its first round here.
    let p = s.generate(ids(&[1, 2]), long.clone(), None, None);
    s.cancel();
    let r = JsFuture::from(p).await.unwrap();
    assert_eq!(field(&r, "cancelled"), JsValue::TRUE);
    assert!(tokens(&r).len() < 40);
    // Generations started after cancel() run to the end, with the tokens of an uninterrupted run.
    let full = JsFuture::from(s.generate(ids(&[1, 2]), long, None, None)).await.unwrap();
    assert_eq!(field(&full, "cancelled"), JsValue::FALSE);
    assert_eq!(tokens(&full).len(), 40);
    let stopped_tokens = tokens(&r);
    assert_eq!(&tokens(&full)[..stopped_tokens.len()], &stopped_tokens[..]);
}

#[wasm_bindgen_test]
async fn load_errors_name_the_users_file_and_the_context_is_known() {
    let s = cpu_session_with_models().await;
    // The page passes the picked file's name (or the address) so a bad file is named as the
    // user knows it, not by an internal name.
    let e = s.load_target_gguf(b"this is not a GGUF file".to_vec(), Some("my-model.gguf".into())).err().expect("not a GGUF: an error");
    let m = field(&JsValue::from(e), "message").as_string().unwrap();
    assert!(m.contains("my-model.gguf") && !m.contains("target.gguf"), "{m}");
    // A drafter config that is not JSON, from a (mistyped) address: the error names the address.
    let e = s.add_drafter("<html>404</html>", vec![], Some("models/my-drafter".into())).err().expect("not JSON: an error");
    let m = field(&JsValue::from(e), "message").as_string().unwrap();
    assert!(m.contains("models/my-drafter/config.json") && m.contains("invalid JSON"), "{m}");
    // The failed load left the loaded target in place; its context bounds message + answer.
    let cfg = tiny_target_config(Arch::Qwen3, 48);
    assert_eq!(s.context_length().unwrap_or_else(|_| panic!("context_length")), cfg.max_positions);
    let fresh = Session::create("cpu".into()).await.unwrap_or_else(|_| panic!("cpu session"));
    assert!(fresh.context_length().is_err(), "no target loaded: an error");
    assert!(fresh.count_chat_tokens("Hi").is_err(), "no tokenizer: an error");
}
