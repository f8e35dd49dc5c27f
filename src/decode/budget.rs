//! `--budget auto` (issue 13): every round verifies only the draft nodes worth their cost.
//!
//! Four parts, each usable alone:
//!
//! 1. **The cost model** ([`CostModel`]), measured, not assumed: the target forward (+ the
//!    argmax read-back) of `r` verify rows for a handful of `r` in `1 ..= 1 + N_max`, on top of a
//!    real KV cache at the current context length, and one drafter forward. Between measured
//!    points the curve is piecewise linear; the points are placed on both sides of the usual
//!    kernel tile edges (4, 8, 16, 32, 48, 64 rows), so the staircase of a tiled kernel stays a
//!    staircase (no smoothing; only upward noise spikes are removed, `c(r) = min_{r' ≥ r} m(r')`).
//! 2. **Expected acceptance from the tree** ([`Calibration`], [`expected_tokens`]): the
//!    best-first heaps pop nodes in decreasing path probability, the expected number of
//!    accepted nodes of a tree is the sum of its nodes' path probabilities (DDTree,
//!    Proposition 1), so every prefix of the pop order is the best tree of its size. The
//!    drafter's probabilities are calibrated online, per depth, by the running ratio of the
//!    accepted to the predicted mass (exponentially decayed). (Weighing the nodes by a DSpark
//!    drafter's confidence head as well was measured neutral on the six sets, BENCHMARKS.md
//!    §26 c, and removed.)
//! 3. **The choice per round** ([`choose`], a pure function): `n* = argmax_n (1 + Σ_{i≤n} q̂_i)
//!    / (t_draft + c(1+n) + t_round)`, `n = 0` included. Whether to run the drafter at all is
//!    decided before it runs ([`AutoState::should_draft`]) from the predicted gain of the
//!    recent drafted rounds (an exponential average of `E(n*) − T(n*)/T_ar`, tokens gained over
//!    plain AR in the same time); while it is negative the drafter is skipped (a plain AR
//!    step) and re-tried after 4, 8, … 64 skipped rounds (probes of up to [`PROBE_BURST`]
//!    drafted rounds). The decode loop keeps the
//!    skipped rounds' taps and feeds them to the drafter when it next runs, so its context is
//!    exactly the one it would have had (its context rows are per-row K/V, independent of
//!    when they are written).
//!
//! 4. **Under load** ([`AutoState::set_load`]): in a batch, a tree's rows beyond the AR row
//!    are priced at their marginal cost in the batch's shared forward, so trees shrink toward
//!    AR steps as that forward becomes compute-bound. Alone, the cost is `c(1+n)` unchanged.
//!
//! A prompt-lookup chain matched in a round is verified whole (the lookup rule of
//! [`super::policy::Graft`]): an online per-position acceptance model that verified a chain
//! only where it beat an AR step was measured neutral on the six sets (within 0.5 %,
//! BENCHMARKS.md §38) and removed.
//!
//! Tokens never depend on any of this: the verify walks whatever tree it is given, so every
//! method stays equal to `ar` (T = 0) and to `ar` with the same seed (T > 0).

use crate::error::{Error, Result};
use crate::model::drafter::{DraftJob, Drafter};
use crate::model::layer::KvCache;
use crate::model::target::{LogitRows, SeqInput, Target};
use crate::tree::DraftTree;
use serde::{Deserialize, Serialize};
use sparkling_core::{AttnMask, Backend};
use web_time::Instant;

/// How many nodes a round verifies: a fixed budget, or chosen per round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetChoice {
    /// `--budget auto`: chosen per round, up to [`super::Platform::auto_max_budget`].
    Auto,
    /// `--budget N`: every round builds (up to) N non-root nodes.
    Fixed(usize),
}

