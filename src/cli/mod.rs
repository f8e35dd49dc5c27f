//! Argument parsing and subcommand dispatch.

/// `println!` that never panics: a closed pipe ends the program quietly, other write errors
/// (a full disk) are errors (see [`write_stdout`]).
macro_rules! outln {
    () => {
        $crate::cli::write_stdout("\n")
    };
    ($($t:tt)*) => {
        $crate::cli::write_stdout(&format!("{}\n", format_args!($($t)*)))
    };
}

/// Open the backend `--backend` names (from the [`load::ModelArgs`] `$args`) and evaluate
/// `$body` with `$b` bound to it and `$target` to the resolved target path: the one dispatch
/// from the runtime backend choice to code generic over [`sparkling::core::Backend`] (the body
/// is compiled once per backend of the build).
macro_rules! with_backend {
    ($args:expr, |$b:ident, $target:ident| $body:expr) => {{
        let s = $crate::cli::load::select($args)?;
        let $target = s.target;
        match s.backend {
            $crate::cli::load::AnyBackend::Cpu($b) => $body,
            #[cfg(feature = "wgpu")]
            $crate::cli::load::AnyBackend::Wgpu($b) => $body,
            #[cfg(feature = "cuda")]
            $crate::cli::load::AnyBackend::Cuda($b) => $body,
        }
    }};
}

/// [`with_backend`], then load the target and the drafters of the kinds `$kinds` onto the
/// backend and evaluate `$body` with `$m` bound to the [`load::Loaded`] model.
macro_rules! with_loaded {
    ($args:expr, $kinds:expr, |$m:ident| $body:expr) => {{
        let args: &$crate::cli::load::ModelArgs = $args;
        with_backend!(args, |b, target| {
            let $m = $crate::cli::load::load(b, &target, args, $kinds)?;
            $body
        })
    }};
}

mod bench;
mod bench_batch;
mod costs;
mod generate;
mod init;
mod load;
mod options;
mod plot;
mod profile;
mod reduce;
mod serve;

use clap::{Parser, Subcommand};
use sparkling::{Error, Result};

