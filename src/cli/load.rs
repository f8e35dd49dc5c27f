//! Loading a target, its tokenizer and drafters for the CLI, with progress bars.

use super::options::{lenient, BackendKind, KvCacheArg, WeightsArg};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use sparkling::core::Backend;
use sparkling::cpu::{self, CpuBackend};
use sparkling::decode::Models;
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
    /// Compute backend: `cpu`, `wgpu` (Vulkan / Metal / DX12 / GL through wgpu; needs a
    /// build with `--features wgpu`) or `cuda` (NVIDIA GPUs; needs `--features cuda`, the
    /// driver, libnvrtc and libcublas; `--adapter N` picks device N; weights bf16 by default,
    /// `--weights f32` for f32).
    #[arg(long, default_value = "cpu", value_parser = lenient::<BackendKind>())]
    pub backend: BackendKind,
    /// wgpu adapter: an index or a case-insensitive name substring, as listed by
    /// `sparkling adapters` (default: `WGPU_ADAPTER_NAME`, else wgpu's default adapter).
    #[arg(long)]
    pub adapter: Option<String>,
    /// CPU threads (default: all cores).
    #[arg(long, allow_negative_numbers = true)]
    pub threads: Option<usize>,
    /// Weight storage: `native` (cpu: GGUF tensors stay in their Q8_0/Q4_0/Q4_1/Q5_0/Q4_K/Q6_K
    /// blocks and run on int8 kernels, ~0.58–1.06 B/weight; GGUF F16/F32 matrices stay as stored;
    /// other block types become f16), `q8_0` (cpu: quantize float matrices — safetensors, GGUF F16/F32/BF16 — to Q8_0 at load, 1.06 B/weight;
    /// GGUF blocks the cpu runs natively stay as stored), `f16` (2 B), `f32` (4 B), `bf16`
    /// (wgpu only), or `auto`: native for GGUF targets on the cpu and wgpu, f32 otherwise.
    #[arg(long, default_value = "auto", value_parser = lenient::<WeightsArg>())]
    pub weights: WeightsArg,
    /// KV cache storage: `f16` (cpu: half the bytes each attention reads — faster at long
    /// contexts and in batches; llama.cpp's default), `q8_0` (cpu: llama.cpp's q8_0 blocks,
    /// 0.56× the bytes of f16: faster `ar` and batch decoding at long contexts; values rounded
    /// to 8 bits, so the text may differ from an f16 cache's after a near-tie), `f32`, or `auto`: f16 on the cpu, f32 on wgpu and cuda (which
    /// store only f32 caches). Every method reads the same cache, so every method still emits
    /// exactly the `ar` tokens.
    #[arg(long, default_value = "auto", value_parser = lenient::<KvCacheArg>())]
    pub kv_cache: KvCacheArg,
}

/// The backend named by `--backend`, opened (`--adapter`, `--weights` applied).
pub enum AnyBackend {
    Cpu(CpuBackend),
    #[cfg(feature = "wgpu")]
    Wgpu(sparkling::wgpu_backend::WgpuBackend),
    #[cfg(feature = "cuda")]
    Cuda(sparkling::cuda_backend::CudaBackend),
}

/// An opened backend and the resolved target path it was configured for.
pub struct Selected {
    pub backend: AnyBackend,
    pub target: PathBuf,
}

/// Everything a run needs, on backend `B`.
pub struct Loaded<B: Backend> {
    pub backend: B,
    /// The target and its drafters (the library's one loaded-model type, shared with the web
    /// session).
    pub models: Models<B>,
    pub tokenizer: Option<TextTokenizer>,
    /// The target's path (keys the `--budget auto` cost cache).
    pub target_path: PathBuf,
}

/// Weight storage asked for by `--weights` (`auto` already resolved).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Weights {
    F32,
    F16,
    Bf16,
    /// GGUF formats as stored (cpu: int8 kernels; wgpu: blocks dequantized in registers).
    Native,
    Q8_0,
}

fn weights(arg: WeightsArg, is_gguf: bool) -> Weights {
    match (arg, is_gguf) {
        (WeightsArg::F32, _) | (WeightsArg::Auto, false) => Weights::F32,
        (WeightsArg::F16, _) => Weights::F16,
        (WeightsArg::Native, _) | (WeightsArg::Auto, true) => Weights::Native,
        (WeightsArg::Q8_0, _) => Weights::Q8_0,
        (WeightsArg::Bf16, _) => Weights::Bf16,
    }
}

