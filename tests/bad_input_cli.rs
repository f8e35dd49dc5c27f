//! The CLI as a new user and an attacker would drive it (issue 15): no file is lost or
//! half-written, malformed model files and absurd sizes are clear errors naming the file, key
//! or argument. Drives the `sparkling` binary. Closed and full outputs (stdout, stderr, a full
//! disk) are in `tests/output_cli.rs`; the checks of each method's options (budgets,
//! `--lookup`, options a method does not read) in `tests/options_cli.rs`.

mod common;

use common::cli::{listing, no_panic, run, s, smollm2, sparkling, stderr, tiny_target, word_tokenizer};
use common::tmpdir;
use sparkling::model::config::{Arch, DrafterKind};
use sparkling::model::synth::{tiny_target_config, write_random_drafter, DrafterInit, StoreDtype};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

// ---- 1. data loss --------------------------------------------------------------------------

#[test]
fn init_drafter_into_a_checkpoint_needs_force() {
    let d = tmpdir("cli-force");
    let t = tiny_target(d.path(), "target", 8);
    let before: Vec<Vec<u8>> = ["config.json", "model.safetensors"].iter().map(|f| std::fs::read(t.join(f)).unwrap()).collect();
    let o = run(d.path(), &["init-drafter", "--target", s(&t), "--kind", "dflash", "--out", s(&t)]);
    no_panic(&o);
    assert!(!o.status.success(), "replaced a checkpoint without --force");
    let e = stderr(&o);
    assert!(e.contains("--force") && e.contains("--out") && e.contains("target"), "{e}");
    let after: Vec<Vec<u8>> = ["config.json", "model.safetensors"].iter().map(|f| std::fs::read(t.join(f)).unwrap()).collect();
    assert!(before == after, "the target's files changed");

    // A fresh directory, then again with --force: written, atomically (no temporaries left).
    let out = d.path().join("drafter");
    let o = run(d.path(), &["init-drafter", "--target", s(&t), "--out", s(&out)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(d.path(), &["init-drafter", "--target", s(&t), "--out", s(&out)]);
    assert!(!o.status.success() && stderr(&o).contains("--force"), "{}", stderr(&o));
    // --force replaces the whole directory in one step: the new checkpoint (a stale weight
    // shard goes), other files carried over, no temporary or set-aside directory left.
    std::fs::write(out.join("model-00002-of-00002.safetensors"), "stale").unwrap();
    std::fs::write(out.join("README.md"), "mine").unwrap();
    let old_weights = std::fs::read(out.join("model.safetensors")).unwrap();
    let o = run(d.path(), &["init-drafter", "--target", s(&t), "--out", s(&out), "--force", "--seed", "5"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(listing(&out), vec!["README.md", "config.json", "model.safetensors"]);
    assert_ne!(std::fs::read(out.join("model.safetensors")).unwrap(), old_weights, "seed 5 weights");
    assert_eq!(listing(d.path()), vec!["drafter", "target"]);
    // The weights get the mode of a plain file create (the umask's; 0644 under 022), like
    // config.json, not the 0600 of the safetensors crate's temporary file.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |f: &str| std::fs::metadata(out.join(f)).unwrap().permissions().mode() & 0o777;
        std::fs::write(d.path().join("plain"), "").unwrap();
        let plain = std::fs::metadata(d.path().join("plain")).unwrap().permissions().mode() & 0o777;
        std::fs::remove_file(d.path().join("plain")).unwrap();
        assert_eq!((mode("model.safetensors"), mode("config.json")), (plain, plain));
    }
    // Arguments init-drafter does not use are refused, not ignored.
    let o = run(d.path(), &["init-drafter", "--target", s(&t), "--out", s(&out), "--force", "--drafter", s(&out)]);
    assert!(!o.status.success() && stderr(&o).contains("does not use --drafter"), "{}", stderr(&o));
}

#[test]
fn synth_and_synth_target_need_force() {
    let d = tmpdir("cli-synth");
    let t = tiny_target(d.path(), "target", 8);
    let o = run(d.path(), &["synth-target", "--out", s(&t)]);
    no_panic(&o);
    assert!(!o.status.success() && stderr(&o).contains("--force"), "{}", stderr(&o));
    let out = d.path().join("synth");
    let tc = t.join("config.json");
    let args = ["synth", "--config", s(&tc), "--out", s(&out), "--block-size", "4", "--markov-rank", "4", "--drafter-layers", "1", "--taps", "1"];
    let o = run(d.path(), &args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(listing(&out), vec!["dflash-b4", "dspark-b4", "target"]);
    let stamp = std::fs::read(out.join("target/model.safetensors")).unwrap();
    let mut again = args.to_vec();
    again.extend(["--seed", "9"]);
    let o = run(d.path(), &again);
    assert!(!o.status.success() && stderr(&o).contains("--force"), "{}", stderr(&o));
    assert!(std::fs::read(out.join("target/model.safetensors")).unwrap() == stamp);
    again.push("--force");
    let o = run(d.path(), &again);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::read(out.join("target/model.safetensors")).unwrap() != stamp);
}

#[test]
fn init_drafter_of_an_absurd_size_is_an_error_and_writes_nothing() {
    let d = tmpdir("cli-huge");
    let t = tiny_target(d.path(), "target", 8);
    let out = d.path().join("huge");
    for (arg, val) in [("--markov-rank", "100000000"), ("--layers", "1000000"), ("--block-size", "100000000"), ("--taps", "99"), ("--mask-token-id", "64")] {
        let o = run(d.path(), &["init-drafter", "--target", s(&t), "--out", s(&out), arg, val]);
        no_panic(&o);
        assert!(!o.status.success(), "{arg} {val} accepted");
        assert!(stderr(&o).contains(arg), "{arg}: {}", stderr(&o));
        assert_eq!(listing(d.path()), vec!["target"], "{arg} {val} left files behind");
    }
}

#[test]
fn init_drafter_default_taps_fit_a_shallow_target() {
    // Issue 15: the default `--taps 3` failed on a 4-layer target; it now takes what fits.
    let d = tmpdir("cli-taps");
    let t = tiny_target(d.path(), "target", 4);
    let out = d.path().join("drafter");
    let o = run(d.path(), &["init-drafter", "--target", s(&t), "--out", s(&out)]);
    no_panic(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(v["target_layer_ids"], serde_json::json!([2]), "one tap, the middle layer of 4");
    // An explicit count beyond what the target has is still refused, naming the limit.
    let o = run(d.path(), &["init-drafter", "--target", s(&t), "--out", s(&d.path().join("d2")), "--taps", "2"]);
    assert!(!o.status.success() && stderr(&o).contains("--taps 2 must be in 1..=1"), "{}", stderr(&o));
}

#[test]
fn a_directory_given_as_a_gguf_file_is_named_as_such() {
    let d = tmpdir("cli-dir-gguf");
    let g = d.path().join("model.gguf");
    std::fs::create_dir(&g).unwrap();
    let o = run(d.path(), &["generate", "--target", s(&g), "--method", "ar", "--prompt-ids", "1,2", "--max-new-tokens", "2"]);
    no_panic(&o);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("model.gguf") && e.contains("is a directory"), "{e}");
}

/// `--kv-cache`: an unknown value is named with the accepted ones whatever the backend, a
/// CPU-only storage on another backend names the backend, and q8_0 runs (tiny random target).
#[test]
fn kv_cache_values_are_checked_and_q8_0_runs() {
    let d = tmpdir("cli-kv-cache");
    let t = tiny_target(d.path(), "t", 2);
    let gen = |extra: &[&str]| {
        let mut a = vec!["generate", "--target", s(&t), "--method", "ar", "--prompt-ids", "1,2,3", "--max-new-tokens", "4", "--ids"];
        a.extend_from_slice(extra);
        run(d.path(), &a)
    };
    for extra in [&["--kv-cache", "q4"][..], &["--kv-cache", "q4", "--backend", "wgpu"]] {
        let o = gen(extra);
        no_panic(&o);
        let e = stderr(&o);
        assert!(!o.status.success() && e.contains("--kv-cache `q4`") && e.contains("q8_0"), "{extra:?}: {e}");
    }
    let o = gen(&["--kv-cache", "q8_0", "--backend", "wgpu"]);
    no_panic(&o);
    assert!(!o.status.success() && stderr(&o).contains("only the cpu backend"), "{}", stderr(&o));
    let o = gen(&["--kv-cache", "q8_0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("q8_0 kv cache"), "{}", stderr(&o));
}

/// The cache entry of the untrained DSpark drafter `generate` creates for target `t`.
fn cache_entry(assets: &Path, t: &Path) -> PathBuf {
    let c = tiny_target_config(Arch::Qwen3, 64);
    assets.join("drafters").join(format!("{}-dspark-random-v{}-h{}-l4", t.file_name().unwrap().to_string_lossy(), c.vocab, c.hidden))
}

fn generate_dspark(assets: &Path, t: &Path) -> Output {
    run(assets, &["generate", "--target", s(t), "--method", "dspark", "--prompt-ids", "1,2,3", "--max-new-tokens", "4", "--threads", "1"])
}

#[test]
fn untrained_drafter_cache_recovers_from_a_half_written_entry() {
    let d = tmpdir("cli-cache");
    let t = tiny_target(d.path(), "tiny", 4);
    // What an interrupted first run of an older version left: config.json, no weights.
    let e = cache_entry(d.path(), &t);
    let scratch = d.path().join("scratch");
    let init = DrafterInit { kind: DrafterKind::DSpark, layers: 1, block_size: 16, markov_rank: 64, taps: 1, mask_token_id: None, confidence_head: true };
    write_random_drafter(&scratch, &tiny_target_config(Arch::Qwen3, 64), &init, 0, StoreDtype::Bf16).unwrap();
    std::fs::create_dir_all(&e).unwrap();
    std::fs::copy(scratch.join("config.json"), e.join("config.json")).unwrap();
    let o = generate_dspark(d.path(), &t);
    no_panic(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(listing(&e), vec!["config.json", "model.safetensors"]);
    // A truncated weights file is rebuilt too.
    let w = e.join("model.safetensors");
    let bytes = std::fs::read(&w).unwrap();
    std::fs::write(&w, &bytes[..bytes.len() / 2]).unwrap();
    let o = generate_dspark(d.path(), &t);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(&w).unwrap(), bytes);
    assert_eq!(listing(e.parent().unwrap()), vec![e.file_name().unwrap().to_string_lossy().into_owned()]);
}

#[test]
fn untrained_drafter_cache_is_safe_under_concurrent_first_use() {
    for trial in 0..2 {
        let d = tmpdir("cli-race");
        let t = tiny_target(d.path(), "tiny", 4);
        let children: Vec<_> = (0..4)
            .map(|_| {
                sparkling(d.path())
                    .args(["generate", "--target", s(&t), "--method", "dspark", "--prompt-ids", "1,2,3", "--max-new-tokens", "4", "--threads", "1"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for c in children {
            let o = c.wait_with_output().unwrap();
            assert!(o.status.success(), "trial {trial}: {}", stderr(&o));
        }
        let e = cache_entry(d.path(), &t);
        assert_eq!(listing(&e), vec!["config.json", "model.safetensors"]);
        assert_eq!(listing(e.parent().unwrap()), vec![e.file_name().unwrap().to_string_lossy().into_owned()], "temporaries left behind");
    }
}

// ---- 2. files a run must not lose (closed and full outputs: tests/output_cli.rs) -------------

/// Issue 15 trial: `synth-target --config X --out X --force` rewrote the input config.json.
#[test]
fn synth_target_never_replaces_its_own_config() {
    let d = tmpdir("cli-synth-config");
    let t = tiny_target(d.path(), "t", 2);
    let cfg = t.join("config.json");
    let before = std::fs::read(&cfg).unwrap();
    for args in [vec!["synth-target", "--config", s(&t), "--out", s(&t), "--force"], vec!["synth-target", "--config", s(&cfg), "--out", s(&t), "--force"]] {
        let o = run(d.path(), &args);
        no_panic(&o);
        assert!(!o.status.success() && stderr(&o).contains("copy it elsewhere first"), "{}", stderr(&o));
        assert_eq!(std::fs::read(&cfg).unwrap(), before);
    }
}

/// Issue 15 trial: an interrupted `synth` left a 269 MB hidden temporary behind. SIGINT now
/// removes the process's temporaries and exits 130. (The interrupt is sent once the temporary
/// exists, so the test does not depend on timing.)
#[cfg(target_os = "linux")]
#[test]
fn an_interrupted_synth_leaves_no_temporaries() {
    let d = tmpdir("cli-sigint");
    let out = d.path().join("big");
    let mut child = sparkling(d.path()).args(["synth", "--preset", "smollm2-135m", "--out", s(&out)]).stderr(Stdio::null()).spawn().unwrap();
    // Hidden entries anywhere below `dir` (the temporaries are built inside `--out`).
    fn hidden(dir: &Path) -> usize {
        std::fs::read_dir(dir)
            .map(|r| {
                r.flatten().map(|e| usize::from(e.file_name().to_string_lossy().starts_with('.')) + if e.path().is_dir() { hidden(&e.path()) } else { 0 }).sum()
            })
            .unwrap_or(0)
    }
    let t0 = std::time::Instant::now();
    while hidden(d.path()) == 0 && t0.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(hidden(d.path()) > 0, "synth made no temporary within 60 s");
    let k = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(k.success());
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(130), "{st:?}");
    assert_eq!(hidden(d.path()), 0, "{:?}", listing(&out));
}

/// Issue 15/16 trials: a drafter directory given as the target said "the checkpoint holds
/// only 0 layers"; it is named as a drafter now.
#[test]
fn a_drafter_given_as_the_target_is_named_as_a_drafter() {
    let d = tmpdir("cli-drafter-as-target");
    let dr = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/smollm2-135m-dspark-b8");
    if !dr.join("config.json").exists() {
        return;
    }
    let o = run(d.path(), &["generate", "--target", s(&dr), "--method", "ar", "--prompt-ids", "1", "--max-new-tokens", "1"]);
    no_panic(&o);
    assert!(!o.status.success() && stderr(&o).contains("this is a drafter checkpoint, not a target model"), "{}", stderr(&o));
}

// ---- 3. malformed model files ----------------------------------------------------------------

/// A copy of `src` with the u32/u64 value of GGUF metadata key `key` replaced by `value`.
fn patch_gguf(src: &Path, dst: &Path, key: &str, value: u64) {
    let mut b = std::fs::read(src).unwrap();
    let mut needle = (key.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(key.as_bytes());
    let at = b.windows(needle.len()).position(|w| w == needle.as_slice()).unwrap_or_else(|| panic!("{key} not in {}", src.display())) + needle.len();
    let ty = u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    match ty {
        4 => b[at + 4..at + 8].copy_from_slice(&(value as u32).to_le_bytes()),
        10 => b[at + 4..at + 12].copy_from_slice(&value.to_le_bytes()),
        other => panic!("{key} has type {other}"),
    }
    std::fs::write(dst, b).unwrap();
}

#[test]
fn gguf_with_zero_heads_or_absurd_layer_count_is_a_clear_error() {
    let Some(target) = smollm2() else { return };
    let d = tmpdir("cli-gguf");
    for (key, value, expect) in [
        ("llama.attention.head_count", 0u64, "positive"),
        ("llama.block_count", u32::MAX as u64, "holds only 30 layers"),
        ("llama.rope.dimension_count", 32, "partial rotary embeddings are not supported"),
    ] {
        let p = d.path().join("bad.gguf");
        patch_gguf(&target, &p, key, value);
        let o = run(d.path(), &["generate", "--target", s(&p), "--method", "ar", "--prompt-ids", "1,2", "--max-new-tokens", "1"]);
        no_panic(&o);
        assert_eq!(o.status.code(), Some(1), "{key} = {value}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains("bad.gguf") && e.contains(key) && e.contains(&value.to_string()) && e.contains(expect), "{e}");
    }
}

// ---- 4. user-given sizes ---------------------------------------------------------------------

#[test]
fn absurd_sizes_are_clamped_or_refused_naming_the_argument() {
    let d = tmpdir("cli-sizes");
    let t = tiny_target(d.path(), "tiny", 4);
    let base = ["generate", "--target", s(&t), "--prompt-ids", "1,2,3"];
    // Candidates, fan-out and k far beyond the vocabulary: clamped, with a note naming the
    // knob (the knobs a method does not read are refused: see `options_no_method_reads_...`).
    for (method, knobs, note) in [
        ("sparkling", &["--candidates", "--max-fanout"][..], "--candidates 1000000000 exceeds the vocabulary size (64)"),
        ("treespark", &["--treespark-k"][..], "--treespark-k 1000000000 exceeds the vocabulary size, --budget and 1024"),
    ] {
        let mut a = base.to_vec();
        a.extend(["--max-new-tokens", "4", "--method", method]);
        for k in knobs {
            a.extend([*k, "1000000000"]);
        }
        let o = run(d.path(), &a);
        no_panic(&o);
        assert!(o.status.success(), "{method}: {}", stderr(&o));
        assert!(stderr(&o).contains(note), "{}", stderr(&o));
    }
    // Refused: a budget beyond the context, absurd thread counts, token counts.
    for (extra, arg) in [
        (vec!["--max-new-tokens", "4", "--method", "sparkling", "--budget", "18446744073709551615"], "context"),
        (vec!["--max-new-tokens", "4", "--method", "ar", "--threads", "100000000"], "--threads"),
        (vec!["--method", "ar", "--max-new-tokens", "18446744073709551615"], "context"),
    ] {
        let mut a = base.to_vec();
        a.extend(extra);
        let o = run(d.path(), &a);
        no_panic(&o);
        assert!(!o.status.success() && stderr(&o).contains(arg), "{arg}: {}", stderr(&o));
    }
    let o = run(d.path(), &["profile", "--target", s(&t), "--budget", "18446744073709551615", "--prefill", "8"]);
    no_panic(&o);
    assert!(!o.status.success() && stderr(&o).contains("--budget"), "{}", stderr(&o));
    // `bench --batch 0` ran batch 1 silently; now refused before anything loads.
    let pf = d.path().join("p.txt");
    std::fs::write(&pf, "hi\n").unwrap();
    let o = run(d.path(), &["bench", "--target", s(&t), "--prompts", s(&pf), "--batch", "0"]);
    no_panic(&o);
    assert!(!o.status.success() && stderr(&o).contains("--batch 0"), "{}", stderr(&o));
    // Repetition counts that would hang or abort allocating (issue 15) are refused up front.
    for arg in ["--reps", "--warmup"] {
        let o = run(d.path(), &["profile", "--target", s(&t), "--prefill", "8", "--budget", "2", arg, "1000000000000"]);
        no_panic(&o);
        assert!(!o.status.success() && stderr(&o).contains(arg) && stderr(&o).contains("at most"), "{arg}: {}", stderr(&o));
    }
    // A named pipe as the target would block the reader forever: refused by kind.
    #[cfg(unix)]
    {
        let fifo = d.path().join("fifo");
        assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let o = run(d.path(), &["generate", "--target", s(&fifo), "--prompt-ids", "1,2", "--max-new-tokens", "2"]);
        no_panic(&o);
        assert!(!o.status.success() && stderr(&o).contains("not a regular file"), "{}", stderr(&o));
        // …and so is a pipe standing in for a file inside a model directory (config, weights,
        // tokenizer), instead of blocking the loader forever.
        for name in ["config.json", "model.safetensors", "tokenizer.json"] {
            let m = d.path().join(format!("m-{name}"));
            std::fs::create_dir(&m).unwrap();
            for f in ["config.json", "model.safetensors"] {
                std::fs::copy(t.join(f), m.join(f)).unwrap();
            }
            let _ = std::fs::remove_file(m.join(name));
            assert!(Command::new("mkfifo").arg(m.join(name)).status().unwrap().success());
            let o = sparkling(d.path()).args(["generate", "--target", s(&m), "--prompt-ids", "1,2", "--max-new-tokens", "2"]).output().unwrap();
            no_panic(&o);
            assert!(!o.status.success() && stderr(&o).contains(name) && stderr(&o).contains("not a regular file"), "{name}: {}", stderr(&o));
        }
    }
}

#[test]
fn tokenizer_argument_is_the_file_it_names() {
    let d = tmpdir("cli-tok");
    let t = tiny_target(d.path(), "tiny", 4);
    let tok = d.path().join("my-tokenizer.json");
    word_tokenizer(&tok, 64);
    // A decoy next to it: the old code read the directory's tokenizer.json instead.
    std::fs::write(d.path().join("tokenizer.json"), "not a tokenizer").unwrap();
    let o = run(d.path(), &["generate", "--target", s(&t), "--tokenizer", s(&tok), "--method", "ar", "--prompt", "w1 w2 w3", "--max-new-tokens", "2"]);
    no_panic(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    let missing = d.path().join("nope.json");
    let o = run(d.path(), &["generate", "--target", s(&t), "--tokenizer", s(&missing), "--method", "ar", "--prompt", "w1", "--max-new-tokens", "2"]);
    assert!(!o.status.success() && stderr(&o).contains("nope.json"), "{}", stderr(&o));
}

#[test]
fn bench_names_a_missing_prompts_file_before_loading_anything() {
    let d = tmpdir("cli-prompts-missing");
    let missing = d.path().join("no-such-prompts.jsonl");
    // The target does not exist either: the prompt file is read first, so it is the one named
    // (before, the target loaded and only then the prompt file failed).
    let o = run(d.path(), &["bench", "--target", s(&d.path().join("no-such-model.gguf")), "--prompts", s(&missing), "--methods", "ar"]);
    no_panic(&o);
    let e = stderr(&o);
    assert!(o.status.code() == Some(1) && e.contains("no-such-prompts.jsonl") && !e.contains("no-such-model"), "{e}");
    // Bad prompt files, each named with the file's own line number (blank lines counted).
    let gz = d.path().join("gzipped-without-suffix.jsonl");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut enc, b"{\"question\": \"a\"}\n").unwrap();
    std::fs::write(&gz, enc.finish().unwrap()).unwrap();
    for (name, text, want) in [
        ("blank-lines.jsonl", "{\"question\": \"a\"}\n\n\n{\"question\": \"b\"\n", "line 4, column 16: invalid JSON: EOF while parsing an object"),
        ("not-json.jsonl", "{\"question\": \"a\"}\nnot json\n", "line 2: expected a JSON object"),
        ("no-field.jsonl", "\n{\"answer\": \"a\"}\n", "line 2: expected a `turns`"),
    ] {
        let f = d.path().join(name);
        std::fs::write(&f, text).unwrap();
        let o = run(d.path(), &["bench", "--target", s(&d.path().join("no-such-model.gguf")), "--prompts", s(&f)]);
        no_panic(&o);
        let e = stderr(&o);
        assert!(o.status.code() == Some(1) && e.contains(name) && e.contains(want), "{name}: {e}");
    }
    // gzip is known by its bytes: this file is read (the error is then the missing model's).
    let o = run(d.path(), &["bench", "--target", s(&d.path().join("no-such-model.gguf")), "--prompts", s(&gz)]);
    let e = stderr(&o);
    assert!(!o.status.success() && e.contains("no-such-model") && !e.contains("UTF-8"), "{e}");
}

#[test]
fn show_tree_prints_each_round_with_the_accepted_path() {
    let d = tmpdir("cli-show-tree");
    let t = tiny_target(d.path(), "tiny", 4);
    let o = run(
        d.path(),
        &[
            "generate",
            "--target",
            s(&t),
            "--method",
            "ddtree",
            "--budget",
            "4",
            "--prompt-ids",
            "1,2,3",
            "--max-new-tokens",
            "6",
            "--ignore-eos",
            "--show-tree",
            "--threads",
            "1",
        ],
    );
    no_panic(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    let committed: Vec<String> = String::from_utf8_lossy(&o.stdout).split_whitespace().map(String::from).collect();
    assert_eq!(committed.len(), 6);
    // Every round line names its position; the bonus tokens and accepted nodes (✓ below the
    // root) rebuild the committed ids after the first (prefill) token.
    let mut rebuilt: Vec<String> = Vec::new();
    let mut rounds = 0;
    let mut lines = e.lines().peekable();
    while let Some(l) = lines.next() {
        let Some(rest) = l.strip_prefix("round ") else { continue };
        assert!(rest.contains(&format!("@ position {}", 3 + rebuilt.len())), "{l}");
        // Budget 4; none in the round that commits the 6th token (its bonus): no drafted node
        // could be committed there (the depth cap is asserted in tests/exactness.rs).
        let generated = 1 + rebuilt.len();
        let nodes: usize = rest.split(": ").nth(1).and_then(|x| x.split(' ').next()).and_then(|n| n.parse().ok()).unwrap_or(99);
        if generated + 1 >= 6 {
            assert_eq!(nodes, 0, "{l}");
        } else {
            assert!((1..=4).contains(&nodes) && rest.contains("drafted nodes"), "{l}");
        }
        let bonus = rest.rsplit("bonus ").next().unwrap().to_string();
        let mut first = true;
        while let Some(n) = lines.peek().filter(|n| n.starts_with("  ")) {
            if !first && n.contains('✓') {
                rebuilt.push(n.trim().trim_start_matches('✓').trim().to_string());
            }
            first = false;
            lines.next();
        }
        rebuilt.push(bonus);
        rounds += 1;
    }
    assert!(rounds >= 1, "{e}");
    assert_eq!(&rebuilt[..5.min(rebuilt.len())], &committed[1..1 + 5.min(rebuilt.len())], "{e}");
}

/// `--show-tree` names control tokens (a plain decode gives them no text): every token of this
/// vocabulary is a control token, so each printed token must be its name, quoted, and the
/// end-of-turn token `<|im_end|>` is marked as such.
#[test]
fn show_tree_names_control_tokens() {
    let d = tmpdir("cli-show-tree-special");
    let t = tiny_target(d.path(), "tiny", 2);
    let name = |i: usize| if i == 5 { "<|im_end|>".to_string() } else { format!("w{i}") };
    let vocab: serde_json::Map<String, serde_json::Value> = (0..64).map(|i| (name(i), serde_json::json!(i))).collect();
    let added: Vec<serde_json::Value> = (0..64)
        .map(|i| serde_json::json!({"id": i, "content": name(i), "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}))
        .collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"}
    });
    let tok = d.path().join("tokenizer.json");
    std::fs::write(&tok, json.to_string()).unwrap();
    let o = run(
        d.path(),
        &[
            "generate",
            "--target",
            s(&t),
            "--tokenizer",
            s(&tok),
            "--method",
            "ar",
            "--prompt",
            "w1 w2 w3",
            "--max-new-tokens",
            "8",
            "--show-tree",
            "--threads",
            "1",
        ],
    );
    no_panic(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    let bonuses: Vec<&str> = e.lines().filter_map(|l| l.strip_prefix("round ")).map(|l| l.rsplit("bonus ").next().unwrap()).collect();
    assert!(!bonuses.is_empty(), "{e}");
    for b in &bonuses {
        let ok = (b.starts_with("\"w") && b.ends_with('"')) || *b == "\"<|im_end|>\" (end of turn)";
        assert!(ok, "bonus printed as {b:?}, expected the token's name: {e}");
    }
}

/// Issue 15 trial: writer commands refuse options the chosen mode does not read, naming them.
#[test]
fn writer_options_the_mode_does_not_read_are_refused() {
    let d = tmpdir("cli-writer-options");
    let t = tiny_target(d.path(), "tiny", 4);
    let out = d.path().join("out");
    let cfg = t.join("config.json");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["init-drafter", "--target", s(&t), "--out", s(&out), "--kind", "dflash", "--markov-rank", "8"], "a DFlash drafter has no Markov head"),
        (vec!["synth-target", "--config", s(&cfg), "--arch", "llama", "--out", s(&out)], "leave out --arch and --vocab"),
        (vec!["synth", "--config", s(&cfg), "--no-drafters", "--block-size", "8", "--out", s(&out)], "--block-size sizes the drafters"),
        (vec!["reduce-vocab", "--target", s(&t), "--count-only", "--out", s(&out)], "--out is not used with --count-only"),
    ];
    for (a, want) in cases {
        let o = run(d.path(), &a);
        no_panic(&o);
        assert!(!o.status.success() && stderr(&o).contains(want), "{a:?}: {}", stderr(&o));
    }
    assert!(!out.exists(), "nothing was written");
    // An output that is the input model is refused even with --force.
    let before = std::fs::read(t.join("model.safetensors")).unwrap();
    let o = run(d.path(), &["init-drafter", "--target", s(&t), "--out", s(&t), "--force"]);
    no_panic(&o);
    assert!(!o.status.success() && stderr(&o).contains("is the --target"), "{}", stderr(&o));
    assert_eq!(std::fs::read(t.join("model.safetensors")).unwrap(), before);
}
