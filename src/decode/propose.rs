//! The proposer seam: turn one drafter forward's logits into a draft tree. Every method is the
//! same decode loop with a different proposer (design §1); `ar` proposes the root alone.

use super::Method;
use crate::tree::{self, DraftTree, MarkovHead};
use std::time::Instant;

/// Tree-shape knobs shared by the methods.
#[derive(Debug, Clone, Copy)]
pub struct TreeParams {
    /// Non-root node budget (chains: maximum chain length).
    pub budget: usize,
    /// Top-C candidates per depth in the SparklingTree union table (reference §5.2c).
    pub candidates: usize,
    /// Maximum children per parent in the SparklingTree table (`max_fanout`).
    pub max_fanout: usize,
    /// Children per parent in the TreeSpark policy (k).
    pub treespark_k: usize,
}

/// Build the draft tree of `method` from host draft logits `[depth, V]` (row `d` is the
/// distribution of depth `d+1`). Returns the tree and the (prep, heap) times in ms.
pub fn propose(
    method: Method,
    logits: &[f32],
    depth: usize,
    vocab: usize,
    markov: Option<&MarkovHead>,
    anchor: u32,
    p: TreeParams,
) -> (DraftTree, f64, f64) {
    let t0 = Instant::now();
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    match method {
        Method::Ar => (DraftTree::root(anchor), 0.0, 0.0),
        Method::DFlash => {
            let n = depth.min(p.budget);
            let drafts: Vec<u32> = logits.chunks(vocab).take(n).map(argmax).collect();
            let prep = ms(t0);
            (DraftTree::chain(anchor, &drafts), prep, 0.0)
        }
        Method::DSpark => {
            let drafts = tree::markov_greedy_chain(logits, depth, vocab, markov, anchor, depth.min(p.budget));
            let prep = ms(t0);
            (DraftTree::chain(anchor, &drafts), prep, 0.0)
        }
        Method::DDTree => {
            let top = tree::depth_topk(logits, depth, vocab, p.budget.min(vocab).max(1));
            let prep = ms(t0);
            let t1 = Instant::now();
            let tr = tree::build_ddtree(&top, anchor, p.budget);
            (tr, prep, ms(t1))
        }
        Method::Sparkling => {
            // Host path: the union-normalised tree of §5.2c with rows built only for expanded
            // nodes (same tree as the precompute table, a fraction of its cost on a CPU).
            let lc = tree::LazyCandidates::new(logits, depth, vocab, markov, anchor, p.candidates);
            let prep = ms(t0);
            let t1 = Instant::now();
            let tr = tree::build_sparkling_lazy(&lc, markov, anchor, p.max_fanout, p.budget);
            (tr, prep, ms(t1))
        }
        Method::TreeSpark => {
            let t1 = Instant::now();
            let tr = tree::build_treespark(logits, depth, vocab, markov, anchor, p.treespark_k, p.budget);
            (tr, 0.0, ms(t1))
        }
    }
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}
