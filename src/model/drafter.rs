//! Block-diffusion drafters: z-lab DFlash (reference §2.4) and DeepSpec DSpark (§3.5) share
//! one backbone: target taps → `hidden_norm(fc(taps))` injected as extra K/V rows into every
//! layer, non-causal attention over [draft cache ; context ; block], draft cache cropped back to
//! the root position after each call (§2.5).

use super::config::{DrafterConfig, DrafterKind, TargetConfig};
use super::layer::{load_matrix, load_vector, DecoderLayer, KvCache, LayerDims};
use super::target::Target;
use crate::error::{Error, Result};
use crate::loader::TensorSource;
use crate::tree::MarkovHead;
use sparkling_core::{AttnMask, AttnShape, Backend};

/// The DSpark confidence head (§3.8): `sigmoid(w·[h_k ; W1[t_{k-1}]] + b)`. Loaded and checked;
/// the decode loop does not schedule on it (fixed blocks, as the offline benchmarks do).
pub struct ConfidenceHead {
    /// `confidence_head.proj.weight` flattened, length `H + r`.
    pub w: Vec<f32>,
    /// `confidence_head.proj.bias`.
    pub bias: f32,
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
    /// Own `lm_head.weight` (DSpark); `None` borrows the target's.
    pub lm_head: Option<B::Weight>,
    /// Markov head (DSpark with `markov_rank > 0`), kept on the host for the tree builders.
    pub markov: Option<MarkovHead>,
    /// Confidence head, when present.
    pub confidence: Option<ConfidenceHead>,
    /// Device copies of the Markov head's `(W1, W2)` (`[V, r]` each), uploaded on first use by
    /// the device tree-prep path ([`Drafter::markov_device`]).
    markov_dev: std::sync::OnceLock<(B::Tensor, B::Tensor)>,
}

impl<B: Backend> Drafter<B> {
    /// Load a drafter and check that it fits `target`: same hidden size and vocabulary, tap
    /// layers inside the target and not its last layer. Unknown tensors are refused.
    pub fn load(b: &B, src: &dyn TensorSource, cfg: DrafterConfig, target: &TargetConfig) -> Result<Self> {
        let p = src.path();
        if cfg.hidden != target.hidden {
            return Err(Error::config(p, "hidden_size", format!("drafter hidden size {} does not match the target's {}", cfg.hidden, target.hidden)));
        }
        if cfg.vocab != target.vocab {
            return Err(Error::config(p, "vocab_size", format!("drafter vocabulary {} does not match the target's {}", cfg.vocab, target.vocab)));
        }
        if let Some(&l) = cfg.target_layer_ids.iter().find(|&&l| l + 1 >= target.layers) {
            return Err(Error::config(p, "target_layer_ids", format!("layer {l} is not a tappable layer of a {}-layer target (0..{})", target.layers, target.layers - 1)));
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
            return Err(Error::config(p, "num_hidden_layers", format!("{}: the checkpoint holds only {present} layers (layers.0 … layers.{})", cfg.layers, present.saturating_sub(1))));
        }
        let mut known: Vec<String> = ["fc.weight", "hidden_norm.weight", "norm.weight", "embed_tokens.weight", "lm_head.weight"]
            .iter()
            .map(|s| s.to_string())
            .collect();
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
        let fc = load_matrix(b, src, "fc.weight", h, n_feat)?;
        let hidden_norm = load_vector(b, src, "hidden_norm.weight", h)?;
        let layers = (0..cfg.layers).map(|l| DecoderLayer::load(b, src, &format!("layers.{l}."), d)).collect::<Result<Vec<_>>>()?;
        let norm = load_vector(b, src, "norm.weight", h)?;
        let opt = |name: &str| -> Result<Option<B::Weight>> {
            if cfg.kind == DrafterKind::DSpark && src.contains(name) {
                Ok(Some(load_matrix(b, src, name, cfg.vocab, h)?))
            } else {
                Ok(None)
            }
        };
        let embed = opt("embed_tokens.weight")?;
        let lm_head = opt("lm_head.weight")?;
        let r = cfg.markov_rank;
        let markov = if cfg.kind == DrafterKind::DSpark && r > 0 {
            let w1 = src.load_shaped("markov_head.markov_w1.weight", &[cfg.vocab, r])?.data;
            let w2 = src.load_shaped("markov_head.markov_w2.weight", &[cfg.vocab, r])?.data;
            Some(MarkovHead { vocab: cfg.vocab, rank: r, w1, w2 })
        } else {
            None
        };
        let confidence = if cfg.confidence_head {
            let w = src.load_shaped("confidence_head.proj.weight", &[1, h + r])?.data;
            let bias = src.load_shaped("confidence_head.proj.bias", &[1])?.data[0];
            Some(ConfidenceHead { w, bias })
        } else {
            None
        };
        Ok(Drafter { cfg, fc, hidden_norm, layers, norm, embed, lm_head, markov, confidence, markov_dev: std::sync::OnceLock::new() })
    }

