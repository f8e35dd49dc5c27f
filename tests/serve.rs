//! `sparkling serve` over loopback on a tiny random target with a character-level tokenizer:
//! every endpoint, streaming and not, the error statuses, stop strings across token
//! boundaries, cancellation when a client disconnects, concurrent requests each equal to its
//! `generate` output (T = 0) and seed-reproducible (T > 0), and (through the binary) the drain
//! on SIGTERM.

mod common;

use common::*;
use serde_json::{json, Value};
use sparkling::cpu::CpuBackend;
use sparkling::decode::budget::BudgetChoice;
use sparkling::decode::{stop_tokens, GenParams, Method, Models, Platform};
use sparkling::model::config::{Arch, DrafterKind};
use sparkling::serve::{ServeModel, ServeOptions};
use sparkling::tokenizer::{Message, Role, TextStream, TextTokenizer};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

const VOCAB: usize = 128;

/// A character-level tokenizer: printable ASCII (ids 0..95), then `<|im_start|>` (95) and
/// `<|im_end|>` (96) as special tokens; ids ≥ 97 decode to nothing.
fn tokenizer_json() -> String {
    let vocab: serde_json::Map<String, Value> = (32u8..127).map(|c| ((c as char).to_string(), json!(c - 32))).collect();
    let added =
        |id: u32, s: &str| json!({"id": id, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true});
    json!({"version": "1.0", "added_tokens": [added(95, "<|im_start|>"), added(96, "<|im_end|>")], "normalizer": null, "pre_tokenizer": null,
           "post_processor": null, "decoder": {"type": "Fuse"}, "model": {"type": "BPE", "vocab": vocab, "merges": []}})
    .to_string()
}

struct Fixture {
    _dirs: (tempfile::TempDir, tempfile::TempDir),
    target_dir: std::path::PathBuf,
    drafter_dir: std::path::PathBuf,
}

fn fixture() -> Fixture {
    let (td, dd) = (tmpdir("serve-target"), tmpdir("serve-dspark"));
    let t = random_target(td.path(), Arch::Llama, VOCAB, 11);
    write_drafter(dd.path(), &t.cfg, DrafterKind::DSpark, 8, 12);
    std::fs::write(td.path().join("tokenizer.json"), tokenizer_json()).unwrap();
    Fixture { target_dir: td.path().to_path_buf(), drafter_dir: dd.path().to_path_buf(), _dirs: (td, dd) }
}

fn models(f: &Fixture) -> (Models<CpuBackend>, TextTokenizer) {
    let b = CpuBackend::new();
    let t = load_target(&b, &f.target_dir);
    let d = load_drafter(&b, &f.drafter_dir, &t.cfg);
    let mut m = Models::new(t);
    m.add_drafter(d);
    (m, TextTokenizer::from_dir(&f.target_dir).unwrap())
}

/// Start the server in this process; returns its address.
fn start(f: &Fixture, opts: ServeOptions) -> SocketAddr {
    let (target_dir, drafter_dir) = (f.target_dir.clone(), f.drafter_dir.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let loader = move || {
            let fx = Fixture { _dirs: (tmpdir("unused-a"), tmpdir("unused-b")), target_dir, drafter_dir };
            let (models, tokenizer) = models(&fx);
            Ok(ServeModel { backend: CpuBackend::new(), models, tokenizer, cost: None })
        };
        let r = sparkling::serve::run(opts, loader, Box::new(|_| {}), Box::new(move |a| tx.send(a).unwrap()));
        r.expect("server");
    });
    let addr = rx.recv_timeout(Duration::from_secs(30)).expect("bound");
    let t0 = Instant::now();
    while http(addr, "GET", "/health", None, &[]).0 != 200 {
        assert!(t0.elapsed() < Duration::from_secs(60), "never ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    addr
}

/// One HTTP/1.1 request (`Connection: close`): status, headers (lower-case names), body.
fn http(addr: SocketAddr, method: &str, path: &str, body: Option<&[u8]>, headers: &[(&str, &str)]) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        req.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", b.len()));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    if let Some(b) = body {
        s.write_all(b).unwrap();
    }
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("header end");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.lines();
    let status: u16 = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string())).collect();
    let mut body = raw[split + 4..].to_vec();
    if headers.iter().any(|(k, v)| k == "transfer-encoding" && v == "chunked") {
        body = dechunk(&body);
    }
    (status, headers, body)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(nl) = b.windows(2).position(|w| w == b"\r\n") {
        let n = usize::from_str_radix(std::str::from_utf8(&b[..nl]).unwrap().trim(), 16).unwrap();
        if n == 0 {
            break;
        }
        out.extend_from_slice(&b[nl + 2..nl + 2 + n]);
        b = &b[nl + 2 + n + 2..];
    }
    out
}

