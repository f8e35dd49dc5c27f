//! `train`: the training loop (DFlash / DeepSpec recipe, reference §3.6–3.8 and §6.3).
//!
//! Each step takes `seqs_per_step` cached sequences (a seeded permutation per epoch) and
//! `anchors` distinct anchor positions `S` in each one's answer (`prompt_len ≤ S ≤ n-2`). For an
//! anchor the drafter sees the taps of **every** token before `S` (the whole context, as the
//! engine's draft cache does) and the block `[token_S, mask × (Bk-1)]`. Labels are the target's
//! greedy tokens: DSpark slot `j` → position `S+1+j` (shifted, depths 1..Bk), DFlash slot `j ≥ 1`
//! → position `S+j` (in place, depths 1..Bk-1); slots past the end of the sequence are dropped.
//! Each row's loss is weighted by `w_k = exp(-(k-1)/γ)` (depth `k`), and the step loss is
//! `Σ w_k (α_ce·ce + α_kl·kl + α_l1·l1) / Σ w_k` ([`crate::head`]) plus, for DSpark,
//! `α_conf · BCE(sigmoid(w·[h_k ; W1[t_{k-1}]] + b), 1 − ½ l1)` (inputs detached: the head is
//! auxiliary and does not steer the backbone). The Markov bias `W2·W1[t_{k-1}]` is added to
//! slot `k`'s logits with teacher forcing (`t_{k-1}` = the previous label, the anchor for
//! `k = 1`), so the backbone and the head are trained jointly.
//!
//! Determinism: sequence order and anchors are pure functions of `(seed, step)`
//! ([`crate::rng`]), parameters are initialised from the seed, and candle's CPU kernels are
//! deterministic for a fixed thread count; `--resume` restores parameters and AdamW moments.

use crate::cache::{load_files, CacheMeta, Sequence};
use crate::checkpoint::{ckpt_paths, frozen_draft_vocab, frozen_file_list, latest_checkpoint, load_checkpoint, prepare_run_dir, save_checkpoint};
use crate::error::{io, Error, Result};
use crate::eval::{evaluate, Metrics};
use crate::gen::load_lm_head;
use crate::head::{vocab_head, HeadTargets, ABSENT, N_COLS};
use crate::model::{feature_scale, BlockInput, CandleDrafter, Params};
use crate::optim::{lr_at, AdamW, AdamWConfig};
use crate::rng::Rng;
use candle_core::{Device, Tensor};
use indicatif::{ProgressBar, ProgressStyle};
use sparkling::model::config::{DrafterConfig, DrafterKind, TargetConfig};
use sparkling::model::draft_vocab::DraftVocab;
use sparkling::model::synth::{drafter_config, DrafterInit};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Everything that defines a training run; stored as `run.json` in the run directory.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunConfig {
    /// `dspark` or `dflash`.
    pub kind: String,
    /// Target checkpoint (for the frozen embedding / lm_head and its geometry).
    pub target: String,
    /// Training-cache directory.
    pub cache: String,
    /// Draft layers.
    pub layers: usize,
    /// Block size Bk.
    pub block_size: usize,
    /// Markov rank r (DSpark; 0 = none).
    pub markov_rank: usize,
    /// Train a confidence head (DSpark).
    pub confidence: bool,
    /// Optimizer steps (the cosine schedule's length).
    pub steps: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Warm-up steps.
    pub warmup: usize,
    /// Final learning rate as a fraction of the peak.
    pub min_lr_ratio: f64,
    /// Sequences per step.
    pub seqs_per_step: usize,
    /// Anchors per sequence.
    pub anchors: usize,
    /// Position-weight decay γ (`w_k = exp(-(k-1)/γ)`).
    pub gamma: f64,
    /// Weight of the CE-to-greedy-token loss.
    pub w_ce: f64,
    /// Weight of the KL(target top-k ‖ draft) loss.
    pub w_kl: f64,
    /// Weight of the L1 distribution-matching loss.
    pub w_l1: f64,
    /// Weight of the confidence-head BCE.
    pub w_conf: f64,
    /// AdamW weight decay.
    pub weight_decay: f64,
    /// Gradient-norm clip.
    pub clip: f64,
    /// Seed.
    pub seed: u64,
    /// Sequences (highest ids) held out for validation.
    pub holdout: usize,
    /// Warm start: copy target layers `init_from_target..+layers` into the draft layers (see
    /// [`crate::warm_start::from_target`]); `None` = random initialisation.
    #[serde(default)]
    pub init_from_target: Option<usize>,
    /// Warm start from a trained drafter (`--init-from DIR`, an exported checkpoint): every
    /// parameter starts at its value there (see [`crate::warm_start::from_drafter`]); `None` = no such start.
    #[serde(default)]
    pub init_from: Option<String>,
    /// Reduced draft vocabulary V_d (`--draft-vocab`): the output layer and the Markov `W2`
    /// cover the V_d most frequent target ids of the training answers ([`count_draft_vocab`]);
    /// `None` = the full vocabulary.
    #[serde(default)]
    pub draft_vocab: Option<usize>,
    /// Use only the first N cache files (by name) of the snapshot (`--max-seqs`); `None` = all
    /// files present when the run starts.
    #[serde(default)]
    pub max_seqs: Option<usize>,
    /// The cached tap layers the drafter reads (`--use-taps`; a subset of the cache's, in the
    /// drafter's `target_layer_ids` order); `None` = every cached tap.
    #[serde(default)]
    pub use_taps: Option<Vec<usize>>,
}

