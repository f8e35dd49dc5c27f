//! `sparkling generate`: one prompt, streamed output, a stats summary.

use super::load::{load, select, AnyBackend, Loaded, ModelArgs};
use clap::Args;
use sparkling::core::{Backend, SampleParams};
use sparkling::decode::propose::{TreeParams, TreePrep};
use sparkling::decode::{Engine, GenParams, Method, Stats};
use sparkling::{Error, Result};
use std::io::Write;

/// Arguments of `generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A chat message, rendered with the model's chat template (ChatML; Qwen3 thinking off).
    #[arg(long, conflicts_with_all = ["prompt", "prompt_ids"])]
    pub chat: Option<String>,
    /// A raw completion prompt: no template, no BOS.
    #[arg(long, conflicts_with = "prompt_ids")]
    pub prompt: Option<String>,
    /// Prompt as comma-separated token ids (no tokenizer needed).
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    /// System message for --chat (default: the model family's default, if any).
    #[arg(long)]
    pub system: Option<String>,
    /// Decoding method: ar, dflash, ddtree, dspark, sparkling, treespark.
    #[arg(long, default_value = "sparkling")]
    pub method: String,
    /// Tree budget: non-root nodes verified per round (chains: max chain length).
    /// Default 64 (treespark: 32) on GPU backends; 8 on the cpu backend, where a verify costs
    /// about one decode step per 4 tree rows and the smallest budget is the fastest
    /// (BENCHMARKS.md §7).
    #[arg(long)]
    pub budget: Option<usize>,
    /// SparklingTree candidates: top-C tokens per depth in the union table (C ≥ vocabulary
    /// takes every token; the device table costs O(n²) in the union size n ≈ depth·C).
    #[arg(long, default_value_t = 128)]
    pub candidates: usize,
    /// SparklingTree maximum children per parent.
    #[arg(long, default_value_t = 64)]
    pub max_fanout: usize,
    /// TreeSpark children per parent (k).
    #[arg(long, default_value_t = 4)]
    pub treespark_k: usize,
    /// Where draft candidates are selected: `host` (download the draft logits), `device`
    /// (top-k, the Markov candidate table and — on wgpu and CUDA — the whole SparklingTree
    /// tree built on the backend; only the selection comes back), or `auto` (host on the cpu
    /// backend, device otherwise).
    #[arg(long, default_value = "auto")]
    pub tree_prep: String,
    /// Sampling temperature (0 = greedy; every method then emits the target's greedy tokens).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Top-k filter for sampling (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Top-p (nucleus) filter for sampling (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// RNG seed (the draw for each position depends only on seed and position).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Maximum new tokens.
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    /// Do not stop at end-of-sequence tokens (always generate --max-new-tokens; for timing).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print generated ids instead of text.
    #[arg(long)]
    pub ids: bool,
    /// Write the stats as JSON to this file.
    #[arg(long)]
    pub stats_json: Option<std::path::PathBuf>,
}

/// Build generation parameters from CLI values (shared with `bench`).
/// Default tree budget on host-memory (CPU) backends: verification there is compute-bound, so
/// small trees win in tokens/s (BENCHMARKS.md §7: verify of 9 rows ≈ 4 decode steps, 65 rows ≈ 19).
const CPU_DEFAULT_BUDGET: usize = 8;

/// Parse `--tree-prep`: `auto` → `None` (resolved per backend), `host`, `device`. Errors name
/// the argument.
pub fn tree_prep(s: &str) -> Result<Option<TreePrep>> {
    match s {
        "auto" => Ok(None),
        other => TreePrep::parse(other).map(Some).ok_or_else(|| Error::Input(format!("--tree-prep `{other}`: expected auto, host or device"))),
    }
}

/// `host_memory`: the backend's [`Backend::host_memory`], which resolves `--tree-prep auto`.
pub fn gen_params(method: Method, budget: Option<usize>, a: &GenerateArgs, stop: Vec<u32>, host_memory: bool) -> Result<GenParams> {
    let prep = match tree_prep(&a.tree_prep)? {
        Some(p) => p,
        None if host_memory => TreePrep::Host,
        None => TreePrep::Device,
    };
    if a.temperature < 0.0 || !a.temperature.is_finite() {
        return Err(Error::Input(format!("--temperature {} must be ≥ 0", a.temperature)));
    }
    if !(a.top_p > 0.0 && a.top_p <= 1.0) {
        return Err(Error::Input(format!("--top-p {} must be in (0, 1]", a.top_p)));
    }
    if a.candidates == 0 || a.max_fanout == 0 || a.treespark_k == 0 {
        return Err(Error::Input("--candidates, --max-fanout and --treespark-k must be ≥ 1".into()));
    }
    Ok(GenParams {
        method,
        tree: TreeParams {
            budget: budget.unwrap_or(if host_memory { CPU_DEFAULT_BUDGET.min(method.default_budget()) } else { method.default_budget() }),
            candidates: a.candidates,
            max_fanout: a.max_fanout,
            treespark_k: a.treespark_k,
            prep,
        },
        sampling: SampleParams { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p },
        seed: a.seed,
        max_new_tokens: a.max_new_tokens,
        stop,
    })
}