fn post(addr: SocketAddr, path: &str, v: &Value) -> (u16, Value) {
    let (st, _, body) = http(addr, "POST", path, Some(v.to_string().as_bytes()), &[]);
    (st, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// The `data:` payloads of a server-sent event stream.
fn events(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body).split("\n\n").filter_map(|e| e.strip_prefix("data: ")).map(str::to_string).collect()
}

/// What `generate` gives for `messages` under the server's defaults (method sparkling, budget
/// auto or `budget`), as text.
fn reference(f: &Fixture, messages: &[Message<'_>], max_tokens: usize, temperature: f32, seed: u64) -> String {
    let (m, tok) = models(f);
    let b = CpuBackend::new();
    let mut p = GenParams::new(Method::Sparkling, &Platform::HOST).with_budget(BudgetChoice::Auto);
    p.max_new_tokens = max_tokens;
    p.sampling.temperature = temperature;
    p.seed = seed;
    p.stop = stop_tokens(&m.target.cfg.eos, &tok.stop);
    let prompt = tok.encode_messages(messages).unwrap();
    let g = m.engine(&b, Method::Sparkling).unwrap().generate(&prompt, &p, &mut |_| {}).unwrap();
    let mut ts = TextStream::new();
    ts.push(&tok, &g.tokens).unwrap() + &ts.finish(&tok).unwrap()
}

fn opts() -> ServeOptions {
    ServeOptions { port: 0, max_batch: 4, max_queue: 64, default_max_tokens: 24, max_tokens_cap: 4000, ..ServeOptions::default() }
}

fn chat_body(user: &str, max_tokens: usize) -> Value {
    json!({"model": "tiny", "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": user}], "max_tokens": max_tokens})
}

#[test]
fn endpoints_answer_in_the_openai_shapes() {
    let f = fixture();
    let addr = start(&f, opts());
    let (st, _, body) = http(addr, "GET", "/v1/models", None, &[]);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((st, v["object"].as_str(), v["data"][0]["object"].as_str()), (200, Some("list"), Some("model")));

    // Chat, whole: the text equals `generate`'s on the same conversation.
    let msgs = [Message { role: Role::System, content: "sys" }, Message { role: Role::User, content: "hello there" }];
    let want = reference(&f, &msgs, 20, 0.0, 0);
    let (st, v) = post(addr, "/v1/chat/completions", &chat_body("hello there", 20));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"].as_str().unwrap(), want);
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let usage = &v["usage"];
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 5);
    assert!(usage["completion_tokens"].as_u64().unwrap() >= 1);
    assert_eq!(usage["total_tokens"].as_u64(), Some(usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()));
    assert!(usage["speculation"]["rounds"].as_u64().is_some(), "{usage}");

    // Chat, streamed: role chunk, content chunks whose concatenation is the same text, the
    // finish chunk, the usage chunk, [DONE].
    let mut b = chat_body("hello there", 20);
    b["stream"] = json!(true);
    b["stream_options"] = json!({"include_usage": true});
    let (st, headers, body) = http(addr, "POST", "/v1/chat/completions", Some(b.to_string().as_bytes()), &[]);
    assert_eq!(st, 200);
    assert!(headers.iter().any(|(k, v)| k == "content-type" && v.starts_with("text/event-stream")));
    let ev = events(&body);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = ev[..ev.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, want);
    let finish = chunks.iter().filter_map(|c| c["choices"][0]["finish_reason"].as_str()).collect::<Vec<_>>();
    assert_eq!(finish.len(), 1);
    assert!(chunks.last().unwrap()["usage"]["completion_tokens"].as_u64().is_some());

    // Completions, whole and streamed.
    let (st, v) = post(addr, "/v1/completions", &json!({"prompt": "abc", "max_tokens": 12}));
    assert_eq!((st, v["object"].as_str()), (200, Some("text_completion")), "{v}");
    let whole = v["choices"][0]["text"].as_str().unwrap().to_string();
    let (_, _, body) = http(addr, "POST", "/v1/completions", Some(json!({"prompt": "abc", "max_tokens": 12, "stream": true}).to_string().as_bytes()), &[]);
    let ev = events(&body);
    let text: String =
        ev[..ev.len() - 1].iter().map(|e| serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"].as_str().unwrap().to_string()).collect();
    assert_eq!(text, whole);

    // /metrics: Prometheus text with the shared speculation counter names.
    let (st, _, body) = http(addr, "GET", "/metrics", None, &[]);
    let m = String::from_utf8(body).unwrap();
    assert_eq!(st, 200);
    for name in [
        "sparkling:spec_decode_num_drafts_total",
        "sparkling:spec_decode_num_accepted_tokens_total",
        "sparkling:time_to_first_token_seconds_count",
        "sparkling:requests_total{status=\"200\"}",
    ] {
        assert!(m.contains(name), "{name} missing from\n{m}");
    }
}

