//! `sparkling generate`: one prompt, streamed output, a stats summary.

use super::load::{Loaded, ModelArgs};
use super::options::{lenient, LookupDrafterArg, MethodArg, TreeArgs};
use clap::Args;
use sparkling::core::{Backend, SampleParams};
use sparkling::decode::budget::BudgetChoice;
use sparkling::decode::lookup::MAX_CHAIN;
use sparkling::decode::propose::{TreeParams, TreePrep};
use sparkling::decode::{stop_tokens, GenParams, LookupGraft, Method, Platform, RoundView, Stats};
use sparkling::tokenizer::{TextStream, TextTokenizer};
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
    /// Decoding method.
    #[arg(long, default_value = "sparkling", value_parser = lenient::<MethodArg>())]
    pub method: MethodArg,
    /// Tree budget: `auto` (default) chooses per round the prefix of the tree worth its
    /// measured cost — none at all (a plain AR step, drafter skipped) when drafting does not
    /// pay — from a cost curve measured once per model × backend × threads × weights (cached
    /// under `$SPARKLING_ASSETS/costs/`, printed by `sparkling profile`), building trees of up
    /// to 16 nodes on the cpu backend, 64 (treespark 32) elsewhere; each round's choice also
    /// reads the drafting time it just measured, so the tree sizes (never the tokens) can differ
    /// between identical runs. Or a number: non-root nodes verified each round (chains: max
    /// chain length; fewer near the end, where no node deeper than the tokens left before the
    /// round's bonus could be kept, and none in the round that writes the last token).
    /// `lookup` has no cost model: `auto` gives it chains of up to 16 tokens (2 / 4 / 6 after
    /// a 1 / 2 / 3-token match, up to 16 after a longer match: as many as matched; half as many
    /// after a short match when sampling, T > 0).
    #[arg(long, allow_negative_numbers = true)]
    pub budget: Option<String>,
    #[command(flatten)]
    pub tree: TreeArgs,
    /// Sampling temperature (0 = greedy; every method then emits the target's greedy tokens).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    pub temperature: f32,
    /// Top-k filter for sampling (0 = off).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    pub top_k: usize,
    /// Top-p (nucleus) filter for sampling (1 = off).
    #[arg(long, allow_negative_numbers = true, default_value_t = 1.0)]
    pub top_p: f32,
    /// RNG seed (the draw for each position depends only on seed and position).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    pub seed: u64,
    /// Maximum new tokens.
    #[arg(long, allow_negative_numbers = true, default_value_t = 256)]
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
    /// Print every verified draft tree to stderr: one line per round (position, nodes, accepted
    /// path + bonus token), then the tree indented by depth, accepted nodes marked `✓`.
    #[arg(long)]
    pub show_tree: bool,
}

/// The `--show-tree` text of one round: a summary line, then one line per node, depth first
/// from the root (each node under its parent, indented by depth), `✓` on the accepted path,
/// `·` elsewhere. `text` renders a token.
pub fn render_round(r: &RoundView<'_>, text: &dyn Fn(u32) -> String) -> String {
    let t = r.tree;
    let path: Vec<String> = r.accepted[1..].iter().map(|&i| text(t.tokens[i])).collect();
    let mut s = format!(
        "round {} @ position {}: {} drafted node{}, accepted {}{}{} + bonus {}\n",
        r.round,
        r.root_pos,
        t.len() - 1,
        if t.len() == 2 { "" } else { "s" },
        r.accepted.len() - 1,
        if path.is_empty() { "" } else { ": " },
        path.join(" "),
        text(r.bonus)
    );
    // Depth-first from the root, children in admission order, so each node sits under its parent.
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); t.len()];
    for i in 1..t.len() {
        children[t.parents[i] as usize].push(i);
    }
    let mut stack = vec![0usize];
    while let Some(i) = stack.pop() {
        let mark = if r.accepted.contains(&i) { '✓' } else { '·' };
        s.push_str(&format!("  {}{mark} {}\n", "  ".repeat(t.depths[i] as usize), text(t.tokens[i])));
        stack.extend(children[i].iter().rev());
    }
    s
}

/// One token as `--show-tree` prints it: its text quoted (`"Ġthe"` decodes to `" the"`), control
/// tokens by name (`"<|im_end|>"`, not the empty text a plain decode gives them), a stop token
/// followed by `(end of turn)`, and `#id` when the token has no text.
pub fn token_label(tok: &TextTokenizer, id: u32) -> String {
    let text = tok.decode(&[id], true).unwrap_or_default();
    let mut s = if text.is_empty() { format!("#{id}") } else { format!("{text:?}") };
    if tok.stop.contains(&id) {
        s.push_str(" (end of turn)");
    }
    s
}

