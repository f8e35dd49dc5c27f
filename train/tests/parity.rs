//! Two implementations, one answer: the engine's drafter forward
//! (`sparkling::model::drafter::Drafter::draft`, CPU backend, f32) and the trainer's candle
//! forward (`CandleDrafter::draft_logits`) give the same block logits on the same checkpoint,
//! context and anchor; the Markov bias of both agrees too, and so does the DSpark confidence
//! head (the engine's path product vs the trainer's `confidence_logits`, the BCE's input).
//!
//! Tolerance: both run in f32 from identical weights but sum in different orders (the engine's
//! fixed-order SIMD dot products vs candle's gemm), so logits differ by rounding only. We require
//! `max |Δ| ≤ 1e-4 · max(1, max |logit|)` on the tiny random checkpoints and the same bound on
//! the committed SmolLM2 drafters (measured: ~1e-6 relative on the random checkpoints). An indexing or convention error (shifted vs in-place slots, RoPE layout, context
//! visibility) shows up as O(1) differences.
//!
//! The random checkpoints are written by the trainer's own exporter (f32) and loaded with the
//! engine's loader, so the test also covers the export path. The committed drafters under
//! `../models/` are checked when they and the SmolLM2 asset are present (skipped otherwise, or
//! failing under `SPARKLING_REQUIRE_ASSETS=1`).

use candle_core::{Device, Tensor};
use sparkling::core::{AttnMask, Backend, DraftTree, ReadBack};
use sparkling::cpu::{CpuBackend, WeightDtype};
use sparkling::loader::open_source;
use sparkling::model::config::{read_json, Arch, DrafterConfig, DrafterKind, TargetConfig};
use sparkling::model::draft_vocab::DraftVocab;
use sparkling::model::drafter::{DraftJob, Drafter};
use sparkling::model::synth::{drafter_config, tiny_target_config, write_random_target, DrafterInit, StoreDtype};
use sparkling::model::target::{LogitRows, SeqInput, Target};
use sparkling_train::export::{verify_with_engine, write_hf, Export, ExportDtype};
use sparkling_train::gen::load_lm_head;
use sparkling_train::model::{BlockInput, CandleDrafter, Params};
use sparkling_train::rng::Rng;
use std::path::{Path, PathBuf};

fn max_abs(a: &[f32]) -> f32 {
    a.iter().fold(0f32, |m, x| m.max(x.abs()))
}

fn assert_close(engine: &[f32], candle: &[f32], what: &str) -> f32 {
    assert_eq!(engine.len(), candle.len(), "{what}: lengths");
    let diff = engine.iter().zip(candle).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    let tol = 1e-4 * max_abs(engine).max(1.0);
    eprintln!("{what}: max |Δ| = {diff:.3e} (tolerance {tol:.3e}, max |logit| {:.2})", max_abs(engine));
    assert!(diff <= tol, "{what}: engine and trainer logits differ by {diff} > {tol}");
    diff
}

/// Engine taps of `tokens` (causal forward from position 0).
fn engine_taps(b: &CpuBackend, target: &Target<CpuBackend>, tokens: &[u32], taps: &[usize]) -> Vec<f32> {
    let mut cache = target.new_cache(b, tokens.len()).unwrap();
    let pos: Vec<u32> = (0..tokens.len() as u32).collect();
    let out = target.forward(b, &mut cache, SeqInput { ids: tokens, positions: &pos, mask: AttnMask::Causal, logits: Some(LogitRows::Last) }, taps).unwrap();
    b.download(&out.taps.unwrap()).unwrap()
}

