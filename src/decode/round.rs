//! One round of one sequence, the pieces of the decode loop ([`super::batch::Batch::step_async`])
//! before and after the shared target forward: plan the round ([`super::policy`]), draft
//! (every sequence of a drafter in one packed forward, [`draft`]), build and prune the tree
//! and graft the lookup chain, then walk the target's tokens down the verified tree
//! ([`accept`]). Words: the *root* is node 0 of a draft tree, the *anchor* its token (the last
//! committed token), at position `root_pos`; *taps* are the target's tapped-layer features
//! (the drafter's context).

use super::budget::Decision;
use super::platform::Platform;
use super::policy::{Plan, RoundCtx, RoundPolicy};
use super::propose::{propose_scored, take_context, DraftLogits, Proposal, TreeParams, TreePrep};
use super::stats::Stats;
use super::{rng, GenParams, Method};
use crate::error::{Error, Result};
use crate::model::drafter::{DraftJob, Drafter};
use crate::model::layer::KvCache;
use crate::model::target::Target;
use sparkling_core::tree::DraftTree;
use sparkling_core::Backend;
use web_time::Instant;

/// A sequence's drafter state.
pub(super) struct Spec<'a, B: Backend> {
    pub drafter: &'a Drafter<B>,
    /// The drafter's own KV cache (its context K/V injected from the target's taps).
    pub dcache: KvCache<B>,
    /// Taps of committed tokens the drafter has not consumed yet: the prefill's chunks, then one
    /// entry per round (more than one after rounds that did not run the drafter).
    pub pending: Vec<B::Tensor>,
    /// Tree knobs with the prep resolved for the backend.
    pub tree: TreeParams,
}

