//! Block-diffusion drafters: z-lab DFlash (reference §2.4) and DeepSpec DSpark (§3.5) share
//! one backbone: target taps → `hidden_norm(fc(taps))` injected as extra K/V rows into every
//! layer, non-causal attention over [draft cache ; context ; block], draft cache cropped back to
//! the root position after each call (§2.5).

use super::config::{DrafterConfig, DrafterKind, TargetConfig};
use super::draft_vocab::{DraftVocab, MAP_TENSOR};
use super::layer::{load_matrix, load_vector, DecoderLayer, KvCache, LayerDims, Owner};
use super::target::Target;
use crate::error::{Error, Result};
use crate::loader::TensorSource;
use crate::tree::MarkovHead;
#[cfg(not(target_arch = "wasm32"))]
use sparkling_core::ReadBack;
use sparkling_core::{AttnMask, AttnShape, Backend, DraftTree, RaggedSeq};

/// The fewest block rows a drafter forward runs ([`Drafter::block_rows`]).
pub const MIN_BLOCK_ROWS: usize = 4;

/// One sequence's part of a [`Drafter::draft_batch`]: the arguments of [`Drafter::draft`].
pub struct DraftJob<'a, B: Backend> {
    /// The sequence's own draft cache (ends at `root_pos` afterwards).
    pub cache: &'a mut KvCache<B>,
    /// Taps `[Lc, n_taps·H]` of the committed tokens at positions `cache.len .. root_pos`.
    pub taps: &'a B::Tensor,
    /// The block's anchor (root) token.
    pub anchor: u32,
    /// The root's position.
    pub root_pos: usize,
    /// Draft depths wanted (clamped to `1 ..= draft_depth()`).
    pub depth: usize,
}

/// The DSpark confidence head (reference §3.8): `α_k = sigmoid(w·[h_k ; W1[t_{k-1}]] + b)`, the
/// predicted acceptance rate of block slot `k` (trained towards `1 − ½‖p_draft − p_target‖₁`,
/// `train/src/train.rs`), from the slot's final-normed hidden state `h_k` and the Markov head's
/// row of the slot's previous token `t_{k-1}` (a tree node's parent). Only `--budget auto` reads
/// it ([`crate::decode::budget::AutoState::choose`]); the tokens never depend on it.
pub struct ConfidenceHead {
    /// `confidence_head.proj.weight` flattened, length `H + r` (`r` = Markov rank, 0 without one).
    pub w: Vec<f32>,
    /// `confidence_head.proj.bias`.
    pub bias: f32,
}

impl ConfidenceHead {
    /// The slot part of each block row's logit, `w[..H]·h_k + b`, for the final-normed hidden
    /// rows `hidden` (`[rows, H]` row-major, [`Drafter::draft_rows`]). Errors: `hidden` not a
    /// whole number of `H`-wide rows, or `w` shorter than `H`.
    pub fn slot_terms(&self, hidden: &[f32], h: usize) -> Result<Vec<f64>> {
        if h == 0 || !hidden.len().is_multiple_of(h) || self.w.len() < h {
            return Err(Error::Input(format!("confidence head: {} hidden values are not rows of {h} (head weight length {})", hidden.len(), self.w.len())));
        }
        Ok(hidden.chunks_exact(h).map(|row| row.iter().zip(&self.w[..h]).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() + self.bias as f64).collect())
    }

    /// Per-node path confidence of `tree` (target ids): `c(root) = 1`, `c(i) = c(parent) ·
    /// sigmoid(slot[depth(i) − 1] + w[H..]·W1[token(parent)])` (the product of the predicted
    /// acceptance rates of the slots on the node's path; DSpark slot `k` drafts depth `k + 1`).
    /// `slot` = [`ConfidenceHead::slot_terms`]; `w1_row(t)` = the Markov head's `W1` row of
    /// target id `t` (`None`: no Markov part, e.g. rank 0). A node deeper than `slot` gets the
    /// last slot's term. Errors: none (missing rows count as zero).
    pub fn path_confidence<'a>(&self, tree: &DraftTree, slot: &[f64], h: usize, w1_row: impl Fn(u32) -> Option<&'a [f32]>) -> Vec<f64> {
        let wr = self.w.get(h..).unwrap_or(&[]);
        let mut c = vec![1.0f64; tree.len()];
        for i in 1..tree.len() {
            let p = tree.parents[i] as usize;
            let d = tree.depths[i] as usize;
            let s = slot.get(d.saturating_sub(1)).or(slot.last()).copied().unwrap_or(self.bias as f64);
            let m: f64 = match w1_row(tree.tokens[p]) {
                Some(row) => row.iter().zip(wr).map(|(&a, &b)| a as f64 * b as f64).sum(),
                None => 0.0,
            };
            c[i] = c[p] * (1.0 / (1.0 + (-(s + m)).exp()));
        }
        c
    }
}

