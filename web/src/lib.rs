//! SparklingTree in the browser (issue 4): the same engine, drafters, tree builders and
//! tree-attention verify as the native build, on WebGPU through wgpu's browser backend, or on
//! the CPU reference backend compiled to wasm (the fallback where WebGPU is missing;
//! platform.md §4). WebGL is not used: it has no compute shaders.
//!
//! A browser cannot block on the GPU, so the engine runs its asynchronous entry point
//! ([`sparkling::decode::Engine::generate_async`]): each round awaits its read-backs (tree
//! prep and acceptance) instead of waiting on them.
//!
//! JavaScript API (built with `wasm-bindgen --target web`, see `web/README.md`):
//!
//! ```js
//! import init, { Session } from "./pkg/sparkling_web.js";
//! await init();
//! const s = await Session.create("webgpu");          // or "cpu"
//! s.load_target(configJsonText, new Uint8Array(await (await fetch(".../model.safetensors")).arrayBuffer()));
//! // or: s.load_target_gguf(ggufBytes)  (also sets the tokenizer from the GGUF vocabulary)
//! s.add_drafter(drafterConfigJsonText, drafterBytes); // DSpark and/or DFlash drafters
//! s.set_tokenizer(tokenizerJsonText, tokenizerConfigJsonText);
//! const r = await s.generate_text("Hello!", JSON.stringify({ method: "sparkling", max_new_tokens: 64 }), (ids, text) => ...,
//!                                 (round) => drawTree(round));   // optional: each verified tree
//! // r: { tokens, text, stopped, cancelled, tau, tokens_per_s, rounds, prefill_ms, decode_ms, backend }
//! // round: { round, root_pos, tokens, parents, depths, accepted, bonus, committed, texts, bonus_text }
//! s.cancel();   // stops every running generation of the session at its next round
//! ```
//!
//! Errors reach JavaScript as exceptions (rejected promises) whose message names the file,
//! key or argument at fault, as on the command line.
#![cfg(target_arch = "wasm32")]
#![warn(missing_docs)]

use serde_json::{json, Value};
use sparkling::core::{Backend, SampleParams, NO_PARENT};
use sparkling::cpu::CpuBackend;
use sparkling::decode::budget::{BudgetChoice, CostModel};
use sparkling::decode::propose::{TreeParams, TreePrep};
use sparkling::decode::{stop_tokens, GenParams, LookupGraft, Method, Models, Platform, RoundView};
use sparkling::loader::gguf_source::GgufSource;
use sparkling::loader::safetensors_source::SafetensorsSource;
use sparkling::loader::TensorSource;
use sparkling::model::config::{DrafterConfig, TargetConfig};
use sparkling::model::drafter::Drafter;
use sparkling::model::target::Target;
use sparkling::tokenizer::TextTokenizer;
use sparkling_wgpu::{WgpuBackend, WgpuOptions};
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::path::Path;
use std::rc::Rc;
use wasm_bindgen::prelude::*;

/// Models loaded on one backend.
struct Loaded<B: Backend> {
    b: B,
    /// The target and its drafters (`None` until a target is loaded).
    models: Option<Models<B>>,
    /// The `budget: "auto"` cost model measured by the first generation on this target (the
    /// next ones reuse it); cleared when a target is loaded.
    cost: std::cell::RefCell<Option<CostModel>>,
}

/// The backend a session runs on.
enum AnyLoaded {
    Gpu(Loaded<WgpuBackend>),
    Cpu(Loaded<CpuBackend>),
}

/// A SparklingTree session: one backend, a target, its drafters and an optional tokenizer.
#[wasm_bindgen]
pub struct Session {
    models: Rc<RefCell<AnyLoaded>>,
    tokenizer: Rc<RefCell<Option<TextTokenizer>>>,
    /// Bumped by [`Session::cancel`]: a generation started at another value stops.
    epoch: Rc<Cell<u64>>,
}

fn js_err(e: impl std::fmt::Display) -> JsError {
    JsError::new(&e.to_string())
}

const BUSY: &str = "this session is generating: models and the tokenizer can be (re)loaded only after generate() has finished";

