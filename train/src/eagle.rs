//! `train --kind eagle`: an EAGLE-style **reference drafter** for diagnosis — the
//! best-understood kind of drafter, trained on the same cache, draft vocabulary and loss as the
//! block drafters, so its held-out depth-1 agreement is the floor a block drafter must reach at
//! depth 1 with the same information.
//!
//! Architecture (EAGLE-1, Li et al. 2024 §4.1, with EAGLE-3's fused low/mid/high taps,
//! Li et al. 2025 §3): for every position `t` of a cached sequence,
//! `f_t = RMSNorm_f(fc(taps_t ⊙ s))` (the target's tapped hidden states, preconditioned as in
//! [`crate::model::CandleDrafter::ctx_scale`]) and `e_{t+1} = RMSNorm_e(E[x_{t+1}])` (the next
//! token's frozen target embedding) are fused, `z_t = fuse([f_t ; e_{t+1}])` (`[2H] → [H]`), then
//! `layers` Qwen3 decoder layers with **causal** attention over `t` (q/k RMSNorm, NeoX RoPE at
//! position `t`), a final RMSNorm and the target's frozen lm_head (the reduced draft vocabulary
//! when the run has one). Row `t` predicts `x_{t+2}`: exactly the block drafter's depth 1 (the
//! drafter sees the taps of positions `< S` and the anchor `x_S`, and slot 0 predicts `S+1`).
//!
//! Every answer position is a loss row (no anchors: one causal pass trains them all), with the
//! block drafters' objective ([`crate::head`]): `w_ce · CE(greedy) + w_kl · KL(top-k ‖ draft)`.
//! Depth ≥ 2 (EAGLE's feature recurrence) is not trained: this head exists to measure depth 1.

use crate::cache::Sequence;
use crate::checkpoint::{frozen_draft_vocab, frozen_file_list, prepare_run_dir};
use crate::error::{io, Error, Result};
use crate::head::{vocab_head, HeadTargets, ABSENT, N_COLS};
use crate::model::{feature_scale, rms_norm, rope, rope_tables, Params};
use crate::optim::{lr_at, AdamW, AdamWConfig};
use crate::rng::Rng;
use crate::train::{run_context, split, RunConfig};
use candle_core::{Device, Tensor, Var, D};
use sparkling::model::config::DrafterConfig;
use sparkling::model::draft_vocab::DraftVocab;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// Name and shape of every parameter of an EAGLE-style head with `layers` decoder layers over
/// `n_feat` tap features, with the geometry (hidden, heads, MLP width) of `cfg`.
pub fn tensor_shapes(cfg: &DrafterConfig, n_feat: usize) -> Vec<(String, Vec<usize>)> {
    let h = cfg.hidden;
    let mut v: Vec<(String, Vec<usize>)> = vec![
        ("fc.weight".into(), vec![h, n_feat]),
        ("hidden_norm.weight".into(), vec![h]),
        ("embed_norm.weight".into(), vec![h]),
        ("fuse.weight".into(), vec![h, 2 * h]),
    ];
    crate::model::push_layer_shapes(cfg, &mut v);
    v.push(("norm.weight".into(), vec![h]));
    v
}

/// Fresh parameters (deterministic in `seed`): linear weights `N(0, 0.02²)` (output projections
/// scaled by `1/√(2·layers)`), norms 1, the final norm 0.1 (as the block drafters: the borrowed
/// lm_head then starts near `ln V`).
pub fn init_params(cfg: &DrafterConfig, n_feat: usize, seed: u64) -> Result<Params> {
    let mut vars = BTreeMap::new();
    let out_scale = 1.0 / (2.0 * cfg.layers.max(1) as f32).sqrt();
    for (si, (name, shape)) in tensor_shapes(cfg, n_feat).into_iter().enumerate() {
        let n: usize = shape.iter().product();
        let mut rng = Rng::new(seed ^ 0xEA61E, si as u64);
        let data: Vec<f32> = if name == "norm.weight" {
            vec![0.1; n]
        } else if name.ends_with("norm.weight") {
            vec![1.0; n]
        } else {
            let s = if name.contains("o_proj") || name.contains("down_proj") { 0.02 * out_scale } else { 0.02 };
            (0..n).map(|_| rng.normal() * s).collect()
        };
        vars.insert(name, Var::from_vec(data, shape, &Device::Cpu)?);
    }
    Ok(Params { vars })
}

