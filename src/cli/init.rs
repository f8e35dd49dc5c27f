//! `sparkling init-drafter`, `sparkling synth` and `sparkling synth-target`: random-weight
//! checkpoints.

use super::load::{target_path, ModelArgs};
use super::options::{lenient, ArchArg, BackendKind, DrafterKindArg, PresetArg, WeightsArg};
use clap::Args;
use sparkling::fsio::check_out_dir;
use sparkling::loader::gguf_source::GgufSource;
use sparkling::model::config::{read_json, DrafterKind, TargetConfig};
use sparkling::model::synth::{
    check_drafter_init, default_taps, preset_target_config, write_random_drafter, write_random_target, DrafterInit, StoreDtype, PRESETS,
};
use sparkling::{Error, Result};
use std::path::PathBuf;

/// Arguments of `init-drafter`.
#[derive(Args, Debug)]
pub struct InitDrafterArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Drafter kind: dflash (in-place, borrows embed/lm_head) or dspark (shifted, Markov head).
    #[arg(long, default_value = "dspark", value_parser = lenient::<DrafterKindArg>())]
    pub kind: DrafterKindArg,
    /// Output directory (config.json + model.safetensors).
    #[arg(long)]
    pub out: PathBuf,
    /// Draft layers.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1)]
    pub layers: usize,
    /// Block size Bk.
    #[arg(long, allow_negative_numbers = true, default_value_t = 16)]
    pub block_size: usize,
    /// Markov head rank r (dspark).
    #[arg(long, allow_negative_numbers = true, default_value_t = 64)]
    pub markov_rank: usize,
    /// Number of tapped target layers (spread from layer 1 to N-3). Default: 3, or as many as a
    /// shallow target has (N-3, at least 1).
    #[arg(long, allow_negative_numbers = true)]
    pub taps: Option<usize>,
    /// Mask token id (default: the last vocabulary row).
    #[arg(long, allow_negative_numbers = true)]
    pub mask_token_id: Option<u32>,
    /// RNG seed.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    pub seed: u64,
    /// Replace the files of a checkpoint or model already in the output directory.
    #[arg(long)]
    pub force: bool,
}

/// Arguments of `synth-target`.
#[derive(Args, Debug)]
pub struct SynthTargetArgs {
    /// Take the geometry from this config.json (or HF directory) …
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// … or use a tiny test geometry of this arch.
    #[arg(long, default_value = "qwen3", value_parser = lenient::<ArchArg>())]
    pub arch: ArchArg,
    /// Vocabulary of the tiny geometry.
    #[arg(long, allow_negative_numbers = true, default_value_t = 256)]
    pub vocab: usize,
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
    /// Store bf16 instead of f32.
    #[arg(long)]
    pub bf16: bool,
    /// RNG seed.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    pub seed: u64,
    /// Replace the files of a checkpoint or model already in the output directory.
    #[arg(long)]
    pub force: bool,
}

/// Run `init-drafter`.
pub fn run_init_drafter(a: InitDrafterArgs) -> Result<()> {
    let kind = DrafterKind::from(a.kind);
    if kind == DrafterKind::DFlash && a.markov_rank != 64 {
        return Err(Error::Input(format!("--markov-rank {}: a DFlash drafter has no Markov head (only --kind dspark reads it)", a.markov_rank)));
    }
    if a.block_size < 2 || a.layers == 0 {
        return Err(Error::Input("--block-size must be ≥ 2 and --layers ≥ 1".into()));
    }
    check_out_dir(&a.out, a.force, "--out")?;
    // Only --target of the shared model arguments means something here: refuse the others
    // rather than ignore them.
    let m = &a.model;
    for (given, arg) in [
        (!m.drafter.is_empty(), "--drafter"),
        (m.tokenizer.is_some(), "--tokenizer"),
        (m.backend != BackendKind::Cpu, "--backend"),
        (m.adapter.is_some(), "--adapter"),
        (m.threads.is_some(), "--threads"),
        (m.weights != WeightsArg::Auto, "--weights"),
    ] {
        if given {
            return Err(Error::Input(format!("init-drafter does not use {arg} (it reads only the geometry of --target)")));
        }
    }
    let tpath = target_path(&a.model)?;
    if sparkling::fsio::same_file(&tpath, &a.out) {
        return Err(Error::Input(format!("--out {} is the --target: the drafter would replace the target model; choose another directory", a.out.display())));
    }
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
        taps: a.taps.unwrap_or_else(|| default_taps(cfg.layers, 3)),
        mask_token_id: a.mask_token_id,
        confidence_head: kind == DrafterKind::DSpark,
    };
    check_drafter_init(&cfg, &init)?;
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