/// Open the backend named by `--backend` and resolve the target path (the default asset when
/// `--target` is absent). Errors: `wgpu` or `cuda` in a build without the feature,
/// `--adapter` with `--backend cpu`, a `--weights` or `--kv-cache` the backend does not store
/// (an f16 / q8_0 cache off the cpu backend), no matching wgpu adapter.
pub fn select(args: &ModelArgs) -> Result<Selected> {
    let target = target_path(args)?;
    let w = weights(args.weights, target.extension().is_some_and(|e| e == "gguf"));
    // The CPU cache storage `--kv-cache` names.
    let kv = match args.kv_cache {
        KvCacheArg::Auto | KvCacheArg::F16 => cpu::KvDtype::F16,
        KvCacheArg::F32 => cpu::KvDtype::F32,
        KvCacheArg::Q8_0 => cpu::KvDtype::Q8_0,
    };
    if args.backend != BackendKind::Cpu && !matches!(args.kv_cache, KvCacheArg::Auto | KvCacheArg::F32) {
        return Err(Error::Input(format!(
            "--kv-cache `{}` with --backend {}: only the cpu backend stores an f16 or q8_0 cache (expected f32 or auto)",
            args.kv_cache.name(),
            args.backend.name()
        )));
    }
    let backend = match args.backend {
        BackendKind::Cpu => {
            if args.adapter.is_some() {
                return Err(Error::Input("--adapter selects a wgpu adapter: it needs --backend wgpu".into()));
            }
            let dtype = match w {
                Weights::F32 => cpu::WeightDtype::F32,
                Weights::F16 => cpu::WeightDtype::F16,
                Weights::Native => cpu::WeightDtype::Native,
                Weights::Q8_0 => cpu::WeightDtype::Q8_0,
                Weights::Bf16 => return Err(Error::Input("--weights bf16 is only available with --backend wgpu (cpu: native, q8_0, f32, f16, auto)".into())),
            };
            AnyBackend::Cpu(CpuBackend::with_weight_dtype(dtype).with_kv_dtype(kv))
        }
        BackendKind::Wgpu => open_wgpu(args.adapter.as_deref(), w)?,
        BackendKind::Cuda => open_cuda(args.adapter.as_deref(), args.weights)?,
    };
    Ok(Selected { backend, target })
}

#[cfg(feature = "wgpu")]
fn open_wgpu(adapter: Option<&str>, w: Weights) -> Result<AnyBackend> {
    use sparkling::wgpu_backend::{WeightDtype, WgpuBackend, WgpuOptions};
    let weight_dtype = match w {
        Weights::F32 => WeightDtype::F32,
        Weights::F16 => WeightDtype::F16,
        Weights::Native => WeightDtype::Native,
        Weights::Bf16 => WeightDtype::Bf16,
        Weights::Q8_0 => return Err(Error::Input("--weights q8_0 is only available with --backend cpu (wgpu: native, f32, f16, bf16, auto)".into())),
    };
    let opts = WgpuOptions { adapter: adapter.map(str::to_string), weight_dtype, ..Default::default() };
    Ok(AnyBackend::Wgpu(WgpuBackend::with_options(&opts)?))
}

#[cfg(not(feature = "wgpu"))]
fn open_wgpu(_adapter: Option<&str>, _w: Weights) -> Result<AnyBackend> {
    Err(no_wgpu("--backend wgpu"))
}

/// The CUDA backend on device `--adapter` (default 0) with `--weights` auto/bf16 (bf16) or f32.
#[cfg(feature = "cuda")]
fn open_cuda(adapter: Option<&str>, weights: WeightsArg) -> Result<AnyBackend> {
    use sparkling::cuda_backend::{CudaBackend, CudaOptions, WeightDtype};
    let device = match adapter {
        None => 0,
        Some(a) => a.parse().map_err(|_| Error::Input(format!("--adapter `{a}`: with --backend cuda this is a CUDA device index (0, 1, …)")))?,
    };
    let weight_dtype = match weights {
        WeightsArg::Auto | WeightsArg::Bf16 => WeightDtype::Bf16,
        WeightsArg::F32 => WeightDtype::F32,
        other => return Err(Error::Input(format!("--weights `{}` with --backend cuda: expected bf16 (the default), f32 or auto", other.name()))),
    };
    Ok(AnyBackend::Cuda(CudaBackend::with_options(&CudaOptions { device, weight_dtype, ..Default::default() })?))
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_adapter: Option<&str>, _weights: WeightsArg) -> Result<AnyBackend> {
    Err(Error::Input("--backend cuda: this sparkling binary was built without the CUDA backend; rebuild with `cargo build --release --features cuda`".into()))
}

/// The error for a wgpu request in a build without the `wgpu` feature.
#[cfg(not(feature = "wgpu"))]
pub fn no_wgpu(what: &str) -> Error {
    Error::Input(format!("{what}: this sparkling binary was built without the wgpu backend; rebuild with `cargo build --release --features wgpu`"))
}