impl RunConfig {
    /// The drafter kind.
    pub fn drafter_kind(&self) -> Result<DrafterKind> {
        match self.kind.as_str() {
            "dspark" => Ok(DrafterKind::DSpark),
            "dflash" => Ok(DrafterKind::DFlash),
            // The EAGLE-style reference head (`crate::eagle`) borrows a drafter config for its
            // geometry only (hidden, heads, MLP, layers, RoPE).
            "eagle" => Ok(DrafterKind::DSpark),
            k => Err(Error::arg("kind", format!("`{k}` (expected dspark, dflash or eagle)"))),
        }
    }

    /// Check the numeric options; errors name the argument.
    pub fn validate(&self) -> Result<()> {
        self.drafter_kind()?;
        let pos = |name: &str, v: usize| if v == 0 { Err(Error::arg(name, "must be ≥ 1")) } else { Ok(()) };
        pos("layers", self.layers)?;
        pos("steps", self.steps)?;
        pos("seqs-per-step", self.seqs_per_step)?;
        pos("anchors", self.anchors)?;
        // Upper bounds by what the values can mean (huge values would abort on allocation
        // or run out of memory): DFlash / DSpark blocks are 7–16 rows, drafters a few layers.
        let at_most = |name: &str, v: usize, max: usize, what: &str| {
            if v > max {
                Err(Error::arg(name, format!("{v} is more than {max} ({what})")))
            } else {
                Ok(())
            }
        };
        at_most("layers", self.layers, 64, "drafters have 1–5 layers")?;
        at_most("block-size", self.block_size, 64, "DFlash / DSpark blocks have 7–16 rows")?;
        at_most("markov-rank", self.markov_rank, 4096, "the DSpark head has rank 32–256")?;
        at_most("seqs-per-step", self.seqs_per_step, 4096, "sequences per optimizer step")?;
        at_most("anchors", self.anchors, 4096, "anchor positions per sequence")?;
        at_most("steps", self.steps, 100_000_000, "optimizer steps")?;
        if self.block_size < 2 {
            return Err(Error::arg("block-size", "must be ≥ 2"));
        }
        if !(self.min_lr_ratio.is_finite() && (0.0..=1.0).contains(&self.min_lr_ratio)) {
            return Err(Error::arg("min-lr-ratio", format!("{} must be in 0..=1 (the final learning rate as a fraction of --lr)", self.min_lr_ratio)));
        }
        if !(self.clip.is_finite() && self.clip > 0.0) {
            return Err(Error::arg("clip", format!("{} must be a positive number (the gradient-norm clip)", self.clip)));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(Error::arg("weight-decay", format!("{} must be a finite number ≥ 0", self.weight_decay)));
        }
        if self.warmup > self.steps {
            return Err(Error::arg("warmup", format!("{} warm-up steps exceed the {} steps of the run", self.warmup, self.steps)));
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return Err(Error::arg("lr", "must be a positive number"));
        }
        if self.gamma.is_nan() || self.gamma <= 0.0 {
            return Err(Error::arg("gamma", "must be positive"));
        }
        if self.draft_vocab == Some(0) {
            return Err(Error::arg("draft-vocab", "must be ≥ 1"));
        }
        if self.max_seqs == Some(0) {
            return Err(Error::arg("max-seqs", "must be ≥ 1"));
        }
        if self.init_from.is_some() && self.init_from_target.is_some() {
            return Err(Error::arg("init-from", "give --init-from (a trained drafter) or --init-from-target (the target's layers), not both"));
        }
        for (w, arg) in [(self.w_ce, "ce"), (self.w_kl, "kl"), (self.w_l1, "l1"), (self.w_conf, "conf")] {
            if !(w.is_finite() && w >= 0.0) {
                return Err(Error::arg(arg, format!("{w}: a loss weight must be a finite number ≥ 0")));
            }
        }
        if self.w_ce + self.w_kl + self.w_l1 <= 0.0 {
            return Err(Error::arg("ce/kl/l1", "the loss weights --ce, --kl and --l1 are all zero: nothing would be trained"));
        }
        Ok(())
    }
}