/// A loaded drafter.
pub struct Drafter<B: Backend> {
    /// Geometry and convention.
    pub cfg: DrafterConfig,
    /// `fc.weight` `[H, n_taps*H]`.
    pub fc: B::Weight,
    /// `hidden_norm.weight` `[1, H]`.
    pub hidden_norm: B::Tensor,
    /// Draft layers (`layers.{l}.*`, Qwen3 layout with q/k norm).
    pub layers: Vec<DecoderLayer<B>>,
    /// `norm.weight` `[1, H]`.
    pub norm: B::Tensor,
    /// Own `embed_tokens.weight` (DSpark); `None` borrows the target's.
    pub embed: Option<B::Weight>,
    /// Own `lm_head.weight` (`[V_d, H]`: DSpark, or any reduced drafter); `None` borrows the
    /// target's (its rows `draft_to_target` for a reduced drafter, see [`Drafter::output_head`]).
    pub lm_head: Option<B::Weight>,
    /// Markov head (DSpark with `markov_rank > 0`), kept on the host for the tree builders, in
    /// **draft ids**: `vocab` = V_d, `w2` = `markov_w2.weight` (`[V_d, r]`), and `w1` the rows
    /// of the target-indexed `markov_w1.weight` for the draft ids (`W1[draft_to_target]`).
    pub markov: Option<MarkovHead>,
    /// The reduced draft vocabulary's map (`None`: the drafter drafts over the whole target
    /// vocabulary and draft ids are target ids).
    pub vocab_map: Option<DraftVocab>,
    /// A reduced drafter's `markov_w1.weight` as stored, `[V, r]` indexed by **target** id: the
    /// parent row of an anchor outside the draft vocabulary (the previous token can be any
    /// target token; only the drafted ones are draft ids).
    pub markov_w1_target: Option<Vec<f32>>,
    /// Confidence head, when present.
    pub confidence: Option<ConfidenceHead>,
    /// Device copies of the Markov head's `(W1, W2)` (`[V, r]` each), uploaded on first use by
    /// the device tree-prep path ([`Drafter::markov_device`]).
    markov_dev: std::sync::OnceLock<(B::Tensor, B::Tensor)>,
    /// A reduced drafter's output layer gathered from the borrowed target lm_head, on first use.
    head_dev: std::sync::OnceLock<B::Weight>,
}