impl BudgetChoice {
    /// Parse `auto` or a positive number of tree nodes. Errors ([`Error::Input`]) name the
    /// argument `arg` and the accepted values; 0 is refused (a tree of no nodes runs the
    /// drafter for nothing: plain decoding is `--method ar`, and `auto` skips the drafter
    /// when it does not pay).
    pub fn parse(s: &str, arg: &str) -> Result<BudgetChoice> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("auto") {
            return Ok(BudgetChoice::Auto);
        }
        match s.parse::<usize>() {
            Ok(n) if n >= 1 => Ok(BudgetChoice::Fixed(n)),
            _ => Err(Error::Input(format!("{arg} `{s}`: expected a positive tree budget (non-root nodes, ≥ 1) or `auto`"))),
        }
    }

    /// `auto` or the number.
    pub fn name(self) -> String {
        match self {
            BudgetChoice::Auto => "auto".into(),
            BudgetChoice::Fixed(n) => n.to_string(),
        }
    }
}

/// Options of `--budget auto` (see [`super::GenParams::auto_budget`]).
#[derive(Debug, Clone, Default)]
pub struct AutoBudget {
    /// A cost model measured earlier for this model × backend × threads × weights (the CLI
    /// caches it in the asset directory); `None`: the engine measures one after the prefill
    /// and returns it in [`super::Generation::cost_model`].
    pub cost: Option<CostModel>,
    /// The policy state a previous generation ended with ([`super::Generation::auto_state`]):
    /// its calibration, timings and draft/skip schedule carry over (a server or a benchmark
    /// keeps learning across requests); ignored when its N_max differs from `tree.budget`.
    pub resume: Option<AutoState>,
}

/// The measured cost of a round's parts (ms).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    /// Verify rows (root included) of the measured points, ascending, starting at 1.
    pub rows: Vec<usize>,
    /// Target forward + argmax read-back of `rows[i]` rows, ms (upward spikes removed).
    pub verify_ms: Vec<f64>,
    /// One drafter forward (+ the read-back of its logits), ms; 0 when not measured.
    pub draft_ms: f64,
    /// KV length the forwards ran on top of.
    pub context: usize,
    /// Wall time the measurement took, ms.
    pub measure_ms: f64,
    /// The backend's name.
    pub backend: String,
}

impl CostModel {
    /// A model from points (`rows` ascending from 1, same length as `ms`), as measured.
    pub fn from_points(rows: Vec<usize>, verify_ms: Vec<f64>, draft_ms: f64) -> CostModel {
        CostModel { rows, verify_ms, draft_ms, context: 0, measure_ms: 0.0, backend: String::new() }
    }

    /// The largest measured row count.
    pub fn max_rows(&self) -> usize {
        self.rows.last().copied().unwrap_or(0)
    }

    /// Whether the points are usable: non-empty, rows strictly ascending from 1, equal
    /// lengths, finite positive times.
    pub fn is_valid(&self) -> bool {
        !self.rows.is_empty()
            && self.rows.len() == self.verify_ms.len()
            && self.rows[0] == 1
            && self.rows.windows(2).all(|w| w[0] < w[1])
            && self.verify_ms.iter().all(|&m| m.is_finite() && m > 0.0)
            && self.draft_ms.is_finite()
            && self.draft_ms >= 0.0
    }

    /// `c(rows)`: piecewise-linear between the measured points (no smoothing, so a staircase
    /// measured on both sides of each step stays one); beyond the last point, the last
    /// segment's slope (never negative) continues.
    pub fn verify(&self, rows: usize) -> f64 {
        let (r, m) = (&self.rows, &self.verify_ms);
        if r.is_empty() {
            return 0.0;
        }
        match r.binary_search(&rows) {
            Ok(i) => m[i],
            Err(0) => m[0],
            Err(i) if i < r.len() => {
                let (r0, r1) = (r[i - 1] as f64, r[i] as f64);
                let t = (rows as f64 - r0) / (r1 - r0);
                m[i - 1] + t * (m[i] - m[i - 1])
            }
            Err(_) => {
                let n = r.len();
                if n < 2 {
                    return m[0] * rows as f64;
                }
                let slope = ((m[n - 1] - m[n - 2]) / (r[n - 1] - r[n - 2]) as f64).max(0.0);
                m[n - 1] + slope * (rows - r[n - 1]) as f64
            }
        }
    }

