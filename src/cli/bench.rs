//! `sparkling bench`: a prompt set × methods × budgets → a table on stdout and a JSON file with
//! τ, tokens/s, per-round stage times and per-depth acceptance.

use super::generate::{gen_params, Decoding};
use super::load::{Loaded, ModelArgs};
use super::options::{lenient, MethodArg, TreeArgs};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use sparkling::core::Backend;
use sparkling::decode::budget::BudgetChoice;
use sparkling::decode::stats::count;
use sparkling::decode::{GenParams, Method, Stats};
use sparkling::{Error, Result};
use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Arguments of `bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt files (repeatable): MT-Bench / EAGLE-Alpaca `question.jsonl` (first turns),
    /// HumanEval `HumanEval.jsonl[.gz]`, GSM8K-style `{"question"}` JSONL, MATH-500
    /// `{"problem"}`, MBPP `mbpp.jsonl` (test split, task ids 11–510), or plain text (one prompt
    /// per line).
    #[arg(long, required = true)]
    pub prompts: Vec<PathBuf>,
    /// Prompts taken from each file.
    #[arg(long, allow_negative_numbers = true, default_value_t = 4)]
    pub limit: usize,
    /// Methods, comma-separated (`lookup`, the drafter-free prompt-lookup chain, is available
    /// but not in the default list, which holds the published methods).
    #[arg(long, value_delimiter = ',', default_value = "ar,dflash,ddtree,dspark,sparkling,treespark", value_parser = lenient::<MethodArg>())]
    pub methods: Vec<MethodArg>,
    /// Budgets, comma-separated: numbers and/or `auto` (the per-round choice of `generate
    /// --budget auto`); each tree/chain method runs at every budget, ar once. Every prompt
    /// runs all (method, budget) pairs before the next prompt (interleaved, so machine-load
    /// drift hits every row alike). Default: 64 (`lookup`: its own chain limit, 16).
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    pub budgets: Option<Vec<String>>,
    /// Maximum new tokens per prompt.
    #[arg(long, allow_negative_numbers = true, default_value_t = 128)]
    pub max_new_tokens: usize,
    /// Sampling temperature.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    pub temperature: f32,
    /// RNG seed.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub tree: TreeArgs,
    /// Write results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write each prompt's token ids and the first run's answer ids as JSON here
    /// (`{"temperature", "sequences": [{"file", "prompt", "answer"}]}`; at T = 0 every method
    /// emits these answers, at T > 0 every method with the same seed): the input of
    /// `scripts/lookup-tau.py --bench`, which replays prompt-lookup rules over them.
    #[arg(long)]
    pub save_tokens: Option<PathBuf>,
    /// Batch decoding: decode the prompt set N sequences at a time (continuous batching: one
    /// target forward per step over every sequence in flight, tree methods verifying one tree
    /// block per sequence), one row per method × budget × `--lookup` value × N (`ar`: per N;
    /// comma-separated, e.g. 1,2,4,8,16): aggregate tokens/s, τ, per-sequence latency. Under
    /// `--budgets auto` each sequence runs its own policy, its tree rows priced at their cost in
    /// the batch's shared forward.
    #[arg(long, allow_negative_numbers = true, value_delimiter = ',')]
    pub batch: Vec<usize>,
}

/// Read prompts (as chat messages) from a file in one of the supported formats.
pub fn read_prompts(path: &Path, limit: usize) -> Result<Vec<String>> {
    read_prompts_with(path, limit, |_| None)
}

/// Longest prompt line accepted from a prompt file, bytes (a 1 M-token context is ~4 MB).
const MAX_PROMPT_BYTES: usize = 8 << 20;

