//! Batch decoding (issue 11): many independent sequences share ONE target forward per step,
//! with continuous batching — sequences join and leave between steps.
//!
//! # Shape of the API
//! A [`Batch`] holds the sequences in flight. [`Batch::add`] queues a prompt with its own
//! [`GenParams`] (stop tokens, max-new-tokens, temperature / top-k / top-p and seed) and returns
//! its [`SeqId`]; the sequence joins at the next [`Batch::step`]. Each step packs, for every
//! sequence in flight, the rows it feeds — its prompt (or the next chunk of it, see
//! [`BatchOptions::max_prefill_rows`]) when it has just joined, else its last token (or, for a
//! speculative method, its draft tree rooted at that token: below) — into one
//! [`Target::forward_batch`]: matmuls, norms and RoPE run once over all rows, attention runs
//! ragged ([`sparkling_core::Backend::attention_ragged`]) with each sequence against its own KV
//! cache. Each sequence then takes its token from its own logits row (argmax at T = 0; at T > 0
//! a draw with the same counter-based uniform `rng::uniform(seed, position)` as
//! [`Engine::generate`](super::Engine::generate)), and a sequence that committed a stop token or
//! reached its max-new-tokens leaves the batch: it comes back in [`StepOutput::finished`].
//!
//! # Exactness
//! Every backend op computes a row independently of the other rows in its call (the
//! [`sparkling_core::Backend`] contract; on the CPU each output is one fixed-order reduction),
//! and ragged attention gives each sequence exactly its single-sequence attention. So each
//! sequence's tokens are bit-for-bit those of decoding it alone with `Engine::generate` (`ar`),
//! at T = 0 and at T > 0 with the same seed, whatever its neighbours, the batch size, when it
//! joined, and how its prompt was chunked (`tests/batch.rs`).
//!
//! # KV caches
//! Each sequence owns a [`KvCache`] sized for its own prompt + max-new-tokens (ragged lengths);
//! a join allocates only the newcomer's cache and a leave frees only the leaver's, never
//! copying the rest of the batch.
//!
//! # Backends
//! The CPU backend runs ragged attention as one parallel pass over every (row, head) of every
//! sequence. The wgpu and CUDA backends fall back to the trait's default, a loop of
//! single-sequence attention calls (one per sequence per layer); everything else in the step
//! (the matmuls, which are the bulk of a decode step) is already batched on them. The API is
//! blocking (native hosts); a browser page should keep using `Engine::generate_async`.
//!
//! # Speculative methods
//! A batch built with drafters ([`Batch::with_drafter`]) also decodes the methods that use them
//! (`dflash`, `ddtree`, `dspark`, `sparkling`, `treespark`) at a fixed tree budget. Each step,
//! every such sequence past its prefill (1) runs its drafter on its own draft cache with the
//! taps of the tokens it committed since its last round as context, (2) builds its tree on the
//! host ([`propose_scored`], as [`Engine::generate`](super::Engine::generate) does), and feeds
//! the tree as its block of the ONE packed target forward (`AttnMask::Tree`, positions
//! `root + depth`, logits of every node); then (3) walks its own logit rows down the tree (the
//! target's token per node: argmax at T = 0, else the counter-based draw of the position the
//! node predicts, its own + 1), commits the accepted path plus the bonus token, compacts its KV
//! cache to that path and keeps the path's taps as its next drafter context. Sequences with trees of
//! different sizes are ragged blocks, and `ar` sequences feed their one row beside them. So
//! each sequence emits exactly the tokens of decoding it alone with the same method — which,
//! at T = 0 and at T > 0 with the same seed, are the `ar` tokens. The sequences of one drafter
//! draft in ONE packed drafter forward per step ([`Drafter::draft_batch`]: their rows packed,
//! attention ragged over their own draft caches; each sequence's logits the bits of its forward
//! alone); `--budget auto` is not batched (its policy measures single-sequence rounds) and is
//! refused for them.
//!
//! Prompt lookup is batched the same way: a `lookup` sequence (no drafter) feeds its lookup
//! chain as its tree block each step, and a sequence with a drafter and a lookup graft
//! ([`super::LookupGraft`]) grafts its chain onto its drafted tree, or — skipping the drafter
//! in a round whose lookup matched — feeds the chain alone, exactly as
//! [`Engine::generate`](super::Engine::generate) proposes them.

