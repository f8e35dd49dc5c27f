//! Helpers shared by the integration tests: random models written to a temporary directory
//! and loaded back through the real loaders.
#![allow(dead_code)]

pub mod cli;
pub mod conformance;

use sparkling::core::{Backend, SampleParams};
use sparkling::cpu::CpuBackend;
use sparkling::decode::propose::{TreeParams, TreePrep};
use sparkling::decode::{GenParams, Method};
use sparkling::loader::open_source;
use sparkling::model::config::{read_json, Arch, DrafterConfig, DrafterKind, TargetConfig};
use sparkling::model::drafter::Drafter;
use sparkling::model::synth::{tiny_target_config, write_random_drafter, write_random_target, DrafterInit, StoreDtype};
use sparkling::model::target::Target;
use std::path::{Path, PathBuf};

/// Deterministic pseudo-random values in [-scale, scale) (xorshift64 from `seed`).
pub fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// The project's SplitMix64 stream ([`sparkling::decode::rng::splitmix64_next`]): uniforms in
/// [-1, 1) or [0, 1), indices.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        sparkling::decode::rng::splitmix64_next(&mut self.0)
    }
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    /// A uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform()).collect()
    }
    /// A uniform index in 0..n (0 when n = 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

/// Assert `|got - want| <= abs + rel * |want|` elementwise; prints the worst error.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], abs: f32, rel: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, 0.0f32);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        let tol = abs + rel * w.abs();
        assert!(err <= tol, "{what}: element {i}: got {g}, want {w} (error {err:e} > tolerance {tol:e})");
        if err > worst.1 {
            worst = (i, err);
        }
    }
    eprintln!("{what}: max abs error {:e} (at {}), tolerance {abs:e} + {rel:e}·|want|", worst.1, worst.0);
}

/// Assert bit equality.
pub fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what}: element {i}: {g} vs {w}");
    }
}

/// A fresh temporary directory (removed when dropped).
pub fn tmpdir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("sparkling-{tag}-")).tempdir().expect("temp dir")
}

/// Write and load a random target of `arch` with `vocab` rows.
pub fn random_target(dir: &Path, arch: Arch, vocab: usize, seed: u64) -> Target<CpuBackend> {
    let cfg = tiny_target_config(arch, vocab);
    write_random_target(dir, &cfg, seed, StoreDtype::F32).expect("write target");
    load_target(&CpuBackend::new(), dir)
}

/// Load a target from an HF directory onto `b`.
pub fn load_target<B: Backend>(b: &B, dir: &Path) -> Target<B> {
    let (cp, v) = read_json(dir).expect("config");
    let cfg = TargetConfig::from_hf_json(&cp, &v).expect("parse config");
    let src = open_source(dir).expect("open");
    Target::load(b, src.as_ref(), cfg, &|_, _| {}).expect("load target")
}

/// Write a random 1-layer bf16 drafter of `kind` for `target` into `dir`, with a Markov head
/// of `rank` (0: none).
pub fn write_drafter_with_rank(dir: &Path, target: &TargetConfig, kind: DrafterKind, block: usize, rank: usize, seed: u64) {
    let init =
        DrafterInit { kind, layers: 1, block_size: block, markov_rank: rank, taps: 2, mask_token_id: None, confidence_head: kind == DrafterKind::DSpark };
    write_random_drafter(dir, target, &init, seed, StoreDtype::Bf16).expect("write drafter");
}

/// Write a random 1-layer drafter of `kind` (DSpark: Markov rank 8) for `target` into `dir`.
pub fn write_drafter(dir: &Path, target: &TargetConfig, kind: DrafterKind, block: usize, seed: u64) {
    write_drafter_with_rank(dir, target, kind, block, if kind == DrafterKind::DSpark { 8 } else { 0 }, seed);
}

/// Write and load (on the CPU) a random drafter for `target`.
pub fn random_drafter(dir: &Path, target: &TargetConfig, kind: DrafterKind, block: usize, rank: usize, seed: u64) -> Drafter<CpuBackend> {
    write_drafter_with_rank(dir, target, kind, block, rank, seed);
    load_drafter(&CpuBackend::new(), dir, target)
}

/// Load a drafter checkpoint directory against `target` on `b`.
pub fn load_drafter<B: Backend>(b: &B, dir: &Path, target: &TargetConfig) -> Drafter<B> {
    let (cp, v) = read_json(dir).expect("drafter config");
    let cfg = DrafterConfig::from_hf_json(&cp, &v).expect("parse drafter config");
    let src = open_source(dir).expect("open drafter");
    Drafter::load(b, src.as_ref(), cfg, target).expect("load drafter")
}

/// Generation parameters for tests.
pub fn params(method: Method, budget: usize, temperature: f32, seed: u64, max_new: usize, stop: Vec<u32>) -> GenParams {
    GenParams {
        method,
        tree: TreeParams { budget, candidates: 16, max_fanout: 64, treespark_k: 4, prep: TreePrep::Host },
        sampling: SampleParams { temperature, top_k: 0, top_p: 1.0 },
        seed,
        max_new_tokens: max_new,
        stop,
        auto_budget: None,
        lookup: sparkling::decode::LookupGraft::OFF,
    }
}

/// Path of an asset, if present.
pub fn asset(name: &str) -> Option<PathBuf> {
    let p = sparkling::assets::path(name);
    p.exists().then_some(p)
}

