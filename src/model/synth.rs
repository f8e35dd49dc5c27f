//! Random-weight checkpoints in HF layout (config.json + model.safetensors): targets of any
//! supported arch for tests and timing, and untrained DFlash / DSpark drafters sized for a
//! target (`sparkling init-drafter`), so every method runs before any drafter is trained.

use super::config::{default_target_layer_ids, Arch, DrafterConfig, DrafterKind, ModelGeometry, TargetConfig};
use crate::decode::rng::splitmix64;
use crate::error::{Error, Result};
use safetensors::tensor::{Dtype, TensorView};
use std::path::Path;

/// Storage precision of written tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreDtype {
    /// 32-bit float.
    F32,
    /// bfloat16 (what published checkpoints use).
    Bf16,
}

/// Deterministic pseudo-random tensors (SplitMix64 stream, uniform in ±scale).
struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(1);
        let x = splitmix64(self.0);
        ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn tensor(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }
    fn norm(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| 1.0 + 0.1 * self.uniform()).collect()
    }
}

/// Tensors waiting to be written: name, shape, values.
#[derive(Default)]
struct Pending(Vec<(String, Vec<usize>, Vec<f32>)>);

impl Pending {
    fn add(&mut self, name: impl Into<String>, shape: &[usize], data: Vec<f32>) {
        self.0.push((name.into(), shape.to_vec(), data));
    }

    /// One decoder layer of geometry `g` (q/k/v biases with `bias`, per-head q/k norms with
    /// `qk_norm`) under `prefix`.
    fn layer(&mut self, rng: &mut Rng, prefix: &str, g: &ModelGeometry, bias: bool, qk_norm: bool) {
        let (h, nh, nkv, hd, inter) = (g.hidden, g.n_heads, g.n_kv_heads, g.head_dim, g.intermediate);
        let (q, kv) = (nh * hd, nkv * hd);
        let s = |k: usize| 1.0 / (k as f32).sqrt();
        self.add(format!("{prefix}input_layernorm.weight"), &[h], rng.norm(h));
        self.add(format!("{prefix}self_attn.q_proj.weight"), &[q, h], rng.tensor(q * h, s(h)));
        self.add(format!("{prefix}self_attn.k_proj.weight"), &[kv, h], rng.tensor(kv * h, s(h)));
        self.add(format!("{prefix}self_attn.v_proj.weight"), &[kv, h], rng.tensor(kv * h, s(h)));
        self.add(format!("{prefix}self_attn.o_proj.weight"), &[h, q], rng.tensor(h * q, s(q)));
        if bias {
            self.add(format!("{prefix}self_attn.q_proj.bias"), &[q], rng.tensor(q, 0.1));
            self.add(format!("{prefix}self_attn.k_proj.bias"), &[kv], rng.tensor(kv, 0.1));
            self.add(format!("{prefix}self_attn.v_proj.bias"), &[kv], rng.tensor(kv, 0.1));
        }
        if qk_norm {
            self.add(format!("{prefix}self_attn.q_norm.weight"), &[hd], rng.norm(hd));
            self.add(format!("{prefix}self_attn.k_norm.weight"), &[hd], rng.norm(hd));
        }
        self.add(format!("{prefix}post_attention_layernorm.weight"), &[h], rng.norm(h));
        self.add(format!("{prefix}mlp.gate_proj.weight"), &[inter, h], rng.tensor(inter * h, s(h)));
        self.add(format!("{prefix}mlp.up_proj.weight"), &[inter, h], rng.tensor(inter * h, s(h)));
        self.add(format!("{prefix}mlp.down_proj.weight"), &[h, inter], rng.tensor(h * inter, s(inter)));
    }

