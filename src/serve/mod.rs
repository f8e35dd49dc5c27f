//! `sparkling serve`: an OpenAI-compatible HTTP server (docs/design.md §7).
//!
//! - [`run`] binds the address at once and answers `/health` with 503 while the model loads
//!   and the `--budget auto` cost model is measured, then 200;
//! - one engine thread ([`engine`]) owns the models and ONE batch: requests join and leave it
//!   between steps, so every request in flight shares each target forward, and each request's
//!   own round policy prices its tree with the whole step's rows (trees shrink toward AR steps
//!   as the batch fills). Every request's tokens are those of `sparkling generate` with the
//!   same options (T = 0), or of the same seed (T > 0), whatever else is in flight;
//! - the HTTP side ([`http`], axum on tokio) parses requests ([`api`]), applies the chat
//!   template, streams server-sent events, cuts stop strings ([`stop`]) and counts everything
//!   for `/metrics` ([`metrics`]). A client that disconnects has its sequence cancelled before
//!   the next step;
//! - prefix reuse: the batch keeps the K/V rows (and drafter taps) of recent prompts and
//!   answers in a [`PrefixCache`](crate::decode::prefix::PrefixCache) within
//!   [`ServeOptions::prefix_cache_bytes`]; a request whose prompt starts with them (the same
//!   system prompt, the earlier turns of a conversation) prefills only the rest, and its
//!   `usage.prompt_tokens_details.cached_tokens` says how many it reused. Its tokens are the
//!   same as without;
//! - a client must send its request headers within [`ServeOptions::header_read_timeout`], else
//!   its connection is closed (a slow client cannot hold a connection open forever);
//! - SIGTERM / SIGINT: new requests get 503, requests in flight finish (up to the drain
//!   timeout), then the process exits with status 0.

pub mod api;
pub mod engine;
mod http;
pub mod metrics;
pub mod stop;

use crate::decode::budget::{BudgetChoice, CostModel};
use crate::decode::{stop_tokens, GenParams, Method, Models, Platform};
use crate::error::{Error, Result};
use crate::tokenizer::TextTokenizer;
use api::Defaults;
use metrics::Metrics;
use sparkling_core::Backend;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Address to bind (`127.0.0.1` by default).
    pub host: String,
    /// Port (8080 by default; 0 picks a free one, printed at start).
    pub port: u16,
    /// When set, every `/v1/*` and `/metrics` request needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// The model id `/v1/models` lists and responses carry.
    pub model_id: String,
    /// Method of requests that name none.
    pub method: Method,
    /// Tree budget of requests that name none.
    pub budget: BudgetChoice,
    /// Most sequences decoded together.
    pub max_batch: usize,
    /// Most requests waiting for a place in the batch (more: 429).
    pub max_queue: usize,
    /// Largest request body, bytes (more: 413).
    pub max_body_bytes: usize,
    /// `max_tokens` of a request that gives none.
    pub default_max_tokens: usize,
    /// The most `max_tokens` a request may ask for.
    pub max_tokens_cap: usize,
    /// Most prompt rows a step feeds over all joining sequences (long prompts prefill in
    /// chunks, prompts arriving together first come, first served).
    pub prefill_chunk: usize,
    /// How long SIGTERM waits for requests in flight.
    pub drain_timeout: Duration,
    /// Host memory for reusable prompt prefixes, bytes (0: no prefix reuse).
    pub prefix_cache_bytes: usize,
    /// How long a client may take to send a request's headers (the whole head, from the
    /// connection's first byte or the previous response) before its connection is closed.
    pub header_read_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            model_id: "sparkling".into(),
            method: Method::Sparkling,
            budget: BudgetChoice::Auto,
            max_batch: 8,
            max_queue: 64,
            max_body_bytes: 1 << 20,
            default_max_tokens: 256,
            max_tokens_cap: 4096,
            prefill_chunk: 256,
            drain_timeout: Duration::from_secs(30),
            prefix_cache_bytes: 512 << 20,
            header_read_timeout: Duration::from_secs(10),
        }
    }
}