/// Compare engine and candle block logits at several anchors of one sequence, including an
/// engine draft cache filled over two calls.
fn compare(b: &CpuBackend, target: &Target<CpuBackend>, d: &Drafter<CpuBackend>, cd: &CandleDrafter, tokens: &[u32], anchors: &[usize], tag: &str) {
    let nf = d.cfg.target_layer_ids.len() * target.cfg.hidden;
    let taps = engine_taps(b, target, tokens, &d.cfg.target_layer_ids);
    let depth = d.cfg.draft_depth();
    // Logit columns: draft ids (V_d = V for a full-vocabulary drafter).
    let v = d.cfg.draft_vocab;
    // Candle: all anchors in one batched call.
    let lc = *anchors.iter().max().unwrap();
    let ctx = Tensor::from_vec(taps[..lc * nf].to_vec(), (lc, nf), &Device::Cpu).unwrap();
    let inp = BlockInput { ctx, anchors: anchors.to_vec(), anchor_ids: anchors.iter().map(|&s| tokens[s]).collect() };
    let cl: Vec<f32> = cd.draft_logits(&inp).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(cl.len(), anchors.len() * depth * v);
    for (a, &s) in anchors.iter().enumerate() {
        // Engine: fresh draft cache, whole context in one call.
        let mut dc = d.new_cache(b, s + d.cfg.block_size).unwrap();
        let ctx = b.upload(&taps[..s * nf], s, nf).unwrap();
        let el = b
            .download(&d.draft(b, target, DraftJob { cache: &mut dc, taps: &ctx, anchor: tokens[s], root_pos: s, depth: d.cfg.draft_depth() }).unwrap())
            .unwrap();
        assert_close(&el, &cl[a * depth * v..(a + 1) * depth * v], &format!("{tag} anchor {s}"));
        // Engine: the context arrives over two calls (as in decoding); the second call's logits
        // must match the candle forward over the whole context.
        if s >= 3 {
            let s1 = s / 2;
            let mut dc = d.new_cache(b, s + d.cfg.block_size).unwrap();
            let c1 = b.upload(&taps[..s1 * nf], s1, nf).unwrap();
            d.draft(b, target, DraftJob { cache: &mut dc, taps: &c1, anchor: tokens[s1], root_pos: s1, depth: d.cfg.draft_depth() }).unwrap();
            let c2 = b.upload(&taps[s1 * nf..s * nf], s - s1, nf).unwrap();
            let el2 = b
                .download(&d.draft(b, target, DraftJob { cache: &mut dc, taps: &c2, anchor: tokens[s], root_pos: s, depth: d.cfg.draft_depth() }).unwrap())
                .unwrap();
            assert_close(&el2, &cl[a * depth * v..(a + 1) * depth * v], &format!("{tag} anchor {s} (two calls)"));
        }
    }
    // Confidence head (DSpark): along the target's own continuation at the first anchor, the
    // engine's path product must grow by the trainer's `sigmoid(w·[h_k ; W1[t_{k-1}]] + b)` of
    // each slot (`train/src/train.rs`, the BCE's input).
    if let Some(head) = &d.confidence {
        let s = anchors[0];
        let mut dc = d.new_cache(b, s + d.cfg.block_size).unwrap();
        let ctx = b.upload(&taps[..s * nf], s, nf).unwrap();
        let (_, hid) = d.draft_rows(b, target, DraftJob { cache: &mut dc, taps: &ctx, anchor: tokens[s], root_pos: s, depth }).unwrap();
        let slot = head.slot_terms(&b.download(&hid).unwrap(), d.cfg.hidden).unwrap();
        let n = depth.min(tokens.len() - 1 - s);
        let chain = DraftTree::chain(tokens[s], &tokens[s + 1..s + 1 + n]);
        let c = head.path_confidence(&chain, &slot, d.cfg.hidden, |t| d.markov_row(t));
        let h = cd.backbone(&inp).unwrap();
        for k in 0..n {
            let hk = h.narrow(0, k, 1).unwrap();
            let e = cd.markov_bias(&[tokens[s + k]]).unwrap().map(|(_, e)| e);
            let x = cd.confidence_logits(&hk, e.as_ref()).unwrap().to_vec1::<f32>().unwrap()[0] as f64;
            let want = 1.0 / (1.0 + (-x).exp());
            let got = c[k + 1] / c[k];
            assert!((got - want).abs() < 1e-4, "{tag} confidence of slot {k}: engine {got} vs trainer {want}");
        }
        eprintln!("{tag} confidence head: {n} slots agree");
    }
    // Markov bias: engine host head vs the trainer's candle bias. The trainer conditions on
    // target ids, the engine's host head (reduced: `W1[draft_to_target]`) on draft ids.
    let prev: Vec<u32> = match &cd.draft_vocab {
        Some(dv) => vec![dv.draft_to_target()[3], dv.draft_to_target()[0]],
        None => vec![tokens[1], tokens[2]],
    };
    if let (Some(mh), Some((bias, _))) = (d.markov.as_ref(), cd.markov_bias(&prev).unwrap()) {
        let cb: Vec<f32> = bias.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(cb.len(), prev.len() * v);
        for (i, &t) in prev.iter().enumerate() {
            let mut eb = vec![0f32; v];
            mh.bias(cd.draft_vocab.as_ref().map_or(t, |dv| dv.draft_id(t).unwrap()), &mut eb);
            assert_close(&eb, &cb[i * v..(i + 1) * v], &format!("{tag} Markov bias"));
        }
    }
}

