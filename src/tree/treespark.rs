//! The "TreeSpark policy" of the SparklingTree issue: the PCTree algorithm (reference spec
//! §5.4 — per-parent top-k expansion, frontier pruning to k, global top-N packing) with the
//! node budget `N` counting **non-root** nodes (N = 32 → 33 verify positions). See spec §0.3
//! for the naming caveat (the calibrated-survival TreeSpark of §5.3 is a different algorithm).

use super::sparkling::{check_inputs, conditional_logits};
use super::{log_prob, log_sum_exp, topk_desc, DraftTree, MarkovHead, NO_PARENT};

/// Build the TreeSpark-policy (PCTree, §5.4) draft tree.
///
/// - `base`: drafter logits `U`, `[ld, vocab]` row-major f32 (finite); row `d` feeds depth
///   `d + 1`; `ld` = number of Markov stages = maximum depth (`B` in §5.4).
/// - `markov`: optional Markov head (`None` = zero bias: every parent at a depth sees the
///   same distribution).
/// - `anchor`: root token (`< vocab`).
/// - `k`: per-parent branching and frontier width (paper default 4); effective
///   `min(k, vocab)`.
/// - `budget`: `N`, the number of **non-root** nodes kept (paper `N = 32` incl. root ⇒ pass 31
///   to reproduce the paper; this API counts non-root nodes as the issue specifies).
///
/// Algorithm: pool = {root (score 0)}, frontier = {root}. For each depth row `d in 0..ld`:
/// every frontier parent `p` (in frontier order) gets its own full-vocabulary conditional
/// `log_softmax(U[d] + B(token(p)))` (f32 values, see [`super::build_sparkling_reference`]),
/// and its top-k children (ties: lower id) are appended to the pool in parent-major,
/// rank order with path score `s(p) + log π(child | p)` (accumulated in f64); if `d + 1 < ld`
/// the new frontier is the k best nodes of this layer (score desc, pool id asc). Then the
/// global top-N non-root nodes are chosen by a stable descending sort of scores over the
/// depth-ascending pool (score desc, depth asc, id asc). Because `log π <= 0`, a child never
/// outranks its parent, so the selection is ancestor-closed. The output is re-sorted by
/// ascending pool id (topological, depth-major) with parents remapped; `scores` are the path
/// scores rounded to f32.
///
/// Result: `min(budget, pool size - 1)` non-root nodes, at most `k` children per node, depth
/// at most `ld`. `budget == 0`, `ld == 0`, `k == 0` or `vocab == 0` → root only. Cost:
/// `1 + (ld-1)·k` conditionals of O(V·r).
///
///
/// # Panics
/// Only on precondition violations: `base.len() < ld*vocab`, `anchor >= vocab`, or a
/// head whose `vocab`/weights do not match.
pub fn build_treespark(base: &[f32], ld: usize, vocab: usize, markov: Option<&MarkovHead>, anchor: u32, k: usize, budget: usize) -> DraftTree {
    let kk = k.min(vocab);
    if budget == 0 || ld == 0 || kk == 0 {
        return DraftTree::root(anchor);
    }
    check_inputs(base, ld, vocab, markov, anchor);

    // Pool (ids ascending = depth ascending).
    let cap = 1 + kk + (ld - 1) * kk * kk;
    let mut tok: Vec<u32> = Vec::with_capacity(cap);
    let mut par: Vec<u32> = Vec::with_capacity(cap);
    let mut dep: Vec<u32> = Vec::with_capacity(cap);
    let mut score: Vec<f64> = Vec::with_capacity(cap);
    tok.push(anchor);
    par.push(NO_PARENT);
    dep.push(0);
    score.push(0.0);

    let mut z = vec![0.0f32; vocab];
    let mut sel = Vec::with_capacity(kk);
    let mut frontier: Vec<usize> = vec![0];
    for d in 0..ld {
        let layer_start = tok.len();
        for &p in &frontier {
            conditional_logits(base, d, vocab, markov, tok[p], &mut z);
            let lse = log_sum_exp(&z);
            topk_desc(&z, kk, &mut sel);
            for &(v, id) in &sel {
                tok.push(id);
                par.push(p as u32);
                dep.push(d as u32 + 1);
                score.push(score[p] + log_prob(v, lse) as f64);
            }
        }
        if d + 1 < ld {
            let mut layer: Vec<usize> = (layer_start..tok.len()).collect();
            layer.sort_by(|&a, &b| score[b].total_cmp(&score[a])); // stable: id asc on ties
            layer.truncate(kk);
            frontier = layer;
        }
    }

    // Global top-N non-root by stable descending sort over the depth-ascending pool.
    let mut order: Vec<usize> = (1..tok.len()).collect();
    order.sort_by(|&a, &b| score[b].total_cmp(&score[a]));
    order.truncate(budget);
    order.sort_unstable();

    // Remap pool ids to output columns (root = column 0).
    let mut col = vec![u32::MAX; tok.len()];
    col[0] = 0;
    let n = order.len() + 1;
    let mut tree = DraftTree { tokens: Vec::with_capacity(n), parents: Vec::with_capacity(n), depths: Vec::with_capacity(n), scores: Vec::with_capacity(n) };
    tree.tokens.push(anchor);
    tree.parents.push(NO_PARENT);
    tree.depths.push(0);
    tree.scores.push(0.0);
    for (j, &i) in order.iter().enumerate() {
        col[i] = j as u32 + 1;
        let pc = col[par[i] as usize];
        debug_assert!(pc != u32::MAX, "PCTree selection not ancestor-closed");
        tree.tokens.push(tok[i]);
        tree.parents.push(pc);
        tree.depths.push(dep[i]);
        tree.scores.push(score[i] as f32);
    }
    tree
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::super::testutil::*;
    use super::super::*;
    use super::*;

    fn naive_cond(base: &[f32], d: usize, vocab: usize, m: Option<&MarkovHead>, prev: u32) -> Vec<f64> {
        let z: Vec<f64> = (0..vocab).map(|v| base[d * vocab + v] as f64 + m.map_or(0.0, |m| m.bias_at(prev, v as u32) as f64)).collect();
        naive_log_softmax(&z)
    }

    fn check_properties(t: &DraftTree, base: &[f32], ld: usize, vocab: usize, m: Option<&MarkovHead>, k: usize, budget: usize) {
        assert!(t.is_well_formed());
        assert!(t.num_nodes() <= budget);
        let cm = t.child_map();
        for p in 0..t.len() {
            let ch = cm.children(p);
            assert!(ch.len() <= k, "node {p} has {} children", ch.len());
            if ch.is_empty() {
                continue;
            }
            let d = t.depths[p] as usize;
            assert!(d < ld);
            let lp = naive_cond(base, d, vocab, m, t.tokens[p]);
            let mut ranked: Vec<usize> = (0..vocab).collect();
            ranked.sort_by(|&a, &b| lp[b].partial_cmp(&lp[a]).unwrap());
            let topk: Vec<u32> = ranked[..k.min(vocab)].iter().map(|&v| v as u32).collect();
            for &c in ch {
                let c = c as usize;
                let tokc = t.tokens[c];
                assert!(topk.contains(&tokc), "child token {tokc} not in parent's top-{k}");
                let want = t.scores[p] as f64 + lp[tokc as usize];
                assert!((t.scores[c] as f64 - want).abs() < 1e-4, "score {} vs {want}", t.scores[c]);
                assert!(t.scores[c] <= t.scores[p]);
            }
        }
        // Topological, depth-major output.
        assert!(t.depths.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn properties_random() {
        let mut rng = Rng(0x7EE);
        for &(vocab, ld, k, budget) in &[(50usize, 7usize, 4usize, 32usize), (50, 16, 4, 32), (30, 5, 3, 100), (10, 4, 2, 5), (3, 6, 4, 64), (200, 7, 4, 31)] {
            let base = random_logits(&mut rng, ld * vocab, 3.0);
            let m = random_head(&mut rng, vocab, 6, 0.7);
            let anchor = rng.below(vocab) as u32;
            for head in [Some(&m), None] {
                let t = build_treespark(&base, ld, vocab, head, anchor, k, budget);
                check_properties(&t, &base, ld, vocab, head, k, budget);
                let kk = k.min(vocab);
                let pool_nonroot = kk + (ld - 1) * kk * kk;
                assert_eq!(t.num_nodes(), budget.min(pool_nonroot));
            }
        }
    }

    #[test]
    fn n32_gives_33_positions() {
        let mut rng = Rng(32);
        let (vocab, ld) = (100, 7);
        let base = random_logits(&mut rng, ld * vocab, 3.0);
        let m = random_head(&mut rng, vocab, 8, 0.5);
        let t = build_treespark(&base, ld, vocab, Some(&m), 5, 4, 32);
        assert_eq!(t.len(), 33);
        assert_eq!(t.num_nodes(), 32);
        assert_eq!(t.tokens[0], 5);
    }

    #[test]
    fn k1_reproduces_greedy_chain() {
        let mut rng = Rng(0xC4A1);
        for &(vocab, ld) in &[(40usize, 7usize), (300, 16), (5, 9)] {
            let base = random_logits(&mut rng, ld * vocab, 3.0);
            let m = random_head(&mut rng, vocab, 8, 0.8);
            let anchor = 1u32;
            let chain = markov_greedy_chain(&base, ld, vocab, Some(&m), anchor, ld);
            for budget in [ld, ld + 1, 100] {
                let t = build_treespark(&base, ld, vocab, Some(&m), anchor, 1, budget);
                assert_eq!(t, {
                    let mut c = DraftTree::chain(anchor, &chain);
                    c.scores = t.scores.clone();
                    c
                });
            }
            // Shorter budget: prefix of the chain.
            let t = build_treespark(&base, ld, vocab, Some(&m), anchor, 1, 3);
            assert_eq!(t.tokens, [&[anchor][..], &chain[..3]].concat());
        }
    }

    #[test]
    fn selection_is_top_n_of_full_pool() {
        let mut rng = Rng(0xF00);
        let (vocab, ld, k) = (25usize, 5usize, 3usize);
        let base = random_logits(&mut rng, ld * vocab, 3.0);
        let m = random_head(&mut rng, vocab, 5, 0.8);
        let anchor = 7u32;
        let full = build_treespark(&base, ld, vocab, Some(&m), anchor, k, usize::MAX);
        assert_eq!(full.num_nodes(), k + (ld - 1) * k * k);
        // Pool structure: depth 1 = root's top-k; depth d+1 = k children of each of the k best
        // depth-d nodes.
        let cm = full.child_map();
        assert_eq!(cm.children(0).len(), k);
        for d in 1..ld as u32 {
            let mut layer: Vec<usize> = (0..full.len()).filter(|&i| full.depths[i] == d).collect();
            assert_eq!(layer.len(), if d == 1 { k } else { k * k });
            layer.sort_by(|&a, &b| full.scores[b].partial_cmp(&full.scores[a]).unwrap());
            for (r, &i) in layer.iter().enumerate() {
                assert_eq!(cm.children(i).len(), if r < k { k } else { 0 }, "depth {d} rank {r}");
            }
        }
        // Each smaller budget selects the top-N of the full pool (stable: score desc, id asc).
        let mut order: Vec<usize> = (1..full.len()).collect();
        order.sort_by(|&a, &b| full.scores[b].partial_cmp(&full.scores[a]).unwrap());
        for budget in 1..full.num_nodes() {
            let t = build_treespark(&base, ld, vocab, Some(&m), anchor, k, budget);
            let mut want: Vec<usize> = order[..budget].to_vec();
            want.sort();
            let want_paths: Vec<Vec<u32>> = want.iter().map(|&i| path_of(&full, i)).collect();
            let got_paths: Vec<Vec<u32>> = (1..t.len()).map(|i| path_of(&t, i)).collect();
            assert_eq!(got_paths, want_paths, "budget {budget}");
        }
    }

    #[test]
    fn empty_cases() {
        let base = [0.0f32; 12];
        assert_eq!(build_treespark(&base, 3, 4, None, 2, 4, 0), DraftTree::root(2));
        assert_eq!(build_treespark(&base, 0, 4, None, 2, 4, 9), DraftTree::root(2));
        assert_eq!(build_treespark(&base, 3, 4, None, 2, 0, 9), DraftTree::root(2));
        // All-equal logits: ties resolved by lower id, depth asc; still well-formed.
        let t = build_treespark(&base, 3, 4, None, 2, 2, 5);
        assert!(t.is_well_formed());
        assert_eq!(t.tokens, vec![2, 0, 1, 0, 1, 0]);
        assert_eq!(t.parents, vec![NO_PARENT, 0, 0, 1, 1, 2]);
    }
}