#[wasm_bindgen]
impl Session {
    /// Open a session on `backend`: `"webgpu"` (the browser's WebGPU adapter) or `"cpu"`
    /// (the CPU reference backend compiled to wasm, one thread).
    /// Errors: an unknown backend name; no WebGPU adapter in this browser (the message says
    /// how to enable it).
    pub async fn create(backend: String) -> Result<Session, JsError> {
        let models = match backend.as_str() {
            "webgpu" | "wgpu" | "gpu" => {
                let b = WgpuBackend::with_options_async(&WgpuOptions::default()).await.map_err(js_err)?;
                AnyLoaded::Gpu(Loaded { b, models: None, cost: Default::default() })
            }
            "cpu" => AnyLoaded::Cpu(Loaded { b: CpuBackend::new(), models: None, cost: Default::default() }),
            other => return Err(JsError::new(&format!("unknown backend `{other}` (expected \"webgpu\" or \"cpu\")"))),
        };
        Ok(Session { models: Rc::new(RefCell::new(models)), tokenizer: Rc::new(RefCell::new(None)), epoch: Rc::new(Cell::new(0)) })
    }

    /// Stop every generation running on this session. Each stops at its next round boundary
    /// (the engine's next read-back or yield) and resolves with `cancelled: true`, the tokens
    /// committed so far, and `null` statistics; the models stay borrowed until then, so await
    /// a cancelled generation's promise before loading. Generations started afterwards run.
    pub fn cancel(&self) {
        self.epoch.set(self.epoch.get().wrapping_add(1));
    }

    /// The backend and device in use (e.g. `wgpu: SwiftShader Device (BrowserWebGpu, Cpu, …)`).
    pub fn backend_name(&self) -> Result<String, JsError> {
        let m = self.models.try_borrow().map_err(|_| JsError::new(BUSY))?;
        Ok(match &*m {
            AnyLoaded::Gpu(l) => l.b.name(),
            AnyLoaded::Cpu(l) => l.b.name(),
        })
    }

    /// Load the target from the text of its `config.json` and the bytes of its
    /// `model.safetensors` (HF layout; bf16, f16 or f32). Replaces any loaded target and
    /// drops the drafters (they are tied to the target's geometry) and a tokenizer whose
    /// vocabulary is larger than the target's.
    /// Errors: invalid config (the message names the key), missing or misshapen tensors
    /// (named), a model larger than the adapter's limits. `name` (optional, default `target`):
    /// the folder or address the files came from, which error messages name
    /// (`<name>/config.json`, `<name>/model.safetensors`).
    pub fn load_target(&self, config_json: &str, weights: Vec<u8>, name: Option<String>) -> Result<(), JsError> {
        let dir = name.filter(|n| !n.is_empty()).unwrap_or_else(|| "target".into());
        let path = Path::new(&dir).join("config.json");
        let v: Value = serde_json::from_str(config_json).map_err(|e| JsError::new(&format!("{}: invalid JSON: {e}", path.display())))?;
        let cfg = TargetConfig::from_hf_json(&path, &v).map_err(js_err)?;
        let src = SafetensorsSource::from_bytes(&format!("{dir}/model.safetensors"), weights).map_err(js_err)?;
        let vocab = cfg.vocab;
        let mut m = self.models.try_borrow_mut().map_err(|_| JsError::new(BUSY))?;
        match &mut *m {
            AnyLoaded::Gpu(l) => load_target(l, &src, cfg),
            AnyLoaded::Cpu(l) => load_target(l, &src, cfg),
        }
        .map_err(js_err)?;
        // A tokenizer set for another model does not fit this one: drop it.
        let mut t = self.tokenizer.try_borrow_mut().map_err(|_| JsError::new(BUSY))?;
        if t.as_ref().is_some_and(|t| t.vocab_size() > vocab) {
            *t = None;
        }
        Ok(())
    }

    /// Load the target from a GGUF file's bytes (e.g. llama.cpp's
    /// `smollm2-135m-instruct-f16.gguf`; F32, F16, BF16 and the Q4/Q5/Q8 block types are
    /// dequantized at load). The file's vocabulary and chat template become the session's
    /// tokenizer (call [`Session::set_tokenizer`] afterwards to use another). Replaces any
    /// loaded target and drops the drafters. `name` (optional, default `target.gguf`): the
    /// file name or address the bytes came from, which error messages name.
    /// Errors: not a GGUF file, an unsupported architecture or tensor type (named).
    pub fn load_target_gguf(&self, bytes: Vec<u8>, name: Option<String>) -> Result<(), JsError> {
        let name = name.filter(|n| !n.is_empty()).unwrap_or_else(|| "target.gguf".into());
        let src = GgufSource::from_bytes(&name, bytes).map_err(js_err)?;
        let cfg = TargetConfig::from_gguf(&src.file).map_err(js_err)?;
        let tok = TextTokenizer::from_gguf(&src.file).ok();
        let mut m = self.models.try_borrow_mut().map_err(|_| JsError::new(BUSY))?;
        match &mut *m {
            AnyLoaded::Gpu(l) => load_target(l, &src, cfg),
            AnyLoaded::Cpu(l) => load_target(l, &src, cfg),
        }
        .map_err(js_err)?;
        *self.tokenizer.try_borrow_mut().map_err(|_| JsError::new(BUSY))? = tok;
        Ok(())
    }

