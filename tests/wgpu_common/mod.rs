//! Helpers shared by the wgpu conformance tests: one backend per test binary, loud skips when
//! no adapter exists (a failure under `SPARKLING_REQUIRE_GPU=1`), deterministic random data
//! and tolerance checks that print the measured error.
#![allow(dead_code)]

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
    let b = B.get_or_init(|| open(&WgpuOptions::default(), "wgpu backend").inspect(|b| eprintln!("wgpu conformance on {}", sparkling_core::Backend::name(b))));
    if b.is_none() {
        eprintln!("SKIPPED {test}: no wgpu adapter");
    }
    b.as_ref()
}

/// `let b = gpu_or_skip!();` — the shared backend, or return from the test after a loud skip.
#[macro_export]
macro_rules! gpu_or_skip {
    () => {
        match common::gpu(module_path!()) {
            Some(b) => b,
            None => return,
        }
    };
}

/// SplitMix64 stream of uniforms in [-1, 1).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        sparkling::decode::rng::splitmix64_next(&mut self.0)
    }
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform()).collect()
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Largest |a - b| over the two slices (panics on a length mismatch).
pub fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Assert `|got - want| <= abs + rel * |want|` elementwise; prints the worst error.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], abs: f32, rel: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, 0.0f32);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        let tol = abs + rel * w.abs();
        assert!(err <= tol, "{what}: element {i}: got {g}, want {w} (error {err:e} > tolerance {tol:e})");
        if err > worst.1 {
            worst = (i, err);
        }
    }
    eprintln!("{what}: max abs error {:e} (at {}), tolerance {abs:e} + {rel:e}·|want|", worst.1, worst.0);
}

/// Assert bit equality and say so.
pub fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what}: element {i}: {g} vs {w}");
    }
}
