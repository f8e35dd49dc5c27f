//! `train::run`'s order of work, end to end on a tiny random target and a hand-made cache:
//! `--init-from` is checked before the cache is read (a wrong directory used to fail only after
//! minutes of loading a large cache), and a resumed run ignores `--init-from` (its checkpoint
//! holds the weights), so deleting the warm-start directory does not stop a resume.

use half::f16;
use sparkling::model::config::Arch;
use sparkling::model::synth::{tiny_target_config, write_random_target, StoreDtype};
use sparkling_train::cache::{CacheMeta, Sequence};
use sparkling_train::export::{write_hf, Export, ExportDtype};
use sparkling_train::model::Params;
use sparkling_train::train::{run, run_context, RunConfig, TrainControl};
use std::path::Path;

const VOCAB: usize = 48;

/// A cache of `n` sequences for `target` (taps of layers 0 and 1, top-2 log-probs).
fn write_cache(dir: &Path, target: &Path, n: u32) {
    let tcfg = tiny_target_config(Arch::Llama, VOCAB);
    let meta = CacheMeta {
        target: target.display().to_string(),
        target_layers: tcfg.layers,
        hidden: tcfg.hidden,
        vocab: VOCAB,
        tap_layers: vec![0, 1],
        topk: 2,
        source: "hand-made".into(),
        max_new_tokens: 12,
        weights: Some("f32".into()),
    };
    meta.write(dir).unwrap();
    for id in 0..n {
        let tokens: Vec<u32> = (0..20u32).map(|i| (i * 7 + id * 3) % VOCAB as u32).collect();
        let (prompt_len, width) = (6, meta.width());
        let answer = tokens.len() - prompt_len;
        let seq = Sequence {
            id,
            prompt_len,
            width,
            taps: (0..tokens.len() * width).map(|i| f16::from_f32(((i * 13 + id as usize) % 17) as f32 / 17.0 - 0.5)).collect(),
            topk: 2,
            top_ids: tokens[prompt_len..].iter().flat_map(|&t| [t, (t + 1) % VOCAB as u32]).collect(),
            top_logp: (0..answer).flat_map(|_| [-0.2f32, -1.8]).collect(),
            tokens,
        };
        seq.write(dir).unwrap();
    }
}

fn config(target: &Path, cache: &Path, steps: usize, init_from: Option<&Path>) -> RunConfig {
    RunConfig {
        kind: "dspark".into(),
        target: target.display().to_string(),
        cache: cache.display().to_string(),
        layers: 1,
        block_size: 4,
        markov_rank: 4,
        confidence: false,
        steps,
        lr: 1e-3,
        warmup: 0,
        min_lr_ratio: 0.1,
        seqs_per_step: 2,
        anchors: 2,
        gamma: 7.0,
        w_ce: 1.0,
        w_kl: 0.0,
        w_l1: 0.0,
        w_conf: 0.0,
        weight_decay: 0.0,
        clip: 1.0,
        seed: 3,
        holdout: 1,
        init_from_target: None,
        init_from: init_from.map(|p| p.display().to_string()),
        draft_vocab: None,
        max_seqs: None,
        use_taps: None,
    }
}

fn control(out: &Path, resume: bool) -> TrainControl {
    TrainControl { out: out.to_path_buf(), resume, ckpt_every: 1, eval_every: 0, max_minutes: None }
}

#[test]
fn init_from_is_checked_before_the_cache_loads_and_a_resume_ignores_it() {
    let root = tempfile::tempdir().unwrap();
    let target = root.path().join("target");
    write_random_target(&target, &tiny_target_config(Arch::Llama, VOCAB), 9, StoreDtype::F32).unwrap();
    let cache = root.path().join("cache");
    write_cache(&cache, &target, 4);

    // A drafter of this run's shape, exported, to warm-start from.
    let warm = root.path().join("warm");
    let rc = config(&target, &cache, 1, Some(&warm));
    let (meta, _, tcfg, dcfg) = run_context(&rc).unwrap();
    let p = Params::init(&dcfg, meta.width(), 5, None).unwrap();
    write_hf(
        &warm,
        Export { cfg: &dcfg, num_target_layers: tcfg.layers, n_feat: meta.width(), params: &p, draft_vocab: None, dtype: ExportDtype::F32 },
        None,
        None,
    )
    .unwrap();

    // One step from it, then a resume to step 2 after the warm-start directory is gone.
    let out = root.path().join("run");
    let m = run(&rc, &control(&out, false)).unwrap();
    assert!(m.ce.is_finite(), "{m:?}");
    assert!(out.join("ckpt-000001.json").exists());
    std::fs::remove_dir_all(&warm).unwrap();
    let rc2 = config(&target, &cache, 2, Some(&warm));
    run(&rc2, &control(&out, true)).unwrap();
    assert!(out.join("ckpt-000002.json").exists());

    // A fresh run from the missing directory fails on --init-from even though the cache now
    // holds a file that cannot be read: the check comes first.
    std::fs::write(cache.join("seq-00009.bin"), b"not a sequence").unwrap();
    let e = run(&rc2, &control(&root.path().join("run2"), false)).unwrap_err().to_string();
    assert!(e.contains("--init-from") && !e.contains("seq-00009"), "{e}");
    // Without --init-from the same run reaches the cache and names the bad file.
    let e = run(&config(&target, &cache, 2, None), &control(&root.path().join("run3"), false)).unwrap_err().to_string();
    assert!(e.contains("seq-00009"), "{e}");
}
