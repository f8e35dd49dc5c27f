//! The real `openai` Python client (tests/openai_client.py) against `sparkling serve` on
//! SmolLM2-135M-Instruct: chat and completions, streaming and not, `stop`, `seed`, `usage`, and
//! a 401 / 400 raised as the client's own exception types.
//!
//! Needs the asset (`scripts/fetch-assets smollm2`) and a Python with the `openai` package named
//! by `SPARKLING_OPENAI_PYTHON` (`.ci/run` makes one: `scripts/install-openai-client`). Skips
//! without them, unless `SPARKLING_REQUIRE_ASSETS=1` / `SPARKLING_REQUIRE_OPENAI=1`.

use std::io::Read;
use std::time::{Duration, Instant};

#[test]
fn the_openai_python_client_talks_to_serve() {
    let required = |v: &str| std::env::var(v).is_ok_and(|x| x == "1");
    let gguf = sparkling::assets::path("smollm2-135m-instruct-q4_1.gguf");
    if !gguf.exists() {
        assert!(!required("SPARKLING_REQUIRE_ASSETS"), "{} missing and SPARKLING_REQUIRE_ASSETS=1", gguf.display());
        eprintln!("SKIPPED: {} missing (scripts/fetch-assets smollm2)", gguf.display());
        return;
    }
    let Some(python) = std::env::var("SPARKLING_OPENAI_PYTHON").ok().filter(|p| !p.is_empty()) else {
        assert!(!required("SPARKLING_REQUIRE_OPENAI"), "SPARKLING_OPENAI_PYTHON unset and SPARKLING_REQUIRE_OPENAI=1");
        eprintln!("SKIPPED: SPARKLING_OPENAI_PYTHON unset (eval \"$(scripts/install-openai-client)\")");
        return;
    };
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sparkling"))
        .args(["serve", "--target", gguf.to_str().unwrap(), "--port", "0", "--api-key", "test-key"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let mut log = Vec::new();
    let t0 = Instant::now();
    let base = loop {
        let mut b = [0u8; 1];
        assert_eq!(err.read(&mut b).unwrap(), 1, "serve exited: {}", String::from_utf8_lossy(&log));
        log.push(b[0]);
        let s = String::from_utf8_lossy(&log);
        if s.contains("serve: ready") {
            let addr = s.split("listening on ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap().to_string();
            break format!("{addr}/v1");
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "serve never became ready: {s}");
    };
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    let out = std::process::Command::new(&python).args([concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai_client.py"), &base, "test-key"]).output().unwrap();
    let _ = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let status = child.wait().unwrap();
    assert!(out.status.success(), "openai client failed:\n{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(status.code(), Some(0), "serve's exit after SIGTERM");
}