/// The drafter config of a run for a target whose cache taps `tap_layers`.
pub fn drafter_cfg(rc: &RunConfig, target: &TargetConfig, tap_layers: &[usize]) -> Result<DrafterConfig> {
    let kind = rc.drafter_kind()?;
    let init = DrafterInit {
        kind,
        layers: rc.layers,
        block_size: rc.block_size,
        markov_rank: rc.markov_rank,
        taps: tap_layers.len(),
        mask_token_id: None,
        confidence_head: rc.confidence,
    };
    let mut c = drafter_config(target, &init);
    c.target_layer_ids = tap_layers.to_vec();
    if let Some(vd) = rc.draft_vocab {
        if vd > target.vocab {
            return Err(Error::arg("draft-vocab", format!("{vd} exceeds the target vocabulary of {}", target.vocab)));
        }
        c.draft_vocab = vd;
        c.reduced = true;
    }
    Ok(c)
}

/// The draft vocabulary of a run: the `v_d` most frequent target ids among the **answer**
/// tokens of `train` (the target's own greedy generations), ties broken by the ids' counts in
/// the training prompts and then by lower id, the target's `eos` ids always included — the
/// rule of `sparkling reduce-vocab` ([`sparkling::model::reduce::top_ids`]). Holdout sequences
/// are not counted. Returns the map and the share of the counted answer tokens it covers.
pub fn count_draft_vocab(train: &[Sequence], vocab: usize, v_d: usize, eos: &[u32]) -> Result<(DraftVocab, f64)> {
    let mut counts = vec![0u64; vocab];
    let mut prompt = vec![0u64; vocab];
    for s in train {
        for (i, &t) in s.tokens.iter().enumerate() {
            let c = if i < s.prompt_len { &mut prompt } else { &mut counts };
            if let Some(x) = c.get_mut(t as usize) {
                *x += 1;
            }
        }
    }
    let ids = sparkling::model::reduce::top_ids(&counts, &prompt, v_d, eos);
    let cov = sparkling::model::reduce::coverage(&counts, &ids);
    Ok((DraftVocab::from_ids(&ids, vocab)?, cov))
}

/// Load the frozen target lm_head/embedding as a candle tensor `[V, H]` plus the target config.
pub fn target_head(target: &Path) -> Result<(Tensor, TargetConfig)> {
    let (data, cfg) = load_lm_head(target)?;
    Ok((Tensor::from_vec(data, (cfg.vocab, cfg.hidden), &Device::Cpu)?, cfg))
}

/// Rows of one step: where each loss row comes from.
pub(crate) struct Rows {
    /// Selected backbone rows `[R, H]`.
    h: Tensor,
    /// Per row: anchor index (within the step), depth k (1-based).
    pub(crate) meta: Vec<(usize, usize)>,
    /// Previous tokens (Markov conditioning).
    prev: Vec<u32>,
    /// Head targets.
    tg: HeadTargets,
    /// Position weights.
    w: Vec<f32>,
}

