//! Model configurations read from HF `config.json` or GGUF metadata (reference §1.1, §2.2, §3.3).

use crate::error::{Error, Result};
use crate::loader::gguf::GgufFile;
use serde_json::Value;
use std::path::Path;

/// Target decoder family. All are one Llama-family decoder with switches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama / SmolLM2: no QKV bias, no q/k norm.
    Llama,
    /// Qwen2 / Qwen2.5: QKV bias.
    Qwen2,
    /// Qwen3: per-head q/k RMSNorm before RoPE, no QKV bias.
    Qwen3,
}

impl Arch {
    /// Parse an HF `model_type` / GGUF `general.architecture` value.
    pub fn parse(s: &str) -> Option<Arch> {
        match s {
            "llama" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            _ => None,
        }
    }
    /// The HF `model_type` spelling.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
        }
    }
}

/// The decoder geometry and numerics a target and a drafter share: both configs hold one
/// ([`TargetConfig::geometry`], [`DrafterConfig::geometry`]) and read its fields as their own
/// through `Deref` (`cfg.hidden`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelGeometry {
    /// Vocabulary size (the target's embedding / lm_head rows; a drafter's input ids, the
    /// anchor and the mask token).
    pub vocab: usize,
    /// Hidden size H (a drafter's must equal its target's).
    pub hidden: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// KV heads (GQA).
    pub n_kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// SwiGLU intermediate size.
    pub intermediate: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// RoPE base θ (`rope_theta` or `rope_parameters.rope_theta`).
    pub rope_theta: f32,
}

impl ModelGeometry {
    /// The geometry of a `config.json` whose vocabulary, hidden size, layer and head counts
    /// were read already; the rest from its keys (`num_key_value_heads` defaults to the heads,
    /// `head_dim` to hidden / heads, `rms_norm_eps` to 1e-6).
    fn from_hf(k: &Keys<'_>, vocab: usize, hidden: usize, layers: usize, n_heads: usize) -> Result<ModelGeometry> {
        Ok(ModelGeometry {
            vocab,
            hidden,
            layers,
            n_heads,
            n_kv_heads: k.usize_or("num_key_value_heads", n_heads)?,
            head_dim: k.usize_or("head_dim", hidden / n_heads.max(1))?,
            intermediate: k.usize("intermediate_size")?,
            rms_eps: k.f32_or("rms_norm_eps", 1e-6)?,
            rope_theta: k.rope_theta()?,
        })
    }

    /// Every value that sizes something: positive, in range, consistent (`derived_head_dim`:
    /// head_dim was not given, so the heads must divide the hidden size).
    fn validate(&self, c: &Check<'_>, derived_head_dim: bool) -> Result<()> {
        c.count("vocab_size", self.vocab, MAX_DIM)?;
        c.count("num_hidden_layers", self.layers, u32::MAX as usize)?;
        c.attention(self, derived_head_dim)
    }

    /// The HF `config.json` keys of the geometry (RoPE aside: its spelling depends on the
    /// checkpoint kind), with the keys of the JSON object `extra` added.
    fn hf_json(&self, extra: Value) -> Value {
        let mut v = serde_json::json!({
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate,
            "rms_norm_eps": self.rms_eps,
        });
        if let (Value::Object(o), Value::Object(e)) = (&mut v, extra) {
            o.extend(e);
        }
        v
    }
}

/// Geometry and numerics of a target decoder (reference §1.1).
#[derive(Debug, Clone, PartialEq)]
pub struct TargetConfig {
    /// Decoder family.
    pub arch: Arch,
    /// Vocabulary, hidden size, layers, heads, head size, MLP size, RMSNorm ε, RoPE θ.
    pub geometry: ModelGeometry,
    /// lm_head tied to the embedding.
    pub tie_embeddings: bool,
    /// q/k/v projections carry biases (Qwen2).
    pub qkv_bias: bool,
    /// Per-head q/k RMSNorm (Qwen3).
    pub qk_norm: bool,
    /// Context limit in tokens.
    pub max_positions: usize,
    /// Beginning-of-sequence id.
    pub bos: Option<u32>,
    /// Stop ids (eos and end-of-turn).
    pub eos: Vec<u32>,
}

