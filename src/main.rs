//! `sparkling` command-line interface: `generate`, `bench`, `init-drafter`, `synth`, `synth-target`.
#![warn(missing_docs)]

/// `eprintln!` that never panics: a closed or full stderr (`2>/dev/full`, `2>&1 | head`) must
/// not abort a run or lose its results; a message that cannot be written is dropped.
/// Shadows the standard macro for this crate (textual scope: defined before the modules).
macro_rules! eprintln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

mod cli;

fn main() {
    sparkling::process::tune_allocator();
    sparkling::fsio::install_interrupt_cleanup();
    if let Err(e) = cli::run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
