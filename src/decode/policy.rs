//! The round-policy seam: what one round of a sequence verifies. A policy plans the round
//! before any drafter forward ([`RoundPolicy::plan`]: a plain AR step, a prompt-lookup chain
//! alone, or a drafted tree with a chain grafted onto it), may cut the drafted tree to the part
//! worth verifying ([`RoundPolicy::prune`]), and observes what the target accepted
//! ([`RoundPolicy::observe`]). The decode loop ([`super::batch`]) asks every sequence's policy
//! the same way, alone or batched (docs/design.md §8).
//!
//! Implementations:
//! - [`Fixed`]: every round drafts the whole tree budget;
//! - [`Auto`]: `--budget auto` ([`super::budget`]): skip the drafter where it does not pay and
//!   verify the prefix of the tree worth its measured cost;
//! - [`PromptLookup`]: method `lookup`, no drafter: the lookup chain, or an AR step;
//! - [`Graft`]: a drafter policy with prompt lookup beside it (`--lookup`).
//!
//! Whatever a policy plans, the target verifies it, so the tokens never depend on the policy.

use super::budget::{AutoState, Decision};
use super::lookup::{self, LookupGraft};
use super::GenParams;
use sparkling_core::tree::DraftTree;

/// What a round of one sequence needs to plan.
#[derive(Debug, Clone, Copy)]
pub struct RoundCtx<'a> {
    /// The sequence's parameters.
    pub params: &'a GenParams,
    /// Its prompt.
    pub prompt: &'a [u32],
    /// Its committed tokens (the round's anchor last).
    pub out: &'a [u32],
    /// The deepest drafted tree worth drafting: the drafter's depth, capped by the tree budget
    /// and by the tokens still to generate less the bonus (≥ 1; rounds with nothing left to
    /// draft are not planned).
    pub full_depth: usize,
    /// Rows the rest of the batch fed in the last step (0 alone): the load a tree's extra rows
    /// join.
    pub other_rows: usize,
}

/// A planned round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Verify the anchor alone (a plain AR step). `skipped`: a drafter was there and the
    /// policy chose not to run it.
    Ar {
        /// The policy skipped the drafter.
        skipped: bool,
    },
    /// Verify this prompt-lookup chain alone (no drafter forward).
    Chain(Vec<u32>),
    /// Run the drafter for `depth` rows, let [`RoundPolicy::prune`] cut its tree, and graft
    /// `graft` (a lookup chain, possibly empty) onto it.
    Draft {
        /// Draft depth (`1 ..= RoundCtx::full_depth`).
        depth: usize,
        /// The lookup chain grafted onto the drafted tree.
        graft: Vec<u32>,
    },
}

/// What a verified round showed, for [`RoundPolicy::observe`].
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// Rows the sequence verified (its tree, root included).
    pub rows: usize,
    /// Rows the rest of the batch fed in the same target forward.
    pub other_rows: usize,
    /// The target forward's time plus this sequence's acceptance, ms.
    pub verify_ms: f64,
    /// This sequence's time outside draft and verify (commit, KV compaction, taps, policy), ms.
    pub overhead_ms: f64,
    /// [`RoundPolicy::prune`]'s decision for a drafted round, if it made one.
    pub decision: Option<&'a Decision>,
    /// Accepted non-root nodes.
    pub reached: usize,
    /// The length of the lookup chain the round verified alone ([`Plan::Chain`]), if it did.
    pub chain: Option<usize>,
}

