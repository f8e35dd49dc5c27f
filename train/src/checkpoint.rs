//! A training run's directory on disk: its checkpoints (parameters + AdamW moments +
//! the context-feature preconditioner, `ckpt-NNNNNN.{safetensors,json}`, the two newest kept),
//! `run.json` (the [`RunConfig`]), the frozen cache file list (`data.json`) and the frozen draft
//! vocabulary (`draft_vocab.json`). Every file is written whole (temporary file + rename) and
//! every read error names the file.

use crate::cache::{list, Sequence};
use crate::error::{io, Error, Result};
use crate::model::Params;
use crate::optim::AdamW;
use crate::train::{count_draft_vocab, RunConfig};
use candle_core::{Device, Tensor};
use sparkling::model::config::{DrafterConfig, TargetConfig};
use sparkling::model::draft_vocab::DraftVocab;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The run directory's frozen list of cache files (`data.json`).
pub const DATA_FILE: &str = "data.json";

/// The run directory's draft vocabulary (`draft_vocab.json`: `draft_to_target` + provenance).
pub const DRAFT_VOCAB_FILE: &str = "draft_vocab.json";

/// Read a run's `draft_vocab.json` (`None` when the run has the full vocabulary); checks it
/// against the run's V_d and the target vocabulary. Errors name the file.
pub fn read_draft_vocab(out: &Path, rc: &RunConfig, vocab: usize) -> Result<Option<DraftVocab>> {
    let Some(vd) = rc.draft_vocab else { return Ok(None) };
    let p = out.join(DRAFT_VOCAB_FILE);
    sparkling::loader::bytes::regular_file(&p, "a run or cache file")?;
    let text = std::fs::read_to_string(&p).map_err(|e| io(&p, e))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::file(&p, format!("invalid JSON: {e}")))?;
    let ids: Vec<i64> = v
        .get("draft_to_target")
        .and_then(|x| x.as_array())
        .ok_or_else(|| Error::file(&p, "no `draft_to_target` array"))?
        .iter()
        .map(|x| x.as_i64().ok_or_else(|| Error::file(&p, "`draft_to_target`: non-integer entry")))
        .collect::<Result<_>>()?;
    Ok(Some(DraftVocab::new(&p, &[ids.len()], &ids, vocab, vd)?))
}

/// Training-state file names for `step`.
pub(crate) fn ckpt_paths(out: &Path, step: usize) -> (PathBuf, PathBuf) {
    (out.join(format!("ckpt-{step:06}.safetensors")), out.join(format!("ckpt-{step:06}.json")))
}

/// The newest checkpoint step in `out`, if any.
pub fn latest_checkpoint(out: &Path) -> Result<Option<usize>> {
    if !out.exists() {
        return Ok(None);
    }
    let mut best = None;
    for e in std::fs::read_dir(out).map_err(|e| io(out, e))?.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if let Some(s) = name.strip_prefix("ckpt-").and_then(|x| x.strip_suffix(".json")) {
            if let Ok(n) = s.parse::<usize>() {
                best = best.max(Some(n));
            }
        }
    }
    Ok(best)
}

/// Checkpoint name of the context-feature preconditioner (see `CandleDrafter::ctx_scale`).
pub const CTX_SCALE: &str = "precond.ctx_scale";

/// Load a run's parameters (and optimizer moments when `opt` is given) from checkpoint `step`.
/// `fc.weight` is returned as trained (on preconditioned features); use
/// [`load_checkpoint_scale`] for the preconditioner.
pub fn load_checkpoint(out: &Path, step: usize, cfg: &DrafterConfig, n_feat: usize, opt: Option<&mut AdamW>) -> Result<Params> {
    let (st, js) = ckpt_paths(out, step);
    sparkling::loader::bytes::regular_file(&st, "a checkpoint file")?;
    let all = candle_core::safetensors::load(&st, &Device::Cpu).map_err(|e| Error::file(&st, e))?;
    let mut params = BTreeMap::new();
    let mut m = BTreeMap::new();
    let mut v = BTreeMap::new();
    for (k, t) in all {
        if let Some(n) = k.strip_prefix("adam.m.") {
            m.insert(n.to_string(), t);
        } else if let Some(n) = k.strip_prefix("adam.v.") {
            v.insert(n.to_string(), t);
        } else if k != CTX_SCALE {
            params.insert(k, t);
        }
    }
    let p = Params::from_tensors(cfg, n_feat, params, &st.display().to_string())?;
    if let Some(o) = opt {
        let state: serde_json::Value = serde_json::from_str(&{
            sparkling::loader::bytes::regular_file(&js, "a checkpoint file")?;
            std::fs::read_to_string(&js).map_err(|e| io(&js, e))?
        })
        .map_err(|e| Error::file(&js, e))?;
        o.t = state.get("adam_t").and_then(|x| x.as_u64()).ok_or_else(|| Error::file(&js, "missing `adam_t`"))?;
        for n in p.vars.keys() {
            let (Some(a), Some(b)) = (m.remove(n), v.remove(n)) else {
                return Err(Error::file(&st, format!("optimizer moments for `{n}` missing")));
            };
            o.m.insert(n.clone(), a);
            o.v.insert(n.clone(), b);
        }
    }
    Ok(p)
}

