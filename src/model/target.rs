//! The target decoder (reference §1.3) with KV cache, explicit positions, tree attention and
//! hidden-state taps (§1.4: raw residual outputs of the listed layers, never the final-normed
//! state).

use super::config::TargetConfig;
use super::layer::{load_matrix, load_vector, DecoderLayer, KvCache, LayerDims};
use crate::error::{Error, Result};
use crate::loader::TensorSource;
use sparkling_core::{AttnMask, AttnShape, Backend};

/// Which rows of a forward need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitRows {
    /// Every input row (verify).
    All,
    /// Only the last row (prefill).
    Last,
}

/// Output of [`Target::forward`].
pub struct TargetOutput<B: Backend> {
    /// Logits `[rows, V]` for the requested rows.
    pub logits: B::Tensor,
    /// Concatenated taps `[T, n_taps*H]` in the listed layer order, when taps were requested.
    pub taps: Option<B::Tensor>,
}

/// A loaded target model.
pub struct Target<B: Backend> {
    /// Geometry.
    pub cfg: TargetConfig,
    /// `model.embed_tokens.weight` `[V, H]`.
    pub embed: B::Weight,
    /// `lm_head.weight` `[V, H]`, `None` when tied to `embed`.
    pub lm_head: Option<B::Weight>,
    /// Decoder layers.
    pub layers: Vec<DecoderLayer<B>>,
    /// `model.norm.weight` `[1, H]`.
    pub norm: B::Tensor,
}

impl<B: Backend> Target<B> {
    /// Load every tensor of `cfg` from `src` (HF names). Missing tensors and shape mismatches are
    /// errors naming the tensor; tensors the model does not use are refused too.
    pub fn load(b: &B, src: &dyn TensorSource, cfg: TargetConfig, progress: &dyn Fn(usize, usize)) -> Result<Self> {
        let d = LayerDims {
            hidden: cfg.hidden,
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: cfg.head_dim,
            intermediate: cfg.intermediate,
            qkv_bias: cfg.qkv_bias,
            qk_norm: cfg.qk_norm,
        };
        // The layer count sizes what follows: it cannot exceed the layers the file holds.
        let present = (0..cfg.layers).take_while(|i| src.contains(&format!("model.layers.{i}.input_layernorm.weight"))).count();
        if present < cfg.layers {
            return Err(Error::config(
                src.path(),
                "num_hidden_layers",
                format!("{}: the checkpoint holds only {present} layers (model.layers.0 … model.layers.{})", cfg.layers, present.saturating_sub(1)),
            ));
        }
        let mut known: Vec<String> = vec!["model.embed_tokens.weight".into(), "model.norm.weight".into(), "lm_head.weight".into()];
        for i in 0..cfg.layers {
            known.extend(DecoderLayer::<B>::tensor_names(&format!("model.layers.{i}."), d));
        }
        if let Some(extra) = src.names().into_iter().find(|n| !known.contains(n) && !n.ends_with("rotary_emb.inv_freq")) {
            return Err(Error::tensor(src.path(), &extra, format!("unexpected tensor for a {} target of {} layers", cfg.arch.name(), cfg.layers)));
        }
        let total = cfg.layers + 2;
        progress(0, total);
        let embed = load_matrix(b, src, "model.embed_tokens.weight", cfg.vocab, cfg.hidden)?;
        let lm_head = if src.contains("lm_head.weight") {
            Some(load_matrix(b, src, "lm_head.weight", cfg.vocab, cfg.hidden)?)
        } else if cfg.tie_embeddings {
            None
        } else {
            return Err(Error::tensor(src.path(), "lm_head.weight", "missing and tie_word_embeddings is false"));
        };
        progress(1, total);
        let mut layers = Vec::with_capacity(cfg.layers);
        for i in 0..cfg.layers {
            layers.push(DecoderLayer::load(b, src, &format!("model.layers.{i}."), d)?);
            progress(2 + i, total);
        }
        let norm = load_vector(b, src, "model.norm.weight", cfg.hidden)?;
        progress(total, total);
        Ok(Target { cfg, embed, lm_head, layers, norm })
    }

