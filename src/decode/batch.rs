//! Batch decoding (issue 11): many independent sequences share ONE target forward per step,
//! with continuous batching — sequences join and leave between steps.
//!
//! # Shape of the API
//! A [`Batch`] holds the sequences in flight. [`Batch::add`] queues a prompt with its own
//! [`GenParams`] (stop tokens, max-new-tokens, temperature / top-k / top-p and seed) and returns
//! its [`SeqId`]; the sequence joins at the next [`Batch::step`]. Each step packs, for every
//! sequence in flight, the rows it feeds — its prompt (or the next chunk of it, see
//! [`BatchOptions::max_prefill_rows`]) when it has just joined, else its last token — into one
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
//! # Speculative methods (design; `ar` runs end to end today)
//! The packed forward already takes a tree block per sequence: a [`SeqInput`] with
//! `mask: AttnMask::Tree { parents }`, `positions = root_pos + depth` and `logits: All`, so a
//! batched speculative round is: (1) each sequence's drafter forward on its own draft cache
//! (batchable the same way: a `Drafter::forward_batch` over per-sequence draft caches, context
//! taps and anchors), (2) `propose` per sequence (host tree build), (3) ONE
//! `Target::forward_batch` verifying every sequence's tree, (4) per-sequence acceptance over its
//! `logit_rows` with the same walk as `Engine::generate_async`, then
//! `KvCache::compact(root_pos, accepted)` on that sequence's cache and its accepted taps as its
//! next drafter context. Sequences whose trees differ in size are simply ragged blocks. Until
//! that lands, [`Batch::add`] refuses methods other than `ar`.

use super::rng;
use super::{Engine, GenParams, Method};
use crate::error::{Error, Result};
use crate::model::layer::KvCache;
use crate::model::target::{LogitRows, SeqInput, Target};
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
    /// Its row of [`StepOutput::logits`], when it took a token this step.
    pub logit_row: Option<usize>,
    /// The token it committed this step (`None` for a non-final prefill chunk or a tail step).
    pub token: Option<u32>,
}

/// Result of one [`Batch::step`].
pub struct StepOutput<B: Backend> {
    /// Every sequence that fed rows this step, in batch order.
    pub seqs: Vec<SeqStep>,
    /// Logits of the rows that produced a token (`[rows, V]`), when any did.
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
    /// Token choice (argmax / sampling), ms.
    pub pick_ms: f64,
}

struct Seq<B: Backend> {
    id: SeqId,
    prompt: Vec<u32>,
    params: GenParams,
    cache: KvCache<B>,
    out: Vec<u32>,
    stopped: bool,
    /// No more tokens to generate.
    done: bool,
    added: Instant,
    first_token_ms: f64,
    steps: usize,
}

impl<B: Backend> Seq<B> {
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

    fn finish(self, cancelled: bool) -> Finished {
        let stats = SeqStats {
            prompt_tokens: self.prompt.len(),
            new_tokens: self.out.len(),
            steps: self.steps,
            first_token_ms: self.first_token_ms,
            latency_ms: self.added.elapsed().as_secs_f64() * 1e3,
        };
        Finished { id: self.id, prompt: self.prompt, tokens: self.out, stopped: self.stopped, cancelled, stats }
    }
}

/// Sequences decoded together, one target forward per step (module docs).
pub struct Batch<'a, B: Backend> {
    backend: &'a B,
    target: &'a Target<B>,
    opts: BatchOptions,
    seqs: Vec<Seq<B>>,
    next_id: SeqId,
    stats: BatchStats,
}

impl<'a, B: Backend> Batch<'a, B> {
    /// An empty batch over `target` on `backend`.
    /// Errors: a tap layer the target cannot tap (the last layer or beyond).
    pub fn new(backend: &'a B, target: &'a Target<B>, opts: BatchOptions) -> Result<Self> {
        if let Some(&bad) = opts.taps.iter().find(|&&l| l + 1 >= target.cfg.layers) {
            return Err(Error::Input(format!("tap layer {bad} invalid for a {}-layer target (never tap the last layer)", target.cfg.layers)));
        }
        Ok(Batch { backend, target, opts, seqs: Vec::new(), next_id: 0, stats: BatchStats::default() })
    }

