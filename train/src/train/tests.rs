use super::*;
use crate::checkpoint::DATA_FILE;
use half::f16;

fn seq(id: u32, prompt: &[u32], answer: &[u32]) -> Sequence {
    let tokens: Vec<u32> = prompt.iter().chain(answer).copied().collect();
    let n = tokens.len();
    Sequence { id, prompt_len: prompt.len(), tokens, width: 1, taps: vec![f16::ZERO; n], topk: 1, top_ids: answer.to_vec(), top_logp: vec![0.0; answer.len()] }
}

/// Answer tokens rank the draft vocabulary; prompt tokens only break ties; eos is always in.
#[test]
fn draft_vocab_counts_answers_only() {
    // Answers: 5 ×3, 2 ×2, 7 ×1. Prompts: 9 ×4 (never in an answer), 3 ×1.
    let train = [seq(0, &[9, 9, 3], &[5, 5, 2, 7]), seq(1, &[9, 9], &[5, 2])];
    let (dv, cov) = count_draft_vocab(&train, 12, 3, &[]).unwrap();
    assert_eq!(dv.draft_to_target(), &[5, 2, 7]);
    assert!((cov - 1.0).abs() < 1e-12);
    // V_d 2: 7 drops out (5 of 6 answer tokens kept); eos 11 takes the first slot.
    let (dv, cov) = count_draft_vocab(&train, 12, 2, &[]).unwrap();
    assert_eq!((dv.draft_to_target(), (cov * 6.0).round()), (&[5u32, 2][..], 5.0));
    let (dv, _) = count_draft_vocab(&train, 12, 3, &[11]).unwrap();
    assert_eq!(dv.draft_to_target(), &[11, 5, 2]);
    // The unseen tail: prompt counts first (9, then 3), then lower id.
    let (dv, _) = count_draft_vocab(&train, 12, 6, &[]).unwrap();
    assert_eq!(dv.draft_to_target(), &[5, 2, 7, 9, 3, 0]);
    assert_eq!((dv.draft_id(9), dv.draft_id(4)), (Some(3), None));
}

/// A small run over `cache` for the run-directory tests.
fn test_run(cache: &Path) -> RunConfig {
    RunConfig {
        kind: "dspark".into(),
        target: String::new(),
        cache: cache.display().to_string(),
        layers: 1,
        block_size: 4,
        markov_rank: 0,
        confidence: false,
        steps: 1,
        lr: 1e-3,
        warmup: 0,
        min_lr_ratio: 0.1,
        seqs_per_step: 1,
        anchors: 1,
        gamma: 7.0,
        w_ce: 1.0,
        w_kl: 0.0,
        w_l1: 0.0,
        w_conf: 0.0,
        weight_decay: 0.0,
        clip: 1.0,
        seed: 0,
        holdout: 1,
        init_from_target: None,
        init_from: None,
        draft_vocab: None,
        max_seqs: Some(2),
        use_taps: None,
    }
}

/// A run that failed before its first checkpoint leaves `run.json` + `data.json`;
/// a rerun with other options starts afresh there instead of being refused forever, while
/// a run with a checkpoint is still protected.
#[test]
fn a_run_without_a_checkpoint_is_restarted_with_new_options() {
    let cache = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    for id in [1u32, 2] {
        seq(id, &[1], &[2, 3]).write(cache.path()).unwrap();
    }
    let rc = test_run(cache.path());
    prepare_run_dir(out.path(), &rc, false).unwrap();
    sparkling::fsio::write_bytes(&out.path().join("run.json"), serde_json::to_string(&rc).unwrap().as_bytes()).unwrap();
    assert_eq!(frozen_file_list(&rc, out.path()).unwrap().len(), 2);
    let other = RunConfig { lr: 2e-3, max_seqs: Some(1), ..rc.clone() };
    prepare_run_dir(out.path(), &other, false).unwrap();
    assert!(!out.path().join("run.json").exists() && !out.path().join(DATA_FILE).exists());
    assert_eq!(frozen_file_list(&other, out.path()).unwrap(), vec!["seq-00001.bin".to_string()]);
    // With a checkpoint the run exists: other options are refused, the same ones pass.
    sparkling::fsio::write_bytes(&out.path().join("run.json"), serde_json::to_string(&other).unwrap().as_bytes()).unwrap();
    std::fs::write(out.path().join("ckpt-000001.json"), "{}").unwrap();
    let e = prepare_run_dir(out.path(), &rc, false).unwrap_err().to_string();
    assert!(e.contains("a different run lives here"), "{e}");
    prepare_run_dir(out.path(), &other, true).unwrap();
    assert!(out.path().join("run.json").exists() && out.path().join(DATA_FILE).exists());
    // The same cache named by another path is the same run.
    let rel = RunConfig { cache: format!("{}/.", other.cache), ..other.clone() };
    prepare_run_dir(out.path(), &rel, true).unwrap();
    // A second process cannot train into a directory another one holds.
    let held = prepare_run_dir(out.path(), &other, true).unwrap();
    let e = crate::checkpoint::RunLock::take(out.path()).unwrap_err().to_string();
    assert!(e.contains("another sparkling-train process"), "{e}");
    drop(held);
    crate::checkpoint::RunLock::take(out.path()).unwrap();
}

