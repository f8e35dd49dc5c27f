//! SparklingTree: Markov-conditioned best-first draft trees (reference spec §5.2 (a) and (c)),
//! plus the DSpark greedy chain (§3.7 at T = 0).
//!
//! A node's children distribution is `log_softmax(U[depth(node)] + B(token(node)))`, where
//! `U` are the drafter's base logits `[Ld, V]` (row `d` feeds depth `d + 1`), the root has
//! depth 0 and token = anchor, and `B(t)[v] = <W2[v], W1[t]>` is the first-order Markov bias
//! (§3.6). Path scores are sums of these conditional log-probabilities; since every term is
//! `<= 0`, scores only decrease along a path and a best-first heap returns exactly the
//! `budget` highest-scoring prefixes.

#[cfg(test)]
use super::sparkling_table::{build_sparkling_precompute, candidate_table, key_parts, rank_key};
use super::{log_prob, log_sum_exp, topk_desc, DraftTree, Heap};

/// First-order Markov head `B(prev)[v] = <W2[v], W1[prev]>` (DSpark §3.6), rank `r`.
///
/// Shapes: `w1` and `w2` are `[vocab, rank]` row-major `f32` (`markov_w1.weight`,
/// `markov_w2.weight`). Precondition for every method: `w1.len() == w2.len() == vocab * rank`.
/// Dot products accumulate sequentially over `j = 0..rank` in `f32` (one fixed order), so
/// [`MarkovHead::bias`], [`MarkovHead::bias_at`] and the bias inside [`candidate_table`] agree
/// bit-for-bit.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MarkovHead {
    /// Vocabulary size `V`.
    pub vocab: usize,
    /// Low rank `r` (256 for the released DSpark checkpoints).
    pub rank: usize,
    /// `W1` (token embedding of the previous token), `[V, r]` row-major.
    pub w1: Vec<f32>,
    /// `W2` (output projection), `[V, r]` row-major.
    pub w2: Vec<f32>,
}

impl MarkovHead {
    /// Full bias row for previous token `prev`: `out[v] = dot(w2[v], w1[prev])` for
    /// `v in 0..vocab`.
    ///
    /// # Panics
    /// If `prev >= vocab` or `out.len() != vocab` (preconditions).
    pub fn bias(&self, prev: u32, out: &mut [f32]) {
        let r = self.rank;
        let v = self.vocab;
        assert!((prev as usize) < v, "MarkovHead::bias: prev out of range");
        assert_eq!(out.len(), v, "MarkovHead::bias: out must have length vocab");
        let e = &self.w1[prev as usize * r..][..r];
        let w2 = &self.w2[..v * r];
        // 8 independent sequential accumulators (same per-element order as `bias_at`).
        let mut blocks = out.chunks_exact_mut(8);
        let mut v0 = 0;
        for ob in &mut blocks {
            let mut acc = [0.0f32; 8];
            let rows: [&[f32]; 8] = std::array::from_fn(|l| &w2[(v0 + l) * r..][..r]);
            for (j, &a) in e.iter().enumerate() {
                for l in 0..8 {
                    acc[l] += a * rows[l][j];
                }
            }
            ob.copy_from_slice(&acc);
            v0 += 8;
        }
        for (l, o) in blocks.into_remainder().iter_mut().enumerate() {
            *o = dot_seq(e, &w2[(v0 + l) * r..][..r]);
        }
    }

    /// Single bias entry `dot(w2[cand], w1[prev])`.
    ///
    /// # Panics
    /// If `prev >= vocab` or `cand >= vocab` (preconditions).
    pub fn bias_at(&self, prev: u32, cand: u32) -> f32 {
        let r = self.rank;
        assert!((prev as usize) < self.vocab && (cand as usize) < self.vocab, "MarkovHead::bias_at: id out of range");
        dot_seq(&self.w1[prev as usize * r..][..r], &self.w2[cand as usize * r..][..r])
    }
}

/// Sequential f32 dot product (the canonical Markov-bias evaluation order).
#[inline]
fn dot_seq(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in a.iter().zip(b) {
        acc += x * y;
    }
    acc
}

