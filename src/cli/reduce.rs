//! `sparkling reduce-vocab`: count the target's own generated tokens and write a drafter whose
//! output layer and Markov `W2` cover only the V_d most frequent of them (issue 12).
//!
//! Counts come from the target's greedy answers (what a drafter must predict), from any of:
//! - `--prompts FILE` (JSON lines with a `prompt` / `question` / `instruction` / `text` /
//!   `problem` / `turns[0]` field, or plain text): answered here with `ar` (chat template,
//!   T = 0); evaluation sets are refused by name, so a draft vocabulary is never fitted to the
//!   prompts it is then measured on;
//! - `--cache DIR`: a `sparkling-train gen-data` cache (its answer tokens; no target run);
//! - `--counts FILE`: counts saved by an earlier run with `--save-counts`.

use super::load::{Loaded, ModelArgs};
use super::options::{lenient, DtypeArg};
use clap::Args;
use sparkling::core::Backend;
use sparkling::decode::{Engine, GenParams, Method};
use sparkling::fsio::{check_out_dir, check_writable, write_bytes};
use sparkling::model::reduce::{coverage, top_ids, write_reduced_drafter};
use sparkling::model::synth::StoreDtype;
use sparkling::{Error, Result};
use std::path::{Path, PathBuf};

/// Arguments of `reduce-vocab`.
#[derive(Args, Debug)]
pub struct ReduceVocabArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The full-vocabulary drafter directory to reduce (omit with --count-only).
    #[arg(long = "from")]
    pub from: Option<PathBuf>,
    /// Output drafter directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Draft vocabulary size V_d (the most frequent counted tokens; the target's stop tokens
    /// are always kept).
    #[arg(long, allow_negative_numbers = true, default_value_t = 8192)]
    pub draft_vocab: usize,
    /// Training prompt files to answer with the target and count (repeatable).
    #[arg(long)]
    pub prompts: Vec<PathBuf>,
    /// Prompts answered per file.
    #[arg(long, allow_negative_numbers = true, default_value_t = 100)]
    pub limit: usize,
    /// Answer tokens per prompt.
    #[arg(long, allow_negative_numbers = true, default_value_t = 256)]
    pub max_new_tokens: usize,
    /// Training prompt files whose prompt texts are tokenized (every line, no target run) to
    /// order the tokens the answers never or equally often produced (repeatable).
    #[arg(long)]
    pub tiebreak_prompts: Vec<PathBuf>,
    /// `sparkling-train gen-data` cache directories whose answer tokens are counted (repeatable).
    #[arg(long)]
    pub cache: Vec<PathBuf>,
    /// Counts saved by `--save-counts` (repeatable; added up).
    #[arg(long)]
    pub counts: Vec<PathBuf>,
    /// Save the counts (JSON) here, to reduce to other sizes without answering again.
    #[arg(long)]
    pub save_counts: Option<PathBuf>,
    /// Only count (and save); no drafter is written. Evaluation prompt files are allowed here
    /// (to measure a vocabulary's coverage on them, never to choose it).
    #[arg(long)]
    pub count_only: bool,
    /// Print the share of these counts (e.g. of evaluation answers, from --count-only) that the
    /// chosen draft vocabulary covers (repeatable).
    #[arg(long)]
    pub coverage_of: Vec<PathBuf>,
    /// Tensor storage of the written drafter.
    #[arg(long, default_value = "bf16", value_parser = lenient::<DtypeArg>())]
    pub dtype: DtypeArg,
    /// Replace the files of a checkpoint already in the output directory.
    #[arg(long)]
    pub force: bool,
}

/// Token counts over a vocabulary, with where they came from.
struct Counts {
    counts: Vec<u64>,
    /// Tie-break counts (tokens of training prompts).
    secondary: Vec<u64>,
    sources: Vec<String>,
}

