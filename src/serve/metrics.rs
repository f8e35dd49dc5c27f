//! The server's counters, in Prometheus text format (`GET /metrics`). Speculation counters use
//! the names vLLM and llama-server share (`spec_decode_num_drafts`, `…_num_draft_tokens`,
//! `…_num_accepted_tokens`, `…_num_accepted_tokens_per_pos{position}`), so dashboards built for
//! them read ours; every name carries the `sparkling:` prefix as theirs carry `vllm:` /
//! `llamacpp:`.

use crate::decode::prefix::PrefixStats;
use crate::decode::Stats;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

/// Upper bounds (seconds) of the latency histograms' buckets.
pub const BUCKETS_S: [f64; 14] = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24];

/// A cumulative histogram of seconds.
#[derive(Debug, Default)]
pub struct Histogram {
    inner: Mutex<(Vec<u64>, u64, f64)>,
}

impl Histogram {
    /// Count one observation of `s` seconds.
    pub fn observe(&self, s: f64) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.0.is_empty() {
            g.0 = vec![0; BUCKETS_S.len()];
        }
        for (i, &b) in BUCKETS_S.iter().enumerate() {
            if s <= b {
                g.0[i] += 1;
            }
        }
        g.1 += 1;
        g.2 += s;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, b) in BUCKETS_S.iter().enumerate() {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {}", g.0.get(i).copied().unwrap_or(0));
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}", g.1, g.2, g.1);
    }
}

/// Everything `/metrics` reports.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Finished HTTP requests by status code (every endpoint).
    pub requests: Mutex<BTreeMap<u16, u64>>,
    /// Prompt tokens of admitted generation requests.
    pub prompt_tokens: AtomicU64,
    /// Of those, the tokens reused from the prefix cache instead of prefilled.
    pub prompt_tokens_cached: AtomicU64,
    /// Bytes the prefix cache holds.
    pub prefix_cache_bytes: AtomicI64,
    /// Entries the prefix cache holds.
    pub prefix_cache_entries: AtomicI64,
    /// Prefix-cache entries evicted (least recently used first) to stay within its budget.
    pub prefix_cache_evictions: AtomicU64,
    /// Tokens generated.
    pub generation_tokens: AtomicU64,
    /// Requests waiting for a place in the batch.
    pub queued: AtomicI64,
    /// Sequences in the batch.
    pub running: AtomicI64,
    /// Target forwards (batch steps) run.
    pub steps: AtomicU64,
    /// Σ sequences over steps (mean occupancy = this ÷ `steps`).
    pub step_seqs: AtomicU64,
    /// Generations cancelled because their client went away (a stop string is a normal finish).
    pub cancelled: AtomicU64,
    /// Rounds that verified a drafted or looked-up tree.
    pub drafts: AtomicU64,
    /// Proposed tokens verified (tree nodes other than the roots).
    pub draft_tokens: AtomicU64,
    /// Proposed tokens the target accepted.
    pub accepted_tokens: AtomicU64,
    /// Accepted tokens per depth (index 0 = position 1).
    pub accepted_per_pos: Mutex<Vec<u64>>,
    /// Rounds the policy ran as plain AR steps (the drafter skipped, or nothing to propose).
    pub ar_rounds: AtomicU64,
    /// Time to first token, s.
    pub ttft: Histogram,
    /// Time between streamed tokens, s.
    pub itl: Histogram,
}

impl Metrics {
    /// Count a finished HTTP request.
    pub fn request(&self, status: u16) {
        *self.requests.lock().unwrap_or_else(|p| p.into_inner()).entry(status).or_default() += 1;
    }

    /// Add a finished generation's speculation counters.
    pub fn generation(&self, s: &Stats) {
        let ar = s.tree_sizes.first().copied().unwrap_or(0);
        let drafted = s.tree_sizes.iter().skip(1).sum::<usize>();
        self.drafts.fetch_add(drafted as u64, Ordering::Relaxed);
        self.ar_rounds.fetch_add(ar as u64, Ordering::Relaxed);
        self.draft_tokens.fetch_add(s.verified_nodes.saturating_sub(s.rounds) as u64, Ordering::Relaxed);
        let accepted: usize = s.accepted_at_depth.iter().sum();
        self.accepted_tokens.fetch_add(accepted as u64, Ordering::Relaxed);
        let mut per = self.accepted_per_pos.lock().unwrap_or_else(|p| p.into_inner());
        if per.len() < s.accepted_at_depth.len() {
            per.resize(s.accepted_at_depth.len(), 0);
        }
        for (p, &a) in per.iter_mut().zip(&s.accepted_at_depth) {
            *p += a as u64;
        }
    }