/// Randomise parameters at a scale where every path (attention, MLP, context) matters.
fn randomise(p: &Params, seed: u64) {
    for (i, (name, var)) in p.vars.iter().enumerate() {
        let mut r = Rng::new(seed, i as u64);
        let n = var.elem_count();
        let data: Vec<f32> = if name.ends_with("norm.weight") {
            (0..n).map(|_| 1.0 + 0.2 * r.normal()).collect()
        } else {
            let fan_in = *var.dims().last().unwrap() as f32;
            (0..n).map(|_| r.normal() / fan_in.sqrt()).collect()
        };
        var.set(&Tensor::from_vec(data, var.shape(), &Device::Cpu).unwrap()).unwrap();
    }
}

#[test]
fn engine_and_trainer_agree_on_random_checkpoints() {
    let b = CpuBackend::new();
    // (arch, kind, seed, reduced draft vocabulary V_d)
    for (arch, kind, seed, reduced) in [
        (Arch::Llama, DrafterKind::DSpark, 1u64, None),
        (Arch::Qwen3, DrafterKind::DFlash, 2, None),
        (Arch::Llama, DrafterKind::DFlash, 3, None),
        (Arch::Llama, DrafterKind::DSpark, 4, Some(40)),
        (Arch::Qwen3, DrafterKind::DFlash, 5, Some(33)),
    ] {
        let tdir = tempfile::tempdir().unwrap();
        let tcfg = tiny_target_config(arch, 96);
        write_random_target(tdir.path(), &tcfg, seed, StoreDtype::F32).unwrap();
        let (cp, v) = read_json(tdir.path()).unwrap();
        let tcfg = TargetConfig::from_hf_json(&cp, &v).unwrap();
        let src = open_source(tdir.path()).unwrap();
        let target = Target::load(&b, src.as_ref(), tcfg.clone(), &|_, _| {}).unwrap();
        let init = DrafterInit { kind, layers: 2, block_size: 6, markov_rank: 8, taps: 2, mask_token_id: None, confidence_head: kind == DrafterKind::DSpark };
        let mut dcfg = drafter_config(&tcfg, &init);
        // A reduced draft vocabulary: V_d distinct target ids in a scrambled order (draft id i is
        // target id d2t[i]), so a row or column mix-up between draft and target ids shows.
        let draft_vocab = reduced.map(|vd| {
            let mut ids: Vec<u32> = (0..tcfg.vocab as u32).collect();
            Rng::new(seed, 7).shuffle(&mut ids);
            ids.truncate(vd);
            dcfg.draft_vocab = vd;
            dcfg.reduced = true;
            DraftVocab::from_ids(&ids, tcfg.vocab).unwrap()
        });
        let nf = dcfg.target_layer_ids.len() * tcfg.hidden;
        let params = Params::init(&dcfg, nf, seed, None).unwrap();
        randomise(&params, seed);
        let ddir = tempfile::tempdir().unwrap();
        write_hf(
            ddir.path(),
            Export { cfg: &dcfg, num_target_layers: tcfg.layers, n_feat: nf, params: &params, draft_vocab: draft_vocab.as_ref(), dtype: ExportDtype::F32 },
            None,
            None,
        )
        .unwrap();
        let loaded_cfg = verify_with_engine(ddir.path(), &tcfg).unwrap();
        assert_eq!(loaded_cfg, dcfg);
        let d = Drafter::load(&b, open_source(ddir.path()).unwrap().as_ref(), loaded_cfg, &tcfg).unwrap();
        let (head, _) = load_lm_head(tdir.path()).unwrap();
        let e = Tensor::from_vec(head, (tcfg.vocab, tcfg.hidden), &Device::Cpu).unwrap();
        let embed = if tcfg.tie_embeddings {
            e.clone()
        } else {
            let t = open_source(tdir.path()).unwrap().load("model.embed_tokens.weight").unwrap();
            Tensor::from_vec(t.data, (tcfg.vocab, tcfg.hidden), &Device::Cpu).unwrap()
        };
        let lm_head = match &draft_vocab {
            Some(dv) => e.index_select(&Tensor::from_vec(dv.draft_to_target().to_vec(), dv.len(), &Device::Cpu).unwrap(), 0).unwrap(),
            None => e,
        };
        let cd = CandleDrafter { cfg: dcfg.clone(), params, embed, lm_head, draft_vocab, ctx_scale: None };
        let mut r = Rng::new(seed, 99);
        let tokens: Vec<u32> = (0..20).map(|_| r.below(tcfg.vocab - 1) as u32).collect();
        compare(&b, &target, &d, &cd, &tokens, &[1, 5, 11, 19], &format!("{arch:?}/{kind:?}/V_d {reduced:?}"));
    }
}