    /// The verify row counts to measure for trees of up to `n_max` non-root nodes: 1–6, then
    /// both sides of 8, 12, 16, 24, 32, 48 and 64, and `1 + n_max`.
    pub fn sample_rows(n_max: usize) -> Vec<usize> {
        let top = n_max + 1;
        let mut v: Vec<usize> = [1, 2, 3, 4, 5, 6, 8, 9, 12, 13, 16, 17, 24, 25, 32, 33, 48, 49, 64, 65].into_iter().filter(|&r| r <= top).collect();
        if v.last() != Some(&top) {
            v.push(top);
        }
        v
    }

    /// Measure the verify curve for trees of up to `n_max` nodes on top of `cache` (which
    /// holds the context: rows `0 .. cache.len`; it is left as it was), with the given target
    /// `taps` requested as the decode loop does, and — when `drafter` is given with a few
    /// context rows of taps `[Lc, n_taps·H]` — one drafter forward on a scratch draft cache.
    /// Each point is timed once (twice when the first pass took under 150 ms; the minimum
    /// kept), so the whole measurement costs about one pass over the rows (a few hundred ms on
    /// a CPU for N_max = 16). Errors: backend failures.
    pub async fn measure<B: Backend>(
        b: &B,
        target: &Target<B>,
        cache: &mut KvCache<B>,
        anchor: u32,
        n_max: usize,
        taps: &[usize],
        drafter: Option<(&Drafter<B>, &B::Tensor)>,
    ) -> Result<CostModel> {
        let t0 = Instant::now();
        let start = cache.len;
        let rows = CostModel::sample_rows(n_max);
        let mut best = vec![f64::INFINITY; rows.len()];
        // Warm-up (first-touch allocations, index 0 of the schedule: 1 row), untimed; then up
        // to two timed passes. Read-backs go through the `_async` ops, so the measurement also
        // runs where a blocking read-back is impossible (WebGPU in a browser).
        let schedule: Vec<(Option<usize>, usize)> =
            std::iter::once((None, 1)).chain((0..2).flat_map(|_| rows.iter().copied().enumerate().map(|(i, r)| (Some(i), r)))).collect();
        for (k, &(slot, r)) in schedule.iter().enumerate() {
            if k == 1 + rows.len() && t0.elapsed().as_secs_f64() * 1e3 > 150.0 {
                break;
            }
            let toks = vec![anchor; r];
            let pos: Vec<u32> = (0..r as u32).map(|i| start as u32 + i).collect();
            let parents: Vec<u32> = (0..r).map(|i| if i == 0 { crate::tree::NO_PARENT } else { i as u32 - 1 }).collect();
            let t = Instant::now();
            let o = target.forward(
                b,
                cache,
                SeqInput { ids: &toks, positions: &pos, mask: AttnMask::Tree { parents: &parents }, logits: Some(LogitRows::All) },
                taps,
            )?;
            b.argmax_async(&o.logits).await?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            cache.crop(start);
            if let Some(i) = slot {
                best[i] = best[i].min(ms);
            }
        }
        // Remove upward noise spikes: the cost of r rows is at most that of any larger tree.
        for i in (0..best.len().saturating_sub(1)).rev() {
            best[i] = best[i].min(best[i + 1]);
        }
        let mut draft_ms = 0.0;
        if let Some((d, ctx)) = drafter {
            let lc = b.shape(ctx).0;
            let mut dc = d.new_cache(b, lc + d.cfg.block_size + 1)?;
            let t = Instant::now();
            let logits = d.draft(b, target, DraftJob { cache: &mut dc, taps: ctx, anchor, root_pos: lc, depth: n_max })?;
            b.download_async(&logits).await?;
            draft_ms = t.elapsed().as_secs_f64() * 1e3;
        }
        Ok(CostModel { rows, verify_ms: best, draft_ms, context: start, measure_ms: t0.elapsed().as_secs_f64() * 1e3, backend: b.name() })
    }
}

