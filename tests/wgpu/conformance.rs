//! The generic conformance suite of `tests/common/conformance.rs` (shared with CUDA) on wgpu,
//! against the CPU backend: every op on awkward sizes for f32, f16 and bf16 weights and both
//! forced matmul kernels, target logits (f32 and f16 weights), and every method's tokens on the
//! random models of the exactness matrix (Llama / Qwen2 / Qwen3 targets, DFlash and DSpark
//! drafters). Here too: real-weight tokens (SmolLM2), device tree prep end to end, and the
//! buffer pool.
use crate::common::conformance::{bf16, exact, f16, Device, Prompts, Weights};
use crate::common::{load_drafter, load_target, params, tmpdir, write_drafter};
use sparkling::cpu::{CpuBackend, WeightDtype as CpuDtype};
use sparkling::decode::{Engine, Method};
use sparkling::model::config::{DrafterKind, TargetConfig};
use sparkling::model::synth::{tiny_target_config, write_random_target, StoreDtype};
use sparkling::model::target::Target;
use sparkling::wgpu_backend::{MatmulKernel, WeightDtype, WgpuBackend, WgpuOptions};
use std::path::Path;

/// The wgpu backend under the conformance suite. Activations stay f32 for every weight storage.
struct Wgpu;

impl Device for Wgpu {
    type B = WgpuBackend;
    type Options = WgpuOptions;

    fn weights() -> Vec<Weights<WgpuOptions>> {
        let opts = |weight_dtype| WgpuOptions { weight_dtype, ..Default::default() };
        vec![
            Weights { name: "f32", opts: opts(WeightDtype::F32), round_x: exact, round_w: exact, cpu: Some(CpuDtype::F32) },
            Weights { name: "f16", opts: opts(WeightDtype::F16), round_x: exact, round_w: f16, cpu: Some(CpuDtype::F16) },
            Weights { name: "bf16", opts: opts(WeightDtype::Bf16), round_x: exact, round_w: bf16, cpu: None },
        ]
    }

    fn kernel_variants() -> Vec<(&'static str, WgpuOptions)> {
        let opts = |matmul_kernel| WgpuOptions { matmul_kernel, ..Default::default() };
        vec![("tiled matmul", opts(MatmulKernel::Tiled)), ("direct matmul", opts(MatmulKernel::Direct))]
    }

    fn open(opts: &WgpuOptions, test: &str) -> Option<WgpuBackend> {
        crate::open(opts, test)
    }

    /// A lavapipe round takes tens of ms: each case runs one of the two prompts.
    const PROMPTS: Prompts = Prompts::Alternate;
    const REDUCED_VOCAB_BUDGETS: &'static [usize] = &[1, 32];
}

crate::conformance_tests!(Wgpu);

/// Dropped tensors go back to the pool, and a recycled buffer is cleared by `zeros` (the
/// suite's round trip, on the shared backend).
#[test]
fn dropped_tensors_go_back_to_the_pool() {
    let g = gpu_or_skip!();
    crate::common::conformance::zeros_upload_and_download_round_trip(g);
    assert!(g.pooled_idle_bytes() > 0, "dropped tensors go back to the pool");
}

