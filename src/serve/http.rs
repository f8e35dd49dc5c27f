//! The HTTP side of `sparkling serve` (axum): routes, authentication, request parsing, the chat
//! template, streaming (server-sent events) and the OpenAI response shapes.

use super::api::{self, ApiError, Endpoint, GenRequest};
use super::engine::{Event, Job};
use super::stop::StopScanner;
use super::Shared;
use crate::decode::Stats;
use crate::tokenizer::{TextStream, TextTokenizer};
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::UnboundedReceiver;

/// The routes, with the body limit and the request counter.
pub(super) fn router(shared: Arc<Shared>) -> Router {
    let limit = shared.opts.max_body_bytes;
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(shared.clone(), announced_size))
        .layer(middleware::from_fn_with_state(shared.clone(), count))
        .with_state(shared)
}

/// Serve `app` on `listener` until `shutdown` resolves, then stop accepting and let each open
/// connection finish the response it is sending (HTTP/1.1, keep-alive). A connection that does
/// not send a request's whole head within `header_timeout` (from its start, or from the end of
/// its previous response) is closed: a client sending its headers byte by byte holds no
/// connection for longer. Transient accept errors (out of file descriptors) are waited out.
pub(super) async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    header_timeout: std::time::Duration,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    // `close` tells the connections to finish; each holds a `done` receiver until it ends.
    let (close_tx, close_rx) = tokio::sync::watch::channel(());
    let (done_tx, done_rx) = tokio::sync::watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(_) => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        // Streamed events are small writes: send each at once.
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let (mut close, done) = (close_rx.clone(), done_rx.clone());
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(header_timeout);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = close.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            drop(done);
        });
    }
    drop(listener);
    let _ = close_tx.send(());
    drop(done_rx);
    done_tx.closed().await;
    Ok(())
}

/// 413 at once for a request whose `Content-Length` is over the body limit, before any of its
/// body is read (a body without a length is cut at the limit as it is read, also 413).
async fn announced_size(State(s): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let announced = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok());
    match announced {
        Some(n) if n > s.opts.max_body_bytes as u64 => {
            error(ApiError::status(413, format!("the request body of {n} bytes is larger than the server's limit of {} bytes", s.opts.max_body_bytes)))
        }
        _ => next.run(req).await,
    }
}

/// Count every answered request by status.
async fn count(State(s): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let r = next.run(req).await;
    s.metrics.request(r.status().as_u16());
    r
}

fn error(e: ApiError) -> Response {
    let mut r = (StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), axum::Json(e.body())).into_response();
    if let Some(s) = e.retry_after {
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

/// 401 unless the request carries the server's key (when it has one).
fn authorize(s: &Shared, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &s.opts.api_key else { return Ok(()) };
    // The scheme name is case-insensitive (RFC 9110 §11.1).
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, k)| k.trim());
    if given == Some(key.as_str()) {
        Ok(())
    } else {
        Err(ApiError::status(401, "missing or wrong API key: send `Authorization: Bearer <key>`"))
    }
}

/// 503 while loading or shutting down.
fn available(s: &Shared) -> Result<(), ApiError> {
    if s.draining.load(Ordering::SeqCst) {
        return Err(ApiError::status(503, "the server is shutting down"));
    }
    if !s.ready.load(Ordering::SeqCst) {
        return Err(ApiError { retry_after: Some(1), ..ApiError::status(503, "the model is loading") });
    }
    Ok(())
}

async fn health(State(s): State<Arc<Shared>>) -> Response {
    match available(&s) {
        Ok(()) => axum::Json(json!({"status": "ok"})).into_response(),
        Err(e) => error(e),
    }
}

async fn metrics(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&s, &headers) {
        return error(e);
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], s.metrics.render()).into_response()
}

async fn models(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&s, &headers) {
        return error(e);
    }
    axum::Json(json!({"object": "list", "data": [{"id": s.opts.model_id, "object": "model", "created": now(), "owned_by": "sparkling"}]})).into_response()
}

