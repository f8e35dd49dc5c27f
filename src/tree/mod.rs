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

/// `exp(x)` for `x <= 0`, vectorisable (Cody–Waite reduction + degree-6 polynomial, about
/// 1 ulp); returns exactly 1 for `x == 0` and 0 for `x < -80` (negligible next to the max term).
#[inline(always)]
pub(crate) fn exp_nonpos(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4; // 0.693359375, exact in f32
    const LN2_LO: f32 = -2.121_944_4e-4;
    const SHIFTER: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let under = x < -80.0;
    let xc = if under { -80.0 } else { x };
    let t = xc * LOG2E + SHIFTER;
    let n = t - SHIFTER;
    let ni = (t.to_bits() as i32).wrapping_sub(SHIFTER.to_bits() as i32);
    let r = xc - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    let scale = f32::from_bits((ni.wrapping_add(127) as u32) << 23);
    if under {
        0.0
    } else {
        e * scale
    }
}

/// Maximum of a non-empty row (order-independent; NaN-free input).
#[inline]
pub(crate) fn row_max(row: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            lanes[l] = if c[l] > lanes[l] { c[l] } else { lanes[l] };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &v in lanes.iter().chain(chunks.remainder()) {
        m = if v > m { v } else { m };
    }
    m
}

/// Natural log-sum-exp of a non-empty finite row, as f64: `max + ln(sum exp(x - max))` with
/// f32 exponentials accumulated in 8 f32 lanes per 256-element block and blocks summed in f64.
pub(crate) fn log_sum_exp(row: &[f32]) -> f64 {
    let m = row_max(row);
    let mut total = 0.0f64;
    let mut buf = [0.0f32; 256];
    for block in row.chunks(256) {
        let e = &mut buf[..block.len()];
        // Plain map loop: auto-vectorised.
        for (o, &x) in e.iter_mut().zip(block) {
            *o = exp_nonpos(x - m);
        }
        total += sum_block(e);
    }
    m as f64 + total.ln()
}

/// Sum of a block: 8 f32 lanes (fixed order), lanes combined in f64.
#[inline]
fn sum_block(e: &[f32]) -> f64 {
    let mut lanes = [0.0f32; 8];
    let mut chunks = e.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            lanes[l] += c[l];
        }
    }
    let mut bs = 0.0f64;
    for &v in chunks.remainder() {
        bs += v as f64;
    }
    for v in lanes {
        bs += v as f64;
    }
    bs
}

/// `a` ranks strictly before `b`: larger value, then lower id.
#[inline(always)]
fn ranks_before(a: (f32, u32), b: (f32, u32)) -> bool {
    a.0 > b.0 || (a.0 == b.0 && a.1 < b.1)
}

/// Top `min(k, vals.len())` of `vals` as `(value, index)` sorted best first (larger value,
/// ties: lower index first), written into `out` (cleared first). Partial selection: a
/// size-k heap plus a per-16-block max filter, O(n + k log k · log n) typical.
pub(crate) fn topk_desc(vals: &[f32], k: usize, out: &mut Vec<(f32, u32)>) {
    out.clear();
    let n = vals.len();
    let k = k.min(n);
    if k == 0 {
        return;
    }
    // Min-heap on rank order: out[0] is the worst kept element.
    let sift_down = |h: &mut [(f32, u32)], mut i: usize| {
        let len = h.len();
        loop {
            let l = 2 * i + 1;
            if l >= len {
                break;
            }
            let r = l + 1;
            let w = if r < len && ranks_before(h[l], h[r]) { r } else { l };
            if ranks_before(h[i], h[w]) {
                h.swap(i, w);
                i = w;
            } else {
                break;
            }
        }
    };
    for (i, &v) in vals[..k].iter().enumerate() {
        out.push((v, i as u32));
        let mut c = i;
        while c > 0 {
            let p = (c - 1) / 2;
            if ranks_before(out[p], out[c]) {
                out.swap(p, c);
                c = p;
            } else {
                break;
            }
        }
    }
    // Scanning ascending indices: an equal value never beats a kept one (it has a higher id).
    let mut thr = out[0].0;
    let mut i = k;
    while i < n {
        let end = (i + 16).min(n);
        let blk = &vals[i..end];
        let mut bm = f32::NEG_INFINITY;
        for &v in blk {
            bm = if v > bm { v } else { bm };
        }
        if bm > thr {
            for (j, &v) in blk.iter().enumerate() {
                if v > thr {
                    out[0] = (v, (i + j) as u32);
                    sift_down(out, 0);
                    thr = out[0].0;
                }
            }
        }
        i = end;
    }
    out.sort_unstable_by(|a, b| {
        if ranks_before(*a, *b) {
            std::cmp::Ordering::Less
        } else if ranks_before(*b, *a) {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        }
    });
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
    use super::testutil::*;
    use super::*;

    #[test]
    fn exp_nonpos_accuracy() {
        let mut worst = 0.0f64;
        let mut x = -80.0f32;
        while x <= 0.0 {
            let got = exp_nonpos(x) as f64;
            let want = (x as f64).exp();
            worst = worst.max(((got - want) / want).abs());
            x += 0.00731;
        }
        assert!(worst < 3e-7, "relative error {worst}");
        assert_eq!(exp_nonpos(0.0), 1.0);
        assert_eq!(exp_nonpos(-80.5), 0.0);
        assert_eq!(exp_nonpos(-1e30), 0.0);
    }

    #[test]
    fn log_sum_exp_matches_f64() {
        let mut rng = Rng(7);
        for &n in &[1usize, 5, 8, 255, 256, 257, 1000, 49152] {
            let row = random_logits(&mut rng, n, 12.0);
            let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
            let want = m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
            let got = log_sum_exp(&row);
            assert!((got - want).abs() < 1e-6 * want.abs().max(1.0), "n={n}: {got} vs {want}");
        }
        assert_eq!(log_sum_exp(&[3.0]), 3.0);
    }

    #[test]
    fn topk_matches_full_sort_with_ties() {
        let mut rng = Rng(11);
        let mut out = Vec::new();
        for &n in &[1usize, 3, 17, 100, 1000] {
            for &k in &[0usize, 1, 2, 5, 16, 64, 2000] {
                // coarse values => many ties
                let vals: Vec<f32> = (0..n).map(|_| (rng.below(7) as f32) - 3.0).collect();
                topk_desc(&vals, k, &mut out);
                let mut all: Vec<(f32, u32)> = vals.iter().enumerate().map(|(i, &v)| (v, i as u32)).collect();
                all.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1)));
                all.truncate(k.min(n));
                assert_eq!(out, all, "n={n} k={k}");
            }
        }
    }

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