/// Which drafter convention a checkpoint follows (reference §3.1, pitfall §7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrafterKind {
    /// z-lab DFlash: in-place slots (slot j predicts position S+j, Bk-1 drafts), borrows the
    /// target's embedding and lm_head, nested `dflash_config`.
    DFlash,
    /// DeepSpec DSpark: shifted slots (slot j predicts S+1+j, Bk drafts), Markov head,
    /// confidence head, flat config keys.
    DSpark,
}

/// Drafter geometry (reference §2.2, §3.3).
#[derive(Debug, Clone, PartialEq)]
pub struct DrafterConfig {
    /// Convention.
    pub kind: DrafterKind,
    /// Vocabulary (the target's), hidden size (the target's), draft layers, heads, head size,
    /// MLP size, RMSNorm ε, RoPE θ.
    pub geometry: ModelGeometry,
    /// Draft vocabulary size V_d (`draft_vocab_size`; `vocab` when absent): the rows of the
    /// drafter's output layer and of the Markov head's `W2`. Below `vocab` the checkpoint
    /// carries the draft → target id map `draft_to_target` (see `models/README.md`).
    pub draft_vocab: usize,
    /// Block size Bk.
    pub block_size: usize,
    /// Input id of the masked block slots.
    pub mask_token_id: u32,
    /// Target layers whose raw outputs are concatenated (listed order) as drafter context.
    pub target_layer_ids: Vec<usize>,
    /// Markov head rank r (0 = none).
    pub markov_rank: usize,
    /// A confidence head is present.
    pub confidence_head: bool,
    /// `draft_vocab_size` was given ([`DrafterConfig::is_reduced`]).
    pub reduced: bool,
}

/// `Deref` / `DerefMut` from a config to its [`ModelGeometry`], so the shared fields read as the
/// config's own (`cfg.hidden`).
macro_rules! deref_geometry {
    ($($config:ty),*) => {$(
        impl std::ops::Deref for $config {
            type Target = ModelGeometry;
            fn deref(&self) -> &ModelGeometry {
                &self.geometry
            }
        }

        impl std::ops::DerefMut for $config {
            fn deref_mut(&mut self) -> &mut ModelGeometry {
                &mut self.geometry
            }
        }
    )*};
}

deref_geometry!(TargetConfig, DrafterConfig);

impl DrafterConfig {
    /// Number of draft depths one forward proposes: Bk-1 (DFlash) or Bk (DSpark).
    pub fn draft_depth(&self) -> usize {
        match self.kind {
            DrafterKind::DFlash => self.block_size - 1,
            DrafterKind::DSpark => self.block_size,
        }
    }

    /// Whether the drafter drafts over a reduced vocabulary (`draft_vocab_size` given: the
    /// checkpoint then carries `draft_to_target`, even when V_d equals the vocabulary).
    pub fn is_reduced(&self) -> bool {
        self.reduced
    }
}

/// Evenly spaced tap layers from 1 to N-3 (z-lab `build_target_layer_ids`, reference §2.2).
pub fn default_target_layer_ids(num_target_layers: usize, num_draft_layers: usize) -> Vec<usize> {
    if num_draft_layers <= 1 {
        return vec![num_target_layers / 2];
    }
    let n = num_draft_layers;
    let span = num_target_layers.saturating_sub(4) as f64;
    (0..n).map(|i| (1.0 + i as f64 * span / (n - 1) as f64).round() as usize).collect()
}

/// Read `config.json` of an HF checkpoint directory.
pub fn read_json(dir: &Path) -> Result<(std::path::PathBuf, Value)> {
    let path = if dir.is_dir() { dir.join("config.json") } else { dir.to_path_buf() };
    #[cfg(not(target_arch = "wasm32"))]
    crate::loader::bytes::regular_file(&path, "a config.json")?;
    let text = std::fs::read_to_string(&path).map_err(|e| Error::file(&path, format!("cannot read config: {e}")))?;
    let v = serde_json::from_str(&text).map_err(|e| Error::file(&path, format!("invalid JSON: {e}")))?;
    Ok((path, v))
}

