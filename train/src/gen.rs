//! `gen-data`: the target answers training prompts greedily through the engine (chat template,
//! thinking off), then one causal forward over prompt + answer records the tapped hidden states
//! and the target's top-k log-probabilities per answer position into the [`crate::cache`].
//!
//! Only training prompts belong here: files whose names look like the evaluation sets
//! (MT-Bench, HumanEval, a `test` split) are refused.

use crate::cache::{seq_path, CacheMeta, Sequence};
use crate::error::{io, Error, Result};
use half::f16;
use indicatif::{ProgressBar, ProgressStyle};
use sparkling::core::{AttnMask, Backend, ReadBack, SampleParams};
use sparkling::cpu::{CpuBackend, WeightDtype};
use sparkling::decode::propose::{TreeParams, TreePrep};
use sparkling::decode::{Engine, GenParams, LookupGraft, Method};
use sparkling::loader::gguf_source::GgufSource;
use sparkling::loader::{open_source, TensorSource};
use sparkling::model::config::{read_json, TargetConfig};
use sparkling::model::target::{LogitRows, SeqInput, Target};
use sparkling::tokenizer::TextTokenizer;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A target with its tokenizer on the CPU backend.
pub struct LoadedTarget {
    /// CPU backend (native weights for GGUF targets, as the engine CLI's `--weights auto`).
    pub backend: CpuBackend,
    /// The target model.
    pub target: Target<CpuBackend>,
    /// Its tokenizer, when one is available (GGUF vocabulary or `tokenizer.json`).
    pub tokenizer: Option<TextTokenizer>,
}

/// The target weight storage `gen-data` uses when `--weights` is not given: the engine CLI's
/// `--weights auto` on the CPU (a GGUF target's blocks kept native, so the drafter learns the
/// target the engine serves; f32 for safetensors checkpoints).
pub fn default_weights(path: &Path) -> WeightDtype {
    if path.extension().is_some_and(|e| e == "gguf") {
        WeightDtype::Native
    } else {
        WeightDtype::F32
    }
}

/// Load a target from a `.gguf` file or an HF directory the way the engine CLI does.
/// `weights`: storage on the CPU backend (`None` = [`default_weights`]).
/// Errors name the file.
pub fn load_target(path: &Path, weights: Option<WeightDtype>) -> Result<LoadedTarget> {
    if !path.exists() {
        return Err(Error::file(path, "target not found (run `scripts/fetch-assets smollm2` or pass --target)"));
    }
    let is_gguf = path.extension().is_some_and(|e| e == "gguf");
    let dtype = weights.unwrap_or(default_weights(path));
    let backend = CpuBackend::with_weight_dtype(dtype);
    if is_gguf {
        let src = GgufSource::open(path)?;
        let cfg = TargetConfig::from_gguf(&src.file)?;
        let target = Target::load(&backend, &src, cfg, &|_, _| {})?;
        let tokenizer = Some(TextTokenizer::from_gguf(&src.file)?);
        Ok(LoadedTarget { backend, target, tokenizer })
    } else {
        let (cp, v) = read_json(path)?;
        let cfg = TargetConfig::from_hf_json(&cp, &v)?;
        let src = open_source(path)?;
        let target = Target::load(&backend, src.as_ref(), cfg, &|_, _| {})?;
        let tokenizer = if path.join("tokenizer.json").exists() { Some(TextTokenizer::from_dir(path)?) } else { None };
        Ok(LoadedTarget { backend, target, tokenizer })
    }
}

/// The target's tied/own lm_head (= embedding for tied models) as host f32 `[V, H]`, read from
/// the checkpoint (the trainer borrows it frozen, as the engine's drafters do).
pub fn load_lm_head(path: &Path) -> Result<(Vec<f32>, TargetConfig)> {
    let (src, cfg): (Box<dyn TensorSource>, TargetConfig) = if path.extension().is_some_and(|e| e == "gguf") {
        let g = GgufSource::open(path)?;
        let cfg = TargetConfig::from_gguf(&g.file)?;
        (Box::new(g), cfg)
    } else {
        let (cp, v) = read_json(path)?;
        (open_source(path)?, TargetConfig::from_hf_json(&cp, &v)?)
    };
    let name = if src.contains("lm_head.weight") { "lm_head.weight" } else { "model.embed_tokens.weight" };
    let t = src.load_shaped(name, &[cfg.vocab, cfg.hidden])?;
    Ok((t.data, cfg))
}

