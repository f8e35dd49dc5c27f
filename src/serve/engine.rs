//! The engine thread: it owns the models and ONE [`Batch`]; requests join and leave it between
//! steps (continuous batching). Each request's events go back on its own channel; a request
//! whose channel closed (the client went away, or its stop string was reached) is cancelled
//! before the next step, which frees its caches. The batch keeps a [`PrefixCache`]: a request
//! whose prompt starts with rows an earlier one fed (a system prompt, earlier turns) skips
//! prefilling them ([`crate::decode::prefix`]).

use super::metrics::Metrics;
use crate::decode::batch::{Batch, BatchOptions, SeqId};
use crate::decode::budget::AutoState;
use crate::decode::prefix::PrefixCache;
use crate::decode::{GenParams, Method, Models, Stats};
use crate::error::{Error, Result};
use sparkling_core::Backend;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;

/// One generation request for the engine.
pub struct Job {
    /// Prompt ids.
    pub prompt: Vec<u32>,
    /// Its parameters.
    pub params: GenParams,
    /// Where its events go.
    pub events: UnboundedSender<Event>,
    /// Set by the request to end it early (its stop string was reached): the engine cancels it
    /// and still answers [`Event::Done`] with its statistics.
    pub cancel: Arc<AtomicBool>,
}

/// What the engine tells a request.
#[derive(Debug)]
pub enum Event {
    /// It joined the batch.
    Started,
    /// Tokens committed in one step, in order.
    Tokens(Vec<u32>),
    /// It finished: whether a stop token ended it, and its statistics.
    Done {
        /// A stop token ended it (else the length limit).
        stopped: bool,
        /// Rounds, τ, acceptance.
        stats: Box<Stats>,
        /// Prompt tokens reused from the prefix cache (not prefilled).
        cached_tokens: usize,
    },
    /// It was refused (bad request: the prompt does not fit, …) or the engine failed.
    Failed(Error),
    /// The server is shutting down and its drain timeout ended this request unfinished.
    ShutDown,
}

/// Engine limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most sequences in the batch at once.
    pub max_batch: usize,
    /// Most prompt rows a step feeds over all joining sequences, first come first served
    /// (chunked prefill keeps streams flowing and the first arrival's first token early).
    pub prefill_chunk: usize,
    /// Bytes of host memory the prefix cache may hold (0: no prefix reuse).
    pub prefix_cache_bytes: usize,
}