/// Forward the backbone over `(sequence, anchors)` pairs and gather the loss rows; with a
/// reduced draft vocabulary the labels and top-k ids become draft ids ([`ABSENT`] outside it).
pub(crate) fn gather_rows(m: &CandleDrafter, items: &[(&Sequence, Vec<usize>)], topk: usize, gamma: f64) -> Result<Rows> {
    let bk = m.cfg.block_size;
    let mut hs = Vec::new();
    let mut meta = Vec::new();
    let mut prev = Vec::new();
    let mut tg = HeadTargets { labels: Vec::new(), k: topk, top_ids: Vec::new(), top_logp: Vec::new() };
    let mut w = Vec::new();
    let mut anchor_base = 0;
    for (seq, anchors) in items {
        let lc = *anchors.iter().max().ok_or_else(|| Error("no anchors".into()))?;
        let ctx = Tensor::from_vec(seq.taps_f32(0, lc), (lc, seq.width), &Device::Cpu)?;
        let anchor_ids: Vec<u32> = anchors.iter().map(|&s| seq.tokens[s]).collect();
        let out = m.backbone(&BlockInput { ctx, anchors: anchors.clone(), anchor_ids })?;
        let mut sel = Vec::new();
        for (a, &s) in anchors.iter().enumerate() {
            for j in m.draft_slots() {
                let (q, depth) = match m.cfg.kind {
                    DrafterKind::DSpark => (s + 1 + j, j + 1),
                    DrafterKind::DFlash => (s + j, j),
                };
                let Some((ids, lp)) = seq.topk_at(q) else { continue };
                sel.push((a * bk + j) as u32);
                meta.push((anchor_base + a, depth));
                prev.push(seq.tokens[q - 1]);
                match &m.draft_vocab {
                    None => {
                        tg.labels.push(seq.tokens[q]);
                        tg.top_ids.extend_from_slice(&ids[..topk]);
                    }
                    Some(dv) => {
                        tg.labels.push(dv.draft_id(seq.tokens[q]).unwrap_or(ABSENT));
                        tg.top_ids.extend(ids[..topk].iter().map(|&t| dv.draft_id(t).unwrap_or(ABSENT)));
                    }
                }
                tg.top_logp.extend_from_slice(&lp[..topk]);
                w.push((-((depth - 1) as f64) / gamma).exp() as f32);
            }
        }
        anchor_base += anchors.len();
        hs.push(out.index_select(&Tensor::from_vec(sel.clone(), sel.len(), &Device::Cpu)?, 0)?);
    }
    let h = Tensor::cat(&hs, 0)?;
    Ok(Rows { h, meta, prev, tg, w })
}

/// Compute the loss (a scalar tensor) and metrics for a set of rows.
pub(crate) fn loss_and_metrics(m: &CandleDrafter, rows: Rows, rc: &RunConfig, n_anchors: usize) -> Result<(Tensor, Metrics)> {
    let r = rows.w.len();
    let bias = m.markov_bias(&rows.prev)?;
    let out = vocab_head(&rows.h, &m.lm_head, bias.as_ref().map(|b| &b.0), rows.tg)?;
    let wsum: f64 = rows.w.iter().map(|&x| x as f64).sum::<f64>().max(1e-12);
    let coef: Vec<f32> = rows
        .w
        .iter()
        .flat_map(|&w| {
            let s = w as f64 / wsum;
            [(s * rc.w_ce) as f32, (s * rc.w_kl) as f32, (s * rc.w_l1) as f32, 0.0]
        })
        .collect();
    let coef_t = Tensor::from_vec(coef, (r, N_COLS), &Device::Cpu)?;
    let mut loss = out.mul(&coef_t)?.sum_all()?;
    let host: Vec<f32> = out.flatten_all()?.to_vec1()?;
    let mut mt = Metrics { rows: r, ..Metrics::default() };
    for (i, &w) in rows.w.iter().enumerate() {
        let s = w as f64 / wsum;
        mt.ce += s * host[i * N_COLS] as f64;
        mt.kl += s * host[i * N_COLS + 1] as f64;
        mt.l1 += s * host[i * N_COLS + 2] as f64;
    }
    if m.cfg.kind == DrafterKind::DSpark && m.cfg.confidence_head {
        let e = bias.as_ref().map(|(_, e)| e.detach());
        let x = m.confidence_logits(&rows.h.detach(), e.as_ref())?;
        let target: Vec<f32> = (0..r).map(|i| (1.0 - 0.5 * host[i * N_COLS + 2]).clamp(0.0, 1.0)).collect();
        let target = Tensor::from_vec(target, r, &Device::Cpu)?;
        let softplus = (x.relu()? + ((x.abs()?.neg()?.exp()? + 1.0)?.log()?))?;
        let bce = (softplus - (&x * &target)?)?;
        let wt = Tensor::from_vec(rows.w.iter().map(|&w| (w as f64 / wsum) as f32).collect::<Vec<_>>(), r, &Device::Cpu)?;
        let conf = (bce * wt)?.sum_all()?;
        mt.conf = conf.to_scalar::<f32>()? as f64;
        loss = (loss + (conf * rc.w_conf)?)?;
    }
    mt.loss = loss.to_scalar::<f32>()? as f64;
    // Per-depth agreement and the greedy chain's accepted length.
    let depth = m.cfg.draft_depth();
    let mut hit = vec![0f64; depth];
    let mut cnt = vec![0f64; depth];
    let mut lead = vec![0usize; n_anchors];
    let mut alive = vec![true; n_anchors];
    let mut order: Vec<usize> = (0..r).collect();
    order.sort_by_key(|&i| rows.meta[i]);
    for i in order {
        let (a, k) = rows.meta[i];
        let h = host[i * N_COLS + 3] > 0.5;
        cnt[k - 1] += 1.0;
        if h {
            hit[k - 1] += 1.0;
        }
        if alive[a] {
            if h {
                lead[a] += 1;
            } else {
                alive[a] = false;
            }
        }
    }
    mt.acc = hit.iter().zip(&cnt).map(|(h, c)| if *c > 0.0 { h / c } else { 0.0 }).collect();
    mt.tau_chain = 1.0 + lead.iter().sum::<usize>() as f64 / n_anchors.max(1) as f64;
    Ok((loss, mt))
}