impl Counts {
    fn add(&mut self, ids: &[u32], path: &Path) -> Result<()> {
        let v = self.counts.len();
        for &t in ids {
            let c = self.counts.get_mut(t as usize).ok_or_else(|| Error::file(path, format!("token id {t} is outside the vocabulary of {v}")))?;
            *c += 1;
        }
        Ok(())
    }
    fn total(&self) -> u64 {
        self.counts.iter().sum()
    }
    fn to_json(&self) -> serde_json::Value {
        let nz: Vec<(usize, u64)> = self.counts.iter().copied().enumerate().filter(|(_, c)| *c > 0).collect();
        let sz: Vec<(usize, u64)> = self.secondary.iter().copied().enumerate().filter(|(_, c)| *c > 0).collect();
        serde_json::json!({
            "vocab": self.counts.len(),
            "tokens": self.total(),
            "sources": self.sources,
            "ids": nz.iter().map(|x| x.0).collect::<Vec<_>>(),
            "counts": nz.iter().map(|x| x.1).collect::<Vec<_>>(),
            "tiebreak_ids": sz.iter().map(|x| x.0).collect::<Vec<_>>(),
            "tiebreak_counts": sz.iter().map(|x| x.1).collect::<Vec<_>>(),
        })
    }
}

/// Read counts saved by `--save-counts` into `c` (same vocabulary).
fn read_counts(path: &Path, c: &mut Counts) -> Result<()> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::file(path, format!("cannot read: {e}")))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::file(path, format!("invalid JSON: {e}")))?;
    let vocab = v.get("vocab").and_then(|x| x.as_u64()).ok_or_else(|| Error::file(path, "no `vocab` field (not a --save-counts file?)"))? as usize;
    if vocab != c.counts.len() {
        return Err(Error::file(path, format!("counts over a vocabulary of {vocab}, the target has {}", c.counts.len())));
    }
    for (ik, ck, secondary) in [("ids", "counts", false), ("tiebreak_ids", "tiebreak_counts", true)] {
        let empty = Vec::new();
        let ids = match v.get(ik) {
            None if secondary => &empty,
            x => x.and_then(|x| x.as_array()).ok_or_else(|| Error::file(path, format!("no `{ik}` array")))?,
        };
        let cs = match v.get(ck) {
            None if secondary => &empty,
            x => x.and_then(|x| x.as_array()).ok_or_else(|| Error::file(path, format!("no `{ck}` array")))?,
        };
        if ids.len() != cs.len() {
            return Err(Error::file(path, format!("`{ik}` and `{ck}` differ in length")));
        }
        let into = if secondary { &mut c.secondary } else { &mut c.counts };
        for (i, n) in ids.iter().zip(cs) {
            let (Some(i), Some(n)) = (i.as_u64(), n.as_u64()) else { return Err(Error::file(path, "non-integer id or count")) };
            let slot = into.get_mut(i as usize).ok_or_else(|| Error::file(path, format!("id {i} outside the vocabulary of {vocab}")))?;
            *slot += n;
        }
    }
    if let Some(s) = v.get("sources").and_then(|x| x.as_array()) {
        c.sources.extend(s.iter().filter_map(|x| x.as_str().map(str::to_string)));
    }
    Ok(())
}

/// The answer tokens of every `seq-*.bin` of a gen-data cache (format: train/src/cache.rs).
fn read_cache(dir: &Path, c: &mut Counts) -> Result<usize> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::file(dir, format!("cannot read cache directory: {e}")))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("seq-") && n.to_string_lossy().ends_with(".bin")))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::file(dir, "no seq-*.bin files: not a gen-data cache"));
    }
    let mut n = 0;
    for f in files {
        let b = std::fs::read(&f).map_err(|e| Error::file(&f, format!("cannot read: {e}")))?;
        let u = |i: usize| -> Option<u32> { b.get(i..i + 4).map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]])) };
        if b.get(..4) != Some(b"SPKD") {
            return Err(Error::file(&f, "not a gen-data sequence file (bad magic)"));
        }
        let (Some(prompt_len), Some(n_tokens)) = (u(12), u(16)) else { return Err(Error::file(&f, "truncated header")) };
        let ids: Option<Vec<u32>> = (prompt_len..n_tokens).map(|i| u(28 + 4 * i as usize)).collect();
        let ids = ids.ok_or_else(|| Error::file(&f, "truncated token list"))?;
        c.add(&ids, &f)?;
        n += ids.len();
    }
    Ok(n)
}

/// Prompts of a file: the bench formats first (MT-Bench turns, HumanEval, GSM8K questions,
/// gzip: coverage is measured on exactly the prompts `bench` runs), else a JSON line's
/// `prompt`, `question`, `instruction`, `text`, `problem` or `turns[0]`; plain text lines.
fn read_prompt_texts(path: &Path, limit: usize) -> Result<Vec<String>> {
    super::bench::read_prompts_with(path, limit, |v| {
        ["prompt", "question", "instruction", "text", "problem"].iter().find_map(|k| v.get(*k).and_then(|x| x.as_str())).map(str::to_string)
    })
}

