//! `sparkling-train`: gen-data → train → export for SparklingTree drafters (see the crate docs
//! in `lib.rs` and `train/README.md`). Every failure is an error message naming the file or
//! argument at fault, with exit status 1.

/// `eprintln!` that never panics: a closed or full stderr (`2>/dev/full`, `2>&1 | head`) must
/// not abort a run or lose its results; a message that cannot be written is dropped.
/// Shadows the standard macro for this crate (textual scope: defined before the modules).
macro_rules! eprintln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

use clap::{Parser, Subcommand};
use sparkling::model::config::default_target_layer_ids;
use sparkling_train::checkpoint::{fold_ctx_scale, latest_checkpoint, load_checkpoint, load_checkpoint_scale, read_draft_vocab, read_run_config};
use sparkling_train::error::{Error, Result};
use sparkling_train::export::{verify_with_engine, write_hf, Export, ExportDtype};
use sparkling_train::gen::{self, GenOptions};
use sparkling_train::train::{self, run_context, RunConfig, TrainControl};
use std::path::{Path, PathBuf};

/// Command line.
#[derive(Parser)]
#[command(name = "sparkling-train", version, about = "Train DFlash / DSpark drafters for SparklingTree (candle, CPU)")]
struct Cli {
    /// CPU threads for the target (gen-data) and candle (train); default: all cores.
    #[arg(long, global = true)]
    threads: Option<usize>,
    #[command(subcommand)]
    cmd: Cmd,
}

