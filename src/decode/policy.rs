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
}

/// One sequence's round policy (module docs).
pub trait RoundPolicy: Send {
    /// Plan the round described by `ctx`.
    fn plan(&mut self, ctx: &RoundCtx<'_>) -> Plan;

    /// The part of the drafted `tree` to verify, given the drafter's time this round
    /// (`draft_ms`: forward + tree build) and, where [`RoundPolicy::reads_confidence`], the
    /// DSpark confidence head's path product per node. `None`: verify it whole.
    fn prune(&mut self, tree: &DraftTree, draft_ms: f64, confidence: Option<&[f64]>) -> Option<Decision> {
        let _ = (tree, draft_ms, confidence);
        None
    }

    /// Whether [`RoundPolicy::prune`] reads the confidence head.
    fn reads_confidence(&self) -> bool {
        false
    }

    /// Learn from a verified round.
    fn observe(&mut self, round: &Observed<'_>) {
        let _ = round;
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
    /// Weigh predictions by the drafter's confidence head (where it has one).
    pub confidence: bool,
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

    fn prune(&mut self, tree: &DraftTree, draft_ms: f64, confidence: Option<&[f64]>) -> Option<Decision> {
        Some(self.state.choose(tree, draft_ms, confidence))
    }

    fn reads_confidence(&self) -> bool {
        self.confidence
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
pub struct Graft<P> {
    /// The drafter's policy.
    pub inner: P,
    /// The graft's length and skip rule.
    pub rule: LookupGraft,
}

impl<P: RoundPolicy> RoundPolicy for Graft<P> {
    fn plan(&mut self, ctx: &RoundCtx<'_>) -> Plan {
        let chain = lookup::round_chain(ctx.prompt, ctx.out, self.rule.len, ctx.params);
        if !chain.is_empty() && self.rule.skip_drafter {
            return Plan::Chain(chain);
        }
        match self.inner.plan(ctx) {
            Plan::Draft { depth, .. } => Plan::Draft { depth, graft: chain },
            Plan::Ar { .. } if !chain.is_empty() => Plan::Chain(chain),
            p => p,
        }
    }

    fn prune(&mut self, tree: &DraftTree, draft_ms: f64, confidence: Option<&[f64]>) -> Option<Decision> {
        self.inner.prune(tree, draft_ms, confidence)
    }

    fn reads_confidence(&self) -> bool {
        self.inner.reads_confidence()
    }

    fn observe(&mut self, round: &Observed<'_>) {
        self.inner.observe(round)
    }

    fn into_auto_state(self: Box<Self>) -> Option<AutoState> {
        Box::new(self.inner).into_auto_state()
    }
}

/// The policy of a sequence under `p` (method, budget, lookup): [`PromptLookup`] for `lookup`
/// (chains of `lookup_len`), [`Fixed`] for `ar` and fixed budgets, [`Auto`] with `auto` (a
/// drafter method under `--budget auto` whose state is ready), each in a [`Graft`] where `p`
/// grafts a lookup chain.
pub fn for_params(p: &GenParams, drafter: bool, lookup_len: usize, auto: Option<AutoState>) -> Box<dyn RoundPolicy> {
    fn graft<P: RoundPolicy + 'static>(inner: P, rule: LookupGraft) -> Box<dyn RoundPolicy> {
        if rule.len > 0 {
            Box::new(Graft { inner, rule })
        } else {
            Box::new(inner)
        }
    }
    let rule = if drafter { p.lookup } else { LookupGraft::OFF };
    match (p.method, auto) {
        (super::Method::Lookup, _) => Box::new(PromptLookup { len: lookup_len }),
        (_, Some(state)) if drafter => {
            let confidence = p.auto_budget.as_ref().is_some_and(|a| a.confidence);
            graft(Auto { state, confidence }, rule)
        }
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
    fn fixed_drafts_the_full_depth_and_ar_never_drafts() {
        let p = GenParams::new(Method::DSpark, &Platform::HOST).with_budget(super::super::budget::BudgetChoice::Fixed(8));
        assert_eq!(for_params(&p, true, 0, None).plan(&ctx(&p, &[1], &[2])), Plan::Draft { depth: 4, graft: vec![] });
        let p = GenParams::new(Method::Ar, &Platform::HOST);
        assert_eq!(for_params(&p, false, 0, None).plan(&ctx(&p, &[1], &[2])), Plan::Ar { skipped: false });
    }
}
