//! Held-out evaluation of a drafter during and after training: the step objective's
//! [`Metrics`] (loss terms, per-depth top-1 agreement, greedy-chain τ) averaged over evenly
//! spaced anchors of the holdout sequences.

use crate::cache::Sequence;
use crate::error::Result;
use crate::model::CandleDrafter;
use crate::train::{gather_rows, loss_and_metrics, RunConfig};

/// Metrics of one step or one evaluation.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Metrics {
    /// Weighted total loss.
    pub loss: f64,
    /// Weighted mean CE to the greedy token.
    pub ce: f64,
    /// Weighted mean KL to the target's top-k.
    pub kl: f64,
    /// Weighted mean L1 estimate.
    pub l1: f64,
    /// Weighted mean confidence BCE (DSpark).
    pub conf: f64,
    /// Top-1 agreement with the greedy token per depth (teacher forcing), depth 1 first.
    pub acc: Vec<f64>,
    /// Mean accepted length of the greedy chain (leading agreements + the bonus token): what
    /// the engine's `dflash` / `dspark` chain methods commit per round on this data.
    pub tau_chain: f64,
    /// Loss rows.
    pub rows: usize,
}

/// Evaluate on held-out sequences: up to `per_seq` evenly spaced anchors each (no update).
pub fn evaluate(m: &CandleDrafter, hold: &[Sequence], rc: &RunConfig, topk: usize, per_seq: usize) -> Result<Metrics> {
    let mut tot = Metrics::default();
    let mut anchors_total = 0usize;
    let mut tau_sum = 0.0;
    let mut acc_num = vec![0f64; m.cfg.draft_depth()];
    let mut acc_den = vec![0f64; m.cfg.draft_depth()];
    for seq in hold {
        let span = seq.len() - 1 - seq.prompt_len;
        let k = per_seq.min(span).max(1);
        let anchors: Vec<usize> = (0..k).map(|i| seq.prompt_len + i * span / k).collect();
        let na = anchors.len();
        let rows = gather_rows(m, &[(seq, anchors)], topk, rc.gamma)?;
        let depths: Vec<usize> = rows.meta.iter().map(|x| x.1).collect();
        let (_, mt) = loss_and_metrics(m, rows, rc, na)?;
        let w = mt.rows as f64;
        tot.loss += mt.loss * w;
        tot.ce += mt.ce * w;
        tot.kl += mt.kl * w;
        tot.l1 += mt.l1 * w;
        tot.conf += mt.conf * w;
        tot.rows += mt.rows;
        tau_sum += mt.tau_chain * na as f64;
        anchors_total += na;
        for (d, a) in mt.acc.iter().enumerate() {
            let c = depths.iter().filter(|&&x| x == d + 1).count() as f64;
            acc_num[d] += a * c;
            acc_den[d] += c;
        }
    }
    let w = tot.rows.max(1) as f64;
    tot.loss /= w;
    tot.ce /= w;
    tot.kl /= w;
    tot.l1 /= w;
    tot.conf /= w;
    tot.tau_chain = tau_sum / anchors_total.max(1) as f64;
    tot.acc = acc_num.iter().zip(&acc_den).map(|(n, d)| if *d > 0.0 { n / d } else { 0.0 }).collect();
    Ok(tot)
}
