//! The drafter forward in candle — the same math as the engine's
//! `sparkling::model::drafter::Drafter::draft` (reference §2.4 / §3.5), batched over anchors:
//!
//! 1. `c = RMSNorm_hidden(ctx · fcᵀ)` for the context rows (target taps of positions
//!    `0..Lc`), computed once per sequence and shared by every anchor and layer;
//! 2. block ids `[anchor, mask × (Bk-1)]` at positions `S..S+Bk-1`, embedded with the target's
//!    frozen embedding;
//! 3. per layer: `y = RMSNorm_in(x)`; `q = rope(q_norm(y·Wqᵀ))` at the block positions;
//!    keys/values over `[c ; y]` (`k_norm` + RoPE on keys, context rows at their own
//!    positions); non-causal attention (scale `hd^-½`, GQA) where the anchor at `S` sees the
//!    context rows `< S` and all `Bk` block rows; `x += o_proj(attn)`;
//!    `x += down(silu(gate(m)) ⊙ up(m))`, `m = RMSNorm_post(x)`;
//! 4. `out = RMSNorm_final(x)` `[nA, Bk, H]`; logits go through the target's lm_head
//!    ([`crate::head`]).
//!
//! RoPE is NeoX (rotate-half) with `inv_freq[j] = θ^(-2j/hd)` computed as the engine does (f64
//! power, f32 angle), so both implementations agree to f32 rounding.
//!
//! Parameters are held by HF tensor name (the names `Drafter::load` reads), so checkpoints and
//! the export are a rename-free copy.

use crate::error::{Error, Result};
use crate::rng::Rng;
use candle_core::{DType, Device, Tensor, Var, D};
use sparkling::model::config::{DrafterConfig, DrafterKind};
use sparkling::model::draft_vocab::DraftVocab;
use std::collections::BTreeMap;

/// Trainable parameters by HF tensor name.
pub struct Params {
    /// Variables (f32, CPU).
    pub vars: BTreeMap<String, Var>,
}

/// Name and shape of every tensor a drafter of `cfg` has (`n_feat = n_taps * H_target`), in the
/// layout `Drafter::load` expects (no embedding / lm_head: borrowed from the target). A reduced
/// draft vocabulary (`cfg.draft_vocab` = V_d < V) shrinks the Markov `W2` to `[V_d, r]`; `W1`
/// stays `[V, r]` (indexed by the previous token's target id). The `draft_to_target` map is not
/// a parameter (the exporter writes it).
pub fn tensor_shapes(cfg: &DrafterConfig, n_feat: usize) -> Vec<(String, Vec<usize>)> {
    let h = cfg.hidden;
    let mut v: Vec<(String, Vec<usize>)> = vec![("fc.weight".into(), vec![h, n_feat]), ("hidden_norm.weight".into(), vec![h])];
    push_layer_shapes(cfg, &mut v);
    v.push(("norm.weight".into(), vec![h]));
    if cfg.kind == DrafterKind::DSpark && cfg.markov_rank > 0 {
        v.push(("markov_head.markov_w1.weight".into(), vec![cfg.vocab, cfg.markov_rank]));
        v.push(("markov_head.markov_w2.weight".into(), vec![cfg.draft_vocab, cfg.markov_rank]));
    }
    if cfg.kind == DrafterKind::DSpark && cfg.confidence_head {
        v.push(("confidence_head.proj.weight".into(), vec![1, h + cfg.markov_rank]));
        v.push(("confidence_head.proj.bias".into(), vec![1]));
    }
    v
}

/// Append the names and shapes of `cfg.layers` Qwen3 decoder layers (`layers.{l}.…`: norms,
/// q/k/v/o projections with q/k RMSNorm, SwiGLU MLP) in HF layout; shared by the block drafters
/// and the reference head ([`crate::eagle`]).
pub fn push_layer_shapes(cfg: &DrafterConfig, v: &mut Vec<(String, Vec<usize>)>) {
    let (h, q, kv, hd, i) = (cfg.hidden, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.head_dim, cfg.intermediate);
    for l in 0..cfg.layers {
        let p = |s: &str| format!("layers.{l}.{s}");
        v.push((p("input_layernorm.weight"), vec![h]));
        v.push((p("self_attn.q_proj.weight"), vec![q, h]));
        v.push((p("self_attn.k_proj.weight"), vec![kv, h]));
        v.push((p("self_attn.v_proj.weight"), vec![kv, h]));
        v.push((p("self_attn.o_proj.weight"), vec![h, q]));
        v.push((p("self_attn.q_norm.weight"), vec![hd]));
        v.push((p("self_attn.k_norm.weight"), vec![hd]));
        v.push((p("post_attention_layernorm.weight"), vec![h]));
        v.push((p("mlp.gate_proj.weight"), vec![i, h]));
        v.push((p("mlp.up_proj.weight"), vec![i, h]));
        v.push((p("mlp.down_proj.weight"), vec![h, i]));
    }
}

