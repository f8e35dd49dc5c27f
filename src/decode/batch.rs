//! The decode loop (docs/design.md §1, §7): sequences share ONE target forward per step, with
//! continuous batching — sequences join and leave between steps. A single generation
//! ([`Engine::generate`](super::Engine::generate)) is a batch of one.
//!
//! # A step
//! [`Batch::add`] queues a prompt with its own [`GenParams`] (method, tree budget or `--budget
//! auto`, lookup graft, stop tokens, max-new-tokens, sampling, seed); it joins at the next
//! step. Each [`Batch::step_async`], for every sequence in flight:
//! 1. **plan**: a sequence that has just joined feeds its prompt (or the next chunk of it,
//!    [`BatchOptions::max_prefill_rows`]); one past its prefill plans a round with its
//!    [`RoundPolicy`](super::policy::RoundPolicy): a plain AR step, a prompt-lookup chain, or a
//!    drafted tree with a chain grafted onto it;
//! 2. **draft**: every sequence of a drafter drafts in ONE packed drafter forward over its own
//!    draft cache ([`Drafter::draft_batch`]), builds its tree and lets its policy cut it;
//! 3. **verify**: the blocks of every sequence are packed into ONE [`Target::forward_batch`]
//!    (matmuls, norms and RoPE once over all rows; attention ragged, each sequence against its
//!    own KV cache with its own mask: causal for a prompt, tree attention for a round);
//! 4. **accept and commit**: each sequence walks its own logit rows down its tree (the
//!    target's token per node: argmax at T = 0, else the counter-based draw of the position the
//!    node predicts), commits the accepted path plus the bonus token (cut at a stop token or
//!    max-new-tokens), compacts its KV cache to that path, keeps the path's taps as its next
//!    drafter context, and its policy observes the round. Finished sequences leave
//!    ([`StepOutput::finished`]).
//!
//! # Exactness
//! Every backend op computes a row independently of the other rows in its call (the
//! [`sparkling_core::Backend`] contract), ragged attention gives each sequence exactly its
//! single-sequence attention, and whatever tree a round verifies, it commits the target's own
//! tokens. So each sequence's tokens are bit-for-bit those of `ar` alone — at T = 0, and at
//! T > 0 with the same seed — whatever its method, policy, neighbours, the batch size, when it
//! joined and how its prompt was chunked (`tests/batch.rs`). `--budget auto` prices a
//! sequence's rows with the cost of the batch's forward ([`super::budget::AutoState::set_load`]),
//! so under load its trees may differ from alone; its tokens do not.
//!
//! # KV caches
//! Each sequence owns a [`KvCache`] sized for its own prompt + max-new-tokens + largest round
//! (ragged lengths); a join allocates only the newcomer's cache and a leave frees only the
//! leaver's. With a [`PrefixCache`] ([`Batch::with_prefix_cache`]) a joining sequence takes
//! the rows of the longest prompt prefix an earlier sequence fed (target K/V and the drafter's
//! taps) and feeds only the rest; each sequence is kept there when its prompt is prefilled and
//! when it leaves ([`super::prefix`]). Its tokens do not change.
//!
//! # Backends
//! Read-backs are awaited ([`Batch::step_async`]), so the loop runs in a browser page too;
//! [`Batch::step`] blocks on it natively. The CPU backend runs ragged attention as one parallel
//! pass over every (row, head) of every sequence; the wgpu and CUDA backends loop over the
//! sequences inside attention (everything else in the step is batched on them).

use super::budget::{AutoBudget, AutoState, CostModel};
use super::governor::{ForcedAr, Governor, StepArm};
use super::platform::Platform;
use super::policy::{self, Observed, Plan, RoundPolicy};
use super::prefix::PrefixCache;
use super::propose::TreeParams;
use super::round::{self, Drafting, Round, Spec};
use super::stats::Stats;
use super::{Engine, GenParams};
use crate::error::{Error, Result};
use crate::model::drafter::Drafter;
use crate::model::layer::KvCache;
use crate::model::target::{BatchOutput, LogitRows, SeqInput, Target};
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
    /// (what a drafter's training cache stores). Such a batch decodes `ar` only.
    pub taps: Vec<usize>,
    /// Most prompt rows a step feeds, over all sequences together (chunked prefill: a long
    /// prompt joining does not stall the others for a whole prefill, and prompts arriving
    /// together prefill first come, first served, so the first of them gets its first token
    /// after one small step instead of all of them after one large one); 0 = every prompt
    /// whole in one step. Chunking does not change any token (each row sees the same keys in
    /// the same order).
    pub max_prefill_rows: usize,
}