/// One sequence's round in flight: what it verifies and how that came about.
pub(super) struct Round {
    /// What the policy planned.
    pub plan: Plan,
    /// The tree to verify (root = the anchor token), with its stage times.
    pub prop: Proposal,
    /// The policy's cut of a drafted tree.
    pub decision: Option<Decision>,
    /// The tree holds proposed tokens (drafted, looked up, or both).
    pub drafted: bool,
    /// It holds a prompt-lookup chain.
    pub looked_up: bool,
    /// Only the bonus token was left to generate: nothing was drafted.
    pub last_token: bool,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// How deep a drafted tree can still be useful after `committed` of `p.max_new_tokens` tokens:
/// a round commits its accepted path and the bonus token, and the commit is cut at
/// `max_new_tokens`, so nodes deeper than the tokens left less the bonus are verified for
/// nothing (0 in the round that commits the last token).
pub(super) fn useful_depth(p: &GenParams, committed: usize) -> usize {
    p.max_new_tokens.saturating_sub(committed + 1)
}

/// Plan the round of a sequence under `p` whose lookup context is `prompt` then `out` (the
/// anchor last), beside `other_rows` rows of other sequences, with `policy` (the round of the last token is an AR step without asking it),
/// and start its tree: an AR step's root, or the lookup chain alone. A drafted round's tree is
/// filled in by [`draft`]. Stage times and counts go to `stats`.
pub(super) fn plan<B: Backend>(
    policy: &mut dyn RoundPolicy,
    spec: Option<&Spec<'_, B>>,
    p: &GenParams,
    prompt: &[u32],
    out: &[u32],
    other_rows: usize,
    stats: &mut Stats,
) -> Round {
    let started = Instant::now();
    let anchor = *out.last().expect("a round follows the first token");
    let left = useful_depth(p, out.len());
    let full_depth = match spec {
        Some(s) => s.drafter.cfg.draft_depth().min(s.tree.budget.max(1)).min(left),
        None => left,
    };
    let plan = if left == 0 { Plan::Ar { skipped: false } } else { policy.plan(&RoundCtx { params: p, prompt, out, full_depth, other_rows }) };
    let dt = ms(started);
    stats.draft_ms += dt;
    if p.method == Method::Lookup || p.lookup.len > 0 {
        stats.lookup_ms += dt;
    } else {
        stats.policy_us += dt * 1e3;
    }
    let last_token = left == 0 && spec.is_some();
    stats.final_rounds += last_token as usize;
    let (tree, drafted, looked_up) = match &plan {
        Plan::Ar { skipped } => {
            stats.drafts_skipped += *skipped as usize;
            (DraftTree::root(anchor), false, false)
        }
        Plan::Chain(chain) => (DraftTree::chain(anchor, chain), true, true),
        Plan::Draft { graft, .. } => (DraftTree::root(anchor), true, !graft.is_empty()),
    };
    stats.lookup_rounds += looked_up as usize;
    Round { plan, prop: Proposal { tree, ..Proposal::default() }, decision: None, drafted, looked_up, last_token }
}

/// One sequence's part of [`draft`]: its drafter state, parameters, policy, stats and round.
pub(super) struct Drafting<'s, 'a, B: Backend> {
    pub spec: &'s mut Spec<'a, B>,
    pub params: &'s GenParams,
    pub policy: &'s mut dyn RoundPolicy,
    pub stats: &'s mut Stats,
    pub round: &'s mut Round,
    /// The root's position.
    pub root_pos: usize,
}

/// The drafted rounds of `seqs` (each planned [`Plan::Draft`]): every sequence of one drafter
/// drafts in ONE packed forward over its own draft cache and pending taps
/// ([`Drafter::draft_batch`], each sequence's logits the same bits as alone), then each builds
/// its tree ([`propose_scored`]), lets its policy cut the tree ([`RoundPolicy::prune`]) and grafts its lookup chain.
/// Errors: a sequence without pending taps (a logic error), backend failures.
pub(super) async fn draft<B: Backend>(b: &B, target: &Target<B>, platform: Platform, seqs: &mut [Drafting<'_, '_, B>]) -> Result<()> {
    let mut groups: Vec<&Drafter<B>> = Vec::new();
    for s in seqs.iter() {
        if !groups.iter().any(|d| std::ptr::eq(*d, s.spec.drafter)) {
            groups.push(s.spec.drafter);
        }
    }
    for d in groups {
        let t = Instant::now();
        let mut ctx = Vec::new();
        let mut members = Vec::new();
        for (i, s) in seqs.iter_mut().enumerate().filter(|(_, s)| std::ptr::eq(s.spec.drafter, d)) {
            if s.spec.pending.is_empty() {
                return Err(Error::Input(format!("decode loop: no drafter context for the round at position {}", s.root_pos)));
            }
            ctx.push(take_context(b, &mut s.spec.pending)?);
            members.push(i);
        }
        let mut jobs: Vec<DraftJob<'_, B>> = seqs
            .iter_mut()
            .filter(|s| std::ptr::eq(s.spec.drafter, d))
            .zip(&ctx)
            .map(|(s, taps)| DraftJob {
                depth: draft_depth(&s.round.plan),
                anchor: s.round.prop.tree.tokens[0],
                root_pos: s.root_pos,
                cache: &mut s.spec.dcache,
                taps,
            })
            .collect();
        let outs = d.draft_batch(b, target, &mut jobs)?;
        drop(jobs);
        let forward_ms = ms(t);
        for (&i, (logits, _hidden)) in members.iter().zip(outs) {
            let s = &mut seqs[i];
            let t = Instant::now();
            let depth = draft_depth(&s.round.plan);
            let anchor = s.round.prop.tree.tokens[0];
            let markov_dev =
                if s.params.method == Method::Sparkling && platform.tree_prep(s.spec.tree.prep) == TreePrep::Device { d.markov_device(b)? } else { None };
            let draft = DraftLogits::of(d, &logits, depth, markov_dev);
            let mut prop = propose_scored(b, s.params.method, &draft, anchor, &s.spec.tree, s.params.auto_budget.is_some()).await?;
            // The tree build's own stages go to `Stats::record_round` (download, prep, heap).
            s.stats.draft_ms += forward_ms;
            s.stats.drafter_rounds += 1;
            let tp = Instant::now();
            if let Some(dec) = s.policy.prune(&prop.tree, forward_ms + ms(t)) {
                prop.tree = dec.tree.clone();
                s.round.decision = Some(dec);
            }
            s.stats.policy_us += ms(tp) * 1e3;
            if let Plan::Draft { graft, .. } = &s.round.plan {
                prop.tree.graft_chain(graft);
            }
            s.round.prop = prop;
        }
    }
    Ok(())
}

/// The depth a planned round drafts (1 for a plan that does not draft).
fn draft_depth(plan: &Plan) -> usize {
    match plan {
        Plan::Draft { depth, .. } => *depth,
        _ => 1,
    }
}

/// Walk the target's tokens down `tree` (reference §4.9.1): from the root, the child whose
/// token equals the target's token at that node, until none does; that token is the bonus.
/// `token(i)` gives the target's token at node `i` (argmax at T = 0, else the counter-based
/// draw of the position node `i` predicts). Returns the accepted nodes (root first) and the
/// bonus token.
pub(super) async fn accept<F, Fut>(tree: &DraftTree, mut token: F) -> Result<(Vec<usize>, u32)>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<u32>>,
{
    let mut accepted = vec![0usize];
    let mut cur = 0usize;
    loop {
        let t = token(cur).await?;
        match tree.child_with_token(cur, t) {
            Some(child) => {
                accepted.push(child);
                cur = child;
            }
            None => return Ok((accepted, t)),
        }
    }
}

/// The target's tokens for `rows` of `logits` under `p`, row `i` predicting sequence position
/// `positions[i]`: argmax at `T < 1e-5`, else a draw with the counter-based uniform of that
/// position (so every method draws the same token at the same position).
pub(super) async fn pick<B: Backend>(b: &B, logits: &B::Tensor, p: &GenParams, positions: &[u64]) -> Result<Vec<u32>> {
    if p.sampling.temperature < 1e-5 {
        Ok(b.argmax_async(logits).await?)
    } else {
        let u: Vec<f32> = positions.iter().map(|&pos| rng::uniform(p.seed, pos)).collect();
        Ok(b.sample_async(logits, p.sampling, &u).await?)
    }
}