    /// Queue `prompt` with its own parameters; it joins the batch at the next [`Batch::step`].
    /// Errors (nothing is queued): the checks of [`Engine::check`] (empty prompt, ids outside
    /// the vocabulary, prompt + max-new-tokens beyond the context), invalid sampling parameters
    /// ([`GenParams::validate`]), a method other than `ar`, KV allocation failures.
    pub fn add(&mut self, prompt: &[u32], params: &GenParams) -> Result<SeqId> {
        if params.method != Method::Ar {
            return Err(Error::Input(format!(
                "batch decoding runs `ar` only so far (method `{}`: tree blocks per sequence are designed, see decode::batch)",
                params.method.name()
            )));
        }
        params.validate()?;
        let engine = Engine { backend: self.backend, target: self.target, drafter: None };
        let checked = engine.check(prompt, params)?;
        let cache = self.target.new_cache(self.backend, checked.capacity)?;
        let id = self.next_id;
        self.next_id += 1;
        self.seqs.push(Seq {
            id,
            prompt: prompt.to_vec(),
            params: params.clone(),
            cache,
            out: Vec::new(),
            stopped: false,
            done: params.max_new_tokens == 0,
            added: Instant::now(),
            first_token_ms: 0.0,
            steps: 0,
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
    /// each sequence whose block ends in a logits row, and the sequences that finished leave.
    /// A step with nothing to feed (empty batch, or only `max_new_tokens == 0` requests) runs
    /// no forward. Errors: backend failures (the batch should then be dropped).
    pub fn step(&mut self) -> Result<StepOutput<B>> {
        let b = self.backend;
        let tail = !self.opts.taps.is_empty();
        // Inputs of every sequence that feeds rows this step.
        let mut feeding: Vec<(usize, Vec<u32>, Vec<u32>, bool)> = Vec::new();
        for (i, s) in self.seqs.iter().enumerate() {
            if let Some((ids, wants_logits)) = s.next_input(self.opts.max_prefill_rows, tail) {
                let p0 = s.fed() as u32;
                let positions: Vec<u32> = (p0..p0 + ids.len() as u32).collect();
                feeding.push((i, ids, positions, wants_logits));
            }
        }
        let mut out = StepOutput { seqs: Vec::new(), logits: None, taps: None, finished: Vec::new() };
        if !feeding.is_empty() {
            let t = Instant::now();
            let inputs: Vec<SeqInput<'_>> = feeding
                .iter()
                .map(|(_, ids, pos, wl)| SeqInput { ids, positions: pos, mask: AttnMask::Causal, logits: wl.then_some(LogitRows::Last) })
                .collect();
            // Mutable borrows of the feeding sequences' caches, in `feeding` order.
            let mut caches: Vec<&mut KvCache<B>> = Vec::with_capacity(feeding.len());
            {
                let mut next = feeding.iter().map(|f| f.0).peekable();
                for (i, s) in self.seqs.iter_mut().enumerate() {
                    if next.peek() == Some(&i) {
                        caches.push(&mut s.cache);
                        next.next();
                    }
                }
            }
            let fwd = self.target.forward_batch(b, &mut caches, &inputs, &self.opts.taps)?;
            drop(caches);
            self.stats.forward_ms += t.elapsed().as_secs_f64() * 1e3;
            self.stats.steps += 1;
            self.stats.rows += fwd.input_rows.last().map_or(0, |r| r.end);

            // Token choice: argmax once over every row when any greedy sequence took a row; a
            // sampled sequence draws from its own row with its own parameters.
            let t = Instant::now();
            let greedy_rows = feeding.iter().zip(&fwd.logit_rows).any(|(f, r)| !r.is_empty() && self.seqs[f.0].params.sampling.temperature < 1e-5);
            let argmax = match (&fwd.logits, greedy_rows) {
                (Some(l), true) => Some(b.argmax(l)?),
                _ => None,
            };
            for (k, (i, ids, _, _)) in feeding.iter().enumerate() {
                let s = &mut self.seqs[*i];
                s.steps += 1;
                let first_position = s.fed() - ids.len();
                let lr = fwd.logit_rows[k].clone();
                let mut step = SeqStep { id: s.id, input_rows: fwd.input_rows[k].clone(), first_position, logit_row: None, token: None };
                if let (Some(logits), Some(r)) = (&fwd.logits, lr.clone().next()) {
                    // The token at absolute position `fed` (the uniform of that position).
                    let pos = s.fed() as u64;
                    let p = &s.params;
                    let tok = if p.sampling.temperature < 1e-5 {
                        argmax.as_ref().expect("argmax taken when a greedy row exists")[r]
                    } else {
                        let row = b.gather_rows(logits, &[r])?;
                        b.sample(&row, p.sampling, &[rng::uniform(p.seed, pos)])?[0]
                    };
                    if s.out.is_empty() {
                        s.first_token_ms = s.added.elapsed().as_secs_f64() * 1e3;
                    }
                    s.out.push(tok);
                    self.stats.tokens += 1;
                    if p.stop.contains(&tok) {
                        s.stopped = true;
                    }
                    s.done = s.stopped || s.out.len() >= p.max_new_tokens;
                    step.logit_row = Some(r);
                    step.token = Some(tok);
                }
                out.seqs.push(step);
            }
            self.stats.pick_ms += t.elapsed().as_secs_f64() * 1e3;
            out.logits = fwd.logits;
            out.taps = fwd.taps;
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