/// Largest dimension (hidden size, heads, head size, intermediate size, vocabulary, block size,
/// Markov rank) a config may give: far above any real model, low enough that products of a few
/// never overflow.
pub const MAX_DIM: usize = 1 << 24;

/// Largest context (`max_position_embeddings`) accepted.
pub const MAX_POSITIONS: usize = 1 << 26;

/// Validation of the values a config gives, before they size anything. `key` maps
/// an HF `config.json` key to the key of the file at hand (GGUF metadata spells them
/// differently), so every error names the file, the key, the value and what was expected.
struct Check<'a> {
    path: &'a Path,
    key: &'a dyn Fn(&str) -> String,
}

impl Check<'_> {
    fn err(&self, hf_key: &str, msg: String) -> Error {
        Error::config(self.path, &(self.key)(hf_key), msg)
    }
    /// `v` in `1..=max`.
    fn count(&self, hf_key: &str, v: usize, max: usize) -> Result<()> {
        if v == 0 || v > max {
            return Err(self.err(hf_key, format!("{v}: expected a positive integer ≤ {max}")));
        }
        Ok(())
    }
    /// `v` finite and > 0.
    fn positive(&self, hf_key: &str, v: f32) -> Result<()> {
        if !(v.is_finite() && v > 0.0) {
            return Err(self.err(hf_key, format!("{v}: expected a finite number > 0")));
        }
        Ok(())
    }
    /// The attention geometry: positive counts, KV heads dividing the query heads, an even head
    /// size; `derived_head_dim`: head_dim was not given, so the heads must divide the hidden size.
    fn attention(&self, g: &ModelGeometry, derived_head_dim: bool) -> Result<()> {
        let ModelGeometry { hidden, n_heads, n_kv_heads, head_dim, intermediate, rms_eps, rope_theta, .. } = *g;
        self.count("hidden_size", hidden, MAX_DIM)?;
        self.count("num_attention_heads", n_heads, MAX_DIM)?;
        if derived_head_dim && !hidden.is_multiple_of(n_heads) {
            return Err(self.err("num_attention_heads", format!("{n_heads} does not divide the hidden size {hidden} (and no head_dim is given)")));
        }
        self.count("num_key_value_heads", n_kv_heads, MAX_DIM)?;
        if !n_heads.is_multiple_of(n_kv_heads) {
            return Err(self.err("num_key_value_heads", format!("{n_kv_heads} does not divide {n_heads} heads")));
        }
        self.count("head_dim", head_dim, MAX_DIM)?;
        if !head_dim.is_multiple_of(2) {
            return Err(self.err("head_dim", format!("{head_dim} is odd; RoPE needs an even head_dim")));
        }
        if n_heads.saturating_mul(head_dim) > MAX_DIM {
            return Err(self.err("head_dim", format!("{n_heads} heads × {head_dim} exceeds {MAX_DIM}")));
        }
        self.count("intermediate_size", intermediate, MAX_DIM)?;
        self.positive("rms_norm_eps", rms_eps)?;
        self.positive("rope_theta", rope_theta)
    }
}

/// The GGUF metadata key for an HF `config.json` key (`{arch}.` + suffix).
fn gguf_key(arch: &str, hf_key: &str) -> String {
    let suffix = match hf_key {
        "hidden_size" => "embedding_length",
        "num_hidden_layers" => "block_count",
        "num_attention_heads" => "attention.head_count",
        "num_key_value_heads" => "attention.head_count_kv",
        "head_dim" => "attention.key_length",
        "intermediate_size" => "feed_forward_length",
        "rms_norm_eps" => "attention.layer_norm_rms_epsilon",
        "rope_theta" => "rope.freq_base",
        "max_position_embeddings" => "context_length",
        "vocab_size" => return "token_embd.weight (vocabulary rows)".into(),
        "eos_token_id" => return "tokenizer.ggml.eos_token_id / eot_token_id".into(),
        "bos_token_id" => return "tokenizer.ggml.bos_token_id".into(),
        other => other,
    };
    format!("{arch}.{suffix}")
}

struct Keys<'a> {
    path: &'a Path,
    v: &'a Value,
}