/// The head: geometry, parameters, the frozen embedding `[V, H]` and output layer `[V_d, H]`.
pub struct EagleHead {
    /// Geometry (a drafter config: hidden, heads, MLP, layers, RoPE).
    pub cfg: DrafterConfig,
    /// Trainable parameters.
    pub params: Params,
    /// Frozen target embedding `[V, H]`.
    pub embed: Tensor,
    /// Frozen output layer `[V_d, H]`.
    pub lm_head: Tensor,
    /// Reduced draft vocabulary, if any (columns of the logits are draft ids).
    pub draft_vocab: Option<DraftVocab>,
    /// Tap preconditioner `[n_feat]` (`1/RMS` per feature).
    pub ctx_scale: Tensor,
}

impl EagleHead {
    /// Final-normed hidden rows `[n-1, H]` of one sequence: row `t` (`0 ≤ t ≤ n-2`) reads the
    /// taps of positions `≤ t` and the tokens `≤ t+1`. Errors: a sequence under 2 tokens.
    pub fn forward(&self, seq: &Sequence) -> Result<Tensor> {
        let c = &self.cfg;
        let n = seq.len();
        if n < 2 {
            return Err(Error(format!("eagle head: sequence {} has {n} tokens (needs 2)", seq.id)));
        }
        let r = n - 1;
        let (nh, nkv, hd, eps) = (c.n_heads, c.n_kv_heads, c.head_dim, c.rms_eps);
        let g = nh / nkv;
        let p = |s: &str| self.params.get(s);
        let taps = Tensor::from_vec(seq.taps_f32(0, r), (r, seq.width), &Device::Cpu)?.broadcast_mul(&self.ctx_scale)?;
        let f = rms_norm(&taps.matmul(&p("fc.weight")?.t()?)?, p("hidden_norm.weight")?, eps)?;
        let next = Tensor::from_vec(seq.tokens[1..].to_vec(), r, &Device::Cpu)?;
        let e = rms_norm(&self.embed.index_select(&next, 0)?, p("embed_norm.weight")?, eps)?;
        let mut x = Tensor::cat(&[f, e], 1)?.matmul(&p("fuse.weight")?.t()?)?;
        let pos: Vec<u32> = (0..r as u32).collect();
        let (cos, sin) = rope_tables(&pos, hd, c.rope_theta)?;
        // Causal mask over rows, repeated for the G query heads of a KV head: [G*r, r].
        let mut m = vec![0f32; g * r * r];
        for gi in 0..g {
            for i in 0..r {
                m[(gi * r + i) * r + i + 1..(gi * r + i + 1) * r].iter_mut().for_each(|v| *v = -1e9);
            }
        }
        let mask = Tensor::from_vec(m, (1, g * r, r), &Device::Cpu)?;
        let scale = 1.0 / (hd as f64).sqrt();
        for l in 0..c.layers {
            let nm = |s: &str| format!("layers.{l}.{s}");
            let y = rms_norm(&x, p(&nm("input_layernorm.weight"))?, eps)?;
            let q = y.matmul(&p(&nm("self_attn.q_proj.weight"))?.t()?)?.reshape((r, nh, hd))?;
            let q = rope(&rms_norm(&q, p(&nm("self_attn.q_norm.weight"))?, eps)?, &cos, &sin)?;
            let k = y.matmul(&p(&nm("self_attn.k_proj.weight"))?.t()?)?.reshape((r, nkv, hd))?;
            let k = rope(&rms_norm(&k, p(&nm("self_attn.k_norm.weight"))?, eps)?, &cos, &sin)?;
            let v = y.matmul(&p(&nm("self_attn.v_proj.weight"))?.t()?)?.reshape((r, nkv, hd))?;
            // q [r, nh, hd] → [nkv, G*r, hd] (head h = kvh*G + gi reads KV head kvh).
            let q = q.transpose(0, 1)?.contiguous()?.reshape((nkv, g * r, hd))?;
            let kt = k.permute((1, 2, 0))?.contiguous()?; // [nkv, hd, r]
            let vt = v.transpose(0, 1)?.contiguous()?; // [nkv, r, hd]
            let s = (q.matmul(&kt)? * scale)?.broadcast_add(&mask)?;
            let a = candle_nn::ops::softmax(&s, D::Minus1)?.matmul(&vt)?; // [nkv, G*r, hd]
            let a = a.reshape((nh, r, hd))?.transpose(0, 1)?.contiguous()?.reshape((r, nh * hd))?;
            x = (x + a.matmul(&p(&nm("self_attn.o_proj.weight"))?.t()?)?)?;
            let mm = rms_norm(&x, p(&nm("post_attention_layernorm.weight"))?, eps)?;
            let gate = mm.matmul(&p(&nm("mlp.gate_proj.weight"))?.t()?)?.silu()?;
            let up = mm.matmul(&p(&nm("mlp.up_proj.weight"))?.t()?)?;
            x = (x + (gate * up)?.matmul(&p(&nm("mlp.down_proj.weight"))?.t()?)?)?;
        }
        Ok(rms_norm(&x, p("norm.weight")?, eps)?)
    }