#[test]
fn errors_have_the_right_status_and_shape() {
    let f = fixture();
    let addr = start(&f, ServeOptions { api_key: Some("k3y".into()), max_body_bytes: 8192, ..opts() });
    let auth = [("Authorization", "Bearer k3y")];
    let call = |path: &str, body: &[u8], h: &[(&str, &str)]| {
        let (st, headers, b) = http(addr, "POST", path, Some(body), h);
        (st, headers, serde_json::from_slice::<Value>(&b).unwrap_or(Value::Null))
    };
    let ok = chat_body("hi", 4).to_string();
    let (st, _, v) = call("/v1/chat/completions", ok.as_bytes(), &[]);
    assert_eq!((st, v["error"]["type"].as_str()), (401, Some("authentication_error")));
    let (st, _, _) = call("/v1/chat/completions", ok.as_bytes(), &[("Authorization", "Bearer wrong")]);
    assert_eq!(st, 401);
    assert_eq!(call("/v1/chat/completions", ok.as_bytes(), &auth).0, 200);
    // The scheme name is case-insensitive.
    assert_eq!(call("/v1/chat/completions", ok.as_bytes(), &[("Authorization", "bearer k3y")]).0, 200);
    // /health needs no key.
    assert_eq!(http(addr, "GET", "/health", None, &[]).0, 200);
    for (body, param) in [
        (&b"{\"messages\": [{\"role\": \"user\""[..], None),
        (b"\xff\xfe\x00", None),
        (br#"{"messages":[{"role":"user","content":"hi"}],"n":3}"#, Some("n")),
        (br#"{"messages":[{"role":"user","content":5}]}"#, Some("messages")),
        (br#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":100000}"#, Some("max_tokens")),
    ] {
        let (st, _, v) = call("/v1/chat/completions", body, &auth);
        assert_eq!(st, 400, "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p);
        }
    }
    // A prompt over the context (4 096 positions) is a 400 from the engine's own check.
    let (st, _, v) = call("/v1/completions", json!({"prompt": "y".repeat(4100), "max_tokens": 4}).to_string().as_bytes(), &auth);
    assert_eq!(st, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("context"), "{v}");
    // Too large a body: 413.
    let (st, _, v) = call("/v1/completions", json!({"prompt": "z".repeat(20_000)}).to_string().as_bytes(), &auth);
    assert_eq!((st, v["error"]["code"].as_u64()), (413, Some(413)), "{v}");
    // An unknown route: 404 in the same shape.
    let (st, _, body) = http(addr, "GET", "/v1/nothing", None, &auth);
    assert_eq!(st, 404);
    assert!(serde_json::from_slice::<Value>(&body).unwrap()["error"]["message"].as_str().unwrap().contains("/v1/nothing"));
    // A known route with the wrong method: 405 in the same shape, with Allow.
    let (st, headers, body) = http(addr, "GET", "/v1/chat/completions", None, &auth);
    assert_eq!(st, 405);
    assert!(headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("allow") && v == "POST"), "{headers:?}");
    assert!(serde_json::from_slice::<Value>(&body).unwrap()["error"]["message"].as_str().unwrap().contains("use POST"));
    // Response ids differ across requests and carry a per-process random part.
    let (_, _, a) = call("/v1/chat/completions", ok.as_bytes(), &auth);
    let (_, _, b) = call("/v1/chat/completions", ok.as_bytes(), &auth);
    assert_ne!(a["id"], b["id"]);
    assert!(a["id"].as_str().unwrap().len() > "chatcmpl-".len() + 16, "{}", a["id"]);
}

#[test]
fn stop_strings_are_cut_across_token_boundaries() {
    let f = fixture();
    let addr = start(&f, opts());
    // The free text first; then a stop string made of characters it emits at positions 3..5
    // (two tokens), so the stop spans a token boundary.
    let (_, v) = post(addr, "/v1/completions", &json!({"prompt": "hello", "max_tokens": 40}));
    let free = v["choices"][0]["text"].as_str().unwrap().to_string();
    let chars: Vec<char> = free.chars().collect();
    assert!(chars.len() >= 6, "the random target's text is too short to test: {free:?}");
    let stop: String = chars[3..5].iter().collect();
    let first = free.find(&stop).unwrap();
    for stream in [false, true] {
        let body = json!({"prompt": "hello", "max_tokens": 40, "stop": [stop.clone(), "never-seen"], "stream": stream});
        let (st, _, raw) = http(addr, "POST", "/v1/completions", Some(body.to_string().as_bytes()), &[]);
        assert_eq!(st, 200);
        let (text, finish) = if stream {
            let ev = events(&raw);
            let c: Vec<Value> = ev[..ev.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
            (
                c.iter().map(|x| x["choices"][0]["text"].as_str().unwrap_or("").to_string()).collect::<String>(),
                c.last().unwrap()["choices"][0]["finish_reason"].clone(),
            )
        } else {
            let v: Value = serde_json::from_slice(&raw).unwrap();
            (v["choices"][0]["text"].as_str().unwrap().to_string(), v["choices"][0]["finish_reason"].clone())
        };
        assert_eq!(text, free[..first], "stream {stream}");
        assert_eq!(finish, "stop");
    }
    // A stop string is a normal finish, not a cancellation.
    assert_eq!(metric(addr, "sparkling:requests_cancelled_total "), 0.0);
}

#[test]
fn concurrent_requests_equal_generate_and_a_disconnect_cancels() {
    let f = fixture();
    let addr = start(&f, opts());
    let users = ["one", "two two", "three three three", "four", "five five", "six"];
    let handles: Vec<_> = users
        .iter()
        .enumerate()
        .map(|(i, u)| {
            let (u, t) = (u.to_string(), if i % 2 == 0 { 0.0 } else { 0.8 });
            std::thread::spawn(move || {
                let mut b = chat_body(&u, 16);
                b["temperature"] = json!(t);
                b["seed"] = json!(i);
                let (st, v) = post(addr, "/v1/chat/completions", &b);
                assert_eq!(st, 200, "{v}");
                (u, t, i as u64, v["choices"][0]["message"]["content"].as_str().unwrap().to_string())
            })
        })
        .collect();
    for h in handles {
        let (u, t, seed, got) = h.join().unwrap();
        let msgs = [Message { role: Role::System, content: "sys" }, Message { role: Role::User, content: &u }];
        assert_eq!(got, reference(&f, &msgs, 16, t, seed), "request {u:?} at T = {t}");
    }
    // A streaming client that reads the first event and leaves: its sequence is cancelled and
    // nothing stays in flight.
    let mut s = TcpStream::connect(addr).unwrap();
    // One token per step, as long as the context allows: it cannot finish before the client
    // leaves.
    let body = json!({"prompt": "go", "max_tokens": 4000, "stream": true, "sparkling": {"method": "ar"}}).to_string();
    write!(s, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).unwrap();
    let head = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    drop(s);
    let t0 = Instant::now();
    loop {
        let (_, _, m) = http(addr, "GET", "/metrics", None, &[]);
        let m = String::from_utf8(m).unwrap();
        let value = |name: &str| m.lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()).and_then(|x| x.parse::<f64>().ok());
        if value("sparkling:num_requests_running ") == Some(0.0) && value("sparkling:requests_cancelled_total ").unwrap_or(0.0) >= 1.0 {
            break;
        }
        let lines: Vec<&str> = m.lines().filter(|l| l.contains("running") || l.contains("cancelled") || l.contains("generation_tokens")).collect();
        assert!(t0.elapsed() < Duration::from_secs(30), "the disconnected request was not cancelled: {lines:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A full queue answers 429 with Retry-After; the requests in flight are unaffected.
#[test]
fn a_full_queue_is_429() {
    let f = fixture();
    let addr = start(&f, ServeOptions { max_batch: 1, max_queue: 1, ..opts() });
    let long = || json!({"prompt": "q", "max_tokens": 3000, "sparkling": {"method": "ar"}});
    let metric = |name: &str| -> f64 {
        let (_, _, m) = http(addr, "GET", "/metrics", None, &[]);
        String::from_utf8(m).unwrap().lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()).and_then(|x| x.parse().ok()).unwrap_or(-1.0)
    };
    let a = std::thread::spawn(move || post(addr, "/v1/completions", &long()).0);
    let t0 = Instant::now();
    while metric("sparkling:num_requests_running ") < 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(5));
    }
    let b = std::thread::spawn(move || post(addr, "/v1/completions", &long()).0);
    while metric("sparkling:num_requests_waiting ") < 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(30), "the second request never queued");
        std::thread::sleep(Duration::from_millis(5));
    }
    let (st, headers, body) = http(addr, "POST", "/v1/completions", Some(long().to_string().as_bytes()), &[]);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((st, v["error"]["type"].as_str()), (429, Some("rate_limit_error")), "{v}");
    assert!(headers.iter().any(|(k, v)| k == "retry-after" && v == "1"), "{headers:?}");
    assert_eq!((a.join().unwrap(), b.join().unwrap()), (200, 200));
}

