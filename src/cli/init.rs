//! `sparkling init-drafter` and `sparkling synth-target`: random-weight checkpoints.

use super::load::{target_path, ModelArgs};
use clap::Args;
use sparkling::loader::gguf_source::GgufSource;
use sparkling::model::config::{read_json, Arch, DrafterKind, TargetConfig};
use sparkling::model::synth::{write_random_drafter, write_random_target, DrafterInit, StoreDtype};
use sparkling::{Error, Result};
use std::path::PathBuf;

/// Arguments of `init-drafter`.
#[derive(Args, Debug)]
pub struct InitDrafterArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Drafter kind: dflash (in-place, borrows embed/lm_head) or dspark (shifted, Markov head).
    #[arg(long, default_value = "dspark")]
    pub kind: String,
    /// Output directory (config.json + model.safetensors).
    #[arg(long)]
    pub out: PathBuf,
    /// Draft layers.
    #[arg(long, default_value_t = 1)]
    pub layers: usize,
    /// Block size Bk.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Markov head rank r (dspark).
    #[arg(long, default_value_t = 64)]
    pub markov_rank: usize,
    /// Number of tapped target layers (spread from layer 1 to N-3).
    #[arg(long, default_value_t = 3)]
    pub taps: usize,
    /// Mask token id (default: the last vocabulary row).
    #[arg(long)]
    pub mask_token_id: Option<u32>,
    /// RNG seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Arguments of `synth-target`.
#[derive(Args, Debug)]
pub struct SynthTargetArgs {
    /// Take the geometry from this config.json (or HF directory) …
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// … or use a tiny test geometry of this arch (llama, qwen2, qwen3).
    #[arg(long, default_value = "qwen3")]
    pub arch: String,
    /// Vocabulary of the tiny geometry.
    #[arg(long, default_value_t = 256)]
    pub vocab: usize,
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
    /// Store bf16 instead of f32.
    #[arg(long)]
    pub bf16: bool,
    /// RNG seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

fn parse_kind(s: &str) -> Result<DrafterKind> {
    match s {
        "dflash" => Ok(DrafterKind::DFlash),
        "dspark" => Ok(DrafterKind::DSpark),
        _ => Err(Error::Input(format!("--kind `{s}`: expected dflash or dspark"))),
    }
}

/// Run `init-drafter`.
pub fn run_init_drafter(a: InitDrafterArgs) -> Result<()> {
    let kind = parse_kind(&a.kind)?;
    if a.block_size < 2 || a.layers == 0 {
        return Err(Error::Input("--block-size must be ≥ 2 and --layers ≥ 1".into()));
    }
    let tpath = target_path(&a.model)?;
    let cfg = if tpath.extension().is_some_and(|e| e == "gguf") {
        TargetConfig::from_gguf(&GgufSource::open(&tpath)?.file)?
    } else {
        let (cp, v) = read_json(&tpath)?;
        TargetConfig::from_hf_json(&cp, &v)?
    };
    if cfg.layers < 3 {
        return Err(Error::Input(format!("target has {} layers; a drafter needs a target of ≥ 3 layers to tap", cfg.layers)));
    }
    let init = DrafterInit {
        kind,
        layers: a.layers,
        block_size: a.block_size,
        markov_rank: a.markov_rank,
        taps: a.taps,
        mask_token_id: a.mask_token_id,
        confidence_head: kind == DrafterKind::DSpark,
    };
    let d = write_random_drafter(&a.out, &cfg, &init, a.seed, StoreDtype::Bf16)?;
    eprintln!(
        "wrote untrained {kind:?} drafter to {}: {} layers, block {}, taps {:?}, markov rank {}, mask id {}",
        a.out.display(),
        d.layers,
        d.block_size,
        d.target_layer_ids,
        d.markov_rank,
        d.mask_token_id
    );
    Ok(())
}

/// Run `synth-target`.
pub fn run_synth_target(a: SynthTargetArgs) -> Result<()> {
    let cfg = match &a.config {
        Some(p) => {
            let (cp, v) = read_json(p)?;
            TargetConfig::from_hf_json(&cp, &v)?
        }
        None => {
            let arch = Arch::parse(&a.arch).ok_or_else(|| Error::Input(format!("--arch `{}`: expected llama, qwen2 or qwen3", a.arch)))?;
            sparkling::model::synth::tiny_target_config(arch, a.vocab)
        }
    };
    let dtype = if a.bf16 { StoreDtype::Bf16 } else { StoreDtype::F32 };
    write_random_target(&a.out, &cfg, a.seed, dtype)?;
    eprintln!("wrote random {} target ({} layers, hidden {}, vocab {}) to {}", cfg.arch.name(), cfg.layers, cfg.hidden, cfg.vocab, a.out.display());
    Ok(())
}
