//! Prompt-prefix reuse (docs/design.md §12): a request whose prompt starts with tokens an
//! earlier sequence of the same [`Batch`](super::batch::Batch) already fed (the same system
//! prompt, the earlier turns of a conversation) takes their target K/V rows, and the drafter's
//! context for them, from a [`PrefixCache`] instead of prefilling them again.
//!
//! # What an entry holds
//! For the token ids `t[0..n]` at positions `0..n`: every target layer's K and V rows
//! `[n, kv_cols]` as the KV cache stored them (read back with `download_rows`, so an f16 or
//! q8_0 cache's values exactly), and, when the sequence had a drafter, the target's taps
//! `[n, n_taps·H]` of those rows (the drafter's context; its own context K/V are recomputed
//! from them by its next forward, which costs one drafter pass over the reused rows). Values
//! are held in host memory as f16 when every value of a tensor is exactly an f16 (an f16
//! cache), else as f32.
//!
//! # When entries are made and used
//! A sequence is captured when its prompt is fully prefilled (its prompt rows) and when it
//! leaves the batch, finished or cancelled (prompt + answer rows up to its last fed token).
//! An entry whose tokens extend an older entry's (the same sequence after its answer; the next
//! turn of a conversation) replaces it, and only the new rows are read back. A sequence joining
//! the batch ([`Batch::add`](super::batch::Batch::add)) takes the longest common prefix of its
//! prompt with any entry (at most the prompt's length − 1: the last prompt row is always fed,
//! for the first token's logits), writes those rows into its fresh cache (`write_rows`) and
//! feeds only the rest. A sequence with a drafter only uses entries that hold taps of the same
//! layers.
//!
//! # Memory
//! The entries' bytes (values, tokens) stay within the budget given to [`PrefixCache::new`]:
//! inserting evicts the least recently used entries (used = made or reused) first; an entry
//! larger than the whole budget is not kept; a budget of 0 keeps nothing (reuse off).
//!
//! # Exactness
//! A row's K/V and taps depend only on the tokens at and before it (every backend op computes
//! a row independently of the others in its call, and attention reads a row's visible keys in
//! ascending order whatever the chunk, design §3), and the read-back values written back into
//! a cache of the same kind are the same values: f32 and f16 exactly; q8_0 blocks re-quantize
//! to the same codes and scales (the largest code is ±127, so the scale is recovered exactly
//! and every code with it). So a sequence's tokens with a reused prefix are those of a cold
//! prefill, at T = 0 and at T > 0 with the same seed (`tests/prefix.rs` checks the first
//! token's logits bit for bit, on every CPU cache kind, at unaligned reuse lengths).
//!
//! One cache serves one target model on one backend (an entry whose shapes do not fit the
//! sequence's cache is never used).

use crate::error::{Error, Result};
use crate::model::layer::KvCache;
use half::f16;
use sparkling_core::Backend;

/// A tensor's values held in host memory: f16 while every value is exactly an f16, else f32.
#[derive(Debug, Clone)]
enum Values {
    F16(Vec<f16>),
    F32(Vec<f32>),
}

impl Values {
    fn len(&self) -> usize {
        match self {
            Values::F16(v) => v.len(),
            Values::F32(v) => v.len(),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Values::F16(v) => v.len() * 2,
            Values::F32(v) => v.len() * 4,
        }
    }

    /// Append `xs`, switching to f32 at the first value an f16 would change.
    fn push(&mut self, xs: &[f32]) {
        if let Values::F16(h) = self {
            if xs.iter().all(|&x| f16::from_f32(x).to_f32().to_bits() == x.to_bits()) {
                h.extend(xs.iter().map(|&x| f16::from_f32(x)));
                return;
            }
            *self = Values::F32(h.iter().map(|x| x.to_f32()).collect());
        }
        if let Values::F32(v) = self {
            v.extend_from_slice(xs);
        }
    }

    /// The first `n` values as f32.
    fn head(&self, n: usize) -> Vec<f32> {
        match self {
            Values::F16(v) => v[..n].iter().map(|x| x.to_f32()).collect(),
            Values::F32(v) => v[..n].to_vec(),
        }
    }

    /// A copy of the first `n` values.
    fn prefix(&self, n: usize) -> Values {
        match self {
            Values::F16(v) => Values::F16(v[..n].to_vec()),
            Values::F32(v) => Values::F32(v[..n].to_vec()),
        }
    }