impl<B: Backend> Drafter<B> {
    /// Load a drafter and check that it fits `target`: same hidden size and vocabulary, tap
    /// layers inside the target (the last layer's raw output included, see [`super::target`]). Unknown
    /// tensors are refused.
    pub fn load(b: &B, src: &dyn TensorSource, cfg: DrafterConfig, target: &TargetConfig) -> Result<Self> {
        let p = src.path();
        if cfg.hidden != target.hidden {
            return Err(Error::config(p, "hidden_size", format!("drafter hidden size {} does not match the target's {}", cfg.hidden, target.hidden)));
        }
        if cfg.vocab != target.vocab {
            return Err(Error::config(p, "vocab_size", format!("drafter vocabulary {} does not match the target's {}", cfg.vocab, target.vocab)));
        }
        if let Some(&l) = cfg.target_layer_ids.iter().find(|&&l| l >= target.layers) {
            return Err(Error::config(
                p,
                "target_layer_ids",
                format!("layer {l} is not a layer of a {}-layer target (0..={})", target.layers, target.layers - 1),
            ));
        }
        if cfg.mask_token_id as usize >= cfg.vocab {
            return Err(Error::config(p, "mask_token_id", format!("{} is outside the vocabulary of {}", cfg.mask_token_id, cfg.vocab)));
        }
        let h = cfg.hidden;
        let d = LayerDims {
            hidden: h,
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: cfg.head_dim,
            intermediate: cfg.intermediate,
            qkv_bias: false,
            qk_norm: true,
        };
        // The layer count sizes what follows: it cannot exceed the layers the file holds.
        let present = (0..cfg.layers).take_while(|l| src.contains(&format!("layers.{l}.input_layernorm.weight"))).count();
        if present < cfg.layers {
            return Err(Error::config(
                p,
                "num_hidden_layers",
                format!("{}: the checkpoint holds only {present} layers (layers.0 … layers.{})", cfg.layers, present.saturating_sub(1)),
            ));
        }
        // A reduced draft vocabulary: the map first, it sizes the output layer and W2.
        let vocab_map = if cfg.is_reduced() {
            let (shape, ids) = src.load_ints(MAP_TENSOR)?;
            Some(DraftVocab::new(p, &shape, &ids, cfg.vocab, cfg.draft_vocab)?)
        } else {
            if src.contains(MAP_TENSOR) {
                return Err(Error::tensor(p, MAP_TENSOR, "present, but config.json gives no draft_vocab_size (a reduced drafter needs both)"));
            }
            None
        };
        let vd = cfg.draft_vocab;
        let mut known: Vec<String> =
            ["fc.weight", "hidden_norm.weight", "norm.weight", "embed_tokens.weight", "lm_head.weight", MAP_TENSOR].iter().map(|s| s.to_string()).collect();
        for l in 0..cfg.layers {
            known.extend(DecoderLayer::<B>::tensor_names(&format!("layers.{l}."), d));
        }
        if cfg.kind == DrafterKind::DSpark {
            known.extend(
                ["markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight", "confidence_head.proj.bias"]
                    .iter()
                    .map(|s| s.to_string()),
            );
        }
        if let Some(extra) = src.names().into_iter().find(|n| !known.contains(n) && !n.ends_with("rotary_emb.inv_freq")) {
            return Err(Error::tensor(p, &extra, format!("unexpected tensor for a {:?} drafter", cfg.kind)));
        }
        let n_feat = cfg.target_layer_ids.len() * target.hidden;
        let fc = load_matrix(b, src, "fc.weight", h, n_feat, Owner::Drafter)?;
        let hidden_norm = load_vector(b, src, "hidden_norm.weight", h)?;
        let layers = (0..cfg.layers).map(|l| DecoderLayer::load(b, src, &format!("layers.{l}."), d, Owner::Drafter)).collect::<Result<Vec<_>>>()?;
        let norm = load_vector(b, src, "norm.weight", h)?;
        // The input embedding covers the target vocabulary (anchors are target ids), the
        // output layer the draft vocabulary. A reduced drafter may own its output layer of
        // either kind.
        let opt = |name: &str, rows: usize| -> Result<Option<B::Weight>> {
            if (cfg.kind == DrafterKind::DSpark || (cfg.is_reduced() && name == "lm_head.weight")) && src.contains(name) {
                Ok(Some(load_matrix(b, src, name, rows, h, Owner::Drafter)?))
            } else {
                Ok(None)
            }
        };
        let embed = opt("embed_tokens.weight", cfg.vocab)?;
        let lm_head = opt("lm_head.weight", vd)?;
        let r = cfg.markov_rank;
        let (markov, markov_w1_target) = if cfg.kind == DrafterKind::DSpark && r > 0 {
            // W1 embeds the previous token (any target id), W2 projects onto the draft ids.
            let w1 = src.load_shaped("markov_head.markov_w1.weight", &[cfg.vocab, r])?.data;
            let w2 = src.load_shaped("markov_head.markov_w2.weight", &[vd, r])?.data;
            match &vocab_map {
                None => (Some(MarkovHead { vocab: cfg.vocab, rank: r, w1, w2 }), None),
                Some(m) => {
                    let w1d: Vec<f32> = m.draft_to_target().iter().flat_map(|&t| w1[t as usize * r..][..r].iter().copied()).collect();
                    (Some(MarkovHead { vocab: vd, rank: r, w1: w1d, w2 }), Some(w1))
                }
            }
        } else {
            (None, None)
        };
        let confidence = if cfg.confidence_head {
            let w = src.load_shaped("confidence_head.proj.weight", &[1, h + r])?.data;
            let bias = src.load_shaped("confidence_head.proj.bias", &[1])?.data[0];
            Some(ConfidenceHead { w, bias })
        } else {
            None
        };
        Ok(Drafter {
            cfg,
            fc,
            hidden_norm,
            layers,
            norm,
            embed,
            lm_head,
            markov,
            vocab_map,
            markov_w1_target,
            confidence,
            markov_dev: std::sync::OnceLock::new(),
            head_dev: std::sync::OnceLock::new(),
        })
    }