/// What a run decodes besides its tree: sampling, seed, length and stop tokens.
pub struct Decoding {
    /// Temperature, top-k, top-p.
    pub sampling: SampleParams,
    /// RNG seed.
    pub seed: u64,
    /// Maximum new tokens.
    pub max_new_tokens: usize,
    /// Stop tokens.
    pub stop: Vec<u32>,
}

/// Build generation parameters from CLI values (shared with `bench` and `profile`) over the
/// library's defaults ([`GenParams::new`]): an option not given keeps the library's value.
/// `lookup`: the one `--lookup` value of this run. `platform`: the backend's [`Platform`],
/// which picks the default budget and lookup graft (`--tree-prep auto` is resolved by the
/// engine). Errors name the option: zero counts, a bad `--lookup` or `--lookup-drafter`, a
/// lookup chain longer than the engine takes; then [`GenParams::validate`]'s.
pub fn gen_params(
    method: Method,
    budget: Option<BudgetChoice>,
    tree: &TreeArgs,
    lookup: Option<&str>,
    dec: Decoding,
    platform: &Platform,
) -> Result<GenParams> {
    tree.check_counts()?;
    let d = GenParams::new(method, platform).with_budget(budget.unwrap_or(BudgetChoice::Auto));
    let t = &d.tree;
    let mut p = GenParams {
        tree: TreeParams {
            budget: t.budget,
            candidates: tree.candidates.unwrap_or(t.candidates),
            max_fanout: tree.max_fanout.unwrap_or(t.max_fanout),
            treespark_k: tree.treespark_k.unwrap_or(t.treespark_k),
            prep: tree.tree_prep.map_or(t.prep, TreePrep::from),
        },
        sampling: dec.sampling,
        seed: dec.seed,
        max_new_tokens: dec.max_new_tokens,
        stop: dec.stop,
        ..d
    };
    if method.drafter_kind().is_some() {
        p.lookup = lookup_graft(method, lookup, tree.lookup_drafter, platform)?;
    }
    if method == Method::Lookup && p.auto_budget.is_none() && p.tree.budget > MAX_CHAIN {
        return Err(Error::Input(format!("--budget {}: {}", p.tree.budget, chain_limit())));
    }
    p.validate()?;
    Ok(p)
}

/// What [`MAX_CHAIN`] means, for the errors of the options that set a chain length.
fn chain_limit() -> String {
    format!("a lookup chain of at most {MAX_CHAIN} tokens (longer chains repeat one phrase and cost a verify row per token)")
}

/// The `--lookup` / `--lookup-drafter` choice of a method with a drafter (`None`: the
/// option's default, [`Platform::lookup_graft`]). Errors name the option and the values
/// it takes.
pub fn lookup_graft(method: Method, len: Option<&str>, drafter: Option<LookupDrafterArg>, platform: &Platform) -> Result<LookupGraft> {
    let mut g = platform.lookup_graft(method);
    match len.map(str::trim) {
        None => {}
        Some(s) if s.eq_ignore_ascii_case("auto") => {}
        Some(s) if s.eq_ignore_ascii_case("off") => g.len = 0,
        Some(s) => {
            let len = s.parse::<usize>().map_err(|_| Error::Input(format!("--lookup `{s}`: expected `auto`, `off` or a chain length in tokens (0 = off)")))?;
            if len > MAX_CHAIN {
                return Err(Error::Input(format!("--lookup {len}: {}", chain_limit())));
            }
            // The backend's drafter policy (fallback on the cpu), also for the methods off by default.
            g = LookupGraft { len, skip_drafter: platform.host_memory };
        }
    }
    match drafter {
        None => {}
        Some(LookupDrafterArg::Fallback) => g.skip_drafter = true,
        Some(LookupDrafterArg::Always) => g.skip_drafter = false,
    }
    if drafter.is_some() && g.len == 0 {
        return Err(Error::Input("--lookup-drafter needs a lookup chain: --lookup is off for this method (give --lookup N)".into()));
    }
    Ok(g)
}