pub const ARCHS: [Arch; 3] = [Arch::Llama, Arch::Qwen2, Arch::Qwen3];

/// A checkpoint served as ggml blocks of `ggml_type` (Q4_0 or Q4_1): every matrix whose rows
/// are a multiple of 32 values is quantized on the fly with ggml's reference quantizers
/// (`quantize_row_q4_0_ref`, `quantize_row_q4_1_ref`), the way a GGUF file would hold it.
pub struct Quant4Source {
    pub inner: Box<dyn sparkling::loader::TensorSource>,
    pub ggml_type: u32,
}

/// ggml's reference 4- or 5-bit quantization of one row (`x.len()` a multiple of 32) into
/// blocks (`quantize_row_q4_0_ref`, `_q4_1_ref`, `_q5_0_ref`).
pub fn quantize_row_q4(ggml_type: u32, x: &[f32]) -> Vec<u8> {
    use half::f16;
    let mut out = Vec::new();
    for blk in x.chunks_exact(32) {
        let mut codes = [0u8; 32];
        if ggml_type == sparkling::core::ggml::Q5_0 {
            let max = blk.iter().copied().fold(0.0f32, |m, v| if v.abs() > m.abs() { v } else { m });
            let d = max / -16.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let mut qh = 0u32;
            for (t, (c, &v)) in codes.iter_mut().zip(blk).enumerate() {
                let q = ((v * id + 16.5) as i8).clamp(0, 31) as u8;
                *c = q & 15;
                qh |= ((q >> 4) as u32) << t;
            }
            out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
            out.extend_from_slice(&qh.to_le_bytes());
        } else if ggml_type == sparkling::core::ggml::Q4_1 {
            let min = blk.iter().copied().fold(f32::INFINITY, f32::min);
            let max = blk.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let d = (max - min) / 15.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            for (c, &v) in codes.iter_mut().zip(blk) {
                *c = (((v - min) * id + 0.5) as u8).min(15);
            }
            out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
            out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
        } else {
            let max = blk.iter().copied().fold(0.0f32, |m, v| if v.abs() > m.abs() { v } else { m });
            let d = max / -8.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            for (c, &v) in codes.iter_mut().zip(blk) {
                *c = ((v * id + 8.5) as i8).clamp(0, 15) as u8;
            }
            out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        }
        for j in 0..16 {
            out.push(codes[j] | (codes[j + 16] << 4));
        }
    }
    out
}

impl sparkling::loader::TensorSource for Quant4Source {
    fn path(&self) -> &Path {
        self.inner.path()
    }
    fn contains(&self, name: &str) -> bool {
        self.inner.contains(name)
    }
    fn names(&self) -> Vec<String> {
        self.inner.names()
    }
    fn load(&self, name: &str) -> sparkling::Result<sparkling::loader::HostTensor> {
        self.inner.load(name)
    }
    fn ggml_type(&self, _name: &str) -> Option<u32> {
        Some(self.ggml_type)
    }
    fn load_ggml(&self, name: &str, shape: [usize; 2]) -> sparkling::Result<Option<sparkling::core::GgmlWeight>> {
        let t = self.inner.load_shaped(name, &shape)?;
        let [n, k] = shape;
        if k % 32 != 0 {
            return Ok(None);
        }
        let bytes = t.data.chunks_exact(k).flat_map(|r| quantize_row_q4(self.ggml_type, r)).collect();
        Ok(Some(sparkling::core::GgmlWeight { ggml_type: self.ggml_type, n, k, bytes }))
    }
}

/// Write a random target of `arch` and load it on `b` with its matrices as `weights`:
/// `"q8_0"` (the backend quantizes at upload) or `"q4_0"` / `"q4_1"` / `"q5_0"` (ggml blocks from
/// [`Quant4Source`], kept as stored).
pub fn random_quant_target(dir: &Path, arch: Arch, vocab: usize, seed: u64, weights: &str) -> Target<CpuBackend> {
    use sparkling::cpu::WeightDtype;
    let cfg = tiny_target_config(arch, vocab);
    write_random_target(dir, &cfg, seed, StoreDtype::F32).expect("write target");
    let (cp, v) = read_json(dir).expect("config");
    let cfg = TargetConfig::from_hf_json(&cp, &v).expect("parse config");
    let src = open_source(dir).expect("open");
    let (dtype, t) = match weights {
        "q8_0" => (WeightDtype::Q8_0, None),
        "q4_0" => (WeightDtype::Native, Some(sparkling::core::ggml::Q4_0)),
        "q4_1" => (WeightDtype::Native, Some(sparkling::core::ggml::Q4_1)),
        "q5_0" => (WeightDtype::Native, Some(sparkling::core::ggml::Q5_0)),
        other => panic!("random_quant_target: unknown weights {other}"),
    };
    let b = CpuBackend::with_weight_dtype(dtype);
    let target = match t {
        None => Target::load(&b, src.as_ref(), cfg, &|_, _| {}),
        Some(ggml_type) => Target::load(&b, &Quant4Source { inner: src, ggml_type }, cfg, &|_, _| {}),
    }
    .expect("load quantized target");
    let kinds = target.kernel_paths(&b);
    assert!(kinds.contains(weights), "{weights} target runs on {kinds}");
    target
}
