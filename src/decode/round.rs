//! One round's proposal, the first step of the decode loop (design §6; the loop itself is
//! [`super::Engine::generate_observed_async`]): the prompt-lookup chain ([`super::lookup`]),
//! the drafter's tree under the `--budget auto` policy ([`super::budget`]), and the chain
//! grafted onto the tree ([`DraftTree::graft_chain`]) — what the target then verifies.

use super::budget::{AutoState, Decision};
use super::lookup;
use super::propose::{propose_scored, take_context, DraftLogits, Proposal, TreeParams};
use super::stats::Stats;
use super::{GenParams, Method};
use crate::error::Result;
use crate::model::drafter::Drafter;
use crate::model::layer::KvCache;
use crate::model::target::Target;
use sparkling_core::tree::DraftTree;
use sparkling_core::Backend;
use web_time::Instant;

/// What one round verifies, and how it came about.
pub(super) struct Round {
    /// The tree to verify (root = the anchor token), with its stage times.
    pub prop: Proposal,
    /// `--budget auto`'s choice for a drafted tree (`None`: no drafter forward this round).
    pub decision: Option<Decision>,
    /// Whether the tree holds any proposed token (drafted, looked up, or both).
    pub drafted: bool,
    /// Whether it holds a prompt-lookup chain (`lookup`'s own, or a `--lookup` graft).
    pub looked_up: bool,
    /// Whether the round drafted nothing because only its bonus token was left to generate.
    pub last_token: bool,
    /// The round's lookup match under `--budget auto` with `skip_drafter` (verified or not),
    /// for [`AutoState::observe_chain`] once the round has committed; `None` otherwise.
    pub chain: Option<lookup::Match>,
}

/// The proposing state of one generation: the drafter with its draft KV cache and the target
/// taps it has not consumed yet, and the parameters every round reads.
pub(super) struct Proposer<'a, B: Backend> {
    pub b: &'a B,
    pub target: &'a Target<B>,
    pub method: Method,
    pub drafter: Option<&'a Drafter<B>>,
    /// The drafter's own KV cache (its context K/V injected from the target's taps).
    pub dcache: Option<KvCache<B>>,
    /// Taps of committed tokens the drafter has not consumed yet (one entry per round; more
    /// than one after rounds that skipped the drafter). The loop pushes each round's.
    pub pending: Vec<B::Tensor>,
    /// The Markov head on the device (SparklingTree device prep), uploaded once.
    pub markov_dev: Option<(&'a B::Tensor, &'a B::Tensor)>,
    /// Tree parameters with the prep resolved for this backend.
    pub tree_params: TreeParams,
    /// `lookup`'s chain length ([`lookup::chain_len`]).
    pub lookup_len: usize,
    /// `--budget auto` reads the drafter's DSpark confidence head.
    pub use_confidence: bool,
}