/// Refuse a `--config` file that the run would replace: the `config.json` of the model written
/// to `out` (issue 15: an output never replaces one of the run's inputs).
fn refuse_config_in_out(config: &std::path::Path, out: &std::path::Path) -> Result<()> {
    if sparkling::fsio::same_file(config, &out.join("config.json")) {
        return Err(Error::file(
            config,
            format!("--config is the config.json this run writes into {}: copy it elsewhere first, or choose another --out", out.display()),
        ));
    }
    Ok(())
}

/// Run `synth-target`.
pub fn run_synth_target(a: SynthTargetArgs) -> Result<()> {
    check_out_dir(&a.out, a.force, "--out")?;
    if a.config.is_some() && (a.arch != ArchArg::Qwen3 || a.vocab != 256) {
        return Err(Error::Input("--config gives the whole geometry: leave out --arch and --vocab (they size a tiny target without --config)".into()));
    }
    let cfg = match &a.config {
        Some(p) => {
            let (cp, v) = read_json(p)?;
            refuse_config_in_out(&cp, &a.out)?;
            TargetConfig::from_hf_json(&cp, &v)?
        }
        None => {
            let arch = a.arch.into();
            if !(2..=1 << 20).contains(&a.vocab) {
                return Err(Error::Input(format!("--vocab {} must be in 2..={}", a.vocab, 1 << 20)));
            }
            sparkling::model::synth::tiny_target_config(arch, a.vocab)
        }
    };
    let dtype = if a.bf16 { StoreDtype::Bf16 } else { StoreDtype::F32 };
    write_random_target(&a.out, &cfg, a.seed, dtype)?;
    eprintln!("wrote random {} target ({} layers, hidden {}, vocab {}) to {}", cfg.arch.name(), cfg.layers, cfg.hidden, cfg.vocab, a.out.display());
    Ok(())
}

/// Arguments of `synth`.
#[derive(Args, Debug)]
pub struct SynthArgs {
    /// A real geometry …
    #[arg(long, conflicts_with = "config", value_parser = lenient::<PresetArg>())]
    pub preset: Option<PresetArg>,
    /// … or the geometry of this config.json (or HF directory).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Output directory: writes `target/`, `dspark-b{B}/` and `dflash-b{B}/` inside it.
    #[arg(long)]
    pub out: PathBuf,
    /// Drafter block size B.
    #[arg(long, allow_negative_numbers = true, default_value_t = 16)]
    pub block_size: usize,
    /// DSpark Markov head rank r (the released DSpark checkpoints use 256).
    #[arg(long, allow_negative_numbers = true, default_value_t = 256)]
    pub markov_rank: usize,
    /// Draft layers (5 in the z-lab / DeepSpec Qwen3 drafters).
    #[arg(long, allow_negative_numbers = true, default_value_t = 5)]
    pub drafter_layers: usize,
    /// Tapped target layers (5 → [1, 9, 17, 25, 33] for a 36-layer target). Default: 5, or as
    /// many as a shallow target has (N-3, at least 1).
    #[arg(long, allow_negative_numbers = true)]
    pub taps: Option<usize>,
    /// Write only the target (no drafters).
    #[arg(long)]
    pub no_drafters: bool,
    /// Store f32 instead of bf16 (bf16 is what published checkpoints use).
    #[arg(long)]
    pub f32: bool,
    /// RNG seed.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    pub seed: u64,
    /// Replace the files of a checkpoint or model already in the output directory.
    #[arg(long)]
    pub force: bool,
}