async fn not_found(State(s): State<Arc<Shared>>, headers: HeaderMap, req: Request) -> Response {
    if let Err(e) = authorize(&s, &headers) {
        return error(e);
    }
    error(ApiError::status(404, format!("no route {} {}", req.method(), req.uri().path())))
}

/// 405 in the JSON error shape (GET on a POST route, OPTIONS, …).
async fn method_not_allowed(req: Request) -> Response {
    let allowed = if req.uri().path().starts_with("/v1/c") { "POST" } else { "GET" };
    let mut r = error(ApiError::status(405, format!("{} {} is not served: use {allowed}", req.method(), req.uri().path())));
    r.headers_mut().insert(header::ALLOW, HeaderValue::from_static(if allowed == "POST" { "POST" } else { "GET" }));
    r
}

async fn chat(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Body) -> Response {
    generate(s, Endpoint::Chat, headers, body).await.unwrap_or_else(error)
}

async fn completions(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Body) -> Response {
    generate(s, Endpoint::Completion, headers, body).await.unwrap_or_else(error)
}

/// The whole request body, within the body limit (413 beyond it) and within the header
/// timeout from when its head arrived (408 for a client that stalls mid-body).
async fn read_body(s: &Shared, body: Body) -> Result<Bytes, ApiError> {
    let limit = s.opts.max_body_bytes;
    match tokio::time::timeout(s.opts.header_read_timeout, axum::body::to_bytes(body, limit)).await {
        Err(_) => {
            Err(ApiError::status(408, format!("the request body did not arrive within {:.0} s (--header-timeout)", s.opts.header_read_timeout.as_secs_f64())))
        }
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) if std::error::Error::source(&e).is_some_and(|x| x.is::<http_body_util::LengthLimitError>()) => {
            Err(ApiError::status(413, format!("the request body is larger than the server's limit of {limit} bytes")))
        }
        Ok(Err(e)) => Err(ApiError::status(400, format!("cannot read the request body: {e}"))),
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Counts a request in flight until dropped (the drain waits for these).
struct InFlight(Arc<Shared>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Parse, queue, and answer one generation request (streamed or whole).
async fn generate(s: Arc<Shared>, endpoint: Endpoint, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    authorize(&s, &headers)?;
    available(&s)?;
    let body = read_body(&s, body).await?;
    let (defaults, tok) = match (s.defaults.get(), s.tokenizer.get()) {
        (Some(d), Some(t)) => (d, t.clone()),
        _ => return Err(ApiError::status(503, "the model is loading")),
    };
    let req = api::parse(endpoint, &body, defaults)?;
    let prompt = match endpoint {
        Endpoint::Chat => tok.encode_messages(&req.template_messages()),
        Endpoint::Completion => tok.encode_raw(&req.prompt),
    }
    .map_err(|e| ApiError::status(400, format!("cannot tokenize the prompt: {e}")))?;
    if prompt.is_empty() {
        return Err(ApiError::bad("prompt", "the prompt is empty after tokenization"));
    }
    let queued = s.metrics.queued.load(Ordering::SeqCst);
    if queued >= s.opts.max_queue as i64 {
        return Err(ApiError { retry_after: Some(1), ..ApiError::status(429, format!("{queued} requests are waiting already (--max-queue): retry later")) });
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let prompt_tokens = prompt.len();
    s.in_flight.fetch_add(1, Ordering::SeqCst);
    let guard = InFlight(s.clone());
    {
        let jobs = s.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let sender = jobs.as_ref().ok_or_else(|| ApiError::status(503, "the server is shutting down"))?;
        s.metrics.queued.fetch_add(1, Ordering::SeqCst);
        if sender.send(Job { prompt, params: req.params.clone(), events: tx, cancel: cancel.clone() }).is_err() {
            s.metrics.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError::status(503, "the engine has stopped"));
        }
    }
    // The request is refused (400) or admitted before any byte of the answer is sent.
    match rx.recv().await {
        Some(Event::Started) => {}
        Some(Event::Failed(e)) => return Err(ApiError::status(400, e.to_string())),
        Some(Event::ShutDown) => return Err(shutting_down(&s)),
        _ => return Err(ApiError::status(500, "the engine stopped before the request started")),
    }
    // A per-process random part keeps ids unique across restarts and replicas.
    let id = format!("{}-{:016x}{}", if endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" }, s.id_base, s.next_id.fetch_add(1, Ordering::Relaxed));
    let model = req.model.clone().unwrap_or_else(|| s.opts.model_id.clone());
    let run = Run {
        s: s.clone(),
        tok,
        rx,
        cancel,
        text: TextStream::new(),
        stop: StopScanner::new(req.stop.clone()),
        completion_tokens: 0,
        arrived: Instant::now(),
        last: None,
        finish: None,
        stats: None,
        cached_tokens: 0,
        _guard: guard,
    };
    let shape = Shape { id, model, created: now(), endpoint, prompt_tokens };
    if req.stream {
        Ok(stream(run, shape, req))
    } else {
        whole(run, shape).await
    }
}

/// One admitted generation as the HTTP side follows it.
struct Run {
    s: Arc<Shared>,
    tok: Arc<TextTokenizer>,
    rx: UnboundedReceiver<Event>,
    cancel: Arc<AtomicBool>,
    text: TextStream,
    stop: StopScanner,
    completion_tokens: usize,
    arrived: Instant,
    last: Option<Instant>,
    finish: Option<&'static str>,
    stats: Option<Stats>,
    /// Prompt tokens reused from the prefix cache.
    cached_tokens: usize,
    _guard: InFlight,
}

impl Run {
    /// The next piece of answer text; `Ok(None)` once finished (then `finish` and `stats` are
    /// set).
    async fn next(&mut self) -> Result<Option<String>, ApiError> {
        loop {
            if self.finish.is_some() {
                return Ok(None);
            }
            match self.rx.recv().await {
                Some(Event::Tokens(t)) => {
                    if self.stop.stopped() {
                        continue; // generated while the cancellation reached the engine
                    }
                    let now = Instant::now();
                    match self.last {
                        None => self.s.metrics.ttft.observe(now.duration_since(self.arrived).as_secs_f64()),
                        Some(l) => {
                            let per = now.duration_since(l).as_secs_f64() / t.len().max(1) as f64;
                            for _ in 0..t.len() {
                                self.s.metrics.itl.observe(per);
                            }
                        }
                    }
                    self.last = Some(now);
                    self.completion_tokens += t.len();
                    let piece = self.text.push(&self.tok, &t).map_err(|e| ApiError::status(500, format!("cannot decode the answer: {e}")))?;
                    let out = self.stop.push(&piece);
                    if self.stop.stopped() {
                        self.cancel.store(true, Ordering::SeqCst);
                    }
                    if !out.is_empty() {
                        return Ok(Some(out));
                    }
                }
                Some(Event::Done { stopped, stats, cached_tokens }) => {
                    // What the detokenizer still holds (an answer cut inside a character), then
                    // what the stop scanner holds.
                    let tail = self.text.finish(&self.tok).map_err(|e| ApiError::status(500, format!("cannot decode the answer: {e}")))?;
                    let rest = if self.stop.stopped() {
                        String::new()
                    } else {
                        let mut r = self.stop.push(&tail);
                        if !self.stop.stopped() {
                            r.push_str(&self.stop.finish());
                        }
                        r
                    };
                    self.finish = Some(if stopped || self.stop.stopped() { "stop" } else { "length" });
                    self.stats = Some(*stats);
                    self.cached_tokens = cached_tokens;
                    if !rest.is_empty() {
                        return Ok(Some(rest));
                    }
                }
                Some(Event::Started) => {}
                Some(Event::Failed(e)) => return Err(ApiError::status(500, e.to_string())),
                Some(Event::ShutDown) => return Err(shutting_down(&self.s)),
                None => return Err(ApiError::status(500, "the engine stopped during the request")),
            }
        }
    }
}

/// What every response of one request repeats.
struct Shape {
    id: String,
    model: String,
    created: u64,
    endpoint: Endpoint,
    prompt_tokens: usize,
}

impl Shape {
    fn usage(&self, run: &Run) -> Value {
        let spec = run.stats.as_ref().map(|st| {
            json!({
                "rounds": st.rounds,
                "tau": (st.rounds > 0).then(|| st.tau()),
                "drafted_rounds": st.tree_sizes.iter().skip(1).sum::<usize>(),
                "ar_rounds": st.tree_sizes.first().copied().unwrap_or(0),
                "draft_tokens": st.verified_nodes.saturating_sub(st.rounds),
                "accepted_tokens": st.accepted_at_depth.iter().sum::<usize>(),
            })
        });
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": run.completion_tokens,
            "total_tokens": self.prompt_tokens + run.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": run.cached_tokens},
            "speculation": spec,
        })
    }

    /// A streamed chunk with `text` (or the role header / the finish reason).
    fn chunk(&self, text: Option<&str>, role: bool, finish: Option<&str>) -> Value {
        match self.endpoint {
            Endpoint::Chat => {
                let delta = match (role, text) {
                    (true, _) => json!({"role": "assistant", "content": ""}),
                    (false, Some(t)) => json!({"content": t}),
                    (false, None) => json!({}),
                };
                json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                       "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
            }
            Endpoint::Completion => json!({"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                                            "choices": [{"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish}]}),
        }
    }
}