/// Run the engine until `jobs` is closed and every request has finished (or `stop` is set and
/// the batch is empty). `learned`: the `--budget auto` state per method carries over from one
/// request to the next (calibration, timings), as a long generation would keep it.
///
/// `abort`: set when the server's drain timeout has passed: every request still waiting or
/// running hears [`Event::ShutDown`] and the engine returns.
pub fn run<B: Backend>(backend: &B, models: &Models<B>, jobs: Receiver<Job>, limits: Limits, metrics: &Arc<Metrics>, abort: &AtomicBool) -> Result<()> {
    let new_batch = |prefix: PrefixCache| -> Result<Batch<'_, B>> {
        let mut batch = Batch::new(backend, &models.target, BatchOptions { taps: Vec::new(), max_prefill_rows: limits.prefill_chunk })?;
        for d in &models.drafters {
            batch = batch.with_drafter(d)?;
        }
        batch.with_prefix_cache(prefix)
    };
    let mut batch = new_batch(PrefixCache::new(limits.prefix_cache_bytes))?;
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let mut live: HashMap<SeqId, (UnboundedSender<Event>, Arc<AtomicBool>)> = HashMap::new();
    let mut method_of: HashMap<SeqId, Method> = HashMap::new();
    let mut learned: HashMap<Method, AutoState> = HashMap::new();
    let mut open = true;
    loop {
        if abort.load(Ordering::SeqCst) {
            for (id, (tx, _)) in live.drain() {
                if let Some(f) = batch.cancel(id) {
                    metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                    metrics.generation(&f.stats);
                }
                let _ = tx.send(Event::ShutDown);
            }
            metrics.queued.fetch_sub(waiting.len() as i64, Ordering::Relaxed);
            for j in waiting.drain(..) {
                let _ = j.events.send(Event::ShutDown);
            }
            metrics.running.store(0, Ordering::Relaxed);
            return Ok(());
        }
        // New requests: wait for one only when there is nothing to step.
        if live.is_empty() && waiting.is_empty() {
            if !open {
                return Ok(());
            }
            match jobs.recv_timeout(Duration::from_millis(200)) {
                Ok(j) => waiting.push_back(j),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => open = false,
            }
        }
        loop {
            match jobs.try_recv() {
                Ok(j) => waiting.push_back(j),
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        // Cancel the requests nobody listens to any more (a closed channel: the client left) or
        // that their handler ended (a stop string matched: a normal finish, not counted as a
        // cancellation).
        let gone: Vec<SeqId> = live.iter().filter(|(_, (tx, c))| tx.is_closed() || c.load(Ordering::Relaxed)).map(|(&id, _)| id).collect();
        for id in gone {
            let (tx, _) = live.remove(&id).expect("listed above");
            method_of.remove(&id);
            if let Some(f) = batch.cancel(id) {
                if tx.is_closed() {
                    metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                }
                metrics.generation(&f.stats);
                if let Some(p) = batch.prefix_cache() {
                    metrics.prefix(&p.stats());
                }
                let _ = tx.send(Event::Done { stopped: true, stats: Box::new(f.stats), cached_tokens: f.cached_tokens });
            }
        }
        let before = waiting.len();
        waiting.retain(|j| !j.events.is_closed());
        metrics.queued.fetch_sub((before - waiting.len()) as i64, Ordering::Relaxed);
        // Admit.
        while live.len() < limits.max_batch {
            let Some(mut j) = waiting.pop_front() else { break };
            metrics.queued.fetch_sub(1, Ordering::Relaxed);
            if let (Some(a), Some(s)) = (j.params.auto_budget.as_mut(), learned.get(&j.params.method)) {
                a.resume.get_or_insert_with(|| s.clone());
            }
            match batch.add(&j.prompt, &j.params) {
                Ok(id) => {
                    metrics.prompt_tokens.fetch_add(j.prompt.len() as u64, Ordering::Relaxed);
                    metrics.prompt_tokens_cached.fetch_add(batch.cached_tokens(id).unwrap_or(0) as u64, Ordering::Relaxed);
                    let _ = j.events.send(Event::Started);
                    method_of.insert(id, j.params.method);
                    live.insert(id, (j.events, j.cancel));
                }
                Err(e) => {
                    let _ = j.events.send(Event::Failed(e));
                }
            }
        }
        metrics.running.store(live.len() as i64, Ordering::Relaxed);
        if live.is_empty() {
            continue;
        }
        let out = match batch.step() {
            Ok(o) => o,
            Err(e) => {
                // A backend failure: every request in flight learns it; the batch is rebuilt.
                for (_, (tx, _)) in live.drain() {
                    let _ = tx.send(Event::Failed(Error::Input(format!("the engine failed: {e}"))));
                }
                method_of.clear();
                let prefix = batch.take_prefix_cache().unwrap_or_else(|| PrefixCache::new(limits.prefix_cache_bytes));
                batch = new_batch(prefix)?;
                continue;
            }
        };
        if let Some(p) = batch.prefix_cache() {
            // Before the requests that finished hear of it: their entries are counted.
            metrics.prefix(&p.stats());
        }
        metrics.steps.fetch_add(1, Ordering::Relaxed);
        metrics.step_seqs.fetch_add(out.seqs.len() as u64, Ordering::Relaxed);
        for s in out.seqs {
            if !s.tokens.is_empty() {
                metrics.generation_tokens.fetch_add(s.tokens.len() as u64, Ordering::Relaxed);
                if let Some((tx, _)) = live.get(&s.id) {
                    let _ = tx.send(Event::Tokens(s.tokens));
                }
            }
        }
        for f in out.finished {
            metrics.generation(&f.stats);
            if let (Some(m), Some(st)) = (method_of.remove(&f.id), f.auto_state) {
                learned.insert(m, st);
            }
            if let Some((tx, _)) = live.remove(&f.id) {
                let _ = tx.send(Event::Done { stopped: f.stopped, stats: Box::new(f.stats), cached_tokens: f.cached_tokens });
            }
        }
        metrics.running.store(live.len() as i64, Ordering::Relaxed);
    }
}