impl Keys<'_> {
    fn usize(&self, key: &str) -> Result<usize> {
        match self.v.get(key) {
            None | Some(Value::Null) => Err(Error::config(self.path, key, "missing (expected a non-negative integer)")),
            Some(x) => x.as_u64().map(|x| x as usize).ok_or_else(|| Error::config(self.path, key, format!("{x} is not a non-negative integer"))),
        }
    }
    fn usize_or(&self, key: &str, default: usize) -> Result<usize> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(_) => self.usize(key),
        }
    }
    fn f32_or(&self, key: &str, default: f32) -> Result<f32> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(x) => x.as_f64().map(|f| f as f32).ok_or_else(|| Error::config(self.path, key, format!("{x} is not a number"))),
        }
    }
    fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(x) => x.as_bool().ok_or_else(|| Error::config(self.path, key, format!("{x} is not true or false"))),
        }
    }
    /// `rope_theta`, or `rope_parameters.rope_theta` (transformers v5 spelling, pitfall §7.2);
    /// non-default rope types are refused.
    fn rope_theta(&self) -> Result<f32> {
        if let Some(rs) = self.v.get("rope_scaling").filter(|x| !x.is_null()) {
            let ty = rs.get("rope_type").or_else(|| rs.get("type")).and_then(Value::as_str).unwrap_or("?");
            if ty != "default" {
                return Err(Error::config(self.path, "rope_scaling", format!("rope type `{ty}` is not supported (only default RoPE)")));
            }
        }
        if let Some(t) = self.v.get("rope_theta").and_then(Value::as_f64) {
            return Ok(t as f32);
        }
        if let Some(rp) = self.v.get("rope_parameters") {
            let ty = rp.get("rope_type").and_then(Value::as_str).unwrap_or("default");
            if ty != "default" {
                return Err(Error::config(self.path, "rope_parameters.rope_type", format!("`{ty}` is not supported")));
            }
            if let Some(t) = rp.get("rope_theta").and_then(Value::as_f64) {
                return Ok(t as f32);
            }
        }
        Err(Error::config(self.path, "rope_theta", "missing (looked for `rope_theta` and `rope_parameters.rope_theta`)"))
    }
    /// `hidden_act`, when given, must be the SiLU of the SwiGLU MLP every supported model uses
    /// (reference §1.3; `swish` is the same function).
    fn activation(&self) -> Result<()> {
        match self.v.get("hidden_act") {
            None | Some(Value::Null) => Ok(()),
            Some(Value::String(s)) if s == "silu" || s == "swish" => Ok(()),
            Some(other) => Err(Error::config(self.path, "hidden_act", format!("{other} is not supported (expected \"silu\")"))),
        }
    }
    /// A list of tap layer ids (`target_layer_ids`): non-negative integers (an entry of another
    /// type is an error, not skipped). A layer may repeat: its hidden state is then fed twice,
    /// which is what the spread rule gives a shallow target (4 layers, 2 taps → `[1, 1]`).
    fn layer_ids(&self, key: &str, a: &[Value]) -> Result<Vec<usize>> {
        a.iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_u64().map(|id| id as usize).ok_or_else(|| Error::config(self.path, key, format!("entry {i} is {x}: expected a non-negative integer")))
            })
            .collect()
    }
    /// Token ids: absent or null = none, an id, or an array of ids. Anything else (a negative
    /// id, a string, an id beyond u32) is an error naming the key and the value.
    fn ids(&self, key: &str) -> Result<Vec<u32>> {
        let id = |x: &Value| {
            x.as_u64()
                .and_then(|i| u32::try_from(i).ok())
                .ok_or_else(|| Error::config(self.path, key, format!("{x} is not a token id (a non-negative integer)")))
        };
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(a)) => a.iter().map(id).collect(),
            Some(x) => Ok(vec![id(x)?]),
        }
    }
}