impl Params {
    /// Fresh parameters, deterministic in `seed`: linear weights `N(0, 0.02²)` (output
    /// projections `o_proj`/`down_proj` scaled by `1/√(2·layers)`), norms 1, Markov `W1 ~ N(0,1)`
    /// and `W2 = 0` (the bias starts at zero), confidence head 0. `final_norm` (length H), when
    /// given, initialises `norm.weight` — the target's own final norm, so the borrowed lm_head
    /// sees hidden states at the scale it was trained for (with 1s SmolLM2's logits start at
    /// CE ≈ 75 instead of ≈ 11).
    pub fn init(cfg: &DrafterConfig, n_feat: usize, seed: u64, final_norm: Option<&[f32]>) -> Result<Self> {
        let mut vars = BTreeMap::new();
        let out_scale = 1.0 / (2.0 * cfg.layers.max(1) as f32).sqrt();
        for (si, (name, shape)) in tensor_shapes(cfg, n_feat).into_iter().enumerate() {
            let n: usize = shape.iter().product();
            let mut rng = Rng::new(seed, si as u64);
            let data: Vec<f32> = if name == "norm.weight" && final_norm.is_some_and(|f| f.len() == n) {
                final_norm.map(|f| f.to_vec()).unwrap_or_default()
            } else if name.ends_with("norm.weight") {
                vec![1.0; n]
            } else if name.contains("markov_w1") {
                (0..n).map(|_| rng.normal()).collect()
            } else if name.contains("markov_w2") || name.starts_with("confidence_head") {
                vec![0.0; n]
            } else {
                let s = if name.contains("o_proj") || name.contains("down_proj") { 0.02 * out_scale } else { 0.02 };
                (0..n).map(|_| rng.normal() * s).collect()
            };
            vars.insert(name, Var::from_vec(data, shape, &Device::Cpu)?);
        }
        Ok(Params { vars })
    }

    /// Parameters from named host tensors (a checkpoint); every expected name must be present
    /// with its shape. `what` names the source in errors.
    pub fn from_tensors(cfg: &DrafterConfig, n_feat: usize, mut t: BTreeMap<String, Tensor>, what: &str) -> Result<Self> {
        let mut vars = BTreeMap::new();
        for (name, shape) in tensor_shapes(cfg, n_feat) {
            let x = t.remove(&name).ok_or_else(|| Error(format!("{what}: tensor `{name}` missing")))?;
            if x.dims() != shape.as_slice() {
                return Err(Error(format!("{what}: tensor `{name}`: expected shape {shape:?}, found {:?}", x.dims())));
            }
            vars.insert(name, Var::from_tensor(&x.to_dtype(DType::F32)?)?);
        }
        Ok(Params { vars })
    }

    /// The tensor of parameter `name`.
    pub fn get(&self, name: &str) -> Result<&Tensor> {
        self.vars.get(name).map(|v| v.as_tensor()).ok_or_else(|| Error(format!("parameter `{name}` missing")))
    }

    /// Total number of scalar parameters.
    pub fn count(&self) -> usize {
        self.vars.values().map(|v| v.elem_count()).sum()
    }
}

/// RMSNorm over the last dimension: `x · rsqrt(mean(x²) + eps) · w`.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> candle_core::Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    let inv = (ms + eps as f64)?.sqrt()?.recip()?;
    x.broadcast_mul(&inv)?.broadcast_mul(w)
}