    /// Add a drafter (DFlash or DSpark, from its `config.json` text and `model.safetensors`
    /// bytes) for the loaded target; a drafter of the same kind replaces the earlier one.
    /// `name` (optional, default `drafter`): the folder or address the files came from, which
    /// error messages name (`<name>/config.json`, `<name>/model.safetensors`).
    /// Errors: no target loaded yet; config or tensors that do not fit the target.
    pub fn add_drafter(&self, config_json: &str, weights: Vec<u8>, name: Option<String>) -> Result<(), JsError> {
        let dir = name.filter(|n| !n.is_empty()).unwrap_or_else(|| "drafter".into());
        let path = Path::new(&dir).join("config.json");
        let v: Value = serde_json::from_str(config_json).map_err(|e| JsError::new(&format!("{}: invalid JSON: {e}", path.display())))?;
        let cfg = DrafterConfig::from_hf_json(&path, &v).map_err(js_err)?;
        let src = SafetensorsSource::from_bytes(&format!("{dir}/model.safetensors"), weights).map_err(js_err)?;
        let mut m = self.models.try_borrow_mut().map_err(|_| JsError::new(BUSY))?;
        match &mut *m {
            AnyLoaded::Gpu(l) => add_drafter(l, &src, cfg),
            AnyLoaded::Cpu(l) => add_drafter(l, &src, cfg),
        }
        .map_err(js_err)
    }

    /// Use a tokenizer (`tokenizer.json` text; `tokenizer_config.json` text for the chat
    /// template, optional) for [`Session::generate_text`] and for decoding tokens.
    /// Errors: an invalid `tokenizer.json`.
    pub fn set_tokenizer(&self, tokenizer_json: &str, tokenizer_config_json: Option<String>) -> Result<(), JsError> {
        let t = TextTokenizer::from_json(tokenizer_json, tokenizer_config_json.as_deref()).map_err(js_err)?;
        let vocab = match &*self.models.try_borrow().map_err(|_| JsError::new(BUSY))? {
            AnyLoaded::Gpu(l) => l.models.as_ref().map(|m| m.target.cfg.vocab),
            AnyLoaded::Cpu(l) => l.models.as_ref().map(|m| m.target.cfg.vocab),
        };
        if let Some(v) = vocab.filter(|&v| t.vocab_size() > v) {
            return Err(JsError::new(&format!(
                "set_tokenizer: the tokenizer has {} tokens but the loaded target's vocabulary has {v}: it belongs to another model",
                t.vocab_size()
            )));
        }
        *self.tokenizer.try_borrow_mut().map_err(|_| JsError::new(BUSY))? = Some(t);
        Ok(())
    }

