//! SparklingTree with lazily built rows: the precompute builder's tree (§5.2 c: children of a
//! node = top-k of `log_softmax_over_union(U[d, cand] + B(token)[cand])`) without the full
//! `[Ld, n, k]` table. A best-first heap of budget B expands at most B+1 nodes, so only those
//! rows are ever computed: O(B·n·r) instead of O(n²·r + Ld·n²) — the right trade on a CPU host,
//! where the whole table at C = 128 and V = 49152 costs far more per round than the rows a
//! heap of budget 64 expands.
//!
//! Row values use the direct per-row log-sum-exp (as [`super::build_sparkling_reference`]
//! does), so with `c >= vocab` and `max_fanout >= budget` this builder reproduces the reference
//! tree exactly, scores included (tie-break aside: FIFO here, as in the precompute heap).

use super::sparkling::MarkovHead;
use super::sparkling_table::candidate_union;
use super::{log_prob, log_sum_exp, topk_desc, DraftTree, Heap};

/// The candidate union and the gathered per-round inputs of [`build_sparkling_lazy`]: `U[:, cand]`
/// (`[ld, n]`) and `W2[cand]` (`[n, r]`), computed once per round (the "prep" stage).
#[derive(Clone, Debug, Default)]
pub struct LazyCandidates {
    /// Candidate ids, sorted ascending (union of per-depth top-C plus the anchor).
    pub cand: Vec<u32>,
    /// Depth rows.
    pub ld: usize,
    /// `U[d, cand[c]]`, `[ld, n]`.
    pub ub: Vec<f32>,
    /// `W2[cand[c]]`, `[n, r]` (empty without a head).
    pub w2c: Vec<f32>,
}

impl LazyCandidates {
    /// Gather the candidate union's inputs from base logits `[ld, vocab]` and the Markov head.
    /// Preconditions as [`super::candidate_table`].
    pub fn new(base: &[f32], ld: usize, vocab: usize, markov: Option<&MarkovHead>, anchor: u32, c: usize) -> Self {
        let cand = candidate_union(base, ld, vocab, anchor, c);
        let n = cand.len();
        let mut ub = vec![0.0f32; ld * n];
        for d in 0..ld {
            let row = &base[d * vocab..(d + 1) * vocab];
            for (o, &t) in ub[d * n..(d + 1) * n].iter_mut().zip(&cand) {
                *o = row[t as usize];
            }
        }
        let w2c = match markov {
            Some(m) => cand.iter().flat_map(|&t| m.w2[t as usize * m.rank..(t as usize + 1) * m.rank].iter().copied()).collect(),
            None => Vec::new(),
        };
        LazyCandidates { cand, ld, ub, w2c }
    }
}

/// `out[c] = Σ_j e[j]·w2c[c, j]`, sequential over `j` per element (the order of
/// `MarkovHead::bias_at`, so values are bit-identical), 8 rows at a time for vectorisation.
fn bias_over(e: &[f32], w2c: &[f32], out: &mut [f32]) {
    let r = e.len();
    let n = out.len();
    let blocks = n / 8;
    for bi in 0..blocks {
        let mut acc = [0.0f32; 8];
        let rows: [&[f32]; 8] = std::array::from_fn(|l| &w2c[(bi * 8 + l) * r..][..r]);
        for (j, &a) in e.iter().enumerate() {
            for l in 0..8 {
                acc[l] += a * rows[l][j];
            }
        }
        out[bi * 8..bi * 8 + 8].copy_from_slice(&acc);
    }
    for c in blocks * 8..n {
        let mut acc = 0.0f32;
        for (x, y) in e.iter().zip(&w2c[c * r..(c + 1) * r]) {
            acc += x * y;
        }
        out[c] = acc;
    }
}

#[derive(Clone, Copy)]
struct Entry {
    logw: f64,
    counter: u32,
    parent: u32,
    depth: u32,
    rank: u32,
}