/// Print a human-readable stats summary to stderr.
pub fn print_stats(method: Method, s: &Stats) {
    let [d, p, h, v, a, c] = s.per_round_ms();
    eprintln!(
        "\n[{}] {} new tokens in {} rounds: τ = {:.2} tokens/round (bonus included), {:.1} tokens/s decode, prefill {} tokens in {:.0} ms",
        method.name(),
        s.new_tokens,
        s.rounds,
        s.tau(),
        s.tokens_per_s(),
        s.prompt_tokens,
        s.prefill_ms
    );
    eprintln!("  per round (ms): draft {d:.2} | prep {p:.2} | heap {h:.3} | verify {v:.2} | accept {a:.3} | compact {c:.3}");
    if !s.accepted_at_depth.is_empty() {
        let acc: Vec<String> = s.conditional_acceptance().iter().take(16).map(|x| format!("{x:.2}")).collect();
        eprintln!("  conditional acceptance by depth: {}", acc.join(" "));
    }
}

/// Run `generate` on the backend named by `--backend`.
pub fn run(a: GenerateArgs) -> Result<()> {
    let method = Method::parse(&a.method)?;
    tree_prep(&a.tree_prep)?; // refuse a bad value before loading anything
    let kinds: Vec<_> = method.drafter_kind().into_iter().collect();
    let s = select(&a.model)?;
    match s.backend {
        AnyBackend::Cpu(b) => generate(load(b, &s.target, &a.model, &kinds)?, method, &a),
        #[cfg(feature = "wgpu")]
        AnyBackend::Wgpu(b) => generate(load(b, &s.target, &a.model, &kinds)?, method, &a),
        #[cfg(feature = "cuda")]
        AnyBackend::Cuda(b) => generate(load(b, &s.target, &a.model, &kinds)?, method, &a),
    }
}

/// `generate` on a loaded model, any backend.
fn generate<B: Backend>(m: Loaded<B>, method: Method, a: &GenerateArgs) -> Result<()> {
    let prompt: Vec<u32> = match (&a.chat, &a.prompt, &a.prompt_ids) {
        (_, _, Some(ids)) => ids.clone(),
        (Some(c), _, _) | (_, Some(c), _) => {
            let tok = m.tokenizer.as_ref().ok_or_else(|| {
                Error::Input("no tokenizer for this target: pass --tokenizer or give --prompt-ids".into())
            })?;
            if a.chat.is_some() {
                tok.encode_chat(c, a.system.as_deref())?
            } else {
                tok.encode_raw(c)?
            }
        }
        _ => return Err(Error::Input("give a prompt: --chat TEXT, --prompt TEXT or --prompt-ids 1,2,3".into())),
    };
    if prompt.is_empty() {
        return Err(Error::Input("the prompt is empty after tokenization".into()));
    }
    let mut stop: Vec<u32> = m.target.cfg.eos.clone();
    if let Some(t) = &m.tokenizer {
        for &s in &t.stop {
            if !stop.contains(&s) {
                stop.push(s);
            }
        }
    }
    if a.ignore_eos {
        stop.clear();
    }
    let params = gen_params(method, a.budget, a, stop, m.backend.host_memory())?;
    let engine = Engine { backend: &m.backend, target: &m.target, drafter: method.drafter_kind().and_then(|k| m.drafter(k)) };
    let mut all: Vec<u32> = Vec::new();
    let mut printed = 0usize;
    let stdout = std::io::stdout();
    let g = engine.generate(&prompt, &params, &mut |new| {
        all.extend_from_slice(new);
        let mut out = stdout.lock();
        if a.ids || m.tokenizer.is_none() {
            for t in new {
                let _ = write!(out, "{t} ");
            }
        } else if let Some(tok) = &m.tokenizer {
            if let Ok(text) = tok.decode(&all, false) {
                // Hold back an incomplete UTF-8 tail (shown as U+FFFD) until the next round.
                if !text.ends_with('\u{FFFD}') {
                    if let Some(tail) = text.get(printed..) {
                        let _ = write!(out, "{tail}");
                        printed = text.len();
                    }
                }
            }
        }
        let _ = out.flush();
    })?;
    println!();
    print_stats(method, &g.stats);
    eprintln!("  kernels: {} | target matmuls: {}", m.backend.name(), m.target.kernel_paths(&m.backend));
    if let Some(p) = &a.stats_json {
        let v = serde_json::json!({"method": method.name(), "tokens": g.tokens, "stopped": g.stopped, "tau": g.stats.tau(), "tokens_per_s": g.stats.tokens_per_s(), "stats": g.stats});
        std::fs::write(p, serde_json::to_string_pretty(&v).unwrap_or_default()).map_err(|e| Error::file(p, e.to_string()))?;
    }
    Ok(())
}