/// One named target tensor (HF name, e.g. `model.norm.weight`) as host f32, from a `.gguf`
/// file or an HF directory. Errors name the file and tensor.
pub fn load_target_tensor(path: &Path, name: &str) -> Result<Vec<f32>> {
    let src: Box<dyn TensorSource> = if path.extension().is_some_and(|e| e == "gguf") { Box::new(GgufSource::open(path)?) } else { open_source(path)? };
    Ok(src.load(name)?.data)
}

/// Refuse prompt files that look like evaluation sets: names with `mt_bench`, `humaneval`,
/// `test`, `math500`, `alpaca_eval`, `eagle_alpaca` anywhere in the path's last two components,
/// and MBPP's full files (`mbpp.jsonl`, `sanitized-mbpp.json`, which hold its test split;
/// `mbpp_train.jsonl` is fine) — the evaluation sets of `../shared/data/README.md`.
pub fn check_not_eval(path: &Path) -> Result<()> {
    let name = path.file_name().map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_default();
    let parent = path.parent().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_default();
    for bad in ["mt_bench", "mt-bench", "humaneval", "test", "math500", "alpaca_eval", "eagle_alpaca"] {
        if name.contains(bad) || (bad != "test" && parent.contains(bad)) {
            return Err(Error::file(path, format!("looks like an evaluation set (`{bad}` in the name); train on training prompts only")));
        }
    }
    if name == "mbpp.jsonl" || name.contains("sanitized-mbpp") {
        return Err(Error::file(path, "MBPP's full file holds its test split (task_id 11–510); use prompts/mbpp_train.jsonl"));
    }
    Ok(())
}

/// The prompt files named by `paths`: files as given, directories expanded to their `*.jsonl`
/// files (sorted by name). Every file passes [`check_not_eval`].
pub fn prompt_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let rd = std::fs::read_dir(p).map_err(|e| io(p, e))?;
            let mut files: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|f| f.extension().is_some_and(|e| e == "jsonl")).collect();
            files.sort();
            if files.is_empty() {
                return Err(Error::file(p, "no *.jsonl prompt files in this directory"));
            }
            out.extend(files);
        } else {
            out.push(p.clone());
        }
    }
    for f in &out {
        check_not_eval(f)?;
    }
    Ok(out)
}

/// Prompts of several files with ids stable across runs: file `f` (in [`prompt_files`] order),
/// line `i` → id `f·2^20 + i` (a single file keeps its line indices). With more than one file
/// the prompts are put in a fixed pseudo-random order (a hash of the id), so any prefix of the
/// list — what `--limit` / `--max-tokens` take — mixes the sets in proportion to their sizes.
pub fn read_prompt_set(files: &[PathBuf]) -> Result<Vec<(u32, String)>> {
    if files.len() >= 1 << 12 {
        return Err(Error(format!("{} prompt files: at most 4095", files.len())));
    }
    let mut all = Vec::new();
    for (fi, f) in files.iter().enumerate() {
        for (line, q) in read_prompts(f)? {
            if line >= 1 << 20 {
                return Err(Error::file(f, "more than 2^20 lines"));
            }
            all.push(((fi as u32) << 20 | line, q));
        }
    }
    if files.len() > 1 {
        all.sort_by_key(|(id, _)| (sparkling::decode::rng::splitmix64(*id as u64 ^ 0x5EED), *id));
    }
    Ok(all)
}