/// Print a human-readable stats summary to stderr.
pub fn print_stats(method: Method, s: &Stats) {
    let [d, p, h, v, a, c] = s.per_round_ms();
    let plural = sparkling::decode::stats::count;
    let prefill = format!("prefill {} in {:.0} ms", plural(s.prompt_tokens, "token"), s.prefill_ms);
    if s.new_tokens == 0 {
        eprintln!("\n[{}] no new token (--max-new-tokens 0 or a stop at once): {prefill}", method.name());
    } else if s.rounds == 0 {
        // Only the prefill's own next token: no round to report on.
        eprintln!("\n[{}] {} from the prefill, no decode round: {prefill}", method.name(), plural(s.new_tokens, "new token"));
    } else {
        eprintln!(
            "\n[{}] {} in {}: τ = {:.2} tokens/round (bonus included), {:.1} tokens/s decode, {prefill}",
            method.name(),
            plural(s.new_tokens, "new token"),
            plural(s.rounds, "round"),
            s.tau(),
            s.tokens_per_s(),
        );
        eprintln!("  per round (ms): draft {d:.2} | prep {p:.2} | heap {h:.3} | verify {v:.2} | accept {a:.3} | compact {c:.3}");
    }
    if !s.accepted_at_depth.is_empty() {
        let acc: Vec<String> = s.conditional_acceptance().iter().take(16).map(|x| format!("{x:.2}")).collect();
        eprintln!("  conditional acceptance by depth: {}", acc.join(" "));
    }
    if let Some(h) = size_histogram(s) {
        eprintln!("  tree sizes (nodes: rounds): {h}");
    }
    if let Some(lt) = s.lookup_tau() {
        eprintln!("  lookup chain verified in {} of {} rounds (τ {lt:.2} there)", s.lookup_rounds, s.rounds);
    }
    if let Some(dm) = s.drafter_ms_per_run() {
        eprintln!(
            "  drafter: {dm:.2} ms in each of the {} it ran (of {}; the draft figure above averages over every round)",
            plural(s.drafter_rounds, "round"),
            s.rounds
        );
    }
    if let Some((pred, obs)) = s.predicted_vs_observed_tau() {
        eprintln!(
            "  budget auto: drafter ran in {} of {} rounds (skipped by the policy in {}{}{}); drafted rounds τ predicted {pred:.2} vs observed {obs:.2} (per-round error {:.2} tokens rms); policy {:.1} µs/round",
            s.predicted_rounds,
            s.rounds,
            s.drafts_skipped,
            if s.final_rounds > 0 { ", not needed in the last round, where only its bonus token was left" } else { "" },
            if s.predicted_rounds + s.drafts_skipped + s.final_rounds < s.rounds { ", the rest lookup rounds" } else { "" },
            s.prediction_rmse().unwrap_or(0.0),
            s.policy_us_per_round()
        );
    }
}

