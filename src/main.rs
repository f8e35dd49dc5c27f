//! `sparkling` command-line interface: `generate`, `bench`, `init-drafter`, `synth`, `synth-target`.
#![warn(missing_docs)]

mod cli;

fn main() {
    if let Err(e) = cli::run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
