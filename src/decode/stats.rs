//! Per-generation statistics (design §6): time per round stage in ms, acceptance length τ and
//! the per-depth acceptance histogram.

use super::propose::Proposal;
use serde::Serialize;

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
    /// Tokens committed by the rounds, including each round's bonus token (Σ τ).
    pub committed: usize,
    /// Target prefill, ms.
    pub prefill_ms: f64,
    /// Drafter forward + logits download, ms.
    pub draft_ms: f64,
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
    }
    /// Per-round means of each stage, ms: (draft, prep, heap, verify, accept, compact).
    pub fn per_round_ms(&self) -> [f64; 6] {
        let r = self.rounds.max(1) as f64;
        [self.draft_ms / r, self.prep_ms / r, self.heap_ms / r, self.verify_ms / r, self.accept_ms / r, self.compact_ms / r]
    }
}