/// The context-feature preconditioner stored in checkpoint `step`, if any.
pub fn load_checkpoint_scale(out: &Path, step: usize) -> Result<Option<Tensor>> {
    let (st, _) = ckpt_paths(out, step);
    let mut all = candle_core::safetensors::load(&st, &Device::Cpu).map_err(|e| Error::file(&st, e))?;
    Ok(all.remove(CTX_SCALE))
}

/// `fc.weight ⊙ s` (columns scaled): the raw-tap `fc` equivalent to `fc` on preconditioned taps.
pub fn fold_ctx_scale(params: &Params, scale: &Tensor) -> Result<()> {
    let fc = params.vars.get("fc.weight").ok_or_else(|| Error("parameter `fc.weight` missing".into()))?;
    let folded = fc.as_tensor().broadcast_mul(&scale.unsqueeze(0)?)?;
    fc.set(&folded)?;
    Ok(())
}

pub(crate) fn save_checkpoint(out: &Path, step: usize, p: &Params, opt: &AdamW, scale: Option<&Tensor>, state: serde_json::Value) -> Result<()> {
    let (st, js) = ckpt_paths(out, step);
    let mut all: std::collections::HashMap<String, Tensor> = std::collections::HashMap::new();
    if let Some(s) = scale {
        all.insert(CTX_SCALE.to_string(), s.clone());
    }
    for (n, v) in &p.vars {
        all.insert(n.clone(), v.as_tensor().clone());
        all.insert(format!("adam.m.{n}"), opt.m[n].clone());
        all.insert(format!("adam.v.{n}"), opt.v[n].clone());
    }
    // Through the engine's atomic writer: an interrupt removes the half-written temporary. The
    // `.json` is written last and marks a checkpoint complete: a `.safetensors` without it was
    // left by an interrupt between the two and is ours to replace (else a resume that redoes
    // this step would be refused forever).
    if st.exists() && !js.exists() {
        std::fs::remove_file(&st).map_err(|e| io(&st, e))?;
    }
    sparkling::fsio::write_with(&st, |tmp| candle_core::safetensors::save(&all, tmp).map_err(|e| sparkling::Error::file(tmp, e.to_string())))?;
    sparkling::fsio::write_bytes(&js, serde_json::to_string_pretty(&state).map_err(|e| Error::file(&js, e))?.as_bytes())?;
    // Keep the two newest checkpoints.
    if let Ok(rd) = std::fs::read_dir(out) {
        let mut steps: Vec<usize> = rd
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().strip_prefix("ckpt-").and_then(|x| x.strip_suffix(".json")).and_then(|x| x.parse().ok()))
            .collect();
        steps.sort_unstable();
        for s in steps.iter().rev().skip(2) {
            let (a, b) = ckpt_paths(out, *s);
            let _ = std::fs::remove_file(a);
            let _ = std::fs::remove_file(b);
        }
    }
    Ok(())
}

/// The lock file of a run directory or training cache: held (an advisory exclusive lock) by the
/// process writing it, released when that process ends however it ends.
pub const LOCK_FILE: &str = ".run.lock";

