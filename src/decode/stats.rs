//! Per-generation statistics (design §6): time per round stage in ms, acceptance length τ and
//! the per-depth acceptance histogram.

use super::propose::Proposal;
use serde::Serialize;

/// `n` and `noun`, the noun in the plural unless `n` is 1 (`1 token`, `3 tokens`, `0 rounds`):
/// the counts the stats lines and errors print. `noun` is a singular English noun that takes
/// an `s`.
pub fn count(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// Accumulated timings (milliseconds, summed over rounds) and acceptance counts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens (after stop/max trimming), the prefill's first token included.
    pub new_tokens: usize,
    /// Tokens emitted by the decode rounds (excludes the first token, which the prefill emits).
    pub decode_tokens: usize,
    /// Verify rounds (prefill excluded).
    pub rounds: usize,
    /// Tokens committed by the rounds, including each round's bonus token (Σ τ); a last round
    /// cut by a stop token or `max_new_tokens` counts only the tokens it kept.
    pub committed: usize,
    /// Target prefill, ms.
    pub prefill_ms: f64,
    /// Proposing, ms: the drafter forward + logits download, and the prompt-lookup scan
    /// (`lookup_ms`). Rounds that skip the drafter add only their lookup scan.
    pub draft_ms: f64,
    /// Of `draft_ms`: the prompt-lookup scan (`lookup`, `--lookup`), ms.
    pub lookup_ms: f64,
    /// Rounds in which the drafter's forward ran ([`Stats::drafter_ms_per_run`]).
    pub drafter_rounds: usize,
    /// Candidate / top-k / Markov table preparation, ms.
    pub prep_ms: f64,
    /// Host heap (tree build), ms.
    pub heap_ms: f64,
    /// Target verify forward, ms.
    pub verify_ms: f64,
    /// Sampling + tree walk, ms.
    pub accept_ms: f64,
    /// KV compaction + feature carry, ms.
    pub compact_ms: f64,
    /// Whole decode phase (all rounds), ms.
    pub decode_ms: f64,
    /// Sum of verified tree sizes (root included).
    pub verified_nodes: usize,
    /// `accepted_at_depth[d]` = rounds whose accepted path reached depth `d+1`.
    pub accepted_at_depth: Vec<usize>,
    /// `tree_sizes[n]` = rounds that verified `n` non-root nodes (methods with a drafter;
    /// under `--budget auto` the chosen sizes, 0 = a plain AR step).
    pub tree_sizes: Vec<usize>,
    /// Rounds in which `--budget auto` skipped the drafter (plain AR steps; their taps are fed
    /// to the drafter when it next runs).
    pub drafts_skipped: usize,
    /// Rounds that drafted nothing because only the last token (the round's bonus) was left
    /// to generate: no drafted node could have been committed (`decode::round::useful_depth`).
    pub final_rounds: usize,
    /// `--budget auto`: rounds with a prediction (the drafter ran), the tokens the policy
    /// predicted for them (calibrated, bonus included) and the tokens they committed.
    pub predicted_rounds: usize,
    /// Σ predicted tokens of those rounds.
    pub predicted_tokens: f64,
    /// Σ committed tokens of those rounds.
    pub predicted_rounds_committed: usize,
    /// Σ (predicted − committed tokens)² of those rounds: how well the policy predicts a
    /// single round ([`Stats::prediction_rmse`]).
    pub predicted_sq_err: f64,
    /// `--budget auto`, per depth `d` (index `d - 1`): the drafter's raw predicted mass of the
    /// verified depth-`d` nodes (path probabilities, [`super::budget::Decision::raw_mass`]),
    /// summed over the rounds whose
    /// tree reached depth `d` …
    pub calib_predicted: Vec<f64>,
    /// … and the number of those rounds whose accepted path reached depth `d`.
    pub calib_accepted: Vec<usize>,
    /// Rounds that verified a prompt-lookup chain: beside (or, skipping the drafter, instead
    /// of) the drafter's tree (`--lookup`; [`super::LookupGraft`]), or `lookup`'s own chain
    /// (its rounds with a match).
    pub lookup_rounds: usize,
    /// Tokens those rounds committed (accepted path + bonus): τ of the lookup rounds =
    /// `lookup_committed / lookup_rounds` ([`Stats::lookup_tau`]).
    pub lookup_committed: usize,
    /// Time spent in the `--budget auto` policy (choice, truncation, bookkeeping), µs.
    pub policy_us: f64,
    /// Time spent measuring the cost model (first use only), ms.
    pub cost_measure_ms: f64,
    /// Steps of the decode loop this generation took part in (prefill chunks included).
    pub steps: usize,
    /// From joining the loop to the first generated token, ms.
    pub first_token_ms: f64,
    /// From joining the loop to leaving it, ms (the per-request latency).
    pub latency_ms: f64,
}