/// One sequence's round policy (module docs).
pub trait RoundPolicy: Send {
    /// Plan the round described by `ctx`.
    fn plan(&mut self, ctx: &RoundCtx<'_>) -> Plan;

    /// The part of the drafted `tree` to verify, given the drafter's time this round
    /// (`draft_ms`: forward + tree build). `None`: verify it whole.
    fn prune(&mut self, tree: &DraftTree, draft_ms: f64) -> Option<Decision> {
        let _ = (tree, draft_ms);
        None
    }

    /// Learn from a verified round.
    fn observe(&mut self, round: &Observed<'_>) {
        let _ = round;
    }

    /// The predicted time of a round that verifies `rows` rows, ms, at the load of the last
    /// planned round — where the policy has a cost model (`--budget auto`); `None` otherwise.
    fn round_ms(&self, rows: usize) -> Option<f64> {
        let _ = rows;
        None
    }

    /// The `--budget auto` state to hand to the next generation ([`super::Generation::auto_state`]).
    fn into_auto_state(self: Box<Self>) -> Option<AutoState> {
        None
    }
}

/// Every round drafts the whole tree budget (a drafter method at a fixed `--budget`), or is an
/// AR step (`ar`).
pub struct Fixed {
    /// Whether the sequence has a drafter.
    pub drafter: bool,
}

impl RoundPolicy for Fixed {
    fn plan(&mut self, ctx: &RoundCtx<'_>) -> Plan {
        if self.drafter {
            Plan::Draft { depth: ctx.full_depth, graft: Vec::new() }
        } else {
            Plan::Ar { skipped: false }
        }
    }
}

/// `--budget auto` ([`AutoState`]): the drafter runs while recent rounds predicted a gain over
/// AR (with probes while it does not), as deep as recent kept trees, and each drafted tree is
/// cut to the prefix of its pop order worth its predicted cost.
pub struct Auto {
    /// The policy state (cost model, calibration, draft/skip schedule).
    pub state: AutoState,
}

impl RoundPolicy for Auto {
    fn plan(&mut self, ctx: &RoundCtx<'_>) -> Plan {
        self.state.set_load(ctx.other_rows);
        if self.state.should_draft() {
            Plan::Draft { depth: self.state.draft_depth(ctx.full_depth), graft: Vec::new() }
        } else {
            Plan::Ar { skipped: true }
        }
    }

    fn prune(&mut self, tree: &DraftTree, draft_ms: f64) -> Option<Decision> {
        Some(self.state.choose(tree, draft_ms))
    }

    fn round_ms(&self, rows: usize) -> Option<f64> {
        Some(self.state.verify_ms(rows) + self.state.round_ms())
    }

    fn observe(&mut self, r: &Observed<'_>) {
        let drafted = r.decision.map(|d| (&d.raw_mass[..], r.reached));
        self.state.observe_rows(r.other_rows, r.rows, r.verify_ms, r.overhead_ms, drafted);
    }

    fn into_auto_state(self: Box<Self>) -> Option<AutoState> {
        Some(self.state)
    }
}

/// Method `lookup` (no drafter): the chain that followed the most recent earlier occurrence of
/// the context's last tokens, up to `len` tokens ([`lookup::round_chain`]), or an AR step
/// without a match.
pub struct PromptLookup {
    /// Longest chain.
    pub len: usize,
}

impl RoundPolicy for PromptLookup {
    fn plan(&mut self, ctx: &RoundCtx<'_>) -> Plan {
        let chain = lookup::round_chain(ctx.prompt, ctx.out, self.len, ctx.params);
        if chain.is_empty() {
            Plan::Ar { skipped: false }
        } else {
            Plan::Chain(chain)
        }
    }
}

/// A drafter policy with prompt lookup beside it ([`LookupGraft`]): each round's lookup chain
/// is grafted onto the drafted tree, or, with `skip_drafter`, a round whose lookup matched
/// verifies the chain alone. A round the inner policy plans as an AR step still verifies a
/// chain that matched.
///
/// Under load (other sequences' rows in the same forward) and with an inner policy that has a
/// cost model (`--budget auto`), a chain verified alone is cut to the prefix with the most
/// expected tokens per ms, from its positions' acceptance learnt on this sequence's chain
/// rounds ([`ChainRates`]); a chain not worth one row leaves the round to the inner policy.
/// Alone, the chain is verified whole (a per-position rule measured neutral there,
/// BENCHMARKS.md §38).
pub struct Graft<P> {
    /// The drafter's policy.
    pub inner: P,
    /// The graft's length and skip rule.
    pub rule: LookupGraft,
    /// Acceptance of the chains verified alone, by position.
    pub rates: ChainRates,
}

impl<P> Graft<P> {
    /// `inner` with the lookup rule `rule`.
    pub fn new(inner: P, rule: LookupGraft) -> Self {
        Graft { inner, rule, rates: ChainRates::default() }
    }
}

impl<P: RoundPolicy> RoundPolicy for Graft<P> {
    fn plan(&mut self, ctx: &RoundCtx<'_>) -> Plan {
        let mut chain = lookup::round_chain(ctx.prompt, ctx.out, self.rule.len, ctx.params);
        if !chain.is_empty() && self.rule.skip_drafter {
            if ctx.other_rows > 0 {
                if let Some(n) = self.rates.worth(chain.len(), &|rows| self.inner.round_ms(rows)) {
                    chain.truncate(n);
                }
            }
            if !chain.is_empty() {
                return Plan::Chain(chain);
            }
        }
        match self.inner.plan(ctx) {
            Plan::Draft { depth, .. } => Plan::Draft { depth, graft: chain },
            Plan::Ar { .. } if !chain.is_empty() => Plan::Chain(chain),
            p => p,
        }
    }

