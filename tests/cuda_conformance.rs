//! Conformance of the CUDA backend with the CPU backend, through the backend-generic suite of
//! `tests/common/conformance.rs` (one `#[test]` per check, the same checks wgpu runs), with f32
//! and bf16 weights:
//!
//! - every op on awkward sizes (f32 weights: matmul within `2e-6·Σ|x·w|`; bf16 weights against
//!   the CPU given the same bf16-rounded operands), gathered weight rows, bad shapes as errors;
//! - the engine invariant on the device: a row (and a 5-row block) alone equals the same rows of
//!   a 65- and a 200-row call bit for bit (matmul crosses the 128-row GEMM block), a
//!   tree-attention row equals the causal decode of its path;
//! - argmax / sampling / top-k / Markov table / candidate table ids and slots exactly as the
//!   CPU's, and the device-built SparklingTree tree equal to the host heap's;
//! - target logits and taps within `1e-4 + 1e-5·max|row|` (f32), every method's greedy tokens
//!   equal to the CPU's on the exactness-matrix models (near-ties reported explicitly), and on
//!   bf16 every method equal to the device's own `ar`, the reduced draft vocabulary included.
//!
//! Without an NVIDIA driver/GPU (or libnvrtc / libcublas) every test skips with a message;
//! `SPARKLING_REQUIRE_CUDA=1` makes that a failure (the device-check script sets it).
//! Run: `cargo test --release --features cuda --test cuda_conformance`.
#![cfg(feature = "cuda")]

mod common;

use common::conformance::{bf16, exact, Device, Prompts, Weights};
use sparkling::core::Error;
use sparkling::cpu::WeightDtype as CpuDtype;
use sparkling::cuda_backend::{CudaBackend, CudaOptions, WeightDtype};

/// The CUDA backend under the conformance suite: f32 weights (cuBLAS `Sgemm`, pedantic math)
/// and bf16 weights (bf16 activations too, f32 accumulation).
struct Cuda;

impl Device for Cuda {
    type B = CudaBackend;
    type Options = CudaOptions;

    fn weights() -> Vec<Weights<CudaOptions>> {
        let opts = |weight_dtype| CudaOptions { weight_dtype, ..Default::default() };
        vec![
            Weights { name: "f32", opts: opts(WeightDtype::F32), round_x: exact, round_w: exact, cpu: Some(CpuDtype::F32) },
            Weights { name: "bf16", opts: opts(WeightDtype::Bf16), round_x: bf16, round_w: bf16, cpu: None },
        ]
    }

    /// The CUDA backend with `opts`, or `None` after a loud skip.
    fn open(opts: &CudaOptions, test: &str) -> Option<CudaBackend> {
        match CudaBackend::with_options(opts) {
            Ok(b) => Some(b),
            Err(Error::Unavailable(m)) if std::env::var("SPARKLING_REQUIRE_CUDA").as_deref() != Ok("1") => {
                eprintln!("SKIPPED {test}: CUDA unavailable ({m}); set SPARKLING_REQUIRE_CUDA=1 to make this a failure");
                None
            }
            Err(e) => panic!("{test}: cannot open the CUDA backend: {e}"),
        }
    }

    const PROMPTS: Prompts = Prompts::Both;
    const REDUCED_VOCAB_BUDGETS: &'static [usize] = &[1, 8, 32];
}

conformance_tests!(Cuda);

#[test]
fn unavailable_cuda_is_an_error_not_a_panic() {
    // Whatever this machine has, opening the backend returns (Ok or Err) instead of panicking,
    // and a bad option is an error.
    let r = CudaBackend::new();
    if let Err(e) = &r {
        eprintln!("CudaBackend::new() = {e}");
        assert!(matches!(e, Error::Unavailable(_)) || std::env::var("SPARKLING_REQUIRE_CUDA").as_deref() == Ok("1"), "{e}");
    }
    let bad = CudaBackend::with_options(&CudaOptions { gemm_row_block: 0, ..Default::default() });
    assert!(matches!(bad, Err(Error::Invalid(_))));
}