/// The policy's choice for one drafted round.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    /// Non-root nodes to verify (a prefix of the pop order).
    pub n: usize,
    /// Expected tokens committed (bonus included): `expected[n]`.
    pub expected: f64,
    /// Predicted round time, ms: `draft + c(1+n) + round`.
    pub ms: f64,
}

/// The arithmetic argmax of `expected[n] / (draft_ms + verify_ms(1 + n) + round_ms)` over
/// `n = 0 ..= expected.len() - 1` (`expected[n]`: expected tokens committed by the round when
/// it verifies the first `n` nodes of the pop order, `expected[0] = 1`: the bonus token).
/// Ties go to the smaller tree. An empty `expected` is treated as `[1]`.
pub fn choose(expected: &[f64], verify_ms: &dyn Fn(usize) -> f64, draft_ms: f64, round_ms: f64) -> Choice {
    let mut best = Choice { n: 0, expected: 1.0, ms: draft_ms + verify_ms(1) + round_ms };
    let mut best_rate = f64::NEG_INFINITY;
    for (n, &e) in expected.iter().enumerate() {
        let ms = draft_ms + verify_ms(1 + n) + round_ms;
        let rate = if ms > 0.0 { e / ms } else { f64::INFINITY };
        if rate > best_rate {
            best_rate = rate;
            best = Choice { n, expected: e, ms };
        }
    }
    best
}

/// Expected tokens `E(n)` for `n = 0 ..= q.len()` when the nodes (in pop order) of depths
/// `depths` with acceptance probabilities `q` (path probabilities, calibrated) are verified:
/// `E(n) = 1 + Σ_d P(depth d reached)`, where `P(depth d reached)` is the mass of the prefix's
/// depth-`d` nodes (disjoint events), clamped to `[0, P(depth d−1 reached)]` ⊆ `[0, 1]`.
/// Without the clamp (probabilities summing below 1 per depth) this is `1 + Σ_{i≤n} q_i`.
pub fn expected_tokens(depths: &[u32], q: &[f64]) -> Vec<f64> {
    let dmax = depths.iter().copied().max().unwrap_or(0) as usize;
    let mut mass = vec![0.0f64; dmax + 1];
    let mut out = Vec::with_capacity(q.len() + 1);
    out.push(1.0);
    for (&d, &qi) in depths.iter().zip(q) {
        mass[d as usize] += qi.max(0.0);
        let mut e = 1.0;
        let mut reach = 1.0f64;
        for &m in &mass[1..] {
            reach = reach.min(m);
            if reach <= 0.0 {
                break;
            }
            e += reach;
        }
        out.push(e);
    }
    out
}

/// Online calibration of the drafter's path probabilities, per depth: `factor(d) = (accepted
/// mass + prior · factor(d−1)) / (predicted mass + prior)`, `factor(0) = 1`, both masses
/// exponentially decayed (`decay` per observed round), where the predicted mass of a round at
/// depth `d` is the sum of the verified depth-`d` nodes' probabilities and the accepted mass
/// is 1 when the accepted path reached depth `d`. Depths a round's tree does not reach are not
/// updated. The prior shrinks a depth towards the depth above it, not towards 1: a drafter
/// whose first depth proved over-confident is not trusted deeper down until it earns it.
#[derive(Debug, Clone)]
pub struct Calibration {
    /// Decayed predicted mass per depth (index = depth, 0 unused).
    pub predicted: Vec<f64>,
    /// Decayed accepted mass per depth.
    pub accepted: Vec<f64>,
    /// Decay per update (0.98: a window of ~50 rounds).
    pub decay: f64,
    /// Pseudo-mass pulling the factor towards 1 while little is observed.
    pub prior: f64,
}

