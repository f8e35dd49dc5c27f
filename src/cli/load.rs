//! Loading a target, its tokenizer and drafters for the CLI, with progress bars.

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use sparkling::cpu::{CpuBackend, WeightDtype};
use sparkling::loader::gguf_source::GgufSource;
use sparkling::loader::{open_source, TensorSource};
use sparkling::model::config::{read_json, DrafterConfig, DrafterKind, TargetConfig};
use sparkling::model::drafter::Drafter;
use sparkling::model::synth::{write_random_drafter, DrafterInit, StoreDtype};
use sparkling::model::target::Target;
use sparkling::tokenizer::TextTokenizer;
use sparkling::{assets, Error, Result};
use std::path::{Path, PathBuf};

/// Model selection shared by `generate` and `bench`.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Target model: a `.gguf` file, an HF directory (config.json + safetensors), or a hub id
    /// (`Qwen/Qwen3-4B`, resolved through the HF cache; downloads need network). Default:
    /// SmolLM2-135M-Instruct from `$SPARKLING_ASSETS` (run `scripts/fetch-assets` first).
    #[arg(long)]
    pub target: Option<PathBuf>,
    /// Drafter checkpoint directories (repeat for a DFlash and a DSpark drafter). Methods whose
    /// drafter kind is missing get an untrained random drafter created under
    /// `$SPARKLING_ASSETS/drafters/` (with a warning: acceptance will be low).
    #[arg(long)]
    pub drafter: Vec<PathBuf>,
    /// Tokenizer: a directory with tokenizer.json, or the tokenizer.json file. Default: the
    /// GGUF's embedded vocabulary, or tokenizer.json in the target directory.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Compute backend. Only `cpu` is built in this version.
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// CPU threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Weight storage on the CPU backend: f32, f16, or auto (f16 for GGUF targets, whose
    /// dequantized values llama.cpp's F16 format also holds; f32 otherwise).
    #[arg(long, default_value = "auto")]
    pub weights: String,
}

/// Everything a run needs.
pub struct Loaded {
    pub backend: CpuBackend,
    pub target: Target<CpuBackend>,
    pub tokenizer: Option<TextTokenizer>,
    pub drafters: Vec<Drafter<CpuBackend>>,
}

impl Loaded {
    /// The drafter of `kind`, if loaded.
    pub fn drafter(&self, kind: DrafterKind) -> Option<&Drafter<CpuBackend>> {
        self.drafters.iter().find(|d| d.cfg.kind == kind)
    }
}

fn bar(len: u64, msg: String) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{msg:40} [{bar:30}] {pos}/{len} {elapsed}").unwrap_or_else(|_| ProgressStyle::default_bar()).progress_chars("=> "),
    );
    pb.set_message(msg);
    pb
}

/// A local path, or a hub id resolved through the HF cache (downloading where the network
/// allows). Errors name the path.
pub fn resolve_path(p: &Path) -> Result<PathBuf> {
    if p.exists() {
        return Ok(p.to_path_buf());
    }
    let s = p.to_string_lossy();
    if sparkling::loader::hub::looks_like_hub_id(&s) {
        return sparkling::loader::hub::resolve(&s);
    }
    Err(Error::file(p, "no such file or directory"))
}

/// Resolve the target path (default asset when absent), with an actionable error.
pub fn target_path(args: &ModelArgs) -> Result<PathBuf> {
    if let Some(t) = &args.target {
        return resolve_path(t);
    }
    let p = assets::path(assets::DEFAULT_TARGET);
    if !p.exists() {
        return Err(Error::file(&p, "default target not found: run `scripts/fetch-assets smollm2` (or pass --target)"));
    }
    Ok(p)
}

fn load_target_config(path: &Path, gguf: Option<&GgufSource>) -> Result<TargetConfig> {
    match gguf {
        Some(g) => TargetConfig::from_gguf(&g.file),
        None => {
            let (cp, v) = read_json(path)?;
            TargetConfig::from_hf_json(&cp, &v)
        }
    }
}