    /// Take the prefix cache's gauges and evictions from its counters.
    pub fn prefix(&self, p: &PrefixStats) {
        self.prefix_cache_bytes.store(p.bytes as i64, Ordering::Relaxed);
        self.prefix_cache_entries.store(p.entries as i64, Ordering::Relaxed);
        self.prefix_cache_evictions.store(p.evictions, Ordering::Relaxed);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let counter = |o: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(o, "# HELP sparkling:{name} {help}\n# TYPE sparkling:{name} counter\nsparkling:{name} {v}");
        };
        let gauge = |o: &mut String, name: &str, help: &str, v: i64| {
            let _ = writeln!(o, "# HELP sparkling:{name} {help}\n# TYPE sparkling:{name} gauge\nsparkling:{name} {v}");
        };
        let _ = writeln!(o, "# HELP sparkling:requests_total HTTP requests answered, by status code.\n# TYPE sparkling:requests_total counter");
        for (code, n) in self.requests.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(o, "sparkling:requests_total{{status=\"{code}\"}} {n}");
        }
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counter(&mut o, "prompt_tokens_total", "Prompt tokens of admitted generation requests.", ld(&self.prompt_tokens));
        counter(&mut o, "generation_tokens_total", "Tokens generated.", ld(&self.generation_tokens));
        counter(&mut o, "prompt_tokens_cached_total", "Prompt tokens reused from the prefix cache instead of prefilled.", ld(&self.prompt_tokens_cached));
        // vLLM's names for the same counts (queried and hit prompt tokens), so its hit-rate
        // panels read ours.
        counter(&mut o, "prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", ld(&self.prompt_tokens));
        counter(&mut o, "prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", ld(&self.prompt_tokens_cached));
        gauge(&mut o, "prefix_cache_bytes", "Host memory the prefix cache holds, bytes.", self.prefix_cache_bytes.load(Ordering::Relaxed));
        gauge(&mut o, "prefix_cache_entries", "Prompt prefixes the prefix cache holds.", self.prefix_cache_entries.load(Ordering::Relaxed));
        counter(&mut o, "prefix_cache_evictions_total", "Prefix-cache entries evicted to stay within its budget.", ld(&self.prefix_cache_evictions));
        gauge(&mut o, "num_requests_waiting", "Requests queued for a place in the batch.", self.queued.load(Ordering::Relaxed));
        gauge(&mut o, "num_requests_running", "Sequences in the batch (its occupancy).", self.running.load(Ordering::Relaxed));
        counter(&mut o, "batch_steps_total", "Target forwards run (one per batch step).", ld(&self.steps));
        counter(&mut o, "batch_step_sequences_total", "Sequences summed over steps (mean occupancy = this / batch_steps_total).", ld(&self.step_seqs));
        counter(&mut o, "requests_cancelled_total", "Generations cancelled before their end because the client went away.", ld(&self.cancelled));
        counter(&mut o, "spec_decode_num_drafts_total", "Rounds that verified a proposed tree or chain.", ld(&self.drafts));
        counter(&mut o, "spec_decode_num_draft_tokens_total", "Proposed tokens verified.", ld(&self.draft_tokens));
        counter(&mut o, "spec_decode_num_accepted_tokens_total", "Proposed tokens accepted.", ld(&self.accepted_tokens));
        let _ = writeln!(
            o,
            "# HELP sparkling:spec_decode_num_accepted_tokens_per_pos_total Proposed tokens accepted, by position in the round.\n# TYPE sparkling:spec_decode_num_accepted_tokens_per_pos_total counter"
        );
        for (i, n) in self.accepted_per_pos.lock().unwrap_or_else(|p| p.into_inner()).iter().enumerate() {
            let _ = writeln!(o, "sparkling:spec_decode_num_accepted_tokens_per_pos_total{{position=\"{}\"}} {n}", i + 1);
        }
        counter(&mut o, "spec_decode_num_ar_rounds_total", "Rounds the policy ran as plain AR steps.", ld(&self.ar_rounds));
        self.ttft.render(&mut o, "sparkling:time_to_first_token_seconds", "From request arrival to the first generated token.");
        self.itl.render(&mut o, "sparkling:inter_token_latency_seconds", "Between consecutive streamed token batches, per token.");
        o
    }
}
