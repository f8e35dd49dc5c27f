//! SparklingTree: lossless speculative decoding with block-diffusion draft trees.
//!
//! Layout (design §2): [`model`] (target, drafters, configs, random checkpoints), [`loader`]
//! (safetensors / GGUF), [`tokenizer`] (tokenizer + chat template), [`tree`] (host tree
//! builders), [`decode`] (the one decode loop and its methods). Backends live in
//! `backends/` behind the [`sparkling_core::Backend`] trait.
#![warn(missing_docs)]

/// `eprintln!` that never panics on a closed or full stderr; see `src/main.rs`.
macro_rules! eprintln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

pub mod assets;
pub mod decode;
pub mod error;
pub mod fsio;
pub mod loader;
pub mod model;
pub mod process;
#[cfg(not(target_arch = "wasm32"))]
pub mod serve;
pub mod tokenizer;
pub mod tree;

pub use error::{Error, Result};
pub use sparkling_core as core;
pub use sparkling_cpu as cpu;
#[cfg(feature = "cuda")]
pub use sparkling_cuda as cuda_backend;
#[cfg(feature = "wgpu")]
pub use sparkling_wgpu as wgpu_backend;