/// A resumed run redoes the steps after its checkpoint; their lines
/// of the interrupted attempt leave the log (eval records too), other lines stay.
#[test]
fn resume_truncates_the_log_to_the_checkpoint() {
    let out = tempfile::tempdir().unwrap();
    let lines = ["{\"step\":1,\"loss\":3}", "{\"step\":2,\"loss\":2}", "{\"eval\":{},\"step\":2}", "{\"step\":3,\"loss\":1}", "not json"];
    std::fs::write(out.path().join("log.jsonl"), lines.join("\n") + "\n").unwrap();
    crate::checkpoint::truncate_log(out.path(), 2).unwrap();
    let kept = std::fs::read_to_string(out.path().join("log.jsonl")).unwrap();
    assert_eq!(kept, [lines[0], lines[1], lines[2], lines[4]].join("\n") + "\n");
    // A run without a checkpoint starts its log afresh.
    let rc = test_run(out.path());
    sparkling::fsio::write_bytes(&out.path().join("run.json"), serde_json::to_string(&rc).unwrap().as_bytes()).unwrap();
    prepare_run_dir(out.path(), &rc, false).unwrap();
    assert!(!out.path().join("log.jsonl").exists());
}

/// `--seqs-per-step 1000` must not grow memory without bound: a step's logits are
/// bounded, the default step is far inside the bound.
#[test]
fn step_size_is_bounded_by_its_logits() {
    let rc = test_run(Path::new("/nonexistent"));
    let big = RunConfig { seqs_per_step: 1000, anchors: 16, block_size: 16, ..rc.clone() };
    let e = check_step_size(&big, 8192).unwrap_err().to_string();
    assert!(e.contains("--seqs-per-step") && e.contains("256000 loss rows"), "{e}");
    check_step_size(&RunConfig { seqs_per_step: 2, anchors: 16, block_size: 16, ..rc }, 49152).unwrap();
}

/// The first start freezes the cache's file list (`--max-seqs` keeps the first N by name);
/// files `gen-data` appends later do not enter a resumed run.
#[test]
fn file_list_is_frozen_at_the_first_start() {
    let cache = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    for id in [3u32, 1, 2] {
        seq(id, &[1], &[2, 3]).write(cache.path()).unwrap();
    }
    let rc = test_run(cache.path());
    let first = frozen_file_list(&rc, out.path()).unwrap();
    assert_eq!(first, vec!["seq-00001.bin".to_string(), "seq-00002.bin".into()]);
    seq(0, &[1], &[2, 3]).write(cache.path()).unwrap();
    assert_eq!(frozen_file_list(&rc, out.path()).unwrap(), first);
    let all = frozen_file_list(&RunConfig { max_seqs: None, ..rc.clone() }, tempfile::tempdir().unwrap().path()).unwrap();
    assert_eq!(all.len(), 4);
    std::fs::write(out.path().join(DATA_FILE), "{}").unwrap();
    let e = frozen_file_list(&rc, out.path()).unwrap_err().to_string();
    assert!(e.contains(DATA_FILE) && e.contains("no `files` array"), "{e}");
    // Sizes that would abort on allocation or run out of memory, and floats that would
    // train into NaN, are refused naming the argument.
    rc.validate().unwrap();
    for (bad, arg) in [
        (RunConfig { block_size: 4096, ..rc.clone() }, "block-size"),
        (RunConfig { markov_rank: 100_000_000, ..rc.clone() }, "markov-rank"),
        (RunConfig { layers: 100_000, ..rc.clone() }, "layers"),
        (RunConfig { seqs_per_step: 100_000_000, ..rc.clone() }, "seqs-per-step"),
        (RunConfig { min_lr_ratio: f64::NAN, ..rc.clone() }, "min-lr-ratio"),
        (RunConfig { min_lr_ratio: 2.0, ..rc.clone() }, "min-lr-ratio"),
        (RunConfig { clip: -1.0, ..rc.clone() }, "clip"),
        (RunConfig { weight_decay: f64::INFINITY, ..rc.clone() }, "weight-decay"),
        (RunConfig { warmup: 100, steps: 2, ..rc.clone() }, "warmup"),
        (RunConfig { w_conf: f64::NAN, ..rc.clone() }, "--conf"),
    ] {
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains(arg), "{arg}: {e}");
    }
}