/// A reduced drafter without its map (or with a map of the wrong size) is refused by the
/// exporter with an error naming the draft vocabulary.
#[test]
fn export_refuses_a_reduced_drafter_without_its_map() {
    let tcfg = tiny_target_config(Arch::Llama, 64);
    let init = DrafterInit { kind: DrafterKind::DSpark, layers: 1, block_size: 4, markov_rank: 4, taps: 2, mask_token_id: None, confidence_head: false };
    let mut dcfg = drafter_config(&tcfg, &init);
    dcfg.draft_vocab = 10;
    dcfg.reduced = true;
    let nf = dcfg.target_layer_ids.len() * tcfg.hidden;
    let params = Params::init(&dcfg, nf, 1, None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("d");
    let e = write_hf(
        &out,
        Export { cfg: &dcfg, num_target_layers: tcfg.layers, n_feat: nf, params: &params, draft_vocab: None, dtype: ExportDtype::F32 },
        None,
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("draft vocabulary") && e.contains("no draft_to_target map"), "{e}");
    let nine = DraftVocab::from_ids(&(0..9).collect::<Vec<u32>>(), tcfg.vocab).unwrap();
    let e = write_hf(
        &out,
        Export { cfg: &dcfg, num_target_layers: tcfg.layers, n_feat: nf, params: &params, draft_vocab: Some(&nine), dtype: ExportDtype::F32 },
        None,
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("a map of 9 ids") && e.contains("draft_vocab_size 10"), "{e}");
    assert!(!out.exists(), "nothing is written on error");
}

/// The training-time context preconditioner folds exactly into `fc.weight` at export: the
/// trainer's forward with `ctx_scale = s` equals its forward on the folded checkpoint.
#[test]
fn preconditioner_folds_into_fc() {
    let tcfg = tiny_target_config(Arch::Llama, 64);
    let init = DrafterInit { kind: DrafterKind::DSpark, layers: 1, block_size: 4, markov_rank: 4, taps: 2, mask_token_id: None, confidence_head: true };
    let dcfg = drafter_config(&tcfg, &init);
    let nf = dcfg.target_layer_ids.len() * tcfg.hidden;
    let params = Params::init(&dcfg, nf, 5, None).unwrap();
    randomise(&params, 5);
    let mut r = Rng::new(5, 1);
    let e = Tensor::from_vec((0..tcfg.vocab * tcfg.hidden).map(|_| r.normal()).collect::<Vec<f32>>(), (tcfg.vocab, tcfg.hidden), &Device::Cpu).unwrap();
    let scale: Vec<f32> = (0..nf).map(|i| if i % 17 == 0 { 1e-3 } else { 0.5 + r.uniform() as f32 }).collect();
    let ctx: Vec<f32> = (0..7 * nf).map(|i| r.normal() * if i % 17 == 0 { 1000.0 } else { 1.0 }).collect();
    let inp = || BlockInput { ctx: Tensor::from_vec(ctx.clone(), (7, nf), &Device::Cpu).unwrap(), anchors: vec![3, 7], anchor_ids: vec![5, 9] };
    let st = Tensor::from_vec(scale, nf, &Device::Cpu).unwrap();
    let with_scale = CandleDrafter { cfg: dcfg.clone(), params, embed: e.clone(), lm_head: e.clone(), draft_vocab: None, ctx_scale: Some(st.clone()) };
    let a: Vec<f32> = with_scale.draft_logits(&inp()).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    sparkling_train::checkpoint::fold_ctx_scale(&with_scale.params, &st).unwrap();
    let folded = CandleDrafter { ctx_scale: None, ..with_scale };
    let b: Vec<f32> = folded.draft_logits(&inp()).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    assert_close(&a, &b, "folded preconditioner");
}

fn models_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("models")
}