impl Stats {
    /// Account one verify round: the proposal's stage times (a download of the whole draft
    /// logits counts as drafting), the verified tree (root included) and the accepted path of
    /// `accepted` nodes, root included (= accepted drafts + the bonus token: the round's τ).
    pub fn record_round(&mut self, prop: &Proposal, accepted: usize) {
        self.draft_ms += prop.download_ms;
        self.prep_ms += prop.prep_ms;
        self.heap_ms += prop.heap_ms;
        self.rounds += 1;
        self.verified_nodes += prop.tree.len();
        self.committed += accepted;
        let depth_reached = accepted.saturating_sub(1);
        if self.accepted_at_depth.len() < depth_reached {
            self.accepted_at_depth.resize(depth_reached, 0);
        }
        for c in self.accepted_at_depth.iter_mut().take(depth_reached) {
            *c += 1;
        }
    }

    /// Account a round's verified tree size (non-root nodes).
    pub fn record_size(&mut self, n: usize) {
        if self.tree_sizes.len() <= n {
            self.tree_sizes.resize(n + 1, 0);
        }
        self.tree_sizes[n] += 1;
    }

    /// Account a `--budget auto` round in which the drafter ran: the predicted tokens, the
    /// committed tokens (accepted path + bonus), the raw predicted mass per depth (index =
    /// depth, `None` where the tree had no node) and the depth the accepted path reached.
    pub fn record_prediction(&mut self, predicted: f64, committed: usize, raw_mass: &[Option<f64>], reached: usize) {
        self.predicted_rounds += 1;
        self.predicted_tokens += predicted;
        self.predicted_rounds_committed += committed;
        self.predicted_sq_err += (predicted - committed as f64).powi(2);
        for (d, m) in raw_mass.iter().enumerate().skip(1) {
            if let Some(m) = m {
                if self.calib_predicted.len() < d {
                    self.calib_predicted.resize(d, 0.0);
                    self.calib_accepted.resize(d, 0);
                }
                self.calib_predicted[d - 1] += m;
                self.calib_accepted[d - 1] += usize::from(reached >= d);
            }
        }
    }

    /// `--budget auto`: (predicted τ, observed τ) over the rounds in which the drafter ran.
    pub fn predicted_vs_observed_tau(&self) -> Option<(f64, f64)> {
        (self.predicted_rounds > 0).then(|| {
            let r = self.predicted_rounds as f64;
            (self.predicted_tokens / r, self.predicted_rounds_committed as f64 / r)
        })
    }

    /// `--budget auto`: root-mean-square error of the predicted tokens of a drafted round
    /// against the tokens it committed (tokens; `None` before any drafted round).
    pub fn prediction_rmse(&self) -> Option<f64> {
        (self.predicted_rounds > 0).then(|| (self.predicted_sq_err / self.predicted_rounds as f64).sqrt())
    }

    /// τ of the rounds that verified a `--lookup` chain (`None` before any such round).
    pub fn lookup_tau(&self) -> Option<f64> {
        (self.lookup_rounds > 0).then(|| self.lookup_committed as f64 / self.lookup_rounds as f64)
    }

    /// Policy time per round, µs.
    pub fn policy_us_per_round(&self) -> f64 {
        self.policy_us / self.rounds.max(1) as f64
    }