/// The value of the `/metrics` sample that starts with `name` (`-1` when absent).
fn metric(addr: SocketAddr, name: &str) -> f64 {
    let (_, _, m) = http(addr, "GET", "/metrics", None, &[]);
    String::from_utf8(m).unwrap().lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()).and_then(|x| x.parse().ok()).unwrap_or(-1.0)
}

fn cached(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or_else(|| panic!("no cached_tokens in {v}"))
}

/// Prefix reuse: a request sharing a system prompt with an earlier one, and the next turn of a
/// conversation, report the prompt tokens they reused in `usage` and `/metrics`, and answer
/// exactly what `generate` answers (T = 0, and T > 0 with a seed), streamed too.
#[test]
fn a_shared_prefix_is_reused_and_the_answer_is_unchanged() {
    let f = fixture();
    let addr = start(&f, opts());
    let sys = "You are a terse assistant. Answer in one line, without greetings.";
    let body = |turns: &[(&str, &str)], t: f64, seed: u64| -> Value {
        let mut m = vec![json!({"role": "system", "content": sys})];
        m.extend(turns.iter().map(|(r, c)| json!({"role": r, "content": c})));
        json!({"messages": m, "max_tokens": 12, "temperature": t, "seed": seed})
    };
    let want = |turns: &[(&str, &str)], t: f32, seed: u64| -> String {
        let role = |r: &str| if r == "user" { Role::User } else { Role::Assistant };
        let mut m = vec![Message { role: Role::System, content: sys }];
        m.extend(turns.iter().map(|(r, c)| Message { role: role(r), content: c }));
        reference(&f, &m, 12, t, seed)
    };
    let (st, first) = post(addr, "/v1/chat/completions", &body(&[("user", "first question")], 0.0, 0));
    assert_eq!((st, cached(&first)), (200, 0), "{first}");
    let answer = first["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let mut reused = 0;
    for (t, seed) in [(0.0, 0), (0.9, 7)] {
        // The same system prompt, another question.
        let (st, v) = post(addr, "/v1/chat/completions", &body(&[("user", "second question")], t, seed));
        assert_eq!(st, 200, "{v}");
        let n = cached(&v);
        assert!(n as usize > sys.len(), "{v}");
        assert!(n < v["usage"]["prompt_tokens"].as_u64().unwrap());
        assert_eq!(v["choices"][0]["message"]["content"].as_str().unwrap(), want(&[("user", "second question")], t as f32, seed), "T = {t}");
        reused += n;
    }
    // The next turn of the first conversation reuses its first turn, streamed with usage.
    let turns = [("user", "first question"), ("assistant", answer.as_str()), ("user", "and then?")];
    let mut b = body(&turns, 0.0, 0);
    b["stream"] = json!(true);
    b["stream_options"] = json!({"include_usage": true});
    let (st, _, raw) = http(addr, "POST", "/v1/chat/completions", Some(b.to_string().as_bytes()), &[]);
    assert_eq!(st, 200);
    let ev = events(&raw);
    let chunks: Vec<Value> = ev[..ev.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, want(&turns, 0.0, 0));
    let n = cached(chunks.last().unwrap());
    assert!(n >= first["usage"]["prompt_tokens"].as_u64().unwrap(), "the whole first prompt: {n}");
    reused += n;
    assert_eq!(metric(addr, "sparkling:prompt_tokens_cached_total "), reused as f64);
    assert_eq!(metric(addr, "sparkling:prefix_cache_hits_total "), reused as f64);
    assert!(metric(addr, "sparkling:prefix_cache_bytes ") > 0.0);
}

/// Under a budget that holds one conversation, a second one evicts the first; a budget of 0
/// reuses nothing.
#[test]
fn the_prefix_cache_evicts_under_its_budget_and_zero_disables_it() {
    let f = fixture();
    let ask = |addr: SocketAddr, c: &str| -> u64 {
        let (st, v) = post(addr, "/v1/completions", &json!({"prompt": c.repeat(40), "max_tokens": 6}));
        assert_eq!(st, 200, "{v}");
        cached(&v)
    };
    // One request's entry, measured.
    let addr = start(&f, opts());
    assert_eq!(ask(addr, "a"), 0);
    let one = metric(addr, "sparkling:prefix_cache_bytes ");
    assert!(one > 0.0);
    assert_eq!(ask(addr, "a"), 39);
    let addr = start(&f, ServeOptions { prefix_cache_bytes: (one * 1.5) as usize, ..opts() });
    assert_eq!(ask(addr, "a"), 0);
    assert_eq!(ask(addr, "b"), 0);
    assert!(metric(addr, "sparkling:prefix_cache_evictions_total ") >= 1.0);
    assert_eq!(metric(addr, "sparkling:prefix_cache_entries "), 1.0);
    assert_eq!(ask(addr, "a"), 0, "evicted");
    assert_eq!(ask(addr, "a"), 39, "kept again");
    let addr = start(&f, ServeOptions { prefix_cache_bytes: 0, ..opts() });
    assert_eq!((ask(addr, "a"), ask(addr, "a")), (0, 0));
    assert_eq!(metric(addr, "sparkling:prefix_cache_bytes "), 0.0);
    assert_eq!(metric(addr, "sparkling:prompt_tokens_cached_total "), 0.0);
}

/// Send `raw` bytes as a whole request and read the answer (`None`: the server closed the
/// connection without one).
fn raw_request(addr: SocketAddr, raw: &[u8]) -> Option<(u16, Value)> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = s.write_all(raw);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    if out.is_empty() {
        return None;
    }
    let (st, _, body) = parse_response(&out);
    Some((st, serde_json::from_slice(&body).unwrap_or(Value::Null)))
}

