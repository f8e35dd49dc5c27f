//! Host-side draft-tree builders (reference spec §4.8, §5, §9.2–§9.5).
//!
//! Every builder returns a [`DraftTree`] in *verify order*: index 0 is the root (the
//! anchor/bonus token of the round, depth 0) and nodes `1..len` follow in the order the
//! builder admitted them, so `parents[i] < i` for every `i >= 1`. The position id of node
//! `i` in the verify batch is `S + depths[i]` and node `i` attends to the committed prefix,
//! its ancestors and itself (§4.8); that compilation step is not done here.
//!
//! Builders:
//! - [`build_ddtree`] — DDTree best-first heap over factorised per-depth marginals (§5.1),
//!   fed by [`depth_topk`].
//! - [`build_sparkling_reference`] — SparklingTree naive Markov-conditioned best-first
//!   (§5.2 (a)); [`candidate_table`] + [`build_sparkling_precompute`] — the precompute form
//!   (§5.2 (c)); [`build_sparkling_lazy`] — the same union-normalised tree with rows built only
//!   for expanded nodes (the CPU fast path); [`markov_greedy_chain`] — the DSpark greedy chain
//!   (§3.7 at T = 0).
//! - [`build_treespark`] — the PCTree policy (§5.4: per-parent top-k, frontier pruning,
//!   global top-N) with the budget counting **non-root** nodes.
//!
//! All numerics are pure `f32`/`f64` Rust with a fixed evaluation order: the Markov bias and
//! the full-vocabulary log-softmax are bit-identical wherever they are evaluated (so DDTree and
//! the SparklingTree reference agree exactly without a head); the precompute table factorises
//! its normaliser and matches the reference to f32 rounding. Logits must be finite (no NaN /
//! ±inf); no builder panics on valid input.

pub mod ddtree;
pub mod sparkling;
pub mod sparkling_lazy;
pub mod sparkling_table;
pub mod treespark;

pub use ddtree::build_ddtree;
pub use sparkling::{build_sparkling_reference, markov_greedy_chain, markov_greedy_chain_scored, MarkovHead};
/// The shared selection numerics (one implementation for the tree builders and every backend).
pub(crate) use sparkling_core::select::{exp_nonpos, log_sum_exp, row_max, topk_desc};
/// The tree types are defined once, next to the Backend trait (design §3).
pub use sparkling_core::tree::{CandidateTable, ChildMap, DraftTree, TopK, NO_PARENT};
pub use sparkling_lazy::{build_sparkling_lazy, LazyCandidates};
pub use sparkling_table::{build_sparkling_precompute, candidate_table, candidate_union};
pub use treespark::build_treespark;

/// Compute the host [`TopK`] of draft logits (§5.1 step 2), normalised: `vals` are
/// log-probabilities and `lse` is 0 ([`TopK::from_logp`]).
///
/// `logits` is `[depths, vocab]` row-major `f32` (finite values). Per row: log-sum-exp over
/// the **full** vocabulary (max shift, `f32` exponentials summed in `f64` blocks), then the
/// top `min(k, vocab)` entries by logit via partial selection (ties: lower id first), stored
/// as `logit - logZ`. The result's `k` is `min(k, vocab)`.
///
/// # Panics
/// If `logits.len() < depths * vocab` (precondition).
pub fn depth_topk(logits: &[f32], depths: usize, vocab: usize, k: usize) -> TopK {
    assert!(logits.len() >= depths * vocab, "depth_topk: logits shorter than depths*vocab");
    let k = k.min(vocab);
    let mut ids = Vec::with_capacity(depths * k);
    let mut logp = Vec::with_capacity(depths * k);
    let mut sel = Vec::with_capacity(k);
    for d in 0..depths {
        let row = &logits[d * vocab..(d + 1) * vocab];
        let lse = log_sum_exp(row);
        topk_desc(row, k, &mut sel);
        for &(v, id) in &sel {
            ids.push(id);
            logp.push(log_prob(v, lse));
        }
    }
    TopK::from_logp(k, ids, logp)
}

// ---------------------------------------------------------------------------------------
// Shared numerics (crate-private). Fixed evaluation order everywhere so that identical
// inputs give bit-identical outputs across builders.
// ---------------------------------------------------------------------------------------

/// `x - lse` rounded once to f32 (a log-probability; `<= 0` whenever `lse` came from
/// [`log_sum_exp`] over a row containing `x`).
#[inline]
pub(crate) fn log_prob(x: f32, lse: f64) -> f32 {
    (x as f64 - lse) as f32
}