    /// A KV cache of `capacity` rows for this model.
    pub fn new_cache(&self, b: &B, capacity: usize) -> Result<KvCache<B>> {
        KvCache::new(b, self.cfg.layers, capacity, self.cfg.n_kv_heads * self.cfg.head_dim)
    }

    /// The matmul kernel paths this target's weights run on ([`Backend::weight_kernel`]), each
    /// with its number of matrices, e.g. `avx2 int8 (maddubs), q4_1 weights ×210`.
    pub fn kernel_paths(&self, b: &B) -> String {
        let mut counts: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
        let mut add = |w: &B::Weight| *counts.entry(b.weight_kernel(w)).or_default() += 1;
        for l in &self.layers {
            for w in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
                add(w);
            }
        }
        add(self.lm_head());
        counts.iter().map(|(k, n)| format!("{k} ×{n}")).collect::<Vec<_>>().join("; ")
    }

    /// The lm_head weight (the embedding when tied).
    pub fn lm_head(&self) -> &B::Weight {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Run `ids` at `positions` on top of the cache (their K/V are appended at rows
    /// `cache.len..`), with `mask` over the new block; returns logits for `rows` and, if `taps`
    /// is non-empty, the raw outputs of those layers concatenated in the listed order.
    /// Errors: empty input, length mismatch, cache overflow, a tap at the last layer.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        b: &B,
        cache: &mut KvCache<B>,
        ids: &[u32],
        positions: &[u32],
        mask: AttnMask<'_>,
        rows: LogitRows,
        taps: &[usize],
    ) -> Result<TargetOutput<B>> {
        let c = &self.cfg;
        if ids.is_empty() || ids.len() != positions.len() {
            return Err(Error::Input(format!("target forward: {} ids with {} positions", ids.len(), positions.len())));
        }
        if let Some(&bad) = taps.iter().find(|&&l| l + 1 >= c.layers) {
            return Err(Error::Input(format!("tap layer {bad} invalid for a {}-layer target (never tap the last layer, reference §7.3)", c.layers)));
        }
        cache.ensure_room(ids.len())?;
        let t = ids.len();
        let start = cache.len;
        let shape = AttnShape { n_heads: c.n_heads, n_kv_heads: c.n_kv_heads, head_dim: c.head_dim };
        let mut h = b.embedding(&self.embed, ids)?;
        let mut tapped: Vec<Option<B::Tensor>> = (0..taps.len()).map(|_| None).collect();
        for (li, layer) in self.layers.iter().enumerate() {
            let x = b.rms_norm(&h, &layer.attn_norm, c.hidden, c.rms_eps)?;
            let q = layer.project_q(b, &x, positions, c.head_dim, c.rms_eps, c.rope_theta)?;
            let (k, v) = layer.project_kv(b, &x, positions, c.head_dim, c.rms_eps, c.rope_theta)?;
            b.write_rows(&mut cache.k[li], start, &k)?;
            b.write_rows(&mut cache.v[li], start, &v)?;
            let a = b.attention(&q, &cache.k[li], &cache.v[li], start + t, shape, mask)?;
            layer.finish(b, &mut h, &a, c.rms_eps)?;
            for (slot, &tl) in tapped.iter_mut().zip(taps) {
                if tl == li {
                    *slot = Some(b.concat_cols(&[&h])?);
                }
            }
        }
        cache.len = start + t;
        let taps_out = if taps.is_empty() {
            None
        } else {
            let parts: Vec<&B::Tensor> = tapped.iter().map(|x| x.as_ref().expect("every tap layer < layers was visited")).collect();
            Some(b.concat_cols(&parts)?)
        };
        let h = match rows {
            LogitRows::All => h,
            LogitRows::Last => b.gather_rows(&h, &[t - 1])?,
        };
        let hn = b.rms_norm(&h, &self.norm, c.hidden, c.rms_eps)?;
        let logits = b.matmul(&hn, self.lm_head(), None)?;
        Ok(TargetOutput { logits, taps: taps_out })
    }
}
