//! The proposer seam: turn one drafter forward's logits into a draft tree. Every method is the
//! same decode loop with a different proposer (design §1); `ar` proposes the root alone.
//!
//! One path for every backend: [`propose`] takes the draft logits where they are (a
//! [`DraftLogits`] handle) and reads back only what the method's tree builder needs — the
//! whole `[depth, V]` logits for a host builder ([`TreePrep::Host`], and `dspark`/`treespark`
//! always), or the per-depth top-k, the candidate table or the finished tree from the device
//! ([`TreePrep::Device`]). [`TreePrep::Auto`] is resolved by the engine from
//! [`Backend::host_memory`].

use super::Method;
use crate::error::Result;
use crate::tree::{self, DraftTree, MarkovHead};
use sparkling_core::Backend;
use web_time::Instant;

/// Where the draft logits are turned into the inputs of the tree heap (design §1, §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TreePrep {
    /// [`TreePrep::Host`] on a backend whose tensors live in host memory
    /// ([`Backend::host_memory`]: the CPU backend), else [`TreePrep::Device`]. Resolved by the
    /// engine ([`TreePrep::resolve`]), so callers never ask the backend themselves.
    #[default]
    Auto,
    /// Download the whole `[depth, V]` draft logits and select on the host (SparklingTree uses
    /// the lazy-row builder, cheapest on a CPU).
    Host,
    /// Select on the device and download only what the heap reads: `ddtree` per-depth
    /// [`Backend::topk`]; `sparkling` the whole tree from [`Backend::sparkling_tree`] where the
    /// backend offers it (wgpu, CUDA: top-C → union → Markov table → best-first heap on the
    /// device, one read-back of the `budget` nodes), else [`Backend::candidate_table`] (one
    /// read-back on a device, `topk` + `markov_table` with the default) → host precompute heap
    /// (reference §5.2 c); `dflash` device argmax. `dspark` and `treespark` still read the full
    /// logits (sequential Markov chain / TreeSpark policy run on the host).
    Device,
}

impl TreePrep {
    /// Parse `auto` / `host` / `device`.
    pub fn parse(s: &str) -> Option<TreePrep> {
        match s {
            "auto" => Some(TreePrep::Auto),
            "host" => Some(TreePrep::Host),
            "device" => Some(TreePrep::Device),
            _ => None,
        }
    }