    /// Generate from token ids. `options`: an object (or its JSON text) with any of `method`
    /// (`ar`, `dflash`, `ddtree`, `dspark`, `sparkling` (default), `treespark`), `budget`
    /// (`"auto"`, the default: each round verifies the part of the tree worth its measured cost,
    /// or skips the drafter; or a number of tree nodes), `candidates`, `max_fanout`,
    /// `treespark_k`, `max_new_tokens`, `temperature` (0 = greedy), `top_k` (0 = off), `top_p`,
    /// `seed` — defaults those of the CLI (`GenParams::new`: budget auto, trees of up to 64
    /// nodes, treespark 32, 16 on the CPU backend; 128
    /// candidates, fan-out 64, k 4, 256 new tokens, greedy, seed 0) — `stop` (token ids; default
    /// the CLI's rule, `sparkling::decode::stop_tokens`: the target's EOS plus the tokenizer's
    /// stop tokens), `tree_prep` (`"auto"`: device on WebGPU, host on the CPU backend), `lookup`
    /// (methods with a drafter: the prompt-lookup chain grafted onto each tree, in tokens, 0 =
    /// off; default the CLI's `--lookup auto`, `Platform::lookup_graft`). `prompt_ids`: a `Uint32Array` or an array of ids;
    /// `options`: an object or its JSON text. Unknown keys are an error. `on_tokens(ids, text)`, optional, is
    /// called with each round's committed tokens (and their text when a tokenizer is set); when
    /// it returns `false` the generation stops at the round's end (as with [`Session::cancel`]).
    /// `on_round(round)`, optional, is called once per verified round, just before `on_tokens`
    /// receives that round's tokens, with the draft tree the target checked (issue 16: the live
    /// tree view), a plain object: `{ round, root_pos, tokens, parents, depths, accepted, bonus,
    /// drafted, last_token, committed, texts, bonus_text }` — `round` counts from 0 (the
    /// prefill, which commits the first token, is not a round); node 0 is the anchor (the last committed token) at sequence
    /// position `root_pos`, node `i` has token `tokens[i]`, parent `parents[i]` (`-1` for node 0)
    /// and depth `depths[i]`; `accepted` lists the accepted nodes from the root (`accepted[0] ==
    /// 0`, each the child of the one before); `bonus` is the target's own next token; `drafted`
    /// says whether the drafter ran (`false`: `ar`, a step `auto` skipped, or the last step);
    /// `last_token` marks the step where only its bonus token was left to generate, so nothing
    /// was drafted (no drafted node could have been kept; not a skip). The round
    /// commits the accepted nodes' tokens after the root, then `bonus`; `committed` says how many
    /// of them were kept (fewer in the last round when a stop token or `max_new_tokens` cuts it).
    /// `texts` (each node's token as text) and `bonus_text` are `null` without a tokenizer. It
    /// may return `false` to stop, like `on_tokens`; an exception it throws rejects the promise.
    /// Resolves to `{ tokens, text, stopped, cancelled, tau, tokens_per_s, rounds, prefill_ms,
    /// decode_ms, method, budget, backend, tree_sizes, drafts_skipped }` (a cancelled run: the tokens so far, `null`
    /// statistics). Several generations may run at once on one session (their rounds
    /// interleave); loading waits until none is running.
    /// Errors: no target loaded, a method whose drafter kind is not loaded, bad options (the
    /// message names the key), a prompt beyond the context, device failures.
    pub fn generate(&self, prompt_ids: JsValue, options: JsValue, on_tokens: Option<js_sys::Function>, on_round: Option<js_sys::Function>) -> js_sys::Promise {
        let args = token_ids(&prompt_ids).and_then(|ids| Ok((ids, options_text(&options)?)));
        match args {
            Ok((ids, opts)) => self.start(ids, opts, Callbacks { on_tokens, on_round }),
            Err(m) => js_sys::Promise::reject(&JsValue::from(JsError::new(&m))),
        }
    }

    /// Like [`Session::generate`] from a user message (a string), encoded with the tokenizer's
    /// chat template. Errors: no tokenizer set, a message that is not a string, plus those of
    /// `generate`.
    pub fn generate_text(&self, user: JsValue, options: JsValue, on_tokens: Option<js_sys::Function>, on_round: Option<js_sys::Function>) -> js_sys::Promise {
        let args = (|| -> Result<(Vec<u32>, String), String> {
            let user = user.as_string().ok_or("generate_text: the message must be a string")?;
            let opts = options_text(&options)?;
            let t = self.tokenizer.try_borrow().map_err(|_| BUSY.to_string())?;
            let t = t.as_ref().ok_or("generate_text needs a tokenizer: call set_tokenizer (or load_target_gguf) first, or pass token ids to generate")?;
            Ok((t.encode_chat(&user, None).map_err(|e| e.to_string())?, opts))
        })();
        match args {
            Ok((ids, opts)) => self.start(ids, opts, Callbacks { on_tokens, on_round }),
            Err(m) => js_sys::Promise::reject(&JsValue::from(JsError::new(&m))),
        }
    }