/// A sequence that left the batch.
#[derive(Debug, Clone)]
pub struct Finished {
    /// Its id.
    pub id: SeqId,
    /// Its prompt.
    pub prompt: Vec<u32>,
    /// Generated token ids (prompt excluded), trimmed at the first stop token / max-new-tokens.
    pub tokens: Vec<u32>,
    /// Whether a stop token ended it.
    pub stopped: bool,
    /// Whether [`Batch::cancel`] removed it before it finished.
    pub cancelled: bool,
    /// Its timings and counts (rounds, τ, acceptance by depth, stage times).
    pub stats: Stats,
    /// The cost model `--budget auto` measured for it (when its parameters had none), for the
    /// caller to cache and pass back in [`AutoBudget::cost`].
    pub cost_model: Option<CostModel>,
    /// Its `--budget auto` policy state at the end (pass it back in [`AutoBudget::resume`]).
    pub auto_state: Option<AutoState>,
    /// Prompt tokens whose rows came from the batch's [`PrefixCache`] instead of the prefill
    /// (0 without one).
    pub cached_tokens: usize,
}

/// What one sequence did in a step.
#[derive(Debug, Clone)]
pub struct SeqStep {
    /// The sequence.
    pub id: SeqId,
    /// Its rows of the packed input (and of [`StepOutput::taps`]).
    pub input_rows: Range<usize>,
    /// Absolute position of its first fed row (a round's root position).
    pub first_position: usize,
    /// Its row of [`StepOutput::logits`], when it took one token from one row: a prefill's
    /// last row, or a round that verified its root alone (an AR step).
    pub logit_row: Option<usize>,
    /// The last token it committed this step (`None` for a non-final prefill chunk or a tail
    /// step).
    pub token: Option<u32>,
    /// Every token it committed this step, in order: the prefill's first token, or a round's
    /// accepted path plus the bonus token (after stop-token / max-new-tokens trimming).
    pub tokens: Vec<u32>,
    /// Rows of [`StepOutput::logits`] of its round's tree (one per node), when it ran a round.
    pub tree_rows: Option<Range<usize>>,
    /// The tree its round verified (root = its last committed token; `ar`: the root alone).
    pub tree: Option<DraftTree>,
    /// Nodes of `tree` on the accepted path, root first (the bonus token follows the last).
    pub accepted: Vec<usize>,
    /// The target's own token after the accepted path (before any trimming), for a round.
    pub bonus: Option<u32>,
    /// Whether the round's tree held anything proposed (drafted or looked up).
    pub drafted: bool,
    /// Whether the round drafted nothing because only its bonus token was left to generate.
    pub last_token: bool,
}

/// Result of one [`Batch::step`].
pub struct StepOutput<B: Backend> {
    /// Every sequence that fed rows this step, in batch order.
    pub seqs: Vec<SeqStep>,
    /// Logits of the rows that asked for them (`[rows, V]`): the last row of each final
    /// prefill chunk and every node of each round's tree (rejected ones included); `None` when
    /// no row asked.
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
    /// Token choice, tree acceptance, KV compaction and the drafters' context taps, ms.
    pub pick_ms: f64,
    /// Round planning, drafter forwards and tree building, ms.
    pub draft_ms: f64,
}

struct Seq<'a, B: Backend> {
    id: SeqId,
    prompt: Vec<u32>,
    params: GenParams,
    cache: KvCache<B>,
    /// `Some` for a method with a drafter.
    spec: Option<Spec<'a, B>>,
    /// `None` until the first token under `--budget auto` (its cost model comes after the
    /// prefill).
    policy: Option<Box<dyn RoundPolicy>>,
    out: Vec<u32>,
    stopped: bool,
    /// No more tokens to generate.
    done: bool,
    added: Instant,
    decode_start: Option<Instant>,
    stats: Stats,
    cost_model: Option<CostModel>,
    /// Rows it fed in the last step (the load its neighbours see).
    last_rows: usize,
    /// Prompt rows restored from the prefix cache.
    cached: usize,
    /// With a prefix cache and a drafter: the taps of every row in its cache so far, in order
    /// (what the cache keeps for the drafter; `spec.pending` is consumed by the drafter).
    taps_log: Vec<B::Tensor>,
}