impl Default for Calibration {
    fn default() -> Self {
        Calibration { predicted: Vec::new(), accepted: Vec::new(), decay: 0.98, prior: 0.25 }
    }
}

impl Calibration {
    /// The factor of depth `d` (that of depth `d − 1` where nothing was observed; 1 at
    /// depth 0).
    pub fn factor(&self, d: usize) -> f64 {
        let mut f = 1.0;
        for k in 1..=d {
            let p = self.predicted.get(k).copied().unwrap_or(0.0);
            let a = self.accepted.get(k).copied().unwrap_or(0.0);
            f = (a + self.prior * f) / (p + self.prior);
        }
        f
    }

    /// The factors of depths `0 ..= dmax` (one pass).
    pub fn factors(&self, dmax: usize) -> Vec<f64> {
        let mut out = Vec::with_capacity(dmax + 1);
        out.push(1.0);
        for k in 1..=dmax {
            let p = self.predicted.get(k).copied().unwrap_or(0.0);
            let a = self.accepted.get(k).copied().unwrap_or(0.0);
            out.push((a + self.prior * out[k - 1]) / (p + self.prior));
        }
        out
    }

    /// Account one verified round: `mass[d]` = the predicted mass of the tree's depth-`d`
    /// nodes (`None` for depths without nodes), `reached` = the depth the accepted path reached.
    pub fn observe(&mut self, mass: &[Option<f64>], reached: usize) {
        if self.predicted.len() < mass.len() {
            self.predicted.resize(mass.len(), 0.0);
            self.accepted.resize(mass.len(), 0.0);
        }
        for (d, m) in mass.iter().enumerate().skip(1) {
            if let Some(m) = m {
                self.predicted[d] = self.decay * self.predicted[d] + m;
                self.accepted[d] = self.decay * self.accepted[d] + if reached >= d { 1.0 } else { 0.0 };
            }
        }
    }
}

/// The nodes of `tree` (root excluded) in pop order: path score descending, index ascending on
/// ties. For the best-first builders (ddtree, sparkling) and chains this is `1..len`; TreeSpark
/// returns its nodes depth-major and is re-ordered here. Every prefix is ancestor-closed
/// (a child's path score never exceeds its parent's, and a parent precedes its child).
pub fn pop_order(tree: &DraftTree) -> Vec<usize> {
    let mut order: Vec<usize> = (1..tree.len()).collect();
    if !tree.scores[1..].windows(2).all(|w| w[0] >= w[1]) {
        order.sort_by(|&a, &b| tree.scores[b].total_cmp(&tree.scores[a]).then(a.cmp(&b)));
    }
    order
}

/// `tree` restricted to the root and the first `n` nodes of `order` (see [`pop_order`]), in
/// the tree's own node order (so parents still precede children), parents remapped.
pub fn truncate(tree: &DraftTree, order: &[usize], n: usize) -> DraftTree {
    let n = n.min(order.len());
    if n == order.len() {
        return tree.clone();
    }
    let mut keep: Vec<usize> = order[..n].to_vec();
    keep.sort_unstable();
    let mut col = vec![u32::MAX; tree.len()];
    col[0] = 0;
    let mut out = DraftTree::root(tree.tokens[0]);
    for (j, &i) in keep.iter().enumerate() {
        col[i] = j as u32 + 1;
        out.tokens.push(tree.tokens[i]);
        out.parents.push(col[tree.parents[i] as usize]);
        out.depths.push(tree.depths[i]);
        out.scores.push(tree.scores[i]);
    }
    debug_assert!(out.is_well_formed(), "truncate: the kept prefix is not ancestor-closed");
    out
}