/// The training data split: (train, holdout).
pub fn split(mut seqs: Vec<Sequence>, holdout: usize) -> (Vec<Sequence>, Vec<Sequence>) {
    seqs.retain(|s| s.len() >= s.prompt_len + 2);
    let h = holdout.min(seqs.len() / 2);
    let hold = seqs.split_off(seqs.len() - h);
    (seqs, hold)
}

/// The sequences and anchors of step `step`.
fn step_items<'a>(train: &'a [Sequence], rc: &RunConfig, step: usize, perms: &mut BTreeMap<usize, Vec<usize>>) -> Vec<(&'a Sequence, Vec<usize>)> {
    let n = train.len();
    (0..rc.seqs_per_step)
        .map(|i| {
            let g = step * rc.seqs_per_step + i;
            let epoch = g / n;
            let perm = perms.entry(epoch).or_insert_with(|| {
                let mut p: Vec<usize> = (0..n).collect();
                Rng::new(rc.seed, 1_000_000 + epoch as u64).shuffle(&mut p);
                p
            });
            let seq = &train[perm[g % n]];
            let anchors = Rng::new(rc.seed, (1u64 << 40) + g as u64).sample_distinct(seq.prompt_len, seq.len() - 1, rc.anchors);
            (seq, anchors)
        })
        .collect()
}

/// Options of one `train` invocation that are not part of the run's identity.
#[derive(Debug, Clone)]
pub struct TrainControl {
    /// Run directory (checkpoints, `run.json`, `log.jsonl`).
    pub out: PathBuf,
    /// Continue from the newest checkpoint in `out`.
    pub resume: bool,
    /// Checkpoint every this many steps.
    pub ckpt_every: usize,
    /// Evaluate on the holdout every this many steps (0 = only at the end).
    pub eval_every: usize,
    /// Stop (with a checkpoint) after this many minutes.
    pub max_minutes: Option<f64>,
}

/// Everything needed to rebuild a run's drafter: cache meta (its `tap_layers` narrowed to
/// `--use-taps`, which [`load_files`] then selects), target config, drafter config.
pub fn run_context(rc: &RunConfig) -> Result<(CacheMeta, Tensor, TargetConfig, DrafterConfig)> {
    let cache = PathBuf::from(&rc.cache);
    let meta = CacheMeta::read(&cache)?.ok_or_else(|| Error::file(&cache, "no meta.json: not a training cache (run gen-data first)"))?;
    let (head, tcfg) = target_head(Path::new(&rc.target))?;
    if tcfg.hidden != meta.hidden || tcfg.vocab != meta.vocab {
        return Err(Error::file(&cache, format!("cache is for H {} / V {} but the target has H {} / V {}", meta.hidden, meta.vocab, tcfg.hidden, tcfg.vocab)));
    }
    if let Some(&bad) = meta.tap_layers.iter().find(|&&l| l >= tcfg.layers) {
        return Err(Error::file(
            &cache.join("meta.json"),
            format!("tap layer {bad} is not a layer of the target's {}: this cache was made for another target", tcfg.layers),
        ));
    }
    let meta = match &rc.use_taps {
        None => meta,
        Some(sel) => {
            if sel.is_empty() {
                return Err(Error::arg("use-taps", "give at least one tap layer"));
            }
            if let Some(&bad) = sel.iter().find(|l| !meta.tap_layers.contains(l)) {
                return Err(Error::arg("use-taps", format!("layer {bad} is not in the cache {} (its tap layers are {:?})", cache.display(), meta.tap_layers)));
            }
            let mut d = sel.clone();
            d.sort_unstable();
            d.dedup();
            if d.len() != sel.len() {
                return Err(Error::arg("use-taps", format!("{sel:?} lists a layer twice")));
            }
            CacheMeta { tap_layers: sel.clone(), ..meta }
        }
    };
    let dcfg = drafter_cfg(rc, &tcfg, &meta.tap_layers)?;
    Ok((meta, head, tcfg, dcfg))
}

