//! The CLI's outputs when they fail under it (issue 15): a closed stdout or stderr, a full
//! disk, a JSON path that names a model or a device. No panic, no lost result: a closed pipe
//! ends the run quietly, a full disk is a clear error, and a JSON file is written before the
//! table that could fail. Drives the `sparkling` binary (`tests/common/cli.rs`); the other bad
//! input of the CLI is in `tests/bad_input_cli.rs`.

mod common;

use common::cli::{listing, no_panic, run, s, smollm2, sparkling, stderr, tiny_target};
use common::tmpdir;
use sparkling::model::config::Arch;
use sparkling::model::synth::tiny_target_config;
use std::path::Path;
use std::process::{Output, Stdio};

/// Run with stdout a pipe whose reader has gone away before the first write.
fn closed_stdout(assets: &Path, args: &[&str]) -> Output {
    let mut c = sparkling(assets).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    drop(c.stdout.take());
    c.wait_with_output().unwrap()
}

fn quiet_exit(o: &Output) {
    no_panic(o);
    // 0, or the conventional 141 (SIGPIPE) of a shell.
    assert!(o.status.success() || o.status.code() == Some(141), "status {:?}: {}", o.status, stderr(o));
    assert!(!stderr(o).contains("error"), "{}", stderr(o));
}

#[test]
fn generate_into_a_closed_pipe_exits_quietly() {
    let d = tmpdir("cli-pipe");
    let t = tiny_target(d.path(), "tiny", 4);
    let o = closed_stdout(d.path(), &["generate", "--target", s(&t), "--method", "ar", "--prompt-ids", "1,2,3", "--max-new-tokens", "200", "--ignore-eos"]);
    quiet_exit(&o);
    // With --stats-json, the stats are still written.
    let st = d.path().join("stats.json");
    let o = closed_stdout(
        d.path(),
        &["generate", "--target", s(&t), "--method", "ar", "--prompt-ids", "1,2,3", "--max-new-tokens", "20", "--ignore-eos", "--stats-json", s(&st)],
    );
    quiet_exit(&o);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&st).unwrap()).unwrap();
    assert_eq!(v["tokens"].as_array().map(|a| a.len()), Some(20));
}

#[test]
fn generate_into_a_full_disk_is_a_clear_error() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("skipping: no /dev/full");
        return;
    };
    let d = tmpdir("cli-full");
    let t = tiny_target(d.path(), "tiny", 4);
    let o = sparkling(d.path())
        .args(["generate", "--target", s(&t), "--method", "ar", "--prompt-ids", "1,2,3", "--max-new-tokens", "8", "--ignore-eos"])
        .stdout(full)
        .output()
        .unwrap();
    no_panic(&o);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("standard output") && e.contains("No space left"), "{e}");
}

#[test]
fn help_into_a_full_disk_is_an_error() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("skipping: no /dev/full");
        return;
    };
    let d = tmpdir("cli-help-full");
    let o = sparkling(d.path()).args(["generate", "--help"]).stdout(full).output().unwrap();
    no_panic(&o);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("standard output"), "{}", stderr(&o));
    // To a pipe, the help is printed in full and the status is 0.
    let o = run(d.path(), &["generate", "--help"]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("--max-new-tokens"));
}

#[test]
fn a_full_stderr_neither_panics_nor_loses_the_stats() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("skipping: no /dev/full");
        return;
    };
    let d = tmpdir("cli-stderr");
    let t = tiny_target(d.path(), "tiny", 4);
    let st = d.path().join("stats.json");
    let o = sparkling(d.path())
        .args(["generate", "--target", s(&t), "--method", "ar", "--prompt-ids", "1,2,3", "--max-new-tokens", "8", "--ignore-eos", "--stats-json", s(&st)])
        .stdout(Stdio::piped())
        .stderr(full)
        .output()
        .unwrap();
    assert!(o.status.success(), "status {:?}", o.status);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&st).unwrap()).unwrap();
    assert_eq!(v["tokens"].as_array().map(|a| a.len()), Some(8));
}

