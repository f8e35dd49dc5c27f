//! Browser conformance: in headless Chromium, the engine on WebGPU emits, for every
//! method, exactly the greedy tokens of the CPU backend compiled to wasm in the same page, and
//! each method equals its backend's own `ar`. Random tiny models built in memory (the same
//! generator as the native exactness matrix), loaded through the byte loaders the JavaScript
//! API uses.
//!
//! Run with `scripts/web-test` (installs nothing; needs Chromium, chromedriver and
//! wasm-bindgen-cli 0.2.130). `SPARKLING_REQUIRE_WEBGPU` cannot reach a browser, so the
//! WebGPU test fails, rather than skips, when the browser offers no adapter.
#![cfg(target_arch = "wasm32")]

use sparkling::core::{Backend, SampleParams};
use sparkling::cpu::CpuBackend;
use sparkling::decode::budget::AutoBudget;
use sparkling::decode::propose::{TreeParams, TreePrep};
use sparkling::decode::{Engine, GenParams, Method};
use sparkling::loader::safetensors_source::SafetensorsSource;
use sparkling::model::config::{Arch, DrafterConfig, DrafterKind, TargetConfig};
use sparkling::model::drafter::Drafter;
use sparkling::model::synth::{random_drafter_bytes, random_target_bytes, tiny_target_config, DrafterInit, StoreDtype};
use sparkling::model::target::Target;
use sparkling_wgpu::{WgpuBackend, WgpuOptions};
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

struct Models<B: Backend> {
    target: Target<B>,
    dflash: Drafter<B>,
    dspark: Drafter<B>,
}

/// A target's config and weights, and its drafters' (DFlash, DSpark).
type Files = (TargetConfig, Vec<u8>, Vec<(DrafterConfig, Vec<u8>)>);

fn files(arch: Arch, block: usize) -> Files {
    let cfg = tiny_target_config(arch, 48);
    let t = random_target_bytes(&cfg, 21, StoreDtype::F32).unwrap();
    let ds = [(DrafterKind::DFlash, 0usize, 5u64), (DrafterKind::DSpark, 8, 6)]
        .into_iter()
        .map(|(kind, rank, seed)| {
            let init = DrafterInit {
                kind,
                layers: 1,
                block_size: block,
                markov_rank: rank,
                taps: 2,
                mask_token_id: None,
                confidence_head: kind == DrafterKind::DSpark,
            };
            random_drafter_bytes(&cfg, &init, seed, StoreDtype::Bf16).unwrap()
        })
        .collect();
    (cfg, t, ds)
}

fn load<B: Backend>(b: &B, f: &Files) -> Models<B> {
    let src = SafetensorsSource::from_bytes("target", f.1.clone()).unwrap();
    let target = Target::load(b, &src, f.0.clone(), &|_, _| {}).unwrap();
    let mut d = f.2.iter().map(|(c, bytes)| {
        let s = SafetensorsSource::from_bytes("drafter", bytes.clone()).unwrap();
        Drafter::load(b, &s, c.clone(), &f.0).unwrap()
    });
    let (dflash, dspark) = (d.next().unwrap(), d.next().unwrap());
    Models { target, dflash, dspark }
}

/// Budget 0 stands for `auto` (with N_max 16).
fn params(method: Method, budget: usize, prep: TreePrep) -> GenParams {
    GenParams {
        method,
        tree: TreeParams { budget: if budget == 0 { 16 } else { budget }, candidates: 16, max_fanout: 64, treespark_k: 4, prep },
        sampling: SampleParams { temperature: 0.0, top_k: 0, top_p: 1.0 },
        seed: 0,
        max_new_tokens: 20,
        stop: vec![],
        auto_budget: (budget == 0).then(AutoBudget::default),
        lookup: sparkling::decode::LookupGraft::OFF,
    }
}

async fn run<B: Backend>(b: &B, m: &Models<B>, method: Method, budget: usize, prompt: &[u32]) -> Vec<u32> {
    let drafter = match method.drafter_kind() {
        None => None,
        Some(DrafterKind::DFlash) => Some(&m.dflash),
        Some(DrafterKind::DSpark) => Some(&m.dspark),
    };
    let e = Engine { backend: b, target: &m.target, drafter };
    e.generate_async(prompt, &params(method, budget, TreePrep::Auto), &mut |_| {}).await.unwrap().tokens
}