/// `cos`, `sin` tables `[positions.len(), hd/2]` exactly as the engine's CPU RoPE forms them.
pub fn rope_tables(positions: &[u32], head_dim: usize, theta: f32) -> candle_core::Result<(Tensor, Tensor)> {
    let half = head_dim / 2;
    let inv: Vec<f32> = (0..half).map(|j| 1.0 / (theta as f64).powf(2.0 * j as f64 / head_dim as f64) as f32).collect();
    let mut c = Vec::with_capacity(positions.len() * half);
    let mut s = Vec::with_capacity(positions.len() * half);
    for &p in positions {
        for f in &inv {
            let a = p as f32 * f;
            c.push(a.cos());
            s.push(a.sin());
        }
    }
    Ok((Tensor::from_vec(c, (positions.len(), half), &Device::Cpu)?, Tensor::from_vec(s, (positions.len(), half), &Device::Cpu)?))
}

/// NeoX RoPE on `x [rows, heads, hd]` with tables `[rows, hd/2]`.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    let hd = x.dim(D::Minus1)?;
    let half = hd / 2;
    let (c, s) = (cos.unsqueeze(1)?, sin.unsqueeze(1)?);
    let a = x.narrow(D::Minus1, 0, half)?;
    let b = x.narrow(D::Minus1, half, half)?;
    let ra = (a.broadcast_mul(&c)? - b.broadcast_mul(&s)?)?;
    let rb = (b.broadcast_mul(&c)? + a.broadcast_mul(&s)?)?;
    Tensor::cat(&[ra, rb], D::Minus1)
}

/// One batch of anchors over one sequence's context.
pub struct BlockInput {
    /// Target taps `[Lc, n_feat]` of positions `0..Lc` (f32).
    pub ctx: Tensor,
    /// Anchor positions `S_a` (each `1 ≤ S_a ≤ Lc`); anchor `a` sees context rows `< S_a`.
    pub anchors: Vec<usize>,
    /// Anchor token ids (the token at `S_a`).
    pub anchor_ids: Vec<u32>,
}

/// The candle drafter: config + parameters + the frozen target embedding `[V, H]` and output
/// layer `[V_d, H]`.
pub struct CandleDrafter {
    /// Geometry (the engine's config type).
    pub cfg: DrafterConfig,
    /// Trainable parameters.
    pub params: Params,
    /// Frozen target embedding, also the lm_head (SmolLM2 ties them) `[V, H]`.
    pub embed: Tensor,
    /// Frozen output layer `[V_d, H]`: the target's lm_head (the same tensor as `embed` for
    /// tied targets), or its rows `draft_vocab.draft_to_target()` for a reduced draft vocabulary.
    pub lm_head: Tensor,
    /// The reduced draft vocabulary (draft id `i` = target id `draft_to_target()[i]`; the
    /// columns of the logits and of the Markov bias are draft ids); `None` = the full vocabulary.
    pub draft_vocab: Option<DraftVocab>,
    /// Training-time preconditioner of the context features, `[n_feat]`: the forward uses
    /// `fc(ctx ⊙ s)`. Target residual streams carry a few "massive" dimensions (SmolLM2's taps
    /// have one feature with RMS ≈ 1 200 against a median of ≈ 5), which through a randomly
    /// initialised `fc` and `hidden_norm` make every context row look alike; `s = 1/RMS` per
    /// feature removes that without changing the model class — the export folds it into
    /// `fc.weight` (`fc ⊙ s`, column-wise), so the engine computes the same function on raw
    /// taps. `None` = identity (inference on an exported checkpoint).
    pub ctx_scale: Option<Tensor>,
}

/// Per-feature scale `1/RMS` of tap rows (`rows` of width `width`), floored at RMS `1e-3`.
pub fn feature_scale(rows: impl Iterator<Item = f32>, width: usize) -> Vec<f32> {
    let mut ss = vec![0f64; width];
    let mut n = 0usize;
    for (i, v) in rows.enumerate() {
        ss[i % width] += (v as f64) * (v as f64);
        if i % width == width - 1 {
            n += 1;
        }
    }
    ss.iter().map(|s| (1.0 / (s / n.max(1) as f64).sqrt().max(1e-3)) as f32).collect()
}