/// Load target, tokenizer and the drafters for `kinds`.
pub fn load(args: &ModelArgs, kinds: &[DrafterKind]) -> Result<Loaded> {
    if args.backend != "cpu" {
        return Err(Error::Input(format!("--backend {}: only `cpu` is built in this version", args.backend)));
    }
    if let Some(n) = args.threads {
        rayon_threads(n)?;
    }
    let tpath = target_path(args)?;
    let is_gguf = tpath.extension().is_some_and(|e| e == "gguf");
    let dtype = match (args.weights.as_str(), is_gguf) {
        ("f32", _) | ("auto", false) => WeightDtype::F32,
        ("f16", _) | ("auto", true) => WeightDtype::F16,
        (other, _) => return Err(Error::Input(format!("--weights `{other}`: expected f32, f16 or auto"))),
    };
    let backend = CpuBackend::with_weight_dtype(dtype);
    let gguf = if is_gguf { Some(GgufSource::open(&tpath)?) } else { None };
    let st_src;
    let src: &dyn TensorSource = match &gguf {
        Some(g) => g,
        None => {
            st_src = open_source(&tpath)?;
            st_src.as_ref()
        }
    };
    let cfg = load_target_config(&tpath, gguf.as_ref())?;
    let pb = bar(0, format!("loading {}", tpath.file_name().map(|s| s.to_string_lossy().to_string()).unwrap_or_default()));
    let target = Target::load(&backend, src, cfg, &|i, n| {
        pb.set_length(n as u64);
        pb.set_position(i as u64);
    })?;
    pb.finish_and_clear();
    eprintln!(
        "target: {} ({} layers, hidden {}, vocab {}) on {}",
        tpath.display(),
        target.cfg.layers,
        target.cfg.hidden,
        target.cfg.vocab,
        sparkling::core::Backend::name(&backend)
    );
    let tokenizer = match (&args.tokenizer, &gguf) {
        (Some(t), _) => Some(TextTokenizer::from_dir(if t.is_dir() { t } else { t.parent().unwrap_or(Path::new(".")) })?),
        (None, Some(g)) => Some(TextTokenizer::from_gguf(&g.file)?),
        (None, None) => {
            if tpath.join("tokenizer.json").exists() {
                Some(TextTokenizer::from_dir(&tpath)?)
            } else {
                None
            }
        }
    };
    let mut drafters = Vec::new();
    for d in &args.drafter {
        let d = &resolve_path(d)?;
        let (cp, v) = read_json(d)?;
        let dcfg = DrafterConfig::from_hf_json(&cp, &v)?;
        let dsrc = open_source(d)?;
        drafters.push(Drafter::load(&backend, dsrc.as_ref(), dcfg, &target.cfg)?);
        eprintln!("drafter: {} ({:?})", d.display(), drafters.last().map(|x| x.cfg.kind));
    }
    for &kind in kinds {
        if drafters.iter().any(|d| d.cfg.kind == kind) {
            continue;
        }
        let stem = tpath.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_else(|| "target".into());
        let dir = assets::dir().join("drafters").join(format!("{stem}-{}-random", format!("{kind:?}").to_lowercase()));
        if !dir.join("config.json").exists() {
            let init = DrafterInit {
                kind,
                layers: 1,
                block_size: 16,
                markov_rank: 64,
                taps: 3,
                mask_token_id: None,
                confidence_head: kind == DrafterKind::DSpark,
            };
            write_random_drafter(&dir, &target.cfg, &init, 0, StoreDtype::Bf16)?;
        }
        eprintln!(
            "warning: no {kind:?} drafter given; using the UNTRAINED random drafter {} (output is still exact, but acceptance will be near 1 token per round; pass --drafter)",
            dir.display()
        );
        let (cp, v) = read_json(&dir)?;
        let dcfg = DrafterConfig::from_hf_json(&cp, &v)?;
        let dsrc = open_source(&dir)?;
        drafters.push(Drafter::load(&backend, dsrc.as_ref(), dcfg, &target.cfg)?);
    }
    Ok(Loaded { backend, target, tokenizer, drafters })
}

fn rayon_threads(n: usize) -> Result<()> {
    if n == 0 {
        return Err(Error::Input("--threads must be ≥ 1".into()));
    }
    // The global pool can only be built once; a second call is harmless for the CLI.
    let _ = rayon::ThreadPoolBuilder::new().num_threads(n).build_global();
    Ok(())
}