impl TargetConfig {
    /// Parse an HF `config.json` (`model_type` llama / qwen2 / qwen3).
    pub fn from_hf_json(path: &Path, v: &Value) -> Result<Self> {
        let k = Keys { path, v };
        // A drafter checkpoint given as the target says what it is (a check on the values alone
        // would speak of a layer count).
        let archs: Vec<&str> = v.get("architectures").and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        if v.get("dflash_config").is_some() || archs.iter().any(|a| a.contains("DSpark") || a.contains("DFlash")) {
            return Err(Error::config(
                path,
                "architectures",
                format!("{archs:?}: this is a drafter checkpoint, not a target model (pass it as the drafter, and a target model as the target)"),
            ));
        }
        let mt = v.get("model_type").and_then(Value::as_str).ok_or_else(|| Error::config(path, "model_type", "missing"))?;
        let arch = Arch::parse(mt).ok_or_else(|| Error::config(path, "model_type", format!("`{mt}` is not supported (llama, qwen2, qwen3)")))?;
        let hidden = k.usize("hidden_size")?;
        let n_heads = k.usize("num_attention_heads")?;
        k.activation()?;
        if k.bool_or("use_sliding_window", false)? {
            return Err(Error::config(
                path,
                "use_sliding_window",
                "true: sliding-window attention is not supported (this engine attends to the whole context)",
            ));
        }
        let derived_head_dim = v.get("head_dim").is_none_or(Value::is_null);
        let cfg = TargetConfig {
            arch,
            geometry: ModelGeometry::from_hf(&k, k.usize("vocab_size")?, hidden, k.usize("num_hidden_layers")?, n_heads)?,
            tie_embeddings: k.bool_or("tie_word_embeddings", false)?,
            qkv_bias: k.bool_or("attention_bias", arch == Arch::Qwen2)?,
            qk_norm: arch == Arch::Qwen3,
            max_positions: k.usize_or("max_position_embeddings", 4096)?,
            bos: k.ids("bos_token_id")?.first().copied(),
            eos: k.ids("eos_token_id")?,
        };
        cfg.validate(&Check { path, key: &|k| k.to_string() }, derived_head_dim)?;
        Ok(cfg)
    }

