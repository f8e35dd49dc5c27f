//! Engine-level conformance of the wgpu backend with the CPU backend (issue 4, design §5), on
//! the random models of the exactness matrix (Llama / Qwen2 / Qwen3 targets, DFlash and DSpark
//! drafters), loaded through the real loaders onto each backend:
//!
//! - Greedy tokens: for every method, the wgpu tokens equal the CPU tokens. Where the two
//!   backends' `ar` runs part, the step is checked for a near-tie (CPU top-2 logit gap below
//!   the logit tolerance); a near-tie is reported explicitly and only the common prefix is
//!   compared, anything else fails. Within each backend every method must equal that
//!   backend's own `ar` exactly (the engine invariant; no tolerance).
//! - Logits of a target forward (causal prefill, then a tree verify with random parents)
//!   agree within `LOGIT_ABS + LOGIT_REL · max|logit|`, f32 and f16 weights; rows whose argmax
//!   differ must be near-ties.
//!
//! Without an adapter the tests skip loudly; `SPARKLING_REQUIRE_GPU=1` makes that a failure.
//! Run: `cargo test --features wgpu --test wgpu_conformance` (on lavapipe:
//! `scripts/install-lavapipe` first).
#![cfg(feature = "wgpu")]

mod common;

use common::conformance::{load_drafter, load_target, logit_tol, top2_gap, write_drafter, LOGIT_ABS, LOGIT_REL};
use common::{params, tmpdir, ARCHS};
use sparkling::core::{AttnMask, Backend, NO_PARENT};
use sparkling::cpu::{CpuBackend, WeightDtype as CpuDtype};
use sparkling::decode::{Engine, Method};
use sparkling::model::config::{DrafterKind, TargetConfig};
use sparkling::model::synth::{tiny_target_config, write_random_target, StoreDtype};
use sparkling::model::target::{LogitRows, Target};
use sparkling::wgpu_backend::{list_adapters, WeightDtype, WgpuBackend, WgpuOptions};
use std::path::Path;

/// The wgpu backend with `dtype` weights, or `None` after a loud skip.
fn gpu(dtype: WeightDtype, test: &str) -> Option<WgpuBackend> {
    match WgpuBackend::with_options(&WgpuOptions { weight_dtype: dtype, ..Default::default() }) {
        Ok(b) => {
            eprintln!("{test}: running on {}", b.name());
            Some(b)
        }
        Err(e) if list_adapters().is_empty() && std::env::var("SPARKLING_REQUIRE_GPU").as_deref() != Ok("1") => {
            eprintln!("SKIPPED {test}: no wgpu adapter ({e}); set SPARKLING_REQUIRE_GPU=1 to make this a failure");
            None
        }
        Err(e) => panic!("{test}: cannot open the wgpu backend: {e}"),
    }
}

#[test]
fn every_method_gives_the_cpu_greedy_tokens_on_wgpu() {
    let Some(g) = gpu(WeightDtype::F32, "every_method_gives_the_cpu_greedy_tokens_on_wgpu") else { return };
    common::conformance::every_method_gives_the_cpu_greedy_tokens(&g, common::conformance::Prompts::Alternate);
}

/// Reduced draft vocabulary (issue 12): every method, host and device tree prep (top-k, Markov
/// table and the device tree over V_d columns, the virtual anchor column), equals wgpu's own
/// `ar` at T = 0 and T = 1.
#[test]
fn every_method_matches_ar_with_a_reduced_draft_vocabulary_on_wgpu() {
    let Some(g) = gpu(WeightDtype::F32, "every_method_matches_ar_with_a_reduced_draft_vocabulary_on_wgpu") else { return };
    common::conformance::reduced_vocab_methods_match_ar(&g, &[1, 32], common::conformance::Prompts::Alternate);
}