#[test]
fn engine_and_trainer_agree_on_committed_smollm2_drafters() {
    let asset = sparkling::assets::path(sparkling::assets::DEFAULT_TARGET);
    let dirs: Vec<PathBuf> =
        ["smollm2-135m-dspark-b8", "smollm2-135m-dflash-b8"].iter().map(|n| models_dir().join(n)).filter(|p| p.join("config.json").exists()).collect();
    if !asset.exists() || dirs.is_empty() {
        if std::env::var("SPARKLING_REQUIRE_ASSETS").is_ok_and(|v| v == "1") && !asset.exists() {
            panic!("asset {} missing (run scripts/fetch-assets smollm2)", asset.display());
        }
        eprintln!("SKIPPED: SmolLM2 asset or committed drafters not present");
        return;
    }
    let g = sparkling::loader::gguf_source::GgufSource::open(&asset).unwrap();
    let tcfg = TargetConfig::from_gguf(&g.file).unwrap();
    let b = CpuBackend::with_weight_dtype(WeightDtype::F32);
    let target = Target::load(&b, &g, tcfg.clone(), &|_, _| {}).unwrap();
    let tok = sparkling::tokenizer::TextTokenizer::from_gguf(&g.file).unwrap();
    let (head, _) = load_lm_head(&asset).unwrap();
    let e = Tensor::from_vec(head, (tcfg.vocab, tcfg.hidden), &Device::Cpu).unwrap();
    let mut tokens = tok.encode_chat("Tom has 3 apples and buys 5 more. How many apples does he have?", None).unwrap();
    tokens.extend(tok.encode_raw("Tom starts with 3 apples. He buys 5 more, so 3 + 5 = 8.").unwrap());
    let n = tokens.len();
    for dir in dirs {
        let (cp, v) = read_json(&dir).unwrap();
        let dcfg = DrafterConfig::from_hf_json(&cp, &v).unwrap();
        let d = Drafter::load(&b, open_source(&dir).unwrap().as_ref(), dcfg.clone(), &tcfg).unwrap();
        let nf = dcfg.target_layer_ids.len() * tcfg.hidden;
        let st = candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap();
        let params = Params::from_tensors(&dcfg, nf, st.into_iter().collect(), &dir.display().to_string()).unwrap();
        // A reduced drafter: the trainer's output layer is the target lm_head's rows of its map.
        let draft_vocab = d.vocab_map.clone();
        let lm_head = match &draft_vocab {
            Some(dv) => e.index_select(&Tensor::from_vec(dv.draft_to_target().to_vec(), dv.len(), &Device::Cpu).unwrap(), 0).unwrap(),
            None => e.clone(),
        };
        let cd = CandleDrafter { cfg: dcfg, params, embed: e.clone(), lm_head, draft_vocab, ctx_scale: None };
        compare(&b, &target, &d, &cd, &tokens, &[n - 12, n - 2], &dir.file_name().unwrap().to_string_lossy());
    }
}