/// Build the SparklingTree (§5.2 c semantics: union-normalised Markov-conditioned best-first,
/// `k = min(max_fanout, budget, n)` children per node, FIFO ties) computing each node's child
/// row only when the node is created. `budget` counts non-root nodes; returns the tree in pop
/// order. `budget == 0`, `ld == 0` or an empty union → root only.
///
/// # Panics
/// Only on precondition violations (`anchor` not in `lc.cand`; head/vocab mismatch).
pub fn build_sparkling_lazy(lc: &LazyCandidates, markov: Option<&MarkovHead>, anchor: u32, max_fanout: usize, budget: usize) -> DraftTree {
    let mut tree = DraftTree::root(anchor);
    let (n, ld) = (lc.cand.len(), lc.ld);
    let k = max_fanout.min(budget).min(n);
    if budget == 0 || ld == 0 || k == 0 {
        return tree;
    }
    let mut z = vec![0.0f32; n];
    let mut sel: Vec<(f32, u32)> = Vec::with_capacity(k);
    // Child rows of expanded nodes: node i's list at row_off[i] (k entries) when it was expanded.
    let mut row_slot: Vec<u32> = Vec::with_capacity((budget + 1) * k);
    let mut row_lp: Vec<f32> = Vec::with_capacity((budget + 1) * k);
    let mut row_off: Vec<u32> = vec![u32::MAX; budget + 1];
    let mut expand = |node: usize, d: usize, tok: u32, row_slot: &mut Vec<u32>, row_lp: &mut Vec<f32>, row_off: &mut Vec<u32>| {
        let u = &lc.ub[d * n..(d + 1) * n];
        match markov {
            Some(m) => {
                let e = &m.w1[tok as usize * m.rank..(tok as usize + 1) * m.rank];
                bias_over(e, &lc.w2c, &mut z);
                for (zi, &ui) in z.iter_mut().zip(u) {
                    *zi += ui;
                }
            }
            None => z.copy_from_slice(u),
        }
        let lse = log_sum_exp(&z);
        topk_desc(&z, k, &mut sel);
        row_off[node] = row_slot.len() as u32;
        for &(v, s) in &sel {
            row_slot.push(s);
            row_lp.push(log_prob(v, lse));
        }
    };
    if lc.cand.binary_search(&anchor).is_err() {
        panic!("build_sparkling_lazy: anchor {anchor} not in the candidate set");
    }
    expand(0, 0, anchor, &mut row_slot, &mut row_lp, &mut row_off);
    let first = |a: &Entry, b: &Entry| if a.logw != b.logw { a.logw > b.logw } else { a.counter < b.counter };
    let mut heap: Heap<Entry> = Heap::with_capacity(2 * budget + 1);
    let mut counter = 0u32;
    heap.push(Entry { logw: row_lp[0] as f64, counter, parent: 0, depth: 1, rank: 0 }, first);
    while tree.num_nodes() < budget {
        let Some(e) = heap.pop(first) else { break };
        let po = row_off[e.parent as usize] as usize;
        let r = po + e.rank as usize;
        let idx = tree.len();
        let tok = lc.cand[row_slot[r] as usize];
        tree.tokens.push(tok);
        tree.parents.push(e.parent);
        tree.depths.push(e.depth);
        tree.scores.push(e.logw as f32);
        if (e.rank as usize) + 1 < k {
            counter += 1;
            let logw = e.logw - row_lp[r] as f64 + row_lp[r + 1] as f64;
            heap.push(Entry { logw, counter, rank: e.rank + 1, ..e }, first);
        }
        if (e.depth as usize) < ld && tree.num_nodes() < budget {
            expand(idx, e.depth as usize, tok, &mut row_slot, &mut row_lp, &mut row_off);
            counter += 1;
            let logw = e.logw + row_lp[row_off[idx] as usize] as f64;
            heap.push(Entry { logw, counter, parent: idx as u32, depth: e.depth + 1, rank: 0 }, first);
        }
    }
    tree
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::*;
    use super::*;

    #[test]
    fn lazy_equals_reference_when_the_union_is_the_vocabulary() {
        let mut rng = Rng(41);
        for case in 0..60 {
            let vocab = 5 + rng.below(20);
            let ld = 1 + rng.below(5);
            let rank = 1 + rng.below(6);
            let base = random_logits(&mut rng, ld * vocab, 3.0);
            let head = random_head(&mut rng, vocab, rank, 1.0);
            let anchor = rng.below(vocab) as u32;
            for budget in [1usize, 3, 8, 20] {
                let want = build_sparkling_reference(&base, ld, vocab, Some(&head), anchor, budget);
                let lc = LazyCandidates::new(&base, ld, vocab, Some(&head), anchor, vocab);
                let got = build_sparkling_lazy(&lc, Some(&head), anchor, budget, budget);
                assert_eq!(got.tokens, want.tokens, "case {case} budget {budget}");
                assert_eq!(got.parents, want.parents, "case {case} budget {budget}");
                assert_eq!(got.depths, want.depths);
                assert_eq!(got.scores, want.scores);
            }
        }
    }

    #[test]
    fn lazy_equals_precompute_table_at_small_c() {
        let mut rng = Rng(7);
        let mut compared = 0;
        for _ in 0..40 {
            let vocab = 64;
            let ld = 4;
            let base = random_logits(&mut rng, ld * vocab, 4.0);
            let head = random_head(&mut rng, vocab, 4, 1.0);
            let anchor = rng.below(vocab) as u32;
            for (c, fan, budget) in [(4usize, 3usize, 12usize), (8, 64, 32), (2, 2, 6)] {
                let t = candidate_table(&base, ld, vocab, Some(&head), anchor, c, fan.min(budget));
                let want = build_sparkling_precompute(&t, anchor, budget);
                let lc = LazyCandidates::new(&base, ld, vocab, Some(&head), anchor, c);
                assert_eq!(lc.cand, t.cand);
                let got = build_sparkling_lazy(&lc, Some(&head), anchor, fan, budget);
                assert_eq!((got.tokens.clone(), got.parents.clone(), got.depths.clone()), (want.tokens, want.parents, want.depths));
                for (a, b) in got.scores.iter().zip(&want.scores) {
                    assert!((a - b).abs() < 1e-5, "{a} vs {b}");
                }
                compared += 1;
            }
        }
        assert_eq!(compared, 120);
    }

    #[test]
    fn no_head_and_empty_budget() {
        let mut rng = Rng(3);
        let (vocab, ld) = (30, 3);
        let base = random_logits(&mut rng, ld * vocab, 2.0);
        let lc = LazyCandidates::new(&base, ld, vocab, None, 2, vocab);
        let tree = build_sparkling_lazy(&lc, None, 2, 64, 10);
        let top = depth_topk(&base, ld, vocab, 10);
        let dd = build_ddtree(&top, 2, 10);
        assert_eq!(path_set(&tree), path_set(&dd));
        assert_eq!(build_sparkling_lazy(&lc, None, 2, 64, 0).len(), 1);
    }
}