/// SparklingTree: lossless speculative decoding with block-diffusion draft trees.
#[derive(Parser)]
#[command(name = "sparkling", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt or chat message, streaming tokens as they are committed.
    Generate(generate::GenerateArgs),
    /// Run a prompt set × methods × budgets; print a table and write JSON.
    Bench(bench::BenchArgs),
    /// Write a randomly initialised DFlash or DSpark drafter sized for a target (HF layout).
    InitDrafter(init::InitDrafterArgs),
    /// Write a random-weight target checkpoint of a given config (HF layout).
    SynthTarget(init::SynthTargetArgs),
    /// Write a random-weight target of a real geometry (e.g. Qwen3-4B) plus DSpark and DFlash
    /// drafters sized for it, to time the real shapes without the real weights.
    Synth(init::SynthArgs),
    /// Draw SVG charts (acceptance by depth, τ per method, budget vs τ vs tokens/s) from
    /// `bench --json` results.
    Plot(plot::PlotArgs),
    /// Time the parts of one round (AR step, verify, draft, candidate table, heap, compaction).
    Profile(profile::ProfileArgs),
    /// Make a reduced-draft-vocabulary drafter: count the target's generated tokens and keep the
    /// V_d most frequent in the drafter's output layer and Markov head (issue 12).
    ReduceVocab(reduce::ReduceVocabArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (chat and text completions,
    /// streaming, continuous batching, /metrics).
    ///
    /// Requests: `temperature` defaults to 0 (greedy: the target's own tokens, as `generate`);
    /// with `temperature` > 0 and no `seed` each request draws its own seed, with a `seed` the
    /// same text comes back alone or under load. `"sparkling": {"method": "ar", "budget": 8}`
    /// chooses a request's method and tree budget; `usage.speculation` reports its rounds and τ
    /// (committed tokens per round). Give `--drafter` once per kind (DFlash, DSpark) to offer
    /// every method.
    Serve(serve::ServeArgs),
    /// List the wgpu adapters (index: name (backend, type, driver)) for `--adapter`.
    Adapters,
}

/// Parse arguments and run the chosen subcommand.
pub fn run() -> Result<()> {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        // `--help` / `--version` go to stdout through `write_stdout`, so a full disk is an error
        // (clap's own printer ignores write failures and exits 0); usage errors exit 2 as usual.
        Err(e) if !e.use_stderr() => return write_stdout(&e.render().to_string()),
        // A value outside an option's set: an input error like the others (exit status 1).
        Err(e) => match options::value_error(&e) {
            Some(msg) => return Err(Error::Input(msg)),
            None => e.exit(),
        },
    };
    let threads = match &cli.cmd {
        Command::Generate(a) => a.model.threads,
        Command::Bench(a) => a.model.threads,
        Command::Profile(a) => a.model.threads,
        Command::ReduceVocab(a) => a.model.threads,
        Command::Serve(a) => a.model.threads,
        _ => None,
    };
    if let Some(n) = threads {
        load::rayon_threads(n)?;
    }
    // Run the whole command on a worker of rayon's pool: the CPU backend's parallel ops then
    // fork from a worker instead of handing each op to the pool from an outside thread and
    // blocking on a latch (hundreds of cross-thread wake-ups per decoded token).
    rayon::scope(move |_| match cli.cmd {
        Command::Generate(a) => generate::run(a),
        Command::Bench(a) => bench::run(a),
        Command::InitDrafter(a) => init::run_init_drafter(a),
        Command::SynthTarget(a) => init::run_synth_target(a),
        Command::Synth(a) => init::run_synth(a),
        Command::Plot(a) => plot::run(a),
        Command::Profile(a) => profile::run(a),
        Command::ReduceVocab(a) => reduce::run(a),
        Command::Adapters => load::list_adapters(),
        // The server's engine thread and HTTP runtime are its own threads.
        Command::Serve(a) => serve::run(a),
    })
}

pub use sparkling::fsio::{stdout_error, write_stdout};

/// Write a command's results: the JSON file first (so a closed stdout cannot lose them), then
/// `text` to stdout. When the JSON write fails (a full disk, a bad path), the text is still
/// printed before the error is returned, so computed results are never lost (issue 15).
pub fn save_json_then_print(json: Option<&std::path::Path>, value: &serde_json::Value, text: &str) -> Result<()> {
    if let Some(path) = json {
        if let Err(e) = sparkling::fsio::write_bytes(path, serde_json::to_string_pretty(value).unwrap_or_default().as_bytes()) {
            use std::io::Write;
            // Best effort: the JSON error is the one to report.
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(text.as_bytes()).and_then(|_| o.flush());
            return Err(e);
        }
        eprintln!("wrote {}", path.display());
    }
    write_stdout(text)
}

/// Bound the tree knobs by what they can mean (issue 15): more candidates per depth than the
/// vocabulary holds, a fan-out above the candidates or a TreeSpark k above the vocabulary only
/// add work (or allocations that abort); they are clamped, with a note when `method` uses them.
pub fn bound_tree(t: &mut sparkling::decode::propose::TreeParams, vocab: usize, method: sparkling::decode::Method) {
    use sparkling::decode::Method;
    // A note only for the knobs `method` uses; the others are bounded silently.
    let note = |used: bool, arg: &str, v: &mut usize, max: usize, what: &str| {
        if used {
            clamp(arg, v, max, what);
        } else {
            *v = (*v).min(max);
        }
    };
    note(method == Method::Sparkling, "--candidates", &mut t.candidates, vocab, "the vocabulary size");
    note(method == Method::Sparkling, "--max-fanout", &mut t.max_fanout, t.candidates, "--candidates");
    // TreeSpark's candidate pool grows as depth × k²: k beyond the budget adds nothing.
    let k_max = vocab.min(t.budget.max(1)).min(MAX_TREESPARK_K);
    note(method == Method::TreeSpark, "--treespark-k", &mut t.treespark_k, k_max, "the vocabulary size, --budget and 1024");
}