#[wasm_bindgen_test]
async fn every_method_on_webgpu_gives_the_cpu_greedy_tokens() {
    let gpu = WgpuBackend::with_options_async(&WgpuOptions::default())
        .await
        .unwrap_or_else(|e| panic!("no WebGPU adapter in this browser (Chromium needs --enable-unsafe-webgpu): {e}"));
    let info = gpu.adapter_info().clone();
    assert_eq!(format!("{:?}", info.backend), "BrowserWebGpu", "the adapter must be the browser's WebGPU, got {info:?}");
    web_sys::console::log_1(&format!("WebGPU adapter: {}", gpu.name()).into());
    let cpu = CpuBackend::new();
    let prompt: &[u32] = &[3, 17, 5, 9, 22, 1];
    let mut compared = 0;
    for arch in [Arch::Llama, Arch::Qwen3] {
        let f = files(arch, 7);
        let (gm, cm) = (load(&gpu, &f), load(&cpu, &f));
        let c_ar = run(&cpu, &cm, Method::Ar, 1, prompt).await;
        let g_ar = run(&gpu, &gm, Method::Ar, 1, prompt).await;
        assert_eq!(c_ar.len(), 20);
        // Random tiny models have no near-ties at this size with these seeds (the native
        // conformance suite reports them when they occur); the two backends' ar must agree.
        assert_eq!(g_ar, c_ar, "{arch:?}: WebGPU ar vs CPU ar");
        for method in Method::ALL.into_iter().skip(1) {
            // `--budget auto` (0) once: its cost curve is measured through async read-backs,
            // the only kind a browser allows (a blocking one failed every auto run on WebGPU).
            let auto = arch == Arch::Llama && method == Method::Sparkling;
            for budget in [1usize, 16, 0].into_iter().filter(|&b| b != 0 || auto) {
                let g = run(&gpu, &gm, method, budget, prompt).await;
                assert_eq!(g, g_ar, "{arch:?} {} budget {budget}: WebGPU tokens differ from ar", method.name());
                let c = run(&cpu, &cm, method, budget, prompt).await;
                assert_eq!(c, c_ar, "{arch:?} {} budget {budget}: CPU-in-wasm tokens differ from ar", method.name());
                compared += 1;
            }
        }
    }
    web_sys::console::log_1(&format!("browser conformance: {compared} generations on WebGPU equal to the CPU tokens").into());
    assert_eq!(compared, 21);
}

#[wasm_bindgen_test]
async fn every_kernel_compiles_in_the_browser() {
    // Chrome's WGSL compiler (Tint) is stricter than naga, which the native tests use: e.g. it
    // rejects the decimal literal of f32::MAX. Compile every variant (all weight dtypes and
    // matmul tiles, the six GGUF block formats included, not only those the tiny models exercise)
    // and surface any rejection.
    let gpu = WgpuBackend::with_options_async(&WgpuOptions::default()).await.unwrap();
    let n = gpu.compile_kernels().unwrap();
    assert!(n >= 42, "only {n} kernels listed");
    // Rejections arrive asynchronously: after a read-back the next op reports them.
    let t = gpu.upload(&[1.0, 2.0], 1, 2).unwrap();
    assert_eq!(gpu.download_async(&t).await.unwrap(), vec![1.0, 2.0]);
    gpu.upload(&[0.0], 1, 1).map(|_| ()).unwrap_or_else(|e| panic!("a kernel failed to compile in the browser: {e}"));
    web_sys::console::log_1(&format!("{n} kernels compiled on {}", gpu.name()).into());
}

#[wasm_bindgen_test]
async fn webgpu_reads_back_with_awaits_not_blocking() {
    // A blocking read-back cannot work in a browser, so the browser build has none
    // (`sparkling_core::ReadBack` is native only); the asynchronous one returns the data.
    let gpu = WgpuBackend::with_options_async(&WgpuOptions::default()).await.unwrap();
    let t = gpu.upload(&[1.0, -2.0, 3.5, 0.25], 2, 2).unwrap();
    assert_eq!(gpu.download_async(&t).await.unwrap(), vec![1.0, -2.0, 3.5, 0.25]);
    assert_eq!(gpu.argmax_async(&t).await.unwrap(), vec![0, 0]);
}