/// The chosen tree sizes as `n: rounds` pairs (sizes with no round left out), or `None` when
/// no round had a drafter.
pub fn size_histogram(s: &Stats) -> Option<String> {
    let parts: Vec<String> = s.tree_sizes.iter().enumerate().filter(|(_, &c)| c > 0).map(|(n, c)| format!("{n}: {c}")).collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// Run `generate` on the backend named by `--backend`.
pub fn run(a: GenerateArgs) -> Result<()> {
    let method = Method::from(a.method);
    let given = a.tree.given("--budget", a.budget.is_some(), !a.model.drafter.is_empty());
    super::refuse_unused_options(&given, &[method], &format!("--method {}", method.name()))?;
    if let Some(p) = &a.stats_json {
        sparkling::fsio::check_writable(p, "--stats-json")?; // fail before the generation, not after
    }
    if a.system.is_some() && a.chat.is_none() {
        // Not clap's `requires`: clap drops it when a conflicting prompt option is given.
        return Err(Error::Input("--system is a system message for --chat: give --chat TEXT, or leave --system out".into()));
    }
    // Refuse bad values before loading anything.
    super::refuse_greedy_sampling_options(a.temperature, Some(a.top_k), Some(a.top_p), a.seed)?;
    a.tree.check_counts()?;
    let lookup = a.tree.one_lookup()?;
    if let Some(b) = &a.budget {
        if BudgetChoice::parse(b, "--budget")? != BudgetChoice::Auto && a.tree.no_confidence {
            return Err(Error::Input(
                "--no-confidence is read by --budget auto only: leave --budget out (auto is the default), or leave --no-confidence out".into(),
            ));
        }
    }
    a.tree.note_no_confidence();
    if method.drafter_kind().is_some() {
        // Bad values before loading.
        lookup_graft(method, lookup, a.tree.lookup_drafter, &Platform::HOST)?;
    }
    let kinds: Vec<_> = method.drafter_kind().into_iter().collect();
    with_loaded!(&a.model, &kinds, |m| generate(m, method, &a))
}

/// `generate` on a loaded model, any backend.
fn generate<B: Backend>(m: Loaded<B>, method: Method, a: &GenerateArgs) -> Result<()> {
    let prompt: Vec<u32> = match (&a.chat, &a.prompt, &a.prompt_ids) {
        (_, _, Some(ids)) => ids.clone(),
        (Some(c), _, _) | (_, Some(c), _) => {
            let tok = m.tokenizer.as_ref().ok_or_else(|| Error::Input("no tokenizer for this target: pass --tokenizer or give --prompt-ids".into()))?;
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
    let mut stop = stop_tokens(&m.models.target.cfg.eos, m.tokenizer.as_ref().map_or(&[][..], |t| &t.stop));
    if a.ignore_eos {
        stop.clear();
    }
    let budget = a.budget.as_deref().map(|b| BudgetChoice::parse(b, "--budget")).transpose()?;
    let dec = Decoding {
        sampling: SampleParams { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p },
        seed: a.seed,
        max_new_tokens: a.max_new_tokens,
        stop,
    };
    let mut params = gen_params(method, budget, &a.tree, a.tree.one_lookup()?, dec, &Platform::of(&m.backend))?;
    super::bound_tree(&mut params.tree, m.models.target.cfg.vocab, method);
    let cost_path = super::costs::cache_path(&a.model, &m.target_path, &m.backend.name());
    super::costs::attach(&mut params, &cost_path);
    let engine = m.models.engine(&m.backend, method)?;
    let mut text = TextStream::new();
    let stdout = std::io::stdout();
    // A failed write to stdout: a closed pipe ends the program quietly, unless a stats file is
    // still to be written (then the run finishes without printing); other errors are reported.
    let mut out_err: Option<std::io::Error> = None;
    let token_text = |t: u32| match (&m.tokenizer, a.ids) {
        (Some(tok), false) => token_label(tok, t),
        _ => t.to_string(),
    };
    let mut show = |r: &RoundView<'_>| {
        if a.show_tree {
            // Like the eprintln! shadow in main.rs: a failed stderr write never panics.
            // A line of its own on a terminal, where the streamed answer shares the screen.
            let _ = write!(std::io::stderr(), "\n{}", render_round(r, &token_text));
        }
    };
    let g = engine.generate_observed(
        &prompt,
        &params,
        &mut |new| {
            if out_err.is_some() {
                return;
            }
            let mut out = stdout.lock();
            let mut r = Ok(());
            if a.ids || m.tokenizer.is_none() {
                for t in new {
                    r = r.and_then(|_| write!(out, "{t} "));
                }
            } else if let Some(tok) = &m.tokenizer {
                // Only the new text: a short window is decoded, not the whole output.
                if let Ok(tail) = text.push(tok, new) {
                    r = write!(out, "{tail}");
                }
            }
            if let Err(e) = r.and_then(|_| out.flush()) {
                if a.stats_json.is_none() {
                    eprintln!("error: {}", super::stdout_error(e));
                    std::process::exit(1);
                }
                out_err = Some(e);
            }
        },
        &mut show,
    )?;
    let saved = a.stats_json.as_ref().map(|p| {
        // τ is null when no round ran (the one token came from the prefill).
        let tau = (g.stats.rounds > 0).then(|| g.stats.tau());
        let v = serde_json::json!({"method": method.name(), "tokens": g.tokens, "stopped": g.stopped, "tau": tau, "tokens_per_s": g.stats.tokens_per_s(), "stats": g.stats});
        sparkling::fsio::write_bytes(p, serde_json::to_string_pretty(&v).unwrap_or_default().as_bytes())
    });
    if let Some(e) = out_err {
        if let Some(c) = &g.cost_model {
            super::costs::save(&cost_path, c);
        }
        return Err(super::stdout_error(e));
    }
    // What the detokenizer still holds: an answer cut inside a multi-token character.
    if let (Some(tok), false) = (&m.tokenizer, a.ids) {
        let tail = text.finish(tok)?;
        if !tail.is_empty() {
            let mut out = stdout.lock();
            write!(out, "{tail}").and_then(|_| out.flush()).map_err(super::stdout_error)?;
        }
    }
    outln!()?;
    // After the answer's last line, so its note does not run on from the streamed text.
    if let Some(c) = &g.cost_model {
        super::costs::save(&cost_path, c);
    }
    // The statistics reach stderr even when the --stats-json write failed (then its error).
    print_stats(method, &g.stats);
    eprintln!("  kernels: {} | target matmuls: {}", m.backend.name(), m.models.target.kernel_paths(&m.backend));
    saved.transpose()?;
    Ok(())
}