    /// The number of tokens [`Session::generate_text`] gives the model for `user` (the message
    /// in the chat template), to check a message against [`Session::context_length`] before
    /// generating. Errors: no tokenizer set.
    pub fn count_chat_tokens(&self, user: &str) -> Result<usize, JsError> {
        let t = self.tokenizer.try_borrow().map_err(|_| JsError::new(BUSY))?;
        let t = t.as_ref().ok_or_else(|| JsError::new("no tokenizer: call set_tokenizer (or load_target_gguf) first"))?;
        Ok(t.encode_chat(user, None).map_err(js_err)?.len())
    }

    /// The loaded target's context in tokens (`max_position_embeddings`, a GGUF's
    /// `<arch>.context_length`): message + answer + the largest checked tree must fit in it.
    /// Errors: no target loaded.
    pub fn context_length(&self) -> Result<usize, JsError> {
        let m = self.models.try_borrow().map_err(|_| JsError::new(BUSY))?;
        let n = match &*m {
            AnyLoaded::Gpu(l) => l.models.as_ref().map(|m| m.target.cfg.max_positions),
            AnyLoaded::Cpu(l) => l.models.as_ref().map(|m| m.target.cfg.max_positions),
        };
        n.ok_or_else(|| JsError::new("no target loaded: call load_target or load_target_gguf first"))
    }

    /// Encode text with the tokenizer (no chat template). Errors: no tokenizer set.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, JsError> {
        let t = self.tokenizer.try_borrow().map_err(|_| JsError::new(BUSY))?;
        let t = t.as_ref().ok_or_else(|| JsError::new("no tokenizer: call set_tokenizer first"))?;
        t.encode_raw(text).map_err(js_err)
    }
}

impl Session {
    /// Run one generation as a promise (the session's models stay borrowed until it settles).
    fn start(&self, ids: Vec<u32>, opts: String, cbs: Callbacks) -> js_sys::Promise {
        let (models, tokenizer) = (Rc::clone(&self.models), Rc::clone(&self.tokenizer));
        let (epoch, started) = (Rc::clone(&self.epoch), self.epoch.get());
        wasm_bindgen_futures::future_to_promise(async move {
            let cancelled = move || epoch.get() != started;
            let out = run(&models, &tokenizer, ids, &opts, &cbs, &cancelled).await.map_err(|e| JsValue::from(js_err(e)))?;
            js_sys::JSON::parse(&out.to_string())
        })
    }
}

/// The JavaScript callbacks of one generation (see [`Session::generate`]).
struct Callbacks {
    on_tokens: Option<js_sys::Function>,
    on_round: Option<js_sys::Function>,
}

/// Prompt ids from JavaScript: a `Uint32Array`, or an array of non-negative integers.
fn token_ids(v: &JsValue) -> Result<Vec<u32>, String> {
    if let Some(a) = v.dyn_ref::<js_sys::Uint32Array>() {
        return Ok(a.to_vec());
    }
    let Some(a) = v.dyn_ref::<js_sys::Array>() else {
        return Err("generate: prompt_ids must be a Uint32Array or an array of token ids".into());
    };
    a.iter()
        .enumerate()
        .map(|(i, x)| match x.as_f64() {
            Some(f) if f >= 0.0 && f.fract() == 0.0 && f <= u32::MAX as f64 => Ok(f as u32),
            _ => Err(format!("generate: prompt_ids[{i}] is {x:?}, expected a non-negative integer token id")),
        })
        .collect()
}

/// Generation options from JavaScript: an object, a JSON string, or `undefined` / `null`.
fn options_text(v: &JsValue) -> Result<String, String> {
    if v.is_undefined() || v.is_null() {
        return Ok("{}".into());
    }
    if let Some(s) = v.as_string() {
        return Ok(s);
    }
    if v.is_object() {
        return js_sys::JSON::stringify(v).map(String::from).map_err(|_| "generate options: the object cannot be converted to JSON".to_string());
    }
    Err(format!("generate options must be an object or a JSON string, got {v:?}"))
}

