//! The target decoder (reference §1.3) with KV cache, explicit positions, tree attention and
//! hidden-state taps (§1.4: raw residual outputs of the listed layers, never the final-normed
//! state). Every layer can be tapped, the last one included: its tap is the raw residual stream
//! before the final norm. (Reference §7.3 forbids the last layer for HF-trained drafters, whose
//! `hidden_states[-1]` is the *normed* state; a drafter trained on this engine's taps reads the
//! same raw output the trainer saw.)

use super::config::TargetConfig;
use super::layer::{load_matrix, load_vector, DecoderLayer, KvCache, LayerDims, Owner};
use crate::error::{Error, Result};
use crate::loader::TensorSource;
use sparkling_core::{AttnMask, AttnShape, Backend, RaggedSeq};
use std::ops::Range;

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

/// One sequence's block in [`Target::forward_batch`]: the tokens it feeds this forward, their
/// absolute positions, the mask over the block (causal for a prefill or an `ar` step, a tree for
/// a speculative verify) and which of its rows need logits (`None`: none, e.g. a row fed only
/// for its taps).
#[derive(Debug, Clone, Copy)]
pub struct SeqInput<'a> {
    /// Token ids fed (≥ 1).
    pub ids: &'a [u32],
    /// Absolute position of each id.
    pub positions: &'a [u32],
    /// Mask over this block (its prefix, the sequence's cache, is always visible).
    pub mask: AttnMask<'a>,
    /// Rows that need logits.
    pub logits: Option<LogitRows>,
}

