//! Helpers shared by the integration tests: random models written to a temporary directory
//! and loaded back through the real loaders.
#![allow(dead_code)]

pub mod conformance;

use sparkling::core::SampleParams;
use sparkling::cpu::CpuBackend;
use sparkling::decode::propose::{TreeParams, TreePrep};
use sparkling::decode::{GenParams, Method};
use sparkling::loader::open_source;
use sparkling::model::config::{read_json, Arch, DrafterConfig, DrafterKind, TargetConfig};
use sparkling::model::drafter::Drafter;
use sparkling::model::synth::{tiny_target_config, write_random_drafter, write_random_target, DrafterInit, StoreDtype};
use sparkling::model::target::Target;
use std::path::{Path, PathBuf};

/// A fresh temporary directory (removed when dropped).
pub fn tmpdir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("sparkling-{tag}-")).tempdir().expect("temp dir")
}

/// Write and load a random target of `arch` with `vocab` rows.
pub fn random_target(dir: &Path, arch: Arch, vocab: usize, seed: u64) -> Target<CpuBackend> {
    let cfg = tiny_target_config(arch, vocab);
    write_random_target(dir, &cfg, seed, StoreDtype::F32).expect("write target");
    load_target(dir)
}

/// Load a target from an HF directory.
pub fn load_target(dir: &Path) -> Target<CpuBackend> {
    let (cp, v) = read_json(dir).expect("config");
    let cfg = TargetConfig::from_hf_json(&cp, &v).expect("parse config");
    let src = open_source(dir).expect("open");
    Target::load(&CpuBackend::new(), src.as_ref(), cfg, &|_, _| {}).expect("load target")
}

/// Write and load a random drafter for `target`.
pub fn random_drafter(dir: &Path, target: &TargetConfig, kind: DrafterKind, block: usize, rank: usize, seed: u64) -> Drafter<CpuBackend> {
    let init = DrafterInit { kind, layers: 1, block_size: block, markov_rank: rank, taps: 2, mask_token_id: None, confidence_head: kind == DrafterKind::DSpark };
    write_random_drafter(dir, target, &init, seed, StoreDtype::Bf16).expect("write drafter");
    let (cp, v) = read_json(dir).expect("config");
    let cfg = DrafterConfig::from_hf_json(&cp, &v).expect("parse drafter config");
    let src = open_source(dir).expect("open drafter");
    Drafter::load(&CpuBackend::new(), src.as_ref(), cfg, target).expect("load drafter")
}

/// Load a drafter checkpoint directory against `target` on `b`.
pub fn load_drafter<B: sparkling::core::Backend>(b: &B, dir: &Path, target: &TargetConfig) -> Drafter<B> {
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
    }
}

/// Path of an asset, if present.
pub fn asset(name: &str) -> Option<PathBuf> {
    let p = sparkling::assets::path(name);
    p.exists().then_some(p)
}

pub const ARCHS: [Arch; 3] = [Arch::Llama, Arch::Qwen2, Arch::Qwen3];