impl<B: Backend> Proposer<'_, B> {
    /// Propose the tree of the round rooted at `anchor` (absolute position `root_pos`), the
    /// lookup context being `prompt` then the committed tokens `out`:
    /// 1. with a `--lookup` graft, the lookup chain first; on a match with `skip_drafter`, the
    ///    chain alone — under `auto`, only where it is worth its rows ([`AutoState::chain_len`];
    ///    else the round goes on as one without a match);
    /// 2. `lookup`: its chain alone (a plain AR step without a match);
    /// 3. else the drafter's tree, unless `auto` skips the drafter; under `auto`, truncated to
    ///    the prefix worth its cost (DSpark confidence head included where it reads one);
    /// 4. the chain grafted onto that tree.
    ///
    /// Stage times and counts go to `stats` (`draft_ms`, `lookup_ms`, `drafter_rounds`,
    /// `drafts_skipped`, `lookup_rounds`, `policy_us`). Errors: the drafter's forward, the tree
    /// preparation or a read-back failing on the backend.
    #[allow(clippy::too_many_arguments)]
    pub async fn propose(
        &mut self,
        p: &GenParams,
        mut auto: Option<&mut AutoState>,
        prompt: &[u32],
        out: &[u32],
        anchor: u32,
        root_pos: usize,
        stats: &mut Stats,
    ) -> Result<Round> {
        let b = self.b;
        let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        // Prompt lookup beside the drafter (`--lookup`): the chain grafted onto the tree
        // below, or verified alone when it matched and the drafter is skipped on a match.
        // Under `--budget auto` a chain verified alone is verified only where it is worth its
        // rows (else the round goes on as one without a match).
        let mut chain = None;
        let graft = if p.lookup.len > 0 && self.drafter.is_some() {
            let m = lookup::round_match(prompt, out, p.lookup.len, p);
            let mut graft = m.tokens.clone();
            if let Some(a) = auto.as_ref().filter(|_| p.lookup.skip_drafter && !m.tokens.is_empty()) {
                let n = a.chain_len(&m);
                if n == 0 {
                    stats.chains_skipped += 1;
                }
                graft.truncate(n);
            }
            // Scored only where the policy reads the rates (a chain verified alone).
            if auto.is_some() && p.lookup.skip_drafter {
                chain = Some(m);
            }
            let dt = ms(t);
            stats.draft_ms += dt;
            stats.lookup_ms += dt;
            graft
        } else {
            Vec::new()
        };
        let t = Instant::now();
        // Nodes a drafted tree could still commit: none in the round that commits the last
        // token (its bonus), so the drafter does not run there.
        let depth_left = useful_depth(p, out.len());
        let run_drafter = if (!graft.is_empty() && p.lookup.skip_drafter) || depth_left == 0 {
            false
        } else {
            match auto.as_mut() {
                Some(a) => {
                    let go = a.should_draft();
                    stats.policy_us += ms(t) * 1e3;
                    go
                }
                None => true,
            }
        };
        let t = Instant::now();
        let mut decision = None;
        let mut drafted = false;
        let mut looked_up = !graft.is_empty();
        let mut prop = if self.method == Method::Lookup {
            // No drafter: the chain is what followed the most recent earlier occurrence of the
            // context's last tokens (prompt and committed tokens, the anchor last).
            let drafts = lookup::round_chain(prompt, out, self.lookup_len, p);
            let dt = ms(t);
            stats.draft_ms += dt;
            stats.lookup_ms += dt;
            drafted = !drafts.is_empty();
            looked_up = drafted;
            Proposal { tree: DraftTree::chain(anchor, &drafts), ..Proposal::default() }
        } else {
            match (self.drafter, self.dcache.as_mut()) {
                (Some(d), Some(dc)) if run_drafter && !self.pending.is_empty() => {
                    let ctx = take_context(b, &mut self.pending)?;
                    // A tree of `budget` nodes is at most `budget` deep; under `--budget auto`,
                    // as deep as the recent kept trees allow (a smaller drafter block).
                    let full = d.cfg.draft_depth().min(self.tree_params.budget.max(1)).min(depth_left);
                    let depth = auto.as_ref().map_or(full, |a| a.draft_depth(full));
                    let (logits, hidden) = d.draft_rows(b, self.target, dc, &ctx, anchor, root_pos, depth)?;
                    let forward_ms = ms(t);
                    let draft = DraftLogits::of(d, &logits, depth, self.markov_dev);
                    let mut prop = propose_scored(b, self.method, &draft, anchor, &self.tree_params, auto.is_some()).await?;
                    stats.draft_ms += forward_ms;
                    stats.drafter_rounds += 1;
                    drafted = true;
                    // The DSpark confidence head, where the drafter has one and `--budget auto`
                    // reads it: its slot terms need the hidden rows `[depth, H]` on the host (a
                    // copy on the CPU, one small read-back on a device), counted as draft time.
                    let tc = Instant::now();
                    let conf = match (&d.confidence, self.use_confidence && auto.is_some()) {
                        (Some(head), true) => {
                            let rows = b.download_async(&hidden).await?;
                            let slot = head.slot_terms(&rows, d.cfg.hidden)?;
                            Some(head.path_confidence(&prop.tree, &slot, d.cfg.hidden, |t| d.markov_row(t)))
                        }
                        _ => None,
                    };
                    stats.draft_ms += ms(tc);
                    if let Some(a) = auto.as_mut() {
                        let tp = Instant::now();
                        let dec = a.choose(&prop.tree, ms(t), conf.as_deref());
                        prop.tree = dec.tree.clone();
                        decision = Some(dec);
                        stats.policy_us += ms(tp) * 1e3;
                    }
                    prop
                }
                (Some(_), Some(_)) if depth_left > 0 && (graft.is_empty() || !p.lookup.skip_drafter) => {
                    stats.drafts_skipped += 1;
                    Proposal::root(anchor)
                }
                _ => Proposal::root(anchor),
            }
        };
        if !graft.is_empty() {
            prop.tree.graft_chain(&graft);
            drafted = true;
        }
        if looked_up {
            stats.lookup_rounds += 1;
        }
        // A drafter method's last round, where nothing drafted could be committed.
        let last_token = depth_left == 0 && self.drafter.is_some();
        if last_token {
            stats.final_rounds += 1;
        }
        Ok(Round { prop, decision, drafted, looked_up, last_token, chain })
    }
}

/// How deep a drafted tree can still be useful after `committed` of `p.max_new_tokens` tokens:
/// a round commits its accepted path and the bonus token, and the commit is cut at
/// `max_new_tokens`, so nodes deeper than the tokens left less the bonus are verified for
/// nothing (0 in the round that commits the last token). `Engine::generate` and `Batch` both
/// cap the drafter's depth with it (as [`lookup::round_chain`] cuts the lookup chain), so a
/// sequence drafts the same trees batched as alone.
pub(super) fn useful_depth(p: &GenParams, committed: usize) -> usize {
    p.max_new_tokens.saturating_sub(committed + 1)
}