/// Option keys `generate` understands.
const OPTION_KEYS: [&str; 13] =
    ["method", "budget", "candidates", "max_fanout", "treespark_k", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop", "tree_prep", "lookup"];

/// An error for an unknown option key, suggesting the key it probably meant.
fn unknown_key(k: &str) -> sparkling::Error {
    let norm = |s: &str| s.to_lowercase().replace(['_', '-'], "");
    let guess = match norm(k).as_str() {
        "maxtokens" | "maxnew" | "newtokens" | "ntokens" => Some("max_new_tokens"),
        n => OPTION_KEYS.iter().copied().find(|o| norm(o) == n || (n.len() >= 4 && norm(o).contains(n))),
    };
    let hint = guess.map(|g| format!(" (did you mean `{g}`?)")).unwrap_or_default();
    sparkling::Error::Input(format!("generate: unknown option `{k}`{hint}; options: {}", OPTION_KEYS.join(", ")))
}

fn load_target<B: Backend>(l: &mut Loaded<B>, src: &dyn TensorSource, cfg: TargetConfig) -> sparkling::Result<()> {
    l.models = None;
    l.cost.replace(None);
    l.models = Some(Models::new(Target::load(&l.b, src, cfg, &|_, _| {})?));
    Ok(())
}

fn add_drafter<B: Backend>(l: &mut Loaded<B>, src: &SafetensorsSource, cfg: DrafterConfig) -> sparkling::Result<()> {
    let models = l.models.as_mut().ok_or_else(|| sparkling::Error::Input("load the target before its drafters (load_target or load_target_gguf)".into()))?;
    let d = Drafter::load(&l.b, src, cfg, &models.target.cfg)?;
    models.add_drafter(d);
    Ok(())
}

/// Generation options parsed from the `generate` JSON (defaults as documented there).
fn gen_params(v: &Value, platform: &Platform, default_stop: Vec<u32>) -> sparkling::Result<GenParams> {
    let bad = |k: &str, want: &str| sparkling::Error::Input(format!("generate option `{k}`: expected {want}"));
    let uint = |k: &str, d: usize| -> sparkling::Result<usize> {
        match v.get(k) {
            None | Some(Value::Null) => Ok(d),
            Some(x) => x.as_u64().and_then(|n| usize::try_from(n).ok()).ok_or_else(|| bad(k, "a non-negative integer below 2^32")),
        }
    };
    let float = |k: &str, d: f32| -> sparkling::Result<f32> {
        match v.get(k) {
            None | Some(Value::Null) => Ok(d),
            Some(x) => x.as_f64().map(|f| f as f32).filter(|f| f.is_finite()).ok_or_else(|| bad(k, "a finite number")),
        }
    };
    let Some(obj) = v.as_object() else {
        return Err(sparkling::Error::Input("generate options must be a JSON object (e.g. {\"method\": \"sparkling\"})".into()));
    };
    if let Some(k) = obj.keys().find(|k| !OPTION_KEYS.contains(&k.as_str())) {
        return Err(unknown_key(k));
    }
    let method = match v.get("method") {
        None | Some(Value::Null) => Method::Sparkling,
        Some(Value::String(s)) => Method::parse(s)?,
        Some(_) => return Err(bad("method", "a string")),
    };
    let stop = match v.get("stop") {
        None | Some(Value::Null) => default_stop,
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| bad("stop", "an array of token ids")))
            .collect::<sparkling::Result<_>>()?,
        Some(_) => return Err(bad("stop", "an array of token ids")),
    };
    let defaults = GenParams::new(method, platform).sampling;
    let temperature = float("temperature", defaults.temperature)?;
    let top_p = float("top_p", defaults.top_p)?;
    // Both are finite (`float` refuses NaN and infinities), so plain comparisons suffice.
    if temperature < 0.0 || top_p <= 0.0 || top_p > 1.0 {
        return Err(sparkling::Error::Input(format!("generate options: temperature must be ≥ 0 (got {temperature}) and top_p in (0, 1] (got {top_p})")));
    }
    // `budget`: "auto" (the default: the per-round choice of `--budget auto`) or a number.
    let d = match v.get("budget") {
        None | Some(Value::Null) => GenParams::new(method, platform),
        Some(Value::String(s)) if s == "auto" => GenParams::new(method, platform),
        Some(x) => match x.as_u64().and_then(|n| usize::try_from(n).ok()) {
            Some(n) if n >= 1 => GenParams::new(method, platform).with_budget(BudgetChoice::Fixed(n)),
            _ => return Err(bad("budget", "\"auto\" or an integer ≥ 1 and below 2^32")),
        },
    };
    Ok(GenParams {
        method,
        auto_budget: d.auto_budget.clone(),
        tree: TreeParams {
            budget: d.tree.budget,
            candidates: uint("candidates", d.tree.candidates)?.max(1),
            max_fanout: uint("max_fanout", d.tree.max_fanout)?.max(1),
            treespark_k: uint("treespark_k", d.tree.treespark_k)?.max(1),
            prep: match v.get("tree_prep") {
                None | Some(Value::Null) => TreePrep::Auto,
                Some(Value::String(s)) => TreePrep::parse(s).ok_or_else(|| bad("tree_prep", "\"auto\", \"host\" or \"device\""))?,
                Some(_) => return Err(bad("tree_prep", "\"auto\", \"host\" or \"device\"")),
            },
        },
        sampling: SampleParams { temperature, top_k: uint("top_k", d.sampling.top_k)?, top_p },
        seed: match v.get("seed") {
            None | Some(Value::Null) => d.seed,
            Some(x) => x.as_u64().ok_or_else(|| bad("seed", "a non-negative integer"))?,
        },
        max_new_tokens: uint("max_new_tokens", d.max_new_tokens)?,
        stop,
        lookup: match v.get("lookup") {
            None | Some(Value::Null) => d.lookup,
            Some(_) if method.drafter_kind().is_none() => {
                return Err(bad("lookup", "no `lookup` key for a method without a drafter (method `lookup` takes its chain length from `budget`)"))
            }
            Some(_) => LookupGraft { len: uint("lookup", d.lookup.len)?, skip_drafter: platform.host_memory },
        },
    })
}