    /// Per-row losses `[rows, 4]` (ce, kl, l1, hit; [`crate::head`]) over the answer positions
    /// `q = t+2 ≥ prompt_len` of `seqs`, at most `max_rows_per_seq` evenly spaced rows each
    /// (`usize::MAX` = all).
    pub fn rows_loss(&self, seqs: &[&Sequence], topk: usize, max_rows_per_seq: usize) -> Result<Tensor> {
        let mut hs = Vec::new();
        let mut tg = HeadTargets { labels: Vec::new(), k: topk, top_ids: Vec::new(), top_logp: Vec::new() };
        for seq in seqs {
            let h = self.forward(seq)?;
            let first = seq.prompt_len.max(2) - 2;
            let all: Vec<usize> = (first..seq.len() - 2).filter(|&t| seq.topk_at(t + 2).is_some()).collect();
            let pick: Vec<usize> =
                if all.len() <= max_rows_per_seq { all } else { (0..max_rows_per_seq).map(|i| all[i * all.len() / max_rows_per_seq]).collect() };
            for &t in &pick {
                let (ids, lp) = seq.topk_at(t + 2).ok_or_else(|| Error("row without top-k".into()))?;
                let map = |id: u32| match &self.draft_vocab {
                    None => id,
                    Some(dv) => dv.draft_id(id).unwrap_or(ABSENT),
                };
                tg.labels.push(map(seq.tokens[t + 2]));
                tg.top_ids.extend(ids[..topk].iter().map(|&i| map(i)));
                tg.top_logp.extend_from_slice(&lp[..topk]);
            }
            let sel: Vec<u32> = pick.iter().map(|&t| t as u32).collect();
            hs.push(h.index_select(&Tensor::from_vec(sel.clone(), sel.len(), &Device::Cpu)?, 0)?);
        }
        let h = Tensor::cat(&hs, 0)?;
        Ok(vocab_head(&h, &self.lm_head, None, tg)?)
    }
}

