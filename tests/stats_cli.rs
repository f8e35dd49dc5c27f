//! What the stats lines, tables and JSON of `generate` and `bench` say in the cases a reader
//! could misread: a run in which no decode round ran (the prefill's one token) has no τ — "–"
//! in the tables (and no tok/s or × ar), null in the JSON — and counts are singular where they
//! are 1. Drives the `sparkling` binary on a tiny random target (`tests/common/cli.rs`).

mod common;

use common::cli::{run, s, stderr, tiny_target, word_tokenizer};
use common::tmpdir;

#[test]
fn a_one_token_answer_reports_no_tau() {
    let d = tmpdir("cli-one-token");
    let t = tiny_target(d.path(), "tiny", 4);
    // The prefill gives the only new token: no round ran, so there is no τ to report.
    let o = run(d.path(), &["generate", "--target", s(&t), "--prompt-ids", "1,2,3", "--max-new-tokens", "1", "--method", "sparkling"]);
    let e = stderr(&o);
    assert!(o.status.success(), "{e}");
    assert!(e.contains("1 new token from the prefill, no decode round: prefill 3 tokens in"), "{e}");
    assert!(!e.contains("τ = 0.00") && !e.contains("per round (ms)"), "{e}");
    let o = run(d.path(), &["generate", "--target", s(&t), "--prompt-ids", "1", "--max-new-tokens", "3", "--method", "ar"]);
    let e = stderr(&o);
    assert!(o.status.success() && e.contains("3 new tokens in 2 rounds: τ = 1.00") && e.contains("prefill 1 token in"), "{e}");
    let (prompts, tok) = (d.path().join("p.txt"), d.path().join("tok.json"));
    std::fs::write(&prompts, "w1 w2 w3\n").unwrap();
    word_tokenizer(&tok, 64);
    let json = d.path().join("one.json");
    let bench =
        ["bench", "--target", s(&t), "--tokenizer", s(&tok), "--prompts", s(&prompts), "--methods", "ar,sparkling", "--budgets", "2", "--max-new-tokens", "1"];
    let o = run(d.path(), &[&bench[..], &["--json", s(&json)]].concat());
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.starts_with("1 prompt, 1 new token max,"), "{out}");
    for m in ["| ar | - | - | – |", "| sparkling | 2 | "] {
        let row = out.lines().find(|l| l.starts_with(m)).unwrap_or_else(|| panic!("no row {m} in {out}"));
        // τ, tok/s and × ar: no round ran, so no value.
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert_eq!(cells[4..7], ["–", "–", "–"], "{row}");
    }
    // The key to both dashes sits under the table.
    assert!(out.contains("- = does not apply to the method or its settings; – = no value in this run"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(v["rows"].as_array().unwrap().iter().all(|r| r["tau"].is_null()), "{v}");
    // The batched bench: the same "–" and null (its τ column is the 8th).
    let o = run(d.path(), &[&bench[..], &["--batch", "1,2", "--json", s(&json)]].concat());
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("| ar |") || l.starts_with("| sparkling |")).collect();
    assert_eq!(rows.len(), 4, "{out}");
    assert!(rows.iter().all(|r| r.split('|').nth(8).map(str::trim) == Some("–")), "{out}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(v["rows"].as_array().unwrap().iter().all(|r| r["tau"].is_null()), "{v}");
}

/// `profile --check-tokens` generates after the same `--prefill`-token prompt it timed (it used
/// the first 64 tokens, so a check at a long context tested a short one), says so, and refuses
/// a check that would not fit the context before any timing (by the engine's own check).
#[test]
fn profile_checks_the_tokens_after_the_whole_prefill() {
    let d = tmpdir("cli-profile-check");
    let t = tiny_target(d.path(), "tiny", 4);
    let j = d.path().join("p.json");
    let base = ["profile", "--target", s(&t), "--budget", "4", "--candidates", "4", "--ctx-rows", "2", "--reps", "1", "--warmup", "0"];
    let o = run(d.path(), &[&base[..], &["--prefill", "100", "--check-tokens", "6", "--json", s(&j)]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(out.contains("check: 6 greedy tokens after the 100-token prompt, sparkling EQUAL to ar"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&j).unwrap()).unwrap();
    assert_eq!((v["check"]["prompt_tokens"].as_u64(), v["check"]["equal"].as_bool()), (Some(100), Some(true)), "{v}");
    // 100 + 100 000 tokens exceed the tiny target's context: refused before any timing.
    let o = run(d.path(), &[&base[..], &["--prefill", "100", "--check-tokens", "100000"]].concat());
    let e = stderr(&o);
    // The engine's own check of the generations the check runs (so a lookup chain's rows count).
    assert!(!o.status.success() && e.contains("--check-tokens 100000 after the 100-token prompt (--prefill) cannot run, so nothing was timed"), "{e}");
    assert!(e.contains("rows a round writes at once exceeds the target context"), "{e}");
    assert!(!String::from_utf8_lossy(&o.stdout).contains("verify"), "timed before refusing");
}