    /// The Markov head's `(W1, W2)` as device tensors `[V, r]` for [`Backend::markov_table`]
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
        KvCache::new(b, self.cfg.layers, capacity, self.cfg.n_kv_heads * self.cfg.head_dim)
    }

    /// One drafter forward (§2.4 / §3.5). `taps` holds the target's tapped-layer features
    /// `[Lc, n_taps*H]` of the committed tokens at positions `cache.len .. root_pos` (so `Lc = root_pos - cache.len`);
    /// the block is `[anchor, mask × (Bk-1)]` at positions `root_pos ..`. Returns the draft
    /// logits `[depth, V]`: DFlash rows for positions `root_pos+1 ..= root_pos+Bk-1` (in-place
    /// slots 1..Bk), DSpark rows for `root_pos+1 ..= root_pos+Bk` (shifted). The cache ends at
    /// `root_pos` (block K/V are discarded).
    pub fn draft(
        &self,
        b: &B,
        target: &Target<B>,
        cache: &mut KvCache<B>,
        taps: &B::Tensor,
        anchor: u32,
        root_pos: usize,
    ) -> Result<B::Tensor> {
        let c = &self.cfg;
        let lc = b.shape(taps).0;
        if cache.len + lc != root_pos {
            return Err(Error::Input(format!(
                "drafter context covers positions {}..{} but the root is at {root_pos}",
                cache.len,
                cache.len + lc
            )));
        }
        let bk = c.block_size;
        cache.ensure_room(lc + bk)?;
        let start = cache.len;
        let ctx_pos: Vec<u32> = (start..root_pos).map(|p| p as u32).collect();
        let block_pos: Vec<u32> = (root_pos..root_pos + bk).map(|p| p as u32).collect();
        let all_pos: Vec<u32> = ctx_pos.iter().chain(&block_pos).copied().collect();
        let mut ids = vec![c.mask_token_id; bk];
        ids[0] = anchor;
        let embed = self.embed.as_ref().unwrap_or(&target.embed);
        let mut x = b.embedding(embed, &ids)?;
        let ctx_h = if lc > 0 {
            let f = b.matmul(taps, &self.fc, None)?;
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
            b.write_rows(&mut cache.k[li], start, &k)?;
            b.write_rows(&mut cache.v[li], start, &v)?;
            let a = b.attention(&q, &cache.k[li], &cache.v[li], root_pos + bk, shape, AttnMask::Full)?;
            layer.finish(b, &mut x, &a, c.rms_eps)?;
        }
        // Keep the context rows, crop the block (§2.5).
        cache.len = root_pos;
        let rows: Vec<usize> = match c.kind {
            DrafterKind::DFlash => (1..bk).collect(),
            DrafterKind::DSpark => (0..bk).collect(),
        };
        let out = b.gather_rows(&x, &rows)?;
        let out = b.rms_norm(&out, &self.norm, c.hidden, c.rms_eps)?;
        let head = self.lm_head.as_ref().unwrap_or_else(|| target.lm_head());
        Ok(b.matmul(&out, head, None)?)
    }
}