/// Exponential moving average.
#[derive(Debug, Clone, Copy)]
struct Ema {
    v: Option<f64>,
    alpha: f64,
}

impl Ema {
    fn new(alpha: f64) -> Ema {
        Ema { v: None, alpha }
    }
    fn push(&mut self, x: f64) {
        self.v = Some(match self.v {
            None => x,
            Some(v) => v + self.alpha * (x - v),
        });
    }
    fn get_or(&self, d: f64) -> f64 {
        self.v.unwrap_or(d)
    }
}

/// Longest run of skipped drafter calls between two probes.
pub const MAX_PROBE_INTERVAL: usize = 64;

/// Skipped drafter calls before the first probe (then 8, 16, … [`MAX_PROBE_INTERVAL`]).
pub const FIRST_PROBE_INTERVAL: usize = 4;

/// Drafted rounds of a probe ([`AutoState::should_draft`]): a drafter's per-round gains are
/// skewed (a missed round loses a fraction of a token, a hit gains one or more), and the first
/// round after a run of skips is its slowest (cold caches, the skipped tokens' taps to
/// consume), so a single-round probe mostly read as a loss and drafting never resumed although
/// it paid on average (BENCHMARKS.md §34 h: `--budget auto` then matched the best fixed budget).
pub const PROBE_BURST: usize = 8;

/// The per-generation state of `--budget auto`: the cost model with its online corrections,
/// the calibration, and the draft/skip schedule.
#[derive(Debug, Clone)]
pub struct AutoState {
    /// The measured cost model.
    pub cost: CostModel,
    /// N_max: nodes built per drafted round before truncation.
    pub n_max: usize,
    /// Per-depth calibration of the drafter's probabilities.
    pub calib: Calibration,
    /// Observed (verify + accept) / `cost.verify(rows)`: context growth and machine load.
    scale: Ema,
    /// Observed drafter forward + tree build, ms.
    draft_ms: Ema,
    /// Observed per-round overhead outside draft and verify (compaction, taps, policy), ms.
    round_ms: Ema,
    /// Predicted gain over AR of recent drafted rounds (tokens), see [`AutoState::should_draft`].
    gain: Ema,
    /// Drafter calls skipped since the last drafted round.
    skipped: usize,
    /// Skips before the next probe.
    interval: usize,
    /// Depths of the trees kept in the last [`DEPTH_WINDOW`] drafted rounds (newest last).
    kept_depths: std::collections::VecDeque<usize>,
    /// Drafted rounds left in the current probe ([`PROBE_BURST`]).
    burst: usize,
    /// Rows the rest of the batch feeds in the same target forward (0 alone): the extra rows
    /// of this sequence's tree are priced at their marginal cost in that forward
    /// ([`AutoState::verify_ms`]).
    load_rows: usize,
}

/// Drafted rounds whose kept tree depths steer [`AutoState::draft_depth`].
pub const DEPTH_WINDOW: usize = 8;

/// What [`AutoState::choose`] decided for a drafted round.
#[derive(Debug, Clone)]
pub struct Decision {
    /// The truncated tree to verify.
    pub tree: DraftTree,
    /// The choice (n, expected tokens, predicted ms).
    pub choice: Choice,
    /// The raw (uncalibrated) predicted mass per depth of the kept nodes: their path
    /// probabilities.
    pub raw_mass: Vec<Option<f64>>,
}

impl AutoState {
    /// A fresh state for trees of up to `n_max` nodes.
    pub fn new(cost: CostModel, n_max: usize) -> AutoState {
        AutoState {
            cost,
            n_max,
            calib: Calibration::default(),
            scale: Ema::new(0.2),
            draft_ms: Ema::new(0.3),
            round_ms: Ema::new(0.2),
            gain: Ema::new(0.5),
            skipped: 0,
            interval: FIRST_PROBE_INTERVAL,
            kept_depths: std::collections::VecDeque::new(),
            burst: 0,
            load_rows: 0,
        }
    }