/// `sparkling adapters`: print every wgpu adapter, one per line (index: name (backend, type, driver)).
#[cfg(feature = "wgpu")]
pub fn list_adapters() -> Result<()> {
    let list = sparkling::wgpu_backend::list_adapters();
    if list.is_empty() {
        return Err(Error::Backend(sparkling::core::Error::Unavailable(
            "no wgpu adapter found (no Vulkan, Metal, DX12 or GL driver is visible). On Debian/Ubuntu without a GPU, `scripts/install-lavapipe` installs Mesa's CPU Vulkan driver (lavapipe)".into(),
        )));
    }
    for l in list {
        outln!("{l}")?;
    }
    Ok(())
}

/// `sparkling adapters` in a build without the `wgpu` feature.
#[cfg(not(feature = "wgpu"))]
pub fn list_adapters() -> Result<()> {
    Err(no_wgpu("sparkling adapters"))
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
    if let Ok(meta) = std::fs::metadata(p) {
        // A named pipe or device would block the reader forever (issue 15).
        if !meta.is_file() && !meta.is_dir() {
            return Err(Error::file(p, "is not a regular file or a directory (a pipe or device?): expected a .gguf file or an HF model directory"));
        }
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

/// Load the target at `tpath` (from [`select`]), its tokenizer and the drafters for `kinds`
/// onto `backend`.
pub fn load<B: Backend>(backend: B, tpath: &Path, args: &ModelArgs, kinds: &[DrafterKind]) -> Result<Loaded<B>> {
    let is_gguf = tpath.extension().is_some_and(|e| e == "gguf");
    let mut gguf = if is_gguf { Some(GgufSource::open(tpath)?) } else { None };
    // The tokenizer before the weights: a GGUF's parsed vocabulary (~7 MB of strings for
    // SmolLM2) and the tokenizer's build temporaries are then freed before the weights are
    // copied in, so the peak memory is the weights' (issue 10: peak RSS ≤ 1.25 × (file + KV)).
    let tokenizer = match (&args.tokenizer, &mut gguf) {
        (Some(t), _) => Some(tokenizer_arg(t)?),
        (None, Some(g)) => Some(TextTokenizer::from_gguf(&g.file)?),
        (None, None) => {
            if tpath.join("tokenizer.json").exists() {
                Some(TextTokenizer::from_dir(tpath)?)
            } else {
                None
            }
        }
    };
    if let Some(g) = &mut gguf {
        for key in sparkling::tokenizer::gguf_vocab::VOCAB_ARRAYS {
            g.file.remove_metadata(key);
        }
    }
    let st_src;
    let src: &dyn TensorSource = match &gguf {
        Some(g) => g,
        None => {
            st_src = open_source(tpath)?;
            st_src.as_ref()
        }
    };
    let cfg = load_target_config(tpath, gguf.as_ref())?;
    let pb = bar(0, format!("loading {}", tpath.file_name().map(|s| s.to_string_lossy().to_string()).unwrap_or_default()));
    let target = Target::load(&backend, src, cfg, &|i, n| {
        pb.set_length(n as u64);
        pb.set_position(i as u64);
    })?;
    pb.finish_and_clear();
    eprintln!("target: {} ({} layers, hidden {}, vocab {}) on {}", tpath.display(), target.cfg.layers, target.cfg.hidden, target.cfg.vocab, backend.name());
    let mut drafters = Vec::new();
    for d in &args.drafter {
        let d = &resolve_path(d)?;
        let (cp, v) = read_json(d)?;
        let dcfg = DrafterConfig::from_hf_json(&cp, &v)?;
        // A drafter no chosen method reads, or a second one of a kind, would be loaded and
        // silently ignored (issue 15).
        if drafters.iter().any(|x: &Drafter<B>| x.cfg.kind == dcfg.kind) {
            return Err(Error::file(d, format!("--drafter: a second {:?} drafter; give at most one --drafter of each kind (DFlash, DSpark)", dcfg.kind)));
        }
        if !kinds.is_empty() && !kinds.contains(&dcfg.kind) {
            let want: Vec<String> = kinds.iter().map(|k| format!("{k:?}")).collect();
            return Err(Error::file(
                d,
                format!(
                    "--drafter: a {:?} drafter, but the chosen methods read only {} drafters; remove it or choose a method that uses it",
                    dcfg.kind,
                    want.join(" and ")
                ),
            ));
        }
        let dsrc = open_source(d)?;
        drafters.push(Drafter::load(&backend, dsrc.as_ref(), dcfg, &target.cfg)?);
        if let Some(x) = drafters.last() {
            eprintln!("drafter: {} ({:?}, block {}, {} layers, Markov rank {})", d.display(), x.cfg.kind, x.cfg.block_size, x.cfg.layers, x.cfg.markov_rank);
        }
    }
    for &kind in kinds {
        if drafters.iter().any(|d| d.cfg.kind == kind) {
            continue;
        }
        if let Some(d) = bundled_drafter(&backend, &target.cfg, kind) {
            drafters.push(d);
            continue;
        }
        if target.cfg.layers < 3 {
            return Err(Error::Input(format!(
                "{}: a {}-layer target is too shallow for a {kind:?} drafter (it taps layers 1..N−3; ≥ 3 layers): use --method ar or lookup",
                tpath.display(),
                target.cfg.layers
            )));
        }
        let stem = tpath.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_else(|| "target".into());
        // Keyed by the target's geometry too: two targets sharing a file name get their own.
        let c = &target.cfg;
        let dir = assets::dir().join("drafters").join(format!("{stem}-{}-random-v{}-h{}-l{}", format!("{kind:?}").to_lowercase(), c.vocab, c.hidden, c.layers));
        {
            let init = DrafterInit {
                kind,
                layers: 1,
                block_size: 16,
                markov_rank: 64,
                taps: sparkling::model::synth::default_taps(target.cfg.layers, 3),
                mask_token_id: None,
                confidence_head: kind == DrafterKind::DSpark,
            };
            // Built in a temporary directory and renamed into place: safe under concurrent first
            // use, and an entry an interrupted older run left half-written is rebuilt.
            let complete = |d: &Path| read_json(d).is_ok() && open_source(d).is_ok();
            sparkling::fsio::ensure_cached_dir(&dir, complete, |tmp| write_random_drafter(tmp, &target.cfg, &init, 0, StoreDtype::Bf16).map(|_| ()))?;
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
    Ok(Loaded { backend, models: Models { target, drafters }, tokenizer, target_path: tpath.to_path_buf() })
}

/// `--tokenizer`: a directory (its tokenizer.json and tokenizer_config.json), a GGUF file (its
/// embedded vocabulary) or exactly the JSON file it names (with tokenizer_config.json beside it
/// for the chat template, when present).
fn tokenizer_arg(t: &Path) -> Result<TextTokenizer> {
    if t.is_dir() {
        return TextTokenizer::from_dir(t);
    }
    if !t.exists() {
        return Err(Error::file(t, "--tokenizer: no such file or directory"));
    }
    sparkling::loader::bytes::regular_file(t, "--tokenizer: a tokenizer.json, a .gguf file or a directory")?;
    if t.extension().is_some_and(|e| e == "gguf") {
        return TextTokenizer::from_gguf(&GgufSource::open(t)?.file);
    }
    let json = std::fs::read_to_string(t).map_err(|e| Error::file(t, format!("--tokenizer: cannot read: {e}")))?;
    let config = t
        .parent()
        .map(|d| d.join("tokenizer_config.json"))
        .filter(|c| std::fs::metadata(c).is_ok_and(|m| m.is_file()))
        .and_then(|c| std::fs::read_to_string(c).ok());
    TextTokenizer::from_json(&json, config.as_deref()).map_err(|e| Error::file(t, e.to_string()))
}

/// The repository's trained drafters (`models/*`, issue 3): the first checkpoint of `kind` that
/// loads against this target (same hidden size, vocabulary and tappable layers) becomes the
/// default drafter. Checkpoints that do not fit are skipped silently — they belong to other
/// targets.
fn bundled_drafter<B: Backend>(backend: &B, target: &TargetConfig, kind: DrafterKind) -> Option<Drafter<B>> {
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&models).ok()?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    dirs.sort();
    for dir in dirs {
        let Ok((cp, v)) = read_json(&dir) else { continue };
        let Ok(dcfg) = DrafterConfig::from_hf_json(&cp, &v) else { continue };
        if dcfg.kind != kind {
            continue;
        }
        let Ok(src) = open_source(&dir) else { continue };
        if let Ok(d) = Drafter::load(backend, src.as_ref(), dcfg, target) {
            eprintln!("drafter: {} (bundled trained drafter whose geometry fits this target; pass --drafter to choose another)", dir.display());
            return Some(d);
        }
    }
    None
}

/// Size rayon's global pool (before first use).
pub fn rayon_threads(n: usize) -> Result<()> {
    if n == 0 {
        return Err(Error::Input("--threads must be ≥ 1".into()));
    }
    // More threads than a few per core only adds contention (and a huge count aborts while
    // spawning them): refuse it.
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    if n > 4 * cores {
        return Err(Error::Input(format!("--threads {n} is more than 4 × the {cores} cores of this machine")));
    }
    // The global pool can only be built once; a second call is harmless for the CLI.
    let _ = rayon::ThreadPoolBuilder::new().num_threads(n).build_global();
    Ok(())
}