/// `--init-from`: every parameter starts at the exported drafter's value; `fc` is unfolded by
/// this run's preconditioner; Markov `W2` rows follow their target id into another draft
/// vocabulary (rows it lacks start at 0); a drafter of another shape is refused naming what
/// differs.
#[test]
fn init_from_a_drafter_copies_it_and_matches_markov_rows_by_target_id() {
    let tcfg = tiny_target_config(Arch::Llama, 64);
    let init = DrafterInit { kind: DrafterKind::DSpark, layers: 1, block_size: 4, markov_rank: 4, taps: 2, mask_token_id: None, confidence_head: true };
    let base = drafter_config(&tcfg, &init);
    let nf = base.target_layer_ids.len() * tcfg.hidden;
    let reduced = |ids: &[u32]| {
        let mut c = base.clone();
        c.draft_vocab = ids.len();
        c.reduced = true;
        (c, DraftVocab::from_ids(ids, tcfg.vocab).unwrap())
    };
    let (src_cfg, src_dv) = reduced(&[5, 9, 2, 7, 11]);
    let src = Params::init(&src_cfg, nf, 1, None).unwrap();
    randomise(&src, 1);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("drafter");
    write_hf(
        &ckpt,
        Export { cfg: &src_cfg, num_target_layers: tcfg.layers, n_feat: nf, params: &src, draft_vocab: Some(&src_dv), dtype: ExportDtype::F32 },
        None,
        None,
    )
    .unwrap();

    // Another draft vocabulary, block size and seed: target ids 9 and 5 are shared, 3 is new.
    let (mut cfg, dv) = reduced(&[9, 3, 5]);
    cfg.block_size = 8;
    let p = Params::init(&cfg, nf, 2, None).unwrap();
    let scale: Vec<f32> = (0..nf).map(|i| 0.25 + (i % 7) as f32 * 0.5).collect();
    let said = sparkling_train::warm_start::from_drafter(&p, &ckpt, &cfg, nf, &scale, Some(&dv)).unwrap();
    assert!(said.contains("2 of 3 draft ids"), "{said}");
    let v = |p: &Params, n: &str| -> Vec<f32> { p.get(n).unwrap().flatten_all().unwrap().to_vec1().unwrap() };
    for n in ["layers.0.self_attn.q_proj.weight", "layers.0.mlp.down_proj.weight", "markov_head.markov_w1.weight", "confidence_head.proj.weight", "norm.weight"]
    {
        assert_eq!(v(&p, n), v(&src, n), "{n}");
    }
    let (fc, src_fc) = (v(&p, "fc.weight"), v(&src, "fc.weight"));
    for (i, (a, b)) in fc.iter().zip(&src_fc).enumerate() {
        assert_eq!(*a, b / scale[i % nf], "fc[{i}] = exported / scale");
    }
    let (w2, src_w2) = (v(&p, "markov_head.markov_w2.weight"), v(&src, "markov_head.markov_w2.weight"));
    assert!(src_w2.iter().any(|&x| x != 0.0));
    assert_eq!(&w2[0..4], &src_w2[4..8], "target id 9: their draft id 1");
    assert_eq!(&w2[4..8], &[0.0; 4], "target id 3: not in their vocabulary");
    assert_eq!(&w2[8..12], &src_w2[0..4], "target id 5: their draft id 0");

    // Refused: another Markov rank, kind or layer count, naming the setting.
    for (bad, what) in [
        (DrafterInit { markov_rank: 8, ..init.clone() }, "Markov rank 4"),
        (DrafterInit { layers: 2, ..init.clone() }, "layers 1"),
        (DrafterInit { confidence_head: false, ..init.clone() }, "confidence head"),
    ] {
        let c = drafter_config(&tcfg, &bad);
        let q = Params::init(&c, nf, 3, None).unwrap();
        let e = sparkling_train::warm_start::from_drafter(&q, &ckpt, &c, nf, &scale, None).unwrap_err().to_string();
        assert!(e.contains("--init-from") && e.contains(what), "{what}: {e}");
    }
    let c = drafter_config(&tcfg, &DrafterInit { kind: DrafterKind::DFlash, markov_rank: 0, confidence_head: false, ..init.clone() });
    let q = Params::init(&c, nf, 3, None).unwrap();
    let e = sparkling_train::warm_start::from_drafter(&q, &ckpt, &c, nf, &scale, None).unwrap_err().to_string();
    assert!(e.contains("--init-from") && (e.contains("DSpark") || e.contains("Markov rank")), "{e}");
}