/// The whole answer as one JSON response.
async fn whole(mut run: Run, shape: Shape) -> Result<Response, ApiError> {
    let mut text = String::new();
    while let Some(piece) = run.next().await? {
        text.push_str(&piece);
    }
    let finish = run.finish.unwrap_or("stop");
    let usage = shape.usage(&run);
    let body = match shape.endpoint {
        Endpoint::Chat => json!({"id": shape.id, "object": "chat.completion", "created": shape.created, "model": shape.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": finish}], "usage": usage}),
        Endpoint::Completion => json!({"id": shape.id, "object": "text_completion", "created": shape.created, "model": shape.model,
            "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}], "usage": usage}),
    };
    Ok(axum::Json(body).into_response())
}

fn event(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// The answer as server-sent events: a role chunk (chat), text chunks, the finish chunk, a
/// usage chunk when asked for, then `data: [DONE]`. A client that goes away drops the stream,
/// which closes the request's channel: the engine cancels the sequence before its next step.
fn stream(run: Run, shape: Shape, req: GenRequest) -> Response {
    let first = (shape.endpoint == Endpoint::Chat).then(|| event(&shape.chunk(None, true, None)));
    let state = (run, shape, req.include_usage, first, 0u8);
    let body = futures_util::stream::unfold(state, |(mut run, shape, usage, first, phase)| async move {
        if let Some(b) = first {
            return Some((Ok::<Bytes, std::convert::Infallible>(b), (run, shape, usage, None, phase)));
        }
        match phase {
            0 => match run.next().await {
                Ok(Some(t)) => {
                    let b = event(&shape.chunk(Some(&t), false, None));
                    Some((Ok(b), (run, shape, usage, None, 0)))
                }
                Ok(None) => {
                    let b = event(&shape.chunk(None, false, Some(run.finish.unwrap_or("stop"))));
                    Some((Ok(b), (run, shape, usage, None, 1)))
                }
                Err(e) => {
                    let b = event(&e.body());
                    Some((Ok(b), (run, shape, usage, None, 2)))
                }
            },
            1 if usage => {
                let u = json!({"id": shape.id, "object": if shape.endpoint == Endpoint::Chat { "chat.completion.chunk" } else { "text_completion" },
                               "created": shape.created, "model": shape.model, "choices": [], "usage": shape.usage(&run)});
                Some((Ok(event(&u)), (run, shape, usage, None, 2)))
            }
            1 | 2 => Some((Ok(Bytes::from_static(b"data: [DONE]\n\n")), (run, shape, usage, None, 3))),
            _ => None,
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| error(ApiError::status(500, "cannot build the stream")))
}

/// 503 for a request the drain timeout ended.
fn shutting_down(s: &Shared) -> ApiError {
    ApiError::status(
        503,
        format!("the server is shutting down: its drain timeout ({:.0} s, --drain-timeout) ended this request unfinished", s.opts.drain_timeout.as_secs_f64()),
    )
}