    /// Read the config from GGUF metadata (`{arch}.block_count`, `.embedding_length`, ...).
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let path = g.path.as_path();
        let ge = Error::from;
        let arch_name = g.get_str("general.architecture").map_err(ge)?;
        let arch = Arch::parse(arch_name)
            .ok_or_else(|| Error::config(path, "general.architecture", format!("`{arch_name}` is not supported (llama, qwen2, qwen3)")))?;
        let key = |s: &str| format!("{arch_name}.{s}");
        let hidden = g.get_u64(&key("embedding_length")).map_err(ge)? as usize;
        let n_heads = g.get_u64(&key("attention.head_count")).map_err(ge)? as usize;
        let n_kv_heads = g.get_u64(&key("attention.head_count_kv")).map(|x| x as usize).unwrap_or(n_heads);
        let head_dim = g.get_u64(&key("attention.key_length")).map(|x| x as usize).unwrap_or(hidden / n_heads.max(1));
        let derived_head_dim = g.get_u64(&key("attention.key_length")).is_err();
        let vocab = match g.tensor("token_embd.weight") {
            Some(t) if t.dims.len() == 2 => t.dims[1] as usize,
            _ => return Err(Error::tensor(path, "token_embd.weight", "missing or not 2-D")),
        };
        if let Ok(declared) = g.get_u64(&key("vocab_size")) {
            if declared != vocab as u64 {
                return Err(Error::config(path, &key("vocab_size"), format!("{declared}, but token_embd.weight has {vocab} vocabulary rows")));
            }
        }
        let tok_id = |k: &str| g.get_u64(k).ok().map(|x| x as u32);
        let mut eos: Vec<u32> = Vec::new();
        for k in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
            if let Some(id) = tok_id(k) {
                if !eos.contains(&id) {
                    eos.push(id);
                }
            }
        }
        let cfg = TargetConfig {
            arch,
            geometry: ModelGeometry {
                vocab,
                hidden,
                layers: g.get_u64(&key("block_count")).map_err(ge)? as usize,
                n_heads,
                n_kv_heads,
                head_dim,
                intermediate: g.get_u64(&key("feed_forward_length")).map_err(ge)? as usize,
                rms_eps: g.get_f64(&key("attention.layer_norm_rms_epsilon")).map_err(ge)? as f32,
                rope_theta: g.get_f64(&key("rope.freq_base")).unwrap_or(10000.0) as f32,
            },
            tie_embeddings: g.tensor("output.weight").is_none(),
            qkv_bias: g.tensor("blk.0.attn_q.bias").is_some(),
            qk_norm: g.tensor("blk.0.attn_q_norm.weight").is_some(),
            max_positions: g.get_u64(&key("context_length")).map(|x| x as usize).unwrap_or(4096),
            bos: tok_id("tokenizer.ggml.bos_token_id"),
            eos,
        };
        cfg.validate(&Check { path, key: &|k| gguf_key(arch_name, k) }, derived_head_dim)?;
        // RoPE rotates the whole head here; a partial rotary dimension would be ignored.
        if let Ok(rd) = g.get_u64(&key("rope.dimension_count")) {
            if rd as usize != cfg.head_dim {
                return Err(Error::config(
                    path,
                    &key("rope.dimension_count"),
                    format!("{rd}, but the head dimension is {}: partial rotary embeddings are not supported", cfg.head_dim),
                ));
            }
        }
        // The layer count sizes allocations: it cannot exceed the layers the file holds.
        let present = (0..cfg.layers).take_while(|i| g.tensor(&format!("blk.{i}.attn_norm.weight")).is_some()).count();
        if present < cfg.layers {
            return Err(Error::config(
                path,
                &key("block_count"),
                format!("{}: the file holds only {present} layers (blk.0 … blk.{})", cfg.layers, present.saturating_sub(1)),
            ));
        }
        Ok(cfg)
    }

    /// Every value that sizes something: positive, in range, consistent.
    fn validate(&self, c: &Check<'_>, derived_head_dim: bool) -> Result<()> {
        self.geometry.validate(c, derived_head_dim)?;
        c.count("max_position_embeddings", self.max_positions, MAX_POSITIONS)?;
        if let Some(&id) = self.eos.iter().find(|&&id| id as usize >= self.vocab) {
            return Err(c.err("eos_token_id", format!("{id} is outside the vocabulary of {}", self.vocab)));
        }
        if let Some(id) = self.bos.filter(|&id| id as usize >= self.vocab) {
            return Err(c.err("bos_token_id", format!("{id} is outside the vocabulary of {}", self.vocab)));
        }
        Ok(())
    }

    /// The HF `config.json` for this target (used by `synth` / tests writing random models).
    pub fn to_hf_json(&self) -> Value {
        self.geometry.hf_json(serde_json::json!({
            "architectures": [match self.arch { Arch::Llama => "LlamaForCausalLM", Arch::Qwen2 => "Qwen2ForCausalLM", Arch::Qwen3 => "Qwen3ForCausalLM" }],
            "model_type": self.arch.name(),
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_embeddings,
            "attention_bias": self.qkv_bias,
            "max_position_embeddings": self.max_positions,
            "bos_token_id": self.bos,
            "eos_token_id": self.eos,
            "hidden_act": "silu",
        }))
    }
}

