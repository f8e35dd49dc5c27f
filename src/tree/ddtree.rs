//! DDTree best-first heap (reference spec §5.1; verify layout §4.8; worked example §9.2).

use super::{DraftTree, Heap, TopK};
use std::cmp::Ordering;

#[derive(Clone, Copy)]
struct Entry {
    /// Path log-weight (f64, incremental arithmetic on f32 inputs as in §5.1 step 4).
    logw: f64,
    /// Parent node index in the tree being built.
    parent: u32,
    /// Depth of the node this entry would create (>= 1).
    depth: u32,
    /// Rank within the parent's depth row.
    rank: u32,
}

/// Build the DDTree draft tree (§5.1): the `budget` highest-scoring prefixes under the
/// factorised per-depth marginals `q(u) = prod_i q_i(u_i)`, admitted best-first.
///
/// - `top`: per-depth top-K log-probabilities ([`super::depth_topk`]); `Ld = top.rows()`.
///   Precondition for exactness: `top.k >= min(budget, V)` (the heap uses
///   `K = min(budget, top.k)` ranks per depth; restricting to top-`min(B, V)` is lossless,
///   §5.1 Lemma 1).
/// - `anchor`: root token (bonus token of the previous round).
/// - `budget`: number of **non-root** nodes `Bt`; the result has `min(budget, reachable)`
///   non-root nodes, where reachable = `sum_{d=1..Ld} K^d`.
///
/// Node order = heap pop order (so `parents[i] < i`); `scores[i]` = path log-weight (f64
/// incremental arithmetic rounded to f32). Ties in log-weight pop the smaller rank tuple
/// first (lexicographic, a proper prefix first), as Python tuple comparison does in the
/// reference; rank tuples are unique, so parent/depth/rank never need comparing.
/// `budget == 0`, `Ld == 0` or `top.k == 0` → root only.
///
/// # Panics
/// Never, for a `top` whose `ids`/`vals` have equal lengths that are a multiple of `k` and
/// with one `lse` per row (as produced by [`super::depth_topk`] and `Backend::topk_async`); shorter
/// ones are an out-of-bounds precondition violation.
pub fn build_ddtree(top: &TopK, anchor: u32, budget: usize) -> DraftTree {
    let ld = top.rows();
    let kk = budget.min(top.k);
    let mut tree = DraftTree::root(anchor);
    if budget == 0 || ld == 0 || kk == 0 {
        return tree;
    }
    let stride = top.k;
    // log-probability of rank r at depth d: TopK::logp without the division.
    let lp = |d: u32, r: u32| (top.vals[(d as usize - 1) * stride + r as usize] - top.lse[d as usize - 1]) as f64;

    tree.tokens.reserve(budget);
    tree.parents.reserve(budget);
    tree.depths.reserve(budget);
    tree.scores.reserve(budget);
    // Rank path of every node (root: empty) in one arena: node i owns arena[off[i]..off[i]+depth].
    let mut arena: Vec<u32> = Vec::with_capacity(budget * ld.min(budget));
    let mut off: Vec<u32> = Vec::with_capacity(budget + 1);
    off.push(0);

    let mut heap: Heap<Entry> = Heap::with_capacity(2 * budget + 1);
    // "a pops before b" under (-logw, rank_tuple) ordering.
    let first = |arena: &[u32], off: &[u32], a: &Entry, b: &Entry| -> bool {
        if a.logw > b.logw {
            return true;
        }
        if a.logw < b.logw {
            return false;
        }
        rank_tuple_cmp(arena, off, a, b) == Ordering::Less
    };

    heap.push(Entry { logw: lp(1, 0), parent: 0, depth: 1, rank: 0 }, |a, b| first(&arena, &off, a, b));
    let mut count = 0usize;
    while count < budget {
        let Some(e) = heap.pop(|a, b| first(&arena, &off, a, b)) else { break };
        let idx = tree.tokens.len() as u32;
        let d = e.depth as usize;
        tree.tokens.push(top.ids[(d - 1) * stride + e.rank as usize]);
        tree.parents.push(e.parent);
        tree.depths.push(e.depth);
        tree.scores.push(e.logw as f32);
        // Rank path of the new node = path(parent) ++ [rank].
        let ps = off[e.parent as usize] as usize;
        let start = arena.len();
        arena.extend_from_within(ps..ps + d - 1);
        arena.push(e.rank);
        off.push(start as u32);
        count += 1;

        if (e.rank as usize) + 1 < kk {
            let logw = e.logw - lp(e.depth, e.rank) + lp(e.depth, e.rank + 1);
            heap.push(Entry { logw, rank: e.rank + 1, ..e }, |a, b| first(&arena, &off, a, b));
        }
        if d < ld {
            let logw = e.logw + lp(e.depth + 1, 0);
            heap.push(Entry { logw, parent: idx, depth: e.depth + 1, rank: 0 }, |a, b| first(&arena, &off, a, b));
        }
    }
    tree
}