/// SmolLM2-135M-Instruct (real weights, f16 on both backends): `ar` and `sparkling` greedy
/// tokens on wgpu equal the CPU backend's on a chat prompt. Uses the trained DSpark drafter in
/// `models/` when it is there, else an untrained one. Skips without the asset or an adapter.
#[test]
fn smollm2_greedy_tokens_match_cpu() {
    let Some(b) = crate::open(&WgpuOptions { weight_dtype: WeightDtype::F16, ..Default::default() }, "smollm2_greedy_tokens_match_cpu") else { return };
    let Some(path) = crate::common::asset("smollm2-135m-instruct-q4_1.gguf") else {
        eprintln!("SKIPPED smollm2_greedy_tokens_match_cpu: SmolLM2 asset missing (scripts/fetch-assets smollm2)");
        return;
    };
    let src = sparkling::loader::gguf_source::GgufSource::open(&path).expect("gguf");
    let cfg = TargetConfig::from_gguf(&src.file).expect("config");
    let tok = sparkling::tokenizer::TextTokenizer::from_gguf(&src.file).expect("tokenizer");
    let cpu = CpuBackend::with_weight_dtype(CpuDtype::F16);
    let t_cpu = Target::load(&cpu, &src, cfg.clone(), &|_, _| {}).expect("cpu target");
    let t_gpu = Target::load(&b, &src, cfg.clone(), &|_, _| {}).expect("wgpu target");
    let trained = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/smollm2-135m-dspark-b8");
    let dir = tmpdir("smol-dspark");
    let ddir = if trained.join("config.json").exists() {
        trained
    } else {
        write_drafter(dir.path(), &cfg, DrafterKind::DSpark, 16, 3);
        dir.path().to_path_buf()
    };
    let d_cpu = load_drafter(&cpu, &ddir, &cfg);
    let d_gpu = load_drafter(&b, &ddir, &cfg);
    let prompt = tok.encode_chat("What is the capital of France?", None).unwrap();
    for method in [Method::Ar, Method::Sparkling] {
        let p = params(method, 8, 0.0, 0, 12, tok.stop.clone());
        let a = Engine { backend: &cpu, target: &t_cpu, drafter: Some(&d_cpu) }.generate(&prompt, &p, &mut |_| {}).unwrap();
        let g = Engine { backend: &b, target: &t_gpu, drafter: Some(&d_gpu) }.generate(&prompt, &p, &mut |_| {}).unwrap();
        assert_eq!(g.tokens, a.tokens, "{} on SmolLM2: wgpu vs cpu", method.name());
        assert!(!a.tokens.is_empty());
    }
}

/// Device-side candidate selection end to end (`TreePrep::Device`: wgpu top-k, Markov table
/// and sampling kernels feed the tree builders): every method emits exactly wgpu's own `ar`
/// tokens at T = 0 and, per seed, at T = 0.8 with top-k/top-p filtering.
#[test]
fn device_tree_prep_is_exact_on_wgpu() {
    use sparkling::decode::propose::TreePrep;
    let Some(g) = crate::open(&WgpuOptions::default(), "device_tree_prep_is_exact_on_wgpu") else { return };
    let vocab = 48;
    let cfg = tiny_target_config(sparkling::model::config::Arch::Qwen3, vocab);
    let tdir = tmpdir("wgpu-prep-target");
    write_random_target(tdir.path(), &cfg, 21, StoreDtype::F32).unwrap();
    let gt = load_target(&g, tdir.path());
    let (d1, d2) = (tmpdir("wgpu-prep-dflash"), tmpdir("wgpu-prep-dspark"));
    write_drafter(d1.path(), &cfg, DrafterKind::DFlash, 7, 5);
    write_drafter(d2.path(), &cfg, DrafterKind::DSpark, 16, 6);
    let (gdf, gds) = (load_drafter(&g, d1.path(), &cfg), load_drafter(&g, d2.path(), &cfg));
    let prompt = [3u32, 17, 5, 9, 22, 1];
    let mut taus = Vec::new();
    for (temperature, seed) in [(0.0f32, 0u64), (0.8, 3)] {
        let mut p_ar = params(Method::Ar, 1, temperature, seed, 24, vec![]);
        p_ar.sampling.top_k = 20;
        p_ar.sampling.top_p = 0.9;
        let want = Engine { backend: &g, target: &gt, drafter: None }.generate(&prompt, &p_ar, &mut |_| {}).unwrap().tokens;
        for method in Method::ALL.into_iter().skip(1) {
            let d = if method.drafter_kind() == Some(DrafterKind::DSpark) { &gds } else { &gdf };
            for budget in [4usize, 32] {
                let mut p = params(method, budget, temperature, seed, 24, vec![]);
                p.sampling = p_ar.sampling;
                p.tree.prep = TreePrep::Device;
                let got = Engine { backend: &g, target: &gt, drafter: Some(d) }.generate(&prompt, &p, &mut |_| {}).unwrap();
                assert_eq!(got.tokens, want, "{} budget {budget} T {temperature}: device-prep tokens differ from wgpu ar", method.name());
                if method == Method::Sparkling && budget == 32 {
                    taus.push(got.stats.tau());
                }
            }
        }
    }
    assert!(taus.iter().any(|&t| t > 1.3), "device-prep sparkling never accepted more than the bonus token (τ {taus:?}): compaction untested");
}