/// `--init-from` with a full-vocabulary checkpoint (no `draft_to_target`: draft id = target
/// id), the kind check on its own (a DFlash checkpoint into a DSpark run of the same rank 0),
/// and checkpoints that are refused: a map with an id outside the vocabulary or an id twice, a
/// tensor this run's drafter lacks. Errors name the tensor and the id.
#[test]
fn init_from_a_full_vocabulary_drafter_and_refused_checkpoints() {
    let tcfg = tiny_target_config(Arch::Llama, 64);
    let init = DrafterInit { kind: DrafterKind::DSpark, layers: 1, block_size: 4, markov_rank: 4, taps: 2, mask_token_id: None, confidence_head: false };
    let full = drafter_config(&tcfg, &init);
    let nf = full.target_layer_ids.len() * tcfg.hidden;
    let src = Params::init(&full, nf, 1, None).unwrap();
    randomise(&src, 5);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("full");
    write_hf(&ckpt, Export { cfg: &full, num_target_layers: tcfg.layers, n_feat: nf, params: &src, draft_vocab: None, dtype: ExportDtype::F32 }, None, None)
        .unwrap();
    let scale = vec![1.0f32; nf];
    let w2 = |p: &Params| -> Vec<f32> { p.get("markov_head.markov_w2.weight").unwrap().flatten_all().unwrap().to_vec1().unwrap() };

    // Into a reduced run: every row is found, at its target id.
    let mut cfg = full.clone();
    cfg.draft_vocab = 3;
    cfg.reduced = true;
    let dv = DraftVocab::from_ids(&[9, 3, 5], tcfg.vocab).unwrap();
    let p = Params::init(&cfg, nf, 2, None).unwrap();
    let said = sparkling_train::warm_start::from_drafter(&p, &ckpt, &cfg, nf, &scale, Some(&dv)).unwrap();
    assert!(said.contains("3 of 3 draft ids"), "{said}");
    let (ours, theirs) = (w2(&p), w2(&src));
    for (d, t) in [9usize, 3, 5].into_iter().enumerate() {
        assert_eq!(&ours[d * 4..d * 4 + 4], &theirs[t * 4..t * 4 + 4], "draft id {d} = target id {t}");
    }
    // Into a full run: the identity.
    let q = Params::init(&full, nf, 3, None).unwrap();
    sparkling_train::warm_start::from_drafter(&q, &ckpt, &full, nf, &scale, None).unwrap();
    assert_eq!(w2(&q), theirs);

    // The kind alone differs: a DFlash checkpoint (rank 0) into a DSpark run of rank 0.
    let dflash = drafter_config(&tcfg, &DrafterInit { kind: DrafterKind::DFlash, markov_rank: 0, ..init.clone() });
    let fl = Params::init(&dflash, nf, 4, None).unwrap();
    let fl_dir = dir.path().join("dflash");
    write_hf(&fl_dir, Export { cfg: &dflash, num_target_layers: tcfg.layers, n_feat: nf, params: &fl, draft_vocab: None, dtype: ExportDtype::F32 }, None, None)
        .unwrap();
    let mut rank0 = drafter_config(&tcfg, &DrafterInit { markov_rank: 0, ..init.clone() });
    rank0.mask_token_id = dflash.mask_token_id;
    assert_eq!((rank0.kind, rank0.markov_rank), (DrafterKind::DSpark, 0));
    let e = sparkling_train::warm_start::check_drafter(&fl_dir, &rank0).unwrap_err().to_string();
    assert!(e.contains("--init-from") && e.contains("DFlash") && e.contains("--kind"), "{e}");

    // Tampered checkpoints: the same config, another model.safetensors.
    let reduced_dir = dir.path().join("reduced");
    let rsrc = Params::init(&cfg, nf, 6, None).unwrap();
    randomise(&rsrc, 6);
    let tamper = |name: &str, edit: &dyn Fn(&mut std::collections::HashMap<String, Tensor>)| -> String {
        write_hf(
            &reduced_dir,
            Export { cfg: &cfg, num_target_layers: tcfg.layers, n_feat: nf, params: &rsrc, draft_vocab: Some(&dv), dtype: ExportDtype::F32 },
            None,
            None,
        )
        .unwrap();
        let st = reduced_dir.join("model.safetensors");
        let mut all = candle_core::safetensors::load(&st, &Device::Cpu).unwrap();
        edit(&mut all);
        candle_core::safetensors::save(&all, &st).unwrap();
        let q = Params::init(&cfg, nf, 7, None).unwrap();
        let e = sparkling_train::warm_start::from_drafter(&q, &reduced_dir, &cfg, nf, &scale, Some(&dv)).unwrap_err().to_string();
        assert!(e.contains("model.safetensors"), "{name}: {e}");
        e
    };
    let map = sparkling::model::draft_vocab::MAP_TENSOR;
    let ids = |v: Vec<i64>| Tensor::from_vec(v, 3, &Device::Cpu).unwrap();
    let e = tamper("out of range", &|all| {
        all.insert(map.to_string(), ids(vec![9, 3, tcfg.vocab as i64]));
    });
    assert!(e.contains("draft_to_target") && e.contains(&format!("entry 2 is target id {}", tcfg.vocab)) && e.contains("outside"), "{e}");
    let e = tamper("negative", &|all| {
        all.insert(map.to_string(), ids(vec![9, -1, 5]));
    });
    assert!(e.contains("target id -1") && e.contains("outside"), "{e}");
    let e = tamper("duplicate", &|all| {
        all.insert(map.to_string(), ids(vec![9, 3, 9]));
    });
    assert!(e.contains("target id 9 appears twice") && e.contains("entries 0 and 2"), "{e}");
    let e = tamper("left over", &|all| {
        all.insert("extra.weight".to_string(), Tensor::zeros(4, candle_core::DType::F32, &Device::Cpu).unwrap());
    });
    assert!(e.contains("extra.weight") && e.contains("not parameters"), "{e}");
    let e = tamper("own lm_head", &|all| {
        all.insert("lm_head.weight".to_string(), Tensor::zeros((3, tcfg.hidden), candle_core::DType::F32, &Device::Cpu).unwrap());
    });
    assert!(e.contains("lm_head.weight") && e.contains("borrows the target's"), "{e}");
    // A RoPE frequency table (the engine ignores it too) is no reason to refuse.
    let st = reduced_dir.join("model.safetensors");
    let mut all = candle_core::safetensors::load(&st, &Device::Cpu).unwrap();
    all.insert(map.to_string(), ids(vec![9, 3, 5]));
    all.remove("extra.weight");
    all.remove("lm_head.weight");
    all.insert("layers.0.self_attn.rotary_emb.inv_freq".to_string(), Tensor::zeros(4, candle_core::DType::F32, &Device::Cpu).unwrap());
    candle_core::safetensors::save(&all, &st).unwrap();
    let q = Params::init(&cfg, nf, 8, None).unwrap();
    sparkling_train::warm_start::from_drafter(&q, &reduced_dir, &cfg, nf, &scale, Some(&dv)).unwrap();
    assert!(w2(&rsrc).iter().any(|&x| x != 0.0));
    assert_eq!(w2(&q), w2(&rsrc));
}
