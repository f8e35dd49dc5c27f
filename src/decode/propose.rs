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
use crate::model::draft_vocab::DraftVocab;
use crate::model::drafter::Drafter;
use crate::tree::{self, DraftTree, MarkovHead};
use sparkling_core::{Backend, CandidateArgs};
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
    /// [`Backend::topk_async`]; `sparkling` the whole tree from [`Backend::sparkling_tree_async`] where the
    /// backend offers it (wgpu, CUDA: top-C → union → Markov table → best-first heap on the
    /// device, one read-back of the `budget` nodes), else [`Backend::candidate_table_async`] (one
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

/// One drafter forward's output, where it lives: the logits `[depth, V_d]` (row `d` is the
/// distribution of depth `d + 1`) and the drafter's Markov head on the host and, for device
/// SparklingTree prep, on the device. Columns, the head's rows and tree tokens are **draft
/// ids**; with a reduced draft vocabulary (`map`) [`propose`] turns them into target ids.
pub struct DraftLogits<'a, B: Backend> {
    /// Draft logits `[depth, vocab]` on the backend.
    pub logits: &'a B::Tensor,
    /// Depth rows.
    pub depth: usize,
    /// Draft vocabulary size V_d (the target's vocabulary without a reduced one).
    pub vocab: usize,
    /// The Markov head's host weights in draft ids (`dspark`, `sparkling`, `treespark`).
    pub markov: Option<&'a MarkovHead>,
    /// The Markov head's `(W1, W2)` in draft ids on the device (`sparkling` with [`TreePrep::Device`]).
    pub markov_dev: Option<(&'a B::Tensor, &'a B::Tensor)>,
    /// The reduced draft vocabulary's map (`None`: draft ids are target ids).
    pub map: Option<&'a DraftVocab>,
    /// With `map`: the Markov head's `W1` as stored, `[V, r]` by target id, for an anchor
    /// outside the draft vocabulary.
    pub markov_w1_target: Option<&'a [f32]>,
}

impl<'a, B: Backend> DraftLogits<'a, B> {
    /// The draft logits `[depth, V_d]` of one forward of drafter `d` (its vocabulary, Markov
    /// head and draft → target map), with the Markov head on the device where `markov_dev`
    /// holds it ([`Drafter::markov_device`]).
    pub fn of(d: &'a Drafter<B>, logits: &'a B::Tensor, depth: usize, markov_dev: Option<(&'a B::Tensor, &'a B::Tensor)>) -> Self {
        DraftLogits {
            logits,
            depth,
            vocab: d.draft_vocab(),
            markov: d.markov.as_ref(),
            markov_dev,
            map: d.vocab_map.as_ref(),
            markov_w1_target: d.markov_w1_target.as_deref(),
        }
    }
}

/// The drafter context of a round: the taps of every committed token the drafter has not
/// consumed yet (`pending`, emptied), as one `[Lc, n_taps·H]` tensor. Errors: backend failures.
pub fn take_context<B: Backend>(b: &B, pending: &mut Vec<B::Tensor>) -> Result<B::Tensor> {
    if pending.len() == 1 {
        return Ok(pending.pop().expect("one pending entry"));
    }
    let c = b.concat_rows(&pending.iter().collect::<Vec<_>>())?;
    pending.clear();
    Ok(c)
}

/// The logit of the virtual draft column that stands for an anchor outside the draft
/// vocabulary: finite (the builders and kernels require it) and so low that its probability is
/// exactly 0 in f32 and f64 (`exp(-1e9 - max)`), so it never changes a normaliser and is only
/// ever drafted when nothing else is left; [`DraftVocab::map_tree`] drops such nodes.
pub const VIRTUAL_LOGIT: f32 = -1.0e9;

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

/// Build the draft tree of `method` from the draft logits `d`, rooted at `anchor` (a target
/// id), with the selection `p.prep` (an unresolved [`TreePrep::Auto`] is resolved here from the
/// backend). Host and device selection give the same trees up to near-ties of f32 rounding
/// (sparkling: both are the §5.2 c tree; the host lazy builder reproduces the precompute table).
///
/// With a reduced draft vocabulary (`d.map`) the builders and kernels run unchanged over draft
/// ids and the tree's tokens are mapped to target ids at the end ([`DraftVocab::map_tree`]).
/// The anchor is a target id: inside the draft vocabulary it becomes its draft id; outside it,
/// `ar`/`dflash`/`ddtree` need it only as the root's token, and the methods that condition on
/// it (the Markov head's parent row; sparkling's candidate union) get a virtual draft column
/// V_d appended for this round: logit [`VIRTUAL_LOGIT`] in every depth row (so it cannot be
/// drafted), Markov `W1` row = the anchor's target-indexed row, `W2` row 0. Same kernels on
/// every backend; the extension is one `concat_cols` (+ two `concat_rows` for device
/// SparklingTree prep) in the rounds whose anchor is outside the draft vocabulary.
/// Errors: backend failures.
pub async fn propose<B: Backend>(b: &B, method: Method, d: &DraftLogits<'_, B>, anchor: u32, p: &TreeParams) -> Result<Proposal> {
    propose_scored(b, method, d, anchor, p, false).await
}