impl CandleDrafter {
    /// Backbone forward: final-normed hidden states `[nA * Bk, H]` (anchor-major, slot-minor) for
    /// the block `[anchor, mask × (Bk-1)]` of every anchor. Errors on shapes that do not fit.
    pub fn backbone(&self, inp: &BlockInput) -> Result<Tensor> {
        let c = &self.cfg;
        let (lc, nf) = inp.ctx.dims2()?;
        let na = inp.anchors.len();
        let bk = c.block_size;
        if na == 0 || inp.anchor_ids.len() != na {
            return Err(Error(format!("backbone: {na} anchors with {} ids", inp.anchor_ids.len())));
        }
        if let Some(&s) = inp.anchors.iter().find(|&&s| s == 0 || s > lc) {
            return Err(Error(format!("backbone: anchor {s} needs context rows 0..{s} but {lc} are given")));
        }
        let (h, nh, nkv, hd, eps) = (c.hidden, c.n_heads, c.n_kv_heads, c.head_dim, c.rms_eps);
        let g = nh / nkv;
        let p = |n: &str| self.params.get(n);
        let fc = p("fc.weight")?;
        if fc.dims2()?.1 != nf {
            return Err(Error(format!("backbone: context width {nf} but fc.weight expects {}", fc.dims2()?.1)));
        }
        let ctx = match &self.ctx_scale {
            Some(sc) => inp.ctx.broadcast_mul(sc)?,
            None => inp.ctx.clone(),
        };
        let ctx_h = rms_norm(&ctx.matmul(&fc.t()?)?, p("hidden_norm.weight")?, eps)?;
        // Block rows.
        let mut ids = Vec::with_capacity(na * bk);
        let mut bpos = Vec::with_capacity(na * bk);
        for (&s, &a) in inp.anchors.iter().zip(&inp.anchor_ids) {
            for j in 0..bk {
                ids.push(if j == 0 { a } else { c.mask_token_id });
                bpos.push((s + j) as u32);
            }
        }
        let ids_t = Tensor::from_vec(ids, na * bk, &Device::Cpu)?;
        let mut x = self.embed.index_select(&ids_t, 0)?;
        let cpos: Vec<u32> = (0..lc as u32).collect();
        let (ccos, csin) = rope_tables(&cpos, hd, c.rope_theta)?;
        let (bcos, bsin) = rope_tables(&bpos, hd, c.rope_theta)?;
        // Context visibility: anchor a sees rows j < S_a.
        let mut mask = vec![0f32; na * lc];
        for (a, &s) in inp.anchors.iter().enumerate() {
            mask[a * lc + s..(a + 1) * lc].iter_mut().for_each(|m| *m = -1e9);
        }
        let mask = Tensor::from_vec(mask, (na, 1, 1, lc), &Device::Cpu)?;
        let scale = 1.0 / (hd as f64).sqrt();
        let r = na * bk;
        for l in 0..c.layers {
            let n = |s: &str| format!("layers.{l}.{s}");
            let y = rms_norm(&x, p(&n("input_layernorm.weight"))?, eps)?;
            let q = y.matmul(&p(&n("self_attn.q_proj.weight"))?.t()?)?.reshape((r, nh, hd))?;
            let q = rope(&rms_norm(&q, p(&n("self_attn.q_norm.weight"))?, eps)?, &bcos, &bsin)?;
            let wk = p(&n("self_attn.k_proj.weight"))?.t()?;
            let wv = p(&n("self_attn.v_proj.weight"))?.t()?;
            let kn = p(&n("self_attn.k_norm.weight"))?;
            let kb = rope(&rms_norm(&y.matmul(&wk)?.reshape((r, nkv, hd))?, kn, eps)?, &bcos, &bsin)?;
            let vb = y.matmul(&wv)?.reshape((r, nkv, hd))?;
            let kc = rope(&rms_norm(&ctx_h.matmul(&wk)?.reshape((lc, nkv, hd))?, kn, eps)?, &ccos, &csin)?;
            let vc = ctx_h.matmul(&wv)?.reshape((lc, nkv, hd))?;
            // q: [nA, Bk, nh, hd] → [nA, nkv, G*Bk, hd] (head h = kvh*G + g reads KV head kvh).
            let q = q.reshape((na, bk, nh, hd))?.transpose(1, 2)?.contiguous()?.reshape((na, nkv, g * bk, hd))?;
            let kc_t = kc.transpose(0, 1)?.transpose(1, 2)?.contiguous()?; // [nkv, hd, Lc]
            let vc_t = vc.transpose(0, 1)?.contiguous()?; // [nkv, Lc, hd]
            let kb_t = kb.reshape((na, bk, nkv, hd))?.permute((0, 2, 3, 1))?.contiguous()?; // [nA, nkv, hd, Bk]
            let vb_t = vb.reshape((na, bk, nkv, hd))?.transpose(1, 2)?.contiguous()?; // [nA, nkv, Bk, hd]
            let s_ctx = (q.broadcast_matmul(&kc_t)? * scale)?.broadcast_add(&mask)?;
            let s_blk = (q.matmul(&kb_t)? * scale)?;
            let probs = candle_nn::ops::softmax(&Tensor::cat(&[s_ctx, s_blk], D::Minus1)?, D::Minus1)?;
            let p_ctx = probs.narrow(D::Minus1, 0, lc)?.contiguous()?;
            let p_blk = probs.narrow(D::Minus1, lc, bk)?.contiguous()?;
            let att = (p_ctx.broadcast_matmul(&vc_t)? + p_blk.matmul(&vb_t)?)?; // [nA, nkv, G*Bk, hd]
            let att = att.reshape((na, nh, bk, hd))?.transpose(1, 2)?.contiguous()?.reshape((r, nh * hd))?;
            x = (x + att.matmul(&p(&n("self_attn.o_proj.weight"))?.t()?)?)?;
            let m = rms_norm(&x, p(&n("post_attention_layernorm.weight"))?, eps)?;
            let gate = m.matmul(&p(&n("mlp.gate_proj.weight"))?.t()?)?.silu()?;
            let up = m.matmul(&p(&n("mlp.up_proj.weight"))?.t()?)?;
            x = (x + (gate * up)?.matmul(&p(&n("mlp.down_proj.weight"))?.t()?)?)?;
        }
        let _ = h;
        Ok(rms_norm(&x, p("norm.weight")?, eps)?)
    }