use super::propose::{propose_scored, take_context, DraftLogits, TreeParams, TreePrep};
use super::{lookup, rng};
use super::{Engine, GenParams, Method};
use crate::error::{Error, Result};
use crate::model::drafter::{DraftJob, Drafter};
use crate::model::layer::KvCache;
use crate::model::target::{LogitRows, SeqInput, Target};
use sparkling_core::tree::DraftTree;
use sparkling_core::{AttnMask, Backend};
use std::ops::Range;
use web_time::Instant;

/// Identifies a sequence of a [`Batch`] (unique within it, increasing in join order).
pub type SeqId = u64;

/// Batch-wide options.
#[derive(Debug, Clone, Default)]
pub struct BatchOptions {
    /// Target layers whose outputs (taps) every step returns for every fed row
    /// ([`StepOutput::taps`]); empty = none. When non-empty, a finished sequence takes one more
    /// step feeding its last token (no logits), so every token of prompt + answer has its taps
    /// (what a drafter's training cache stores).
    pub taps: Vec<usize>,
    /// Most prompt rows one sequence feeds per step (chunked prefill, so a long prompt joining
    /// does not stall the others for a whole prefill); 0 = the whole prompt in one step. Chunking
    /// does not change any token (each row sees the same keys in the same order).
    pub max_prefill_rows: usize,
}

/// Per-sequence timings and counts of a finished sequence.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SeqStats {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens (after stop / max-new-tokens trimming).
    pub new_tokens: usize,
    /// Steps this sequence took part in (prefill chunks and a taps-only tail step included).
    pub steps: usize,
    /// Steps that committed tokens after the first one (one token each for `ar`, a verified
    /// tree for a speculative method): τ = (new_tokens − 1) / decode_steps.
    pub decode_steps: usize,
    /// Decode steps that verified a prompt-lookup chain (`lookup`, or `--lookup` beside a
    /// drafter: alone or grafted onto the drafted tree).
    pub lookup_steps: usize,
    /// From [`Batch::add`] to its first generated token, ms.
    pub first_token_ms: f64,
    /// From [`Batch::add`] to leaving the batch, ms (the per-sequence latency).
    pub latency_ms: f64,
}

/// A sequence that left the batch.
#[derive(Debug, Clone)]
pub struct Finished {
    /// Its id.
    pub id: SeqId,
    /// Its prompt.
    pub prompt: Vec<u32>,
    /// Generated token ids (prompt excluded), trimmed at the first stop token / max-new-tokens
    /// exactly as [`Engine::generate`](super::Engine::generate) trims them.
    pub tokens: Vec<u32>,
    /// Whether a stop token ended it.
    pub stopped: bool,
    /// Whether [`Batch::cancel`] removed it before it finished.
    pub cancelled: bool,
    /// Timings and counts.
    pub stats: SeqStats,
}

/// What one sequence did in a step.
#[derive(Debug, Clone)]
pub struct SeqStep {
    /// The sequence.
    pub id: SeqId,
    /// Its rows of the packed input (and of [`StepOutput::taps`]).
    pub input_rows: Range<usize>,
    /// Absolute position of its first fed row.
    pub first_position: usize,
    /// Its row of [`StepOutput::logits`], when it took one token from one row this step (`ar`,
    /// and the prefill's last chunk of every method); `None` for a verified tree block, whose
    /// rows are [`SeqStep::tree_rows`].
    pub logit_row: Option<usize>,
    /// The last token it committed this step (`None` for a non-final prefill chunk or a tail
    /// step).
    pub token: Option<u32>,
    /// Every token it committed this step, in order: one for `ar`, the accepted path plus the
    /// bonus token for a verified tree (after stop-token / max-new-tokens trimming).
    pub tokens: Vec<u32>,
    /// Rows of [`StepOutput::logits`] of its tree block (one per node), when it verified a tree.
    pub tree_rows: Option<Range<usize>>,
    /// The draft tree it verified this step (root = its last committed token), if any.
    pub tree: Option<DraftTree>,
    /// Nodes of `tree` on the accepted path, root first (the bonus token follows the last).
    pub accepted: Vec<usize>,
}