/// [`propose`], with path log-probabilities in the chains' `scores` when `chain_scores` (the
/// `--budget auto` policy needs them; trees always carry theirs): `dflash` the running sum of
/// each depth's top-1 log-probability (device: a top-1 [`Backend::topk_async`] instead of the argmax),
/// `dspark` of the Markov-conditioned ones. Same tokens either way.
pub async fn propose_scored<B: Backend>(b: &B, method: Method, d: &DraftLogits<'_, B>, anchor: u32, p: &TreeParams, chain_scores: bool) -> Result<Proposal> {
    let Some(map) = d.map else { return propose_ids(b, method, d, anchor, p, chain_scores).await };
    let conditions = matches!(method, Method::DSpark | Method::Sparkling | Method::TreeSpark);
    let mut prop = match map.draft_id(anchor) {
        Some(a) => propose_ids(b, method, d, a, p, chain_scores).await?,
        None if !conditions => propose_ids(b, method, d, 0, p, chain_scores).await?,
        None => {
            let t0 = Instant::now();
            let (depth, v) = (d.depth, d.vocab);
            let col = b.upload(&vec![VIRTUAL_LOGIT; depth], depth, 1)?;
            let logits = b.concat_cols(&[d.logits, &col])?;
            let row: Option<Vec<f32>> = d.markov.map(|m| match d.markov_w1_target {
                Some(w1) if w1.len() >= (anchor as usize + 1) * m.rank => w1[anchor as usize * m.rank..][..m.rank].to_vec(),
                _ => vec![0.0; m.rank],
            });
            let device_sparkling = method == Method::Sparkling && p.prep.resolve(b.host_memory()) == TreePrep::Device;
            let mut dev = None;
            let mut host = None;
            if let (Some(m), Some(row)) = (d.markov, &row) {
                if device_sparkling {
                    if let Some((w1, w2)) = d.markov_dev {
                        let w1x = b.concat_rows(&[w1, &b.upload(row, 1, m.rank)?])?;
                        let w2x = b.concat_rows(&[w2, &b.zeros(1, m.rank)?])?;
                        dev = Some((w1x, w2x));
                    }
                } else {
                    let mut w1 = Vec::with_capacity((v + 1) * m.rank);
                    w1.extend_from_slice(&m.w1[..v * m.rank]);
                    w1.extend_from_slice(row);
                    let mut w2 = Vec::with_capacity((v + 1) * m.rank);
                    w2.extend_from_slice(&m.w2[..v * m.rank]);
                    w2.resize((v + 1) * m.rank, 0.0);
                    host = Some(MarkovHead { vocab: v + 1, rank: m.rank, w1, w2 });
                }
            }
            let ext = DraftLogits::<B> {
                logits: &logits,
                depth,
                vocab: v + 1,
                markov: host.as_ref(),
                markov_dev: dev.as_ref().map(|(a, c)| (a, c)),
                map: None,
                markov_w1_target: None,
            };
            let ext_ms = ms(t0);
            let mut prop = propose_ids(b, method, &ext, v as u32, p, chain_scores).await?;
            prop.prep_ms += ext_ms;
            prop
        }
    };
    prop.tree = map.map_tree(&prop.tree, anchor);
    Ok(prop)
}

/// [`propose_scored`] over draft ids: `anchor` is a draft id (`< d.vocab`).
async fn propose_ids<B: Backend>(b: &B, method: Method, d: &DraftLogits<'_, B>, anchor: u32, p: &TreeParams, chain_scores: bool) -> Result<Proposal> {
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
            let args = CandidateArgs { base: d.logits, markov: d.markov_dev, candidates: p.candidates.max(1), anchor, k };
            if let Some(tree) = b.sparkling_tree_async(args, p.budget).await? {
                return Ok(Proposal { tree, prep_ms: ms(t0), ..Proposal::default() });
            }
            // Else top-C per depth → union with the anchor → Markov table, one Backend op (one
            // read-back on a device; topk + markov_table with the default), heap on the host.
            let table = b.candidate_table_async(args).await?;
            let prep_ms = ms(t0);
            let t1 = Instant::now();
            let tree = tree::build_sparkling_precompute(&table, anchor, p.budget);
            Proposal { tree, download_ms: 0.0, prep_ms, heap_ms: ms(t1) }
        }
        // Host builders (and dspark / treespark everywhere): the whole logits come back.
        _ => {
            let host = b.download_async(d.logits).await?;
            let mut prop = propose_host(method, d, &host, anchor, p, chain_scores);
            prop.download_ms = ms(t0);
            prop
        }
    })
}

/// The host tree builders over `logits`, the downloaded draft logits `[d.depth, d.vocab]` of
/// `d` (with its host Markov head).
fn propose_host<B: Backend>(method: Method, d: &DraftLogits<'_, B>, logits: &[f32], anchor: u32, p: &TreeParams, chain_scores: bool) -> Proposal {
    let (depth, vocab, markov) = (d.depth, d.vocab, d.markov);
    let t0 = Instant::now();
    let (tree, prep_ms, heap_ms) = match method {
        // No draft logits: `lookup` proposes in the decode loop (`super::lookup`).
        Method::Ar | Method::Lookup => (DraftTree::root(anchor), 0.0, 0.0),
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
