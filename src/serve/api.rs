//! The OpenAI request and error shapes: a request body parsed into what the engine needs, with
//! an error that names the offending field; errors rendered as OpenAI's
//! `{"error": {"message", "type", "param", "code"}}` with the matching HTTP status.

use crate::decode::budget::{BudgetChoice, CostModel};
use crate::decode::{GenParams, Method, Platform};
use crate::tokenizer::{Message, Role};
use serde_json::{json, Value};

/// An error answered to the client.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status (400, 401, 404, 413, 429, 500, 503).
    pub status: u16,
    /// What went wrong, for a person.
    pub message: String,
    /// The request field at fault, if one.
    pub param: Option<String>,
    /// Seconds to wait before retrying (429).
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// A 400 about `param`.
    pub fn bad(param: &str, message: impl Into<String>) -> ApiError {
        ApiError { status: 400, message: message.into(), param: Some(param.to_string()), retry_after: None }
    }

    /// An error of `status` not tied to a field.
    pub fn status(status: u16, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), param: None, retry_after: None }
    }

    /// OpenAI's error type name for the status.
    pub fn kind(&self) -> &'static str {
        match self.status {
            400 | 404 | 413 => "invalid_request_error",
            401 => "authentication_error",
            429 => "rate_limit_error",
            503 => "service_unavailable",
            _ => "server_error",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind(), "param": self.param, "code": self.status}})
    }
}

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`: `messages` through the chat template.
    Chat,
    /// `POST /v1/completions`: a raw `prompt`.
    Completion,
}

/// A parsed generation request.
#[derive(Debug, Clone)]
pub struct GenRequest {
    /// The endpoint.
    pub endpoint: Endpoint,
    /// Chat turns (`Chat`), as (role, text).
    pub messages: Vec<(Role, String)>,
    /// The raw prompt (`Completion`).
    pub prompt: String,
    /// Decoding parameters (stop *tokens* included: the model's end of turn).
    pub params: GenParams,
    /// Stop strings (at most 4), never emitted.
    pub stop: Vec<String>,
    /// Stream server-sent events.
    pub stream: bool,
    /// Add a `usage` chunk before `[DONE]` when streaming.
    pub include_usage: bool,
    /// The `model` the client named (echoed back).
    pub model: Option<String>,
}

impl GenRequest {
    /// The chat turns as template messages.
    pub fn template_messages(&self) -> Vec<Message<'_>> {
        self.messages.iter().map(|(role, content)| Message { role: *role, content }).collect()
    }
}

/// What the server fills in where a request is silent.
#[derive(Debug, Clone)]
pub struct Defaults {
    /// Method of every request that names none.
    pub method: Method,
    /// Tree budget (`auto` or a fixed node count).
    pub budget: BudgetChoice,
    /// `max_tokens` when the request gives none.
    pub max_tokens: usize,
    /// The most `max_tokens` a request may ask for.
    pub max_tokens_cap: usize,
    /// The model's stop tokens (end of sequence, end of turn).
    pub stop_tokens: Vec<u32>,
    /// The backend's platform (default budgets and lookup graft).
    pub platform: Platform,
    /// The `--budget auto` cost model measured at start (`None`: each request measures one).
    pub cost: Option<CostModel>,
}

fn obj_field<'v>(v: &'v Value, k: &str) -> Option<&'v Value> {
    v.get(k).filter(|x| !x.is_null())
}

fn num(v: &Value, k: &str) -> Result<Option<f64>, ApiError> {
    match obj_field(v, k) {
        None => Ok(None),
        Some(x) => x.as_f64().map(Some).ok_or_else(|| ApiError::bad(k, format!("`{k}` must be a number"))),
    }
}

fn uint(v: &Value, k: &str) -> Result<Option<u64>, ApiError> {
    match obj_field(v, k) {
        None => Ok(None),
        Some(x) => x.as_u64().map(Some).ok_or_else(|| ApiError::bad(k, format!("`{k}` must be a whole number"))),
    }
}

/// Parse a request `body` (JSON) for `endpoint` under `d`. Unknown fields are ignored.
/// Errors: 400 naming the field (malformed JSON, wrong types, out-of-range values, `n` ≠ 1,
/// more than 4 stop strings, an empty conversation).
pub fn parse(endpoint: Endpoint, body: &[u8], d: &Defaults) -> Result<GenRequest, ApiError> {
    let text = std::str::from_utf8(body).map_err(|e| ApiError::status(400, format!("the request body is not UTF-8: {e}")))?;
    let v: Value = serde_json::from_str(text).map_err(|e| ApiError::status(400, format!("the request body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::status(400, "the request body must be a JSON object"));
    }
    let (mut messages, mut prompt) = (Vec::new(), String::new());
    match endpoint {
        Endpoint::Chat => {
            let list = obj_field(&v, "messages").and_then(Value::as_array).ok_or_else(|| ApiError::bad("messages", "`messages` must be a non-empty array"))?;
            for (i, m) in list.iter().enumerate() {
                let role = match m.get("role").and_then(Value::as_str) {
                    Some("system") | Some("developer") => Role::System,
                    Some("user") => Role::User,
                    Some("assistant") => Role::Assistant,
                    Some(other) => return Err(ApiError::bad("messages", format!("messages[{i}].role \"{other}\": expected system, user or assistant"))),
                    None => return Err(ApiError::bad("messages", format!("messages[{i}] needs a string `role` (system, user or assistant)"))),
                };
                let content = match m.get("content") {
                    Some(Value::String(s)) => s.clone(),
                    // Content parts: the text parts, concatenated.
                    Some(Value::Array(parts)) => parts
                        .iter()
                        .map(|p| {
                            p.get("text")
                                .and_then(Value::as_str)
                                .ok_or_else(|| ApiError::bad("messages", format!("messages[{i}].content: only text parts are supported")))
                        })
                        .collect::<Result<Vec<_>, _>>()?
                        .concat(),
                    Some(Value::Null) | None if role == Role::Assistant => String::new(),
                    _ => return Err(ApiError::bad("messages", format!("messages[{i}].content must be a string"))),
                };
                messages.push((role, content));
            }
            if !messages.iter().any(|(r, _)| *r != Role::System) {
                return Err(ApiError::bad("messages", "`messages` needs at least one user or assistant message"));
            }
        }
        Endpoint::Completion => {
            prompt = match obj_field(&v, "prompt") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => a[0].as_str().unwrap_or_default().to_string(),
                Some(Value::Array(_)) => {
                    return Err(ApiError::bad("prompt", "`prompt` must be one string (a batch of prompts is not supported: send one request each)"))
                }
                _ => return Err(ApiError::bad("prompt", "`prompt` must be a string")),
            };
            if prompt.is_empty() {
                return Err(ApiError::bad("prompt", "`prompt` is empty"));
            }
        }
    }
    if let Some(n) = uint(&v, "n")? {
        if n != 1 {
            return Err(ApiError::bad("n", format!("`n` = {n}: this server returns one choice per request (n = 1)")));
        }
    }
    // The per-request extension: `"sparkling": {"method": "ar", "budget": "auto" | 8}`.
    let ext = obj_field(&v, "sparkling");
    let method = match ext.and_then(|e| obj_field(e, "method")) {
        None => d.method,
        Some(Value::String(s)) => Method::parse(s).map_err(|e| ApiError::bad("sparkling.method", e.to_string()))?,
        Some(_) => return Err(ApiError::bad("sparkling.method", "`sparkling.method` must be a string")),
    };
    let budget = match ext.and_then(|e| obj_field(e, "budget")) {
        None => d.budget,
        Some(Value::String(s)) => BudgetChoice::parse(s, "sparkling.budget").map_err(|e| ApiError::bad("sparkling.budget", e.to_string()))?,
        Some(x) => match x.as_u64() {
            Some(n) if n >= 1 => BudgetChoice::Fixed(n as usize),
            _ => return Err(ApiError::bad("sparkling.budget", "`sparkling.budget` must be \"auto\" or a positive integer")),
        },
    };
    let mut params = GenParams::new(method, &d.platform).with_budget(budget);
    let max_tokens = match (uint(&v, "max_completion_tokens")?, uint(&v, "max_tokens")?) {
        (Some(n), _) | (None, Some(n)) => n as usize,
        (None, None) => d.max_tokens,
    };
    if max_tokens == 0 || max_tokens > d.max_tokens_cap {
        return Err(ApiError::bad("max_tokens", format!("`max_tokens` = {max_tokens}: expected 1 ..= {} (the server's cap)", d.max_tokens_cap)));
    }
    params.max_new_tokens = max_tokens;
    if let Some(t) = num(&v, "temperature")? {
        if !(0.0..=2.0).contains(&t) {
            return Err(ApiError::bad("temperature", format!("`temperature` = {t}: expected 0 ..= 2")));
        }
        params.sampling.temperature = t as f32;
    }
    if let Some(p) = num(&v, "top_p")? {
        if !(p > 0.0 && p <= 1.0) {
            return Err(ApiError::bad("top_p", format!("`top_p` = {p}: expected (0, 1]")));
        }
        params.sampling.top_p = p as f32;
    }
    if let Some(k) = uint(&v, "top_k")? {
        params.sampling.top_k = k as usize;
    }
    // Without a seed, a sampled request draws its own (OpenAI's behaviour: another call, another
    // sample); with one, the same seed gives the same text alone or under load.
    params.seed = match obj_field(&v, "seed") {
        Some(s) => s.as_u64().or_else(|| s.as_i64().map(|x| x as u64)).ok_or_else(|| ApiError::bad("seed", "`seed` must be an integer"))?,
        None if params.sampling.temperature > 0.0 => fresh_seed(),
        None => params.seed,
    };
    let stop: Vec<String> = match obj_field(&v, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_string).ok_or_else(|| ApiError::bad("stop", "`stop` must be a string or an array of strings")))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::bad("stop", "`stop` must be a string or an array of strings")),
    };
    if stop.len() > 4 {
        return Err(ApiError::bad("stop", format!("`stop` has {} strings: at most 4", stop.len())));
    }
    params.stop = d.stop_tokens.clone();
    if let Some(a) = params.auto_budget.as_mut() {
        a.cost = d.cost.clone();
    }
    params.validate().map_err(|e| ApiError::status(400, e.to_string()))?;
    let stream = match obj_field(&v, "stream") {
        None => false,
        Some(x) => x.as_bool().ok_or_else(|| ApiError::bad("stream", "`stream` must be a boolean"))?,
    };
    let include_usage = obj_field(&v, "stream_options").and_then(|o| obj_field(o, "include_usage")).and_then(Value::as_bool).unwrap_or(false);
    let model = obj_field(&v, "model").and_then(Value::as_str).map(str::to_string);
    Ok(GenRequest { endpoint, messages, prompt, params, stop, stream, include_usage, model })
}

/// A seed for a sampled request that gave none: std's per-instance random hasher keys
/// (fresh OS randomness per process, a new key per call), so calls differ.
fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new().build_hasher().finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d() -> Defaults {
        Defaults {
            method: Method::Sparkling,
            budget: BudgetChoice::Auto,
            max_tokens: 16,
            max_tokens_cap: 100,
            stop_tokens: vec![2],
            platform: Platform::HOST,
            cost: None,
        }
    }

    #[test]
    fn parses_the_openai_fields_and_the_extension() {
        let body = br#"{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],
            "max_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":40,"seed":3,"stop":["\n"],"stream":true,
            "stream_options":{"include_usage":true},"sparkling":{"method":"ddtree","budget":8},"unknown":1}"#;
        let r = parse(Endpoint::Chat, body, &d()).unwrap();
        assert_eq!(r.messages, vec![(Role::System, "be brief".to_string()), (Role::User, "hi".to_string())]);
        assert_eq!((r.params.max_new_tokens, r.params.seed, r.params.sampling.top_k), (7, 3, 40));
        assert_eq!((r.params.method, r.params.tree.budget, r.params.auto_budget.is_none()), (Method::DDTree, 8, true));
        assert_eq!(r.params.stop, vec![2]);
        assert!(r.stream && r.include_usage);
        assert_eq!(r.stop, vec!["\n".to_string()]);
    }

    /// A sampled request without a seed draws its own (two calls differ); a greedy one keeps
    /// the default; any u64 seed is taken as given.
    #[test]
    fn seeds_are_drawn_only_when_sampling_without_one() {
        let seed = |body: &[u8]| parse(Endpoint::Chat, body, &d()).unwrap().params.seed;
        let (a, b) = (
            seed(br#"{"messages":[{"role":"user","content":"hi"}],"temperature":1}"#),
            seed(br#"{"messages":[{"role":"user","content":"hi"}],"temperature":1}"#),
        );
        assert_ne!(a, b, "two sampled requests without a seed drew the same one");
        assert_eq!(seed(br#"{"messages":[{"role":"user","content":"hi"}]}"#), GenParams::new(Method::Sparkling, &Platform::HOST).seed);
        assert_eq!(seed(br#"{"messages":[{"role":"user","content":"hi"}],"temperature":1,"seed":18446744073709551615}"#), u64::MAX);
        assert_eq!(seed(br#"{"messages":[{"role":"user","content":"hi"}],"temperature":1,"seed":-1}"#), u64::MAX);
        let e = parse(Endpoint::Chat, br#"{"messages":[{"role":"wizard","content":"hi"}]}"#, &d()).unwrap_err();
        assert!(e.message.contains("role \"wizard\"") && !e.message.contains("Some("), "{e:?}");
    }

    #[test]
    fn errors_name_the_field() {
        let cases: [(&[u8], &str); 8] = [
            (br#"{"messages":[{"role":"user","content":"hi"}],"n":2}"#, "n"),
            (br#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":0}"#, "max_tokens"),
            (br#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":1000}"#, "max_tokens"),
            (br#"{"messages":[{"role":"user","content":"hi"}],"temperature":"hot"}"#, "temperature"),
            (br#"{"messages":[{"role":"user","content":"hi"}],"stop":["a","b","c","d","e"]}"#, "stop"),
            (br#"{"messages":[{"role":"robot","content":"hi"}]}"#, "messages"),
            (br#"{"messages":[]}"#, "messages"),
            (br#"{"messages":[{"role":"user","content":"hi"}],"sparkling":{"method":"magic"}}"#, "sparkling.method"),
        ];
        for (body, field) in cases {
            let e = parse(Endpoint::Chat, body, &d()).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (400, Some(field)), "{}", e.message);
        }
        for body in [&b"{\"messages\": ["[..], b"\xff\xfe", b"[1,2]"] {
            assert_eq!(parse(Endpoint::Chat, body, &d()).unwrap_err().status, 400);
        }
        assert_eq!(parse(Endpoint::Completion, br#"{"prompt":["a","b"]}"#, &d()).unwrap_err().param.as_deref(), Some("prompt"));
    }
}