/// Result of one [`Batch::step`].
pub struct StepOutput<B: Backend> {
    /// Every sequence that fed rows this step, in batch order.
    pub seqs: Vec<SeqStep>,
    /// Logits of the rows that asked for them (`[rows, V]`): the last row of each one-token
    /// block or final prefill chunk, and every node of each tree block (rejected ones included);
    /// `None` when no row asked.
    pub logits: Option<B::Tensor>,
    /// Taps `[Σ fed rows, n_taps·H]` when [`BatchOptions::taps`] asked for them.
    pub taps: Option<B::Tensor>,
    /// Sequences that left the batch after this step.
    pub finished: Vec<Finished>,
}

/// Batch-level counters.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct BatchStats {
    /// Steps run (each one target forward).
    pub steps: usize,
    /// Rows fed in all steps.
    pub rows: usize,
    /// Tokens committed in all steps.
    pub tokens: usize,
    /// Target forward time, ms.
    pub forward_ms: f64,
    /// Token choice (argmax / sampling), tree acceptance, KV compaction and the drafters'
    /// context taps, ms.
    pub pick_ms: f64,
    /// Drafter forwards and tree building of the speculative sequences, ms.
    pub draft_ms: f64,
}

/// A speculative sequence's drafter state.
struct Spec<'a, B: Backend> {
    drafter: &'a Drafter<B>,
    /// The drafter's own KV cache.
    dcache: KvCache<B>,
    /// Taps of committed tokens the drafter has not consumed yet (prefill chunks, then one
    /// entry per round).
    pending: Vec<B::Tensor>,
    /// Tree knobs with the prep resolved for this backend.
    tree: TreeParams,
}

struct Seq<'a, B: Backend> {
    id: SeqId,
    prompt: Vec<u32>,
    params: GenParams,
    cache: KvCache<B>,
    /// `Some` for a method with a drafter.
    spec: Option<Spec<'a, B>>,
    out: Vec<u32>,
    stopped: bool,
    /// No more tokens to generate.
    done: bool,
    added: Instant,
    first_token_ms: f64,
    steps: usize,
    decode_steps: usize,
    lookup_steps: usize,
}

impl<B: Backend> Seq<'_, B> {
    /// Tokens whose K/V are in the cache.
    fn fed(&self) -> usize {
        self.cache.len
    }

    /// The rows this sequence feeds next (ids from `fed`), whether they end with a logits row,
    /// or `None` when it has nothing left to feed.
    fn next_input(&self, chunk: usize, tail: bool) -> Option<(Vec<u32>, bool)> {
        let fed = self.fed();
        let pl = self.prompt.len();
        if self.done && self.out.is_empty() {
            return None; // max-new-tokens 0: nothing to generate, no prefill
        }
        if fed < pl {
            let end = if chunk == 0 { pl } else { pl.min(fed + chunk) };
            return Some((self.prompt[fed..end].to_vec(), end == pl && !self.done));
        }
        let last = *self.out.last()?;
        // The last generated token is fed to produce the next one, or (done, with taps) once
        // more for its taps only.
        if fed < pl + self.out.len() && (!self.done || tail) {
            return Some((vec![last], !self.done));
        }
        None
    }

    /// Append `new` to the output, stopping after a stop token or at max-new-tokens (as
    /// `Engine::generate` commits a round); returns the tokens appended and updates `done`.
    fn commit(&mut self, new: &[u32]) -> Vec<u32> {
        let start = self.out.len();
        for &t in new {
            if self.out.len() >= self.params.max_new_tokens {
                break;
            }
            self.out.push(t);
            if self.params.stop.contains(&t) {
                self.stopped = true;
                break;
            }
        }
        self.done = self.stopped || self.out.len() >= self.params.max_new_tokens;
        self.out[start..].to_vec()
    }

    fn finish(self, cancelled: bool) -> Finished {
        let stats = SeqStats {
            prompt_tokens: self.prompt.len(),
            new_tokens: self.out.len(),
            steps: self.steps,
            decode_steps: self.decode_steps,
            lookup_steps: self.lookup_steps,
            first_token_ms: self.first_token_ms,
            latency_ms: self.added.elapsed().as_secs_f64() * 1e3,
        };
        Finished { id: self.id, prompt: self.prompt, tokens: self.out, stopped: self.stopped, cancelled, stats }
    }
}

