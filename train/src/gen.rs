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
use sparkling::core::{AttnMask, Backend, SampleParams};
use sparkling::cpu::{CpuBackend, WeightDtype};
use sparkling::decode::propose::{TreeParams, TreePrep};
use sparkling::decode::{Engine, GenParams, Method};
use sparkling::loader::gguf_source::GgufSource;
use sparkling::loader::{open_source, TensorSource};
use sparkling::model::config::{read_json, TargetConfig};
use sparkling::model::target::{LogitRows, Target};
use sparkling::tokenizer::TextTokenizer;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A target with its tokenizer on the CPU backend.
pub struct LoadedTarget {
    /// CPU backend (f16 weights for GGUF targets, as the engine CLI's `--weights auto`).
    pub backend: CpuBackend,
    /// The target model.
    pub target: Target<CpuBackend>,
    /// Its tokenizer, when one is available (GGUF vocabulary or `tokenizer.json`).
    pub tokenizer: Option<TextTokenizer>,
}

/// Load a target from a `.gguf` file or an HF directory the way the engine CLI does.
/// `weights`: storage precision on the CPU backend (`None` = f16 for GGUF, f32 otherwise).
/// Errors name the file.
pub fn load_target(path: &Path, weights: Option<WeightDtype>) -> Result<LoadedTarget> {
    if !path.exists() {
        return Err(Error::file(path, "target not found (run `scripts/fetch-assets smollm2` or pass --target)"));
    }
    let is_gguf = path.extension().is_some_and(|e| e == "gguf");
    let dtype = weights.unwrap_or(if is_gguf { WeightDtype::F16 } else { WeightDtype::F32 });
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
    let src: Box<dyn TensorSource> =
        if path.extension().is_some_and(|e| e == "gguf") { Box::new(GgufSource::open(path)?) } else { open_source(path)? };
    Ok(src.load(name)?.data)
}

/// Refuse prompt files that look like evaluation sets.
pub fn check_not_eval(path: &Path) -> Result<()> {
    let name = path.file_name().map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_default();
    for bad in ["mt_bench", "mt-bench", "humaneval", "test"] {
        if name.contains(bad) {
            return Err(Error::file(path, format!("looks like an evaluation set (`{bad}` in the name); train on training prompts only")));
        }
    }
    Ok(())
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
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| Error::file(path, format!("line {}: invalid JSON: {e}", i + 1)))?;
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
    /// Prompt file (JSON lines).
    pub prompts: PathBuf,
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
    /// Stop after this many minutes (after the sequence in flight).
    pub max_minutes: Option<f64>,
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
    /// 0: the CPU backend's rows do not depend on batch size).
    pub top1_mismatch: usize,
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

/// Answer one prompt and record its cache entry.
pub fn answer(lt: &LoadedTarget, id: u32, prompt: &[u32], o: &GenOptions) -> Result<(Sequence, usize)> {
    let b = &lt.backend;
    let stop = lt.tokenizer.as_ref().map(|t| t.stop.clone()).unwrap_or_else(|| lt.target.cfg.eos.clone());
    let params = GenParams {
        method: Method::Ar,
        tree: TreeParams { budget: 1, candidates: 1, max_fanout: 1, treespark_k: 1, prep: TreePrep::Host },
        sampling: SampleParams { temperature: 0.0, top_k: 0, top_p: 1.0 },
        seed: 0,
        max_new_tokens: o.max_new_tokens,
        stop,
        auto_budget: None,
    };
    let engine = Engine { backend: b, target: &lt.target, drafter: None };
    let g = engine.generate(prompt, &params, &mut |_| {})?;
    let mut tokens = prompt.to_vec();
    tokens.extend_from_slice(&g.tokens);
    let n = tokens.len();
    let mut cache = lt.target.new_cache(b, n)?;
    let positions: Vec<u32> = (0..n as u32).collect();
    let out = lt.target.forward(b, &mut cache, &tokens, &positions, AttnMask::Causal, LogitRows::All, &o.tap_layers)?;
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

/// Run `gen-data`: answer prompts `start..start+limit` that are not cached yet.
pub fn run(o: &GenOptions) -> Result<GenSummary> {
    let t0 = Instant::now();
    let prompts = read_prompts(&o.prompts)?;
    if o.topk == 0 {
        return Err(Error::arg("topk", "must be ≥ 1"));
    }
    let lt = load_target(&o.target, None)?;
    let tcfg = lt.target.cfg.clone();
    if let Some(&bad) = o.tap_layers.iter().find(|&&l| l + 1 >= tcfg.layers) {
        return Err(Error::arg("taps", format!("layer {bad} is not tappable in a {}-layer target (never the last layer)", tcfg.layers)));
    }
    let tok = lt.tokenizer.as_ref().ok_or_else(|| Error::file(&o.target, "no tokenizer found next to the target"))?;
    let meta = CacheMeta {
        target: o.target.display().to_string(),
        target_layers: tcfg.layers,
        hidden: tcfg.hidden,
        vocab: tcfg.vocab,
        tap_layers: o.tap_layers.clone(),
        topk: o.topk.min(tcfg.vocab),
        source: o.prompts.display().to_string(),
        max_new_tokens: o.max_new_tokens,
    };
    match CacheMeta::read(&o.out)? {
        Some(m) if (m.tap_layers != meta.tap_layers || m.topk != meta.topk || m.hidden != meta.hidden || m.vocab != meta.vocab) => {
            return Err(Error::file(&o.out, format!("holds a cache for taps {:?} / top-k {} / H {} / V {}; these settings differ (use another --out)", m.tap_layers, m.topk, m.hidden, m.vocab)));
        }
        Some(_) => {}
        None => meta.write(&o.out)?,
    }
    let chosen: Vec<&(u32, String)> = prompts.iter().skip(o.start).take(o.limit).collect();
    let pb = ProgressBar::new(chosen.len() as u64);
    pb.set_style(
        ProgressStyle::with_template("gen-data [{bar:30}] {pos}/{len} {elapsed_precise} eta {eta} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let mut s = GenSummary::default();
    let gen_start = Instant::now();
    for (id, q) in chosen {
        if let Some(m) = o.max_minutes {
            if t0.elapsed().as_secs_f64() > m * 60.0 {
                pb.println(format!("time budget of {m} min reached; stopping (rerun to resume)"));
                break;
            }
        }
        if seq_path(&o.out, *id).exists() {
            s.skipped += 1;
            pb.inc(1);
            continue;
        }
        let prompt = tok.encode_chat(q, None)?;
        if prompt.len() + o.max_new_tokens + 2 > tcfg.max_positions {
            pb.println(format!("prompt {id}: {} tokens + {} new exceed the context; skipped", prompt.len(), o.max_new_tokens));
            pb.inc(1);
            continue;
        }
        let (seq, mm) = answer(&lt, *id, &prompt, o).map_err(|e| e.context(format!("prompt {id}")))?;
        s.new_tokens += seq.len() - seq.prompt_len;
        s.top1_mismatch += mm;
        seq.write(&o.out)?;
        s.written += 1;
        let rate = s.new_tokens as f64 / gen_start.elapsed().as_secs_f64().max(1e-9);
        pb.set_message(format!("{} new tokens, {rate:.1} tok/s, top-1 mismatches {}", s.new_tokens, s.top1_mismatch));
        pb.inc(1);
        if pb.is_hidden() && s.written % 20 == 0 {
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
    }
}