/// Output of [`Target::forward_batch`].
pub struct BatchOutput<B: Backend> {
    /// Logits of the requested rows, sequences back to back (`None` when no row asked).
    pub logits: Option<B::Tensor>,
    /// Rows of `logits` per sequence (empty when it asked for none).
    pub logit_rows: Vec<Range<usize>>,
    /// Taps `[Σ input rows, n_taps*H]` of every fed row, when taps were requested.
    pub taps: Option<B::Tensor>,
    /// Rows of the packed input (and of `taps`) per sequence.
    pub input_rows: Vec<Range<usize>>,
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
            return Err(Error::tensor(
                src.path(),
                &src.file_name(&extra),
                format!("unexpected tensor for a {} target of {} layers", cfg.arch.name(), cfg.layers),
            ));
        }
        let total = cfg.layers + 2;
        progress(0, total);
        let embed = load_matrix(b, src, "model.embed_tokens.weight", cfg.vocab, cfg.hidden, Owner::Target)?;
        let lm_head = if src.contains("lm_head.weight") {
            Some(load_matrix(b, src, "lm_head.weight", cfg.vocab, cfg.hidden, Owner::Target)?)
        } else if cfg.tie_embeddings {
            None
        } else {
            return Err(Error::tensor(src.path(), &src.file_name("lm_head.weight"), "missing and tie_word_embeddings is false"));
        };
        progress(1, total);
        let mut layers = Vec::with_capacity(cfg.layers);
        for i in 0..cfg.layers {
            layers.push(DecoderLayer::load(b, src, &format!("model.layers.{i}."), d, Owner::Target)?);
            progress(2 + i, total);
        }
        let norm = load_vector(b, src, "model.norm.weight", cfg.hidden)?;
        progress(total, total);
        Ok(Target { cfg, embed, lm_head, layers, norm })
    }

    /// A KV cache of `capacity` rows for this model.
    pub fn new_cache(&self, b: &B, capacity: usize) -> Result<KvCache<B>> {
        KvCache::new(b, self.cfg.layers, capacity, self.cfg.n_kv_heads, self.cfg.head_dim)
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

    /// Bytes of the weights one decode step reads, as stored on `b` ([`Backend::weight_bytes`]:
    /// quantized blocks, f16 or f32 values): every layer matrix and the lm_head (the
    /// embedding's one row is left out).
    pub fn decode_weight_bytes(&self, b: &B) -> u64 {
        let layers: usize = self.layers.iter().flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]).map(|w| b.weight_bytes(w)).sum();
        (layers + b.weight_bytes(self.lm_head())) as u64
    }

    /// The lm_head weight (the embedding when tied).
    pub fn lm_head(&self) -> &B::Weight {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Run `seq.ids` at `seq.positions` on top of the cache (their K/V are appended at rows
    /// `cache.len..`), with `seq.mask` over the new block; returns logits for the rows
    /// `seq.logits` names and, if `taps` is non-empty, the raw outputs of those layers
    /// concatenated in the listed order. A batch of one [`Target::forward_batch`] (the model's
    /// one layer loop).
    /// Errors: empty input, length mismatch, cache overflow, a tap layer ≥ the layer count, no logits
    /// rows asked (`seq.logits == None`).
    pub fn forward(&self, b: &B, cache: &mut KvCache<B>, seq: SeqInput<'_>, taps: &[usize]) -> Result<TargetOutput<B>> {
        let out = self.forward_batch(b, &mut [cache], &[seq], taps)?;
        let logits = out.logits.ok_or_else(|| Error::Input("target forward: no logits row".into()))?;
        Ok(TargetOutput { logits, taps: out.taps })
    }

    /// Several sequences in ONE forward (batch decoding): the blocks of `seqs` are packed row
    /// after row, every matmul, norm and RoPE runs once over all rows, and attention runs ragged
    /// ([`Backend::attention_ragged`]), sequence `s` against `caches[s]` only (its K/V appended
    /// at rows `caches[s].len..`). Since every backend op computes a row independently of the
    /// others in its call, each sequence's logits and taps are bit-identical to a forward of
    /// that sequence alone.
    /// Errors: a count mismatch between `caches` and `seqs`, an empty block, ids/positions of
    /// different lengths, a cache overflow, a tap layer ≥ the layer count; backend failures.
    pub fn forward_batch(&self, b: &B, caches: &mut [&mut KvCache<B>], seqs: &[SeqInput<'_>], taps: &[usize]) -> Result<BatchOutput<B>> {
        let c = &self.cfg;
        if seqs.is_empty() || caches.len() != seqs.len() {
            return Err(Error::Input(format!("batch forward: {} sequences with {} caches", seqs.len(), caches.len())));
        }
        if let Some(&bad) = taps.iter().find(|&&l| l >= c.layers) {
            return Err(Error::Input(format!("tap layer {bad} invalid for a {}-layer target (layers 0..{})", c.layers, c.layers - 1)));
        }
        let mut input_rows = Vec::with_capacity(seqs.len());
        let mut ids = Vec::new();
        let mut positions = Vec::new();
        for (s, cache) in seqs.iter().zip(caches.iter()) {
            if s.ids.is_empty() || s.ids.len() != s.positions.len() {
                return Err(Error::Input(format!("batch forward: a sequence with {} ids and {} positions", s.ids.len(), s.positions.len())));
            }
            cache.ensure_room(s.ids.len())?;
            input_rows.push(ids.len()..ids.len() + s.ids.len());
            ids.extend_from_slice(s.ids);
            positions.extend_from_slice(s.positions);
        }
        let starts: Vec<usize> = caches.iter().map(|c| c.len).collect();
        let shape = AttnShape { n_heads: c.n_heads, n_kv_heads: c.n_kv_heads, head_dim: c.head_dim };
        let single = seqs.len() == 1;
        let mut h = b.embedding(&self.embed, &ids)?;
        let mut tapped: Vec<Option<B::Tensor>> = (0..taps.len()).map(|_| None).collect();
        for (li, layer) in self.layers.iter().enumerate() {
            let x = b.rms_norm(&h, &layer.attn_norm, c.hidden, c.rms_eps)?;
            let (q, k, v) = layer.project_qkv(b, &x, &positions, c.head_dim, c.rms_eps, c.rope_theta)?;
            for ((cache, rows), &start) in caches.iter_mut().zip(&input_rows).zip(&starts) {
                if single {
                    b.write_rows(&mut cache.k[li], start, &k)?;
                    b.write_rows(&mut cache.v[li], start, &v)?;
                } else {
                    let idx: Vec<usize> = rows.clone().collect();
                    b.write_rows(&mut cache.k[li], start, &b.gather_rows(&k, &idx)?)?;
                    b.write_rows(&mut cache.v[li], start, &b.gather_rows(&v, &idx)?)?;
                }
            }
            let ragged: Vec<RaggedSeq<'_, B::Tensor>> = caches
                .iter()
                .zip(seqs)
                .zip(&starts)
                .map(|((cache, s), &start)| RaggedSeq {
                    k_cache: &cache.k[li],
                    v_cache: &cache.v[li],
                    kv_len: start + s.ids.len(),
                    q_rows: s.ids.len(),
                    mask: s.mask,
                })
                .collect();
            let a = b.attention_ragged(&q, &ragged, shape)?;
            drop(ragged);
            layer.finish(b, &mut h, &a, c.rms_eps)?;
            for (slot, &tl) in tapped.iter_mut().zip(taps) {
                if tl == li {
                    *slot = Some(b.concat_cols(&[&h])?);
                }
            }
        }
        for ((cache, s), &start) in caches.iter_mut().zip(seqs).zip(&starts) {
            cache.len = start + s.ids.len();
        }
        let taps_out = if taps.is_empty() {
            None
        } else {
            let parts: Vec<&B::Tensor> = tapped.iter().map(|x| x.as_ref().expect("every tap layer < layers was visited")).collect();
            Some(b.concat_cols(&parts)?)
        };
        let mut wanted: Vec<usize> = Vec::new();
        let mut logit_rows = Vec::with_capacity(seqs.len());
        for (s, rows) in seqs.iter().zip(&input_rows) {
            let r0 = wanted.len();
            match s.logits {
                Some(LogitRows::All) => wanted.extend(rows.clone()),
                Some(LogitRows::Last) => wanted.push(rows.end - 1),
                None => {}
            }
            logit_rows.push(r0..wanted.len());
        }
        let logits = if wanted.is_empty() {
            None
        } else {
            let hs = if wanted.len() == ids.len() { h } else { b.gather_rows(&h, &wanted)? };
            let hn = b.rms_norm(&hs, &self.norm, c.hidden, c.rms_eps)?;
            Some(b.matmul(&hn, self.lm_head(), None)?)
        };
        Ok(BatchOutput { logits, logit_rows, taps: taps_out, input_rows })
    }
}