/// [`read_prompts`], with `fallback` giving the prompt of a JSON line in none of the bench
/// formats (`None`: the line is an error naming the expected fields). Plain-text files (one
/// prompt per line) and gzip (`.gz`) are read as by `bench`.
pub fn read_prompts_with(path: &Path, limit: usize, fallback: impl Fn(&serde_json::Value) -> Option<String>) -> Result<Vec<String>> {
    let mut raw = Vec::new();
    std::fs::File::open(path).and_then(|mut f| f.read_to_end(&mut raw)).map_err(|e| Error::file(path, e.to_string()))?;
    // gzip by its magic bytes, whatever the file is called.
    let text = if path.extension().is_some_and(|e| e == "gz") || raw.starts_with(&[0x1f, 0x8b]) {
        let mut s = String::new();
        flate2::read::GzDecoder::new(&raw[..]).read_to_string(&mut s).map_err(|e| Error::file(path, format!("bad gzip: {e}")))?;
        s
    } else {
        String::from_utf8(raw).map_err(|_| Error::file(path, "not UTF-8 text"))?
    };
    // A JSON-lines file holds one JSON object per line: any other line is an error, not a prompt.
    let stem = path.file_name().map(|n| n.to_string_lossy().trim_end_matches(".gz").to_ascii_lowercase()).unwrap_or_default();
    let json_lines = stem.ends_with(".jsonl") || stem.ends_with(".json");
    let mut out = Vec::new();
    // Line numbers count every line of the file, blank ones included (as an editor shows them).
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        if out.len() >= limit {
            break;
        }
        // No context holds a prompt this long, and tokenizing one allocates many times its size
        // (issue 15: a 200 MB line, 200 KB gzipped, aborted on allocation).
        if line.len() > MAX_PROMPT_BYTES {
            return Err(Error::file(
                path,
                format!("line {}: {} bytes, more than any context holds (at most {MAX_PROMPT_BYTES} bytes a prompt)", i + 1, line.len()),
            ));
        }
        if !line.trim_start().starts_with('{') {
            if json_lines {
                return Err(Error::file(path, format!("line {}: expected a JSON object (one per line of a JSON-lines file)", i + 1)));
            }
            out.push(line.to_string());
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| {
            // serde counts within the line: give the file's line and the column.
            let msg = e.to_string();
            let msg = msg.rsplit_once(" at line ").map_or(msg.as_str(), |(m, _)| m).to_string();
            Error::file(path, format!("line {}, column {}: invalid JSON: {msg}", i + 1, e.column()))
        })?;
        match bench_prompt(&v) {
            Some(Some(p)) => out.push(p),
            Some(None) => continue,
            None => match fallback(&v) {
                Some(p) => out.push(p),
                None => {
                    return Err(Error::file(
                        path,
                        format!("line {}: expected a `turns`, `prompt`+`task_id`, `question`, `problem` (MATH) or `text`+`test_list` (MBPP) field", i + 1),
                    ))
                }
            },
        }
    }
    if out.is_empty() {
        return Err(Error::file(path, "no prompts found"));
    }
    Ok(out)
}

/// The prompt of one JSON line in a bench format: `Some(Some(prompt))`, `Some(None)` for a line
/// the format leaves out (MBPP outside its test split), `None` for none of the formats.
fn bench_prompt(v: &serde_json::Value) -> Option<Option<String>> {
    let s = |k: &str| v.get(k).and_then(|x| x.as_str());
    Some(Some(if let Some(t) = v.get("turns").and_then(|t| t.get(0)).and_then(|t| t.as_str()) {
        t.to_string()
    } else if let (Some(p), Some(_)) = (s("prompt"), v.get("task_id")) {
        // HumanEval, formatted as in the DDTree benchmark (reference §6.2).
        format!("Write a solution to the following problem and make sure that it passes the tests:\n```python\n{p}\n```")
    } else if let Some(q) = s("question") {
        format!("{q}\nPlease reason step by step, and put your final answer within \\boxed{{}}.")
    } else if let Some(q) = s("problem") {
        // MATH-500: the GSM8K instruction.
        format!("{q}\nPlease reason step by step, and put your final answer within \\boxed{{}}.")
    } else if let (Some(t), Some(tests)) = (s("text"), v.get("test_list").and_then(|x| x.as_array())) {
        // MBPP: only the test split (task ids 11–510); the prompt of the MBPP paper.
        let id = v.get("task_id").and_then(|x| x.as_u64()).unwrap_or(0);
        if !(11..=510).contains(&id) {
            return Some(None);
        }
        let tests: Vec<&str> = tests.iter().filter_map(|x| x.as_str()).collect();
        format!("{t} Your code should pass these tests:\n\n{}", tests.join("\n"))
    } else {
        return None;
    }))
}

