//! Reduced draft vocabulary (issue 12): a drafter whose output layer and Markov `W2` cover V_d
//! of the target's tokens. Every method stays exact (CPU here; the same suite runs on wgpu and
//! CUDA through `common::conformance`), a reduced proposal is the full-vocabulary proposal over
//! logits that give the other tokens no mass, the CPU backend's row gather is bit-exact, and a
//! bad map is a clear error naming the tensor.

mod common;

use common::conformance::{reduced_vocab_methods_match_ar, write_reduced_drafter, Prompts};
use common::*;
use safetensors::tensor::{Dtype, TensorView};
use sparkling::core::{Backend, ReadBack};
use sparkling::cpu::{CpuBackend, WeightDtype};
use sparkling::decode::propose::{propose, DraftLogits, TreeParams, TreePrep, VIRTUAL_LOGIT};
use sparkling::decode::{Engine, Method};
use sparkling::loader::open_source;
use sparkling::model::config::{read_json, Arch, DrafterConfig, DrafterKind};
use sparkling::model::draft_vocab::{DraftVocab, MAP_TENSOR};
use sparkling::model::drafter::Drafter;
use sparkling::tree::{DraftTree, MarkovHead};
use std::path::Path;

#[test]
fn every_method_matches_ar_with_a_reduced_draft_vocabulary_on_cpu() {
    reduced_vocab_methods_match_ar(&CpuBackend::new(), &[1, 8, 32], Prompts::Both);
}

#[test]
fn reduced_drafter_on_a_q4_1_target_gathers_quantized_rows_and_stays_exact() {
    let dir = tmpdir("q41-target");
    let target = random_quant_target(dir.path(), Arch::Llama, 64, 21, "q4_1");
    let b = CpuBackend::with_weight_dtype(WeightDtype::Native);
    let (f, r) = (tmpdir("q41-full"), tmpdir("q41-red"));
    write_reduced_drafter(f.path(), r.path(), &target.cfg, DrafterKind::DSpark, 7, 24, 4);
    let d = load_drafter(&b, r.path(), &target.cfg);
    let head = d.output_head(&b, &target).unwrap();
    assert_eq!(b.weight_kernel(head), b.weight_kernel(target.lm_head()), "the gathered rows keep the target's format");
    let prompt = [5u32, 9, 1, 33];
    let ar = Engine { backend: &b, target: &target, drafter: None }.generate(&prompt, &params(Method::Ar, 1, 0.0, 0, 30, vec![]), &mut |_| {}).unwrap().tokens;
    for method in [Method::DSpark, Method::Sparkling, Method::TreeSpark] {
        let g = Engine { backend: &b, target: &target, drafter: Some(&d) }.generate(&prompt, &params(method, 8, 0.0, 0, 30, vec![]), &mut |_| {}).unwrap();
        assert_eq!(g.tokens, ar, "{}", method.name());
    }
}

#[test]
fn cpu_gather_weight_rows_is_bit_exact() {
    let (n, k) = (50usize, 64usize);
    let data = values(n * k, 7, 1.0);
    let rows = [49u32, 0, 17, 17, 3];
    let x = values(3 * k, 8, 1.0);
    for dtype in [WeightDtype::F32, WeightDtype::F16, WeightDtype::Q8_0] {
        let b = CpuBackend::with_weight_dtype(dtype);
        let w = b.upload_weight(data.clone(), n, k).unwrap();
        let g = b.gather_weight_rows(&w, &rows).unwrap();
        assert_eq!(b.weight_shape(&g), (rows.len(), k));
        let xt = b.upload(&x, 3, k).unwrap();
        let full = b.download(&b.matmul(&xt, &w, None).unwrap()).unwrap();
        let part = b.download(&b.matmul(&xt, &g, None).unwrap()).unwrap();
        for i in 0..3 {
            for (j, &r) in rows.iter().enumerate() {
                assert_eq!(part[i * rows.len() + j].to_bits(), full[i * n + r as usize].to_bits(), "{dtype:?} row {i} col {j}");
            }
        }
        assert!(b.gather_weight_rows(&w, &[50]).is_err());
        assert!(b.gather_weight_rows(&w, &[]).is_err());
    }
}

/// The path set of a tree (root excluded), sorted.
fn paths(t: &DraftTree) -> Vec<Vec<u32>> {
    let mut out: Vec<Vec<u32>> = (1..t.len())
        .map(|mut i| {
            let mut p = Vec::new();
            while i != 0 {
                p.push(t.tokens[i]);
                i = t.parents[i] as usize;
            }
            p.reverse();
            p
        })
        .collect();
    out.sort();
    out
}