/// Read prompts from a JSON-lines file: each line's `question`, `prompt`, `instruction` or `text`
/// field (the first present). Returns `(line index, text)`.
pub fn read_prompts(path: &Path) -> Result<Vec<(u32, String)>> {
    check_not_eval(path)?;
    let text = std::fs::read_to_string(path).map_err(|e| io(path, e))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| Error::file(path, format!("line {}: invalid JSON: {e}", i + 1)))?;
        let q = ["question", "prompt", "instruction", "text"]
            .iter()
            .find_map(|k| v.get(*k).and_then(|x| x.as_str()))
            .ok_or_else(|| Error::file(path, format!("line {}: no `question`/`prompt`/`instruction`/`text` string", i + 1)))?;
        out.push((i as u32, q.to_string()));
    }
    Ok(out)
}

/// Options of `gen-data`.
#[derive(Debug, Clone)]
pub struct GenOptions {
    /// Target checkpoint (`.gguf` or HF directory).
    pub target: PathBuf,
    /// Prompt files or directories of `*.jsonl` (see [`read_prompt_set`]).
    pub prompts: Vec<PathBuf>,
    /// Cache directory.
    pub out: PathBuf,
    /// First prompt (line index order) to answer.
    pub start: usize,
    /// Prompts to answer (cached ones count).
    pub limit: usize,
    /// Maximum answer length in tokens.
    pub max_new_tokens: usize,
    /// Top-k logits kept per position.
    pub topk: usize,
    /// Target layers to tap.
    pub tap_layers: Vec<usize>,
    /// Stop after this many minutes (the sequences in flight are dropped; rerun to resume).
    pub max_minutes: Option<f64>,
    /// Sequences decoded together (batch API, continuous batching).
    pub batch: usize,
    /// Stop once the cache holds this many answer tokens (cached ones count).
    pub max_tokens: Option<usize>,
    /// Weight storage on the CPU backend (`None`: f16 for GGUF, f32 otherwise).
    pub weights: Option<WeightDtype>,
}

/// Summary of a `gen-data` run.
#[derive(Debug, Clone, Default)]
pub struct GenSummary {
    /// Sequences written by this run.
    pub written: usize,
    /// Sequences already present (skipped).
    pub skipped: usize,
    /// Answer tokens generated by this run.
    pub new_tokens: usize,
    /// Answer positions whose cached top-1 differed from the generated greedy token (should be
    /// 0: the top-k comes from the very logits row that chose the token).
    pub top1_mismatch: usize,
    /// Answer tokens already in the cache before this run.
    pub cached_tokens: usize,
    /// Broken cache files (a size that does not match their header) removed to be redone.
    pub removed: usize,
    /// Prompts skipped because prompt + `--max-new-tokens` exceed the target's context.
    pub too_long: usize,
    /// Wall time in seconds.
    pub seconds: f64,
}

/// Top-k (ids, log-probs) of one logit row, ids by descending logit (ties: lower id first).
pub fn topk_logprobs(row: &[f32], k: usize) -> (Vec<u32>, Vec<f32>) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + row.iter().map(|&v| ((v - max) as f64).exp()).sum::<f64>().ln() as f32;
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    let k = k.min(row.len());
    let cmp = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k, cmp);
        idx.truncate(k);
    }
    idx.sort_by(cmp);
    let lp = idx.iter().map(|&i| row[i as usize] - lse).collect();
    (idx, lp)
}

/// The stop tokens of a generation: the engine's one rule (the CLI's and the browser's), the
/// target's eos ids plus the tokenizer's end-of-turn tokens.
fn stop_ids(lt: &LoadedTarget) -> Vec<u32> {
    sparkling::decode::stop_tokens(&lt.target.cfg.eos, lt.tokenizer.as_ref().map_or(&[][..], |t| &t.stop))
}