    fn truncate(&mut self, n: usize) {
        match self {
            Values::F16(v) => v.truncate(n),
            Values::F32(v) => v.truncate(n),
        }
    }
}

/// The taps of an entry's rows.
#[derive(Debug, Clone)]
struct Taps {
    /// The target layers they were tapped from.
    layers: Vec<usize>,
    /// Columns per row (`n_taps·H`).
    cols: usize,
    /// `[rows, cols]`, row-major.
    values: Values,
}

/// One reusable prefix.
#[derive(Debug, Clone)]
struct Entry {
    tokens: Vec<u32>,
    /// Columns of a K or V row.
    kv_cols: usize,
    /// K then V of each layer: `2·layers` tensors `[tokens.len(), kv_cols]`, row-major.
    kv: Vec<Values>,
    taps: Option<Taps>,
    /// [`PrefixCache`]'s clock when last made or reused.
    used: u64,
}

/// Bytes an entry costs beyond its values and tokens (the bookkeeping), so that many tiny
/// entries still count.
const ENTRY_OVERHEAD: usize = 256;

impl Entry {
    fn rows(&self) -> usize {
        self.tokens.len()
    }

    fn bytes(&self) -> usize {
        ENTRY_OVERHEAD + self.tokens.len() * 4 + self.kv.iter().map(Values::bytes).sum::<usize>() + self.taps.as_ref().map_or(0, |t| t.values.bytes())
    }

    /// Whether its K/V fit a cache of `tensors` tensors of `cols` columns.
    fn fits(&self, tensors: usize, cols: usize) -> bool {
        self.kv.len() == tensors && self.kv_cols == cols
    }

    /// Whether it serves every lookup `other` serves: its tokens start with `other`'s and it
    /// has taps where `other` has.
    fn covers(&self, tokens: &[u32], taps: Option<&[usize]>) -> bool {
        self.tokens.starts_with(tokens) && self.taps_for(taps)
    }

    /// Whether a sequence needing the taps of `layers` (`None`: no taps) can use it.
    fn taps_for(&self, layers: Option<&[usize]>) -> bool {
        match layers {
            None => true,
            Some(l) => self.taps.as_ref().is_some_and(|t| t.layers == l),
        }
    }

    /// Keep only the first `n` rows.
    fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
        for v in &mut self.kv {
            v.truncate(n * self.kv_cols);
        }
        if let Some(t) = &mut self.taps {
            t.values.truncate(n * t.cols);
        }
    }
}

/// Counters of a [`PrefixCache`] since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PrefixStats {
    /// Prompts looked up (sequences that joined the batch).
    pub lookups: u64,
    /// Prompt tokens looked up (Σ prompt lengths).
    pub queried_tokens: u64,
    /// Lookups that reused at least one token.
    pub hits: u64,
    /// Prompt tokens reused instead of prefilled.
    pub reused_tokens: u64,
    /// Entries made (an extended entry counts again).
    pub inserts: u64,
    /// Entries evicted to stay within the budget.
    pub evictions: u64,
    /// Entries held now.
    pub entries: usize,
    /// Bytes held now (≤ the budget).
    pub bytes: usize,
}

/// Reusable prompt prefixes of one target, least recently used evicted first (module docs).
#[derive(Debug, Clone)]
pub struct PrefixCache {
    budget: usize,
    entries: Vec<Entry>,
    clock: u64,
    stats: PrefixStats,
}