#[test]
fn target_logits_match_cpu_within_tolerance() {
    for (gdt, cdt) in [(WeightDtype::F32, CpuDtype::F32), (WeightDtype::F16, CpuDtype::F16)] {
        let Some(g) = gpu(gdt, "target_logits_match_cpu_within_tolerance") else { return };
        let cpu = CpuBackend::with_weight_dtype(cdt);
        for (ai, arch) in ARCHS.into_iter().enumerate() {
            let dir = tmpdir("wgpu-logits");
            let cfg = tiny_target_config(arch, 200);
            write_random_target(dir.path(), &cfg, 40 + ai as u64, StoreDtype::F32).unwrap();
            let (ct, gt) = (load_target(&cpu, dir.path()), load_target(&g, dir.path()));
            let prompt: Vec<u32> = (0..23u32).map(|i| (i * 37 + 5) % 200).collect();
            let pos: Vec<u32> = (0..prompt.len() as u32).collect();
            // A 17-node tree after the prompt: random parents, depths from the parents.
            let mut parents = vec![NO_PARENT];
            let mut depth = vec![0u32];
            for i in 1..17u32 {
                let p = (i * 7 + 3) % i;
                parents.push(p);
                depth.push(depth[p as usize] + 1);
            }
            let tree_ids: Vec<u32> = (0..17u32).map(|i| (i * 13 + 1) % 200).collect();
            let tree_pos: Vec<u32> = depth.iter().map(|d| prompt.len() as u32 + d).collect();
            let results =
                [forward_pair(&cpu, &ct, &prompt, &pos, &tree_ids, &tree_pos, &parents), forward_pair(&g, &gt, &prompt, &pos, &tree_ids, &tree_pos, &parents)];
            let v = cfg.vocab;
            for (part, (c, w)) in
                [("prefill", (&results[0].0, &results[1].0)), ("tree verify", (&results[0].1, &results[1].1)), ("taps", (&results[0].2, &results[1].2))]
            {
                let mut worst = 0.0f32;
                let width = if part == "taps" { c.len() / prompt.len() } else { v };
                for (ri, (cr, wr)) in c.chunks(width).zip(w.chunks(width)).enumerate() {
                    let tol = logit_tol(cr);
                    let err = cr.iter().zip(wr).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                    assert!(err <= tol, "{arch:?} {gdt:?} {part} row {ri}: max |Δ| {err:e} > tolerance {tol:e}");
                    worst = worst.max(err);
                    if part != "taps" {
                        let (ca, wa) = (argmax(cr), argmax(wr));
                        if ca != wa {
                            let gap = top2_gap(cr);
                            assert!(gap < tol, "{arch:?} {part} row {ri}: argmax {ca} vs {wa} with a top-2 gap {gap:e} ≥ tolerance {tol:e}");
                            eprintln!("NEAR-TIE {arch:?} {gdt:?} {part} row {ri}: argmax CPU {ca} vs wgpu {wa}, top-2 gap {gap:e} < {tol:e}");
                        }
                    }
                }
                eprintln!("{arch:?} {gdt:?} {part}: max |Δ logit| = {worst:e} (tolerance {LOGIT_ABS:e} + {LOGIT_REL:e}·max|logit|)");
            }
        }
    }
}

fn argmax(row: &[f32]) -> usize {
    row.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0
}

/// Prefill logits `[P, V]` (all rows), then tree-verify logits `[N, V]`, and the prefill taps.
fn forward_pair<B: Backend>(
    b: &B,
    t: &Target<B>,
    prompt: &[u32],
    pos: &[u32],
    tree_ids: &[u32],
    tree_pos: &[u32],
    parents: &[u32],
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut cache = t.new_cache(b, prompt.len() + tree_ids.len()).unwrap();
    let pre = t.forward(b, &mut cache, prompt, pos, AttnMask::Causal, LogitRows::All, &[0, 2]).unwrap();
    let ver = t.forward(b, &mut cache, tree_ids, tree_pos, AttnMask::Tree { parents }, LogitRows::All, &[]).unwrap();
    (b.download(&pre.logits).unwrap(), b.download(&ver.logits).unwrap(), b.download(pre.taps.as_ref().unwrap()).unwrap())
}

/// SmolLM2-135M-Instruct (real weights, f16 on both backends): `ar` and `sparkling` greedy
/// tokens on wgpu equal the CPU backend's on a chat prompt. Uses the trained DSpark drafter in
/// `models/` when it is there, else an untrained one. Skips without the asset or an adapter.
#[test]
fn smollm2_greedy_tokens_match_cpu() {
    let Some(b) = gpu(WeightDtype::F16, "smollm2_greedy_tokens_match_cpu") else { return };
    let Some(path) = common::asset("smollm2-135m-instruct-q4_1.gguf") else {
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

/// The backend-generic op suite of `tests/common/conformance.rs` (shared with the CUDA backend,
/// issue 5: one suite, every device backend) on wgpu with f32 weights.
#[test]
fn generic_op_suite_on_wgpu() {
    use common::conformance as conf;
    let Some(g) = gpu(WeightDtype::F32, "generic_op_suite_on_wgpu") else { return };
    conf::matmul_matches_cpu(&g, conf::exact, conf::exact);
    conf::rows_do_not_depend_on_the_batch(&g);
    conf::attention_matches_cpu(&g);
    conf::elementwise_and_copies_match_cpu(&g, conf::exact);
    conf::selection_matches_cpu(&g);
}

/// Device-side candidate selection end to end (`TreePrep::Device`: wgpu top-k, Markov table
/// and sampling kernels feed the tree builders): every method emits exactly wgpu's own `ar`
/// tokens at T = 0 and, per seed, at T = 0.8 with top-k/top-p filtering.
#[test]
fn device_tree_prep_is_exact_on_wgpu() {
    use sparkling::decode::propose::TreePrep;
    let Some(g) = gpu(WeightDtype::F32, "device_tree_prep_is_exact_on_wgpu") else { return };
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

#[test]
fn sparkling_tree_on_the_device_matches_the_host_heap() {
    let Some(g) = gpu(WeightDtype::F32, "sparkling_tree_on_the_device_matches_the_host_heap") else { return };
    assert!(common::conformance::sparkling_tree_matches_host_heap(&g), "the wgpu backend must build SparklingTree trees on the device");
}
