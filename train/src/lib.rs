//! `sparkling-train`: trains SparklingTree's block-diffusion drafters (z-lab DFlash, reference
//! §2; DeepSpec DSpark with its Markov and confidence heads, §3) for a target the engine runs,
//! on data the target itself generated.
//!
//! Pipeline (see the crate README for commands):
//! 1. [`gen`] — the target answers training prompts greedily through the engine
//!    ([`sparkling::decode::Engine`]); per sequence the token ids, the tapped hidden states of
//!    the drafter's tap layers (f16) and the target's top-k logits are cached on disk
//!    ([`cache`]).
//! 2. [`train`] — a candle implementation of the drafter forward ([`model`]; the same math as
//!    `sparkling::model::drafter::Drafter::draft`) trained with the DFlash / DeepSpec objective
//!    ([`head`]: CE to the target's greedy token + distribution matching to its top-k, position
//!    weights `exp(-(k-1)/γ)`, Markov head trained jointly, confidence head), AdamW ([`optim`]),
//!    resumable checkpoints ([`checkpoint`]), held-out evaluation ([`eval`]).
//!    [`eagle`] trains an EAGLE-style reference head on the same data (a diagnosis:
//!    the depth-1 agreement a drafter with the same information reaches).
//! 3. [`export`] — the HF-layout checkpoint (`config.json` + bf16 `model.safetensors`) the
//!    engine loads unchanged, verified by loading it with `Drafter::load`.

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

pub mod cache;
pub mod checkpoint;
pub mod eagle;
pub mod error;
pub mod eval;
pub mod export;
pub mod gen;
pub mod head;
pub mod model;
pub mod optim;
pub mod rng;
pub mod train;
pub mod warm_start;

pub use error::{Error, Result};
