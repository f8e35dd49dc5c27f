//! The `sparkling-train` command line: `--help` into a full disk, and a training cache that
//! refuses to mix two weight storages.

use std::process::Command;

/// `--help` into a full disk is an error naming standard output (clap's printer ignored the
/// failed write and exited 0); into a pipe the help is printed whole with status 0.
#[test]
fn help_into_a_full_disk_is_an_error() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("skipping: no /dev/full");
        return;
    };
    let o = Command::new(env!("CARGO_BIN_EXE_sparkling-train")).args(["train", "--help"]).stdout(full).output().unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("standard output") && !e.contains("panicked"), "{e}");
    let o = Command::new(env!("CARGO_BIN_EXE_sparkling-train")).args(["train", "--help"]).output().unwrap();
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("--steps"));
}

/// A training cache records the target's weight storage (`meta.json`: `weights`), `gen-data`
/// defaults to native blocks for a GGUF target (the engine's default), and resuming a cache
/// with another storage is refused with a message naming both (answers of two targets would
/// mix). Needs the SmolLM2 asset (`scripts/fetch-assets smollm2`); required in CI.
#[test]
fn gen_data_records_the_weight_storage_and_refuses_to_mix_two() {
    let target = sparkling::assets::path(sparkling::assets::DEFAULT_TARGET);
    if !target.exists() {
        assert!(std::env::var_os("SPARKLING_REQUIRE_ASSETS").is_none(), "{} is missing (SPARKLING_REQUIRE_ASSETS is set)", target.display());
        eprintln!("skipping: {} not fetched", target.display());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let prompts = dir.path().join("train_prompts.jsonl");
    std::fs::write(&prompts, "{\"prompt\": \"Name a colour.\"}\n").unwrap();
    let gen = |out: &str, weights: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_sparkling-train"));
        c.args(["--threads", "2", "gen-data", "--target"]).arg(&target).arg("--prompts").arg(&prompts);
        c.args(["--limit", "1", "--max-new-tokens", "2", "--batch", "1", "--out"]).arg(dir.path().join(out));
        if let Some(w) = weights {
            c.args(["--weights", w]);
        }
        c.output().unwrap()
    };
    let meta = |out: &str| -> serde_json::Value { serde_json::from_str(&std::fs::read_to_string(dir.path().join(out).join("meta.json")).unwrap()).unwrap() };
    let o = gen("a", None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(meta("a")["weights"], "native");
    let o = gen("b", Some("f16"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(meta("b")["weights"], "f16");
    // Resuming `b` with the default (native) storage is refused, and nothing is added.
    let o = gen("b", None);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("--weights f16") && e.contains("--weights native") && !e.contains("panicked"), "{e}");
    assert_eq!(meta("b")["weights"], "f16");
    // The same storage resumes (the one prompt is cached already).
    let o = gen("b", Some("f16"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}
