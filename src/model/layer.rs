//! Weights of one Llama-family decoder layer (shared by targets and drafters) and the pieces
//! of its forward pass that both use (reference §1.3).

use crate::error::{Error, Result};
use crate::loader::TensorSource;
use sparkling_core::Backend;

/// One pre-norm decoder layer: attention (GQA, optional QKV bias, optional per-head q/k norm)
/// and a SwiGLU MLP.
pub struct DecoderLayer<B: Backend> {
    /// `input_layernorm.weight` `[1, H]`.
    pub attn_norm: B::Tensor,
    /// `q_proj` `[nh*hd, H]`.
    pub wq: B::Weight,
    /// `k_proj` `[nkv*hd, H]`.
    pub wk: B::Weight,
    /// `v_proj` `[nkv*hd, H]`.
    pub wv: B::Weight,
    /// `o_proj` `[H, nh*hd]`.
    pub wo: B::Weight,
    /// Optional `q_proj` bias `[1, nh*hd]` (Qwen2).
    pub bq: Option<B::Tensor>,
    /// Optional `k_proj` bias `[1, nkv*hd]` (Qwen2).
    pub bk: Option<B::Tensor>,
    /// Optional `v_proj` bias `[1, nkv*hd]` (Qwen2).
    pub bv: Option<B::Tensor>,
    /// Optional per-head query norm `[1, hd]` (Qwen3, applied before RoPE).
    pub q_norm: Option<B::Tensor>,
    /// Optional per-head key norm `[1, hd]` (Qwen3, applied before RoPE).
    pub k_norm: Option<B::Tensor>,
    /// `post_attention_layernorm.weight` `[1, H]`.
    pub mlp_norm: B::Tensor,
    /// `gate_proj` `[I, H]`.
    pub w_gate: B::Weight,
    /// `up_proj` `[I, H]`.
    pub w_up: B::Weight,
    /// `down_proj` `[H, I]`.
    pub w_down: B::Weight,
}

/// Geometry needed to load a layer.
#[derive(Debug, Clone, Copy)]
pub struct LayerDims {
    /// Hidden size.
    pub hidden: usize,
    /// Query heads.
    pub n_heads: usize,
    /// KV heads.
    pub n_kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// MLP width.
    pub intermediate: usize,
    /// Expect q/k/v biases.
    pub qkv_bias: bool,
    /// Expect per-head q/k norms.
    pub qk_norm: bool,
}

/// Whose matrices a load reads: the target's (their precision decides the tokens) or a
/// drafter's (only its speed and acceptance: [`Backend::upload_draft_weight`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The target model.
    Target,
    /// A drafter.
    Drafter,
}

/// Load a `[n, k]` matrix by name and upload it: in its stored ggml format when the source
/// holds ggml blocks and the backend keeps that type ([`Backend::accepts_ggml`]), else
/// dequantized to f32 and uploaded with [`Backend::upload_weight`] (a drafter's with
/// [`Backend::upload_draft_weight`]).
pub fn load_matrix<B: Backend>(b: &B, src: &dyn TensorSource, name: &str, n: usize, k: usize, owner: Owner) -> Result<B::Weight> {
    if src.ggml_type(name).is_some_and(|t| b.accepts_ggml(t)) {
        if let Some(g) = src.load_ggml(name, [n, k])? {
            return b.upload_weight_ggml(g).map_err(|e| Error::tensor(src.path(), &src.file_name(name), e.to_string()));
        }
    }
    let t = src.load_shaped(name, &[n, k])?;
    Ok(match owner {
        Owner::Target => b.upload_weight(t.data, n, k)?,
        Owner::Drafter => b.upload_draft_weight(t.data, n, k)?,
    })
}

/// The `N` outputs of a [`Backend::matmul_many`] of `N` weights as an array. Errors: a backend
/// that returned another count ([`Error::Input`], naming both).
fn outputs<T, const N: usize>(v: Vec<T>) -> Result<[T; N]> {
    let got = v.len();
    v.try_into().map_err(|_| Error::Input(format!("matmul_many returned {got} outputs for {N} weights")))
}

/// Load a vector by name as a `[1, n]` tensor.
pub fn load_vector<B: Backend>(b: &B, src: &dyn TensorSource, name: &str, n: usize) -> Result<B::Tensor> {
    let t = src.load_shaped(name, &[n])?;
    Ok(b.upload(&t.data, 1, n)?)
}