/// Minimal binary max-heap with an external "pops first" predicate, so entries can be
/// compared against side tables (DDTree rank tuples) without storing them inline.
pub(crate) struct Heap<T> {
    v: Vec<T>,
}

impl<T: Copy> Heap<T> {
    /// Empty heap with room for `n` entries.
    pub(crate) fn with_capacity(n: usize) -> Self {
        Heap { v: Vec::with_capacity(n) }
    }

    /// Insert `x`; `first(a, b)` is true when `a` must pop before `b` (a strict order).
    pub(crate) fn push(&mut self, x: T, first: impl Fn(&T, &T) -> bool) {
        self.v.push(x);
        let mut c = self.v.len() - 1;
        while c > 0 {
            let p = (c - 1) / 2;
            if first(&self.v[c], &self.v[p]) {
                self.v.swap(c, p);
                c = p;
            } else {
                break;
            }
        }
    }

    /// Remove and return the entry that pops first under `first`, or `None` when empty.
    pub(crate) fn pop(&mut self, first: impl Fn(&T, &T) -> bool) -> Option<T> {
        let n = self.v.len();
        if n == 0 {
            return None;
        }
        self.v.swap(0, n - 1);
        let top = self.v.pop();
        let len = n - 1;
        let mut i = 0;
        loop {
            let l = 2 * i + 1;
            if l >= len {
                break;
            }
            let r = l + 1;
            let b = if r < len && first(&self.v[r], &self.v[l]) { r } else { l };
            if first(&self.v[b], &self.v[i]) {
                self.v.swap(b, i);
                i = b;
            } else {
                break;
            }
        }
        top
    }
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
pub(crate) mod testutil {
    //! Deterministic helpers shared by the builder tests.
    use super::*;

    /// splitmix64 PRNG.
    pub struct Rng(pub u64);

    impl Rng {
        pub fn next_u64(&mut self) -> u64 {
            crate::decode::rng::splitmix64_next(&mut self.0)
        }
        /// Uniform in [0, 1) with 24 random bits.
        pub fn unit(&mut self) -> f32 {
            (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
        }
        /// Uniform in [lo, hi).
        pub fn range(&mut self, lo: f32, hi: f32) -> f32 {
            lo + (hi - lo) * self.unit()
        }
        pub fn below(&mut self, n: usize) -> usize {
            (self.next_u64() % n as u64) as usize
        }
    }

    pub fn random_logits(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| rng.range(-scale, scale)).collect()
    }

    pub fn random_head(rng: &mut Rng, vocab: usize, rank: usize, scale: f32) -> MarkovHead {
        MarkovHead { vocab, rank, w1: random_logits(rng, vocab * rank, scale), w2: random_logits(rng, vocab * rank, scale) }
    }

    /// Token path (root excluded) of every non-root node, sorted.
    pub fn path_set(t: &DraftTree) -> Vec<Vec<u32>> {
        let mut out: Vec<Vec<u32>> = (1..t.len()).map(|i| path_of(t, i)).collect();
        out.sort();
        out
    }

    pub fn path_of(t: &DraftTree, mut i: usize) -> Vec<u32> {
        let mut p = Vec::new();
        while i != 0 {
            p.push(t.tokens[i]);
            i = t.parents[i] as usize;
        }
        p.reverse();
        p
    }

    /// f64 log-softmax of a row (independent naive implementation).
    pub fn naive_log_softmax(z: &[f64]) -> Vec<f64> {
        let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = z.iter().map(|&v| (v - m).exp()).sum();
        z.iter().map(|&v| v - m - s.ln()).collect()
    }

    /// Enumerate all token prefixes of length 1..=ld over `vocab` with their scores
    /// (`score(prefix, path)` is given the parent path and returns per-token log-probs for
    /// the next depth), sorted by score descending.
    pub fn enumerate_prefixes(ld: usize, vocab: usize, cond: &dyn Fn(&[u32]) -> Vec<f64>) -> Vec<(f64, Vec<u32>)> {
        let mut out = Vec::new();
        let mut stack: Vec<(Vec<u32>, f64)> = vec![(Vec::new(), 0.0)];
        while let Some((path, s)) = stack.pop() {
            if path.len() == ld {
                continue;
            }
            let lp = cond(&path);
            for v in 0..vocab {
                let mut p = path.clone();
                p.push(v as u32);
                out.push((s + lp[v], p.clone()));
                stack.push((p, s + lp[v]));
            }
        }
        out.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap());
        out
    }