/// Mean (ce, kl, acc1) of loss rows `[rows, 4]`.
fn summarize(out: &Tensor) -> Result<(f64, f64, f64, usize)> {
    let host: Vec<f32> = out.flatten_all()?.to_vec1()?;
    let r = host.len() / N_COLS;
    let mean = |c: usize| host.iter().skip(c).step_by(N_COLS).map(|&x| x as f64).sum::<f64>() / r.max(1) as f64;
    Ok((mean(0), mean(1), mean(3), r))
}

/// Options of one `train-eagle` invocation.
#[derive(Debug, Clone)]
pub struct EagleControl {
    /// Run directory.
    pub out: std::path::PathBuf,
    /// Evaluate on the holdout every N steps (0 = only at the end).
    pub eval_every: usize,
    /// Stop after this many minutes (the state is not resumable: the runs are short diagnostics).
    pub max_minutes: Option<f64>,
}

/// Train the reference head with `rc`'s data, draft vocabulary, loss weights, schedule and
/// `layers`; logs `log.jsonl` (per step: loss, acc1, rows, seconds; evals) and `summary.json`
/// (held-out ce, kl, depth-1 agreement over **every** answer row of the holdout). Returns the
/// held-out depth-1 agreement.
pub fn run(rc: &RunConfig, ctl: &EagleControl) -> Result<f64> {
    rc.validate()?;
    let _lock = prepare_run_dir(&ctl.out, rc, false)?;
    let (meta, head, tcfg, dcfg) = run_context(rc)?;
    let n_feat = meta.width();
    let seqs = crate::cache::load_files(Path::new(&rc.cache), &meta, &frozen_file_list(rc, &ctl.out)?)?;
    let (train, hold) = split(seqs, rc.holdout);
    if train.is_empty() {
        return Err(Error::file(Path::new(&rc.cache), "no usable sequences (run gen-data first)"));
    }
    let run_json = ctl.out.join("run.json");
    sparkling::fsio::write_bytes(&run_json, serde_json::to_string_pretty(rc).map_err(|e| Error::file(&run_json, e))?.as_bytes())?;
    let draft_vocab = frozen_draft_vocab(rc, &ctl.out, &train, &hold, &tcfg)?;
    let scale = feature_scale(train.iter().flat_map(|q| q.taps.iter().map(|v| v.to_f32())), n_feat);
    let lm_head = match &draft_vocab {
        Some(dv) => head.index_select(&Tensor::from_vec(dv.draft_to_target().to_vec(), dv.len(), &Device::Cpu)?, 0)?,
        None => head.clone(),
    };
    let params = init_params(&dcfg, n_feat, rc.seed)?;
    eprintln!(
        "eagle reference: {} layers over taps {:?}, {} parameters; {} train / {} holdout sequences",
        dcfg.layers,
        meta.tap_layers,
        params.count(),
        train.len(),
        hold.len()
    );
    let m = EagleHead { cfg: dcfg, params, embed: head, lm_head, draft_vocab, ctx_scale: Tensor::from_vec(scale, n_feat, &Device::Cpu)? };
    let mut opt = AdamW::new(AdamWConfig { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: rc.weight_decay, clip: rc.clip }, &m.params)?;
    let log_path = ctl.out.join("log.jsonl");
    let mut log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path).map_err(|e| io(&log_path, e))?;
    let evaluate = |m: &EagleHead| -> Result<(f64, f64, f64, usize)> {
        let (mut ce, mut kl, mut acc, mut rows) = (0.0, 0.0, 0.0, 0usize);
        for s in &hold {
            let out = m.rows_loss(&[s], meta.topk, usize::MAX)?;
            let (c, k, a, r) = summarize(&out)?;
            ce += c * r as f64;
            kl += k * r as f64;
            acc += a * r as f64;
            rows += r;
        }
        let d = rows.max(1) as f64;
        Ok((ce / d, kl / d, acc / d, rows))
    };
    let t0 = Instant::now();
    let n = train.len();
    let mut perm: Vec<usize> = (0..n).collect();
    let mut label_rows = 0usize;
    let mut ema_acc: Option<f64> = None;
    let mut step = 0;
    // Rows per sequence: the block drafters' anchors × block, so a step holds a comparable
    // number of loss rows.
    let per_seq = rc.anchors * rc.block_size;
    while step < rc.steps {
        if ctl.max_minutes.is_some_and(|mm| t0.elapsed().as_secs_f64() > mm * 60.0) {
            eprintln!("time budget reached at step {step}");
            break;
        }
        let ts = Instant::now();
        let items: Vec<&Sequence> = (0..rc.seqs_per_step)
            .map(|i| {
                let gi = step * rc.seqs_per_step + i;
                if gi.is_multiple_of(n) {
                    Rng::new(rc.seed, 1_000_000 + (gi / n) as u64).shuffle(&mut perm);
                }
                &train[perm[gi % n]]
            })
            .collect();
        let out = m.rows_loss(&items, meta.topk, per_seq)?;
        let r = out.dim(0)?;
        let coef: Vec<f32> = (0..r).flat_map(|_| [(rc.w_ce / r as f64) as f32, (rc.w_kl / r as f64) as f32, (rc.w_l1 / r as f64) as f32, 0.0]).collect();
        let loss = out.mul(&Tensor::from_vec(coef, (r, N_COLS), &Device::Cpu)?)?.sum_all()?;
        let grads = loss.backward()?;
        let lr = lr_at(step, rc.steps, rc.warmup, rc.lr, rc.min_lr_ratio);
        let gnorm = opt.step(&m.params, &grads, lr)?;
        drop(grads);
        step += 1;
        label_rows += r;
        let (ce, kl, acc, _) = summarize(&out)?;
        let e = ema_acc.get_or_insert(acc);
        *e = 0.95 * *e + 0.05 * acc;
        let dt = ts.elapsed().as_secs_f64();
        writeln!(
            log,
            "{}",
            serde_json::json!({"step": step, "lr": lr, "gnorm": gnorm, "sec": dt, "ce": ce, "kl": kl, "acc1": acc, "rows": r, "label_rows": label_rows})
        )
        .map_err(|e| io(&log_path, e))?;
        if step % 25 == 0 || step == 1 {
            eprintln!("eagle step {step}/{}: ce {ce:.3} kl {kl:.3} acc1 {acc:.3} (ema {:.3}) | {:.0} rows/s", rc.steps, *e, r as f64 / dt);
        }
        if ctl.eval_every > 0 && step % ctl.eval_every == 0 && !hold.is_empty() {
            let (ce, kl, acc, rows) = evaluate(&m)?;
            eprintln!("step {step}: holdout ce {ce:.3} kl {kl:.3} acc1 {acc:.3} ({rows} rows, {label_rows} label rows seen)");
            writeln!(log, "{}", serde_json::json!({"step": step, "label_rows": label_rows, "eval": {"ce": ce, "kl": kl, "acc1": acc, "rows": rows}}))
                .map_err(|e| io(&log_path, e))?;
        }
    }
    let (ce, kl, acc, rows) = if hold.is_empty() { (0.0, 0.0, 0.0, 0) } else { evaluate(&m)? };
    let summary = serde_json::json!({"step": step, "label_rows": label_rows, "train_seconds": t0.elapsed().as_secs_f64(), "train_ema_acc1": ema_acc,
        "holdout": {"ce": ce, "kl": kl, "acc1": acc, "rows": rows}, "train_sequences": train.len(), "holdout_sequences": hold.len()});
    let sp = ctl.out.join("summary.json");
    sparkling::fsio::write_bytes(&sp, serde_json::to_string_pretty(&summary).map_err(|e| Error::file(&sp, e))?.as_bytes())?;
    eprintln!("holdout: ce {ce:.3} kl {kl:.3} depth-1 agreement {acc:.3} over {rows} rows");
    Ok(acc)
}