/// Answer one prompt and record its cache entry.
pub fn answer(lt: &LoadedTarget, id: u32, prompt: &[u32], o: &GenOptions) -> Result<(Sequence, usize)> {
    let b = &lt.backend;
    let stop = stop_ids(lt);
    let params = GenParams {
        method: Method::Ar,
        tree: TreeParams { budget: 1, candidates: 1, max_fanout: 1, treespark_k: 1, prep: TreePrep::Host },
        sampling: SampleParams { temperature: 0.0, top_k: 0, top_p: 1.0 },
        seed: 0,
        max_new_tokens: o.max_new_tokens,
        stop,
        auto_budget: None,
        lookup: LookupGraft::OFF,
    };
    let engine = Engine { backend: b, target: &lt.target, drafter: None };
    let g = engine.generate(prompt, &params, &mut |_| {})?;
    let mut tokens = prompt.to_vec();
    tokens.extend_from_slice(&g.tokens);
    let n = tokens.len();
    let mut cache = lt.target.new_cache(b, n)?;
    let positions: Vec<u32> = (0..n as u32).collect();
    let out = lt.target.forward(
        b,
        &mut cache,
        SeqInput { ids: &tokens, positions: &positions, mask: AttnMask::Causal, logits: Some(LogitRows::All) },
        &o.tap_layers,
    )?;
    let taps = out.taps.ok_or_else(|| Error("target forward returned no taps".into()))?;
    let (_, width) = b.shape(&taps);
    let taps: Vec<f16> = b.download(&taps)?.iter().map(|&v| f16::from_f32(v)).collect();
    let vocab = lt.target.cfg.vocab;
    let pl = prompt.len();
    let logits = b.download_rows(&out.logits, pl - 1, n - pl)?;
    let mut top_ids = Vec::with_capacity((n - pl) * o.topk);
    let mut top_logp = Vec::with_capacity((n - pl) * o.topk);
    let mut mismatch = 0;
    for (r, row) in logits.chunks(vocab).enumerate() {
        let (ids, lp) = topk_logprobs(row, o.topk);
        if ids[0] != tokens[pl + r] {
            mismatch += 1;
        }
        top_ids.extend(ids);
        top_logp.extend(lp);
    }
    let s = Sequence { id, prompt_len: pl, tokens, width, taps, topk: o.topk.min(vocab), top_ids, top_logp };
    Ok((s, mismatch))
}

/// Answer tokens held by the cache file `p` (from its 28-byte header), or `None` when the file
/// is not a complete cache file (its size disagrees with its header).
fn cached_answer_tokens(p: &Path) -> Option<usize> {
    use std::io::Read;
    let mut h = [0u8; 28];
    let mut f = std::fs::File::open(p).ok()?;
    f.read_exact(&mut h).ok()?;
    let len = f.metadata().ok()?.len() as usize;
    let u = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]) as usize;
    if &h[..4] != b"SPKD" {
        return None;
    }
    let (pl, n, width, topk) = (u(12), u(16), u(20), u(24));
    let rows = n.checked_sub(pl)?;
    (len == 28 + n * 4 + n * width * 2 + rows * topk * 8).then_some(rows)
}

/// The prompt files of a cache's `source` (comma-separated), canonicalized where they exist.
fn canonical_sources(source: &str) -> Vec<PathBuf> {
    source.split(',').map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| PathBuf::from(p))).collect()
}

/// One sequence in flight: its prompt id, and the taps / top-k gathered step by step.
struct InFlight {
    id: u32,
    taps: Vec<f16>,
    top_ids: Vec<u32>,
    top_logp: Vec<f32>,
    mismatch: usize,
}