    fn prune(&mut self, tree: &DraftTree, draft_ms: f64) -> Option<Decision> {
        self.inner.prune(tree, draft_ms)
    }

    fn observe(&mut self, round: &Observed<'_>) {
        if let Some(n) = round.chain {
            self.rates.observe(n, round.reached);
        }
        self.inner.observe(round)
    }

    fn round_ms(&self, rows: usize) -> Option<f64> {
        self.inner.round_ms(rows)
    }

    fn into_auto_state(self: Box<Self>) -> Option<AutoState> {
        Box::new(self.inner).into_auto_state()
    }
}

/// Positions of a lookup chain whose acceptance [`ChainRates`] tracks (later ones share the
/// last).
pub const CHAIN_POSITIONS: usize = 16;

/// The acceptance of lookup chains by position: `q[i]` = P(token `i` of the chain is accepted |
/// the tokens before it were), counts decayed by 0.98 per observation and started from a prior
/// of 2 pseudo-observations at 0.7.
#[derive(Debug, Clone, Default)]
pub struct ChainRates {
    tried: Vec<f64>,
    kept: Vec<f64>,
}

impl ChainRates {
    const DECAY: f64 = 0.98;
    const PRIOR: (f64, f64) = (2.0, 0.7);

    /// `q[i]`.
    pub fn rate(&self, i: usize) -> f64 {
        let i = i.min(CHAIN_POSITIONS - 1);
        let (w, p) = Self::PRIOR;
        (self.kept.get(i).copied().unwrap_or(0.0) + w * p) / (self.tried.get(i).copied().unwrap_or(0.0) + w)
    }

    /// Count a chain of `len` tokens verified alone whose first `reached` tokens were accepted.
    pub fn observe(&mut self, len: usize, reached: usize) {
        if self.tried.is_empty() {
            self.tried = vec![0.0; CHAIN_POSITIONS];
            self.kept = vec![0.0; CHAIN_POSITIONS];
        }
        for i in 0..CHAIN_POSITIONS {
            self.tried[i] *= Self::DECAY;
            self.kept[i] *= Self::DECAY;
        }
        for i in 0..len.min(reached + 1) {
            let k = i.min(CHAIN_POSITIONS - 1);
            self.tried[k] += 1.0;
            if i < reached {
                self.kept[k] += 1.0;
            }
        }
    }