/// Bad input: malformed, truncated and mistyped JSON, invalid UTF-8, bodies shorter than they
/// announce, and huge bodies each get a 4xx in OpenAI's error shape (413 for the huge ones),
/// and the server answers the next request as before.
#[test]
fn bad_bodies_get_a_clear_4xx_and_change_nothing() {
    let f = fixture();
    let addr = start(&f, ServeOptions { max_body_bytes: 64 << 10, ..opts() });
    let want = reference(&f, &[Message { role: Role::User, content: "ok" }], 6, 0.0, 0);
    let good = json!({"messages": [{"role": "user", "content": "ok"}], "max_tokens": 6}).to_string();
    let check = |body: &[u8], param: Option<&str>, what: &str| {
        let (st, _, raw) = http(addr, "POST", "/v1/chat/completions", Some(body), &[]);
        let v: Value = serde_json::from_slice(&raw).unwrap_or_else(|_| panic!("{what}: not JSON: {}", String::from_utf8_lossy(&raw)));
        assert_eq!((st, v["error"]["type"].as_str()), (400, Some("invalid_request_error")), "{what}: {v}");
        assert_eq!(v["error"]["param"].as_str(), param, "{what}: {v}");
    };
    // Every truncation of a valid body.
    for n in 0..good.len() {
        check(&good.as_bytes()[..n], None, &format!("truncated at {n}"));
    }
    // Malformed JSON and JSON that is not a request object.
    for body in
        ["{", "}", "{\"messages\": [}", "{'messages': []}", "[1, 2]", "null", "\"text\"", "42", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]} x"]
    {
        check(body.as_bytes(), None, body);
    }
    // Invalid UTF-8: the whole body, inside a string, an overlong encoding, a lone surrogate.
    for body in [
        &b"\xff\xfe\xfd"[..],
        b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xc3\x28\"}]}",
        b"{\"prompt\": \"\xc0\xaf\"}",
        b"{\"prompt\": \"\xed\xa0\x80\"}",
    ] {
        check(body, None, &String::from_utf8_lossy(body));
    }
    // Wrong types name their field.
    let msgs = json!([{"role": "user", "content": "hi"}]);
    for (field, value) in [
        ("messages", json!("hi")),
        ("messages", json!([{"role": "user"}])),
        ("messages", json!([{"role": 3, "content": "hi"}])),
        ("messages", json!([{"role": "user", "content": [{"type": "image_url"}]}])),
        ("max_tokens", json!("5")),
        ("max_tokens", json!(-1)),
        ("max_tokens", json!(2.5)),
        ("max_completion_tokens", json!(true)),
        ("temperature", json!([1])),
        ("temperature", json!(-0.5)),
        ("top_p", json!({})),
        ("top_p", json!(0)),
        ("top_k", json!(-3)),
        ("seed", json!(1.5)),
        ("stop", json!(5)),
        ("stop", json!(["a", 1])),
        ("stream", json!("yes")),
        ("n", json!("one")),
        ("sparkling.method", json!(4)),
        ("sparkling.budget", json!(0)),
    ] {
        let mut b = json!({"messages": msgs, "max_tokens": 4});
        match field.split_once('.') {
            Some((a, c)) => b[a] = json!({c: value}),
            None => b[field] = value.clone(),
        }
        let param = if field == "max_completion_tokens" { "max_completion_tokens" } else { field };
        check(b.to_string().as_bytes(), Some(param), &format!("{field} = {value}"));
    }
    let completion = |body: &Value| post(addr, "/v1/completions", body);
    for bad in [json!({"prompt": 5}), json!({"prompt": null}), json!({"prompt": ""}), json!({"prompt": ["a", "b"]}), json!({})] {
        let (st, v) = completion(&bad);
        assert_eq!((st, v["error"]["param"].as_str()), (400, Some("prompt")), "{bad}: {v}");
    }
    // A body shorter than its Content-Length, the client then closing its side: an error
    // answer or a closed connection, never a generation.
    let head = |len: usize| format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n");
    let short = [head(good.len() + 40).as_bytes(), good.as_bytes()].concat();
    if let Some((st, v)) = raw_request(addr, &short) {
        assert!((400..500).contains(&st), "{st}: {v}");
    }
    // Huge bodies: announced (answered 413 from the headers alone, before any body byte is
    // sent) and chunked without a length (cut at the limit).
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "{}", head(1 << 30)).unwrap();
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).unwrap();
    let (st, _, body) = parse_response(&buf[..n]);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((st, v["error"]["code"].as_u64()), (413, Some(413)), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("1073741824 bytes"), "{v}");
    drop(s);
    let mut chunked = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..80 {
        chunked.extend_from_slice(format!("{:x}\r\n{}\r\n", 1024, "z".repeat(1024)).as_bytes());
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let (st, v) = raw_request(addr, &chunked).expect("an answer");
    assert_eq!((st, v["error"]["code"].as_u64()), (413, Some(413)), "{v}");
    // The server is unharmed.
    let (st, v) = post(addr, "/v1/chat/completions", &serde_json::from_str(&good).unwrap());
    assert_eq!((st, v["choices"][0]["message"]["content"].as_str()), (200, Some(want.as_str())), "{v}");
    assert_eq!(metric(addr, "sparkling:num_requests_running "), 0.0);
}

