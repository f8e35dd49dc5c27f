//! The proposer seam: turn one drafter forward's logits into a draft tree. Every method is the
//! same decode loop with a different proposer (design §1); `ar` proposes the root alone.

use super::Method;
use crate::error::Result;
use crate::tree::{self, DraftTree, MarkovHead};
use sparkling_core::Backend;
use web_time::Instant;

/// Where the draft logits are turned into the inputs of the tree heap (design §1, §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreePrep {
    /// Download the whole `[depth, V]` draft logits and select on the host (the CPU backend's
    /// path: SparklingTree uses the lazy-row builder, cheapest on a CPU).
    Host,
    /// Select on the device and download only what the heap reads: `ddtree` per-depth
    /// [`Backend::topk`]; `sparkling` the whole tree from [`Backend::sparkling_tree`] where the
    /// backend offers it (wgpu: top-C → union → Markov table → best-first heap on the device,
    /// one read-back of the `budget` nodes), else [`Backend::candidate_table`] (one read-back
    /// on a device, `topk` + `markov_table` with the default) → host precompute heap (reference
    /// §5.2 c); `dflash` device argmax.
    /// `dspark` and `treespark` still read the full logits (sequential Markov chain / TreeSpark
    /// policy run on the host). The GPU backends' default.
    Device,
}

impl TreePrep {
    /// Parse `host` / `device`.
    pub fn parse(s: &str) -> Option<TreePrep> {
        match s {
            "host" => Some(TreePrep::Host),
            "device" => Some(TreePrep::Device),
            _ => None,
        }
    }
}

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
    /// Host or device candidate selection.
    pub prep: TreePrep,
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

/// Build the draft tree of `method` from the device draft logits `[depth, V]` with device-side
/// selection ([`TreePrep::Device`]). Same trees as [`propose`] up to near-ties of f32 rounding
/// (sparkling: identical to the §5.2 c table, which the host lazy builder reproduces).
/// Returns the tree and the (prep, heap) times in ms; prep includes the device calls and their
/// downloads. Errors: backend failures.
#[allow(clippy::too_many_arguments)]
pub async fn propose_device<B: Backend>(
    b: &B,
    method: Method,
    logits: &B::Tensor,
    depth: usize,
    vocab: usize,
    markov: Option<&MarkovHead>,
    markov_dev: Option<(&B::Tensor, &B::Tensor)>,
    anchor: u32,
    p: TreeParams,
) -> Result<(DraftTree, f64, f64)> {
    let t0 = Instant::now();
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    Ok(match method {
        Method::Ar => (DraftTree::root(anchor), 0.0, 0.0),
        Method::DFlash => {
            let n = depth.min(p.budget);
            let ids = b.argmax_async(logits).await?;
            (DraftTree::chain(anchor, &ids[..n.min(ids.len())]), ms(t0), 0.0)
        }
        Method::DDTree => {
            let top = b.topk_async(logits, p.budget.min(vocab).max(1)).await?;
            let prep = ms(t0);
            let t1 = Instant::now();
            let tr = tree::build_ddtree(&top, anchor, p.budget);
            (tr, prep, ms(t1))
        }
        Method::Sparkling => {
            let k = p.max_fanout.min(p.budget);
            if depth == 0 || k == 0 {
                return Ok((DraftTree::root(anchor), 0.0, 0.0));
            }
            // The whole tree on the device where the backend offers it (wgpu: only the tree
            // comes back; the heap time is part of prep).
            if let Some(tr) = b.sparkling_tree_async(logits, markov_dev, p.candidates.max(1), anchor, k, p.budget).await? {
                return Ok((tr, ms(t0), 0.0));
            }
            // Else top-C per depth → union with the anchor → Markov table, one Backend op (one
            // read-back on a device; topk + markov_table with the default), heap on the host.
            let table = b.candidate_table_async(logits, markov_dev, p.candidates.max(1), anchor, k).await?;
            let prep = ms(t0);
            let t1 = Instant::now();
            let tr = tree::build_sparkling_precompute(&table, anchor, p.budget);
            (tr, prep, ms(t1))
        }
        Method::DSpark | Method::TreeSpark => {
            let host = b.download_async(logits).await?;
            let dl = ms(t0);
            let (tr, prep, heap) = propose(method, &host, depth, vocab, markov, anchor, p);
            (tr, dl + prep, heap)
        }
    })
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