impl<B: Backend> DecoderLayer<B> {
    /// Load layer tensors named `{prefix}input_layernorm.weight`, `{prefix}self_attn.q_proj.weight`, …
    /// `owner` chooses the upload of the matrices ([`load_matrix`]). Errors name the missing
    /// tensor or the expected and found shape.
    pub fn load(b: &B, src: &dyn TensorSource, prefix: &str, d: LayerDims, owner: Owner) -> Result<Self> {
        let (h, q, kv) = (d.hidden, d.n_heads * d.head_dim, d.n_kv_heads * d.head_dim);
        let n = |s: &str| format!("{prefix}{s}");
        let bias = |s: &str, len: usize| -> Result<Option<B::Tensor>> {
            if d.qkv_bias {
                Ok(Some(load_vector(b, src, &n(s), len)?))
            } else {
                Ok(None)
            }
        };
        let norm = |s: &str| -> Result<Option<B::Tensor>> {
            if d.qk_norm {
                Ok(Some(load_vector(b, src, &n(s), d.head_dim)?))
            } else {
                Ok(None)
            }
        };
        Ok(DecoderLayer {
            attn_norm: load_vector(b, src, &n("input_layernorm.weight"), h)?,
            wq: load_matrix(b, src, &n("self_attn.q_proj.weight"), q, h, owner)?,
            wk: load_matrix(b, src, &n("self_attn.k_proj.weight"), kv, h, owner)?,
            wv: load_matrix(b, src, &n("self_attn.v_proj.weight"), kv, h, owner)?,
            wo: load_matrix(b, src, &n("self_attn.o_proj.weight"), h, q, owner)?,
            bq: bias("self_attn.q_proj.bias", q)?,
            bk: bias("self_attn.k_proj.bias", kv)?,
            bv: bias("self_attn.v_proj.bias", kv)?,
            q_norm: norm("self_attn.q_norm.weight")?,
            k_norm: norm("self_attn.k_norm.weight")?,
            mlp_norm: load_vector(b, src, &n("post_attention_layernorm.weight"), h)?,
            w_gate: load_matrix(b, src, &n("mlp.gate_proj.weight"), d.intermediate, h, owner)?,
            w_up: load_matrix(b, src, &n("mlp.up_proj.weight"), d.intermediate, h, owner)?,
            w_down: load_matrix(b, src, &n("mlp.down_proj.weight"), h, d.intermediate, owner)?,
        })
    }

    /// Names of all tensors this layer reads (for refusing unknown tensors).
    pub fn tensor_names(prefix: &str, d: LayerDims) -> Vec<String> {
        let mut v: Vec<String> = [
            "input_layernorm.weight",
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
            "post_attention_layernorm.weight",
            "mlp.gate_proj.weight",
            "mlp.up_proj.weight",
            "mlp.down_proj.weight",
        ]
        .iter()
        .map(|s| format!("{prefix}{s}"))
        .collect();
        if d.qkv_bias {
            v.extend(["q", "k", "v"].iter().map(|x| format!("{prefix}self_attn.{x}_proj.bias")));
        }
        if d.qk_norm {
            v.extend(["q", "k"].iter().map(|x| format!("{prefix}self_attn.{x}_norm.weight")));
        }
        v
    }

    /// Project queries: `q = q_norm(x·Wqᵀ + bq)` then RoPE at `positions`. `x` is already normed.
    pub fn project_q(&self, b: &B, x: &B::Tensor, positions: &[u32], hd: usize, eps: f32, theta: f32) -> Result<B::Tensor> {
        let q = b.matmul(x, &self.wq, self.bq.as_ref())?;
        Self::norm_rope(b, q, self.q_norm.as_ref(), positions, hd, eps, theta)
    }

    /// Project keys (normed, rotated at `positions`) and values for the normed rows `x` (one
    /// [`Backend::matmul_many`]).
    pub fn project_kv(&self, b: &B, x: &B::Tensor, positions: &[u32], hd: usize, eps: f32, theta: f32) -> Result<(B::Tensor, B::Tensor)> {
        let [k, v] = outputs(b.matmul_many(x, &[(&self.wk, self.bk.as_ref()), (&self.wv, self.bv.as_ref())])?)?;
        Ok((Self::norm_rope(b, k, self.k_norm.as_ref(), positions, hd, eps, theta)?, v))
    }