impl<B: Backend> Seq<'_, B> {
    /// Tokens whose K/V are in the cache.
    fn fed(&self) -> usize {
        self.cache.len
    }

    /// The prompt rows this sequence feeds next and whether they end with a logits row, its
    /// tail feed (`[last token]`, no logits, with `tail`), or `None` when it feeds no prompt or
    /// tail rows (past its prefill it runs rounds; done, it has nothing left).
    fn prompt_input(&self, chunk: usize, tail: bool) -> Option<(Vec<u32>, bool)> {
        let (fed, pl) = (self.fed(), self.prompt.len());
        if self.done && self.out.is_empty() {
            return None; // max-new-tokens 0: nothing to generate, no prefill
        }
        if fed < pl {
            let end = if chunk == 0 { pl } else { pl.min(fed + chunk) };
            return Some((self.prompt[fed..end].to_vec(), end == pl && !self.done));
        }
        let last = *self.out.last()?;
        (self.done && tail && fed < pl + self.out.len()).then(|| (vec![last], false))
    }

    /// Append `new` to the output, stopping after a stop token or at max-new-tokens; returns
    /// the tokens appended and updates `done`.
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

    fn finish(mut self, cancelled: bool) -> Finished {
        let s = &mut self.stats;
        s.new_tokens = self.out.len();
        s.decode_tokens = self.out.len().saturating_sub(1);
        s.decode_ms = self.decode_start.map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
        s.latency_ms = self.added.elapsed().as_secs_f64() * 1e3;
        let auto_state = self.policy.and_then(|p| p.into_auto_state());
        Finished {
            id: self.id,
            prompt: self.prompt,
            tokens: self.out,
            stopped: self.stopped,
            cancelled,
            stats: self.stats,
            cost_model: self.cost_model,
            auto_state,
            cached_tokens: self.cached,
        }
    }
}

/// Keep the rows `s` has fed in `prefix` ([`PrefixCache::capture`]): its prompt and answer up to
/// its last fed token, with their taps when it has a drafter.
async fn capture<B: Backend>(prefix: &mut Option<PrefixCache>, b: &B, s: &Seq<'_, B>) -> Result<()> {
    let Some(p) = prefix.as_mut().filter(|p| p.enabled()) else { return Ok(()) };
    let n = s.fed().min(s.prompt.len() + s.out.len().saturating_sub(1));
    let tokens: Vec<u32> = s.prompt.iter().chain(&s.out).copied().take(n).collect();
    let taps = s.spec.as_ref().map(|sp| (&sp.drafter.cfg.target_layer_ids[..], &s.taps_log[..]));
    p.capture(b, &tokens, &s.cache, taps).await
}

/// One sequence's block of a step's packed input.
struct Feed {
    /// Index in `Batch::seqs`.
    seq: usize,
    ids: Vec<u32>,
    positions: Vec<u32>,
    /// A prefill block that ends in a logits row.
    wants_logits: bool,
    /// A round (its tree is the block), or `None` for a prompt chunk or a tail feed.
    round: Option<Round>,
}

/// Sequences decoded together, one target forward per step (module docs).
pub struct Batch<'a, B: Backend> {
    backend: &'a B,
    target: &'a Target<B>,
    platform: Platform,
    opts: BatchOptions,
    /// Drafters the speculative sequences may use ([`Batch::with_drafter`]), at most one per
    /// kind, all tapping the same target layers.
    drafters: Vec<&'a Drafter<B>>,
    seqs: Vec<Seq<'a, B>>,
    next_id: SeqId,
    stats: BatchStats,
    /// Rows the last step's forward fed.
    last_rows: usize,
    /// Speculate or force AR steps when several `--budget auto` sequences run rounds together.
    governor: Governor,
    /// Reusable prompt prefixes ([`Batch::with_prefix_cache`]).
    prefix: Option<PrefixCache>,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

impl<'a, B: Backend> Batch<'a, B> {
    /// An empty batch over `target` on `backend`.
    /// Errors: a tap layer beyond the target's layers.
    pub fn new(backend: &'a B, target: &'a Target<B>, opts: BatchOptions) -> Result<Self> {
        if let Some(&bad) = opts.taps.iter().find(|&&l| l >= target.cfg.layers) {
            return Err(Error::Input(format!("tap layer {bad} invalid for a {}-layer target (layers 0..={})", target.cfg.layers, target.cfg.layers - 1)));
        }
        let platform = Platform::of(backend);
        Ok(Batch {
            backend,
            target,
            platform,
            opts,
            drafters: Vec::new(),
            seqs: Vec::new(),
            next_id: 0,
            stats: BatchStats::default(),
            last_rows: 0,
            governor: Governor::default(),
            prefix: None,
        })
    }

