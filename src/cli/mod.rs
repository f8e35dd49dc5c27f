//! Argument parsing and subcommand dispatch.

mod bench;
mod generate;
mod init;
mod load;
mod plot;
mod profile;

use clap::{Parser, Subcommand};
use sparkling::Result;

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
    /// List the wgpu adapters (index: name (backend, type, driver)) for `--adapter`.
    Adapters,
}

/// Parse arguments and run the chosen subcommand.
pub fn run() -> Result<()> {
    let cli = Cli::parse();
    let threads = match &cli.cmd {
        Command::Generate(a) => a.model.threads,
        Command::Bench(a) => a.model.threads,
        Command::Profile(a) => a.model.threads,
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
        Command::Adapters => load::list_adapters(),
    })
}