/// Length of the common prefix of `a` and `b`.
fn common(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixCache {
    /// An empty cache holding at most `budget_bytes` bytes of entries (0: it keeps nothing,
    /// reuse is off).
    pub fn new(budget_bytes: usize) -> PrefixCache {
        PrefixCache { budget: budget_bytes, entries: Vec::new(), clock: 0, stats: PrefixStats::default() }
    }

    /// The budget, bytes.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Whether it keeps anything (a budget above 0).
    pub fn enabled(&self) -> bool {
        self.budget > 0
    }

    /// Its counters.
    pub fn stats(&self) -> PrefixStats {
        PrefixStats { entries: self.entries.len(), bytes: self.bytes(), ..self.stats }
    }

    /// Drop every entry (the counters stay).
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    fn bytes(&self) -> usize {
        self.entries.iter().map(Entry::bytes).sum()
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The entry to reuse for `prompt` and the rows it gives: the longest common prefix, at
    /// most `prompt.len() − 1` rows, among the entries that fit the cache shape and have the
    /// taps needed; the most recently used on ties.
    fn best(&self, prompt: &[u32], tensors: usize, cols: usize, taps: Option<&[usize]>) -> Option<(usize, usize)> {
        let cap = prompt.len().saturating_sub(1);
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.fits(tensors, cols) && e.taps_for(taps))
            .map(|(i, e)| (i, common(&e.tokens, prompt).min(cap)))
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(i, n)| (n, self.entries[i].used))
    }

    /// Reuse the longest cached prefix of `prompt` for a sequence whose target cache `cache`
    /// is fresh (`cache.len` 0): write its K/V rows into `cache` (then `cache.len` = the rows
    /// reused) and return how many rows that is and, when `taps` names the layers the
    /// sequence's drafter reads, their taps `[rows, n_taps·H]` for its pending context.
    /// Returns `(0, None)` on a miss (and when the cache keeps nothing).
    /// Errors: a cache that is not fresh; backend failures (upload, `write_rows`).
    pub fn restore<B: Backend>(&mut self, b: &B, prompt: &[u32], cache: &mut KvCache<B>, taps: Option<&[usize]>) -> Result<(usize, Option<B::Tensor>)> {
        if !self.enabled() {
            return Ok((0, None));
        }
        if cache.len != 0 {
            return Err(Error::Input(format!("prefix reuse into a cache that holds {} rows already (expected a fresh one)", cache.len)));
        }
        self.stats.lookups += 1;
        self.stats.queried_tokens += prompt.len() as u64;
        let cols = cache.k.first().map_or(0, |k| b.shape(k).1);
        let Some((i, n)) = self.best(prompt, 2 * cache.k.len(), cols, taps) else { return Ok((0, None)) };
        let n = n.min(cache.capacity);
        let e = &self.entries[i];
        for (l, (k, v)) in cache.k.iter_mut().zip(cache.v.iter_mut()).enumerate() {
            b.write_rows(k, 0, &b.upload(&e.kv[2 * l].head(n * cols), n, cols)?)?;
            b.write_rows(v, 0, &b.upload(&e.kv[2 * l + 1].head(n * cols), n, cols)?)?;
        }
        let t = match (&e.taps, taps) {
            (Some(t), Some(_)) => Some(b.upload(&t.values.head(n * t.cols), n, t.cols)?),
            _ => None,
        };
        cache.len = n;
        let now = self.tick();
        self.entries[i].used = now;
        self.stats.hits += 1;
        self.stats.reused_tokens += n as u64;
        Ok((n, t))
    }

    /// Keep the K/V rows of `tokens` (positions `0..tokens.len()`, at most `cache.len`) from a
    /// sequence's target `cache`, with their taps when `taps` gives the layers and the tensors
    /// whose rows, concatenated, are the taps of rows `0..` (at least `tokens.len()` of them).
    /// An entry that already covers these tokens is only marked used; an entry they extend is
    /// replaced, reading back only the new rows; the least recently used entries are evicted
    /// to make room. Nothing is kept when the budget is 0 or the entry alone exceeds it.
    /// Errors: `tokens` longer than the cache's rows or the taps; backend read-back failures.
    pub async fn capture<B: Backend>(&mut self, b: &B, tokens: &[u32], cache: &KvCache<B>, taps: Option<(&[usize], &[B::Tensor])>) -> Result<()> {
        let n = tokens.len();
        if !self.enabled() || n == 0 {
            return Ok(());
        }
        if n > cache.len {
            return Err(Error::Input(format!("prefix capture of {n} tokens from a cache of {} rows", cache.len)));
        }
        let cols = cache.k.first().map_or(0, |k| b.shape(k).1);
        let tensors = 2 * cache.k.len();
        let layers = taps.map(|(l, _)| l);
        let now = self.tick();
        if let Some(e) = self.entries.iter_mut().find(|e| e.fits(tensors, cols) && e.covers(tokens, layers)) {
            e.used = now;
            return Ok(());
        }
        // The least the entry can cost (f16 values): skip the read-back when even that is over.
        let tap_cols = taps.and_then(|(_, t)| t.first()).map_or(0, |t| b.shape(t).1);
        if ENTRY_OVERHEAD + n * (4 + 2 * (tensors * cols + tap_cols)) > self.budget {
            return Ok(());
        }
        // A base to copy rows from: the entry sharing the longest prefix; when these tokens
        // extend it whole, it is replaced (its values are taken, not copied).
        let base = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.fits(tensors, cols))
            .map(|(i, e)| (i, common(&e.tokens, tokens)))
            .filter(|&(_, k)| k > 0)
            .max_by_key(|&(i, k)| (k, self.entries[i].used));
        let (mut entry, replaced) = match base {
            Some((i, k)) if k == self.entries[i].rows() && (layers.is_some() || self.entries[i].taps.is_none()) => {
                let mut e = self.entries.swap_remove(i);
                if layers.is_none_or(|l| !e.taps_for(Some(l))) {
                    e.taps = None;
                }
                let old = e.rows();
                (e, Some(old))
            }
            Some((i, k)) => {
                let e = &self.entries[i];
                let taps = match (&e.taps, layers) {
                    (Some(t), Some(l)) if t.layers == l => Some(Taps { layers: t.layers.clone(), cols: t.cols, values: t.values.prefix(k * t.cols) }),
                    _ => None,
                };
                (Entry { tokens: tokens[..k].to_vec(), kv_cols: cols, kv: e.kv.iter().map(|v| v.prefix(k * cols)).collect(), taps, used: now }, None)
            }
            None => (Entry { tokens: Vec::new(), kv_cols: cols, kv: vec![Values::F16(Vec::new()); tensors], taps: None, used: now }, None),
        };
        let k = entry.rows();
        for (l, (kt, vt)) in cache.k.iter().zip(&cache.v).enumerate() {
            entry.kv[2 * l].push(&b.download_rows_async(kt, k, n - k).await?);
            entry.kv[2 * l + 1].push(&b.download_rows_async(vt, k, n - k).await?);
        }
        if let Some((l, parts)) = taps {
            let have = entry.taps.as_ref().map_or(0, |t| t.values.len() / t.cols.max(1));
            let t = entry.taps.get_or_insert_with(|| Taps { layers: l.to_vec(), cols: tap_cols, values: Values::F16(Vec::new()) });
            // Read the rows `have..n` of the concatenated parts.
            let mut row0 = 0;
            for p in parts {
                let rows = b.shape(p).0;
                let (from, to) = (have.max(row0), n.min(row0 + rows));
                if from < to {
                    t.values.push(&b.download_rows_async(p, from - row0, to - from).await?);
                }
                row0 += rows;
                if row0 >= n {
                    break;
                }
            }
            if row0 < n {
                return Err(Error::Input(format!("prefix capture of {n} tokens with taps of only {row0} rows")));
            }
        }
        entry.tokens = tokens.to_vec();
        entry.used = now;
        let bytes = entry.bytes();
        if bytes > self.budget {
            // Too large to keep: put back what it replaced.
            if let Some(old) = replaced {
                entry.truncate(old);
                self.entries.push(entry);
            }
            return Ok(());
        }
        while !self.entries.is_empty() && self.bytes() + bytes > self.budget {
            let lru = self.entries.iter().enumerate().min_by_key(|(_, e)| e.used).map(|(i, _)| i).expect("not empty");
            self.entries.swap_remove(lru);
            self.stats.evictions += 1;
        }
        self.entries.push(entry);
        self.stats.inserts += 1;
        Ok(())
    }

    /// The token lists held, most recently used first (for tests and diagnostics).
    pub fn held(&self) -> Vec<Vec<u32>> {
        let mut e: Vec<&Entry> = self.entries.iter().collect();
        e.sort_by_key(|e| std::cmp::Reverse(e.used));
        e.into_iter().map(|e| e.tokens.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sparkling_core::ReadBack;
    use sparkling_cpu::CpuBackend;

    const COLS: usize = 8;

    /// A 1-layer cache (1 KV head of 8 values) whose row `p` holds `p + token/8` in every
    /// column, for `tokens`.
    fn cache(b: &CpuBackend, tokens: &[u32]) -> KvCache<CpuBackend> {
        let mut c = KvCache::new(b, 1, 64, 1, COLS).unwrap();
        let rows: Vec<f32> = tokens.iter().enumerate().flat_map(|(p, &t)| [p as f32 + t as f32 / 8.0; COLS]).collect();
        let x = b.upload(&rows, tokens.len(), COLS).unwrap();
        b.write_rows(&mut c.k[0], 0, &x).unwrap();
        b.write_rows(&mut c.v[0], 0, &x).unwrap();
        c.len = tokens.len();
        c
    }

    fn capture(p: &mut PrefixCache, b: &CpuBackend, tokens: &[u32]) {
        pollster::block_on(p.capture(b, tokens, &cache(b, tokens), None)).unwrap();
    }

    /// Rows reused for `prompt`, checking the rows written equal the cached sequence's.
    fn restore(p: &mut PrefixCache, b: &CpuBackend, prompt: &[u32]) -> usize {
        let mut c = KvCache::new(b, 1, 64, 1, COLS).unwrap();
        let (n, taps) = p.restore(b, prompt, &mut c, None).unwrap();
        assert!(taps.is_none());
        assert_eq!(c.len, n);
        assert_eq!(b.download_rows(&c.k[0], 0, n).unwrap(), b.download_rows(&cache(b, &prompt[..n]).k[0], 0, n).unwrap());
        n
    }

    #[test]
    fn reuses_the_longest_prefix_and_evicts_the_least_recently_used() {
        let b = CpuBackend::new();
        // 10 rows of f16-exact values: 256 + 40 + 2 tensors · 10 · 8 · 2 bytes = 616.
        let row = |t: u32| -> Vec<u32> { (0..10).map(|i| t * 100 + i).collect() };
        let mut p = PrefixCache::new(2 * 616 + 100);
        capture(&mut p, &b, &row(1));
        assert_eq!(p.stats().bytes, 616);
        capture(&mut p, &b, &row(2));
        // Reuse: the longest common prefix, at most the prompt's length − 1.
        assert_eq!(restore(&mut p, &b, &[100, 101, 102, 7]), 3);
        assert_eq!(restore(&mut p, &b, &row(1)), 9);
        assert_eq!(restore(&mut p, &b, &[5, 6]), 0);
        // A third entry evicts the least recently used (row 2; row 1 was just reused).
        capture(&mut p, &b, &row(3));
        assert_eq!(p.held(), vec![row(3), row(1)]);
        assert_eq!(restore(&mut p, &b, &row(2)), 0);
        let s = p.stats();
        assert_eq!((s.entries, s.evictions, s.inserts, s.lookups, s.hits, s.reused_tokens), (2, 1, 3, 4, 2, 12));
        // A prefix of an entry is not kept again; an extension replaces the entry it extends.
        capture(&mut p, &b, &row(3)[..4]);
        assert_eq!(p.held(), vec![row(3), row(1)]);
        let longer: Vec<u32> = row(1).into_iter().chain([9, 9]).collect();
        capture(&mut p, &b, &longer);
        assert_eq!(p.held(), vec![longer.clone(), row(3)]);
        assert_eq!(p.stats().bytes, 616 + 616 + 2 * 4 + 2 * 2 * COLS * 2);
        assert_eq!(restore(&mut p, &b, &[longer.clone(), vec![1]].concat()), 12);
        // An entry larger than the whole budget is not kept (the others stay).
        let long: Vec<u32> = (0..40).collect();
        capture(&mut p, &b, &long);
        assert_eq!(p.stats().entries, 2);
        // Values an f16 would change are kept as f32.
        let mut q = PrefixCache::new(1 << 20);
        let mut c = KvCache::new(&b, 1, 8, 1, COLS).unwrap();
        b.write_rows(&mut c.k[0], 0, &b.upload(&[0.1; COLS], 1, COLS).unwrap()).unwrap();
        c.len = 1;
        pollster::block_on(q.capture(&b, &[4], &c, None)).unwrap();
        assert_eq!(q.stats().bytes, ENTRY_OVERHEAD + 4 + COLS * 4 + COLS * 2);
    }

    #[test]
    fn a_zero_budget_keeps_nothing() {
        let b = CpuBackend::new();
        let mut p = PrefixCache::new(0);
        assert!(!p.enabled());
        capture(&mut p, &b, &[1, 2, 3]);
        assert_eq!(restore(&mut p, &b, &[1, 2, 3, 4]), 0);
        assert_eq!(p.stats(), PrefixStats::default());
    }
}