/// Lexicographic comparison of the rank tuples `path(a.parent) ++ [a.rank]` and
/// `path(b.parent) ++ [b.rank]` (a proper prefix sorts first).
fn rank_tuple_cmp(arena: &[u32], off: &[u32], a: &Entry, b: &Entry) -> Ordering {
    let la = a.depth as usize;
    let lb = b.depth as usize;
    let pa = &arena[off[a.parent as usize] as usize..][..la - 1];
    let pb = &arena[off[b.parent as usize] as usize..][..lb - 1];
    let at = |i: usize| if i + 1 < la { pa[i] } else { a.rank };
    let bt = |i: usize| if i + 1 < lb { pb[i] } else { b.rank };
    for i in 0..la.min(lb) {
        match at(i).cmp(&bt(i)) {
            Ordering::Equal => {}
            o => return o,
        }
    }
    la.cmp(&lb)
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::super::testutil::*;
    use super::super::*;
    use super::*;

    #[test]
    fn toy_heap_spec_9_2() {
        // V = 2, depth limit 2, budget 3; depth1 = [0.60, 0.25], depth2 = [0.50, 0.30].
        let top = TopK::from_logp(2, vec![0, 1, 0, 1], vec![0.60f32.ln(), 0.25f32.ln(), 0.50f32.ln(), 0.30f32.ln()]);
        let anchor = 42;
        let t = build_ddtree(&top, anchor, 3);
        assert!(t.is_well_formed());
        assert_eq!(t.tokens, vec![anchor, 0, 0, 1]);
        assert_eq!(t.parents, vec![NO_PARENT, 0, 1, 0]);
        assert_eq!(t.depths, vec![0, 1, 2, 1]);
        let s = 1000u32;
        let pos: Vec<u32> = t.depths.iter().map(|d| s + d).collect();
        assert_eq!(pos, vec![s, s + 1, s + 2, s + 1]);
        let want = [0.0f64, 0.60f64.ln(), (0.60f64 * 0.50).ln(), 0.25f64.ln()];
        for (g, w) in t.scores.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-6, "{g} vs {w}");
        }
        // Visibility rows via ancestor walk (§4.8): row0 {0}, row1 {0,1}, row2 {0,1,2}, row3 {0,3}.
        let rows: Vec<Vec<usize>> = (0..t.len())
            .map(|i| {
                let mut r = vec![i];
                let mut j = i;
                while t.parents[j] != NO_PARENT {
                    j = t.parents[j] as usize;
                    r.push(j);
                }
                r.sort();
                r
            })
            .collect();
        assert_eq!(rows, vec![vec![0], vec![0, 1], vec![0, 1, 2], vec![0, 3]]);
        // Acceptance-walk lookups.
        assert_eq!(t.child_with_token(0, 0), Some(1));
        assert_eq!(t.child_with_token(0, 1), Some(3));
        assert_eq!(t.child_with_token(1, 0), Some(2));
        assert_eq!(t.child_with_token(1, 1), None);
        assert_eq!(t.child_with_token(3, 0), None);
        // Budget 4 continues with (0,1) = 0.18 before (1,0) = 0.125.
        let t4 = build_ddtree(&top, anchor, 4);
        assert_eq!(t4.tokens, vec![anchor, 0, 0, 1, 1]);
        assert_eq!(t4.parents, vec![NO_PARENT, 0, 1, 0, 1]);
        assert_eq!(t4.depths, vec![0, 1, 2, 1, 2]);
    }

    #[test]
    fn empty_budget_and_depth() {
        let top = TopK::from_logp(2, vec![0, 1], vec![-0.1, -2.0]);
        assert_eq!(build_ddtree(&top, 7, 0), DraftTree::root(7));
        let none = TopK::from_logp(2, vec![], vec![]);
        assert_eq!(build_ddtree(&none, 7, 5), DraftTree::root(7));
        // Budget larger than the reachable tree (2 nodes at depth 1).
        let t = build_ddtree(&top, 7, 10);
        assert_eq!(t.tokens, vec![7, 0, 1]);
    }

    #[test]
    fn matches_brute_force() {
        let mut rng = Rng(0xDD);
        let mut total = 0;
        for &(vocab, ld) in &[(3usize, 2usize), (3, 3), (4, 2), (4, 3), (2, 3)] {
            for _trial in 0..4 {
                let logits = random_logits(&mut rng, ld * vocab, 3.0);
                let full = depth_topk(&logits, ld, vocab, vocab);
                // Independent per-depth log-softmax in f64.
                let lps: Vec<Vec<f64>> = (0..ld)
                    .map(|d| {
                        let z: Vec<f64> = logits[d * vocab..(d + 1) * vocab].iter().map(|&x| x as f64).collect();
                        naive_log_softmax(&z)
                    })
                    .collect();
                let all = enumerate_prefixes(ld, vocab, &|path| lps[path.len()].clone());
                total += check_topb(&all, 1e-5, &|b| build_ddtree(&full, 99, b));
                // The minimal top-K (K = min(B, V)) gives the same trees.
                total += check_topb(&all, 1e-5, &|b| build_ddtree(&depth_topk(&logits, ld, vocab, b), 99, b));
            }
        }
        assert!(total > 300, "too few budgets checked: {total}");
    }

    #[test]
    fn exact_tie_prefers_smaller_rank_tuple() {
        // Depth 1: two tokens with equal log-prob; depth 2: log-prob 0 for both ranks, so
        // every prefix has logw = -1 and the pop order is decided by rank tuples alone.
        let top = TopK::from_logp(2, vec![5, 6, 7, 8], vec![-1.0, -1.0, 0.0, 0.0]);
        let t = build_ddtree(&top, 0, 6);
        // logw: (0,)=-1, (1,)=-1, (0,0)=-1, (0,1)=-1, (1,0)=-1, (1,1)=-1 — all tied.
        // Pop order by rank tuple: (0,), (0,0), (0,1), (1,), (1,0), (1,1).
        assert_eq!(t.tokens, vec![0, 5, 7, 8, 6, 7, 8]);
        assert_eq!(t.parents, vec![NO_PARENT, 0, 1, 1, 0, 4, 4]);
        assert_eq!(t.depths, vec![0, 1, 2, 2, 1, 2, 2]);
        assert!(t.is_well_formed());
    }
}