    /// `Auto` → `Host` when `host_memory` (the backend's [`Backend::host_memory`]), else
    /// `Device`; `Host` and `Device` unchanged.
    pub fn resolve(self, host_memory: bool) -> TreePrep {
        match self {
            TreePrep::Auto if host_memory => TreePrep::Host,
            TreePrep::Auto => TreePrep::Device,
            p => p,
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
    /// Host or device candidate selection ([`TreePrep::Auto`]: the engine decides).
    pub prep: TreePrep,
}

/// One drafter forward's output, where it lives: the logits `[depth, V]` (row `d` is the
/// distribution of depth `d + 1`) and the drafter's Markov head on the host and, for device
/// SparklingTree prep, on the device.
pub struct DraftLogits<'a, B: Backend> {
    /// Draft logits `[depth, vocab]` on the backend.
    pub logits: &'a B::Tensor,
    /// Depth rows.
    pub depth: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// The Markov head's host weights (`dspark`, `sparkling`, `treespark`).
    pub markov: Option<&'a MarkovHead>,
    /// The Markov head's `(W1, W2)` on the device (`sparkling` with [`TreePrep::Device`]).
    pub markov_dev: Option<(&'a B::Tensor, &'a B::Tensor)>,
}

/// A proposed draft tree and what building it cost (ms).
#[derive(Debug, Clone, Default)]
pub struct Proposal {
    /// The draft tree (root = the round's anchor).
    pub tree: DraftTree,
    /// Download of the whole draft logits (host builders), ms.
    pub download_ms: f64,
    /// Candidate / top-k / table preparation, device calls and their read-backs included, ms.
    pub prep_ms: f64,
    /// Host heap (tree build), ms.
    pub heap_ms: f64,
}

impl Proposal {
    /// The root alone (no draft): `ar`, or a drafter with nothing to propose.
    pub fn root(anchor: u32) -> Proposal {
        Proposal { tree: DraftTree::root(anchor), ..Proposal::default() }
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Build the draft tree of `method` from the draft logits `d`, rooted at `anchor`, with the
/// selection `p.prep` (an unresolved [`TreePrep::Auto`] is resolved here from the backend).
/// Host and device selection give the same trees up to near-ties of f32 rounding (sparkling:
/// both are the §5.2 c tree; the host lazy builder reproduces the precompute table).
/// Errors: backend failures.
pub async fn propose<B: Backend>(b: &B, method: Method, d: &DraftLogits<'_, B>, anchor: u32, p: &TreeParams) -> Result<Proposal> {
    propose_scored(b, method, d, anchor, p, false).await
}

/// [`propose`], with path log-probabilities in the chains' `scores` when `chain_scores` (the
/// `--budget auto` policy needs them; trees always carry theirs): `dflash` the running sum of
/// each depth's top-1 log-probability (device: a top-1 [`Backend::topk`] instead of the argmax),
/// `dspark` of the Markov-conditioned ones. Same tokens either way.
pub async fn propose_scored<B: Backend>(b: &B, method: Method, d: &DraftLogits<'_, B>, anchor: u32, p: &TreeParams, chain_scores: bool) -> Result<Proposal> {
    let device = p.prep.resolve(b.host_memory()) == TreePrep::Device;
    let t0 = Instant::now();
    let (depth, vocab) = (d.depth, d.vocab);
    Ok(match method {
        Method::Ar => Proposal::root(anchor),
        Method::DFlash if device && chain_scores => {
            let n = depth.min(p.budget);
            let top = b.topk_async(d.logits, 1).await?;
            let n = n.min(top.ids.len());
            let lp: Vec<f32> = (0..n).map(|i| top.logp(i)).collect();
            Proposal { tree: scored_chain(anchor, &top.ids[..n], &lp), prep_ms: ms(t0), ..Proposal::default() }
        }
        Method::DFlash if device => {
            let n = depth.min(p.budget);
            let ids = b.argmax_async(d.logits).await?;
            Proposal { tree: DraftTree::chain(anchor, &ids[..n.min(ids.len())]), prep_ms: ms(t0), ..Proposal::default() }
        }
        Method::DDTree if device => {
            let top = b.topk_async(d.logits, p.budget.min(vocab).max(1)).await?;
            let prep_ms = ms(t0);
            let t1 = Instant::now();
            let tree = tree::build_ddtree(&top, anchor, p.budget);
            Proposal { tree, download_ms: 0.0, prep_ms, heap_ms: ms(t1) }
        }
        Method::Sparkling if device => {
            let k = p.max_fanout.min(p.budget);
            if depth == 0 || k == 0 {
                return Ok(Proposal::root(anchor));
            }
            // The whole tree on the device where the backend offers it (wgpu, CUDA: only the
            // tree comes back; the heap time is part of prep).
            if let Some(tree) = b.sparkling_tree_async(d.logits, d.markov_dev, p.candidates.max(1), anchor, k, p.budget).await? {
                return Ok(Proposal { tree, prep_ms: ms(t0), ..Proposal::default() });
            }
            // Else top-C per depth → union with the anchor → Markov table, one Backend op (one
            // read-back on a device; topk + markov_table with the default), heap on the host.
            let table = b.candidate_table_async(d.logits, d.markov_dev, p.candidates.max(1), anchor, k).await?;
            let prep_ms = ms(t0);
            let t1 = Instant::now();
            let tree = tree::build_sparkling_precompute(&table, anchor, p.budget);
            Proposal { tree, download_ms: 0.0, prep_ms, heap_ms: ms(t1) }
        }
        // Host builders (and dspark / treespark everywhere): the whole logits come back.
        _ => {
            let host = b.download_async(d.logits).await?;
            let mut prop = propose_host(method, &host, depth, vocab, d.markov, anchor, p, chain_scores);
            prop.download_ms = ms(t0);
            prop
        }
    })
}

/// The host tree builders over downloaded draft logits `[depth, V]`.
#[allow(clippy::too_many_arguments)]
fn propose_host(method: Method, logits: &[f32], depth: usize, vocab: usize, markov: Option<&MarkovHead>, anchor: u32, p: &TreeParams, chain_scores: bool) -> Proposal {
    let t0 = Instant::now();
    let (tree, prep_ms, heap_ms) = match method {
        Method::Ar => (DraftTree::root(anchor), 0.0, 0.0),
        Method::DFlash if chain_scores => {
            let n = depth.min(p.budget);
            let (drafts, lp): (Vec<u32>, Vec<f32>) = logits
                .chunks(vocab)
                .take(n)
                .map(|row| {
                    let a = argmax(row);
                    (a, tree::log_prob(row[a as usize], tree::log_sum_exp(row)))
                })
                .unzip();
            (scored_chain(anchor, &drafts, &lp), ms(t0), 0.0)
        }
        Method::DFlash => {
            let n = depth.min(p.budget);
            let drafts: Vec<u32> = logits.chunks(vocab).take(n).map(argmax).collect();
            (DraftTree::chain(anchor, &drafts), ms(t0), 0.0)
        }
        Method::DSpark if chain_scores => {
            let (drafts, lp) = tree::markov_greedy_chain_scored(logits, depth, vocab, markov, anchor, depth.min(p.budget));
            (scored_chain(anchor, &drafts, &lp), ms(t0), 0.0)
        }
        Method::DSpark => {
            let drafts = tree::markov_greedy_chain(logits, depth, vocab, markov, anchor, depth.min(p.budget));
            (DraftTree::chain(anchor, &drafts), ms(t0), 0.0)
        }
        Method::DDTree => {
            let top = tree::depth_topk(logits, depth, vocab, p.budget.min(vocab).max(1));
            let prep = ms(t0);
            let t1 = Instant::now();
            (tree::build_ddtree(&top, anchor, p.budget), prep, ms(t1))
        }
        Method::Sparkling => {
            // The union-normalised tree of §5.2c with rows built only for expanded nodes (same
            // tree as the precompute table, a fraction of its cost on a CPU).
            let lc = tree::LazyCandidates::new(logits, depth, vocab, markov, anchor, p.candidates);
            let prep = ms(t0);
            let t1 = Instant::now();
            (tree::build_sparkling_lazy(&lc, markov, anchor, p.max_fanout, p.budget), prep, ms(t1))
        }
        Method::TreeSpark => (tree::build_treespark(logits, depth, vocab, markov, anchor, p.treespark_k, p.budget), 0.0, ms(t0)),
    };
    Proposal { tree, download_ms: 0.0, prep_ms, heap_ms }
}

/// A chain whose node scores are the running sums of the per-depth log-probabilities `lp`.
fn scored_chain(anchor: u32, drafts: &[u32], lp: &[f32]) -> DraftTree {
    let mut t = DraftTree::chain(anchor, drafts);
    let mut acc = 0.0f64;
    for (s, &l) in t.scores[1..].iter_mut().zip(lp) {
        acc += l as f64;
        *s = acc as f32;
    }
    t
}

/// Index of the row's largest value (the first on ties).
fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}