/// The methods that read a tree or drafter option of `generate` / `bench` (none for a name
/// not listed here).
fn readers(option: &str) -> &'static [sparkling::decode::Method] {
    use sparkling::decode::Method::*;
    match option {
        "--candidates" | "--max-fanout" => &[Sparkling],
        "--treespark-k" => &[TreeSpark],
        // Every method with a draft tree or chain (lookup's budget is its chain length).
        "--budget" | "--budgets" => &[DFlash, DDTree, DSpark, Sparkling, TreeSpark, Lookup],
        // Every method with a drafter.
        "--tree-prep" | "--drafter" | "--lookup" | "--lookup-drafter" => &[DFlash, DDTree, DSpark, Sparkling, TreeSpark],
        // The methods whose drafter is a DSpark one (only those carry a confidence head).
        "--no-confidence" => &[DSpark, Sparkling, TreeSpark],
        _ => &[],
    }
}

/// Refuse an option that none of the chosen `methods` reads (issue 15: arguments a run does
/// not use are rejected, not silently ignored). `given`: each option's name and whether it was
/// given; `chosen`: how the methods were chosen (`--method ar`, `--methods ar,dflash`).
/// Errors: [`Error::Input`] naming the option, the chosen methods and the methods that read it.
pub fn refuse_unused_options(given: &[(&str, bool)], methods: &[sparkling::decode::Method], chosen: &str) -> Result<()> {
    for &(option, _) in given.iter().filter(|(_, g)| *g) {
        let r = readers(option);
        if !methods.iter().any(|m| r.contains(m)) {
            let names: Vec<&str> = r.iter().map(|m| m.name()).collect();
            return Err(Error::Input(format!("{option} is not used by {chosen}: only {} read it; remove it or choose such a method", names.join(", "))));
        }
    }
    Ok(())
}

/// Refuse sampling options at temperature 0 (greedy decoding reads none of them; issue 15:
/// `--top-k`, `--top-p` and `--seed` were accepted and ignored). `top_k` / `top_p`: `None`
/// where the command has no such option. Only values other than the defaults (0, 1, 0) count
/// as given. A negative or non-finite temperature is refused first, a top-p outside (0, 1]
/// when sampling.
pub fn refuse_greedy_sampling_options(temperature: f32, top_k: Option<usize>, top_p: Option<f32>, seed: u64) -> Result<()> {
    if !(temperature >= 0.0 && temperature.is_finite()) {
        return Err(Error::Input(format!("--temperature {temperature}: expected a finite value ≥ 0 (0 = greedy)")));
    }
    if temperature >= 1e-5 {
        return match top_p {
            Some(p) if !(p > 0.0 && p <= 1.0) => Err(Error::Input(format!("--top-p {p}: expected a value in (0, 1] (1 = off)"))),
            _ => Ok(()),
        };
    }
    for (given, option) in [(top_k.is_some_and(|k| k != 0), "--top-k"), (top_p.is_some_and(|p| p != 1.0), "--top-p"), (seed != 0, "--seed")] {
        if given {
            return Err(Error::Input(format!(
                "{option} has no effect at --temperature 0 (greedy decoding): give a temperature > 0 to sample, or leave {option} out"
            )));
        }
    }
    Ok(())
}

/// Largest TreeSpark k (its pool holds depth × k² candidates).
const MAX_TREESPARK_K: usize = 1024;

/// Clamp `v` to `max` with a note naming the argument.
pub fn clamp(arg: &str, v: &mut usize, max: usize, what: &str) {
    if *v > max {
        eprintln!("note: {arg} {v} exceeds {what} ({max}); using {max}");
        *v = max;
    }
}