/// `"auto"` or the fixed budget.
fn budget_json(p: &GenParams) -> Value {
    if p.auto_budget.is_some() {
        json!("auto")
    } else {
        json!(p.tree.budget)
    }
}

// The models and tokenizer stay borrowed for the whole generation on purpose: loading during
// it fails with `BUSY` instead of swapping the weights under a running round.
#[allow(clippy::await_holding_refcell_ref)]
async fn run(
    models: &RefCell<AnyLoaded>,
    tokenizer: &RefCell<Option<TextTokenizer>>,
    prompt: Vec<u32>,
    options_json: &str,
    cbs: &Callbacks,
    cancelled: &dyn Fn() -> bool,
) -> Result<Value, String> {
    let opts: Value =
        serde_json::from_str(if options_json.trim().is_empty() { "{}" } else { options_json }).map_err(|e| format!("generate options: invalid JSON: {e}"))?;
    let m = models.try_borrow().map_err(|_| BUSY.to_string())?;
    let tok = tokenizer.try_borrow().map_err(|_| BUSY.to_string())?;
    let r = match &*m {
        AnyLoaded::Gpu(l) => generate(l, tok.as_ref(), &prompt, &opts, cbs, cancelled).await,
        AnyLoaded::Cpu(l) => generate(l, tok.as_ref(), &prompt, &opts, cbs, cancelled).await,
    };
    r.map_err(|e| e.to_string())
}