/// A reduced proposal equals the full-vocabulary proposal over logits in which every token
/// outside the draft vocabulary gets [`VIRTUAL_LOGIT`] and a zero `W2` row (the semantics the
/// reduced drafter defines), for anchors inside and outside the draft vocabulary, host and
/// device prep.
#[test]
fn reduced_proposal_equals_the_full_vocabulary_proposal_without_the_other_tokens() {
    let b = CpuBackend::new();
    let (vocab, v_d, depth, r) = (90usize, 30usize, 6usize, 4usize);
    let ids: Vec<u32> = (0..v_d as u32).map(|i| (i * 37 + 11) % vocab as u32).collect();
    let map = DraftVocab::from_ids(&ids, vocab).unwrap();
    let logits_d = values(depth * v_d, 1, 4.0);
    let w1 = values(vocab * r, 2, 1.0);
    let w2_d = values(v_d * r, 3, 1.0);
    let w1_d: Vec<f32> = ids.iter().flat_map(|&t| w1[t as usize * r..][..r].to_vec()).collect();
    let head_d = MarkovHead { vocab: v_d, rank: r, w1: w1_d, w2: w2_d.clone() };
    // The same drafter in target ids.
    let mut logits_f = vec![VIRTUAL_LOGIT; depth * vocab];
    let mut w2_f = vec![0.0f32; vocab * r];
    for (d, &t) in ids.iter().enumerate() {
        for row in 0..depth {
            logits_f[row * vocab + t as usize] = logits_d[row * v_d + d];
        }
        w2_f[t as usize * r..][..r].copy_from_slice(&w2_d[d * r..][..r]);
    }
    let head_f = MarkovHead { vocab, rank: r, w1: w1.clone(), w2: w2_f };
    let (ud, uf) = (b.upload(&logits_d, depth, v_d).unwrap(), b.upload(&logits_f, depth, vocab).unwrap());
    let (dw1, dw2) = (b.upload(&head_d.w1, v_d, r).unwrap(), b.upload(&head_d.w2, v_d, r).unwrap());
    let (fw1, fw2) = (b.upload(&head_f.w1, vocab, r).unwrap(), b.upload(&head_f.w2, vocab, r).unwrap());
    let inside = ids[7];
    let outside = (0..vocab as u32).find(|t| map.draft_id(*t).is_none()).unwrap();
    let mut checked = 0;
    for anchor in [inside, outside] {
        for method in [Method::DFlash, Method::DDTree, Method::DSpark, Method::Sparkling, Method::TreeSpark] {
            for prep in [TreePrep::Host, TreePrep::Device] {
                for budget in [1usize, 5, 24] {
                    let p = TreeParams { budget, candidates: 8, max_fanout: 6, treespark_k: 3, prep };
                    let red = DraftLogits {
                        logits: &ud,
                        depth,
                        vocab: v_d,
                        markov: Some(&head_d),
                        markov_dev: Some((&dw1, &dw2)),
                        map: Some(&map),
                        markov_w1_target: Some(&w1),
                    };
                    let full = DraftLogits::<CpuBackend> {
                        logits: &uf,
                        depth,
                        vocab,
                        markov: Some(&head_f),
                        markov_dev: Some((&fw1, &fw2)),
                        map: None,
                        markov_w1_target: None,
                    };
                    let got = pollster::block_on(propose(&b, method, &red, anchor, &p)).unwrap().tree;
                    let want = pollster::block_on(propose(&b, method, &full, anchor, &p)).unwrap().tree;
                    let what = format!("{} {prep:?} budget {budget} anchor {anchor} (in draft vocabulary: {})", method.name(), map.draft_id(anchor).is_some());
                    assert!(got.is_well_formed(), "{what}: malformed");
                    assert_eq!(got.tokens[0], anchor, "{what}: root");
                    assert!(got.tokens[1..].iter().all(|t| map.draft_id(*t).is_some()), "{what}: a token outside the draft vocabulary was drafted");
                    assert_eq!(paths(&got), paths(&want), "{what}: path sets differ");
                    assert!(got.num_nodes() > 0, "{what}: empty tree");
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 60);
}

/// A map tensor to write: dtype, shape, bytes.
type MapTensor = (Dtype, Vec<usize>, Vec<u8>);

/// Rewrite `dir/model.safetensors` with the map tensor replaced by `map`, or removed (`None`).
fn rewrite_map(dir: &Path, map: Option<MapTensor>) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> =
        st.tensors().into_iter().filter(|(n, _)| n != MAP_TENSOR).map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec())).collect();
    if let Some((dt, shape, b)) = map {
        owned.push((MAP_TENSOR.into(), dt, shape, b));
    }
    let views: Vec<(String, TensorView<'_>)> = owned.iter().map(|(n, dt, s, b)| (n.clone(), TensorView::new(*dt, s.clone(), b).unwrap())).collect();
    let out = safetensors::serialize(views, None).unwrap();
    std::fs::write(&path, out).unwrap();
}

fn i64s(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn load_err(dir: &Path, target: &sparkling::model::config::TargetConfig) -> String {
    let (cp, v) = read_json(dir).unwrap();
    let cfg = match DrafterConfig::from_hf_json(&cp, &v) {
        Ok(c) => c,
        Err(e) => return e.to_string(),
    };
    let src = open_source(dir).unwrap();
    match Drafter::load(&CpuBackend::new(), src.as_ref(), cfg, target) {
        Ok(_) => panic!("{}: loaded a bad reduced drafter", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_draft_vocabulary_maps_are_clear_errors_naming_the_tensor() {
    let tdir = tmpdir("bad-map-target");
    let target = random_target(tdir.path(), Arch::Qwen3, 40, 1);
    let cases: Vec<(&str, Option<MapTensor>, &str)> = vec![
        ("out of range", Some((Dtype::I64, vec![4], i64s(&[1, 2, 40, 3]))), "outside the target vocabulary 0..40"),
        ("negative", Some((Dtype::I64, vec![4], i64s(&[1, 2, -3, 3]))), "outside the target vocabulary"),
        ("duplicate", Some((Dtype::I64, vec![4], i64s(&[1, 2, 2, 3]))), "appears twice"),
        ("too short", Some((Dtype::I64, vec![3], i64s(&[1, 2, 3]))), "expected shape [4]"),
        ("2-D", Some((Dtype::I64, vec![2, 2], i64s(&[1, 2, 3, 4]))), "expected shape [4]"),
        ("float", Some((Dtype::F32, vec![4], [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|x| x.to_le_bytes()).collect())), "expected an integer tensor"),
        ("missing", None, "not found"),
    ];
    for kind in [DrafterKind::DSpark, DrafterKind::DFlash] {
        for (what, map, want) in &cases {
            let (f, r) = (tmpdir("bad-map-full"), tmpdir("bad-map"));
            write_reduced_drafter(f.path(), r.path(), &target.cfg, kind, 7, 4, 2);
            rewrite_map(r.path(), map.clone());
            let e = load_err(r.path(), &target.cfg);
            assert!(e.contains(MAP_TENSOR) && e.contains(want), "{kind:?} {what}: {e}");
        }
    }
    // A map without draft_vocab_size, and a draft vocabulary larger than the target's.
    let (f, r) = (tmpdir("bad-map-full"), tmpdir("bad-map"));
    write_reduced_drafter(f.path(), r.path(), &target.cfg, DrafterKind::DSpark, 7, 4, 2);
    let (cp, mut v) = read_json(r.path()).unwrap();
    v.as_object_mut().unwrap().insert("draft_vocab_size".into(), serde_json::json!(41));
    std::fs::write(&cp, v.to_string()).unwrap();
    let e = load_err(r.path(), &target.cfg);
    assert!(e.contains("draft_vocab_size") && e.contains("41"), "{e}");
    v.as_object_mut().unwrap().remove("draft_vocab_size");
    std::fs::write(&cp, v.to_string()).unwrap();
    let e = load_err(r.path(), &target.cfg);
    assert!(e.contains(MAP_TENSOR) && e.contains("no draft_vocab_size"), "{e}");
    // W2 still of the full vocabulary: its shape error names it.
    let (f, r) = (tmpdir("bad-map-full"), tmpdir("bad-map"));
    write_reduced_drafter(f.path(), r.path(), &target.cfg, DrafterKind::DSpark, 7, 4, 2);
    std::fs::copy(f.path().join("model.safetensors"), r.path().join("model.safetensors")).unwrap();
    rewrite_map(r.path(), Some((Dtype::I64, vec![4], i64s(&[1, 2, 3, 4]))));
    let e = load_err(r.path(), &target.cfg);
    assert!(e.contains("markov_w2") && e.contains("[4, 8]"), "{e}");
    // Reducing a reduced drafter is refused.
    let again = tmpdir("bad-map-again");
    let e = sparkling::model::reduce::write_reduced_drafter(r.path(), again.path(), &[1, 2], sparkling::model::synth::StoreDtype::Bf16, &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("already reduced"), "{e}");
}
