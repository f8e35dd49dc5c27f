//! `sparkling bench --batch N[,N…]`: the prompt set decoded N sequences at a time with the
//! batch API (`ar`, continuous batching: a finished sequence's slot goes to the next prompt at
//! once), one row per N: aggregate tokens/s over the whole set and per-sequence latency.

use super::bench::BenchArgs;
use super::load::Loaded;
use indicatif::{ProgressBar, ProgressStyle};
use sparkling::core::Backend;
use sparkling::decode::batch::{Batch, BatchOptions, SeqId};
use sparkling::decode::{GenParams, Method};
use sparkling::Result;
use std::collections::HashMap;
use std::fmt::Write as _;
use web_time::Instant;

/// One batch size's measurements.
struct Row {
    batch: usize,
    wall_s: f64,
    new_tokens: usize,
    steps: usize,
    rows: usize,
    latency_ms: Vec<f64>,
    first_token_ms: Vec<f64>,
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
fn run_one<B: Backend>(m: &Loaded<B>, prompts: &[Vec<u32>], params: &GenParams, n: usize, pb: &ProgressBar) -> Result<(Row, Vec<Vec<u32>>)> {
    let mut batch = Batch::new(&m.backend, &m.models.target, BatchOptions::default())?;
    let mut owner: HashMap<SeqId, usize> = HashMap::new();
    let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let mut row = Row { batch: n, wall_s: 0.0, new_tokens: 0, steps: 0, rows: 0, latency_ms: Vec::new(), first_token_ms: Vec::new(), mismatches: 0 };
    let t0 = Instant::now();
    let mut next = 0;
    while next < prompts.len() || !batch.is_empty() {
        while next < prompts.len() && batch.len() < n {
            owner.insert(batch.add(&prompts[next], params)?, next);
            next += 1;
        }
        for f in batch.step()?.finished {
            row.new_tokens += f.tokens.len();
            row.latency_ms.push(f.stats.latency_ms);
            row.first_token_ms.push(f.stats.first_token_ms);
            tokens[owner[&f.id]] = f.tokens;
            pb.inc(1);
        }
    }
    row.wall_s = t0.elapsed().as_secs_f64();
    row.steps = batch.stats().steps;
    row.rows = batch.stats().rows;
    Ok((row, tokens))
}

/// `bench --batch`: every batch size of `a.batch` over the prompt set, `ar` only.
pub fn bench_batch<B: Backend>(m: &Loaded<B>, prompts: &[Vec<u32>], params: &GenParams, a: &BenchArgs) -> Result<()> {
    if !a.methods.iter().any(|x| x == "ar") {
        eprintln!("note: --batch decodes with `ar` only (tree methods are not batched yet)");
    }
    let params = GenParams { method: Method::Ar, ..params.clone() };
    let pb = ProgressBar::new((a.batch.len() * prompts.len()) as u64);
    pb.set_style(ProgressStyle::with_template("{msg:12} [{bar:30}] {pos}/{len} {elapsed}").unwrap_or_else(|_| ProgressStyle::default_bar()));
    let mut rows = Vec::new();
    let mut reference: Option<Vec<Vec<u32>>> = None;
    for &n in &a.batch {
        pb.set_message(format!("ar batch {n}"));
        let (mut row, toks) = run_one(m, prompts, &params, n.max(1), &pb)?;
        match &reference {
            None => reference = Some(toks),
            Some(r) => row.mismatches = r.iter().zip(&toks).filter(|(x, y)| x != y).count(),
        }
        rows.push(row);
    }
    pb.finish_and_clear();
    let base = rows.iter().find(|r| r.batch == 1).map(|r| r.new_tokens as f64 / r.wall_s);
    let mut table = String::new();
    let _ = writeln!(table, "{} prompts, {} new tokens max, T={}, method ar, backend {}", prompts.len(), a.max_new_tokens, a.temperature, m.backend.name());
    let _ = writeln!(
        table,
        "| batch | aggregate tok/s | vs batch 1 | new tokens | wall s | rows/step | latency ms mean / p90 | first token ms mean | ≠ first row |"
    );
    let _ = writeln!(table, "|---|---|---|---|---|---|---|---|---|");
    let mut json_rows = Vec::new();
    for r in &rows {
        let agg = r.new_tokens as f64 / r.wall_s.max(1e-9);
        let speed = base.map(|x| agg / x).unwrap_or(f64::NAN);
        let lat = summary(&r.latency_ms);
        let ftl = summary(&r.first_token_ms);
        let rps = r.rows as f64 / r.steps.max(1) as f64;
        let _ = writeln!(
            table,
            "| {} | {agg:.1} | {speed:.2}× | {} | {:.1} | {rps:.1} | {:.0} / {:.0} | {:.0} | {} |",
            r.batch,
            r.new_tokens,
            r.wall_s,
            lat["mean"].as_f64().unwrap_or(0.0),
            lat["p90"].as_f64().unwrap_or(0.0),
            ftl["mean"].as_f64().unwrap_or(0.0),
            r.mismatches
        );
        json_rows.push(serde_json::json!({
            "method": "ar", "batch": r.batch, "aggregate_tokens_per_s": agg, "speedup_vs_batch_1": speed,
            "sequences": r.latency_ms.len(), "new_tokens": r.new_tokens, "wall_s": r.wall_s, "steps": r.steps,
            "rows_per_step": rps, "latency_ms": lat, "first_token_ms": ftl,
            "per_sequence_latency_ms": r.latency_ms, "outputs_differing_from_first_row": r.mismatches,
        }));
    }
    if let Some(j) = &a.json {
        let v = serde_json::json!({"prompts": prompts.len(), "max_new_tokens": a.max_new_tokens, "temperature": a.temperature, "backend": m.backend.name(), "rows": json_rows});
        sparkling::fsio::write_bytes(j, serde_json::to_string_pretty(&v).unwrap_or_default().as_bytes())?;
        eprintln!("wrote {}", j.display());
    }
    super::write_stdout(&table)
}