/// Run `gen-data`: answer the prompts `start..start+limit` of the (mixed) prompt list that are
/// not cached yet, `batch` at a time through the engine's batch API ([`sparkling::decode::batch`]):
/// greedy, chat template, answers capped at `max_new_tokens`. The taps of every token and the
/// top-k of every answer position come from the decoding forwards themselves (bit-identical to
/// one forward over prompt + answer, `tests/batch.rs`), so no second pass runs. Each finished
/// sequence is written atomically (synced temporary + rename); a killed run loses only the
/// sequences in flight, and a rerun skips every cached prompt.
pub fn run(o: &GenOptions) -> Result<GenSummary> {
    use sparkling::decode::batch::{Batch, BatchOptions, SeqId};
    use std::collections::HashMap;
    let t0 = Instant::now();
    let files = prompt_files(&o.prompts)?;
    let prompts = read_prompt_set(&files)?;
    if o.topk == 0 {
        return Err(Error::arg("topk", "must be ≥ 1"));
    }
    if o.batch == 0 {
        return Err(Error::arg("batch", "must be ≥ 1"));
    }
    let lt = load_target(&o.target, o.weights)?;
    let tcfg = lt.target.cfg.clone();
    if let Some(&bad) = o.tap_layers.iter().find(|&&l| l >= tcfg.layers) {
        return Err(Error::arg("taps", format!("layer {bad} is not a layer of a {}-layer target (0..={})", tcfg.layers, tcfg.layers - 1)));
    }
    let tok = lt.tokenizer.as_ref().ok_or_else(|| Error::file(&o.target, "no tokenizer found next to the target"))?;
    // Checked before anything is written: an answer that cannot fit would skip every prompt.
    if o.max_new_tokens + 3 > tcfg.max_positions {
        return Err(Error::arg(
            "max-new-tokens",
            format!("{} leaves no room for a prompt in the target's context of {} tokens", o.max_new_tokens, tcfg.max_positions),
        ));
    }
    if prompts.is_empty() {
        return Err(Error::arg("prompts", "the files hold no prompts (one JSON object or line of text per prompt)"));
    }
    if o.start >= prompts.len() {
        return Err(Error::arg("start", format!("{} is past the {} prompts of --prompts", o.start, prompts.len())));
    }
    let source = files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(",");
    let meta = CacheMeta {
        target: o.target.display().to_string(),
        target_layers: tcfg.layers,
        hidden: tcfg.hidden,
        vocab: tcfg.vocab,
        tap_layers: o.tap_layers.clone(),
        topk: o.topk.min(tcfg.vocab),
        source,
        max_new_tokens: o.max_new_tokens,
        weights: Some(o.weights.unwrap_or(default_weights(&o.target)).name().to_string()),
    };
    match CacheMeta::read(&o.out)? {
        Some(m) if (m.tap_layers != meta.tap_layers || m.topk != meta.topk || m.hidden != meta.hidden || m.vocab != meta.vocab) => {
            return Err(Error::file(
                &o.out,
                format!(
                    "holds a cache for taps {:?} / top-k {} / H {} / V {}; these settings differ (use another --out)",
                    m.tap_layers, m.topk, m.hidden, m.vocab
                ),
            ));
        }
        // Ids are positions in the prompt files: a cache of other files would alias them.
        Some(m) if canonical_sources(&m.source) != canonical_sources(&meta.source) => {
            return Err(Error::file(&o.out, format!("holds answers to other prompt files ({}); use another --out", m.source)));
        }
        // Answers of the target in another weight storage would mix two targets' outputs.
        Some(m) if m.weights.is_some() && m.weights != meta.weights => {
            let (had, now) = (m.weights.unwrap_or_default(), meta.weights.unwrap_or_default());
            return Err(Error::file(
                &o.out,
                format!("holds answers of the target with --weights {had}; this run would add answers with --weights {now} (pass --weights {had}, or use another --out)"),
            ));
        }
        Some(m) => {
            if m.weights.is_none() {
                eprintln!(
                    "note: this cache does not record the target's weight storage (written before it was recorded); new answers use --weights {}",
                    meta.weights.as_deref().unwrap_or("?")
                );
            }
            if m.max_new_tokens != meta.max_new_tokens {
                eprintln!(
                    "note: this cache was made with --max-new-tokens {}; cached answers keep their length, new ones get {}",
                    m.max_new_tokens, meta.max_new_tokens
                );
            }
        }
        None => {
            // A new cache goes into a new or empty directory, never over a user's files.
            if o.out.exists() && !o.out.is_dir() {
                return Err(Error::file(&o.out, "--out: exists and is not a directory (expected a training-cache directory)"));
            }
            if std::fs::read_dir(&o.out).is_ok_and(|mut r| r.next().is_some()) {
                return Err(Error::file(&o.out, "--out: not empty and not a training cache (no meta.json); choose a new directory"));
            }
            meta.write(&o.out)?
        }
    }
    // One writer per cache (a fifth trial: two runs into one cache redid the same prompts and
    // one's answers silently replaced the other's).
    let _lock = crate::checkpoint::RunLock::take(&o.out)?;
    let chosen: Vec<&(u32, String)> = prompts.iter().skip(o.start).take(o.limit).collect();
    let mut s = GenSummary::default();
    // What is cached already (headers only); broken files are removed and redone.
    let mut todo: Vec<&(u32, String)> = Vec::new();
    for p in chosen.iter().copied() {
        let path = seq_path(&o.out, p.0);
        if !path.exists() {
            todo.push(p);
            continue;
        }
        match cached_answer_tokens(&path) {
            Some(n) => {
                s.skipped += 1;
                s.cached_tokens += n;
            }
            None => {
                std::fs::remove_file(&path).map_err(|e| io(&path, e))?;
                s.removed += 1;
                todo.push(p);
            }
        }
    }
    let width = o.tap_layers.len() * tcfg.hidden;
    let topk = o.topk.min(tcfg.vocab);
    let vocab = tcfg.vocab;
    let (len, pos) = match o.max_tokens {
        Some(m) => (m as u64, s.cached_tokens.min(m) as u64),
        None => (chosen.len() as u64, s.skipped as u64),
    };
    let pb = ProgressBar::new(len);
    let unit = if o.max_tokens.is_some() { "tokens" } else { "prompts" };
    pb.set_style(
        ProgressStyle::with_template(&format!("gen-data [{{bar:30}}] {{pos}}/{{len}} {unit} {{elapsed_precise}} eta {{eta_precise}} {{msg}}"))
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_position(pos);
    if s.removed > 0 {
        pb.println(format!("removed {} incomplete cache files (they are redone)", s.removed));
    }
    let b = &lt.backend;
    let stop = stop_ids(&lt);
    let params = GenParams {
        method: Method::Ar,
        auto_budget: None,
        lookup: LookupGraft::OFF,
        tree: TreeParams { budget: 1, candidates: 1, max_fanout: 1, treespark_k: 1, prep: TreePrep::Host },
        sampling: SampleParams { temperature: 0.0, top_k: 0, top_p: 1.0 },
        seed: 0,
        max_new_tokens: o.max_new_tokens,
        stop,
    };
    let mut batch = Batch::new(b, &lt.target, BatchOptions { taps: o.tap_layers.clone(), max_prefill_rows: 0 })?;
    let mut flying: HashMap<SeqId, InFlight> = HashMap::new();
    let gen_start = Instant::now();
    let mut next = 0;
    let mut stopping = false;
    let enough = |s: &GenSummary| o.max_tokens.is_some_and(|m| s.cached_tokens + s.new_tokens >= m);
    loop {
        if !stopping {
            if let Some(m) = o.max_minutes {
                if t0.elapsed().as_secs_f64() > m * 60.0 {
                    pb.println(format!("time budget of {m} min reached; stopping (rerun to resume; the {} sequences in flight are dropped)", batch.len()));
                    stopping = true;
                }
            }
        }
        if stopping {
            break;
        }
        while !enough(&s) && batch.len() < o.batch && next < todo.len() {
            let (id, q) = todo[next];
            next += 1;
            let prompt = tok.encode_chat(q, None)?;
            if prompt.len() + o.max_new_tokens + 2 > tcfg.max_positions {
                s.too_long += 1;
                crate::train::say(
                    &pb,
                    format!("prompt {id}: {} tokens + {} new exceed the context of {}; skipped", prompt.len(), o.max_new_tokens, tcfg.max_positions),
                );
                continue;
            }
            let sid = batch.add(&prompt, &params).map_err(|e| Error::from(e).context(format!("prompt {id}")))?;
            flying.insert(sid, InFlight { id: *id, taps: Vec::new(), top_ids: Vec::new(), top_logp: Vec::new(), mismatch: 0 });
        }
        if batch.is_empty() {
            break;
        }
        let out = batch.step()?;
        if let Some(t) = &out.taps {
            let host = b.download(t)?;
            for st in &out.seqs {
                let f = flying.get_mut(&st.id).expect("every sequence in flight is tracked");
                f.taps.extend(host[st.input_rows.start * width..st.input_rows.end * width].iter().map(|&v| f16::from_f32(v)));
            }
        }
        if let Some(l) = &out.logits {
            let host = b.download(l)?;
            let rows: Vec<(SeqId, usize, u32)> = out.seqs.iter().filter_map(|st| Some((st.id, st.logit_row?, st.token?))).collect();
            let tops: Vec<(Vec<u32>, Vec<f32>)> = {
                use rayon::prelude::*;
                rows.par_iter().map(|&(_, r, _)| topk_logprobs(&host[r * vocab..(r + 1) * vocab], topk)).collect()
            };
            for ((sid, _, token), (ids, lp)) in rows.into_iter().zip(tops) {
                let f = flying.get_mut(&sid).expect("every sequence in flight is tracked");
                if ids[0] != token {
                    f.mismatch += 1;
                }
                f.top_ids.extend(ids);
                f.top_logp.extend(lp);
            }
        }
        let written_before = s.written;
        for fin in out.finished {
            let f = flying.remove(&fin.id).expect("every finished sequence was tracked");
            let mut tokens = fin.prompt;
            let pl = tokens.len();
            let answer = fin.tokens.len();
            tokens.extend_from_slice(&fin.tokens);
            let seq = Sequence { id: f.id, prompt_len: pl, tokens, width, taps: f.taps, topk, top_ids: f.top_ids, top_logp: f.top_logp };
            seq.validate(&seq_path(&o.out, f.id))?;
            seq.write(&o.out)?;
            s.written += 1;
            s.new_tokens += answer;
            s.top1_mismatch += f.mismatch;
            pb.inc(if o.max_tokens.is_some() { answer as u64 } else { 1 });
        }
        let rate = s.new_tokens as f64 / gen_start.elapsed().as_secs_f64().max(1e-9);
        pb.set_message(format!("{rate:.1} tok/s, {} written, {} new tokens, top-1 mismatches {}", s.written, s.new_tokens, s.top1_mismatch));
        if pb.is_hidden() && s.written / 20 > written_before / 20 {
            eprintln!("gen-data: {} written ({} cached before): {}", s.written, s.skipped, pb.message());
        }
    }
    pb.finish();
    s.seconds = t0.elapsed().as_secs_f64();
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topk_is_sorted_and_normalised() {
        let row = [0.0f32, 3.0, 1.0, 3.0, -1.0];
        let (ids, lp) = topk_logprobs(&row, 3);
        assert_eq!(ids, vec![1, 3, 2]);
        let total: f32 = row.iter().map(|v| v.exp()).sum();
        assert!((lp[0] - (3.0f32.exp() / total).ln()).abs() < 1e-5);
    }

    #[test]
    fn eval_sets_are_refused() {
        assert!(check_not_eval(Path::new("/x/mt_bench_question.jsonl")).is_err());
        assert!(check_not_eval(Path::new("/x/HumanEval.jsonl.gz")).is_err());
        assert!(check_not_eval(Path::new("/x/gsm8k/test.jsonl")).is_err());
        assert!(check_not_eval(Path::new("/x/gsm8k/train.jsonl")).is_ok());
        // The evaluation files of ../shared/data (README) and its training prompts.
        for eval in ["math500/test.jsonl", "mbpp/mbpp.jsonl", "mbpp/sanitized-mbpp.json", "alpaca_eval/eagle_alpaca_80.jsonl"] {
            assert!(check_not_eval(&Path::new("../shared/data").join(eval)).is_err(), "{eval}");
        }
        for ok in ["prompts/mbpp_train.jsonl", "prompts/arena_hard.jsonl", "prompts/gsm8k_train.jsonl", "prompts/t0_p3_sample.jsonl"] {
            assert!(check_not_eval(&Path::new("../shared/data").join(ok)).is_ok(), "{ok}");
        }
    }
}