/// Print a line above the progress bar, or to stderr when the bar is hidden (not a terminal:
/// a background run's log file), where `println` on the bar would drop it.
pub(crate) fn say(pb: &ProgressBar, line: String) {
    if pb.is_hidden() {
        eprintln!("{line}");
    } else {
        pb.println(line);
    }
}

/// Largest number of logits (loss rows × output vocabulary) one optimizer step may hold:
/// 2^28 f32 = 1 GiB before the head's gradient buffers (the default step: 512 rows × V_d).
pub const MAX_STEP_LOGITS: usize = 1 << 28;

/// Refuse a step whose logits would not fit in memory (`--seqs-per-step 1000` would grow
/// without bound and abort): `seqs_per_step × anchors × block_size` loss rows over `vocab`
/// output columns must stay within [`MAX_STEP_LOGITS`].
pub fn check_step_size(rc: &RunConfig, vocab: usize) -> Result<()> {
    let rows = rc.seqs_per_step * rc.anchors * rc.block_size;
    if rows.saturating_mul(vocab) > MAX_STEP_LOGITS {
        return Err(Error::arg(
            "seqs-per-step",
            format!(
                "{} sequences × {} anchors × block {} = {rows} loss rows over {vocab} output tokens is more than one step can hold ({} logits); lower --seqs-per-step or --anchors",
                rc.seqs_per_step, rc.anchors, rc.block_size, MAX_STEP_LOGITS
            ),
        ));
    }
    Ok(())
}