    /// Let sequences of the methods that use `drafter`'s kind (DFlash: `dflash`, `ddtree`;
    /// DSpark: `dspark`, `sparkling`, `treespark`) join this batch.
    /// Errors: a drafter of that kind already added; a drafter tapping other target layers than
    /// one already added; a batch whose [`BatchOptions::taps`] are set.
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
        self.drafters.push(drafter);
        Ok(self)
    }

    /// Reuse prompt prefixes through `cache` ([`super::prefix`]): a sequence that joins takes
    /// the rows of the longest prefix of its prompt the cache holds, and every sequence is kept
    /// in it when its prompt is prefilled and when it leaves. Tokens do not change.
    /// Errors: a batch whose [`BatchOptions::taps`] are set (every row's taps must be computed).
    pub fn with_prefix_cache(mut self, cache: PrefixCache) -> Result<Self> {
        if !self.opts.taps.is_empty() {
            return Err(Error::Input("a batch with taps (BatchOptions::taps, gen-data) computes every row: no prefix cache".into()));
        }
        self.prefix = Some(cache);
        Ok(self)
    }

    /// The batch's prefix cache, if it has one.
    pub fn prefix_cache(&self) -> Option<&PrefixCache> {
        self.prefix.as_ref()
    }

    /// Take the batch's prefix cache out (to hand it to another batch of the same target).
    pub fn take_prefix_cache(&mut self) -> Option<PrefixCache> {
        self.prefix.take()
    }

    /// Prompt tokens sequence `id` took from the prefix cache instead of prefilling them;
    /// `None` when `id` is not in the batch.
    pub fn cached_tokens(&self, id: SeqId) -> Option<usize> {
        self.seqs.iter().find(|s| s.id == id).map(|s| s.cached)
    }

    /// Queue `prompt` with its own parameters; it joins the batch at the next step.
    /// Errors (nothing is queued): invalid parameters ([`GenParams::validate`]), the checks of
    /// [`Engine::check`] (empty prompt, ids outside the vocabulary, prompt + max-new-tokens +
    /// the largest round beyond the context), a method whose drafter kind the batch has not got
    /// ([`Batch::with_drafter`]), KV allocation failures.
    pub fn add(&mut self, prompt: &[u32], params: &GenParams) -> Result<SeqId> {
        params.validate()?;
        let drafter = match params.method.drafter_kind() {
            None => None,
            Some(kind) => Some(*self.drafters.iter().find(|d| d.cfg.kind == kind).ok_or_else(|| {
                Error::Input(format!(
                    "method `{}` needs a {kind:?} drafter, and none is loaded: load one (`--drafter DIR`; Batch::with_drafter) or choose another method",
                    params.method.name()
                ))
            })?),
        };
        let engine = Engine { backend: self.backend, target: self.target, drafter };
        let checked = engine.check(prompt, params)?;
        let mut cache = self.target.new_cache(self.backend, checked.capacity)?;
        let mut spec = match drafter {
            Some(d) => Some(Spec {
                drafter: d,
                dcache: d.new_cache(self.backend, checked.capacity + d.cfg.block_size)?,
                pending: Vec::new(),
                tree: TreeParams { prep: self.platform.tree_prep(params.tree.prep), ..params.tree },
            }),
            None => None,
        };
        // The longest cached prefix of the prompt: its K/V rows, and its taps as the drafter's
        // first context (kept in the log too, for this sequence's own capture).
        let (mut cached, mut taps_log) = (0, Vec::new());
        if let Some(pc) = self.prefix.as_mut() {
            let (n, taps) = pc.restore(self.backend, prompt, &mut cache, spec.as_ref().map(|s| &s.drafter.cfg.target_layer_ids[..]))?;
            cached = n;
            if let (Some(sp), Some(t)) = (spec.as_mut(), taps) {
                taps_log.push(self.backend.gather_rows(&t, &(0..n).collect::<Vec<_>>())?);
                sp.pending.push(t);
            }
        }
        let lookup_len = self.platform.lookup_chain_len(params);
        // `--budget auto` with a drafter gets its policy after the prefill (its cost model).
        let policy = (params.auto_budget.is_none() || drafter.is_none()).then(|| policy::for_params(params, drafter.is_some(), lookup_len, None));
        let id = self.next_id;
        self.next_id += 1;
        self.seqs.push(Seq {
            id,
            prompt: prompt.to_vec(),
            params: params.clone(),
            cache,
            spec,
            policy,
            out: Vec::new(),
            stopped: false,
            done: params.max_new_tokens == 0,
            added: Instant::now(),
            decode_start: None,
            stats: Stats { prompt_tokens: prompt.len(), ..Stats::default() },
            cost_model: None,
            last_rows: 0,
            cached,
            taps_log,
        });
        Ok(id)
    }

    /// Remove a sequence now (finished or not), freeing its caches; `None` when `id` is not in
    /// the batch.
    pub fn cancel(&mut self, id: SeqId) -> Option<Finished> {
        let i = self.seqs.iter().position(|s| s.id == id)?;
        let s = self.seqs.remove(i);
        // Its rows are kept for reuse too (best effort: a failed read-back keeps nothing; a
        // browser page cannot block on it, so there it keeps nothing).
        #[cfg(not(target_arch = "wasm32"))]
        let _ = pollster::block_on(capture(&mut self.prefix, self.backend, &s));
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

    /// [`Batch::step_async`], blocking on its read-backs (native hosts; in a browser always an
    /// error, since a page cannot block).
    pub fn step(&mut self) -> Result<StepOutput<B>> {
        #[cfg(target_arch = "wasm32")]
        {
            Err(Error::Input("Batch::step cannot block in a browser: use Batch::step_async".into()))
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            pollster::block_on(self.step_async())
        }
    }

    /// One step (module docs): plan every sequence's block, draft, ONE packed target forward,
    /// then each sequence accepts, commits and compacts; finished sequences leave. A step with
    /// nothing to feed runs no forward. Errors: backend failures (the batch should then be
    /// dropped).
    pub async fn step_async(&mut self) -> Result<StepOutput<B>> {
        let t = Instant::now();
        let step_start = t;
        for d in &self.drafters {
            d.prepare_output_head_async(self.backend, self.target).await?;
        }
        let (mut feeds, governed) = self.plan();
        self.draft(&mut feeds).await?;
        self.stats.draft_ms += ms(t);
        let mut out = StepOutput { seqs: Vec::new(), logits: None, taps: None, finished: Vec::new() };
        if !feeds.is_empty() {
            let t = Instant::now();
            let fwd = self.verify(&feeds)?;
            let forward_ms = ms(t);
            self.stats.forward_ms += forward_ms;
            let t = Instant::now();
            let total_rows = fwd.input_rows.last().map_or(0, |r| r.end);
            // One argmax over every logits row when any greedy sequence took one.
            let greedy = feeds.iter().zip(&fwd.logit_rows).any(|(f, r)| !r.is_empty() && self.seqs[f.seq].params.sampling.temperature < 1e-5);
            let argmax = match (&fwd.logits, greedy) {
                (Some(l), true) => Some(self.backend.argmax_async(l).await?),
                _ => None,
            };
            for (k, f) in feeds.into_iter().enumerate() {
                let step = self.finish_block(k, f, &fwd, argmax.as_deref(), forward_ms, total_rows).await?;
                self.stats.tokens += step.tokens.len();
                out.seqs.push(step);
            }
            if let Some((rounds, arm, true)) = governed {
                let tokens = out.seqs.iter().map(|s| s.tokens.len()).sum();
                self.governor.observe(rounds, arm, tokens, ms(step_start));
            }
            self.start_policies().await?;
            self.stats.pick_ms += ms(t);
            self.stats.steps += 1;
            self.stats.rows += total_rows;
            self.last_rows = total_rows;
            out.logits = fwd.logits;
            out.taps = if self.opts.taps.is_empty() { None } else { fwd.taps };
        }
        self.leave(&mut out.finished).await?;
        if self.platform.yields_each_step() {
            super::yield_to_host().await;
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

    /// Step 1: every sequence's block — a prompt chunk, a tail feed, or a planned round (whose
    /// drafted tree [`Batch::draft`] fills in). Where two or more `--budget auto` sequences run
    /// rounds, the [`Governor`] picks the step's arm; returns it with their count and whether
    /// the step feeds rounds only (so its time measures the arm).
    fn plan(&mut self) -> (Vec<Feed>, Option<(usize, StepArm, bool)>) {
        let tail = !self.opts.taps.is_empty();
        let chunk = if self.opts.max_prefill_rows > 0 { self.opts.max_prefill_rows } else { self.platform.prefill_chunk() };
        let mut feeds = Vec::new();
        // Governed: past the prefill, with a cost model (`--budget auto`), more to generate.
        let governed = |s: &Seq<'_, B>| !s.done && s.fed() >= s.prompt.len() && s.policy.as_deref().is_some_and(|p| p.round_ms(1).is_some());
        let rounds = self.seqs.iter().filter(|s| governed(s)).count();
        let only_rounds = self.seqs.iter().all(|s| s.done || s.fed() >= s.prompt.len());
        let arm = self.governor.choose(rounds);
        let mut forced_ar = ForcedAr;
        // The step's prompt-row budget, shared in joining order.
        let mut prompt_rows_left = if chunk == 0 { usize::MAX } else { chunk };
        for (i, s) in self.seqs.iter_mut().enumerate() {
            let root = s.fed();
            let prefilling = root < s.prompt.len() && !(s.done && s.out.is_empty());
            if prefilling && prompt_rows_left == 0 {
                continue; // waits for the next step's budget
            }
            let limit = if chunk == 0 { 0 } else { prompt_rows_left }; // 0: the whole prompt
            if let Some((ids, wants_logits)) = s.prompt_input(limit, tail) {
                if prefilling {
                    prompt_rows_left -= ids.len();
                }
                let positions = (root as u32..(root + ids.len()) as u32).collect();
                feeds.push(Feed { seq: i, ids, positions, wants_logits, round: None });
            } else if !s.done {
                let policy = s.policy.as_deref_mut().expect("a sequence past its prefill has its policy");
                let other_rows = self.last_rows.saturating_sub(s.last_rows);
                let forced = arm == Some(StepArm::ForceAr) && policy.round_ms(1).is_some();
                let policy: &mut dyn RoundPolicy = if forced { &mut forced_ar } else { policy };
                let r = round::plan(policy, s.spec.as_ref(), &s.params, &s.prompt, &s.out, other_rows, &mut s.stats);
                feeds.push(Feed { seq: i, ids: Vec::new(), positions: Vec::new(), wants_logits: true, round: Some(r) });
            }
        }
        (feeds, arm.map(|a| (rounds, a, only_rounds)))
    }

    /// Step 2: the drafted rounds draft ([`round::draft`]); then every round's block is its
    /// tree at positions `root + depth`.
    async fn draft(&mut self, feeds: &mut [Feed]) -> Result<()> {
        let mut drafting: Vec<Drafting<'_, '_, B>> = Vec::new();
        let mut rounds = feeds.iter_mut().filter_map(|f| f.round.as_mut().map(|r| (f.seq, r))).peekable();
        for (i, s) in self.seqs.iter_mut().enumerate() {
            let Some((_, r)) = rounds.next_if(|(seq, _)| *seq == i) else { continue };
            if let (Plan::Draft { .. }, Some(spec), Some(policy)) = (&r.plan, s.spec.as_mut(), s.policy.as_deref_mut()) {
                drafting.push(Drafting { spec, params: &s.params, policy, stats: &mut s.stats, round: r, root_pos: s.cache.len });
            }
        }
        drop(rounds);
        if !drafting.is_empty() {
            round::draft(self.backend, self.target, self.platform, &mut drafting).await?;
        }
        drop(drafting);
        for f in feeds.iter_mut() {
            if let Some(r) = &f.round {
                let root = self.seqs[f.seq].fed() as u32;
                f.ids = r.prop.tree.tokens.clone();
                f.positions = r.prop.tree.depths.iter().map(|&d| root + d).collect();
            }
        }
        Ok(())
    }

    /// Step 3: ONE target forward over every block (tree attention for rounds, causal for
    /// prompts), with the taps the options or the drafters need.
    fn verify(&mut self, feeds: &[Feed]) -> Result<BatchOutput<B>> {
        let inputs: Vec<SeqInput<'_>> = feeds
            .iter()
            .map(|f| match &f.round {
                Some(r) => {
                    SeqInput { ids: &f.ids, positions: &f.positions, mask: AttnMask::Tree { parents: &r.prop.tree.parents }, logits: Some(LogitRows::All) }
                }
                None => SeqInput { ids: &f.ids, positions: &f.positions, mask: AttnMask::Causal, logits: f.wants_logits.then_some(LogitRows::Last) },
            })
            .collect();
        // Taps: those the options ask for, else the drafters' layers while a sequence with a
        // drafter is in the batch (its prefill and its rounds' accepted rows feed its drafter).
        let tap_layers: &[usize] = match self.drafters.first() {
            Some(d) if self.opts.taps.is_empty() && self.seqs.iter().any(|s| s.spec.is_some()) => &d.cfg.target_layer_ids,
            _ => &self.opts.taps,
        };
        let mut caches: Vec<&mut KvCache<B>> = Vec::with_capacity(feeds.len());
        let mut next = feeds.iter().map(|f| f.seq).peekable();
        for (i, s) in self.seqs.iter_mut().enumerate() {
            if next.next_if_eq(&i).is_some() {
                caches.push(&mut s.cache);
            }
        }
        self.target.forward_batch(self.backend, &mut caches, &inputs, tap_layers)
    }

    /// Step 4 for block `k`: a prompt chunk takes its first token from its last row; a round
    /// walks its tree, commits the accepted path and the bonus token, compacts the KV cache,
    /// carries the path's taps to the drafter and lets the policy observe.
    async fn finish_block(&mut self, k: usize, f: Feed, fwd: &BatchOutput<B>, argmax: Option<&[u32]>, forward_ms: f64, total_rows: usize) -> Result<SeqStep> {
        let b = self.backend;
        let platform = self.platform;
        let logging = self.prefix.as_ref().is_some_and(PrefixCache::enabled);
        let s = &mut self.seqs[f.seq];
        let rows = fwd.input_rows[k].clone();
        let lr = fwd.logit_rows[k].clone();
        s.stats.steps += 1;
        s.last_rows = rows.len();
        let first_position = f.positions[0] as usize;
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
            bonus: None,
            drafted: false,
            last_token: false,
        };
        let Some(mut r) = f.round else {
            if let (Some(spec), Some(tp)) = (s.spec.as_mut(), &fwd.taps) {
                let r: Vec<usize> = rows.clone().collect();
                spec.pending.push(b.gather_rows(tp, &r)?);
                if logging {
                    s.taps_log.push(b.gather_rows(tp, &r)?);
                }
            }
            s.stats.prefill_ms += forward_ms;
            if let Some(row) = lr.clone().next() {
                let t = Instant::now();
                let logits = fwd.logits.as_ref().expect("a logits row was asked for");
                let tok = match argmax.filter(|_| s.params.sampling.temperature < 1e-5) {
                    Some(a) => a[row],
                    None => round::pick(b, &b.gather_rows(logits, &[row])?, &s.params, &[s.fed() as u64]).await?[0],
                };
                s.stats.prefill_ms += ms(t);
                s.stats.first_token_ms = s.added.elapsed().as_secs_f64() * 1e3;
                step.tokens = s.commit(&[tok]);
                step.logit_row = Some(row);
            }
            step.token = step.tokens.last().copied();
            if step.logit_row.is_some() {
                // The prompt is prefilled: keep it for requests that share it.
                capture(&mut self.prefix, b, &self.seqs[f.seq]).await?;
            }
            return Ok(step);
        };
        // Accept: the target's token per node walked down the tree.
        let t = Instant::now();
        let tree = &r.prop.tree;
        let positions: Vec<u64> = f.positions.iter().map(|&x| x as u64 + 1).collect();
        let logits = fwd.logits.as_ref().expect("a round's rows ask for logits");
        let p = &s.params;
        let sampled = match argmax.filter(|_| p.sampling.temperature < 1e-5) {
            Some(_) => None,
            None if platform.per_row_sampling() && tree.len() > 1 => None,
            // A device draws the tree's rows in one call (one read-back); alone, they are every
            // logits row, so no gather.
            None if lr.start == 0 && lr.end == b.shape(logits).0 => Some(round::pick(b, logits, p, &positions).await?),
            None => Some(round::pick(b, &b.gather_rows(logits, &lr.clone().collect::<Vec<_>>())?, p, &positions).await?),
        };
        let (accepted, bonus) = round::accept(tree, |i| {
            let row = lr.start + i;
            let pos = positions[i];
            let known = match (argmax, &sampled) {
                (_, Some(v)) => Some(v[i]),
                (Some(a), None) if p.sampling.temperature < 1e-5 => Some(a[row]),
                _ => None,
            };
            async move {
                match known {
                    Some(tok) => Ok(tok),
                    None => Ok(round::pick(b, &b.gather_rows(logits, &[row])?, p, &[pos]).await?[0]),
                }
            }
        })
        .await?;
        let accept_ms = ms(t);
        // Commit path + bonus (stop tokens and max-new-tokens trim inside the round).
        let t = Instant::now();
        let mut new: Vec<u32> = accepted[1..].iter().map(|&i| tree.tokens[i]).collect();
        new.push(bonus);
        s.stats.record_round(&r.prop, accepted.len());
        if s.spec.is_some() || s.params.method == super::Method::Lookup {
            s.stats.record_size(tree.len() - 1);
        }
        step.tokens = s.commit(&new);
        // τ counts the tokens kept: a last round cut by a stop token or the length limit commits
        // fewer than it accepted (so τ × rounds + 1 = the tokens generated).
        s.stats.committed -= new.len() - step.tokens.len();
        if r.looked_up {
            s.stats.lookup_committed += step.tokens.len();
        }
        // Compact the target KV to the accepted path; carry the accepted rows' taps.
        s.cache.compact(b, first_position, &accepted)?;
        if let (Some(spec), Some(tp)) = (s.spec.as_mut(), &fwd.taps) {
            let r: Vec<usize> = accepted.iter().map(|&a| rows.start + a).collect();
            spec.pending.push(b.gather_rows(tp, &r)?);
            if logging {
                s.taps_log.push(b.gather_rows(tp, &r)?);
            }
        }
        let compact_ms = ms(t);
        let tp = Instant::now();
        let reached = accepted.len() - 1;
        if let Some(d) = &r.decision {
            s.stats.record_prediction(d.choice.expected, accepted.len(), &d.raw_mass, reached);
        }
        if let Some(policy) = s.policy.as_deref_mut() {
            let other_rows = total_rows - rows.len();
            policy.observe(&Observed {
                rows: tree.len(),
                other_rows,
                verify_ms: forward_ms + accept_ms,
                overhead_ms: compact_ms + ms(tp),
                decision: r.decision.as_ref(),
                reached,
                chain: match &r.plan {
                    Plan::Chain(c) => Some(c.len()),
                    _ => None,
                },
            });
        }
        s.stats.verify_ms += forward_ms;
        s.stats.accept_ms += accept_ms;
        s.stats.compact_ms += compact_ms;
        s.stats.policy_us += ms(tp) * 1e3;
        step.token = step.tokens.last().copied();
        step.logit_row = (lr.len() == 1).then_some(lr.start);
        step.tree_rows = Some(lr);
        step.bonus = Some(bonus);
        step.drafted = r.drafted;
        step.last_token = r.last_token;
        step.accepted = accepted;
        step.tree = Some(std::mem::take(&mut r.prop.tree));
        Ok(step)
    }

    /// After a step: each sequence that has just taken its first token and still has none
    /// gets its round policy — under `--budget auto` with a drafter, from a resumed state, the
    /// given cost model, or one measured now on its live cache — and starts its decode clock.
    async fn start_policies(&mut self) -> Result<()> {
        let (b, target, platform) = (self.backend, self.target, self.platform);
        for s in self.seqs.iter_mut().filter(|s| s.policy.is_none() && !s.out.is_empty()) {
            let spec = s.spec.as_ref().expect("only a drafter method waits for its policy");
            let n_max = spec.tree.budget;
            let a: &AutoBudget = s.params.auto_budget.as_ref().expect("only `--budget auto` waits for its policy");
            let state = match (&a.resume, &a.cost) {
                (Some(st), _) if st.n_max == n_max && st.cost.is_valid() => Some(st.resumed()),
                (_, Some(c)) if c.is_valid() => Some(AutoState::new(c.clone(), n_max)),
                // A generation that is already done (one token) has no round to measure for.
                _ if s.done => None,
                _ => {
                    let t = Instant::now();
                    let d = spec.drafter;
                    let ctx = match spec.pending.last() {
                        Some(tp) => {
                            let n = b.shape(tp).0;
                            Some(b.gather_rows(tp, &(n.saturating_sub(4)..n).collect::<Vec<_>>())?)
                        }
                        None => None,
                    };
                    let first = s.out[0];
                    let c = CostModel::measure(b, target, &mut s.cache, first, n_max, &d.cfg.target_layer_ids, ctx.as_ref().map(|x| (d, x))).await?;
                    s.stats.cost_measure_ms += ms(t);
                    s.cost_model = Some(c.clone());
                    Some(AutoState::new(c, n_max))
                }
            };
            s.policy = Some(policy::for_params(&s.params, true, platform.lookup_chain_len(&s.params), state));
        }
        for s in self.seqs.iter_mut().filter(|s| s.decode_start.is_none() && !s.out.is_empty()) {
            s.decode_start = Some(Instant::now());
        }
        Ok(())
    }

    /// Sequences that are done (and, with taps, have fed their last token) leave, kept in the
    /// prefix cache when there is one.
    async fn leave(&mut self, finished: &mut Vec<Finished>) -> Result<()> {
        let tail = !self.opts.taps.is_empty();
        let mut i = 0;
        while i < self.seqs.len() {
            let s = &self.seqs[i];
            if s.done && s.prompt_input(self.opts.max_prefill_rows, tail).is_none() {
                let s = self.seqs.remove(i);
                capture(&mut self.prefix, self.backend, &s).await?;
                finished.push(s.finish(false));
            } else {
                i += 1;
            }
        }
        Ok(())
    }
}