/// `z = U[d] + B(prev)` (or `U[d]` without a head) over the full vocabulary.
pub(super) fn conditional_logits(base: &[f32], d: usize, vocab: usize, markov: Option<&MarkovHead>, prev: u32, z: &mut [f32]) {
    let row = &base[d * vocab..(d + 1) * vocab];
    match markov {
        Some(m) => {
            m.bias(prev, z);
            for (zi, &u) in z.iter_mut().zip(row) {
                *zi += u;
            }
        }
        None => z.copy_from_slice(row),
    }
}

/// Precondition checks shared by the builders (panics with a message on violation).
pub(super) fn check_inputs(base: &[f32], ld: usize, vocab: usize, markov: Option<&MarkovHead>, anchor: u32) {
    assert!(base.len() >= ld * vocab, "base logits shorter than ld*vocab");
    if let Some(m) = markov {
        assert_eq!(m.vocab, vocab, "Markov head vocab differs from the logits' vocab");
        assert!(m.w1.len() >= vocab * m.rank && m.w2.len() >= vocab * m.rank, "Markov head weights too short");
    }
    assert!(vocab == 0 || (anchor as usize) < vocab, "anchor out of vocabulary range");
}

#[derive(Clone, Copy)]
struct RefEntry {
    logw: f64,
    parent: u32,
    depth: u32,
    rank: u32,
}

/// SparklingTree naive best-first builder (§5.2 (a), `build_sparked_tree`).
///
/// - `base`: drafter logits `U`, `[ld, vocab]` row-major f32 (finite).
/// - `markov`: the Markov head; `None` means zero bias, i.e. a per-depth-independent tree
///   (identical to [`super::build_ddtree`] on the same logits, §9.4).
/// - `anchor`: root token (`< vocab`); `budget`: number of **non-root** nodes.
///
/// Every created node with depth `< ld` gets its own full-vocabulary conditional
/// `log_softmax(U[depth] + B(token))`, top-`K` with `K = min(budget, vocab)` (ties: lower id).
/// Heap entries pop by largest path log-weight (f64, incremental sibling/child arithmetic as
/// §5.1), ties by smaller parent index, then depth, then rank. Returns the `budget`
/// highest-scoring prefixes in pop order (fewer if the tree is exhausted);
/// `budget == 0`, `ld == 0` or `vocab == 0` → root only. Cost: one O(V·r) conditional per
/// created node — a reference, not the fast path (see [`build_sparkling_precompute`]).
///
///
/// # Panics
/// Only on precondition violations: `base.len() < ld*vocab`, `anchor >= vocab`, or a
/// head whose `vocab`/weights do not match.
pub fn build_sparkling_reference(base: &[f32], ld: usize, vocab: usize, markov: Option<&MarkovHead>, anchor: u32, budget: usize) -> DraftTree {
    let mut tree = DraftTree::root(anchor);
    if budget == 0 || ld == 0 || vocab == 0 {
        return tree;
    }
    check_inputs(base, ld, vocab, markov, anchor);
    let kk = budget.min(vocab);
    let mut z = vec![0.0f32; vocab];
    let mut sel = Vec::with_capacity(kk);
    // Cached conditionals: node i's list lives at dist[i*kk ..] (only nodes with depth < ld).
    let mut dist_ids: Vec<u32> = Vec::new();
    let mut dist_lp: Vec<f32> = Vec::new();
    let mut dist_off: Vec<u32> = Vec::with_capacity(budget + 1);
    let mut conditional = |d: usize, prev: u32, ids: &mut Vec<u32>, lps: &mut Vec<f32>| {
        conditional_logits(base, d, vocab, markov, prev, &mut z);
        let lse = log_sum_exp(&z);
        topk_desc(&z, kk, &mut sel);
        for &(v, id) in &sel {
            ids.push(id);
            lps.push(log_prob(v, lse));
        }
    };
    dist_off.push(0);
    conditional(0, anchor, &mut dist_ids, &mut dist_lp);

    let first = |a: &RefEntry, b: &RefEntry| {
        if a.logw != b.logw {
            return a.logw > b.logw;
        }
        (a.parent, a.depth, a.rank) < (b.parent, b.depth, b.rank)
    };
    let mut heap: Heap<RefEntry> = Heap::with_capacity(2 * budget + 1);
    heap.push(RefEntry { logw: dist_lp[0] as f64, parent: 0, depth: 1, rank: 0 }, first);
    while tree.num_nodes() < budget {
        let Some(e) = heap.pop(first) else { break };
        let po = dist_off[e.parent as usize] as usize;
        let idx = tree.len() as u32;
        let tok = dist_ids[po + e.rank as usize];
        tree.tokens.push(tok);
        tree.parents.push(e.parent);
        tree.depths.push(e.depth);
        tree.scores.push(e.logw as f32);
        dist_off.push(dist_ids.len() as u32);
        if (e.rank as usize) + 1 < kk {
            let r = po + e.rank as usize;
            let logw = e.logw - dist_lp[r] as f64 + dist_lp[r + 1] as f64;
            heap.push(RefEntry { logw, rank: e.rank + 1, ..e }, first);
        }
        if (e.depth as usize) < ld {
            let co = dist_ids.len();
            conditional(e.depth as usize, tok, &mut dist_ids, &mut dist_lp);
            let logw = e.logw + dist_lp[co] as f64;
            heap.push(RefEntry { logw, parent: idx, depth: e.depth + 1, rank: 0 }, first);
        }
    }
    tree
}

