//! Helpers for the tests that drive the `sparkling` binary: running it, reading its output,
//! tiny random targets and a word-level tokenizer for them.

use sparkling::model::config::Arch;
use sparkling::model::synth::{tiny_target_config, write_random_target, StoreDtype};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The `sparkling` binary with `SPARKLING_ASSETS` = `assets`, no backtraces, no stdin.
pub fn sparkling(assets: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sparkling"));
    c.env("SPARKLING_ASSETS", assets).env_remove("RUST_BACKTRACE").stdin(Stdio::null());
    c
}

/// Run `sparkling args` to completion.
pub fn run(assets: &Path, args: &[&str]) -> Output {
    sparkling(assets).args(args).output().expect("run sparkling")
}

/// A run's stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// No panic message, and not the panic exit status.
pub fn no_panic(o: &Output) {
    let e = stderr(o);
    assert!(!e.contains("panicked") && o.status.code() != Some(101), "status {:?}, stderr:\n{e}", o.status);
}

/// A tiny random target with `layers` layers in `dir/name`.
pub fn tiny_target(dir: &Path, name: &str, layers: usize) -> PathBuf {
    let mut cfg = tiny_target_config(Arch::Qwen3, 64);
    cfg.layers = layers;
    let p = dir.join(name);
    write_random_target(&p, &cfg, 3, StoreDtype::F32).unwrap();
    p
}

/// A word-level tokenizer.json for a `vocab`-token vocabulary: words `w0`…`w{vocab-1}` (the
/// tiny targets have 64).
pub fn word_tokenizer(path: &Path, vocab: usize) {
    let vocab: serde_json::Map<String, serde_json::Value> = (0..vocab).map(|i| (format!("w{i}"), serde_json::json!(i))).collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"}
    });
    std::fs::write(path, json.to_string()).unwrap();
}

/// The names in directory `d`, sorted.
pub fn listing(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// `p` as a `&str` (test paths are UTF-8).
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The real SmolLM2 GGUF, or `None` (the test then skips with a message).
pub fn smollm2() -> Option<PathBuf> {
    let p = sparkling::assets::path(sparkling::assets::DEFAULT_TARGET);
    if p.exists() {
        Some(p)
    } else {
        assert!(!std::env::var("SPARKLING_REQUIRE_ASSETS").is_ok_and(|v| v == "1"), "{} not found and SPARKLING_REQUIRE_ASSETS is set", p.display());
        eprintln!("skipping: {} not found (run scripts/fetch-assets smollm2)", p.display());
        None
    }
}
