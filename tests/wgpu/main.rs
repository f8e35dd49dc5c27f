//! The wgpu backend's tests, one test binary (each binary links the whole engine): the generic
//! conformance suite against the CPU backend (`conformance`, from `tests/common/conformance.rs`,
//! shared with CUDA), attention, batches (each sequence equal to itself alone and to `ar`), the
//! selection ops on both reduction paths, adapter limits, quantized weights, and the host-sync
//! and op-count audits.
//!
//! Without an adapter every test skips loudly; `SPARKLING_REQUIRE_GPU=1` makes that a failure.
//! Run: `cargo test --release --features wgpu --test wgpu` (on a machine without a GPU:
//! `scripts/install-lavapipe` first; see scripts/test).
#![cfg(feature = "wgpu")]

#[path = "../common/mod.rs"]
mod common;

use sparkling_wgpu::{WgpuBackend, WgpuOptions};
use std::sync::OnceLock;

/// True when `SPARKLING_REQUIRE_GPU=1`: a missing adapter fails instead of skipping.
pub fn require_gpu() -> bool {
    std::env::var("SPARKLING_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// Open a backend with `opts`, or `None` after a loud skip message when there is no adapter.
/// Panics (test failure) when no adapter exists and `SPARKLING_REQUIRE_GPU=1`, or when the
/// adapter exists but cannot be opened.
pub fn open(opts: &WgpuOptions, test: &str) -> Option<WgpuBackend> {
    match WgpuBackend::with_options(opts) {
        Ok(b) => Some(b),
        Err(sparkling_core::Error::Unavailable(msg)) if !require_gpu() && sparkling_wgpu::list_adapters().is_empty() => {
            eprintln!("SKIPPED {test}: no wgpu adapter ({msg}); set SPARKLING_REQUIRE_GPU=1 to make this a failure");
            None
        }
        Err(e) => panic!("{test}: cannot open a wgpu backend: {e}"),
    }
}

/// The shared default backend (f32 weights), or `None` after a loud skip.
pub fn gpu(test: &str) -> Option<&'static WgpuBackend> {
    static B: OnceLock<Option<WgpuBackend>> = OnceLock::new();
    let b = B.get_or_init(|| open(&WgpuOptions::default(), "wgpu backend").inspect(|b| eprintln!("wgpu tests on {}", sparkling_core::Backend::name(b))));
    if b.is_none() {
        eprintln!("SKIPPED {test}: no wgpu adapter");
    }
    b.as_ref()
}

/// `let b = gpu_or_skip!();` — the shared backend, or return from the test after a loud skip.
macro_rules! gpu_or_skip {
    () => {
        match $crate::gpu(module_path!()) {
            Some(b) => b,
            None => return,
        }
    };
}

mod attention;
mod batch;
mod conformance;
mod limits;
mod quant;
mod select;
mod syncs;