/// The parsed `--budgets` (default: 64; `lookup` then runs at its own default chain length).
/// Errors name `--budgets` ([`BudgetChoice::parse`]).
fn budget_choices(a: &BenchArgs) -> Result<Vec<BudgetChoice>> {
    match &a.budgets {
        Some(b) => b.iter().map(|b| BudgetChoice::parse(b, "--budgets")).collect(),
        None => Ok(vec![BudgetChoice::Fixed(64)]),
    }
}

/// The `--lookup` values (`[None]`: each method's default).
fn lookup_choices(a: &BenchArgs) -> Vec<Option<String>> {
    match &a.tree.lookup {
        Some(l) => l.iter().map(|x| Some(x.clone())).collect(),
        None => vec![None],
    }
}

/// A run's lookup column: `-` without a drafter, `off`, or the chain length and the drafter
/// policy (`4 fallback`, `8 always`).
pub(super) fn lookup_label(meth: Method, p: &GenParams) -> String {
    match (meth.drafter_kind(), p.lookup.len) {
        (None, _) => "-".into(),
        (Some(_), 0) => "off".into(),
        (Some(_), n) => format!("{n} {}", if p.lookup.skip_drafter { "fallback" } else { "always" }),
    }
}

/// `p` with its directory resolved (so `x.json`, `./x.json` and `d/../x.json` compare equal
/// before the file exists), or `p` itself when the directory cannot be resolved.
fn resolved(p: &std::path::Path) -> PathBuf {
    let dir = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    match (std::fs::canonicalize(dir), p.file_name()) {
        (Ok(d), Some(name)) => d.join(name),
        _ => p.to_path_buf(),
    }
}