/// Refuse prompt files that look like evaluation sets (the trainer's rule).
fn check_not_eval(path: &Path) -> Result<()> {
    let full = path.to_string_lossy().to_lowercase();
    let name = path.file_name().map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_default();
    for bad in ["mt_bench", "mt-bench", "humaneval", "test", "alpaca", "math500", "mbpp.jsonl"] {
        if name.contains(bad) || (bad == "math500" && full.contains(bad)) {
            return Err(Error::file(
                path,
                format!("looks like an evaluation set (`{bad}`): a draft vocabulary is counted on training prompts only (use --count-only to measure coverage on it)"),
            ));
        }
    }
    Ok(())
}

/// Run `reduce-vocab`.
pub fn run(a: ReduceVocabArgs) -> Result<()> {
    let dtype = StoreDtype::from(a.dtype);
    if a.count_only {
        // Nothing is written with --count-only: the writing options would be ignored.
        for (given, arg) in [
            (a.from.is_some(), "--from"),
            (a.out.is_some(), "--out"),
            (a.dtype != DtypeArg::Bf16, "--dtype"),
            (a.force, "--force"),
            (!a.model.drafter.is_empty(), "--drafter"),
        ] {
            if given {
                return Err(Error::Input(format!("{arg} is not used with --count-only (it only counts; no drafter is written)")));
            }
        }
    }
    if !a.count_only {
        let (Some(from), Some(out)) = (&a.from, &a.out) else {
            return Err(Error::Input("reduce-vocab needs --from (the full drafter) and --out, or --count-only".into()));
        };
        check_out_dir(out, a.force, "--out")?;
        // Before the prompts are answered (minutes): a --from that cannot be a drafter.
        if !from.join("config.json").is_file() {
            return Err(Error::file(from, "--from: expected the full drafter's directory (config.json + model.safetensors)"));
        }
        if sparkling::fsio::same_file(from, out) {
            return Err(Error::Input(format!("--out {} is the --from drafter: write the reduced drafter to another directory", out.display())));
        }
        if a.draft_vocab == 0 {
            return Err(Error::Input("--draft-vocab must be ≥ 1".into()));
        }
        for p in &a.prompts {
            check_not_eval(p)?;
        }
    }
    for p in &a.tiebreak_prompts {
        check_not_eval(p)?;
    }
    if a.prompts.is_empty() && a.cache.is_empty() && a.counts.is_empty() && a.tiebreak_prompts.is_empty() {
        return Err(Error::Input("nothing to count: give --prompts, --cache or --counts".into()));
    }
    if let Some(s) = &a.save_counts {
        check_writable(s, "--save-counts")?;
        // The counts never replace one of the run's inputs (issue 15 trial: prompts, counts, a
        // cache's files and the --from drafter's files were overwritten).
        let mut files = a.prompts.iter().chain(&a.tiebreak_prompts).chain(&a.counts).chain(&a.coverage_of);
        if let Some(p) = files.find(|p| sparkling::fsio::same_file(p, s)) {
            return Err(Error::Input(format!("--save-counts {} is an input of this run ({}); choose another file", s.display(), p.display())));
        }
        let mut dirs = a.cache.iter().chain(a.from.iter());
        if let Some(d) = dirs.find(|d| s.parent().is_some_and(|p| sparkling::fsio::same_file(p, d))) {
            return Err(Error::Input(format!("--save-counts {} is inside the input directory {}; choose another place", s.display(), d.display())));
        }
    }
    with_loaded!(&a.model, &[], |m| reduce(m, &a, dtype))
}