impl DrafterConfig {
    /// Parse a drafter `config.json`: DFlash (nested `dflash_config`) or DSpark (flat keys,
    /// `architectures: ["Qwen3DSparkModel"]`).
    pub fn from_hf_json(path: &Path, v: &Value) -> Result<Self> {
        let k = Keys { path, v };
        let archs: Vec<&str> = v.get("architectures").and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        let nested = v.get("dflash_config");
        let kind = if archs.iter().any(|a| a.contains("DSpark")) {
            DrafterKind::DSpark
        } else if nested.is_some() || archs.iter().any(|a| a.contains("DFlash")) {
            DrafterKind::DFlash
        } else {
            return Err(Error::config(
                path,
                "architectures",
                format!("{archs:?} is neither a DFlash (`DFlashDraftModel`, `dflash_config`) nor a DSpark (`Qwen3DSparkModel`) drafter"),
            ));
        };
        let hidden = k.usize("hidden_size")?;
        let n_heads = k.usize("num_attention_heads")?;
        let layers = k.usize("num_hidden_layers")?;
        let (mask_token_id, target_layer_ids) = match kind {
            DrafterKind::DFlash => {
                let n = nested.ok_or_else(|| Error::config(path, "dflash_config", "missing"))?;
                let nk = Keys { path, v: n };
                let mask = nk.usize("mask_token_id").map_err(|_| Error::config(path, "dflash_config.mask_token_id", "missing or not an integer"))?;
                let ids = match n.get("target_layer_ids").and_then(Value::as_array) {
                    Some(a) => k.layer_ids("dflash_config.target_layer_ids", a)?,
                    None => default_target_layer_ids(k.usize("num_target_layers")?, layers),
                };
                (mask as u32, ids)
            }
            DrafterKind::DSpark => {
                let mask = k.usize("mask_token_id")?;
                let ids = match v.get("target_layer_ids").and_then(Value::as_array) {
                    Some(a) => k.layer_ids("target_layer_ids", a)?,
                    None => default_target_layer_ids(k.usize("num_target_layers")?, layers),
                };
                (mask as u32, ids)
            }
        };
        k.activation()?;
        match v.get("markov_head_type") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == "vanilla" => {}
            Some(other) => {
                return Err(Error::config(
                    path,
                    "markov_head_type",
                    format!("{other} is not supported (expected \"vanilla\": the low-rank W2·W1[prev] bias, reference §3.3)"),
                ))
            }
        }
        if target_layer_ids.is_empty() {
            return Err(Error::config(path, "target_layer_ids", "empty"));
        }
        let block_size = k.usize("block_size")?;
        if !(2..=MAX_DIM).contains(&block_size) {
            return Err(Error::config(path, "block_size", format!("{block_size} (expected 2..={MAX_DIM})")));
        }
        let derived_head_dim = v.get("head_dim").is_none_or(Value::is_null);
        let cfg = DrafterConfig {
            kind,
            geometry: ModelGeometry::from_hf(&k, k.usize("vocab_size")?, hidden, layers, n_heads)?,
            draft_vocab: match v.get("draft_vocab_size") {
                None | Some(Value::Null) => k.usize("vocab_size")?,
                Some(_) => k.usize("draft_vocab_size")?,
            },
            block_size,
            mask_token_id,
            target_layer_ids,
            markov_rank: if kind == DrafterKind::DSpark { k.usize_or("markov_rank", 0)? } else { 0 },
            confidence_head: kind == DrafterKind::DSpark && k.bool_or("enable_confidence_head", false)?,
            reduced: v.get("draft_vocab_size").is_some_and(|x| !x.is_null()),
        };
        let c = Check { path, key: &|k| k.to_string() };
        cfg.geometry.validate(&c, derived_head_dim)?;
        c.count("draft_vocab_size", cfg.draft_vocab, cfg.vocab)?;
        if cfg.markov_rank > MAX_DIM {
            return Err(c.err("markov_rank", format!("{}: expected ≤ {MAX_DIM}", cfg.markov_rank)));
        }
        if cfg.target_layer_ids.len() > MAX_DIM {
            return Err(c.err("target_layer_ids", format!("{} entries: expected ≤ {MAX_DIM}", cfg.target_layer_ids.len())));
        }
        Ok(cfg)
    }

    /// The HF `config.json` of this drafter, in the spelling its kind uses.
    pub fn to_hf_json(&self, num_target_layers: usize) -> Value {
        let mut v = self.geometry.hf_json(serde_json::json!({
            "model_type": "qwen3",
            "block_size": self.block_size,
            "num_target_layers": num_target_layers,
            "hidden_act": "silu",
            "attention_bias": false,
            "max_position_embeddings": 32768,
        }));
        let o = v.as_object_mut().expect("json object literal");
        if self.is_reduced() {
            o.insert("draft_vocab_size".into(), serde_json::json!(self.draft_vocab));
        }
        match self.kind {
            DrafterKind::DFlash => {
                o.insert("architectures".into(), serde_json::json!(["DFlashDraftModel"]));
                o.insert("rope_theta".into(), serde_json::json!(self.rope_theta));
                o.insert("dflash_config".into(), serde_json::json!({"mask_token_id": self.mask_token_id, "target_layer_ids": self.target_layer_ids}));
            }
            DrafterKind::DSpark => {
                o.insert("architectures".into(), serde_json::json!(["Qwen3DSparkModel"]));
                o.insert("rope_parameters".into(), serde_json::json!({"rope_theta": self.rope_theta, "rope_type": "default"}));
                o.insert("mask_token_id".into(), serde_json::json!(self.mask_token_id));
                o.insert("target_layer_ids".into(), serde_json::json!(self.target_layer_ids));
                o.insert("markov_rank".into(), serde_json::json!(self.markov_rank));
                o.insert("markov_head_type".into(), serde_json::json!("vanilla"));
                o.insert("enable_confidence_head".into(), serde_json::json!(self.confidence_head));
                o.insert("confidence_head_with_markov".into(), serde_json::json!(self.confidence_head));
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tap_layers_match_zlab_for_qwen3() {
        assert_eq!(default_target_layer_ids(36, 5), vec![1, 9, 17, 25, 33]);
        assert_eq!(default_target_layer_ids(36, 1), vec![18]);
    }

    #[test]
    fn dspark_rope_parameters_spelling() {
        let v = serde_json::json!({
            "architectures": ["Qwen3DSparkModel"], "hidden_size": 64, "num_attention_heads": 4,
            "num_hidden_layers": 1, "intermediate_size": 128, "vocab_size": 100, "block_size": 7,
            "mask_token_id": 99, "target_layer_ids": [1], "markov_rank": 8,
            "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}
        });
        let c = DrafterConfig::from_hf_json(Path::new("x/config.json"), &v).unwrap();
        assert_eq!(c.rope_theta, 1e6);
        assert_eq!(c.kind, DrafterKind::DSpark);
        assert_eq!(c.draft_depth(), 7);
        assert_eq!(c.head_dim, 16);
    }

    fn dspark_json() -> Value {
        serde_json::json!({
            "architectures": ["Qwen3DSparkModel"], "hidden_size": 64, "num_attention_heads": 4,
            "num_hidden_layers": 1, "intermediate_size": 128, "vocab_size": 100, "block_size": 7,
            "mask_token_id": 99, "target_layer_ids": [1, 3], "markov_rank": 8, "rope_theta": 10000.0,
            "hidden_act": "silu", "markov_head_type": "vanilla"
        })
    }

    fn drafter_err(edit: impl FnOnce(&mut Value)) -> String {
        let mut v = dspark_json();
        edit(&mut v);
        DrafterConfig::from_hf_json(Path::new("d/config.json"), &v).unwrap_err().to_string()
    }

    #[test]
    fn unsupported_keys_are_refused_by_name() {
        assert_eq!(DrafterConfig::from_hf_json(Path::new("d/config.json"), &dspark_json()).unwrap().target_layer_ids, vec![1, 3]);
        let e = drafter_err(|v| v["hidden_act"] = "gelu".into());
        assert!(e.contains("d/config.json") && e.contains("hidden_act") && e.contains("gelu"), "{e}");
        let e = drafter_err(|v| v["markov_head_type"] = "gated".into());
        assert!(e.contains("markov_head_type") && e.contains("gated") && e.contains("vanilla"), "{e}");
        let e = drafter_err(|v| v["target_layer_ids"] = serde_json::json!([1, "3"]));
        assert!(e.contains("target_layer_ids") && e.contains("entry 1"), "{e}");
        let t = serde_json::json!({
            "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
            "intermediate_size": 128, "vocab_size": 100, "rope_theta": 10000.0, "hidden_act": "relu"
        });
        let e = TargetConfig::from_hf_json(Path::new("t/config.json"), &t).unwrap_err().to_string();
        assert!(e.contains("t/config.json") && e.contains("hidden_act") && e.contains("relu"), "{e}");
    }

    #[test]
    fn missing_key_is_named() {
        let v = serde_json::json!({"model_type": "qwen3", "hidden_size": 64});
        let e = TargetConfig::from_hf_json(Path::new("m/config.json"), &v).unwrap_err().to_string();
        assert!(e.contains("m/config.json") && e.contains("num_attention_heads"), "{e}");
    }
}