#[test]
fn stats_json_never_replaces_a_model_or_a_device() {
    let d = tmpdir("cli-stats-target");
    let t = tiny_target(d.path(), "tiny", 4);
    let weights = t.join("model.safetensors");
    let before = std::fs::read(&weights).unwrap();
    let gen = |out: &Path| {
        run(
            d.path(),
            &["generate", "--target", s(&t), "--method", "ar", "--prompt-ids", "1,2,3", "--max-new-tokens", "4", "--ignore-eos", "--stats-json", s(out)],
        )
    };
    let o = gen(&weights);
    no_panic(&o);
    assert!(!o.status.success() && stderr(&o).contains("holds a model"), "{}", stderr(&o));
    assert_eq!(std::fs::read(&weights).unwrap(), before);
    // A device is written through, not replaced by a regular file.
    let o = gen(Path::new("/dev/null"));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!std::fs::symlink_metadata("/dev/null").unwrap().file_type().is_file());
    // The config.json beside the weights is part of the model too.
    let cfg = t.join("config.json");
    let cfg_before = std::fs::read(&cfg).unwrap();
    let o = gen(&cfg);
    assert!(!o.status.success() && stderr(&o).contains("holds a model"), "{}", stderr(&o));
    assert_eq!(std::fs::read(&cfg).unwrap(), cfg_before);
    // `--stats-json /dev/stdout >> log`: appended to the log, which keeps its content (it used
    // to be replaced by the JSON alone: the write renamed a file over fd 1's target).
    #[cfg(unix)]
    {
        let log = d.path().join("log.txt");
        std::fs::write(&log, "keep\n").unwrap();
        let f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        let o = sparkling(d.path())
            .args([
                "generate",
                "--target",
                s(&t),
                "--method",
                "ar",
                "--prompt-ids",
                "1,2,3",
                "--max-new-tokens",
                "4",
                "--ignore-eos",
                "--ids",
                "--stats-json",
                "/dev/stdout",
            ])
            .stdout(f)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.starts_with("keep\n") && text.contains("\"new_tokens\"") && text.lines().count() >= 3, "{text}");
    }
}

#[test]
fn profile_into_a_closed_pipe_writes_its_json_first() {
    let d = tmpdir("cli-profile");
    let t = tiny_target(d.path(), "tiny", 4);
    let j = d.path().join("profile.json");
    let args = [
        "profile",
        "--target",
        s(&t),
        "--prefill",
        "8",
        "--budget",
        "4",
        "--candidates",
        "4",
        "--max-fanout",
        "2",
        "--ctx-rows",
        "2",
        "--reps",
        "1",
        "--warmup",
        "0",
        "--json",
        s(&j),
    ];
    let o = closed_stdout(d.path(), &args);
    quiet_exit(&o);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&j).unwrap()).unwrap();
    assert_eq!(v["budget"], 4);
    // The weights one decode step reads, as stored (this target's are f32: 4 B each).
    let mut c = tiny_target_config(Arch::Qwen3, 64);
    c.layers = 4;
    let (h, q, kv) = (c.hidden, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
    let params = c.layers * (2 * h * q + 2 * h * kv + 3 * h * c.intermediate) + c.vocab * h;
    assert_eq!(v["decode_weight_bytes"], 4 * params);
    // An unwritable --json fails before the timing, and creates nothing.
    let bad = d.path().join("no-such-dir").join("p.json");
    let mut a2 = args.to_vec();
    *a2.last_mut().unwrap() = s(&bad);
    let o = run(d.path(), &a2);
    no_panic(&o);
    assert!(!o.status.success() && stderr(&o).contains("--json"), "{}", stderr(&o));
}

#[test]
fn bench_into_a_closed_pipe_writes_its_json_first() {
    let Some(target) = smollm2() else { return };
    let d = tmpdir("cli-bench");
    let prompts = d.path().join("p.txt");
    std::fs::write(&prompts, "Say hi.\n").unwrap();
    let j = d.path().join("bench.json");
    let o = closed_stdout(
        d.path(),
        &["bench", "--target", s(&target), "--prompts", s(&prompts), "--limit", "1", "--methods", "ar", "--max-new-tokens", "4", "--json", s(&j)],
    );
    quiet_exit(&o);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&j).unwrap()).unwrap();
    assert_eq!(v["rows"].as_array().map(|r| r.len()), Some(1));
    assert_eq!(listing(d.path()), vec!["bench.json", "p.txt"]);
    // The results never replace the prompt file they were made from.
    let o = run(
        d.path(),
        &["bench", "--target", s(&target), "--prompts", s(&prompts), "--limit", "1", "--methods", "ar", "--max-new-tokens", "4", "--json", s(&prompts)],
    );
    assert!(!o.status.success() && stderr(&o).contains("is the --prompts file"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&prompts).unwrap(), "Say hi.\n");
}

/// Issue 15 trial: a JSON file that cannot be written (a full disk) must not lose the computed
/// results: the table is printed, then the error names the file.
#[test]
fn bench_json_into_a_full_disk_still_prints_the_table() {
    let Some(target) = smollm2() else { return };
    if !Path::new("/dev/full").exists() {
        eprintln!("skipping: no /dev/full");
        return;
    }
    let d = tmpdir("cli-bench-full");
    let prompts = d.path().join("p.txt");
    std::fs::write(&prompts, "Say hi.\n").unwrap();
    let o = run(
        d.path(),
        &["bench", "--target", s(&target), "--prompts", s(&prompts), "--limit", "1", "--methods", "ar", "--max-new-tokens", "4", "--json", "/dev/full"],
    );
    no_panic(&o);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("| ar |"), "table lost: {}", String::from_utf8_lossy(&o.stdout));
    assert!(stderr(&o).contains("/dev/full"), "{}", stderr(&o));
}