    /// Encode to `dtype` and hand the tensor views to `sink` (serialize in memory or stream
    /// to a file); `path` names the file in errors.
    fn encode<T>(self, path: &Path, dtype: StoreDtype, sink: impl FnOnce(Vec<(String, TensorView<'_>)>) -> Result<T>) -> Result<T> {
        let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = self
            .0
            .into_iter()
            .map(|(n, s, d)| {
                let b = match dtype {
                    StoreDtype::F32 => d.iter().flat_map(|v| v.to_le_bytes()).collect(),
                    StoreDtype::Bf16 => d.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect(),
                };
                (n, s, b)
            })
            .collect();
        let st_dtype = match dtype {
            StoreDtype::F32 => Dtype::F32,
            StoreDtype::Bf16 => Dtype::BF16,
        };
        let views = bytes
            .iter()
            .map(|(n, s, b)| TensorView::new(st_dtype, s.clone(), b).map(|v| (n.clone(), v)).map_err(|e| Error::tensor(path, n, e.to_string())))
            .collect::<Result<Vec<_>>>()?;
        sink(views)
    }

    /// The tensors as safetensors bytes in memory.
    fn serialize(self, path: &Path, dtype: StoreDtype) -> Result<Vec<u8>> {
        self.encode(path, dtype, |views| safetensors::serialize(views, None).map_err(|e| Error::file(path, format!("cannot serialize safetensors: {e}"))))
    }

    /// Stream the tensors to the safetensors file `to` (no second in-memory copy: presets are
    /// GBs); errors name `shown`.
    fn write(self, to: &Path, shown: &Path, dtype: StoreDtype) -> Result<()> {
        self.encode(shown, dtype, |views| crate::fsio::write_safetensors(to, shown, views, None))
    }
}

fn write_config(dir: &Path, v: &serde_json::Value) -> Result<()> {
    let p = dir.join("config.json");
    let text = serde_json::to_string_pretty(v).map_err(|e| Error::file(&p, e.to_string()))?;
    std::fs::write(&p, text).map_err(|e| Error::file(&p, format!("cannot write: {e}")))
}

/// Refuse, before allocating, a checkpoint of `params` values that cannot be held: the f32
/// values plus their encoded copy must fit in the address space and in one reservation the
/// allocator grants, so an absurd size is an error naming `dir`, not an abort.
fn check_alloc(dir: &Path, params: f64, dtype: StoreDtype) -> Result<()> {
    let per = 4.0 + if dtype == StoreDtype::F32 { 4.0 } else { 2.0 };
    let bytes = params * per;
    let gb = bytes / 1e9;
    if bytes.is_nan() || bytes >= (isize::MAX / 2) as f64 || Vec::<u8>::new().try_reserve_exact(bytes as usize).is_err() {
        return Err(Error::file(dir, format!("a checkpoint of {params:.3e} values needs {gb:.1} GB of memory to write, which cannot be allocated here")));
    }
    Ok(())
}

/// The number of values [`random_target_tensors`] draws for `cfg` (f64: never overflows).
fn target_params(cfg: &TargetConfig) -> f64 {
    let f = |x: usize| x as f64;
    let (v, h, hd, inter) = (f(cfg.vocab), f(cfg.hidden), f(cfg.head_dim), f(cfg.intermediate));
    let (q, kv) = (f(cfg.n_heads) * hd, f(cfg.n_kv_heads) * hd);
    let layer = 2.0 * h + 2.0 * q * h + 2.0 * kv * h + 3.0 * inter * h + q + 2.0 * kv + 2.0 * hd;
    v * h * if cfg.tie_embeddings { 1.0 } else { 2.0 } + h + f(cfg.layers) * layer
}

/// Write a random target checkpoint of `cfg` into `dir`, atomically: the checkpoint is built in
/// a temporary sibling directory and moved into place when complete ([`crate::fsio::publish_dir`]),
/// so a failure or an interruption never leaves a half-written `dir`. Existing files of the same
/// names in `dir` are replaced (the CLI asks for `--force` first).
pub fn write_random_target(dir: &Path, cfg: &TargetConfig, seed: u64, dtype: StoreDtype) -> Result<()> {
    check_alloc(dir, target_params(cfg), dtype)?;
    let t = random_target_tensors(cfg, seed);
    crate::fsio::publish_dir(dir, |tmp| {
        t.write(&tmp.join("model.safetensors"), &dir.join("model.safetensors"), dtype)?;
        write_config(tmp, &cfg.to_hf_json())
    })
}

/// The `model.safetensors` bytes of the random target [`write_random_target`] writes (same
/// seed, same values), built in memory (browser tests; no file system needed).
pub fn random_target_bytes(cfg: &TargetConfig, seed: u64, dtype: StoreDtype) -> Result<Vec<u8>> {
    random_target_tensors(cfg, seed).serialize(Path::new("model.safetensors"), dtype)
}

fn random_target_tensors(cfg: &TargetConfig, seed: u64) -> Pending {
    let mut rng = Rng(seed);
    let mut t = Pending::default();
    let (v, h) = (cfg.vocab, cfg.hidden);
    t.add("model.embed_tokens.weight", &[v, h], rng.tensor(v * h, 1.0));
    for i in 0..cfg.layers {
        t.layer(&mut rng, &format!("model.layers.{i}."), &cfg.geometry, cfg.qkv_bias, cfg.qk_norm);
    }
    t.add("model.norm.weight", &[h], rng.norm(h));
    if !cfg.tie_embeddings {
        t.add("lm_head.weight", &[v, h], rng.tensor(v * h, 1.0 / (h as f32).sqrt()));
    }
    t
}

/// A small target config of `arch` for tests: `vocab`, hidden 64, 4 layers, 4/2 heads of 16.
pub fn tiny_target_config(arch: Arch, vocab: usize) -> TargetConfig {
    TargetConfig {
        arch,
        geometry: ModelGeometry {
            vocab,
            hidden: 64,
            layers: 4,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 16,
            intermediate: 128,
            rms_eps: 1e-6,
            rope_theta: 10000.0,
        },
        tie_embeddings: arch == Arch::Llama,
        qkv_bias: arch == Arch::Qwen2,
        qk_norm: arch == Arch::Qwen3,
        max_positions: 4096,
        bos: None,
        eos: vec![vocab as u32 - 1],
    }
}

/// Real model geometries that `sparkling synth --preset` writes with random weights, so the
/// paper's shapes can be timed where the real weights cannot be downloaded.
pub const PRESETS: [&str; 3] = ["qwen3-4b", "qwen3-8b", "smollm2-135m"];

/// The target config of a preset in [`PRESETS`] (reference §1 tables: Qwen3-4B/8B config.json;
/// SmolLM2-135M-Instruct), or `None` for an unknown name.
pub fn preset_target_config(name: &str) -> Option<TargetConfig> {
    let qwen3 = |hidden, layers, intermediate, tie| TargetConfig {
        arch: Arch::Qwen3,
        geometry: ModelGeometry {
            vocab: 151_936,
            hidden,
            layers,
            n_heads: 32,
            n_kv_heads: 8,
            head_dim: 128,
            intermediate,
            rms_eps: 1e-6,
            rope_theta: 1_000_000.0,
        },
        tie_embeddings: tie,
        qkv_bias: false,
        qk_norm: true,
        max_positions: 40_960,
        bos: None,
        eos: vec![151_645, 151_643],
    };
    Some(match name {
        "qwen3-4b" => qwen3(2560, 36, 9728, true),
        "qwen3-8b" => qwen3(4096, 36, 12288, false),
        "smollm2-135m" => TargetConfig {
            arch: Arch::Llama,
            geometry: ModelGeometry {
                vocab: 49_152,
                hidden: 576,
                layers: 30,
                n_heads: 9,
                n_kv_heads: 3,
                head_dim: 64,
                intermediate: 1536,
                rms_eps: 1e-5,
                rope_theta: 100_000.0,
            },
            tie_embeddings: true,
            qkv_bias: false,
            qk_norm: false,
            max_positions: 8192,
            bos: Some(1),
            eos: vec![2],
        },
        _ => return None,
    })
}

/// Options of `init-drafter`.
#[derive(Debug, Clone)]
pub struct DrafterInit {
    /// DFlash or DSpark.
    pub kind: DrafterKind,
    /// Draft layers.
    pub layers: usize,
    /// Block size Bk.
    pub block_size: usize,
    /// Markov rank r (DSpark only; 0 = none).
    pub markov_rank: usize,
    /// Number of tapped target layers.
    pub taps: usize,
    /// Mask token id (default: the last vocabulary row).
    pub mask_token_id: Option<u32>,
    /// Write a confidence head (DSpark).
    pub confidence_head: bool,
}

/// The most tap layers a drafter can take from a target of `target_layers` layers (≥ 3): the
/// taps are distinct layers spread from 1 to N−3 (reference §2.2), and one tap (the middle
/// layer) always fits.
pub fn max_taps(target_layers: usize) -> usize {
    target_layers.saturating_sub(3).max(1)
}

/// The tap count `init-drafter` / `synth` use when `--taps` is not given: `preferred`, or fewer
/// on a shallow target ([`max_taps`]).
pub fn default_taps(target_layers: usize, preferred: usize) -> usize {
    preferred.min(max_taps(target_layers))
}

/// Check `init` against the target it is sized for, before anything is allocated: every size
/// is bounded by what it can mean. Errors name the `init-drafter` argument.
pub fn check_drafter_init(target: &TargetConfig, init: &DrafterInit) -> Result<()> {
    let bad = |m: String| Err(Error::Input(m));
    if init.layers == 0 || init.layers > target.layers {
        return bad(format!("--layers {} must be in 1..={} (the target's layer count)", init.layers, target.layers));
    }
    if init.block_size < 2 || init.block_size >= target.max_positions {
        return bad(format!("--block-size {} must be in 2..{} (the target's context)", init.block_size, target.max_positions));
    }
    if init.kind == DrafterKind::DSpark && init.markov_rank > target.vocab {
        return bad(format!("--markov-rank {} exceeds the vocabulary ({}): a rank above it means nothing", init.markov_rank, target.vocab));
    }
    if target.layers < 3 {
        return bad(format!("the target has {} layers; a drafter needs a target of ≥ 3 layers to tap", target.layers));
    }
    if init.taps == 0 || init.taps > max_taps(target.layers) {
        return bad(format!(
            "--taps {} must be in 1..={} (distinct layers from 1 to N-3 of a {}-layer target)",
            init.taps,
            max_taps(target.layers),
            target.layers
        ));
    }
    if let Some(m) = init.mask_token_id {
        if m as usize >= target.vocab {
            return bad(format!("--mask-token-id {m} is not below the vocabulary size {}", target.vocab));
        }
    }
    Ok(())
}

/// The drafter config `init` produces for `target` (geometry copied from the target; DSpark
/// borrows the target's embedding and lm_head, so neither is written).
pub fn drafter_config(target: &TargetConfig, init: &DrafterInit) -> DrafterConfig {
    DrafterConfig {
        kind: init.kind,
        // The target's geometry, with the drafter's own layer count.
        geometry: ModelGeometry { layers: init.layers, ..target.geometry },
        draft_vocab: target.vocab,
        block_size: init.block_size,
        mask_token_id: init.mask_token_id.unwrap_or(target.vocab as u32 - 1),
        target_layer_ids: default_target_layer_ids(target.layers, init.taps.max(1)),
        markov_rank: if init.kind == DrafterKind::DSpark { init.markov_rank } else { 0 },
        confidence_head: init.kind == DrafterKind::DSpark && init.confidence_head,
        reduced: false,
    }
}

/// The number of values [`random_drafter_tensors`] draws (f64: never overflows).
fn drafter_params(cfg: &DrafterConfig, target: &TargetConfig) -> f64 {
    let f = |x: usize| x as f64;
    let (h, hd, inter, r) = (f(cfg.hidden), f(cfg.head_dim), f(cfg.intermediate), f(cfg.markov_rank));
    let (q, kv) = (f(cfg.n_heads) * hd, f(cfg.n_kv_heads) * hd);
    let layer = 2.0 * h + 2.0 * q * h + 2.0 * kv * h + 3.0 * inter * h + 2.0 * hd;
    h * f(cfg.target_layer_ids.len()) * f(target.hidden) + 2.0 * h + f(cfg.layers) * layer + 2.0 * f(cfg.vocab) * r + h + r + 1.0
}

/// Write a randomly initialised drafter for `target` into `dir` (HF layout), atomically like
/// [`write_random_target`].
pub fn write_random_drafter(dir: &Path, target: &TargetConfig, init: &DrafterInit, seed: u64, dtype: StoreDtype) -> Result<DrafterConfig> {
    let cfg = drafter_config(target, init);
    check_alloc(dir, drafter_params(&cfg, target), dtype)?;
    let t = random_drafter_tensors(&cfg, target, seed);
    crate::fsio::publish_dir(dir, |tmp| {
        t.write(&tmp.join("model.safetensors"), &dir.join("model.safetensors"), dtype)?;
        write_config(tmp, &cfg.to_hf_json(target.layers))
    })?;
    Ok(cfg)
}

/// The config and `model.safetensors` bytes of the random drafter [`write_random_drafter`]
/// writes (same seed, same values), built in memory.
pub fn random_drafter_bytes(target: &TargetConfig, init: &DrafterInit, seed: u64, dtype: StoreDtype) -> Result<(DrafterConfig, Vec<u8>)> {
    let cfg = drafter_config(target, init);
    let bytes = random_drafter_tensors(&cfg, target, seed).serialize(Path::new("model.safetensors"), dtype)?;
    Ok((cfg, bytes))
}

fn random_drafter_tensors(cfg: &DrafterConfig, target: &TargetConfig, seed: u64) -> Pending {
    let mut rng = Rng(seed ^ 0xD4AF);
    let mut t = Pending::default();
    let h = cfg.hidden;
    let nf = cfg.target_layer_ids.len() * target.hidden;
    t.add("fc.weight", &[h, nf], rng.tensor(h * nf, 1.0 / (nf as f32).sqrt()));
    t.add("hidden_norm.weight", &[h], rng.norm(h));
    for l in 0..cfg.layers {
        t.layer(&mut rng, &format!("layers.{l}."), &cfg.geometry, false, true);
    }
    t.add("norm.weight", &[h], rng.norm(h));
    let r = cfg.markov_rank;
    if r > 0 {
        t.add("markov_head.markov_w1.weight", &[cfg.vocab, r], rng.tensor(cfg.vocab * r, 1.0));
        t.add("markov_head.markov_w2.weight", &[cfg.vocab, r], rng.tensor(cfg.vocab * r, 1.0 / (r as f32).sqrt()));
    }
    if cfg.confidence_head {
        t.add("confidence_head.proj.weight", &[1, h + r], rng.tensor(h + r, 0.05));
        t.add("confidence_head.proj.bias", &[1], vec![0.0]);
    }
    t
}