/// Run `synth`: a random-weight target of a real geometry plus a DSpark and a DFlash drafter
/// sized for it, all in the HF layout the loaders read (issue 5: time the real shapes
/// anywhere). Errors: neither or an unknown preset, unreadable config, unwritable directory.
pub fn run_synth(a: SynthArgs) -> Result<()> {
    let cfg = match (&a.preset, &a.config) {
        (Some(p), _) => {
            preset_target_config(p.name()).ok_or_else(|| Error::Input(format!("--preset `{}`: expected one of {}", p.name(), PRESETS.join(", "))))?
        }
        (None, Some(c)) => {
            let (cp, v) = read_json(c)?;
            refuse_config_in_out(&cp, &a.out.join("target"))?;
            TargetConfig::from_hf_json(&cp, &v)?
        }
        (None, None) => return Err(Error::Input(format!("synth needs --preset ({}) or --config <config.json>", PRESETS.join(", ")))),
    };
    if a.block_size < 2 || a.block_size >= cfg.max_positions {
        return Err(Error::Input(format!("--block-size {} must be in 2..{} (the target's context)", a.block_size, cfg.max_positions)));
    }
    if !a.no_drafters && (a.drafter_layers == 0 || a.drafter_layers > cfg.layers) {
        return Err(Error::Input(format!("--drafter-layers {} must be in 1..={} (the target's layer count)", a.drafter_layers, cfg.layers)));
    }
    if a.no_drafters {
        for (given, arg) in [
            (a.block_size != 16, "--block-size"),
            (a.markov_rank != 256, "--markov-rank"),
            (a.drafter_layers != 5, "--drafter-layers"),
            (a.taps.is_some(), "--taps"),
        ] {
            if given {
                return Err(Error::Input(format!("{arg} sizes the drafters, which --no-drafters leaves out: remove one of the two")));
            }
        }
    }
    let taps = a.taps.unwrap_or_else(|| default_taps(cfg.layers, 5));
    if !a.no_drafters {
        // Every drafter argument is checked before the (large) target is written.
        let init = DrafterInit {
            kind: DrafterKind::DSpark,
            layers: a.drafter_layers,
            block_size: a.block_size,
            markov_rank: a.markov_rank,
            taps,
            mask_token_id: None,
            confidence_head: true,
        };
        check_drafter_init(&cfg, &init)?;
    }
    check_out_dir(&a.out.join("target"), a.force, "--out")?;
    if !a.no_drafters {
        for name in ["dspark", "dflash"] {
            check_out_dir(&a.out.join(format!("{name}-b{}", a.block_size)), a.force, "--out")?;
        }
    }
    let dtype = if a.f32 { StoreDtype::F32 } else { StoreDtype::Bf16 };
    let params = |p: usize| -> f64 { p as f64 / 1e9 };
    let n = cfg.vocab * cfg.hidden * if cfg.tie_embeddings { 1 } else { 2 }
        + cfg.layers
            * (cfg.hidden * (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim + cfg.n_heads * cfg.head_dim * cfg.hidden + 3 * cfg.hidden * cfg.intermediate);
    eprintln!("writing a random {} target ({:.2} B parameters) to {} …", cfg.arch.name(), params(n), a.out.join("target").display());
    let t0 = std::time::Instant::now();
    write_random_target(&a.out.join("target"), &cfg, a.seed, dtype)?;
    eprintln!("  done in {:.1} s", t0.elapsed().as_secs_f64());
    if a.no_drafters {
        return Ok(());
    }
    for (kind, name, rank) in [(DrafterKind::DSpark, "dspark", a.markov_rank), (DrafterKind::DFlash, "dflash", 0)] {
        let init = DrafterInit {
            kind,
            layers: a.drafter_layers,
            block_size: a.block_size,
            markov_rank: rank,
            taps,
            mask_token_id: None,
            confidence_head: kind == DrafterKind::DSpark,
        };
        let dir = a.out.join(format!("{name}-b{}", a.block_size));
        let d = write_random_drafter(&dir, &cfg, &init, a.seed + 1, dtype)?;
        eprintln!(
            "wrote a random {name} drafter ({} layers, block {}, taps {:?}, Markov rank {}) to {}",
            d.layers,
            d.block_size,
            d.target_layer_ids,
            d.markov_rank,
            dir.display()
        );
    }
    Ok(())
}