    /// The output layer of the draft logits, `[V_d, H]`: the drafter's own `lm_head`, else the
    /// target's, or for a reduced drafter that borrows it, the target's rows `draft_to_target`
    /// (gathered once, on first call, with [`Backend::gather_weight_rows_async`]: stored rows as
    /// they are on the CPU backend, the backend's weight precision elsewhere; in a browser a
    /// device backend's rows must have been gathered by [`Drafter::prepare_output_head_async`]).
    /// Errors: the gather's backend failure.
    pub fn output_head<'s>(&'s self, b: &B, target: &'s Target<B>) -> Result<&'s B::Weight> {
        if let Some(h) = &self.lm_head {
            return Ok(h);
        }
        let Some(m) = &self.vocab_map else { return Ok(target.lm_head()) };
        if self.head_dev.get().is_none() {
            #[cfg(not(target_arch = "wasm32"))]
            let w = b.gather_weight_rows(target.lm_head(), m.draft_to_target())?;
            // A page cannot block: a host-memory backend's gather is ready at once, a device's
            // must have been awaited by `prepare_output_head_async`.
            #[cfg(target_arch = "wasm32")]
            let w = ready_now(b.gather_weight_rows_async(target.lm_head(), m.draft_to_target()))
                .ok_or_else(|| Error::Input("drafter output layer: not gathered yet (await prepare_output_head_async first)".into()))??;
            // A concurrent first call may have won the race; either copy is identical.
            let _ = self.head_dev.set(w);
        }
        self.head_dev.get().ok_or_else(|| Error::Input("drafter output layer: gather failed".into()))
    }

    /// Gather a reduced drafter's borrowed output layer now, awaiting the read-back
    /// ([`Backend::gather_weight_rows_async`]), so that later [`Drafter::output_head`] calls never
    /// block on the device (a browser cannot). No-op when the drafter has its own `lm_head`,
    /// the full vocabulary, or the rows were gathered already. Errors: the gather's failure.
    pub async fn prepare_output_head_async(&self, b: &B, target: &Target<B>) -> Result<()> {
        if self.lm_head.is_some() || self.head_dev.get().is_some() {
            return Ok(());
        }
        let Some(m) = &self.vocab_map else { return Ok(()) };
        let w = b.gather_weight_rows_async(target.lm_head(), m.draft_to_target()).await?;
        let _ = self.head_dev.set(w);
        Ok(())
    }

    /// The draft vocabulary size V_d (the columns of the draft logits).
    pub fn draft_vocab(&self) -> usize {
        self.cfg.draft_vocab
    }

    /// The Markov head's `(W1, W2)` in draft ids as device tensors `[V_d, r]` for [`Backend::markov_table_async`]
    /// (uploaded once, on first call; `None` without a Markov head). Errors: upload failure.
    pub fn markov_device(&self, b: &B) -> Result<Option<(&B::Tensor, &B::Tensor)>> {
        let Some(m) = &self.markov else { return Ok(None) };
        if self.markov_dev.get().is_none() {
            let w1 = b.upload(&m.w1, m.vocab, m.rank)?;
            let w2 = b.upload(&m.w2, m.vocab, m.rank)?;
            // A concurrent first call may have won the race; either copy is identical.
            let _ = self.markov_dev.set((w1, w2));
        }
        Ok(self.markov_dev.get().map(|(a, c)| (a, c)))
    }

    /// A draft KV cache of `capacity` rows.
    pub fn new_cache(&self, b: &B, capacity: usize) -> Result<KvCache<B>> {
        KvCache::new(b, self.cfg.layers, capacity, self.cfg.n_kv_heads, self.cfg.head_dim)
    }