    /// Compare a builder's tree against the brute-force top-B prefix set for every B where the
    /// B-th and (B+1)-th scores are separated by more than `gap`; returns the number checked.
    pub fn check_topb(all: &[(f64, Vec<u32>)], gap: f64, build: &dyn Fn(usize) -> DraftTree) -> usize {
        let mut checked = 0;
        for b in 0..=all.len() {
            if b > 0 && b < all.len() && all[b - 1].0 - all[b].0 <= gap {
                continue;
            }
            let t = build(b);
            assert!(t.is_well_formed(), "B={b}: malformed tree");
            assert_eq!(t.num_nodes(), b, "B={b}: node count");
            let mut want: Vec<Vec<u32>> = all[..b].iter().map(|x| x.1.clone()).collect();
            want.sort();
            assert_eq!(path_set(&t), want, "B={b}: prefix set differs from brute force");
            checked += 1;
        }
        checked
    }
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;

    #[test]
    fn depth_topk_values() {
        // 2 depths, vocab 4.
        let logits = [1.0f32, 3.0, 2.0, 3.0, /* */ 0.0, -1.0, 5.0, 0.5];
        let t = depth_topk(&logits, 2, 4, 3);
        assert_eq!(t.k, 3);
        assert_eq!(t.rows(), 2);
        assert_eq!(t.ids, vec![1, 3, 2, 2, 3, 0]); // tie 3.0 at ids 1 and 3: lower id first
        let lz0 = (1f64.exp() + 2.0 * 3f64.exp() + 2f64.exp()).ln();
        let lz1 = (1.0 + (-1f64).exp() + 5f64.exp() + 0.5f64.exp()).ln();
        let want = [3.0 - lz0, 3.0 - lz0, 2.0 - lz0, 5.0 - lz1, 0.5 - lz1, 0.0 - lz1];
        for (i, w) in want.into_iter().enumerate() {
            let g = t.logp(i);
            assert!((g as f64 - w).abs() < 1e-6, "{g} vs {w}");
        }
        // k > vocab clamps.
        let t = depth_topk(&logits, 2, 4, 10);
        assert_eq!(t.k, 4);
        assert_eq!(t.ids.len(), 8);
        assert_eq!(depth_topk(&logits, 2, 4, 0).rows(), 0);
    }

    #[test]
    fn chain_root_and_child_map() {
        let r = DraftTree::root(9);
        assert_eq!((r.len(), r.num_nodes()), (1, 0));
        assert!(r.is_well_formed());
        let c = DraftTree::chain(5, &[7, 8, 9]);
        assert_eq!(c.tokens, vec![5, 7, 8, 9]);
        assert_eq!(c.parents, vec![NO_PARENT, 0, 1, 2]);
        assert_eq!(c.depths, vec![0, 1, 2, 3]);
        assert_eq!(c.scores, vec![0.0; 4]);
        assert!(c.is_well_formed());
        assert_eq!(c.child_with_token(0, 7), Some(1));
        assert_eq!(c.child_with_token(1, 8), Some(2));
        assert_eq!(c.child_with_token(1, 7), None);
        assert_eq!(c.child_with_token(3, 7), None);
        assert_eq!(c.child_with_token(99, 7), None);

        // §4.8 worked example: node1 (d1,p0), node2 (d1,p0), node3 (d2,p1).
        let t = DraftTree { tokens: vec![1, 10, 11, 12], parents: vec![NO_PARENT, 0, 0, 1], depths: vec![0, 1, 1, 2], scores: vec![0.0; 4] };
        assert!(t.is_well_formed());
        let cm = t.child_map();
        assert_eq!(cm.children(0), &[1, 2]);
        assert_eq!(cm.children(1), &[3]);
        assert_eq!(cm.children(3), &[] as &[u32]);
        for (node, tok) in [(0, 10), (0, 11), (1, 12), (0, 12), (2, 12), (3, 1)] {
            assert_eq!(cm.child_with_token(node, tok), t.child_with_token(node, tok));
        }
        assert_eq!(cm.child_with_token(0, 11), Some(2));

        // Malformed trees.
        let mut bad = t.clone();
        bad.depths[3] = 1;
        assert!(!bad.is_well_formed());
        let mut bad = t.clone();
        bad.parents[1] = 2;
        assert!(!bad.is_well_formed());
        let mut bad = t.clone();
        bad.tokens[2] = 10; // duplicate sibling token
        assert!(!bad.is_well_formed());
        let mut bad = t.clone();
        bad.scores.pop();
        assert!(!bad.is_well_formed());
        assert!(!DraftTree::default().is_well_formed());
    }
}