    /// Block slots that produce draft logits: DFlash `1..Bk` (in-place), DSpark `0..Bk`
    /// (shifted) — the rows `Drafter::draft` returns.
    pub fn draft_slots(&self) -> std::ops::Range<usize> {
        match self.cfg.kind {
            DrafterKind::DFlash => 1..self.cfg.block_size,
            DrafterKind::DSpark => 0..self.cfg.block_size,
        }
    }

    /// Base draft logits `[nA * depth, V_d]` (no Markov bias; columns are draft ids): the engine's `Drafter::draft`
    /// output for each anchor, stacked. Inference/testing path (no loss).
    pub fn draft_logits(&self, inp: &BlockInput) -> Result<Tensor> {
        let out = self.backbone(inp)?;
        let bk = self.cfg.block_size;
        let rows: Vec<u32> = (0..inp.anchors.len()).flat_map(|a| self.draft_slots().map(move |j| (a * bk + j) as u32)).collect();
        let sel = out.index_select(&Tensor::from_vec(rows.clone(), rows.len(), &Device::Cpu)?, 0)?;
        Ok(sel.matmul(&self.lm_head.t()?)?)
    }

    /// Markov bias `[rows, V_d]` = `W2 · W1[prev]` for the previous tokens `prev` (target ids;
    /// DSpark with `markov_rank > 0`; `None` otherwise) and the gathered `W1` rows `[rows, r]`.
    pub fn markov_bias(&self, prev: &[u32]) -> Result<Option<(Tensor, Tensor)>> {
        if self.cfg.kind != DrafterKind::DSpark || self.cfg.markov_rank == 0 {
            return Ok(None);
        }
        let w1 = self.params.get("markov_head.markov_w1.weight")?;
        let w2 = self.params.get("markov_head.markov_w2.weight")?;
        let e = w1.index_select(&Tensor::from_vec(prev.to_vec(), prev.len(), &Device::Cpu)?, 0)?;
        Ok(Some((e.matmul(&w2.t()?)?, e)))
    }

    /// DSpark confidence-head logits `[R]` = `w·[h ; e] + b` (reference §3.8; the engine's
    /// `ConfidenceHead`) for final-normed slot rows `h` `[R, H]` and the Markov `W1` rows `e`
    /// `[R, r]` of their previous tokens (`None` without a Markov head). Errors: a drafter
    /// without a confidence head, candle shape errors.
    pub fn confidence_logits(&self, h: &Tensor, e: Option<&Tensor>) -> Result<Tensor> {
        let wc = self.params.get("confidence_head.proj.weight")?;
        let bc = self.params.get("confidence_head.proj.bias")?;
        let feat = match e {
            Some(e) => Tensor::cat(&[h, e], 1)?,
            None => h.clone(),
        };
        Ok(feat.matmul(&wc.t()?)?.broadcast_add(bc)?.squeeze(1)?)
    }
}
