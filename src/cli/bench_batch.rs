//! `sparkling bench --batch N[,N…]`: the prompt set decoded N sequences at a time with the
//! batch API (continuous batching: a finished sequence's slot goes to the next prompt at once),
//! one row per method × budget × N (`ar`: per N): aggregate tokens/s over the whole set
//! (prefills and the draining tail included), decode-only tokens/s (the steps that fed no
//! prompt row, the draining tail's among them: read it with its mean occupancy), τ (tokens committed per
//! sequence and decode step after the first token) and per-sequence latency. An untimed
//! 2–4-token decode of the first prompt runs before the first row.

use super::bench::BenchArgs;
use super::load::Loaded;
use indicatif::{ProgressBar, ProgressStyle};
use sparkling::core::Backend;
use sparkling::decode::batch::{Batch, BatchOptions, SeqId};
use sparkling::decode::stats::count;
use sparkling::decode::{GenParams, Method};
use sparkling::Result;
use std::collections::HashMap;
use std::fmt::Write as _;
use web_time::Instant;

/// One method × budget × batch size's measurements.
struct Row {
    method: Method,
    /// The run's label: its budget, and its lookup chain when it grafts one (`8, lookup 16`).
    budget: String,
    /// The tree budget (nodes below the root; 0 for `ar`).
    tree_budget: usize,
    /// The lookup graft, as the one-sequence bench's `lookup` column writes it (`-`, `off`,
    /// `16 fallback`).
    lookup: String,
    batch: usize,
    wall_s: f64,
    new_tokens: usize,
    steps: usize,
    rows: usize,
    latency_ms: Vec<f64>,
    first_token_ms: Vec<f64>,
    /// Σ per-sequence decode steps (for τ).
    seq_steps: usize,
    /// Drafter forwards and tree building, s.
    draft_s: f64,
    /// Steps that fed no prompt row (every sequence in them decoding): their wall time, s…
    decode_s: f64,
    /// …the tokens they committed…
    decode_tokens: usize,
    /// …and the sequences they carried, summed (÷ their count = the mean occupancy).
    decode_seqs: usize,
    /// How many such steps.
    decode_steps: usize,
    /// Σ per-sequence decode steps that verified a lookup chain.
    lookup_steps: usize,
    mismatches: usize,
}

/// Mean, median, 90th percentile and max of `v` (`0` for an empty slice).
fn summary(v: &[f64]) -> serde_json::Value {
    if v.is_empty() {
        return serde_json::json!({"mean": 0.0, "p50": 0.0, "p90": 0.0, "max": 0.0});
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let at = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize];
    serde_json::json!({"mean": s.iter().sum::<f64>() / s.len() as f64, "p50": at(0.5), "p90": at(0.9), "max": s[s.len() - 1]})
}

/// Decode `prompts` with at most `n` in flight; returns the row and each prompt's tokens.
fn run_one<B: Backend>(m: &Loaded<B>, prompts: &[Vec<u32>], budget: &str, params: &GenParams, n: usize, pb: &ProgressBar) -> Result<(Row, Vec<Vec<u32>>)> {
    let mut batch = Batch::new(&m.backend, &m.models.target, BatchOptions::default())?;
    if let Some(kind) = params.method.drafter_kind() {
        let d =
            m.models.drafter(kind).ok_or_else(|| sparkling::Error::Input(format!("method `{}` needs a {kind:?} drafter (--drafter)", params.method.name())))?;
        batch = batch.with_drafter(d)?;
    }
    let mut owner: HashMap<SeqId, usize> = HashMap::new();
    let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let mut row = Row {
        method: params.method,
        budget: budget.to_string(),
        tree_budget: if params.method == Method::Ar { 0 } else { params.tree.budget },
        lookup: super::bench::lookup_label(params.method, params),
        batch: n,
        wall_s: 0.0,
        new_tokens: 0,
        steps: 0,
        rows: 0,
        latency_ms: Vec::new(),
        first_token_ms: Vec::new(),
        seq_steps: 0,
        draft_s: 0.0,
        decode_s: 0.0,
        decode_tokens: 0,
        decode_seqs: 0,
        decode_steps: 0,
        lookup_steps: 0,
        mismatches: 0,
    };
    let mut prompt_len: HashMap<SeqId, usize> = HashMap::new();
    let t0 = Instant::now();
    let mut next = 0;
    while next < prompts.len() || !batch.is_empty() {
        while next < prompts.len() && batch.len() < n {
            let id = batch.add(&prompts[next], params)?;
            owner.insert(id, next);
            prompt_len.insert(id, prompts[next].len());
            next += 1;
        }
        let ts = Instant::now();
        let out = batch.step()?;
        let dt = ts.elapsed().as_secs_f64();
        // A decode-only step: every sequence in it fed a row past its prompt (no prefill chunk).
        if !out.seqs.is_empty() && out.seqs.iter().all(|s| prompt_len.get(&s.id).is_some_and(|&p| s.first_position >= p)) {
            row.decode_s += dt;
            row.decode_tokens += out.seqs.iter().map(|s| s.tokens.len()).sum::<usize>();
            row.decode_seqs += out.seqs.len();
            row.decode_steps += 1;
        }
        for f in out.finished {
            row.new_tokens += f.tokens.len();
            row.latency_ms.push(f.stats.latency_ms);
            row.first_token_ms.push(f.stats.first_token_ms);
            row.seq_steps += f.stats.rounds;
            row.lookup_steps += f.stats.lookup_rounds;
            tokens[owner[&f.id]] = f.tokens;
            pb.inc(1);
        }
    }
    row.wall_s = t0.elapsed().as_secs_f64();
    row.steps = batch.stats().steps;
    row.rows = batch.stats().rows;
    row.draft_s = batch.stats().draft_ms / 1e3;
    Ok((row, tokens))
}