    /// [`DecoderLayer::project_q`] and [`DecoderLayer::project_kv`] of the same rows `x` in one
    /// [`Backend::matmul_many`] (the target's case; the drafter's keys see more rows than its
    /// queries). Returns `(q, k, v)`, equal to the two calls' results.
    pub fn project_qkv(&self, b: &B, x: &B::Tensor, positions: &[u32], hd: usize, eps: f32, theta: f32) -> Result<(B::Tensor, B::Tensor, B::Tensor)> {
        let ws = [(&self.wq, self.bq.as_ref()), (&self.wk, self.bk.as_ref()), (&self.wv, self.bv.as_ref())];
        let [q, k, v] = outputs(b.matmul_many(x, &ws)?)?;
        let q = Self::norm_rope(b, q, self.q_norm.as_ref(), positions, hd, eps, theta)?;
        Ok((q, Self::norm_rope(b, k, self.k_norm.as_ref(), positions, hd, eps, theta)?, v))
    }

    /// Queries or keys after their projection: the per-head norm `norm` (when the layer has
    /// one), then RoPE at `positions`.
    fn norm_rope(b: &B, mut t: B::Tensor, norm: Option<&B::Tensor>, positions: &[u32], hd: usize, eps: f32, theta: f32) -> Result<B::Tensor> {
        if let Some(w) = norm {
            t = b.rms_norm(&t, w, hd, eps)?;
        }
        b.rope(&mut t, positions, hd, theta)?;
        Ok(t)
    }

    /// `h += o_proj(attn)`; then `h += down(silu(gate(y)) * up(y))` with `y = RMSNorm_post(h)`.
    pub fn finish(&self, b: &B, h: &mut B::Tensor, attn: &B::Tensor, eps: f32) -> Result<()> {
        let o = b.matmul(attn, &self.wo, None)?;
        b.add_assign(h, &o)?;
        let hidden = b.shape(h).1;
        let y = b.rms_norm(h, &self.mlp_norm, hidden, eps)?;
        let [g, u] = outputs(b.matmul_many(&y, &[(&self.w_gate, None), (&self.w_up, None)])?)?;
        let m = b.silu_mul(&g, &u)?;
        let d = b.matmul(&m, &self.w_down, None)?;
        b.add_assign(h, &d)?;
        Ok(())
    }
}

/// Per-layer K/V cache: `[capacity, nkv*hd]` tensors ([`Backend::kv_zeros`]: on the CPU
/// backend f16 by default, or q8_0 / f32 with `--kv-cache`, each KV head's rows contiguous);
/// rows `0..len` are valid.
pub struct KvCache<B: Backend> {
    /// Keys per layer.
    pub k: Vec<B::Tensor>,
    /// Values per layer.
    pub v: Vec<B::Tensor>,
    /// Valid rows.
    pub len: usize,
    /// Allocated rows.
    pub capacity: usize,
}

impl<B: Backend> KvCache<B> {
    /// Allocate `layers` K/V pairs of `[capacity, heads·head_dim]` (`heads` KV heads).
    pub fn new(b: &B, layers: usize, capacity: usize, heads: usize, head_dim: usize) -> Result<Self> {
        let mut k = Vec::with_capacity(layers);
        let mut v = Vec::with_capacity(layers);
        for _ in 0..layers {
            k.push(b.kv_zeros(capacity, heads, head_dim)?);
            v.push(b.kv_zeros(capacity, heads, head_dim)?);
        }
        Ok(KvCache { k, v, len: 0, capacity })
    }

    /// Fail early when `extra` more rows would not fit.
    pub fn ensure_room(&self, extra: usize) -> Result<()> {
        if self.len + extra > self.capacity {
            return Err(Error::Input(format!(
                "KV cache full: {} rows used + {extra} new > capacity {} (raise the context size or lower --max-new-tokens)",
                self.len, self.capacity
            )));
        }
        Ok(())
    }

    /// Drop rows past `len` (crop).
    pub fn crop(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// KV compaction after a tree round (reference §4.10): the tree block starts at row
    /// `start`; keep tree rows `keep` (increasing, `keep[0] = 0` the root) in path order at rows
    /// `start..start+keep.len()`, every layer, K and V; then crop.
    pub fn compact(&mut self, b: &B, start: usize, keep: &[usize]) -> Result<()> {
        let in_place = keep.iter().enumerate().all(|(i, &k)| i == k);
        if !in_place {
            for t in self.k.iter_mut().chain(self.v.iter_mut()) {
                b.compact_rows(t, start, keep)?;
            }
        }
        self.len = start + keep.len();
        Ok(())
    }
}