    /// Depths to draft this round (of at most `max_depth`): the deepest tree kept in the last
    /// [`DEPTH_WINDOW`] drafted rounds plus 2 (room to grow), at least 2; `max_depth` before
    /// any round. A drafter forward costs by its block rows ([`crate::model::drafter::Drafter::block_rows`]),
    /// so rounds that keep 0–2 nodes draft with the smallest block and the observed
    /// drafter time (which the choice weighs) falls with them.
    pub fn draft_depth(&self, max_depth: usize) -> usize {
        match self.kept_depths.iter().max() {
            None => max_depth,
            Some(&d) => (d + 2).clamp(2, max_depth.max(2)).min(max_depth),
        }
    }

    /// Predicted verify (+ accept) time of a tree of `rows` rows now, ms: `c(rows)` alone;
    /// in a batch whose other sequences feed `L` rows ([`AutoState::set_load`]), the AR step's
    /// `c(1)` plus the marginal cost of the tree's other rows in that forward,
    /// `c(L + rows) − c(L + 1)` — so trees shrink toward AR steps as the batch's forward
    /// becomes compute-bound. Scaled by the observed / predicted ratio of recent rounds.
    pub fn verify_ms(&self, rows: usize) -> f64 {
        let c = &self.cost;
        let l = self.load_rows;
        let raw = if l == 0 || rows == 0 { c.verify(rows) } else { c.verify(1) + c.verify(l + rows) - c.verify(l + 1) };
        self.scale.get_or(1.0) * raw
    }

    /// Set the rows the rest of the batch feeds in this round's target forward (0: alone).
    pub fn set_load(&mut self, other_rows: usize) {
        self.load_rows = other_rows;
    }

    /// This state for the next generation ([`AutoBudget::resume`]): all it learnt, alone.
    pub fn resumed(&self) -> AutoState {
        AutoState { load_rows: 0, ..self.clone() }
    }

    /// Predicted drafter forward + tree build, ms.
    pub fn draft_ms(&self) -> f64 {
        self.draft_ms.get_or(self.cost.draft_ms)
    }

    /// Predicted per-round overhead, ms.
    pub fn round_ms(&self) -> f64 {
        self.round_ms.get_or(0.0)
    }

    /// Time of a plain AR round, ms.
    pub fn ar_ms(&self) -> f64 {
        self.verify_ms(1) + self.round_ms()
    }

    /// The longest probe interval: [`MAX_PROBE_INTERVAL`] rounds, stretched by the drafter's
    /// cost in AR steps when a drafter call costs more than one (so probes of a losing drafter
    /// cost at most ~1/64 of the decode time).
    pub fn max_interval(&self) -> usize {
        let steps = self.draft_ms() / self.ar_ms().max(1e-9);
        let k = if steps.is_finite() { steps.clamp(1.0, 16.0) } else { 1.0 };
        (MAX_PROBE_INTERVAL as f64 * k).round() as usize
    }

    /// Run the drafter this round? Yes while the recent drafted rounds predicted a gain over
    /// AR (and on the first round); else the round is a plain AR step, except every
    /// `interval`-th one, which starts a probe: [`PROBE_BURST`] drafted rounds (fewer when a
    /// round of it finds nothing worth verifying). The interval starts at
    /// [`FIRST_PROBE_INTERVAL`], doubles after each probe that ends still predicting a loss,
    /// up to [`AutoState::max_interval`], and resets once drafting pays.
    pub fn should_draft(&mut self) -> bool {
        if self.burst > 0 || self.gain.get_or(0.0) >= 0.0 {
            return true;
        }
        if self.skipped + 1 >= self.interval {
            self.burst = PROBE_BURST;
            return true;
        }
        self.skipped += 1;
        false
    }