/// Subcommands.
#[derive(Subcommand)]
enum Cmd {
    /// Answer training prompts with the target (greedy, chat template) and cache token ids,
    /// tapped hidden states (f16) and top-k logits. Resumable: cached prompts are skipped.
    GenData {
        /// Target: `.gguf` file or HF directory (default: SmolLM2-135M-Instruct in $SPARKLING_ASSETS).
        #[arg(long)]
        target: Option<PathBuf>,
        /// Prompt files or directories of `*.jsonl` (repeatable), JSON lines with a `question` /
        /// `prompt` / `instruction` / `text` field (training prompts only; evaluation sets are
        /// refused). Several files are mixed in a fixed pseudo-random order, so any prefix holds
        /// each set in proportion to its size.
        #[arg(long, required = true)]
        prompts: Vec<PathBuf>,
        /// Cache directory (default: $SPARKLING_ASSETS/train-cache/<target>-taps<N>).
        #[arg(long)]
        out: Option<PathBuf>,
        /// First prompt index.
        #[arg(long, default_value_t = 0)]
        start: usize,
        /// Number of prompts.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        /// Maximum answer tokens.
        #[arg(long, default_value_t = 320)]
        max_new_tokens: usize,
        /// Top-k target logits kept per position.
        #[arg(long, default_value_t = 32)]
        topk: usize,
        /// Number of tap layers (evenly spaced from layer 1 to N-3, z-lab's rule).
        #[arg(long, default_value_t = 3)]
        taps: usize,
        /// Tap exactly these target layers (comma-separated, 0-based, the last layer's raw
        /// output allowed) instead of --taps' evenly spaced ones, e.g. `1,14,27,29`: one cache
        /// then serves drafters reading any subset (`train --use-taps`).
        #[arg(long, value_delimiter = ',', conflicts_with = "taps")]
        tap_layers: Option<Vec<usize>>,
        /// Stop after this many minutes (rerun to continue).
        #[arg(long)]
        max_minutes: Option<f64>,
        /// Sequences decoded together (the engine's batch API; continuous batching).
        #[arg(long, default_value_t = 8)]
        batch: usize,
        /// Stop once the cache holds this many answer tokens (cached ones count).
        #[arg(long)]
        max_tokens: Option<usize>,
        /// Target weights on the CPU: `native` (GGUF blocks as stored on int8 kernels; the
        /// default for GGUF targets, as in the engine), `q8_0`, `f16` or `f32` (the default for
        /// safetensors checkpoints). A cache holds answers of one storage: resuming with
        /// another is refused.
        #[arg(long)]
        weights: Option<String>,
    },
    /// Train a drafter on a cache (resumable with --resume).
    Train {
        /// `dspark` (shifted slots, Markov + confidence heads), `dflash` (in-place slots), or
        /// `eagle`: an EAGLE-style reference head for diagnosis (one causal pass over
        /// taps + next-token embeddings, depth 1 only, every answer position a loss row —
        /// `--anchors × --block-size` of them per sequence; not exportable, not resumable).
        #[arg(long)]
        kind: String,
        /// Cache directory written by gen-data.
        #[arg(long)]
        cache: PathBuf,
        /// Target the cache came from (its embedding / lm_head are borrowed, frozen).
        #[arg(long)]
        target: Option<PathBuf>,
        /// Run directory (checkpoints, logs).
        #[arg(long)]
        out: PathBuf,
        /// Draft transformer layers.
        #[arg(long, default_value_t = 2)]
        layers: usize,
        /// Block size Bk (DSpark drafts Bk tokens per round, DFlash Bk-1).
        #[arg(long, default_value_t = 16)]
        block_size: usize,
        /// Markov head rank (DSpark).
        #[arg(long, default_value_t = 32)]
        markov_rank: usize,
        /// Skip the DSpark confidence head.
        #[arg(long)]
        no_confidence: bool,
        /// Optimizer steps (length of the cosine schedule; may grow on --resume).
        #[arg(long, default_value_t = 600)]
        steps: usize,
        /// Peak learning rate (DFlash recipe: 6e-4).
        #[arg(long, default_value_t = 6e-4)]
        lr: f64,
        /// Linear warm-up steps.
        #[arg(long, default_value_t = 30)]
        warmup: usize,
        /// Final learning rate as a fraction of the peak (cosine decay).
        #[arg(long, default_value_t = 0.1)]
        min_lr_ratio: f64,
        /// Cached sequences per step.
        #[arg(long, default_value_t = 2)]
        seqs_per_step: usize,
        /// Anchors per sequence per step.
        #[arg(long, default_value_t = 16)]
        anchors: usize,
        /// Position-weight decay γ: w_k = exp(-(k-1)/γ).
        #[arg(long, default_value_t = 7.0)]
        gamma: f64,
        /// Loss weight: CE to the target's greedy token.
        #[arg(long, default_value_t = 0.1)]
        ce: f64,
        /// Loss weight: KL(target top-k ‖ draft).
        #[arg(long, default_value_t = 0.9)]
        kl: f64,
        /// Loss weight: L1 distribution matching (DeepSpec's choice; 0 by default, see README).
        #[arg(long, default_value_t = 0.0)]
        l1: f64,
        /// Loss weight: confidence-head BCE (DSpark).
        #[arg(long, default_value_t = 1.0)]
        conf: f64,
        /// AdamW decoupled weight decay (matrices only, never the Markov tables).
        #[arg(long, default_value_t = 0.0)]
        weight_decay: f64,
        /// Global gradient-norm clip (0 = off).
        #[arg(long, default_value_t = 1.0)]
        clip: f64,
        /// Seed of the initialisation, sequence order and anchors.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Held-out sequences for validation (highest prompt ids).
        #[arg(long, default_value_t = 8)]
        holdout: usize,
        /// Write a training checkpoint every N steps (the two newest are kept).
        #[arg(long, default_value_t = 50)]
        ckpt_every: usize,
        /// Evaluate on the holdout every N steps (0 = only at the end).
        #[arg(long, default_value_t = 0)]
        eval_every: usize,
        /// Warm start: copy target layers F..F+layers into the draft layers (F = first tap + 1
        /// makes the context rows exactly the normalised input of target layer F).
        #[arg(long)]
        init_from_target: Option<usize>,
        /// Warm start from a trained drafter: an exported checkpoint directory (config.json +
        /// model.safetensors, e.g. models/smollm2-135m-dspark-b8) of the same kind, layers, taps
        /// and Markov rank; Markov W2 rows are matched by target id, so --draft-vocab may differ.
        /// Fresh optimizer moments; ignored when --resume finds a checkpoint (it has the weights).
        #[arg(long, value_name = "DIR")]
        init_from: Option<PathBuf>,
        /// Reduced draft vocabulary V_d: the output layer (the target lm_head's rows) and the
        /// Markov W2 cover the V_d most frequent target ids of the training answers (counted
        /// once, frozen into --out/draft_vocab.json); CE to a label outside it is skipped.
        #[arg(long)]
        draft_vocab: Option<usize>,
        /// The cached tap layers this drafter reads (comma-separated, a subset of the cache's
        /// `tap_layers`, in any order: the drafter's `target_layer_ids`); default: all of them.
        #[arg(long, value_delimiter = ',')]
        use_taps: Option<Vec<usize>>,
        /// Train on the first N cache files (by name) only. The file list is frozen into
        /// --out/data.json at the start either way, so a resumed run sees the same data.
        #[arg(long)]
        max_seqs: Option<usize>,
        /// Continue from the newest checkpoint in --out.
        #[arg(long)]
        resume: bool,
        /// Stop with a checkpoint after this many minutes.
        #[arg(long)]
        max_minutes: Option<f64>,
    },
    /// Write the HF-layout checkpoint of a run (bf16) and verify it loads with the engine.
    Export {
        /// Run directory.
        #[arg(long)]
        run: PathBuf,
        /// Output directory (config.json + model.safetensors).
        #[arg(long)]
        out: PathBuf,
        /// Checkpoint step (default: the newest).
        #[arg(long)]
        step: Option<usize>,
        /// Write f32 instead of bf16.
        #[arg(long)]
        f32: bool,
        /// Replace the files of a checkpoint or model already in --out.
        #[arg(long)]
        force: bool,
    },
}