/// What the loader gives the server.
pub struct ServeModel<B: Backend> {
    /// The backend the models live on.
    pub backend: B,
    /// Target and drafters.
    pub models: Models<B>,
    /// The target's tokenizer (with its chat template).
    pub tokenizer: TextTokenizer,
    /// A cost model measured earlier for this target × backend (`None`: measured at start).
    pub cost: Option<CostModel>,
}

/// State shared by the HTTP handlers and the engine thread.
pub(crate) struct Shared {
    pub opts: ServeOptions,
    pub ready: AtomicBool,
    pub draining: AtomicBool,
    /// The drain timeout passed: the engine ends what is still in flight.
    pub abort: AtomicBool,
    pub in_flight: AtomicUsize,
    pub metrics: Arc<Metrics>,
    pub jobs: Mutex<Option<std::sync::mpsc::Sender<engine::Job>>>,
    pub tokenizer: OnceLock<Arc<TextTokenizer>>,
    pub defaults: OnceLock<Defaults>,
    pub next_id: AtomicUsize,
    /// Random per process: the first part of every response id.
    pub id_base: u64,
}

/// Serve until SIGTERM / SIGINT: bind `opts.host:opts.port`, load the model with `load` on the
/// engine thread (the address answers 503 meanwhile), measure the cost model when the default
/// budget is `auto` and none was given (`on_cost` receives it, to cache it), then answer.
/// `on_bound` receives the bound address (useful with port 0).
/// Errors: the address cannot be bound; the model fails to load; the runtime fails.
pub fn run<B, L>(opts: ServeOptions, load: L, on_cost: Box<dyn FnOnce(&CostModel) + Send>, on_bound: Box<dyn FnOnce(std::net::SocketAddr) + Send>) -> Result<()>
where
    B: Backend + 'static,
    L: FnOnce() -> Result<ServeModel<B>> + Send + 'static,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::Input(format!("cannot start the server runtime: {e}")))?;
    let (tx, rx) = std::sync::mpsc::channel::<engine::Job>();
    let shared = Arc::new(Shared {
        opts: opts.clone(),
        ready: AtomicBool::new(false),
        draining: AtomicBool::new(false),
        abort: AtomicBool::new(false),
        in_flight: AtomicUsize::new(0),
        metrics: Arc::new(Metrics::default()),
        jobs: Mutex::new(Some(tx)),
        tokenizer: OnceLock::new(),
        defaults: OnceLock::new(),
        next_id: AtomicUsize::new(0),
        id_base: {
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new().build_hasher().finish()
        },
    });
    let shutdown = Arc::new(tokio::sync::Notify::new());
    let fatal: Arc<Mutex<Option<Error>>> = Arc::new(Mutex::new(None));
    {
        let n = shutdown.clone();
        crate::fsio::on_interrupt(Box::new(move || n.notify_one()));
    }
    let listener = rt
        .block_on(tokio::net::TcpListener::bind((opts.host.as_str(), opts.port)))
        .map_err(|e| Error::Input(format!("cannot listen on {}:{}: {e} (another server on that port? choose one with --port)", opts.host, opts.port)))?;
    let addr = listener.local_addr().map_err(|e| Error::Input(format!("the bound address: {e}")))?;
    on_bound(addr);
    // The engine thread: load, measure, then decode until the job channel closes.
    let engine = {
        let (shared, shutdown, fatal) = (shared.clone(), shutdown.clone(), fatal.clone());
        std::thread::Builder::new()
            .name("sparkling-engine".into())
            .spawn(move || {
                let r = (|| -> Result<()> {
                    let m = load()?;
                    let platform = Platform::of(&m.backend);
                    let stop = stop_tokens(&m.models.target.cfg.eos, &m.tokenizer.stop);
                    let mut cost = m.cost.clone();
                    if cost.is_none() && shared.opts.budget == BudgetChoice::Auto && shared.opts.method.drafter_kind().is_some() {
                        cost = measure_cost(&m, &platform, &shared.opts, &stop)?;
                        if let Some(c) = &cost {
                            on_cost(c);
                        }
                    }
                    let defaults = Defaults {
                        method: shared.opts.method,
                        budget: shared.opts.budget,
                        max_tokens: shared.opts.default_max_tokens,
                        max_tokens_cap: shared.opts.max_tokens_cap,
                        stop_tokens: stop,
                        platform,
                        cost,
                    };
                    let _ = shared.defaults.set(defaults);
                    let _ = shared.tokenizer.set(Arc::new(m.tokenizer));
                    shared.ready.store(true, Ordering::SeqCst);
                    eprintln!("serve: ready");
                    let limits = engine::Limits {
                        max_batch: shared.opts.max_batch,
                        prefill_chunk: shared.opts.prefill_chunk,
                        prefix_cache_bytes: shared.opts.prefix_cache_bytes,
                    };
                    engine::run(&m.backend, &m.models, rx, limits, &shared.metrics, &shared.abort)
                })();
                if let Err(e) = r {
                    *fatal.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                    shutdown.notify_one();
                }
            })
            .map_err(|e| Error::Input(format!("cannot start the engine thread: {e}")))?
    };
    let app = http::router(shared.clone());
    let drain = {
        let (shared, shutdown) = (shared.clone(), shutdown.clone());
        async move {
            shutdown.notified().await;
            shared.draining.store(true, Ordering::SeqCst);
            eprintln!("serve: shutting down; waiting up to {:.0} s for requests in flight", shared.opts.drain_timeout.as_secs_f64());
            let deadline = tokio::time::Instant::now() + shared.opts.drain_timeout;
            while shared.in_flight.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let left = shared.in_flight.load(Ordering::SeqCst);
            if left > 0 {
                // The rest end with an error their clients see (503, or an error event on a
                // stream), and get a moment to send it.
                eprintln!(
                    "serve: the drain timeout ({:.0} s) passed with {left} request(s) in flight: they are ended with 503 \"shutting down\"",
                    shared.opts.drain_timeout.as_secs_f64()
                );
                shared.abort.store(true, Ordering::SeqCst);
                let grace = tokio::time::Instant::now() + Duration::from_secs(1);
                while shared.in_flight.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < grace {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    };
    let served = rt.block_on(async {
        let server = http::serve(listener, app, opts.header_read_timeout, drain);
        // Graceful shutdown waits for open connections; a stream still open after the drain
        // timeout is cut.
        let cut = {
            let shared = shared.clone();
            async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    if shared.draining.load(Ordering::SeqCst) {
                        tokio::time::sleep(shared.opts.drain_timeout + Duration::from_secs(2)).await;
                        return;
                    }
                }
            }
        };
        tokio::select! {
            r = server => r.map_err(|e| Error::Input(format!("the server failed: {e}"))),
            _ = cut => Ok(()),
        }
    });
    // Stop the engine: close the job channel; it returns once its batch is empty.
    shared.jobs.lock().unwrap_or_else(|p| p.into_inner()).take();
    if shared.in_flight.load(Ordering::SeqCst) == 0 {
        let _ = engine.join();
    }
    rt.shutdown_timeout(Duration::from_millis(100));
    if let Some(e) = fatal.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(e);
    }
    served
}

/// One short generation with the default method under `--budget auto`, to measure the cost
/// model before the first request (a request should not pay for it).
fn measure_cost<B: Backend>(m: &ServeModel<B>, platform: &Platform, opts: &ServeOptions, stop: &[u32]) -> Result<Option<CostModel>> {
    let prompt = m.tokenizer.encode_chat("Hello", None)?;
    let mut p = GenParams::new(opts.method, platform).with_budget(BudgetChoice::Auto);
    p.max_new_tokens = 2;
    p.stop = stop.to_vec();
    let g = m.models.engine(&m.backend, opts.method)?.generate(&prompt, &p, &mut |_| {})?;
    Ok(g.cost_model)
}