    /// The chain prefix (of at most `len` tokens) with the most expected tokens per ms, by the
    /// policy's round time `ms(rows)` (`1 + n` rows for `n` chain tokens); 0 when a plain AR
    /// step does better. `None` without a cost model.
    pub fn worth(&self, len: usize, ms: &dyn Fn(usize) -> Option<f64>) -> Option<usize> {
        let ar = 1.0 / ms(1)?.max(1e-9);
        let (mut best, mut best_rate) = (0, ar);
        let (mut e, mut reach) = (1.0, 1.0);
        for n in 1..=len {
            reach *= self.rate(n - 1);
            e += reach;
            let r = e / ms(1 + n)?.max(1e-9);
            if r > best_rate {
                (best, best_rate) = (n, r);
            }
        }
        Some(best)
    }
}

/// The policy of a sequence under `p` (method, budget, lookup): [`PromptLookup`] for `lookup`
/// (chains of `lookup_len`), [`Fixed`] for `ar` and fixed budgets, [`Auto`] with `auto` (a
/// drafter method under `--budget auto` whose state is ready), each in a [`Graft`] where `p`
/// grafts a lookup chain.
pub fn for_params(p: &GenParams, drafter: bool, lookup_len: usize, auto: Option<AutoState>) -> Box<dyn RoundPolicy> {
    fn graft<P: RoundPolicy + 'static>(inner: P, rule: LookupGraft) -> Box<dyn RoundPolicy> {
        if rule.len > 0 {
            Box::new(Graft::new(inner, rule))
        } else {
            Box::new(inner)
        }
    }
    let rule = if drafter { p.lookup } else { LookupGraft::OFF };
    match (p.method, auto) {
        (super::Method::Lookup, _) => Box::new(PromptLookup { len: lookup_len }),
        (_, Some(state)) if drafter => graft(Auto { state }, rule),
        _ => graft(Fixed { drafter }, rule),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::platform::Platform;
    use crate::decode::Method;

    fn ctx<'a>(p: &'a GenParams, prompt: &'a [u32], out: &'a [u32]) -> RoundCtx<'a> {
        RoundCtx { params: p, prompt, out, full_depth: 4, other_rows: 0 }
    }

    #[test]
    fn lookup_plans_its_chain_or_an_ar_step() {
        let p = GenParams::new(Method::Lookup, &Platform::HOST);
        let mut pol = for_params(&p, false, 16, None);
        // "5 6" occurred before, followed by 7 8 9.
        assert_eq!(pol.plan(&ctx(&p, &[5, 6, 7, 8, 9, 1], &[5, 6])), Plan::Chain(vec![7, 8, 9, 1]));
        assert_eq!(pol.plan(&ctx(&p, &[1, 2, 3], &[4])), Plan::Ar { skipped: false });
    }

    #[test]
    fn a_graft_skips_the_drafter_on_a_match_only_with_skip_drafter() {
        let mut p = GenParams::new(Method::Sparkling, &Platform::HOST).with_budget(super::super::budget::BudgetChoice::Fixed(8));
        p.lookup = LookupGraft { len: 2, skip_drafter: true };
        let mut pol = for_params(&p, true, 0, None);
        assert_eq!(pol.plan(&ctx(&p, &[5, 6, 7, 8], &[5, 6])), Plan::Chain(vec![7, 8]));
        assert_eq!(pol.plan(&ctx(&p, &[1, 2], &[3])), Plan::Draft { depth: 4, graft: vec![] });
        p.lookup.skip_drafter = false;
        let mut pol = for_params(&p, true, 0, None);
        assert_eq!(pol.plan(&ctx(&p, &[5, 6, 7, 8], &[5, 6])), Plan::Draft { depth: 4, graft: vec![7, 8] });
    }

    #[test]
    fn chain_rates_cut_a_chain_to_the_prefix_worth_its_rows() {
        let mut r = ChainRates::default();
        // Chains of 6 whose first two tokens are kept, the third never.
        for _ in 0..200 {
            r.observe(6, 2);
        }
        assert!(r.rate(0) > 0.95 && r.rate(1) > 0.95 && r.rate(2) < 0.05);
        // Each row costs a tenth of an AR step: the two kept tokens pay, the rest do not.
        assert_eq!(r.worth(6, &|rows| Some(10.0 + (rows - 1) as f64)), Some(2));
        // Each row costs a whole AR step: nothing pays.
        assert_eq!(r.worth(6, &|rows| Some(10.0 * rows as f64)), Some(0));
        assert_eq!(r.worth(6, &|_| None), None);
    }

    #[test]
    fn fixed_drafts_the_full_depth_and_ar_never_drafts() {
        let p = GenParams::new(Method::DSpark, &Platform::HOST).with_budget(super::super::budget::BudgetChoice::Fixed(8));
        assert_eq!(for_params(&p, true, 0, None).plan(&ctx(&p, &[1], &[2])), Plan::Draft { depth: 4, graft: vec![] });
        let p = GenParams::new(Method::Ar, &Platform::HOST);
        assert_eq!(for_params(&p, false, 0, None).plan(&ctx(&p, &[1], &[2])), Plan::Ar { skipped: false });
    }
}