/// Exclusive use of a run directory (`train`) or training cache (`gen-data`) by one process:
/// two runs into one `--out` would mix their checkpoints and logs, two gen-data runs would
/// replace each other's answers. Dropping it releases the lock.
#[derive(Debug)]
pub struct RunLock(#[allow(dead_code)] std::fs::File);

impl RunLock {
    /// Lock `out/.run.lock`. Errors: another process holds it (naming the directory), I/O.
    pub fn take(out: &Path) -> Result<RunLock> {
        let p = out.join(LOCK_FILE);
        let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&p).map_err(|e| io(&p, e))?;
        match f.try_lock() {
            Ok(()) => Ok(RunLock(f)),
            Err(std::fs::TryLockError::WouldBlock) => Err(Error::file(
                out,
                "another sparkling-train process is writing this directory (a training run or a gen-data cache); wait for it to finish or choose another --out",
            )),
            Err(std::fs::TryLockError::Error(e)) => Err(io(&p, e)),
        }
    }
}

/// `rc` with its cache and target paths canonical (when they exist), for comparing runs.
fn canonical_paths(rc: &RunConfig) -> RunConfig {
    let canon = |p: &str| std::fs::canonicalize(p).map(|c| c.display().to_string()).unwrap_or_else(|_| p.to_string());
    RunConfig { cache: canon(&rc.cache), target: canon(&rc.target), ..rc.clone() }
}

/// Make `out` ready for run `rc`: a new or empty directory is created; an existing
/// run directory must hold the same run (`--steps` may change on `resume`), except that a run
/// which stopped before its first checkpoint is started afresh there (its `run.json`, frozen
/// file list, draft vocabulary and log are removed). Errors: a non-empty directory that is not
/// a run, a different run (naming the options that differ when resuming), another process
/// training into `out` (the returned [`RunLock`] is held for the whole run), I/O (naming the path).
pub fn prepare_run_dir(out: &Path, rc: &RunConfig, resume: bool) -> Result<RunLock> {
    let run_json = out.join("run.json");
    if !run_json.exists() && std::fs::read_dir(out).is_ok_and(|r| r.flatten().any(|e| e.file_name() != LOCK_FILE)) {
        return Err(Error::file(out, "--out: not empty and not a training run (no run.json); choose a new directory"));
    }
    std::fs::create_dir_all(out).map_err(|e| io(out, e))?;
    let lock = RunLock::take(out)?;
    let remove = |f: &str| match std::fs::remove_file(out.join(f)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(&out.join(f), e)),
        _ => Ok(()),
    };
    if latest_checkpoint(out)?.is_none() {
        // A run without a checkpoint starts at step 0: an earlier attempt's log goes.
        remove("log.jsonl")?;
        // A run that stopped before its first checkpoint (an error or an interrupt after
        // `run.json` was written) has nothing to resume: its frozen files are replaced, so a
        // rerun with other options is not refused forever.
        if run_json.exists() && read_run_config(out).map_or(true, |old| canonical_paths(&old) != canonical_paths(rc)) {
            eprintln!("note: {} holds a run that never reached a checkpoint; starting this run there afresh", out.display());
            for f in ["run.json", DATA_FILE, DRAFT_VOCAB_FILE] {
                remove(f)?;
            }
        }
    }
    if run_json.exists() {
        let old = read_run_config(out)?;
        // `--steps` may change on resume (the cosine schedule then follows the new length);
        // the cache and target may be named by another path to the same file.
        let same = RunConfig { steps: rc.steps, ..canonical_paths(&old) } == canonical_paths(rc);
        if !same || (!resume && old.steps != rc.steps) {
            if resume {
                let (a, b) = (serde_json::to_value(&old).unwrap_or_default(), serde_json::to_value(rc).unwrap_or_default());
                let differ: Vec<String> = match (a.as_object(), b.as_object()) {
                    (Some(a), Some(b)) => a
                        .iter()
                        .filter(|(k, v)| k.as_str() != "steps" && b.get(k.as_str()) != Some(*v))
                        .map(|(k, v)| format!("{k}: run {v}, now {}", b.get(k.as_str()).cloned().unwrap_or_default()))
                        .collect(),
                    _ => Vec::new(),
                };
                return Err(Error::file(
                    &run_json,
                    format!("the run's options differ from this invocation's ({}); resume with the same options", differ.join("; ")),
                ));
            }
            return Err(Error::file(&run_json, "a different run lives here; pass another --out (or --resume with the same options)"));
        }
    }
    Ok(lock)
}