/// DSpark greedy draft chain (§3.7 at T = 0): `prev = anchor`; for `d in 0..min(ld, max_len)`:
/// `tok_d = argmax_v (U[d][v] + B(prev)[v])` (ties: lowest id), `prev = tok_d`.
///
/// Returns the drafts (anchor excluded), length `min(ld, max_len)` (0 if `vocab == 0`).
/// `markov == None` → per-row argmax of `U`. Wrap with [`DraftTree::chain`] for a verify tree.
///
/// # Panics
/// Only on precondition violations: `base.len() < ld*vocab`, `anchor >= vocab`, or a
/// head whose `vocab`/weights do not match.
pub fn markov_greedy_chain(base: &[f32], ld: usize, vocab: usize, markov: Option<&MarkovHead>, anchor: u32, max_len: usize) -> Vec<u32> {
    greedy_chain(base, ld, vocab, markov, anchor, max_len, None)
}

/// [`markov_greedy_chain`] plus each draft's conditional log-probability
/// `log_softmax(U[d] + B(prev))[tok_d]` over the full vocabulary (same tokens).
pub fn markov_greedy_chain_scored(base: &[f32], ld: usize, vocab: usize, markov: Option<&MarkovHead>, anchor: u32, max_len: usize) -> (Vec<u32>, Vec<f32>) {
    let mut lp = Vec::new();
    let toks = greedy_chain(base, ld, vocab, markov, anchor, max_len, Some(&mut lp));
    (toks, lp)
}

