//! Each method's options on the command line: tree budgets (`0` and negatives refused by every
//! command), `--lookup` / `--lookup-drafter` (values, which methods read them, bench lists) and
//! options a method does not read, refused naming the option and the method. Drives the
//! `sparkling` binary on tiny random targets (`tests/common/cli.rs`).

mod common;

use common::cli::{no_panic, run, s, stderr, tiny_target, word_tokenizer};
use common::tmpdir;
use sparkling::model::config::{Arch, DrafterKind};
use sparkling::model::synth::{tiny_target_config, write_random_drafter, DrafterInit, StoreDtype};

#[test]
fn a_zero_tree_budget_is_refused_by_every_command() {
    let d = tmpdir("cli-budget0");
    let t = tiny_target(d.path(), "tiny", 4);
    let prompts = d.path().join("p.txt");
    std::fs::write(&prompts, "hi\n").unwrap();
    let gen = ["generate", "--target", s(&t), "--prompt-ids", "1,2,3", "--max-new-tokens", "2", "--method", "ddtree"];
    let bench = ["bench", "--target", s(&t), "--prompts", s(&prompts), "--methods", "ddtree", "--max-new-tokens", "2"];
    for (cmd, flag, bad) in [(&gen[..], "--budget", "0"), (&bench[..], "--budgets", "0"), (&bench[..], "--budgets", "8,0"), (&gen[..], "--budget", "-3")] {
        let mut a = cmd.to_vec();
        let arg = format!("{flag}={bad}");
        a.push(&arg);
        let o = run(d.path(), &a);
        no_panic(&o);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{a:?}: {e}");
        assert!(e.contains(flag) && e.contains("positive tree budget") && e.contains("`auto`"), "{a:?}: {e}");
    }
    let o = run(d.path(), &["profile", "--target", s(&t), "--prefill", "8", "--budget", "0"]);
    no_panic(&o);
    let e = stderr(&o);
    assert!(!o.status.success() && e.contains("--budget") && e.contains("positive tree budget"), "{e}");
    // The smallest accepted budget runs.
    let mut a = gen.to_vec();
    a.extend(["--budget", "1"]);
    let o = run(d.path(), &a);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn lookup_reads_the_budget_and_the_graft_options_are_checked() {
    let d = tmpdir("cli-lookup");
    let t = tiny_target(d.path(), "tiny", 2);
    let prompts = d.path().join("p.txt");
    std::fs::write(&prompts, "hi\n").unwrap();
    let gen = |budget: &'static str| {
        vec!["generate", "--target", s(&t), "--prompt-ids", "1,2,3,1,2", "--max-new-tokens", "6", "--method", "lookup", "--budget", budget]
    };
    // `--budget` is lookup's chain length: numbers and auto run, 0 is refused like any method's.
    for budget in ["1", "3", "auto"] {
        let o = run(d.path(), &gen(budget));
        assert!(o.status.success(), "--budget {budget}: {}", stderr(&o));
    }
    let o = run(d.path(), &gen("0"));
    no_panic(&o);
    assert!(o.status.code() == Some(1) && stderr(&o).contains("--budget `0`: expected a positive tree budget"), "{}", stderr(&o));
    // `--lookup` grafts onto a drafter's tree: methods without one refuse it (lookup's chain
    // is its --budget), and bad values are refused before anything loads.
    let with = |method: &'static str, extra: [&'static str; 2]| {
        let mut v = vec!["generate", "--target", s(&t), "--prompt-ids", "1,2,3", "--max-new-tokens", "2", "--method", method];
        v.extend(extra);
        v
    };
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (with("ar", ["--lookup", "4"]), "--lookup is not used by --method ar"),
        (with("lookup", ["--lookup", "4"]), "--lookup is not used by --method lookup"),
        (with("lookup", ["--lookup-drafter", "always"]), "--lookup-drafter is not used by --method lookup"),
        (with("sparkling", ["--lookup", "four"]), "--lookup `four`: expected `auto`, `off` or a chain length"),
        // A negative number reaches our own check (not clap's "unexpected argument").
        (with("sparkling", ["--lookup", "-1"]), "--lookup `-1`: expected `auto`, `off` or a chain length"),
        (with("sparkling", ["--budget", "-1"]), "--budget `-1`: expected a positive tree budget"),
        (with("sparkling", ["--lookup-drafter", "sometimes"]), "--lookup-drafter `sometimes`: expected `fallback` or `always`"),
        (with("dflash", ["--lookup-drafter", "always"]), "--lookup-drafter needs a lookup chain"),
    ];
    for (args, want) in cases {
        let o = run(d.path(), &args);
        no_panic(&o);
        assert!(o.status.code() == Some(1) && stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
    for (list, want) in [("auto,x", "--lookup `x`: expected"), ("auto,,4", "--lookup ``: expected"), ("-2", "--lookup `-2`: expected")] {
        let o = run(d.path(), &["bench", "--target", s(&t), "--prompts", s(&prompts), "--methods", "ar,sparkling", "--lookup", list]);
        no_panic(&o);
        assert!(o.status.code() == Some(1) && stderr(&o).contains(want), "--lookup {list}: {}", stderr(&o));
    }
    // … and where no run has a chain, `--lookup-drafter` has nothing to act on: refused, before loading.
    for (methods, lookup) in [("ar,sparkling", "off"), ("ar,dspark", "auto")] {
        let o = run(d.path(), &["bench", "--target", s(&t), "--prompts", s(&prompts), "--methods", methods, "--lookup", lookup, "--lookup-drafter", "always"]);
        no_panic(&o);
        assert!(
            o.status.code() == Some(1) && stderr(&o).contains("--lookup-drafter always is read by drafter runs with a lookup chain"),
            "{methods}: {}",
            stderr(&o)
        );
    }
    let o = run(d.path(), &["bench", "--target", s(&t), "--prompts", s(&prompts), "--methods", "ar", "--limit", "0"]);
    no_panic(&o);
    assert!(o.status.code() == Some(1) && stderr(&o).contains("--limit 0: expected at least 1 prompt"), "{}", stderr(&o));
    // A drafter method on a target too shallow to tap (2 layers) says so, before creating an
    // untrained drafter it could not load.
    let o = run(d.path(), &["generate", "--target", s(&t), "--prompt-ids", "1,2,3", "--method", "dspark", "--max-new-tokens", "2"]);
    no_panic(&o);
    assert!(o.status.code() == Some(1) && stderr(&o).contains("too shallow for a DSpark drafter"), "{}", stderr(&o));
    // `--lookup-drafter` applies to the runs with a chain: beside `--lookup off` (and a
    // method without a graft) it runs; values are case-insensitive; a run listed twice
    // (`auto` resolved) runs once, with a note.
    let json = d.path().join("rows.json");
    let t4 = tiny_target(d.path(), "tiny4", 4);
    let saved = d.path().join("tokens.json");
    let tok = d.path().join("tokenizer4.json");
    word_tokenizer(&tok, 64);
    std::fs::write(&prompts, "w1 w2 w3 w1 w2 w3 w1 w2\n").unwrap();
    let o = run(
        d.path(),
        &[
            "bench",
            "--target",
            s(&t4),
            "--tokenizer",
            s(&tok),
            "--prompts",
            s(&prompts),
            "--methods",
            "ar,sparkling,dspark",
            "--budgets",
            "2",
            "--lookup",
            "AUTO,off,16",
            "--lookup-drafter",
            "Always",
            "--max-new-tokens",
            "4",
            "--json",
            s(&json),
            "--save-tokens",
            s(&saved),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("note: sparkling at budget 2 with lookup 16 always is listed more than once"), "{}", stderr(&o));
    // `--save-tokens`: the prompt's ids and the answer every row emitted (4 tokens, no stop).
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    let seqs = v["sequences"].as_array().unwrap();
    assert_eq!(seqs.len(), 1);
    assert_eq!(seqs[0]["file"].as_str(), Some(s(&prompts)));
    assert!(!seqs[0]["prompt"].as_array().unwrap().is_empty() && seqs[0]["answer"].as_array().unwrap().len() == 4, "{v}");
    // The same file spelt two ways, before it exists, is refused.
    let fresh = d.path().join("fresh.json");
    let dotted = d.path().join(".").join("fresh.json");
    let o = run(
        d.path(),
        &["bench", "--target", s(&t4), "--tokenizer", s(&tok), "--prompts", s(&prompts), "--methods", "ar", "--json", s(&fresh), "--save-tokens", s(&dotted)],
    );
    no_panic(&o);
    assert!(o.status.code() == Some(1) && stderr(&o).contains("give them different files") && !fresh.exists(), "{}", stderr(&o));
    let o = run(
        d.path(),
        &["bench", "--target", s(&t4), "--tokenizer", s(&tok), "--prompts", s(&prompts), "--methods", "ar", "--batch", "2", "--save-tokens", s(&saved)],
    );
    no_panic(&o);
    assert!(o.status.code() == Some(1) && stderr(&o).contains("--save-tokens writes the answers of the one-sequence bench"), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows: Vec<(String, String)> =
        v["rows"].as_array().unwrap().iter().map(|r| (r["method"].as_str().unwrap().to_string(), r["lookup"].as_str().unwrap().to_string())).collect();
    let want = [("ar", "-"), ("sparkling", "16 always"), ("sparkling", "off"), ("dspark", "off"), ("dspark", "16 always")];
    assert_eq!(rows, want.map(|(m, l)| (m.to_string(), l.to_string())), "{}", stderr(&o));
}

#[test]
fn options_no_method_reads_are_refused_naming_option_and_method() {
    let d = tmpdir("cli-unused");
    let t = tiny_target(d.path(), "tiny", 4);
    let prompts = d.path().join("p.txt");
    std::fs::write(&prompts, "hi\n").unwrap();
    let drafter = d.path().join("drafter");
    let gen = |method: &'static str| vec!["generate", "--target", s(&t), "--prompt-ids", "1,2,3", "--max-new-tokens", "2", "--method", method];
    let bench = |methods: &'static str| vec!["bench", "--target", s(&t), "--prompts", s(&prompts), "--max-new-tokens", "2", "--methods", methods];
    let cases: Vec<(Vec<&str>, [&str; 2], &str, &str)> = vec![
        (gen("ar"), ["--budget", "4"], "--method ar", "dflash, ddtree, dspark, sparkling, treespark"),
        (gen("ar"), ["--tree-prep", "host"], "--method ar", "dflash"),
        (gen("ar"), ["--drafter", s(&drafter)], "--method ar", "dflash"),
        (gen("ddtree"), ["--candidates", "8"], "--method ddtree", "only sparkling read it"),
        (gen("dflash"), ["--max-fanout", "8"], "--method dflash", "only sparkling read it"),
        (gen("sparkling"), ["--treespark-k", "2"], "--method sparkling", "only treespark read it"),
        (bench("ar"), ["--budgets", "4"], "--methods ar", "ddtree"),
        (bench("ar,ddtree"), ["--treespark-k", "2"], "--methods ar,ddtree", "only treespark read it"),
    ];
    for (mut a, option, chosen, readers) in cases {
        a.extend(option);
        let o = run(d.path(), &a);
        no_panic(&o);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{a:?}: {e}");
        assert!(e.contains(&format!("{} is not used by {chosen}", option[0])) && e.contains(readers), "{a:?}: {e}");
    }
    // A method that reads the option accepts it; bench accepts it when any listed method reads
    // it (and then stops later, for want of a tokenizer for its text prompts).
    for (mut a, ok) in [(gen("treespark"), true), (bench("ar,treespark"), false)] {
        a.extend(["--treespark-k", "2", "--tree-prep", "host"]);
        let o = run(d.path(), &a);
        let e = stderr(&o);
        assert!(if ok { o.status.success() } else { e.contains("bench needs a tokenizer") }, "{a:?}: {e}");
    }
    // --no-confidence: read by the DSpark-drafter methods, under an auto budget only (`AUTO`
    // parses as auto).
    let no_conf: Vec<(Vec<&str>, &[&str], Option<&str>)> = vec![
        (gen("dflash"), &["--no-confidence"], Some("--no-confidence is not used by --method dflash: only dspark, sparkling, treespark read it")),
        (gen("sparkling"), &["--budget", "4", "--no-confidence"], Some("--no-confidence is read by --budget auto only")),
        (bench("ar,dspark"), &["--budgets", "4,8", "--no-confidence"], Some("--no-confidence is read by `--budgets auto` only")),
        (gen("sparkling"), &["--budget", "AUTO", "--no-confidence"], None),
    ];
    for (mut a, extra, want) in no_conf {
        a.extend(extra);
        let o = run(d.path(), &a);
        no_panic(&o);
        let e = stderr(&o);
        match want {
            Some(w) => assert!(o.status.code() == Some(1) && e.contains(w), "{a:?}: {e}"),
            None => assert!(o.status.success(), "{a:?}: {e}"),
        }
    }
    // --system belongs to --chat.
    let mut a = gen("ar");
    a.extend(["--system", "be brief"]);
    let o = run(d.path(), &a);
    no_panic(&o);
    assert!(!o.status.success() && stderr(&o).contains("--chat"), "{}", stderr(&o));
    // Sampling options do nothing at temperature 0 (greedy).
    for (opt, v) in [("--top-k", "5"), ("--top-p", "0.5"), ("--seed", "3")] {
        let mut a = gen("ar");
        a.extend([opt, v]);
        let o = run(d.path(), &a);
        no_panic(&o);
        assert!(!o.status.success() && stderr(&o).contains(&format!("{opt} has no effect at --temperature 0")), "{opt}: {}", stderr(&o));
        a.extend(["--temperature", "0.7"]);
        let o = run(d.path(), &a);
        assert!(o.status.success(), "{opt} with a temperature: {}", stderr(&o));
    }
    // A negative temperature is refused before loading, naming the option; a negative count
    // gets clap's "invalid value" (not "unexpected argument").
    for (opt, v, want) in [("--temperature", "-0.5", "--temperature -0.5: expected a finite value ≥ 0"), ("--top-k", "-1", "invalid value '-1' for '--top-k")]
    {
        let mut a = gen("ar");
        a.extend([opt, v]);
        let o = run(d.path(), &a);
        no_panic(&o);
        assert!(!o.status.success() && stderr(&o).contains(want) && !stderr(&o).contains("target:"), "{opt} {v}: {}", stderr(&o));
    }
    // A drafter the method does not read, or a second one of a kind, is refused by name.
    let dflash = d.path().join("dflash");
    let init = DrafterInit { kind: DrafterKind::DFlash, layers: 1, block_size: 4, markov_rank: 0, taps: 2, mask_token_id: None, confidence_head: false };
    write_random_drafter(&dflash, &tiny_target_config(Arch::Qwen3, 64), &init, 1, StoreDtype::F32).unwrap();
    let mut a = gen("dspark");
    a.extend(["--drafter", s(&dflash)]);
    let o = run(d.path(), &a);
    no_panic(&o);
    assert!(!o.status.success() && stderr(&o).contains("a DFlash drafter, but the chosen methods read only DSpark"), "{}", stderr(&o));
    let mut a = gen("dflash");
    a.extend(["--drafter", s(&dflash), "--drafter", s(&dflash)]);
    let o = run(d.path(), &a);
    assert!(!o.status.success() && stderr(&o).contains("a second DFlash drafter"), "{}", stderr(&o));
}

// ---- path arguments mean exactly the file they name ----------------------------------------