    /// Choose the prefix of `tree`'s pop order to verify, the drafter's time this round
    /// (`draft_ms`, observed) included; updates the skip schedule. A node's predicted
    /// acceptance is its path probability `exp(score)` times the depth's calibration factor.
    pub fn choose(&mut self, tree: &DraftTree, draft_ms: f64) -> Decision {
        self.draft_ms.push(draft_ms);
        let order = pop_order(tree);
        let order = &order[..order.len().min(self.n_max)];
        let depths: Vec<u32> = order.iter().map(|&i| tree.depths[i]).collect();
        let dmax_all = depths.iter().copied().max().unwrap_or(0) as usize;
        let f = self.calib.factors(dmax_all);
        let raw = |i: usize| (tree.scores[i] as f64).exp();
        let q: Vec<f64> = order.iter().map(|&i| raw(i) * f[tree.depths[i] as usize]).collect();
        let expected = expected_tokens(&depths, &q);
        let (d, r) = (self.draft_ms(), self.round_ms());
        let choice = choose(&expected, &|rows| self.verify_ms(rows), d, r);
        // Gain over AR in the same time, tokens.
        let gain = choice.expected - choice.ms / self.ar_ms().max(1e-9);
        let was_probe = self.gain.get_or(0.0) < 0.0;
        self.gain.push(gain);
        if self.burst > 0 {
            // A probe burst ends early when this round found nothing worth verifying (a
            // hopeless drafter then costs one drafted round per probe, as before bursts).
            self.burst = if choice.n == 0 { 0 } else { self.burst - 1 };
            if self.burst == 0 && self.gain.get_or(0.0) < 0.0 {
                self.interval = (self.interval * 2).min(self.max_interval());
            } else if self.gain.get_or(0.0) >= 0.0 {
                self.interval = FIRST_PROBE_INTERVAL;
            }
        } else if self.gain.get_or(0.0) >= 0.0 {
            self.interval = FIRST_PROBE_INTERVAL;
        } else if was_probe {
            self.interval = (self.interval * 2).min(self.max_interval());
        }
        self.skipped = 0;
        let kept = truncate(tree, order, choice.n);
        let dmax = kept.depths.iter().copied().max().unwrap_or(0) as usize;
        if self.kept_depths.len() == DEPTH_WINDOW {
            self.kept_depths.pop_front();
        }
        self.kept_depths.push_back(dmax);
        let mut raw_mass: Vec<Option<f64>> = vec![None; dmax + 1];
        for &i in &order[..choice.n] {
            *raw_mass[tree.depths[i] as usize].get_or_insert(0.0) += raw(i);
        }
        Decision { tree: kept, choice, raw_mass }
    }

    /// Account a verified round: its rows, the observed verify + accept time, the observed
    /// overhead outside draft and verify, and — for a drafted round — the raw predicted mass
    /// per depth and the depth the accepted path reached.
    pub fn observe(&mut self, rows: usize, verify_ms: f64, overhead_ms: f64, drafted: Option<(&[Option<f64>], usize)>) {
        self.observe_rows(0, rows, verify_ms, overhead_ms, drafted)
    }

    /// [`AutoState::observe`] of a round verified in a batch forward whose other sequences fed
    /// `other_rows` rows (`verify_ms`: that whole forward, plus this sequence's acceptance).
    pub fn observe_rows(&mut self, other_rows: usize, rows: usize, verify_ms: f64, overhead_ms: f64, drafted: Option<(&[Option<f64>], usize)>) {
        let c = self.cost.verify(other_rows + rows);
        if c > 0.0 && verify_ms.is_finite() {
            self.scale.push((verify_ms / c).clamp(0.25, 4.0));
        }
        if overhead_ms.is_finite() {
            self.round_ms.push(overhead_ms.max(0.0));
        }
        if let Some((mass, reached)) = drafted {
            self.calib.observe(mass, reached);
        }
    }
}

#[cfg(test)]
mod tests;