/// A client that sends its headers one byte at a time is cut off after the header timeout,
/// while requests on other connections are answered meanwhile.
#[test]
fn a_slow_client_times_out_and_others_are_served() {
    let f = fixture();
    let addr = start(&f, ServeOptions { header_read_timeout: Duration::from_millis(800), ..opts() });
    let slow = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let t0 = Instant::now();
        let head =
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Padding: slowly-slowly-slowly\r\nContent-Length: 2\r\n\r\n{}";
        let mut sent = 0;
        for byte in head.bytes() {
            if s.write_all(&[byte]).is_err() {
                break;
            }
            sent += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        (t0.elapsed(), sent, head.len(), out)
    });
    // Meanwhile: normal requests are answered.
    let t0 = Instant::now();
    let mut answered = 0;
    while t0.elapsed() < Duration::from_millis(1500) {
        let (st, v) = post(addr, "/v1/completions", &json!({"prompt": "fast", "max_tokens": 3}));
        assert_eq!(st, 200, "{v}");
        answered += 1;
    }
    let (took, sent, len, out) = slow.join().unwrap();
    assert!(answered >= 2, "{answered} requests while the slow client dawdled");
    // It was cut off well before it could finish its ~6.5 s of headers, and got no answer.
    assert!(sent < len, "the slow client sent its whole request ({sent} bytes) in {took:?}");
    assert!(took >= Duration::from_millis(700) && took < Duration::from_secs(5), "closed after {took:?}");
    assert!(out.is_empty() || String::from_utf8_lossy(&out).starts_with("HTTP/1.1 4"), "{}", String::from_utf8_lossy(&out));
    assert_eq!(metric(addr, "sparkling:num_requests_running "), 0.0);
}