/// `bench --batch`: every batch size of `a.batch` over the prompt set, for every run (a
/// method at a budget, its name and parameters). The "≠ first row" column counts the prompts
/// whose tokens differ from the first row's (at T = 0 every method emits the `ar` tokens).
pub fn bench_batch<B: Backend>(m: &Loaded<B>, prompts: &[Vec<u32>], runs: &[(String, GenParams)], a: &BenchArgs) -> Result<()> {
    let pb = ProgressBar::new((runs.len() * a.batch.len() * prompts.len()) as u64);
    pb.set_style(ProgressStyle::with_template("{msg:20} [{bar:30}] {pos}/{len} {elapsed}").unwrap_or_else(|_| ProgressStyle::default_bar()));
    let mut rows = Vec::new();
    let mut reference: Option<Vec<Vec<u32>>> = None;
    // One short untimed decode first, so that the first timed row does not also pay for the
    // process's first forwards (cold caches, the allocator's first requests).
    if let (Some((budget, params)), Some(first)) = (runs.first(), prompts.first()) {
        // At least one decode step after the prefill's token. Its result is not used: where it
        // fails (a prompt that leaves no room for its 2–4 tokens), the timed runs report why.
        let warm = GenParams { max_new_tokens: params.max_new_tokens.clamp(2, 4), ..params.clone() };
        let _ = run_one(m, std::slice::from_ref(first), budget, &warm, 1, &ProgressBar::hidden());
    }
    // `--budget auto` rows without a cached cost model: measured once here (and cached), not
    // by every sequence of the batch on its own cache.
    let cost_path = super::costs::cache_path(&a.model, &m.target_path, &m.backend.name());
    let mut runs = runs.to_vec();
    for (_, params) in runs.iter_mut() {
        super::costs::attach(params, &cost_path);
        if let (Some(ab), Some(first)) = (params.auto_budget.as_ref(), prompts.first()) {
            if ab.cost.is_none() && params.method.drafter_kind().is_some() {
                let probe = GenParams { max_new_tokens: 2, ..params.clone() };
                if let Some(c) = m.models.engine(&m.backend, params.method)?.generate(first, &probe, &mut |_| {})?.cost_model {
                    super::costs::save(&cost_path, &c);
                    params.auto_budget.as_mut().expect("auto").cost = Some(c);
                }
            }
        }
    }
    for (budget, params) in &runs {
        for &n in &a.batch {
            let what = if params.method == Method::Ar { "ar".to_string() } else { format!("{} b{budget}", params.method.name()) };
            pb.set_message(format!("{what} batch {n}"));
            let (mut row, toks) = run_one(m, prompts, budget, params, n.max(1), &pb)?;
            match &reference {
                None => reference = Some(toks),
                Some(r) => row.mismatches = r.iter().zip(&toks).filter(|(x, y)| x != y).count(),
            }
            rows.push(row);
        }
    }
    pb.finish_and_clear();
    // Speeds against `ar` at batch 1 of this run, when it ran.
    let ar1 = rows.iter().find(|r| r.batch == 1 && r.method == Method::Ar);
    let base = ar1.map(|r| r.new_tokens as f64 / r.wall_s);
    let decode_rate = |r: &Row| (r.decode_steps > 0).then(|| r.decode_tokens as f64 / r.decode_s.max(1e-9));
    let decode_base = ar1.and_then(decode_rate);
    let mut table = String::new();
    let _ =
        writeln!(table, "{}, {} max, T={}, backend {}", count(prompts.len(), "prompt"), count(a.max_new_tokens, "new token"), a.temperature, m.backend.name());
    let _ = writeln!(
        table,
        "| method | budget | batch | aggregate tok/s | vs ar batch 1 | decode-only tok/s (seqs/step) | decode vs ar batch 1 | τ | draft s | new tokens | wall s | rows/step | latency ms mean / p90 | first token ms mean | lookup steps (of sequence steps) | ≠ first row |"
    );
    let _ = writeln!(table, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut json_rows = Vec::new();
    for r in &rows {
        let agg = r.new_tokens as f64 / r.wall_s.max(1e-9);
        let speed = base.map(|x| agg / x).filter(|x| x.is_finite());
        // The steps with no prefill row (the draining tail's included), whose cost is decode alone.
        let dec = decode_rate(r);
        let dec_speed = dec.zip(decode_base).map(|(d, x)| d / x).filter(|x| x.is_finite());
        let occupancy = (r.decode_steps > 0).then(|| r.decode_seqs as f64 / r.decode_steps as f64);
        let lat = summary(&r.latency_ms);
        let ftl = summary(&r.first_token_ms);
        let rps = r.rows as f64 / r.steps.max(1) as f64;
        // τ: tokens after each sequence's first, per decode step.
        // (None when no sequence took a decode step: every answer was the prefill's one token.)
        let per_step = (r.seq_steps > 0).then(|| r.new_tokens.saturating_sub(r.latency_ms.len()) as f64 / r.seq_steps as f64);
        let budget = if r.method == Method::Ar { "-" } else { r.budget.as_str() };
        let _ = writeln!(
            table,
            "| {} | {budget} | {} | {agg:.1} | {} | {} | {} | {} | {:.2} | {} | {:.1} | {rps:.1} | {:.0} / {:.0} | {:.0} | {} | {} |",
            r.method.name(),
            r.batch,
            speed.map_or("–".to_string(), |x| format!("{x:.2}×")),
            dec.zip(occupancy).map_or("–".to_string(), |(d, o)| format!("{d:.1} ({o:.1})")),
            dec_speed.map_or("–".to_string(), |x| format!("{x:.2}×")),
            per_step.map_or("–".to_string(), |t| format!("{t:.2}")),
            r.draft_s,
            r.new_tokens,
            r.wall_s,
            lat["mean"].as_f64().unwrap_or(0.0),
            lat["p90"].as_f64().unwrap_or(0.0),
            ftl["mean"].as_f64().unwrap_or(0.0),
            // Per-sequence decode steps that verified a lookup chain (alone or grafted).
            // "-": the run proposes no lookup chain (`ar`, lookup off); else a count, 0 included.
            if r.method != Method::Lookup && (r.lookup == "-" || r.lookup == "off") { "-".into() } else { format!("{} of {}", r.lookup_steps, r.seq_steps) },
            r.mismatches
        );
        json_rows.push(serde_json::json!({
            "method": r.method.name(), "budget": r.tree_budget, "lookup": r.lookup, "label": budget, "batch": r.batch, "aggregate_tokens_per_s": agg,
            "speedup_vs_ar_batch_1": speed,
            "decode_only": {"tokens_per_s": dec, "speedup_vs_ar_batch_1": dec_speed, "steps": r.decode_steps, "seconds": r.decode_s, "tokens": r.decode_tokens, "mean_sequences_per_step": occupancy},
            "tau": per_step, "draft_s": r.draft_s,
            "sequences": r.latency_ms.len(), "new_tokens": r.new_tokens, "wall_s": r.wall_s, "steps": r.steps,
            "rows_per_step": rps, "lookup_steps": r.lookup_steps, "sequence_steps": r.seq_steps, "latency_ms": lat, "first_token_ms": ftl,
            "per_sequence_latency_ms": r.latency_ms, "outputs_differing_from_first_row": r.mismatches,
        }));
    }
    super::bench::dash_legend(&mut table);
    if let Some(j) = &a.json {
        let v = serde_json::json!({"prompts": prompts.len(), "max_new_tokens": a.max_new_tokens, "temperature": a.temperature, "backend": m.backend.name(), "rows": json_rows});
        sparkling::fsio::write_bytes(j, serde_json::to_string_pretty(&v).unwrap_or_default().as_bytes())?;
        eprintln!("wrote {}", j.display());
    }
    super::write_stdout(&table)
}