fn greedy_chain(base: &[f32], ld: usize, vocab: usize, markov: Option<&MarkovHead>, anchor: u32, max_len: usize, mut lp: Option<&mut Vec<f32>>) -> Vec<u32> {
    let len = ld.min(max_len);
    if vocab == 0 || len == 0 {
        return Vec::new();
    }
    check_inputs(base, ld, vocab, markov, anchor);
    let mut z = vec![0.0f32; vocab];
    let mut out = Vec::with_capacity(len);
    let mut prev = anchor;
    for d in 0..len {
        conditional_logits(base, d, vocab, markov, prev, &mut z);
        let mut best = 0usize;
        for (i, &v) in z.iter().enumerate() {
            if v > z[best] {
                best = i;
            }
        }
        prev = best as u32;
        out.push(prev);
        if let Some(lp) = lp.as_deref_mut() {
            lp.push(super::log_prob(z[best], super::log_sum_exp(&z)));
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::super::testutil::*;
    use super::super::*;
    use super::*;

    /// Naive f64 conditional log-softmax (independent of the builder numerics).
    fn naive_cond(base: &[f32], d: usize, vocab: usize, m: Option<&MarkovHead>, prev: u32) -> Vec<f64> {
        let z: Vec<f64> = (0..vocab)
            .map(|v| {
                let b = m.map_or(0.0, |m| (0..m.rank).map(|j| m.w1[prev as usize * m.rank + j] as f64 * m.w2[v * m.rank + j] as f64).sum());
                base[d * vocab + v] as f64 + b
            })
            .collect();
        naive_log_softmax(&z)
    }

    #[test]
    fn bias_matches_bias_at_and_f64() {
        let mut rng = Rng(3);
        for &(v, r) in &[(1usize, 1usize), (7, 3), (19, 16), (64, 5), (33, 0)] {
            let m = random_head(&mut rng, v, r, 1.0);
            let mut out = vec![0.0f32; v];
            for prev in 0..v as u32 {
                m.bias(prev, &mut out);
                for c in 0..v {
                    assert_eq!(out[c].to_bits(), m.bias_at(prev, c as u32).to_bits());
                    let want: f64 = (0..r).map(|j| m.w1[prev as usize * r + j] as f64 * m.w2[c * r + j] as f64).sum();
                    assert!((out[c] as f64 - want).abs() < 1e-5, "{} vs {want}", out[c]);
                }
            }
        }
        // Hand-computed: W1[1] = [1, 2], W2[0] = [3, 4] → 11.
        let m = MarkovHead { vocab: 2, rank: 2, w1: vec![0.0, 0.0, 1.0, 2.0], w2: vec![3.0, 4.0, -1.0, 0.5] };
        assert_eq!(m.bias_at(1, 0), 11.0);
        assert_eq!(m.bias_at(1, 1), 0.0);
        assert_eq!(m.bias_at(0, 1), 0.0);
    }

    #[test]
    fn reference_matches_brute_force() {
        let mut rng = Rng(0x5EED);
        let mut total = 0;
        for &(vocab, ld) in &[(3usize, 2usize), (3, 3), (4, 2), (4, 3)] {
            for _ in 0..4 {
                let base = random_logits(&mut rng, ld * vocab, 2.0);
                let m = random_head(&mut rng, vocab, 3, 1.0);
                let all = enumerate_prefixes(ld, vocab, &|path: &[u32]| {
                    let prev = path.last().copied().unwrap_or(1);
                    naive_cond(&base, path.len(), vocab, Some(&m), prev)
                });
                total += check_topb(&all, 1e-5, &|b| build_sparkling_reference(&base, ld, vocab, Some(&m), 1, b));
                // Scores equal the brute-force path scores.
                let t = build_sparkling_reference(&base, ld, vocab, Some(&m), 1, all.len());
                for i in 1..t.len() {
                    let p = path_of(&t, i);
                    let s = all.iter().find(|x| x.1 == p).unwrap().0;
                    assert!((t.scores[i] as f64 - s).abs() < 1e-5, "{} vs {s}", t.scores[i]);
                }
            }
        }
        assert!(total > 200, "too few budgets checked: {total}");
    }

    #[test]
    fn precompute_equals_reference_full_union() {
        let mut rng = Rng(0xC0FFEE);
        for &(vocab, ld, rank) in &[(30usize, 4usize, 5usize), (50, 3, 8), (17, 6, 2), (8, 5, 3)] {
            for trial in 0..3 {
                let base = random_logits(&mut rng, ld * vocab, 3.0);
                let m = random_head(&mut rng, vocab, rank, 0.8);
                let anchor = rng.below(vocab) as u32;
                for &budget in &[1usize, 2, 5, 17, 40, 64, 100] {
                    let want = build_sparkling_reference(&base, ld, vocab, Some(&m), anchor, budget);
                    for (c, fan) in [(vocab, budget), (vocab + 7, budget + 3), (usize::MAX, usize::MAX)] {
                        let t = candidate_table(&base, ld, vocab, Some(&m), anchor, c, fan.min(budget));
                        assert_eq!(t.cand, (0..vocab as u32).collect::<Vec<_>>());
                        assert_eq!(t.k, budget.min(vocab));
                        let got = build_sparkling_precompute(&t, anchor, budget);
                        assert!(got.is_well_formed());
                        assert_eq!(got.tokens, want.tokens, "V={vocab} ld={ld} trial={trial} B={budget}");
                        assert_eq!(got.parents, want.parents);
                        assert_eq!(got.depths, want.depths);
                        // Scores agree to f32 rounding (the table's normaliser is factorised).
                        for (g, w) in got.scores.iter().zip(&want.scores) {
                            assert!((g - w).abs() <= 2e-6 * w.abs().max(1.0), "{g} vs {w}");
                        }
                    }
                    let expect_nodes: usize = (1..=ld).map(|d| vocab.pow(d as u32)).sum::<usize>().min(budget);
                    assert_eq!(want.num_nodes(), expect_nodes);
                }
            }
        }
    }

    #[test]
    fn no_markov_equals_ddtree() {
        let mut rng = Rng(42);
        for &(vocab, ld) in &[(20usize, 4usize), (5, 3), (100, 6), (2, 7)] {
            let base = random_logits(&mut rng, ld * vocab, 4.0);
            for &budget in &[1usize, 3, 10, 33, 64] {
                let dd = build_ddtree(&depth_topk(&base, ld, vocab, budget), 0, budget);
                let sp = build_sparkling_reference(&base, ld, vocab, None, 0, budget);
                assert_eq!(sp, dd, "V={vocab} ld={ld} B={budget}");
                let t = candidate_table(&base, ld, vocab, None, 0, vocab, budget);
                let pc = build_sparkling_precompute(&t, 0, budget);
                assert_eq!(pc, dd, "precompute V={vocab} ld={ld} B={budget}");
            }
        }
    }

    #[test]
    fn no_markov_tree_is_per_depth_independent() {
        // Every node at depth d has children drawn from the same per-depth ranking.
        let mut rng = Rng(77);
        let (vocab, ld) = (6, 3);
        let base = random_logits(&mut rng, ld * vocab, 2.0);
        let t = build_sparkling_reference(&base, ld, vocab, None, 2, 60);
        let top = depth_topk(&base, ld, vocab, vocab);
        let cm = t.child_map();
        for p in 0..t.len() {
            let d = t.depths[p] as usize;
            let toks = cm.child_tokens(p);
            if d < ld {
                assert_eq!(toks, &top.ids[d * vocab..d * vocab + toks.len()], "children of {p} are a per-depth prefix");
            }
        }
    }

    #[test]
    fn empty_inputs_give_root_only() {
        let mut rng = Rng(1);
        let (vocab, ld) = (10, 3);
        let base = random_logits(&mut rng, ld * vocab, 2.0);
        let m = random_head(&mut rng, vocab, 4, 1.0);
        assert_eq!(build_sparkling_reference(&base, ld, vocab, Some(&m), 3, 0), DraftTree::root(3));
        assert_eq!(build_sparkling_reference(&base, 0, vocab, Some(&m), 3, 5), DraftTree::root(3));
        let t = candidate_table(&base, ld, vocab, Some(&m), 3, 4, 0);
        assert_eq!(t.k, 0);
        assert!(t.vals.is_empty() && t.slots.is_empty());
        assert_eq!(build_sparkling_precompute(&t, 3, 0), DraftTree::root(3));
        assert_eq!(build_sparkling_precompute(&t, 3, 5), DraftTree::root(3));
        let t = candidate_table(&base, 0, vocab, Some(&m), 3, 4, 8);
        assert_eq!(build_sparkling_precompute(&t, 3, 8), DraftTree::root(3));
        assert!(markov_greedy_chain(&base, ld, vocab, Some(&m), 3, 0).is_empty());
    }

    #[test]
    fn candidate_table_values() {
        let mut rng = Rng(0x7AB1E);
        let (vocab, ld, rank, c) = (40usize, 3usize, 6usize, 5usize);
        let base = random_logits(&mut rng, ld * vocab, 3.0);
        let m = random_head(&mut rng, vocab, rank, 0.7);
        let anchor = 39u32;
        let t = candidate_table(&base, ld, vocab, Some(&m), anchor, c, 4);
        // Union of per-depth top-5 plus the anchor, sorted.
        let mut want: Vec<u32> = Vec::new();
        for d in 0..ld {
            let mut ids: Vec<u32> = (0..vocab as u32).collect();
            ids.sort_by(|&a, &b| base[d * vocab + b as usize].partial_cmp(&base[d * vocab + a as usize]).unwrap());
            want.extend(&ids[..c]);
        }
        want.push(anchor);
        want.sort();
        want.dedup();
        assert_eq!(t.cand, want);
        let n = t.n();
        assert_eq!(t.k, 4);
        assert_eq!(t.vals.len(), ld * n * 4);
        for d in 0..ld {
            for p in 0..n {
                // Naive union-normalised row.
                let z: Vec<f64> = (0..n)
                    .map(|ci| {
                        let b: f64 = (0..rank).map(|j| m.w1[t.cand[p] as usize * rank + j] as f64 * m.w2[t.cand[ci] as usize * rank + j] as f64).sum();
                        base[d * vocab + t.cand[ci] as usize] as f64 + b
                    })
                    .collect();
                let lp = naive_log_softmax(&z);
                let mut order: Vec<usize> = (0..n).collect();
                order.sort_by(|&a, &b| lp[b].partial_cmp(&lp[a]).unwrap());
                let o = (d * n + p) * t.k;
                for j in 0..t.k {
                    assert_eq!(t.slots[o + j] as usize, order[j]);
                    assert!((t.vals[o + j] as f64 - lp[order[j]]).abs() < 1e-5);
                }
            }
        }
        // max_fanout = 2 limits every node's children.
        let t2 = candidate_table(&base, ld, vocab, Some(&m), anchor, c, 2);
        let tree = build_sparkling_precompute(&t2, anchor, 30);
        assert_eq!(tree.num_nodes(), 2 + 4 + 8);
        let cm = tree.child_map();
        assert!((0..tree.len()).all(|p| cm.children(p).len() <= 2));
        assert!(tree.is_well_formed());
        assert!(tree.tokens[1..].iter().all(|tok| t2.cand.binary_search(tok).is_ok()));
    }

    /// Naive table row: (slot, logp) sorted by (value desc, slot asc).
    fn naive_row(base: &[f32], vocab: usize, m: &MarkovHead, cand: &[u32], d: usize, p: usize) -> Vec<(usize, f64)> {
        let z: Vec<f32> = cand.iter().map(|&c| base[d * vocab + c as usize] + m.bias_at(cand[p], c)).collect();
        let lp = naive_log_softmax(&z.iter().map(|&x| x as f64).collect::<Vec<_>>());
        let mut order: Vec<usize> = (0..cand.len()).collect();
        order.sort_by(|&a, &b| z[b].partial_cmp(&z[a]).unwrap().then(a.cmp(&b)));
        order.into_iter().map(|i| (i, lp[i])).collect()
    }

    #[test]
    fn rank_key_order_and_roundtrip() {
        let vals = [-1e30f32, -3.5, -1.0, -1e-40, 0.0, 1e-40, 0.25, 1.0, 7.0, 3e38];
        let mut keys: Vec<(u64, f32, u32)> = Vec::new();
        for &v in &vals {
            for slot in [0u32, 5, u32::MAX - 1] {
                let key = rank_key(v, slot);
                assert_eq!(key_parts(key), (v, slot));
                keys.push((key, v, slot));
            }
        }
        keys.sort_by_key(|x| x.0);
        for w in keys.windows(2) {
            // Ascending key = descending value, then ascending slot.
            assert!(w[0].1 > w[1].1 || (w[0].1 == w[1].1 && w[0].2 < w[1].2));
        }
    }

    #[test]
    fn candidate_table_ties_and_extremes() {
        // Integer-valued logits and bias: many exact ties (lower slot must win).
        let mut rng = Rng(0x7135);
        let (vocab, ld, rank) = (23usize, 3usize, 2usize);
        let base: Vec<f32> = (0..ld * vocab).map(|_| rng.below(4) as f32).collect();
        let w = |rng: &mut Rng| (0..vocab * rank).map(|_| rng.below(3) as f32 - 1.0).collect::<Vec<f32>>();
        let m = MarkovHead { vocab, rank, w1: w(&mut rng), w2: w(&mut rng) };
        for (c, fan) in [(vocab, 9usize), (4, 5), (2, 64)] {
            let t = candidate_table(&base, ld, vocab, Some(&m), 0, c, fan.min(64));
            let n = t.n();
            for d in 0..ld {
                for p in 0..n {
                    let want = naive_row(&base, vocab, &m, &t.cand, d, p);
                    let o = (d * n + p) * t.k;
                    for j in 0..t.k {
                        assert_eq!(t.slots[o + j] as usize, want[j].0, "c={c} d={d} p={p} j={j}");
                        assert!((t.vals[o + j] as f64 - want[j].1).abs() < 1e-5);
                    }
                }
            }
        }
        // Joint maximum far from both separate maxima: the factorised normaliser underflows and
        // the exact per-row fallback must kick in.
        let base = vec![0.0f32, -90.0, -90.0, -90.0];
        let m = MarkovHead { vocab: 4, rank: 1, w1: vec![1.0; 4], w2: vec![-90.0, 0.0, -5.0, -5.0] };
        let t = candidate_table(&base, 1, 4, Some(&m), 0, 4, 4);
        for p in 0..4 {
            let want = naive_row(&base, 4, &m, &t.cand, 0, p);
            for j in 0..4 {
                assert_eq!(t.slots[p * 4 + j] as usize, want[j].0);
                assert!((t.vals[p * 4 + j] as f64 - want[j].1).abs() < 1e-5, "{} vs {}", t.vals[p * 4 + j], want[j].1);
            }
        }
        // Large but representable spread: factorised path, still accurate.
        let base = vec![0.0f32, -30.0, -31.0, -60.0];
        let m = MarkovHead { vocab: 4, rank: 1, w1: vec![1.0, 0.5, -1.0, 2.0], w2: vec![-25.0, 0.0, 3.0, 20.0] };
        let t = candidate_table(&base, 1, 4, Some(&m), 2, 4, 4);
        for p in 0..4 {
            let want = naive_row(&base, 4, &m, &t.cand, 0, p);
            for j in 0..4 {
                assert_eq!(t.slots[p * 4 + j] as usize, want[j].0);
                assert!((t.vals[p * 4 + j] as f64 - want[j].1).abs() < 1e-5 * want[j].1.abs().max(1.0));
            }
        }
    }

    #[test]
    fn precompute_matches_brute_force_over_union() {
        let mut rng = Rng(0xB00);
        let mut total = 0;
        for _ in 0..6 {
            let (vocab, ld, c) = (12usize, 2usize, 2usize);
            let base = random_logits(&mut rng, ld * vocab, 3.0);
            let m = random_head(&mut rng, vocab, 3, 1.0);
            let anchor = rng.below(vocab) as u32;
            let probe = candidate_table(&base, ld, vocab, Some(&m), anchor, c, 1);
            let cand = probe.cand.clone();
            let n = cand.len();
            let all: Vec<(f64, Vec<u32>)> = enumerate_prefixes(ld, n, &|path: &[u32]| {
                let prev = path.last().map_or(anchor, |&s| cand[s as usize]);
                let z: Vec<f64> = cand.iter().map(|&ct| base[path.len() * vocab + ct as usize] as f64 + m.bias_at(prev, ct) as f64).collect();
                naive_log_softmax(&z)
            })
            .into_iter()
            .map(|(s, p)| (s, p.iter().map(|&i| cand[i as usize]).collect()))
            .collect();
            total += check_topb(&all, 1e-5, &|b| {
                let t = candidate_table(&base, ld, vocab, Some(&m), anchor, c, b);
                build_sparkling_precompute(&t, anchor, b)
            });
        }
        assert!(total > 60, "too few budgets checked: {total}");
    }

    #[test]
    fn greedy_chain_matches_naive_argmax() {
        let mut rng = Rng(9);
        for &(vocab, ld) in &[(50usize, 7usize), (7, 16), (1000, 5)] {
            let base = random_logits(&mut rng, ld * vocab, 3.0);
            let m = random_head(&mut rng, vocab, 8, 0.6);
            let anchor = 3u32;
            let chain = markov_greedy_chain(&base, ld, vocab, Some(&m), anchor, usize::MAX);
            assert_eq!(chain.len(), ld);
            let mut prev = anchor;
            for d in 0..ld {
                let lp = naive_cond(&base, d, vocab, Some(&m), prev);
                let best = (0..vocab).max_by(|&a, &b| lp[a].partial_cmp(&lp[b]).unwrap()).unwrap() as u32;
                assert_eq!(chain[d], best);
                prev = best;
            }
            assert_eq!(markov_greedy_chain(&base, ld, vocab, Some(&m), anchor, 3), chain[..3.min(ld)].to_vec());
            // Chain == best-first tree with budget = 1 per level when K = 1? The tree with
            // budget 1 is the single best depth-1 child, which is the chain's first token.
            let t = build_sparkling_reference(&base, ld, vocab, Some(&m), anchor, 1);
            assert_eq!(t.tokens, vec![anchor, chain[0]]);
            // No head: per-row argmax.
            let plain = markov_greedy_chain(&base, ld, vocab, None, anchor, usize::MAX);
            for d in 0..ld {
                let row = &base[d * vocab..(d + 1) * vocab];
                let best = (0..vocab).fold(0, |b, i| if row[i] > row[b] { i } else { b }) as u32;
                assert_eq!(plain[d], best);
            }
        }
        // Ties: lowest id wins.
        let base = [1.0f32, 2.0, 2.0, 0.0];
        assert_eq!(markov_greedy_chain(&base, 1, 4, None, 0, 5), vec![1]);
    }
}