/// The trees of the speculative sequences in `want` (`(index in seqs, anchor, root
/// position)`, ascending indices, each past its prefill) — the first steps of an
/// [`Engine::generate`](super::Engine::generate) round at a fixed budget: every sequence of one
/// drafter drafts in ONE packed forward over its own draft cache and pending taps
/// ([`Drafter::draft_batch`], each sequence's logits the same bits as alone), then each builds
/// its tree ([`propose_scored`]). Returns the trees in `want` order. Errors: a sequence with no
/// pending taps or with a drafter not in `drafters` (logic errors), backend failures.
fn draft_trees<B: Backend>(
    b: &B,
    target: &Target<B>,
    drafters: &[&Drafter<B>],
    seqs: &mut [Seq<'_, B>],
    want: &[(usize, u32, usize)],
) -> Result<Vec<DraftTree>> {
    let mut ctx = Vec::with_capacity(want.len());
    for &(i, _, root) in want {
        let spec = seqs[i].spec.as_mut().ok_or_else(|| Error::Input(format!("batch: sequence {i} drafts without a drafter")))?;
        if spec.pending.is_empty() {
            // Every committed token's taps are pushed as it is fed; none pending is a logic error.
            return Err(Error::Input(format!("batch: no drafter context for the round at position {root}")));
        }
        ctx.push(take_context(b, &mut spec.pending)?);
    }
    let mut trees: Vec<Option<DraftTree>> = (0..want.len()).map(|_| None).collect();
    for &d in drafters {
        // This drafter's sequences: (index in `want`, its params, its speculative state).
        let mut members: Vec<(usize, &GenParams, &mut Spec<'_, B>, usize)> = Vec::new();
        let mut next = want.iter().enumerate().peekable();
        for (i, s) in seqs.iter_mut().enumerate() {
            let Some(&(k, &(wi, _, _))) = next.peek() else { break };
            if wi != i {
                continue;
            }
            next.next();
            let Seq { params, spec, out, .. } = s;
            if let Some(spec) = spec.as_mut().filter(|sp| std::ptr::eq(sp.drafter, d)) {
                members.push((k, params, spec, out.len()));
            }
        }
        if members.is_empty() {
            continue;
        }
        let depths: Vec<usize> =
            members.iter().map(|(_, p, sp, done)| d.cfg.draft_depth().min(sp.tree.budget.max(1)).min(super::round::useful_depth(p, *done))).collect();
        let mut jobs: Vec<DraftJob<'_, B>> = members
            .iter_mut()
            .zip(&depths)
            .map(|((k, _, sp, _), &depth)| DraftJob { cache: &mut sp.dcache, taps: &ctx[*k], anchor: want[*k].1, root_pos: want[*k].2, depth })
            .collect();
        let logits = d.draft_batch(b, target, &mut jobs)?;
        drop(jobs);
        for ((k, p, sp, _), (l, &depth)) in members.iter().zip(logits.iter().zip(&depths)) {
            let markov_dev = if p.method == Method::Sparkling && sp.tree.prep == TreePrep::Device { d.markov_device(b)? } else { None };
            let draft = DraftLogits::of(d, l, depth, markov_dev);
            trees[*k] = Some(pollster::block_on(propose_scored(b, p.method, &draft, want[*k].1, &sp.tree, false))?.tree);
        }
    }
    trees
        .into_iter()
        .enumerate()
        .map(|(k, t)| t.ok_or_else(|| Error::Input(format!("batch: sequence {} has a drafter this batch was not given", want[k].0))))
        .collect()
}

/// Sequences decoded together, one target forward per step (module docs).
pub struct Batch<'a, B: Backend> {
    backend: &'a B,
    target: &'a Target<B>,
    opts: BatchOptions,
    /// Drafters the speculative sequences may use ([`Batch::with_drafter`]), at most one per
    /// kind, all tapping the same target layers.
    drafters: Vec<&'a Drafter<B>>,
    seqs: Vec<Seq<'a, B>>,
    next_id: SeqId,
    stats: BatchStats,
}

/// One sequence's block of a step's packed input.
struct Feed {
    /// Index in `Batch::seqs`.
    seq: usize,
    ids: Vec<u32>,
    positions: Vec<u32>,
    /// Whether the block ends in a logits row (a one-token block) — trees take every row.
    wants_logits: bool,
    /// The draft tree this block verifies.
    tree: Option<DraftTree>,
}

impl<'a, B: Backend> Batch<'a, B> {
    /// An empty batch over `target` on `backend`.
    /// Errors: a tap layer the target cannot tap (the last layer or beyond).
    pub fn new(backend: &'a B, target: &'a Target<B>, opts: BatchOptions) -> Result<Self> {
        if let Some(&bad) = opts.taps.iter().find(|&&l| l + 1 >= target.cfg.layers) {
            return Err(Error::Input(format!("tap layer {bad} invalid for a {}-layer target (never tap the last layer)", target.cfg.layers)));
        }
        Ok(Batch { backend, target, opts, drafters: Vec::new(), seqs: Vec::new(), next_id: 0, stats: BatchStats::default() })
    }

    /// Let sequences of the methods that use `drafter`'s kind (DFlash: `dflash`, `ddtree`;
    /// DSpark: `dspark`, `sparkling`, `treespark`) join this batch.
    /// Errors: a drafter of that kind already added; a drafter tapping other target layers than
    /// one already added; a batch whose [`BatchOptions::taps`] are set (those steps return the
    /// taps of every fed row, which speculative rounds do not keep); the drafter's output head
    /// failing to load.
    pub fn with_drafter(mut self, drafter: &'a Drafter<B>) -> Result<Self> {
        if !self.opts.taps.is_empty() {
            return Err(Error::Input("a batch with taps (BatchOptions::taps, gen-data) decodes `ar` only: no drafter".into()));
        }
        if self.drafters.iter().any(|d| d.cfg.kind == drafter.cfg.kind) {
            return Err(Error::Input(format!("the batch has a {:?} drafter already", drafter.cfg.kind)));
        }
        if let Some(d) = self.drafters.first() {
            if d.cfg.target_layer_ids != drafter.cfg.target_layer_ids {
                return Err(Error::Input(format!(
                    "the batch's drafters must tap the same target layers ({:?} vs {:?})",
                    d.cfg.target_layer_ids, drafter.cfg.target_layer_ids
                )));
            }
        }
        pollster::block_on(drafter.prepare_output_head_async(self.backend, self.target))?;
        self.drafters.push(drafter);
        Ok(self)
    }

    /// Queue `prompt` with its own parameters; it joins the batch at the next [`Batch::step`].
    /// Errors (nothing is queued): the checks of [`Engine::check`] (empty prompt, ids outside
    /// the vocabulary, prompt + max-new-tokens + the largest tree beyond the context), invalid
    /// sampling parameters ([`GenParams::validate`]), a method whose drafter kind the batch has
    /// not got ([`Batch::with_drafter`]), `--budget auto` for a method with a drafter, KV
    /// allocation failures.
    pub fn add(&mut self, prompt: &[u32], params: &GenParams) -> Result<SeqId> {
        params.validate()?;
        let drafter = match params.method.drafter_kind() {
            None => None,
            Some(kind) => {
                let Some(&d) = self.drafters.iter().find(|d| d.cfg.kind == kind) else {
                    return Err(Error::Input(format!(
                        "method `{}` needs a {kind:?} drafter, and the batch has none (Batch::with_drafter)",
                        params.method.name()
                    )));
                };
                if params.auto_budget.is_some() {
                    return Err(Error::Input(format!(
                        "method `{}` in a batch needs a fixed tree budget: `--budget auto` is not batched",
                        params.method.name()
                    )));
                }
                Some(d)
            }
        };
        let engine = Engine { backend: self.backend, target: self.target, drafter };
        let checked = engine.check(prompt, params)?;
        let cache = self.target.new_cache(self.backend, checked.capacity)?;
        let spec = match drafter {
            Some(d) => Some(Spec {
                drafter: d,
                dcache: d.new_cache(self.backend, checked.capacity + d.cfg.block_size)?,
                pending: Vec::new(),
                tree: TreeParams { prep: params.tree.prep.resolve(self.backend.host_memory()), ..params.tree },
            }),
            None => None,
        };
        let id = self.next_id;
        self.next_id += 1;
        self.seqs.push(Seq {
            id,
            prompt: prompt.to_vec(),
            params: params.clone(),
            cache,
            spec,
            out: Vec::new(),
            stopped: false,
            done: params.max_new_tokens == 0,
            added: Instant::now(),
            first_token_ms: 0.0,
            steps: 0,
            decode_steps: 0,
            lookup_steps: 0,
        });
        Ok(id)
    }

    /// Remove a sequence now (finished or not); `None` when `id` is not in the batch.
    pub fn cancel(&mut self, id: SeqId) -> Option<Finished> {
        let i = self.seqs.iter().position(|s| s.id == id)?;
        let s = self.seqs.remove(i);
        let cancelled = !s.done;
        Some(s.finish(cancelled))
    }

    /// Sequences in the batch (queued ones included).
    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    /// Whether no sequence is in the batch.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Ids of the sequences in the batch, in batch order.
    pub fn ids(&self) -> Vec<SeqId> {
        self.seqs.iter().map(|s| s.id).collect()
    }

    /// Batch-level counters so far.
    pub fn stats(&self) -> &BatchStats {
        &self.stats
    }

    /// One step: one packed target forward over every sequence with rows to feed, a token for
    /// each sequence whose block ends in a logits row — or, for a speculative sequence past its
    /// prefill, its drafter's tree verified and the accepted path plus the bonus token — and the
    /// sequences that finished leave. A step with nothing to feed (empty batch, or only
    /// `max_new_tokens == 0` requests) runs no forward. Errors: backend failures (the batch
    /// should then be dropped).
    pub fn step(&mut self) -> Result<StepOutput<B>> {
        let b = self.backend;
        let tail = !self.opts.taps.is_empty();
        // Inputs of every sequence that feeds rows this step.
        let mut feeding: Vec<Feed> = Vec::new();
        let t = Instant::now();
        // Speculative sequences past their prefill draft their trees first (every sequence of a
        // drafter in one packed drafter forward); their blocks are filled in below.
        let (mut want, mut want_feed, mut grafts) = (Vec::new(), Vec::new(), Vec::new());
        let mut lookup_seqs = Vec::new();
        for (i, s) in self.seqs.iter().enumerate() {
            let Some((ids, wants_logits)) = s.next_input(self.opts.max_prefill_rows, tail) else { continue };
            let root = s.fed();
            let proposes = (s.spec.is_some() || s.params.method == Method::Lookup) && root >= s.prompt.len() && !s.done;
            if proposes {
                // Its prompt-lookup chain (`lookup`, or `--lookup` beside a drafter), as
                // `Engine::generate` proposes it.
                let len = match s.params.method {
                    Method::Lookup => lookup::chain_len(&s.params, b.host_memory()),
                    _ => s.params.lookup.len,
                };
                let chain = lookup::round_chain(&s.prompt, &s.out, len, &s.params);
                lookup_seqs.extend((!chain.is_empty()).then_some(i));
                let drafts = super::round::useful_depth(&s.params, s.out.len()) > 0;
                if s.spec.is_some() && drafts && (chain.is_empty() || !s.params.lookup.skip_drafter) {
                    want.push((i, ids[0], root));
                    want_feed.push(feeding.len());
                    grafts.push(chain);
                    feeding.push(Feed { seq: i, ids: Vec::new(), positions: Vec::new(), wants_logits: true, tree: None });
                } else {
                    // The chain alone (the drafter skipped on a match, or no drafter).
                    let tree = DraftTree::chain(ids[0], &chain);
                    let positions = tree.depths.iter().map(|&d| root as u32 + d).collect();
                    feeding.push(Feed { seq: i, ids: tree.tokens.clone(), positions, wants_logits: true, tree: Some(tree) });
                }
            } else {
                let positions = (root as u32..(root + ids.len()) as u32).collect();
                feeding.push(Feed { seq: i, ids, positions, wants_logits, tree: None });
            }
        }
        for &i in &lookup_seqs {
            self.seqs[i].lookup_steps += 1;
        }
        if !want.is_empty() {
            let trees = draft_trees(b, self.target, &self.drafters, &mut self.seqs, &want)?;
            for (((&f, &(_, _, root)), mut tree), graft) in want_feed.iter().zip(&want).zip(trees).zip(&grafts) {
                tree.graft_chain(graft);
                let f = &mut feeding[f];
                f.positions = tree.depths.iter().map(|&d| root as u32 + d).collect();
                f.ids = tree.tokens.clone();
                f.tree = Some(tree);
            }
        }
        self.stats.draft_ms += t.elapsed().as_secs_f64() * 1e3;
        let mut out = StepOutput { seqs: Vec::new(), logits: None, taps: None, finished: Vec::new() };
        if !feeding.is_empty() {
            let t = Instant::now();
            let spec_taps = self.seqs.iter().any(|s| s.spec.is_some());
            let inputs: Vec<SeqInput<'_>> = feeding
                .iter()
                .map(|f| match &f.tree {
                    Some(tree) => {
                        SeqInput { ids: &f.ids, positions: &f.positions, mask: AttnMask::Tree { parents: &tree.parents }, logits: Some(LogitRows::All) }
                    }
                    None => SeqInput { ids: &f.ids, positions: &f.positions, mask: AttnMask::Causal, logits: f.wants_logits.then_some(LogitRows::Last) },
                })
                .collect();
            // Mutable borrows of the feeding sequences' caches, in `feeding` order.
            let mut caches: Vec<&mut KvCache<B>> = Vec::with_capacity(feeding.len());
            {
                let mut next = feeding.iter().map(|f| f.seq).peekable();
                for (i, s) in self.seqs.iter_mut().enumerate() {
                    if next.peek() == Some(&i) {
                        caches.push(&mut s.cache);
                        next.next();
                    }
                }
            }
            // Taps: those the options ask for, else the drafters' layers while a speculative
            // sequence is in the batch (its prefill and its trees' accepted rows feed its drafter).
            let tap_layers: &[usize] = match self.drafters.first() {
                Some(d) if self.opts.taps.is_empty() && spec_taps => &d.cfg.target_layer_ids,
                _ => &self.opts.taps,
            };
            let fwd = self.target.forward_batch(b, &mut caches, &inputs, tap_layers)?;
            drop(caches);
            self.stats.forward_ms += t.elapsed().as_secs_f64() * 1e3;
            self.stats.steps += 1;
            self.stats.rows += fwd.input_rows.last().map_or(0, |r| r.end);

            // Token choice: argmax once over every row when any greedy sequence took a row; a
            // sampled sequence draws from its own rows with its own parameters.
            let t = Instant::now();
            let greedy_rows = feeding.iter().zip(&fwd.logit_rows).any(|(f, r)| !r.is_empty() && self.seqs[f.seq].params.sampling.temperature < 1e-5);
            let argmax = match (&fwd.logits, greedy_rows) {
                (Some(l), true) => Some(b.argmax(l)?),
                _ => None,
            };
            // The target's token for logits row `r`, whose sequence position is `pos` (the
            // uniform of that position at T > 0).
            let token_at = |p: &GenParams, r: usize, pos: u64| -> Result<u32> {
                if p.sampling.temperature < 1e-5 {
                    Ok(argmax.as_ref().expect("argmax taken when a greedy row exists")[r])
                } else {
                    let logits = fwd.logits.as_ref().expect("a row was asked for");
                    Ok(b.sample(&b.gather_rows(logits, &[r])?, p.sampling, &[rng::uniform(p.seed, pos)])?[0])
                }
            };
            for (k, f) in feeding.iter().enumerate() {
                let s = &mut self.seqs[f.seq];
                s.steps += 1;
                let first_position = f.positions[0] as usize;
                let rows = fwd.input_rows[k].clone();
                let lr = fwd.logit_rows[k].clone();
                let mut step = SeqStep {
                    id: s.id,
                    input_rows: rows.clone(),
                    first_position,
                    logit_row: None,
                    token: None,
                    tokens: Vec::new(),
                    tree_rows: None,
                    tree: None,
                    accepted: Vec::new(),
                };
                match &f.tree {
                    Some(tree) => {
                        // Walk the target's tokens down the tree (Engine::generate's accept).
                        let mut accepted = vec![0usize];
                        let mut cur = 0usize;
                        let bonus = loop {
                            let token = token_at(&s.params, lr.start + cur, f.positions[cur] as u64 + 1)?;
                            match tree.child_with_token(cur, token) {
                                Some(child) => {
                                    accepted.push(child);
                                    cur = child;
                                }
                                None => break token,
                            }
                        };
                        let mut new: Vec<u32> = accepted[1..].iter().map(|&i| tree.tokens[i]).collect();
                        new.push(bonus);
                        step.tokens = s.commit(&new);
                        s.cache.compact(b, first_position, &accepted)?;
                        if let (Some(spec), Some(tp)) = (s.spec.as_mut(), &fwd.taps) {
                            spec.pending.push(b.gather_rows(tp, &accepted.iter().map(|&a| rows.start + a).collect::<Vec<_>>())?);
                        }
                        step.tree_rows = Some(lr);
                        step.tree = Some(tree.clone());
                        step.accepted = accepted;
                    }
                    None => {
                        if let (Some(spec), Some(tp)) = (s.spec.as_mut(), &fwd.taps) {
                            // A prefill chunk's taps: the drafter's first context.
                            spec.pending.push(b.gather_rows(tp, &rows.clone().collect::<Vec<_>>())?);
                        }
                        if let Some(r) = lr.clone().next() {
                            // The token at absolute position `fed`.
                            let tok = token_at(&s.params, r, s.fed() as u64)?;
                            if s.out.is_empty() {
                                s.first_token_ms = s.added.elapsed().as_secs_f64() * 1e3;
                            }
                            step.tokens = s.commit(&[tok]);
                            step.logit_row = Some(r);
                        }
                    }
                }
                step.token = step.tokens.last().copied();
                if first_position >= s.prompt.len() && !step.tokens.is_empty() {
                    s.decode_steps += 1;
                }
                self.stats.tokens += step.tokens.len();
                out.seqs.push(step);
            }
            self.stats.pick_ms += t.elapsed().as_secs_f64() * 1e3;
            out.logits = fwd.logits;
            if !self.opts.taps.is_empty() {
                out.taps = fwd.taps;
            }
        }
        // Leavers: done, and (with taps) their last token fed.
        let mut i = 0;
        while i < self.seqs.len() {
            let s = &self.seqs[i];
            if s.done && s.next_input(self.opts.max_prefill_rows, tail).is_none() {
                out.finished.push(self.seqs.remove(i).finish(false));
            } else {
                i += 1;
            }
        }
        Ok(out)
    }

    /// Step until the batch is empty; returns every finished sequence in finishing order.
    pub fn run_to_end(&mut self) -> Result<Vec<Finished>> {
        let mut done = Vec::new();
        while !self.is_empty() {
            done.extend(self.step()?.finished);
        }
        Ok(done)
    }
}