/// Run `bench` on the backend named by `--backend`.
pub fn run(a: BenchArgs) -> Result<()> {
    let mut a = a;
    let mut sizes = std::collections::HashSet::new();
    let listed = a.batch.len();
    a.batch.retain(|n| sizes.insert(*n));
    if a.batch.len() < listed {
        eprintln!("note: a --batch size is listed more than once; each runs once");
    }
    // The same prompt file twice (also through another path) would run its prompts twice.
    let mut kept: Vec<PathBuf> = Vec::new();
    for p in std::mem::take(&mut a.prompts) {
        match kept.iter().find(|k| *k == &p || sparkling::fsio::same_file(k, &p)) {
            Some(k) => eprintln!("note: --prompts {} is the file {} listed before; its prompts run once", p.display(), k.display()),
            None => kept.push(p),
        }
    }
    a.prompts = kept;
    let methods: Vec<Method> = a.methods.iter().map(|&m| m.into()).collect();
    let names: Vec<&str> = methods.iter().map(|m| m.name()).collect();
    let options = a.tree.given("--budgets", a.budgets.is_some(), !a.model.drafter.is_empty());
    if a.tree.no_confidence && !budget_choices(&a)?.contains(&BudgetChoice::Auto) {
        return Err(Error::Input("--no-confidence is read by `--budgets auto` only: add auto to --budgets, or leave --no-confidence out".into()));
    }
    a.tree.note_no_confidence();
    if a.batch.is_empty() {
        super::refuse_unused_options(&options, &methods, &format!("--methods {}", names.join(",")))?;
    } else {
        super::refuse_unused_options(&options, &methods, &format!("--batch with --methods {}", names.join(",")))?;
    }
    // Refuse bad values before loading anything.
    super::refuse_greedy_sampling_options(a.temperature, None, None, a.seed)?;
    budget_choices(&a)?;
    if let Some(&n) = a.batch.iter().find(|&&n| n == 0 || n > 1024) {
        return Err(Error::Input(format!("--batch {n}: expected 1..=1024 sequences per target forward")));
    }
    a.tree.check_counts()?;
    // Each --lookup value on its own (the drafter policy is checked below, per run).
    for l in lookup_choices(&a) {
        super::generate::lookup_graft(Method::Sparkling, l.as_deref(), None, &sparkling::decode::Platform::HOST)?;
    }
    if let Some(d) = a.tree.lookup_drafter {
        // Some run must graft a chain for it to act on (whether one is grafted does not depend
        // on the backend, only its length does).
        let mut chained = false;
        for meth in methods.iter().filter(|m| m.drafter_kind().is_some()) {
            for l in lookup_choices(&a) {
                chained |= super::generate::lookup_graft(*meth, l.as_deref(), None, &sparkling::decode::Platform::HOST)?.len > 0;
            }
        }
        if !chained {
            return Err(Error::Input(format!(
                "--lookup-drafter {} is read by drafter runs with a lookup chain, and no run here has one (--lookup off, or no sparkling in --methods): add one, or leave --lookup-drafter out",
                d.name()
            )));
        }
    }
    if a.save_tokens.is_some() && !a.batch.is_empty() {
        return Err(Error::Input("--save-tokens writes the answers of the one-sequence bench: leave out --batch".into()));
    }
    if a.limit == 0 {
        return Err(Error::Input("--limit 0: expected at least 1 prompt per --prompts file".into()));
    }
    for (j, opt) in [(&a.json, "--json"), (&a.save_tokens, "--save-tokens")] {
        let Some(j) = j else { continue };
        sparkling::fsio::check_writable(j, opt)?; // fail before the benchmark, not after
        if let Some(p) = a.prompts.iter().find(|p| sparkling::fsio::same_file(p, j)) {
            return Err(Error::Input(format!(
                "{opt} {} is the --prompts file {}: the results would replace the prompts; choose another output file",
                j.display(),
                p.display()
            )));
        }
    }
    if let (Some(j), Some(t)) = (&a.json, &a.save_tokens) {
        if sparkling::fsio::same_file(j, t) || resolved(j) == resolved(t) {
            return Err(Error::Input(format!("--json and --save-tokens are both {}: give them different files", j.display())));
        }
    }
    // The prompt files are read before the models load: a missing or empty file fails at once.
    let mut texts: Vec<(String, String)> = Vec::new();
    for f in &a.prompts {
        texts.extend(read_prompts(f, a.limit)?.into_iter().map(|p| (f.display().to_string(), p)));
    }
    let mut kinds: Vec<_> = methods.iter().filter_map(|m| m.drafter_kind()).collect();
    kinds.sort_by_key(|k| format!("{k:?}"));
    kinds.dedup();
    with_loaded!(&a.model, &kinds, |m| bench(m, &methods, &a, &texts))
}

