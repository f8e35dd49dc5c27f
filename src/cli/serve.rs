//! `sparkling serve`: the OpenAI-compatible HTTP server (`sparkling::serve`) over the models the
//! other commands load.

use super::load::{load, ModelArgs};
use super::options::{lenient, MethodArg};
use clap::Args;
use sparkling::core::Backend;
use sparkling::decode::budget::BudgetChoice;
use sparkling::decode::Method;
use sparkling::serve::{ServeModel, ServeOptions};
use sparkling::{Error, Result};
use std::time::Duration;

/// `serve` arguments.
#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on `/v1/*` and `/metrics` (default: the
    /// SPARKLING_API_KEY environment variable; neither: no key needed).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Method of requests that name none (`"sparkling": {"method": …}` in a request chooses).
    #[arg(long, default_value = "sparkling", value_parser = lenient::<MethodArg>())]
    pub method: MethodArg,
    /// Tree budget of requests that name none: `auto` (each step, every sequence's tree sized by
    /// its expected tokens per second at the batch's cost) or a node count.
    #[arg(long, default_value = "auto")]
    pub budget: String,
    /// Most requests decoded together (one target forward per step for all of them).
    #[arg(long, default_value_t = 8)]
    pub max_batch: usize,
    /// Most requests waiting for a place in the batch; more are answered 429 with Retry-After.
    #[arg(long, default_value_t = 64)]
    pub max_queue: usize,
    /// Largest request body in bytes; larger ones are answered 413.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    /// `max_tokens` of a request that gives none.
    #[arg(long, default_value_t = 256)]
    pub default_max_tokens: usize,
    /// The most `max_tokens` a request may ask for (more: 400).
    #[arg(long, default_value_t = 4096)]
    pub max_tokens_cap: usize,
    /// Seconds SIGTERM / SIGINT waits for requests in flight before the server exits.
    #[arg(long, default_value_t = 30.0)]
    pub drain_timeout: f64,
    /// The model id `/v1/models` lists (default: the target file's name).
    #[arg(long)]
    pub model_id: Option<String>,
    /// Host memory, in MiB, for the K/V rows of recent prompts and answers: a request whose
    /// prompt starts with them (a shared system prompt, earlier turns) skips prefilling them;
    /// least recently used first out; 0 turns prefix reuse off.
    #[arg(long, default_value_t = 512)]
    pub prefix_cache_mb: usize,
    /// Seconds a client may take to send a request's headers before its connection is closed.
    #[arg(long, default_value_t = 10.0)]
    pub header_timeout: f64,
}

/// Run `serve`.
pub fn run(a: ServeArgs) -> Result<()> {
    let method = Method::from(a.method);
    BudgetChoice::parse(&a.budget, "--budget")?;
    if a.max_batch == 0 || a.max_batch > 1024 {
        return Err(Error::Input(format!("--max-batch {}: expected 1..=1024 sequences", a.max_batch)));
    }
    if a.default_max_tokens == 0 || a.default_max_tokens > a.max_tokens_cap {
        return Err(Error::Input(format!("--default-max-tokens {}: expected 1..=--max-tokens-cap ({})", a.default_max_tokens, a.max_tokens_cap)));
    }
    if !(a.drain_timeout.is_finite() && a.drain_timeout >= 0.0) {
        return Err(Error::Input(format!("--drain-timeout {}: expected seconds ≥ 0", a.drain_timeout)));
    }
    if !(a.header_timeout.is_finite() && a.header_timeout > 0.0 && a.header_timeout <= 3600.0) {
        return Err(Error::Input(format!("--header-timeout {}: expected seconds in (0, 3600]", a.header_timeout)));
    }
    if a.prefix_cache_mb > 1 << 30 {
        return Err(Error::Input(format!("--prefix-cache-mb {}: expected at most {} MiB", a.prefix_cache_mb, 1usize << 30)));
    }
    let model = a.model.clone();
    with_backend!(&model, |b, target| serve(b, target, a, method))
}

fn serve<B: Backend + 'static>(b: B, target: std::path::PathBuf, a: ServeArgs, method: Method) -> Result<()> {
    let budget = BudgetChoice::parse(&a.budget, "--budget")?;
    let model_id = a.model_id.clone().unwrap_or_else(|| target.file_stem().map(|x| x.to_string_lossy().into_owned()).unwrap_or_else(|| "sparkling".into()));
    let opts = ServeOptions {
        host: a.host.clone(),
        port: a.port,
        api_key: a.api_key.clone().or_else(|| std::env::var("SPARKLING_API_KEY").ok().filter(|k| !k.is_empty())),
        model_id,
        method,
        budget,
        max_batch: a.max_batch,
        max_queue: a.max_queue,
        max_body_bytes: a.max_body_bytes,
        default_max_tokens: a.default_max_tokens,
        max_tokens_cap: a.max_tokens_cap,
        drain_timeout: Duration::from_secs_f64(a.drain_timeout),
        prefix_cache_bytes: a.prefix_cache_mb << 20,
        header_read_timeout: Duration::from_secs_f64(a.header_timeout),
        ..ServeOptions::default()
    };
    // Requests choose their method: the default method's drafter kind and the kind of every
    // --drafter given are loaded (a DFlash and a DSpark drafter side by side).
    let mut kinds: Vec<_> = method.drafter_kind().into_iter().collect();
    for d in &a.model.drafter {
        let (cp, v) = sparkling::model::config::read_json(&super::load::resolve_path(d)?)?;
        let kind = sparkling::model::config::DrafterConfig::from_hf_json(&cp, &v)?.kind;
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    let cost_path = super::costs::cache_path(&a.model, &target, &b.name());
    let (loader_path, save_path) = (cost_path.clone(), cost_path);
    let n_max = sparkling::decode::Platform::of(&b).auto_max_budget(method);
    let loader = move || -> Result<ServeModel<B>> {
        let m = load(b, &target, &a.model, &kinds)?;
        let tokenizer = m.tokenizer.ok_or_else(|| Error::Input("serve needs the target's tokenizer: pass --tokenizer".into()))?;
        Ok(ServeModel { backend: m.backend, models: m.models, tokenizer, cost: super::costs::load(&loader_path, n_max) })
    };
    sparkling::serve::run(
        opts,
        loader,
        Box::new(move |c| super::costs::save(&save_path, c)),
        Box::new(|addr| eprintln!("serve: listening on http://{addr} (GET /health answers 503 until the model is loaded)")),
    )
}