/// A client that sends its head and then stalls mid-body gets 408 within the header timeout
/// (it held no request slot meanwhile), and the server goes on answering.
#[test]
fn a_stalled_body_is_408() {
    let f = fixture();
    let addr = start(&f, ServeOptions { header_read_timeout: Duration::from_millis(600), ..opts() });
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let t0 = Instant::now();
    s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\": ").unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let took = t0.elapsed();
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("did not arrive within"), "{text}");
    assert!(took >= Duration::from_millis(500) && took < Duration::from_secs(5), "answered after {took:?}");
    assert_eq!(post(addr, "/v1/completions", &json!({"prompt": "fast", "max_tokens": 2})).0, 200);
    assert_eq!(metric(addr, "sparkling:num_requests_running "), 0.0);
}

/// 200 clients start streams and drop them (half after the first event, half before any
/// answer): afterwards nothing is queued or running, and a new request is answered as before.
#[test]
fn two_hundred_clients_dropping_mid_stream_leave_nothing_in_flight() {
    let f = fixture();
    let addr = start(&f, ServeOptions { max_batch: 8, max_queue: 256, ..opts() });
    let t0 = Instant::now();
    let clients: Vec<_> = (0..200)
        .map(|i| {
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                let body = json!({"prompt": format!("client {i}"), "max_tokens": 2000, "stream": true, "sparkling": {"method": "ar"}}).to_string();
                write!(s, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len())
                    .unwrap();
                if i % 2 == 0 {
                    // Read up to the first event, then leave mid-stream.
                    let mut got = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !String::from_utf8_lossy(&got).contains("data: ") {
                        let n = s.read(&mut buf).unwrap();
                        assert!(n > 0, "closed before the first event: {}", String::from_utf8_lossy(&got));
                        got.extend_from_slice(&buf[..n]);
                    }
                    assert!(got.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&got));
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    loop {
        let (waiting, running) = (metric(addr, "sparkling:num_requests_waiting "), metric(addr, "sparkling:num_requests_running "));
        if (waiting, running) == (0.0, 0.0) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "still in flight: {waiting} waiting, {running} running");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(metric(addr, "sparkling:requests_cancelled_total ") >= 100.0);
    let want = reference(&f, &[Message { role: Role::User, content: "after" }], 8, 0.0, 0);
    let (st, v) = post(addr, "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "after"}], "max_tokens": 8}));
    assert_eq!((st, v["choices"][0]["message"]["content"].as_str()), (200, Some(want.as_str())), "{v}");
    assert_eq!((metric(addr, "sparkling:num_requests_waiting "), metric(addr, "sparkling:num_requests_running ")), (0.0, 0.0));
}

/// The binary: SIGTERM makes new requests 503 while the one in flight finishes, then the
/// process exits 0.
#[test]
fn sigterm_drains_and_exits_zero() {
    let f = fixture();
    let exe = env!("CARGO_BIN_EXE_sparkling");
    let mut child = std::process::Command::new(exe)
        .args(["serve", "--target", path(&f.target_dir), "--drafter", path(&f.drafter_dir), "--port", "0", "--drain-timeout", "20"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let mut log = Vec::new();
    let addr: SocketAddr = loop {
        let mut b = [0u8; 1];
        assert_eq!(err.read(&mut b).unwrap(), 1, "serve exited early: {}", String::from_utf8_lossy(&log));
        log.push(b[0]);
        let s = String::from_utf8_lossy(&log);
        if let Some(rest) = s.split("listening on http://").nth(1) {
            if let Some(a) = rest.split_whitespace().next().filter(|_| s.ends_with('\n')) {
                break a.parse().unwrap();
            }
        }
    };
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    let t0 = Instant::now();
    while http(addr, "GET", "/health", None, &[]).0 != 200 {
        assert!(t0.elapsed() < Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(20));
    }
    let long = std::thread::spawn(move || {
        let r = post(addr, "/v1/completions", &json!({"prompt": "long", "max_tokens": 4000, "sparkling": {"method": "ar"}}));
        (r, Instant::now())
    });
    std::thread::sleep(Duration::from_millis(100));
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let killed = Instant::now();
    std::thread::sleep(Duration::from_millis(50));
    let (st, _, _) = http(addr, "GET", "/health", None, &[]);
    assert_eq!(st, 503, "health while draining");
    let ((st, v), done) = long.join().unwrap();
    assert_eq!(st, 200, "{v}");
    assert!(done > killed, "the request finished before the signal: the drain was not tested");
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}