fn reduce<B: Backend>(m: Loaded<B>, a: &ReduceVocabArgs, dtype: StoreDtype) -> Result<()> {
    let vocab = m.models.target.cfg.vocab;
    let mut c = Counts { counts: vec![0; vocab], secondary: vec![0; vocab], sources: Vec::new() };
    for f in &a.counts {
        read_counts(f, &mut c)?;
    }
    for d in &a.cache {
        let n = read_cache(d, &mut c)?;
        c.sources.push(format!("gen-data cache {} ({n} answer tokens)", d.display()));
        eprintln!("counted {n} answer tokens of {}", d.display());
    }
    if !a.prompts.is_empty() {
        let tok = m.tokenizer.as_ref().ok_or_else(|| Error::Input("answering --prompts needs a tokenizer (pass --tokenizer)".into()))?;
        let stop = sparkling::decode::stop_tokens(&m.models.target.cfg.eos, &tok.stop);
        let mut p = GenParams::new(Method::Ar, &sparkling::decode::Platform::of(&m.backend));
        p.max_new_tokens = a.max_new_tokens;
        p.stop = stop;
        let engine = Engine { backend: &m.backend, target: &m.models.target, drafter: None };
        for f in &a.prompts {
            let texts = read_prompt_texts(f, a.limit)?;
            let t0 = std::time::Instant::now();
            let mut n = 0usize;
            for (i, t) in texts.iter().enumerate() {
                let ids = tok.encode_chat(t, None)?;
                let g = engine.generate(&ids, &p, &mut |_| {})?;
                c.add(&g.tokens, f)?;
                n += g.tokens.len();
                eprint!("\r{}: {}/{} prompts, {n} answer tokens, {:.0} s", f.display(), i + 1, texts.len(), t0.elapsed().as_secs_f64());
            }
            eprintln!();
            c.sources.push(format!(
                "{}: target greedy answers to the first {} prompts (chat template, ≤ {} tokens), {n} tokens",
                f.display(),
                texts.len(),
                a.max_new_tokens
            ));
        }
    }
    if !a.tiebreak_prompts.is_empty() {
        let tok = m.tokenizer.as_ref().ok_or_else(|| Error::Input("--tiebreak-prompts needs a tokenizer (pass --tokenizer)".into()))?;
        for f in &a.tiebreak_prompts {
            let texts = read_prompt_texts(f, usize::MAX)?;
            let mut n = 0usize;
            for t in &texts {
                for id in tok.encode_raw(t)? {
                    if let Some(s) = c.secondary.get_mut(id as usize) {
                        *s += 1;
                        n += 1;
                    }
                }
            }
            eprintln!("tie-break: {n} prompt tokens of {} prompts of {}", texts.len(), f.display());
            c.sources.push(format!("tie-break: prompt texts of {} ({} prompts, {n} tokens)", f.display(), texts.len()));
        }
    }
    if let Some(s) = &a.save_counts {
        write_bytes(s, serde_json::to_string(&c.to_json()).unwrap_or_default().as_bytes())?;
        eprintln!("wrote {}", s.display());
    }
    let distinct = c.counts.iter().filter(|&&x| x > 0).count();
    eprintln!("{} tokens counted, {distinct} distinct target ids", c.total());
    let stops: Vec<u32> = match &m.tokenizer {
        Some(t) => sparkling::decode::stop_tokens(&m.models.target.cfg.eos, &t.stop),
        None => m.models.target.cfg.eos.clone(),
    };
    if a.draft_vocab > c.counts.len() {
        return Err(Error::Input(format!("--draft-vocab {} exceeds the target vocabulary of {}", a.draft_vocab, c.counts.len())));
    }
    let ids = top_ids(&c.counts, &c.secondary, a.draft_vocab, &stops);
    let cov = coverage(&c.counts, &ids);
    let mut lines = vec![format!("V_d = {}: covers {:.4} of the counted tokens", ids.len(), cov)];
    for f in &a.coverage_of {
        let mut e = Counts { counts: vec![0; vocab], secondary: vec![0; vocab], sources: Vec::new() };
        read_counts(f, &mut e)?;
        lines.push(format!("V_d = {}: covers {:.4} of {} ({} tokens)", ids.len(), coverage(&e.counts, &ids), f.display(), e.total()));
    }
    if !a.count_only {
        let (Some(from), Some(out)) = (&a.from, &a.out) else { unreachable!("checked in run") };
        let provenance = serde_json::json!({
            "reduced_from": from.display().to_string(),
            "draft_vocab_size": ids.len(),
            "counted_on": c.sources,
            "tokens_counted": c.total(),
            "distinct_tokens_counted": distinct,
            "coverage_of_counted_tokens": cov,
            "always_kept": stops,
        });
        let extra = [("draft_vocab.json", serde_json::to_string_pretty(&provenance).unwrap_or_default().into_bytes())];
        write_reduced_drafter(from, out, &ids, dtype, &extra)?;
        lines.push(format!("wrote {} (draft_vocab_size {}, map tensor `{}`)", out.display(), ids.len(), sparkling::model::draft_vocab::MAP_TENSOR));
    }
    for l in lines {
        outln!("{l}")?;
    }
    Ok(())
}