    /// Block rows a forward for `depth` depths runs: the rows whose outputs the tree can use
    /// (DSpark slots `0..depth`, DFlash slots `1..=depth`), at least [`MIN_BLOCK_ROWS`], at
    /// most the trained block size. The drafter was trained on full blocks; dropping the
    /// trailing mask rows the round cannot use changes what the kept rows attend to, but
    /// measured on SmolLM2 (BENCHMARKS.md §20) acceptance moves by ≤ 0.02 tokens per round
    /// while the forward costs about half. Exactness does not depend on it (the target
    /// verifies every drafted token).
    pub fn block_rows(&self, depth: usize) -> usize {
        let c = &self.cfg;
        let depth = depth.clamp(1, c.draft_depth());
        let need = match c.kind {
            DrafterKind::DFlash => depth + 1,
            DrafterKind::DSpark => depth,
        };
        need.max(MIN_BLOCK_ROWS).min(c.block_size)
    }

    /// One drafter forward (§2.4 / §3.5) of one [`DraftJob`]. `job.taps` holds the target's
    /// tapped-layer features `[Lc, n_taps*H]` of the committed tokens at positions
    /// `cache.len .. root_pos` (so `Lc = root_pos - cache.len`); the block is `[anchor, mask × (Bk-1)]` at positions `root_pos ..`, `Bk` =
    /// [`Drafter::block_rows`]`(depth)` (the trained block size when `depth` is the full draft
    /// depth). Returns the draft
    /// logits `[depth, V_d]` (columns are draft ids, = target ids without a reduced vocabulary)
    /// of the first `depth` depths, `depth` clamped to `1 ..= draft_depth()`: DFlash rows for
    /// positions `root_pos+1 ..` (in-place slots 1..Bk), DSpark rows for `root_pos+1 ..`
    /// (shifted). A tree of `B` nodes is at most `B` deep, so the decode loop asks for
    /// `min(draft_depth, B)` rows and the output layer (a third of the drafter's cost at V_d
    /// = 8 192) runs only for those. The cache ends at `root_pos` (block K/V are discarded).
    pub fn draft(&self, b: &B, target: &Target<B>, job: DraftJob<'_, B>) -> Result<B::Tensor> {
        Ok(self.draft_rows(b, target, job)?.0)
    }

    /// [`Drafter::draft`], also returning the final-normed hidden rows `[depth, H]` the logits
    /// were projected from (the confidence head's input, [`ConfidenceHead::slot_terms`]).
    /// Errors: as [`Drafter::draft`].
    pub fn draft_rows(&self, b: &B, target: &Target<B>, job: DraftJob<'_, B>) -> Result<(B::Tensor, B::Tensor)> {
        let mut job = [job];
        self.forward_jobs(b, target, &mut job)?.pop().ok_or_else(|| Error::Input("drafter forward returned no output".into()))
    }