/// Run (or resume) training. Returns the final holdout metrics.
pub fn run(rc: &RunConfig, ctl: &TrainControl) -> Result<Metrics> {
    rc.validate()?;
    if ctl.ckpt_every == 0 {
        return Err(Error::arg("ckpt-every", "must be ≥ 1"));
    }
    let _lock = prepare_run_dir(&ctl.out, rc, ctl.resume)?;
    let run_json = ctl.out.join("run.json");
    let (meta, head, tcfg, dcfg) = run_context(rc)?;
    check_step_size(rc, dcfg.draft_vocab)?;
    if !sparkling::fsio::same_file(Path::new(&meta.target), Path::new(&rc.target)) {
        // Same geometry (checked), maybe not the same model (a random target of the
        // same shape would otherwise train without a word, at a far higher loss).
        eprintln!(
            "warning: the cache was generated by {}, but --target is {}: the drafter learns the cache's answers and hidden states with --target's embedding and lm_head, so both must be the same model",
            meta.target, rc.target
        );
    }
    let n_feat = meta.width();
    // Both refusals before the cache loads (minutes for a large one).
    let newest = latest_checkpoint(&ctl.out)?;
    if !ctl.resume && newest.is_some() {
        return Err(Error::file(&ctl.out, "holds checkpoints already; pass --resume to continue or another --out"));
    }
    let start = if ctl.resume { newest.unwrap_or(0) } else { 0 };
    if let (Some(dir), 0) = (&rc.init_from, start) {
        crate::warm_start::check_drafter(Path::new(dir), &dcfg)?;
    }
    let t_load = Instant::now();
    let seqs = load_files(Path::new(&rc.cache), &meta, &frozen_file_list(rc, &ctl.out)?)?;
    let (train, hold) = split(seqs, rc.holdout);
    if hold.len() < rc.holdout {
        eprintln!(
            "note: --holdout {} leaves too few training sequences; holding out {} of {} (at most half)",
            rc.holdout,
            hold.len(),
            train.len() + hold.len()
        );
    }
    if train.is_empty() {
        return Err(Error::file(Path::new(&rc.cache), "no usable sequences (run gen-data first)"));
    }
    let topk = meta.topk;
    eprintln!(
        "data: {} train / {} holdout sequences, {} train tokens ({:.1}s to load)",
        train.len(),
        hold.len(),
        train.iter().map(|s| s.len()).sum::<usize>(),
        t_load.elapsed().as_secs_f64()
    );
    sparkling::fsio::write_bytes(&run_json, serde_json::to_string_pretty(rc).map_err(|e| Error::file(&run_json, e))?.as_bytes())?;
    let ocfg = AdamWConfig { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: rc.weight_decay, clip: rc.clip };
    if start >= rc.steps {
        eprintln!("note: this run is at step {start}, which reaches --steps {}: nothing left to train (raise --steps to continue)", rc.steps);
    }
    if ctl.resume && start == 0 {
        // Not an error: rerunning one command (with --resume) starts the run and continues it.
        eprintln!("--resume: no checkpoint in {} yet, so this starts a new run there", ctl.out.display());
    }
    // Final norm at 0.1: with 1s (or the target's own final-norm weights) random hidden states
    // through SmolLM2's borrowed lm_head give logits so large that the first CE is 75–120 nats;
    // at 0.1 it starts near ln V.
    let final_norm = vec![0.1f32; dcfg.hidden];
    {
        let row_norm = |i: u32| -> Result<f32> { Ok(head.get(i as usize)?.sqr()?.sum_all()?.sqrt()?.to_scalar::<f32>()?) };
        let mean: f32 = (0..64u32).map(|i| row_norm(i * 700).unwrap_or(0.0)).sum::<f32>() / 64.0;
        eprintln!("embedding: |E[mask={}]| = {:.4}, mean |E[v]| = {mean:.4}", dcfg.mask_token_id, row_norm(dcfg.mask_token_id)?);
    }
    let (params, mut opt, mut elapsed0) = if start > 0 {
        let init = Params::init(&dcfg, n_feat, rc.seed, Some(&final_norm))?;
        let mut opt = AdamW::new(ocfg, &init)?;
        let p = load_checkpoint(&ctl.out, start, &dcfg, n_feat, Some(&mut opt))?;
        let (_, js) = ckpt_paths(&ctl.out, start);
        let st: serde_json::Value = serde_json::from_str(&{
            sparkling::loader::bytes::regular_file(&js, "a checkpoint file")?;
            std::fs::read_to_string(&js).map_err(|e| io(&js, e))?
        })
        .map_err(|e| Error::file(&js, e))?;
        eprintln!("resuming from step {start}");
        crate::checkpoint::truncate_log(&ctl.out, start)?;
        (p, opt, st.get("elapsed_s").and_then(|x| x.as_f64()).unwrap_or(0.0))
    } else {
        let p = Params::init(&dcfg, n_feat, rc.seed, Some(&final_norm))?;
        let opt = AdamW::new(ocfg, &p)?;
        (p, opt, 0.0)
    };
    eprintln!(
        "drafter: {:?}, {} layers, block {}, Markov rank {}, {} trainable parameters",
        dcfg.kind,
        dcfg.layers,
        dcfg.block_size,
        dcfg.markov_rank,
        params.count()
    );
    let scale = feature_scale(train.iter().flat_map(|q| q.taps.iter().map(|v| v.to_f32())), n_feat);
    if let (Some(first), 0) = (rc.init_from_target, start) {
        let h = tcfg.hidden;
        let mut rows = Vec::new();
        for q in train.iter().take(4) {
            for i in 0..q.len().min(128) {
                rows.extend(q.taps[i * q.width..i * q.width + h].iter().map(|v| v.to_f32()));
            }
        }
        let sample = Tensor::from_vec(rows.clone(), (rows.len() / h, h), &Device::Cpu)?;
        crate::warm_start::from_target(&params, Path::new(&rc.target), &tcfg, &dcfg, first, &scale, &sample)?;
        eprintln!("warm start: draft layers ← target layers {first}..{}", first + dcfg.layers);
    }
    let draft_vocab = frozen_draft_vocab(rc, &ctl.out, &train, &hold, &tcfg)?;
    if let (Some(dir), 0) = (&rc.init_from, start) {
        let from = crate::warm_start::from_drafter(&params, Path::new(dir), &dcfg, n_feat, &scale, draft_vocab.as_ref())?;
        eprintln!("warm start: every parameter from the drafter {dir} ({from})");
    }
    let scale_t = Tensor::from_vec(scale, n_feat, &Device::Cpu)?;
    let lm_head = match &draft_vocab {
        Some(dv) => head.index_select(&Tensor::from_vec(dv.draft_to_target().to_vec(), dv.len(), &Device::Cpu)?, 0)?,
        None => head.clone(),
    };
    let model = CandleDrafter { cfg: dcfg, params, embed: head, lm_head, draft_vocab, ctx_scale: Some(scale_t) };
    let log_path = ctl.out.join("log.jsonl");
    let mut log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path).map_err(|e| io(&log_path, e))?;
    let pb = ProgressBar::new(rc.steps as u64);
    pb.set_style(
        ProgressStyle::with_template("{prefix} [{bar:25}] {pos}/{len} {elapsed_precise} eta {eta} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_prefix(rc.kind.clone());
    pb.set_position(start as u64);
    let t0 = Instant::now();
    let mut perms = BTreeMap::new();
    let mut ema: Option<Metrics> = None;
    let mut step = start;
    let mut last_saved = start;
    while step < rc.steps {
        if let Some(mm) = ctl.max_minutes {
            if t0.elapsed().as_secs_f64() > mm * 60.0 {
                say(&pb, format!("time budget of {mm} min reached at step {step}"));
                break;
            }
        }
        let ts = Instant::now();
        let items = step_items(&train, rc, step, &mut perms);
        let n_anchors: usize = items.iter().map(|x| x.1.len()).sum();
        let rows = gather_rows(&model, &items, topk, rc.gamma)?;
        let (loss, mt) = loss_and_metrics(&model, rows, rc, n_anchors)?;
        let grads = loss.backward()?;
        let lr = lr_at(step, rc.steps, rc.warmup, rc.lr, rc.min_lr_ratio);
        let gnorm = opt.step(&model.params, &grads, lr)?;
        drop(grads);
        step += 1;
        let dt = ts.elapsed().as_secs_f64();
        let e = ema.get_or_insert_with(|| mt.clone());
        let a = 0.95;
        e.loss = a * e.loss + (1.0 - a) * mt.loss;
        e.ce = a * e.ce + (1.0 - a) * mt.ce;
        e.kl = a * e.kl + (1.0 - a) * mt.kl;
        e.l1 = a * e.l1 + (1.0 - a) * mt.l1;
        e.conf = a * e.conf + (1.0 - a) * mt.conf;
        e.tau_chain = a * e.tau_chain + (1.0 - a) * mt.tau_chain;
        for (x, y) in e.acc.iter_mut().zip(&mt.acc) {
            *x = a * *x + (1.0 - a) * y;
        }
        pb.set_message(format!(
            "loss {:.3} ce {:.3} kl {:.3} l1 {:.3} acc1 {:.2} τchain {:.2} | {:.0} tok/s",
            e.loss,
            e.ce,
            e.kl,
            e.l1,
            e.acc.first().copied().unwrap_or(0.0),
            e.tau_chain,
            mt.rows as f64 / dt
        ));
        pb.set_position(step as u64);
        if pb.is_hidden() && (step % 25 == 0 || step == 1) {
            eprintln!("{} step {step}/{}: {}", rc.kind, rc.steps, pb.message());
        }
        let rec = serde_json::json!({"step": step, "lr": lr, "gnorm": gnorm, "sec": dt, "loss": mt.loss, "ce": mt.ce, "kl": mt.kl, "l1": mt.l1, "conf": mt.conf, "acc": mt.acc, "tau_chain": mt.tau_chain, "rows": mt.rows});
        writeln!(log, "{rec}").map_err(|e| io(&log_path, e))?;
        if ctl.eval_every > 0 && step % ctl.eval_every == 0 && !hold.is_empty() {
            let ev = evaluate(&model, &hold, rc, topk, 32)?;
            say(
                &pb,
                format!("step {step}: holdout ce {:.3} kl {:.3} acc1 {:.3} τchain {:.3}", ev.ce, ev.kl, ev.acc.first().copied().unwrap_or(0.0), ev.tau_chain),
            );
            writeln!(log, "{}", serde_json::json!({"step": step, "eval": ev})).map_err(|e| io(&log_path, e))?;
        }
        if step % ctl.ckpt_every == 0 || step == rc.steps {
            let state = serde_json::json!({"step": step, "adam_t": opt.t, "elapsed_s": elapsed0 + t0.elapsed().as_secs_f64(), "ema": e});
            save_checkpoint(&ctl.out, step, &model.params, &opt, model.ctx_scale.as_ref(), state)?;
            last_saved = step;
        }
    }
    pb.finish();
    elapsed0 += t0.elapsed().as_secs_f64();
    if last_saved != step {
        let state = serde_json::json!({"step": step, "adam_t": opt.t, "elapsed_s": elapsed0, "ema": ema});
        save_checkpoint(&ctl.out, step, &model.params, &opt, model.ctx_scale.as_ref(), state)?;
    }
    let ev = if hold.is_empty() { Metrics::default() } else { evaluate(&model, &hold, rc, topk, 32)? };
    let summary = serde_json::json!({"step": step, "train_seconds": elapsed0, "train_ema": ema, "holdout": ev, "train_sequences": train.len(), "holdout_sequences": hold.len()});
    let sp = ctl.out.join("summary.json");
    sparkling::fsio::write_bytes(&sp, serde_json::to_string_pretty(&summary).map_err(|e| Error::file(&sp, e))?.as_bytes())?;
    eprintln!(
        "holdout: ce {:.3} kl {:.3} l1 {:.3} acc {:?} τchain {:.3}",
        ev.ce,
        ev.kl,
        ev.l1,
        ev.acc.iter().map(|x| (x * 100.0).round() / 100.0).collect::<Vec<_>>(),
        ev.tau_chain
    );
    Ok(ev)
}

#[cfg(test)]
mod tests;