    /// Mean acceptance length τ: committed tokens per round, bonus included (reference §6.1,
    /// round-weighted).
    pub fn tau(&self) -> f64 {
        if self.rounds == 0 {
            0.0
        } else {
            self.committed as f64 / self.rounds as f64
        }
    }
    /// Decode tokens per second: tokens emitted by the rounds over the rounds' wall time
    /// (prefill and its first token excluded).
    pub fn tokens_per_s(&self) -> f64 {
        if self.decode_ms <= 0.0 {
            0.0
        } else {
            self.decode_tokens as f64 / (self.decode_ms / 1000.0)
        }
    }
    /// Conditional acceptance per depth: P(depth d accepted | depth d-1 accepted).
    pub fn conditional_acceptance(&self) -> Vec<f64> {
        let mut prev = self.rounds;
        self.accepted_at_depth
            .iter()
            .map(|&c| {
                let r = if prev == 0 { 0.0 } else { c as f64 / prev as f64 };
                prev = c;
                r
            })
            .collect()
    }
    /// Add another generation's counts.
    pub fn merge(&mut self, o: &Stats) {
        self.prompt_tokens += o.prompt_tokens;
        self.new_tokens += o.new_tokens;
        self.decode_tokens += o.decode_tokens;
        self.rounds += o.rounds;
        self.committed += o.committed;
        self.prefill_ms += o.prefill_ms;
        self.draft_ms += o.draft_ms;
        self.lookup_ms += o.lookup_ms;
        self.drafter_rounds += o.drafter_rounds;
        self.prep_ms += o.prep_ms;
        self.heap_ms += o.heap_ms;
        self.verify_ms += o.verify_ms;
        self.accept_ms += o.accept_ms;
        self.compact_ms += o.compact_ms;
        self.decode_ms += o.decode_ms;
        self.verified_nodes += o.verified_nodes;
        if self.accepted_at_depth.len() < o.accepted_at_depth.len() {
            self.accepted_at_depth.resize(o.accepted_at_depth.len(), 0);
        }
        for (a, b) in self.accepted_at_depth.iter_mut().zip(&o.accepted_at_depth) {
            *a += b;
        }
        if self.tree_sizes.len() < o.tree_sizes.len() {
            self.tree_sizes.resize(o.tree_sizes.len(), 0);
        }
        for (a, b) in self.tree_sizes.iter_mut().zip(&o.tree_sizes) {
            *a += b;
        }
        self.drafts_skipped += o.drafts_skipped;
        self.final_rounds += o.final_rounds;
        self.lookup_rounds += o.lookup_rounds;
        self.lookup_committed += o.lookup_committed;
        self.predicted_rounds += o.predicted_rounds;
        self.predicted_tokens += o.predicted_tokens;
        self.predicted_rounds_committed += o.predicted_rounds_committed;
        self.predicted_sq_err += o.predicted_sq_err;
        if self.calib_predicted.len() < o.calib_predicted.len() {
            self.calib_predicted.resize(o.calib_predicted.len(), 0.0);
            self.calib_accepted.resize(o.calib_accepted.len(), 0);
        }
        for (a, b) in self.calib_predicted.iter_mut().zip(&o.calib_predicted) {
            *a += b;
        }
        for (a, b) in self.calib_accepted.iter_mut().zip(&o.calib_accepted) {
            *a += b;
        }
        self.policy_us += o.policy_us;
        self.cost_measure_ms += o.cost_measure_ms;
        self.steps += o.steps;
        self.first_token_ms += o.first_token_ms;
        self.latency_ms += o.latency_ms;
    }
    /// Mean drafting time of the rounds whose drafter ran, ms: `draft_ms` without the lookup
    /// scans, ÷ `drafter_rounds` (`per_round_ms`'s draft column averages over every round,
    /// also those that skipped the drafter). `None` when the drafter never ran.
    pub fn drafter_ms_per_run(&self) -> Option<f64> {
        (self.drafter_rounds > 0).then(|| (self.draft_ms - self.lookup_ms).max(0.0) / self.drafter_rounds as f64)
    }
    /// Per-round means of each stage, ms: (draft, prep, heap, verify, accept, compact).
    pub fn per_round_ms(&self) -> [f64; 6] {
        let r = self.rounds.max(1) as f64;
        [self.draft_ms / r, self.prep_ms / r, self.heap_ms / r, self.verify_ms / r, self.accept_ms / r, self.compact_ms / r]
    }
}