fn default_target() -> PathBuf {
    sparkling::assets::path(sparkling::assets::DEFAULT_TARGET)
}

fn main() {
    sparkling::process::tune_allocator();
    sparkling::fsio::install_interrupt_cleanup();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        // `--help` / `--version` through the engine's stdout writer, so a full disk is an error
        // (clap's own printer ignores write failures and exits 0); usage errors exit 2 as usual.
        Err(e) if !e.use_stderr() => match sparkling::fsio::write_stdout(&e.render().to_string()) {
            Ok(()) => return,
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        },
        Err(e) => e.exit(),
    };
    // As the engine's CLI: run the command on a worker of rayon's pool, so the engine's
    // parallel ops (gen-data's target forwards) fork from a worker instead of handing each op
    // to the pool from an outside thread and sleeping on a latch until it is done.
    let result = configure_threads(cli.threads).and_then(|()| rayon::scope(move |_| run(cli)));
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// Size rayon's global pool from `--threads` (before its first use).
fn configure_threads(threads: Option<usize>) -> Result<()> {
    if let Some(n) = threads {
        if n == 0 {
            return Err(Error::arg("threads", "must be ≥ 1"));
        }
        // As the engine's CLI: more threads than a few per core only adds contention, and a
        // huge count hangs while spawning them.
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        if n > 4 * cores {
            return Err(Error::arg("threads", format!("{n} is more than 4 × the {cores} cores of this machine")));
        }
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
        let _ = rayon::ThreadPoolBuilder::new().num_threads(n).build_global();
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    let minutes_ok = |m: Option<f64>| match m {
        Some(x) if !(x.is_finite() && x > 0.0) => Err(Error::arg("max-minutes", format!("{x} must be a positive number of minutes"))),
        _ => Ok(()),
    };
    match &cli.cmd {
        Cmd::GenData { max_minutes, .. } | Cmd::Train { max_minutes, .. } => minutes_ok(*max_minutes)?,
        Cmd::Export { .. } => {}
    }
    match cli.cmd {
        Cmd::GenData { target, prompts, out, start, limit, max_new_tokens, topk, taps, tap_layers, max_minutes, batch, max_tokens, weights } => {
            use sparkling::cpu::WeightDtype;
            let weights = match weights.as_deref() {
                None => None,
                Some("f16") => Some(WeightDtype::F16),
                Some("f32") => Some(WeightDtype::F32),
                Some("native") => Some(WeightDtype::Native),
                Some("q8_0") => Some(WeightDtype::Q8_0),
                Some(other) => return Err(Error::arg("weights", format!("`{other}`: expected f16, native, q8_0 or f32"))),
            };
            let target = target.unwrap_or_else(default_target);
            if taps == 0 {
                return Err(Error::arg("taps", "must be ≥ 1"));
            }
            if max_new_tokens == 0 {
                return Err(Error::arg("max-new-tokens", "must be ≥ 1 (answer tokens per prompt)"));
            }
            if limit == 0 {
                return Err(Error::arg("limit", "must be ≥ 1 (prompts to answer)"));
            }
            let (_, tcfg) = gen::load_lm_head(&target)?;
            if topk == 0 || topk > tcfg.vocab {
                return Err(Error::arg("topk", format!("{topk}: expected 1..={} (the target vocabulary)", tcfg.vocab)));
            }
            let explicit = tap_layers.is_some();
            let tap_layers = match tap_layers {
                Some(t) => {
                    if t.is_empty() {
                        return Err(Error::arg("tap-layers", "give at least one layer"));
                    }
                    if let Some(&bad) = t.iter().find(|&&l| l >= tcfg.layers) {
                        return Err(Error::arg(
                            "tap-layers",
                            format!("layer {bad} is not a layer of the {}-layer target (0..={})", tcfg.layers, tcfg.layers - 1),
                        ));
                    }
                    let mut d = t.clone();
                    d.sort_unstable();
                    d.dedup();
                    if d.len() != t.len() {
                        return Err(Error::arg("tap-layers", format!("{t:?} lists a layer twice")));
                    }
                    t
                }
                None => default_target_layer_ids(tcfg.layers, taps),
            };
            let mut distinct = tap_layers.clone();
            distinct.dedup();
            if !explicit && distinct.len() != tap_layers.len() {
                return Err(Error::arg(
                    "taps",
                    format!("{taps} taps do not fit a {}-layer target (distinct layers from 1 to {} only)", tcfg.layers, tcfg.layers.saturating_sub(3)),
                ));
            }
            let out = out.unwrap_or_else(|| {
                let stem = target.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_else(|| "target".into());
                let taps: Vec<String> = tap_layers.iter().map(|t| t.to_string()).collect();
                sparkling::assets::dir().join("train-cache").join(format!("{stem}-taps{}", taps.join("-")))
            });
            let o = GenOptions { target, prompts, out: out.clone(), start, limit, max_new_tokens, topk, tap_layers, max_minutes, batch, max_tokens, weights };
            let s = gen::run(&o)?;
            if s.too_long > 0 {
                eprintln!("note: {} prompts did not fit the target's context with --max-new-tokens {} and were skipped", s.too_long, o.max_new_tokens);
            }
            eprintln!(
                "gen-data: {} written, {} already cached ({} answer tokens), {} new answer tokens in {:.1}s ({:.1} tok/s), top-1 mismatches {} → {}",
                s.written,
                s.skipped,
                s.cached_tokens,
                s.new_tokens,
                s.seconds,
                s.new_tokens as f64 / s.seconds.max(1e-9),
                s.top1_mismatch,
                out.display()
            );
            Ok(())
        }
        Cmd::Train {
            kind,
            cache,
            target,
            out,
            layers,
            block_size,
            markov_rank,
            no_confidence,
            steps,
            lr,
            warmup,
            min_lr_ratio,
            seqs_per_step,
            anchors,
            gamma,
            ce,
            kl,
            l1,
            conf,
            weight_decay,
            clip,
            seed,
            holdout,
            ckpt_every,
            eval_every,
            init_from_target,
            init_from,
            draft_vocab,
            use_taps,
            max_seqs,
            resume,
            max_minutes,
        } => {
            let target = target.unwrap_or_else(default_target);
            let dspark = kind == "dspark";
            if kind == "eagle" && (resume || init_from.is_some() || init_from_target.is_some()) {
                return Err(Error::arg("kind", "an eagle reference head trains from scratch in one go (no --resume / --init-from)"));
            }
            if !dspark {
                // DFlash drafters have neither head: these options would be ignored, so they are refused.
                for (given, arg) in [(markov_rank != 32, "markov-rank"), (no_confidence, "no-confidence"), (conf != 1.0, "conf")] {
                    if given {
                        return Err(Error::arg(arg, format!("only --kind dspark reads it (a {kind} drafter has no Markov or confidence head)")));
                    }
                }
            }
            let rc = RunConfig {
                kind,
                target: target.display().to_string(),
                cache: cache.display().to_string(),
                layers,
                block_size,
                markov_rank: if dspark { markov_rank } else { 0 },
                confidence: dspark && !no_confidence,
                steps,
                lr,
                warmup,
                min_lr_ratio,
                seqs_per_step,
                anchors,
                gamma,
                w_ce: ce,
                w_kl: kl,
                w_l1: l1,
                w_conf: conf,
                weight_decay,
                clip,
                seed,
                holdout,
                init_from_target,
                init_from: init_from.map(|p| p.display().to_string()),
                draft_vocab,
                max_seqs,
                use_taps,
            };
            if rc.kind == "eagle" {
                sparkling_train::eagle::run(&rc, &sparkling_train::eagle::EagleControl { out, eval_every, max_minutes })?;
                return Ok(());
            }
            let ctl = TrainControl { out, resume, ckpt_every, eval_every, max_minutes };
            train::run(&rc, &ctl)?;
            Ok(())
        }
        Cmd::Export { run, out, step, f32, force } => export(&run, &out, step, f32, force),
    }
}

fn export(run: &Path, out: &Path, step: Option<usize>, f32: bool, force: bool) -> Result<()> {
    sparkling::fsio::check_out_dir(out, force, "--out")?;
    let rc = read_run_config(run)?;
    for (input, what) in [(run, "the --run directory"), (Path::new(&rc.target), "the run's target")] {
        if sparkling::fsio::same_file(input, out) {
            return Err(Error::arg("out", format!("{} is {what}: export the drafter to another directory", out.display())));
        }
    }
    let (meta, _head, tcfg, dcfg) = run_context(&rc)?;
    let step = match step {
        Some(s) => s,
        None => latest_checkpoint(run)?.ok_or_else(|| Error::file(run, "no checkpoint (ckpt-*.json) in this run directory"))?,
    };
    let params = load_checkpoint(run, step, &dcfg, meta.width(), None)?;
    let draft_vocab = read_draft_vocab(run, &rc, tcfg.vocab)?;
    if let Some(scale) = load_checkpoint_scale(run, step)? {
        fold_ctx_scale(&params, &scale)?;
    }
    let summary = std::fs::read_to_string(run.join("summary.json")).ok().and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok());
    let info = serde_json::json!({"run": rc, "step": step, "summary": summary, "cache_target": meta.target, "cache_source": meta.source});
    let dtype = if f32 { ExportDtype::F32 } else { ExportDtype::Bf16 };
    write_hf(
        out,
        Export { cfg: &dcfg, num_target_layers: tcfg.layers, n_feat: meta.width(), params: &params, draft_vocab: draft_vocab.as_ref(), dtype },
        Some(&info),
        Some(&tcfg),
    )?;
    let cfg = verify_with_engine(out, &tcfg)?;
    let size = std::fs::metadata(out.join("model.safetensors")).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "exported step {step} → {} ({:?}, {} layers, Markov rank {}, draft vocabulary {}, {:.1} MB); verified: the engine's Drafter::load accepts it",
        out.display(),
        cfg.kind,
        cfg.layers,
        cfg.markov_rank,
        cfg.draft_vocab,
        size as f64 / 1e6
    );
    Ok(())
}