/// Keep only the records of steps ≤ `step` in `out/log.jsonl` (a resumed run redoes the steps
/// after its checkpoint; their earlier lines would appear twice). Unparseable lines are kept.
pub fn truncate_log(out: &Path, step: usize) -> Result<()> {
    let p = out.join("log.jsonl");
    let Ok(text) = std::fs::read_to_string(&p) else { return Ok(()) };
    let keep: Vec<&str> = text
        .lines()
        .filter(|l| serde_json::from_str::<serde_json::Value>(l).ok().and_then(|v| v.get("step").and_then(|s| s.as_u64())).is_none_or(|s| s as usize <= step))
        .collect();
    if keep.len() != text.lines().count() {
        let mut body = keep.join("\n");
        body.push('\n');
        sparkling::fsio::write_bytes(&p, body.as_bytes())?;
    }
    Ok(())
}

/// Read `run.json` of a run directory.
pub fn read_run_config(out: &Path) -> Result<RunConfig> {
    let p = out.join("run.json");
    sparkling::loader::bytes::regular_file(&p, "a run or cache file")?;
    let text = std::fs::read_to_string(&p).map_err(|e| io(&p, e))?;
    serde_json::from_str(&text).map_err(|e| Error::file(&p, format!("invalid run config: {e}")))
}

/// The cache files of a run: read from `out/data.json` when the run has one (a resumed run
/// trains on exactly the files it started with, in the same order, so the holdout and the
/// sequence order do not move while `gen-data` appends to the cache), else listed now — the
/// first `max_seqs` by name — and frozen into `data.json`. Errors name the file.
pub fn frozen_file_list(rc: &RunConfig, out: &Path) -> Result<Vec<String>> {
    let p = out.join(DATA_FILE);
    if p.exists() {
        sparkling::loader::bytes::regular_file(&p, "a run or cache file")?;
        let text = std::fs::read_to_string(&p).map_err(|e| io(&p, e))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::file(&p, format!("invalid JSON: {e}")))?;
        return v
            .get("files")
            .and_then(|x| x.as_array())
            .ok_or_else(|| Error::file(&p, "no `files` array"))?
            .iter()
            .map(|x| x.as_str().map(str::to_string).ok_or_else(|| Error::file(&p, "`files`: non-string entry")))
            .collect();
    }
    let mut names = list(Path::new(&rc.cache))?;
    if let Some(m) = rc.max_seqs {
        names.truncate(m);
    }
    let v = serde_json::json!({"cache": rc.cache, "files": names});
    sparkling::fsio::write_bytes(&p, serde_json::to_string_pretty(&v).map_err(|e| Error::file(&p, e))?.as_bytes())?;
    Ok(names)
}

/// The draft vocabulary of a run (`None`: full vocabulary): read from `out/draft_vocab.json`
/// when present (resume), else counted on `train` ([`count_draft_vocab`]) and written there
/// with its coverage of the train and holdout answers.
pub(crate) fn frozen_draft_vocab(rc: &RunConfig, out: &Path, train: &[Sequence], hold: &[Sequence], tcfg: &TargetConfig) -> Result<Option<DraftVocab>> {
    let Some(vd) = rc.draft_vocab else { return Ok(None) };
    if out.join(DRAFT_VOCAB_FILE).exists() {
        return read_draft_vocab(out, rc, tcfg.vocab);
    }
    let (dv, cov) = count_draft_vocab(train, tcfg.vocab, vd, &tcfg.eos)?;
    let mut hc = vec![0u64; tcfg.vocab];
    for s in hold {
        s.tokens[s.prompt_len..].iter().for_each(|&t| hc[t as usize] += 1);
    }
    let hold_cov = sparkling::model::reduce::coverage(&hc, dv.draft_to_target());
    let answers: usize = train.iter().map(|s| s.len() - s.prompt_len).sum();
    eprintln!("draft vocabulary: V_d = {vd} covers {:.2} % of the train answers' tokens, {:.2} % of the holdout answers'", cov * 100.0, hold_cov * 100.0);
    let v = serde_json::json!({
        "draft_vocab_size": dv.len(),
        "counted": format!("answer tokens of the {} training sequences ({answers} tokens); ties: their prompt tokens, then lower id; always: eos {:?}", train.len(), tcfg.eos),
        "coverage_train_answers": cov,
        "coverage_holdout_answers": hold_cov,
        "draft_to_target": dv.draft_to_target(),
    });
    let p = out.join(DRAFT_VOCAB_FILE);
    sparkling::fsio::write_bytes(&p, serde_json::to_string(&v).map_err(|e| Error::file(&p, e))?.as_bytes())?;
    Ok(Some(dv))
}