    /// Several sequences' drafter forwards packed into ONE (batch decoding): every matmul, norm
    /// and RoPE runs once over all jobs' rows (their context rows, then their blocks), the
    /// context-and-block K/V of job `i` go to `jobs[i].cache` only, and attention runs ragged
    /// ([`Backend::attention_ragged`], each block over its own draft cache). Every backend op
    /// computes a row independently of the others in its call, so job `i`'s logits are
    /// bit-identical to [`Drafter::draft_rows`] on that job alone. Returns each job's draft
    /// logits `[depth_i, V_d]` and final-normed hidden rows `[depth_i, H]` in job order (none
    /// for no jobs). Errors: as [`Drafter::draft`]; a misplaced context or a full draft cache
    /// names the job (checked for every job before any cache changes).
    pub fn draft_batch(&self, b: &B, target: &Target<B>, jobs: &mut [DraftJob<'_, B>]) -> Result<Vec<(B::Tensor, B::Tensor)>> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        self.forward_jobs(b, target, jobs)
    }

    /// The forward behind [`Drafter::draft_rows`] (one job) and [`Drafter::draft_batch`]:
    /// `(logits, final-normed hidden rows)` per job (at least one). Errors: as
    /// [`Drafter::draft_batch`].
    fn forward_jobs(&self, b: &B, target: &Target<B>, jobs: &mut [DraftJob<'_, B>]) -> Result<Vec<(B::Tensor, B::Tensor)>> {
        let single = jobs.len() == 1;
        let c = &self.cfg;
        let (mut ids, mut ctx_pos, mut block_pos) = (Vec::new(), Vec::new(), Vec::new());
        let (mut lcs, mut bks, mut starts) = (Vec::with_capacity(jobs.len()), Vec::with_capacity(jobs.len()), Vec::with_capacity(jobs.len()));
        for (i, j) in jobs.iter_mut().enumerate() {
            let lc = b.shape(j.taps).0;
            if j.cache.len + lc != j.root_pos {
                return Err(Error::Input(format!(
                    "drafter job {i}: the taps cover positions {}..{} but must cover exactly {}..{} (the draft cache's length up to the root)",
                    j.cache.len,
                    j.cache.len + lc,
                    j.cache.len,
                    j.root_pos
                )));
            }
            let bk = self.block_rows(j.depth);
            j.cache.ensure_room(lc + bk).map_err(|e| Error::Input(format!("drafter job {i}: {e}")))?;
            ctx_pos.extend((j.cache.len..j.root_pos).map(|p| p as u32));
            block_pos.extend((j.root_pos..j.root_pos + bk).map(|p| p as u32));
            ids.push(j.anchor);
            ids.extend(std::iter::repeat_n(c.mask_token_id, bk - 1));
            starts.push(j.cache.len);
            lcs.push(lc);
            bks.push(bk);
        }
        // The packed K/V input is [every job's context rows ; every job's block rows]; job i's
        // cache rows are its context rows, then its block rows.
        let n_ctx: usize = lcs.iter().sum();
        let all_pos: Vec<u32> = ctx_pos.iter().chain(&block_pos).copied().collect();
        let (mut c0, mut b0) = (0, n_ctx);
        let kv_rows: Vec<Vec<usize>> = lcs
            .iter()
            .zip(&bks)
            .map(|(&lc, &bk)| {
                let r: Vec<usize> = (c0..c0 + lc).chain(b0..b0 + bk).collect();
                (c0, b0) = (c0 + lc, b0 + bk);
                r
            })
            .collect();
        let embed = self.embed.as_ref().unwrap_or(&target.embed);
        let mut x = b.embedding(embed, &ids)?;
        let ctx_h = if n_ctx > 0 {
            let parts: Vec<&B::Tensor> = jobs.iter().zip(&lcs).filter(|(_, &lc)| lc > 0).map(|(j, _)| j.taps).collect();
            let taps = b.concat_rows(&parts)?;
            let f = b.matmul(&taps, &self.fc, None)?;
            Some(b.rms_norm(&f, &self.hidden_norm, c.hidden, c.rms_eps)?)
        } else {
            None
        };
        let shape = AttnShape { n_heads: c.n_heads, n_kv_heads: c.n_kv_heads, head_dim: c.head_dim };
        for (li, layer) in self.layers.iter().enumerate() {
            let y = b.rms_norm(&x, &layer.attn_norm, c.hidden, c.rms_eps)?;
            let q = layer.project_q(b, &y, &block_pos, c.head_dim, c.rms_eps, c.rope_theta)?;
            let kv_in = match &ctx_h {
                Some(ch) => b.concat_rows(&[ch, &y])?,
                None => b.concat_rows(&[&y])?,
            };
            let (k, v) = layer.project_kv(b, &kv_in, &all_pos, c.head_dim, c.rms_eps, c.rope_theta)?;
            for ((j, rows), &start) in jobs.iter_mut().zip(&kv_rows).zip(&starts) {
                if single {
                    b.write_rows(&mut j.cache.k[li], start, &k)?;
                    b.write_rows(&mut j.cache.v[li], start, &v)?;
                } else {
                    b.write_rows(&mut j.cache.k[li], start, &b.gather_rows(&k, rows)?)?;
                    b.write_rows(&mut j.cache.v[li], start, &b.gather_rows(&v, rows)?)?;
                }
            }
            let ragged: Vec<RaggedSeq<'_, B::Tensor>> = jobs
                .iter()
                .zip(&bks)
                .map(|(j, &bk)| RaggedSeq { k_cache: &j.cache.k[li], v_cache: &j.cache.v[li], kv_len: j.root_pos + bk, q_rows: bk, mask: AttnMask::Full })
                .collect();
            let a = b.attention_ragged(&q, &ragged, shape)?;
            drop(ragged);
            layer.finish(b, &mut x, &a, c.rms_eps)?;
        }
        // Keep the context rows, crop the blocks (§2.5); each job's logit rows as in `draft`.
        let mut rows = Vec::new();
        let mut spans = Vec::with_capacity(jobs.len());
        let mut r0 = 0;
        for (j, &bk) in jobs.iter_mut().zip(&bks) {
            j.cache.len = j.root_pos;
            let depth = j.depth.clamp(1, c.draft_depth());
            let first = rows.len();
            match c.kind {
                DrafterKind::DFlash => rows.extend(r0 + 1..=r0 + depth),
                DrafterKind::DSpark => rows.extend(r0..r0 + depth),
            }
            spans.push(first..rows.len());
            r0 += bk;
        }
        let out = b.gather_rows(&x, &rows)?;
        let out = b.rms_norm(&out, &self.norm, c.hidden, c.rms_eps)?;
        let logits = b.matmul(&out, self.output_head(b, target)?, None)?;
        if single {
            return Ok(vec![(logits, out)]);
        }
        spans
            .into_iter()
            .map(|r| {
                let r: Vec<usize> = r.collect();
                Ok((b.gather_rows(&logits, &r)?, b.gather_rows(&out, &r)?))
            })
            .collect()
    }

    /// The Markov head's `W1` row of target id `t` (`[r]`; `None` without a Markov head or for
    /// an id outside the target vocabulary): the stored target-indexed table of a reduced
    /// drafter, else the head's own rows (draft ids are target ids).
    pub fn markov_row(&self, t: u32) -> Option<&[f32]> {
        let m = self.markov.as_ref()?;
        let w1 = self.markov_w1_target.as_deref().unwrap_or(&m.w1);
        w1.get(t as usize * m.rank..(t as usize + 1) * m.rank)
    }
}

/// The output of `f` if it is ready on its first poll (a host-memory backend's read-back), else
/// `None`: the browser's stand-in for blocking, which a page cannot do.
#[cfg(target_arch = "wasm32")]
fn ready_now<F: std::future::Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    match std::future::Future::poll(f.as_mut(), &mut std::task::Context::from_waker(std::task::Waker::noop())) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    fn sigmoid(x: f64) -> f64 {
        1.0 / (1.0 + (-x).exp())
    }

    /// Slot terms are `w[..H]·h + b` per row; a node's confidence is its parent's times the
    /// sigmoid of its depth's slot term plus `w[H..]·W1[parent token]` (hand-computed, H = 2,
    /// r = 1, a root with two children and a grandchild).
    #[test]
    fn path_confidence_multiplies_the_slot_rates_along_the_path() {
        let head = ConfidenceHead { w: vec![0.5, -1.0, 2.0], bias: 0.25 };
        let hidden = [1.0f32, 2.0, -1.0, 0.5];
        let slot = head.slot_terms(&hidden, 2).unwrap();
        assert_eq!(slot, vec![0.5 - 2.0 + 0.25, -0.5 - 0.5 + 0.25]);
        // root 7 → {8, 9}; 8 → 10.
        let tree = DraftTree { tokens: vec![7, 8, 9, 10], parents: vec![sparkling_core::NO_PARENT, 0, 0, 1], depths: vec![0, 1, 1, 2], scores: vec![0.0; 4] };
        let w1 = |t: u32| -> Option<&'static [f32]> {
            match t {
                7 => Some(&[0.5]),
                8 => Some(&[-1.0]),
                _ => None,
            }
        };
        let c = head.path_confidence(&tree, &slot, 2, w1);
        let c1 = sigmoid(slot[0] + 2.0 * 0.5);
        let c3 = c1 * sigmoid(slot[1] - 2.0); // w[H..] = 2, W1[8] = -1
        assert_eq!(c.len(), 4);
        assert_eq!(c[0], 1.0);
        assert!((c[1] - c1).abs() < 1e-12 && (c[2] - c1).abs() < 1e-12, "{c:?}");
        assert!((c[3] - c3).abs() < 1e-12, "{c:?}");
        // A node deeper than the slots reuses the last slot's term.
        let deep = DraftTree { tokens: vec![7, 8, 11, 12], parents: vec![sparkling_core::NO_PARENT, 0, 1, 2], depths: vec![0, 1, 2, 3], scores: vec![0.0; 4] };
        let c = head.path_confidence(&deep, &slot, 2, w1);
        assert!((c[3] - c[2] * sigmoid(slot[1])).abs() < 1e-12, "{c:?}");
        assert!(head.slot_terms(&[1.0, 2.0, 3.0], 2).unwrap_err().to_string().contains("not rows of 2"));
    }
}