async fn generate<B: Backend>(
    l: &Loaded<B>,
    tok: Option<&TextTokenizer>,
    prompt: &[u32],
    opts: &Value,
    cbs: &Callbacks,
    cancelled: &dyn Fn() -> bool,
) -> sparkling::Result<Value> {
    let models = l.models.as_ref().ok_or_else(|| sparkling::Error::Input("no target loaded: call load_target or load_target_gguf first".into()))?;
    let default_stop = stop_tokens(&models.target.cfg.eos, tok.map_or(&[][..], |t| &t.stop));
    let mut p = gen_params(opts, &Platform::of(&l.b), default_stop)?;
    if let Some(a) = p.auto_budget.as_mut() {
        a.cost = l.cost.borrow().clone().filter(|c| c.max_rows() > p.tree.budget);
    }
    let engine = models.engine(&l.b, p.method)?;
    // The first exception thrown by a callback rejects the promise once the generation ends.
    let thrown: RefCell<Option<String>> = RefCell::new(None);
    // Tokens committed so far (a cancelled run resolves with them) and whether a callback
    // returned `false`.
    let mut so_far: Vec<u32> = Vec::new();
    let stop = Cell::new(false);
    let call = |name: &str, r: Result<JsValue, JsValue>| match r {
        Ok(v) if v == JsValue::FALSE => stop.set(true),
        Ok(_) => {}
        Err(e) => {
            thrown.borrow_mut().get_or_insert_with(|| format!("the {name} callback threw: {}", js_message(&e)));
        }
    };
    // The engine shows a round to `on_round` before `on_tokens` gets its committed tokens; the
    // round's object waits for those (its `committed` count) and goes to JavaScript first.
    let pending: RefCell<Option<js_sys::Object>> = RefCell::new(None);
    let mut round_cb = |r: &RoundView<'_>| {
        if cbs.on_round.is_some() {
            *pending.borrow_mut() = Some(round_object(r, tok));
        }
    };
    let mut cb = |ids: &[u32]| {
        so_far.extend_from_slice(ids);
        if let (Some(f), Some(o)) = (&cbs.on_round, pending.borrow_mut().take()) {
            let _ = js_sys::Reflect::set(&o, &JsValue::from_str("committed"), &JsValue::from(ids.len() as u32));
            call("on_round", f.call1(&JsValue::NULL, &o));
        }
        if let Some(f) = &cbs.on_tokens {
            let text = tok.and_then(|t| t.decode(ids, false).ok()).map(JsValue::from).unwrap_or(JsValue::NULL);
            let arr = js_sys::Uint32Array::from(ids);
            call("on_tokens", f.call2(&JsValue::NULL, &arr, &text));
        }
    };
    // Cancellation drops the engine's future at its next await (a read-back, or the CPU
    // backend's per-round yield); the engine itself has no stop hook.
    let g = {
        let mut fut = std::pin::pin!(engine.generate_observed_async(prompt, &p, &mut cb, &mut round_cb));
        std::future::poll_fn(|cx| {
            if stop.get() || cancelled() {
                return std::task::Poll::Ready(None);
            }
            fut.as_mut().poll(cx).map(Some)
        })
        .await
    };
    if let Some(e) = thrown.into_inner() {
        return Err(sparkling::Error::Input(e));
    }
    let Some(g) = g else {
        let text = tok.and_then(|t| t.decode(&so_far, false).ok());
        return Ok(json!({
            "tokens": so_far,
            "text": text,
            "stopped": false,
            "cancelled": true,
            "tau": null,
            "tokens_per_s": null,
            "rounds": null,
            "prefill_ms": null,
            "decode_ms": null,
            "method": p.method.name(),
            "budget": budget_json(&p),
            "backend": l.b.name(),
        }));
    };
    let g = g?;
    if let Some(c) = &g.cost_model {
        l.cost.replace(Some(c.clone()));
    }
    let text = match tok {
        Some(t) => Some(t.decode(&g.tokens, false)?),
        None => None,
    };
    Ok(json!({
        "tokens": g.tokens,
        "text": text,
        "stopped": g.stopped,
        "cancelled": false,
        "tau": g.stats.tau(),
        "tokens_per_s": g.stats.tokens_per_s(),
        "rounds": g.stats.rounds,
        "prefill_ms": g.stats.prefill_ms,
        "decode_ms": g.stats.decode_ms,
        "method": p.method.name(),
        "budget": budget_json(&p),
        "backend": l.b.name(),
        "tree_sizes": g.stats.tree_sizes,
        "drafts_skipped": g.stats.drafts_skipped,
    }))
}

/// The message of a JavaScript exception (`Error.message`, else the value as text).
fn js_message(e: &JsValue) -> String {
    js_sys::Reflect::get(e, &JsValue::from_str("message")).ok().and_then(|m| m.as_string()).or_else(|| e.as_string()).unwrap_or_else(|| format!("{e:?}"))
}

/// One verified round as the plain object `on_round` receives (documented at
/// [`Session::generate`]; `committed` is added once the round's tokens are known).
fn round_object(r: &RoundView<'_>, tok: Option<&TextTokenizer>) -> js_sys::Object {
    let t = r.tree;
    let text = |id: u32| tok.and_then(|k| k.decode(&[id], true).ok());
    let v = json!({
        "round": r.round,
        "root_pos": r.root_pos,
        "tokens": t.tokens,
        "parents": t.parents.iter().map(|&p| if p == NO_PARENT { -1 } else { i64::from(p) }).collect::<Vec<i64>>(),
        "depths": t.depths,
        "accepted": r.accepted,
        "bonus": r.bonus,
        "drafted": r.drafted,
        "last_token": r.last_token,
        "texts": tok.map(|_| t.tokens.iter().map(|&id| text(id).unwrap_or_default()).collect::<Vec<String>>()),
        "bonus_text": text(r.bonus),
    });
    // serde_json text always parses as JSON; an object that failed would only lack fields.
    js_sys::JSON::parse(&v.to_string()).map(|o| o.unchecked_into::<js_sys::Object>()).unwrap_or_default()
}