/// `bench` on a loaded model, any backend; `texts`: (prompt file, prompt) in run order.
fn bench<B: Backend>(m: Loaded<B>, methods: &[Method], a: &BenchArgs, texts: &[(String, String)]) -> Result<()> {
    let tok = m.tokenizer.as_ref().ok_or_else(|| Error::Input("bench needs a tokenizer (pass --tokenizer)".into()))?;
    let mut prompts = Vec::new();
    let mut prompt_files = Vec::new();
    for (f, p) in texts {
        prompts.push(tok.encode_chat(p, None)?);
        prompt_files.push(f.clone());
    }
    let stop = sparkling::decode::stop_tokens(&m.models.target.cfg.eos, &tok.stop);
    let budgets = budget_choices(a)?;
    // (method, budget, --lookup value): drafter methods at every budget × lookup value.
    let mut runs: Vec<(Method, BudgetChoice, Option<String>)> = Vec::new();
    let platform = sparkling::decode::Platform::of(&m.backend);
    for &meth in methods {
        if meth == Method::Ar {
            runs.push((meth, BudgetChoice::Fixed(0), None));
        } else if meth == Method::Lookup && a.budgets.is_none() {
            // Without --budgets: lookup's own default chain (the bench default of 64 suits
            // trees; a 64-token chain is mostly rejected rows).
            runs.push((meth, BudgetChoice::Fixed(platform.default_budget(meth)), None));
        } else if meth == Method::Lookup {
            runs.extend(budgets.iter().map(|&b| (meth, b, None)));
        } else {
            for &b in &budgets {
                runs.extend(lookup_choices(a).into_iter().map(|l| (meth, b, l)));
            }
        }
    }
    // Each run's parameters: the shared arguments, its budget and its lookup value.
    let run_params = |meth: Method, budget: BudgetChoice, lookup: &Option<String>| -> Result<GenParams> {
        let budget = match budget {
            BudgetChoice::Fixed(n) => BudgetChoice::Fixed(n.max(1)),
            auto => auto,
        };
        // `--lookup-drafter` applies to the runs with a chain (`--lookup auto,off` with it
        // compares that policy against the drafter alone).
        let chain = meth.drafter_kind().is_some() && super::generate::lookup_graft(meth, lookup.as_deref(), None, &platform)?.len > 0;
        let tree = TreeArgs { lookup_drafter: a.tree.lookup_drafter.filter(|_| chain), ..a.tree.clone() };
        let dec = Decoding {
            sampling: sparkling::core::SampleParams { temperature: a.temperature, top_k: 0, top_p: 1.0 },
            seed: a.seed,
            max_new_tokens: a.max_new_tokens,
            stop: stop.clone(),
        };
        let mut params = gen_params(meth, Some(budget), &tree, lookup.as_deref(), dec, &platform)?;
        super::bound_tree(&mut params.tree, m.models.target.cfg.vocab, meth);
        Ok(params)
    };
    // A run listed twice (`--budgets 3,3`, or `--lookup auto,16` where auto means 16) runs once.
    let mut seen = std::collections::HashSet::new();
    let mut unique = Vec::with_capacity(runs.len());
    let mut noted = std::collections::HashSet::new();
    for (meth, budget, lookup) in runs {
        let p = run_params(meth, budget, &lookup)?;
        // What the run does: `lookup`'s auto is its fixed chain length.
        let b = match meth {
            Method::Ar => "-".to_string(),
            Method::Lookup => platform.lookup_chain_len(&p).to_string(),
            _ => budget.name(),
        };
        let key = (meth.name(), b, lookup_label(meth, &p));
        if seen.insert(key.clone()) {
            unique.push((meth, budget, lookup));
        } else if noted.insert(key.clone()) {
            let what = match (meth, key.2.as_str()) {
                (Method::Ar, _) => "ar".to_string(),
                (_, "-") => format!("{} at budget {}", key.0, key.1),
                (_, l) => format!("{} at budget {} with lookup {l}", key.0, key.1),
            };
            eprintln!("note: {what} is listed more than once; it runs once");
        }
    }
    let runs = unique;
    let pb = ProgressBar::new((runs.len() * prompts.len()) as u64);
    pb.set_style(ProgressStyle::with_template("{msg:28} [{bar:30}] {pos}/{len} {elapsed}").unwrap_or_else(|_| ProgressStyle::default_bar()));
    let cost_path = super::costs::cache_path(&a.model, &m.target_path, &m.backend.name());
    if !a.batch.is_empty() {
        pb.finish_and_clear();
        let mut batch_runs = Vec::new();
        for (meth, budget, lookup) in &runs {
            let mut params = run_params(*meth, *budget, lookup)?;
            super::costs::attach(&mut params, &cost_path);
            let label = match lookup_label(*meth, &params).as_str() {
                "-" | "off" => budget.name(),
                l => format!("{}, lookup {l}", budget.name()),
            };
            batch_runs.push((label, params));
        }
        return super::bench_batch::bench_batch(&m, &prompts, &batch_runs, a);
    }
    let mut reference: Vec<Option<Vec<u32>>> = vec![None; prompts.len()];
    let mut params_of = Vec::new();
    for (meth, budget, lookup) in &runs {
        let mut params = run_params(*meth, *budget, lookup)?;
        super::costs::attach(&mut params, &cost_path);
        params_of.push(params);
    }
    let mut totals: Vec<(Stats, usize)> = vec![(Stats::default(), 0); runs.len()];
    // Interleaved: prompt-major, every (method, budget, lookup) on a prompt before the next prompt.
    for (i, p) in prompts.iter().enumerate() {
        for (ri, &(meth, budget, _)) in runs.iter().enumerate() {
            pb.set_message(format!("{} b{}", meth.name(), budget.name()));
            let engine = m.models.engine(&m.backend, meth)?;
            let g = engine.generate(p, &params_of[ri], &mut |_| {})?;
            // `auto` rows keep learning across prompts (calibration, timings, skip schedule),
            // as a server would across requests.
            if let (Some(ab), Some(st)) = (params_of[ri].auto_budget.as_mut(), g.auto_state.clone()) {
                ab.resume = Some(st);
            }
            if let Some(c) = &g.cost_model {
                // Measured once: every auto row uses it from now on, and later runs find it cached.
                super::costs::save(&cost_path, c);
                for q in params_of.iter_mut() {
                    if let Some(ab) = q.auto_budget.as_mut() {
                        ab.cost.get_or_insert_with(|| c.clone());
                    }
                }
            }
            match &reference[i] {
                None => reference[i] = Some(g.tokens.clone()),
                Some(r) if *r != g.tokens => totals[ri].1 += 1,
                _ => {}
            }
            totals[ri].0.merge(&g.stats);
            pb.inc(1);
        }
    }
    if let Some(path) = &a.save_tokens {
        let seqs: Vec<serde_json::Value> = prompt_files
            .iter()
            .zip(&prompts)
            .zip(&reference)
            .map(|((f, p), r)| serde_json::json!({"file": f, "prompt": p, "answer": r.as_deref().unwrap_or_default()}))
            .collect();
        let v = serde_json::json!({"temperature": a.temperature, "seed": a.seed, "max_new_tokens": a.max_new_tokens, "sequences": seqs});
        sparkling::fsio::write_bytes(path, v.to_string().as_bytes())?;
        eprintln!("wrote {}", path.display());
    }
    let results: Vec<(Method, BudgetChoice, String, Stats, usize)> =
        runs.iter().zip(totals).zip(&params_of).map(|((&(m, b, _), (s, x)), p)| (m, b, lookup_label(m, p), s, x)).collect();
    pb.finish_and_clear();
    let ar_tps = results.iter().find(|r| r.0 == Method::Ar).map(|r| r.3.tokens_per_s());
    let mut table = String::new();
    let _ =
        writeln!(table, "{}, {} max, T={}, backend {}", count(prompts.len(), "prompt"), count(a.max_new_tokens, "new token"), a.temperature, m.backend.name());
    let _ = writeln!(table, "| method | budget | lookup | τ | tok/s | vs ar | draft ms | prep ms | heap ms | verify ms | accept ms | compact ms | ≠ first run | tree sizes (nodes: rounds) | lookup rounds (τ there) | drafter ran (ms each) |");
    let _ = writeln!(table, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut json_rows = Vec::new();
    for (meth, budget, lookup, s, mism) in &results {
        let [d, p, h, v, ac, c] = s.per_round_ms();
        // `None` (JSON null, table "–") when the run has no `ar` row to compare with.
        let speed = ar_tps.map(|x| s.tokens_per_s() / x).filter(|x| x.is_finite());
        let _ = writeln!(
            table,
            "| {} | {} | {lookup} | {} | {} | {} | {d:.2} | {p:.2} | {h:.3} | {v:.2} | {ac:.3} | {c:.3} | {mism} | {} | {} | {} |",
            meth.name(),
            if *meth == Method::Ar { "-".to_string() } else { budget.name() },
            // No round ran (every answer was the prefill's one token): no τ and no decode rate
            // to show.
            if s.rounds == 0 { "–".to_string() } else { format!("{:.2}", s.tau()) },
            if s.rounds == 0 { "–".to_string() } else { format!("{:.1}", s.tokens_per_s()) },
            speed.filter(|_| s.rounds > 0).map_or_else(|| "–".to_string(), |x| format!("{x:.2}×")),
            // Tree sizes: "-" for `ar` (no tree), "–" where no round ran.
            super::generate::size_histogram(s).unwrap_or_else(|| if *meth == Method::Ar { "-" } else { "–" }.into()),
            // "-" where the method has no lookup chain or no drafter; a count (0 included) else.
            match s.lookup_tau() {
                _ if *meth != Method::Lookup && (lookup == "-" || lookup == "off") => "-".to_string(),
                Some(t) => format!("{} of {} ({t:.2})", s.lookup_rounds, s.rounds),
                None => format!("0 of {}", s.rounds),
            },
            match s.drafter_ms_per_run() {
                _ if meth.drafter_kind().is_none() => "-".to_string(),
                Some(d) => format!("{} of {} ({d:.2})", s.drafter_rounds, s.rounds),
                None => format!("0 of {}", s.rounds),
            },
        );
        let budget_json = match budget {
            BudgetChoice::Auto => serde_json::json!("auto"),
            BudgetChoice::Fixed(n) => serde_json::json!(n),
        };
        let auto_json = s.predicted_vs_observed_tau().map(|(pred, obs)| {
            serde_json::json!({"predicted_tau": pred, "observed_tau": obs, "prediction_rmse": s.prediction_rmse(), "drafts_skipped": s.drafts_skipped, "policy_us_per_round": s.policy_us_per_round()})
        });
        json_rows.push(serde_json::json!({
            "method": meth.name(), "budget": budget_json, "lookup": lookup, "auto": auto_json, "tau": (s.rounds > 0).then(|| s.tau()), "tokens_per_s": s.tokens_per_s(),
            "speedup_vs_ar": speed, "per_round_ms": {"draft": d, "prep": p, "heap": h, "verify": v, "accept": ac, "compact": c},
            "drafter_ms_per_run": s.drafter_ms_per_run(),
            "conditional_acceptance": s.conditional_acceptance(), "outputs_differing_from_first_run": mism, "stats": s,
        }));
    }
    dash_legend(&mut table);
    let v = serde_json::json!({"prompts": prompts.len(), "max_new_tokens": a.max_new_tokens, "temperature": a.temperature, "rows": json_rows});
    super::save_json_then_print(a.json.as_deref(), &v, &table)
}

/// Append the key to a bench table's two dashes when it shows either: "-" where a column does
/// not apply to the row's method or its settings (`ar`'s budget, a method without a drafter,
/// lookup off), "–" where it has no value in this run (no decode round ran, no `ar` row to
/// compare with).
pub(super) fn dash_legend(table: &mut String) {
    let (na, none) = (table.contains("| - |"), table.contains("| – |"));
    if na || none {
        let mut key = Vec::new();
        if na {
            key.push("- = does not apply to the method or its settings");
        }
        if none {
            key.push("– = no value in this run (no decode round, or no ar row to compare with)");
        }
        table.push_str(&format!("{}\n", key.join("; ")));
    }
}
