//! Warm starts: a drafter's parameters taken from a trained drafter (`--init-from DIR`,
//! [`from_drafter`]) or from the target's own layers (`--init-from-target F`, [`from_target`])
//! instead of the random initialisation of [`Params::init`]. Both run once, at step 0 of a
//! new run (a resumed run takes its weights from its checkpoint).

use crate::error::{Error, Result};
use crate::model::Params;
use candle_core::{DType, Device, Tensor};
use sparkling::model::config::{DrafterConfig, DrafterKind, TargetConfig};
use sparkling::model::draft_vocab::DraftVocab;
use std::path::Path;

/// The settings of `--init-from DIR` that need no weights: `DIR/config.json` parses as a
/// drafter of this run's kind, layer geometry, target vocabulary, Markov rank, mask token,
/// RoPE θ, RMSNorm ε, context taps and confidence head, and `DIR/model.safetensors` is a
/// regular file. [`crate::train::run`] calls it before the cache loads (minutes for a 1.5 M-token
/// cache), so a wrong directory fails at once. Errors name `--init-from`, the directory and the
/// setting that differs, with both values.
pub fn check_drafter(dir: &Path, dcfg: &DrafterConfig) -> Result<()> {
    let what = |m: String| Error::arg("init-from", format!("{}: {m}", dir.display()));
    let expected = "expected the directory of an exported drafter (config.json + model.safetensors, as `sparkling-train export` writes them)";
    let (cp, v) = sparkling::model::config::read_json(dir).map_err(|e| Error::arg("init-from", format!("{e}; {expected}")))?;
    let src = DrafterConfig::from_hf_json(&cp, &v).map_err(|e| Error::arg("init-from", format!("{e}; {expected}")))?;
    for (name, theirs, ours) in [
        ("layers", src.layers, dcfg.layers),
        ("hidden size", src.hidden, dcfg.hidden),
        ("attention heads", src.n_heads, dcfg.n_heads),
        ("KV heads", src.n_kv_heads, dcfg.n_kv_heads),
        ("head dim", src.head_dim, dcfg.head_dim),
        ("intermediate size", src.intermediate, dcfg.intermediate),
        ("target vocabulary", src.vocab, dcfg.vocab),
        ("Markov rank", src.markov_rank, dcfg.markov_rank),
        ("mask token id", src.mask_token_id as usize, dcfg.mask_token_id as usize),
    ] {
        if theirs != ours {
            return Err(what(format!("{name} {theirs}, but this run's drafter has {ours}")));
        }
    }
    if src.rope_theta != dcfg.rope_theta || src.rms_eps != dcfg.rms_eps {
        return Err(what(format!("RoPE θ {} / RMSNorm ε {}, but this run's drafter has {} / {}", src.rope_theta, src.rms_eps, dcfg.rope_theta, dcfg.rms_eps)));
    }
    if src.kind != dcfg.kind {
        return Err(what(format!("a {:?} drafter, but this run trains a {:?} one (--kind)", src.kind, dcfg.kind)));
    }
    if src.target_layer_ids != dcfg.target_layer_ids {
        return Err(what(format!("reads target layers {:?}, but this run's cache taps {:?}", src.target_layer_ids, dcfg.target_layer_ids)));
    }
    if src.confidence_head != dcfg.confidence_head {
        return Err(what(format!("confidence head {}, this run {} (--no-confidence)", src.confidence_head, dcfg.confidence_head)));
    }
    let st = dir.join("model.safetensors");
    sparkling::loader::bytes::regular_file(&st, "a drafter checkpoint").map_err(|e| Error::arg("init-from", format!("{e}; {expected}")))?;
    Ok(())
}

/// Warm start from a trained drafter (`--init-from DIR`): the exported checkpoint in `DIR`
/// (`config.json` + `model.safetensors`, as `sparkling-train export` writes them, bf16 or f32)
/// gives every parameter its starting value, so training continues across machines and runs
/// from the committed drafter rather than from random weights (the optimizer's moments start
/// at zero). The checkpoint must have this run's kind, layer geometry, context taps, Markov rank
/// and confidence head; its block size may differ (no parameter depends on it).
///
/// Two tensors are not copied as they are:
/// - `fc.weight`: the export folds the context-feature preconditioner `s` of its run into the
///   columns (`fc ⊙ s`, [`crate::checkpoint::fold_ctx_scale`]); this run trains on taps times its
///   own `scale`, so the column `j` starts at `fc_exported[:, j] / scale[j]` (the same map from raw
///   taps to `c`).
/// - the Markov `W2` (`[V_d, r]`, one row per draft id): rows are matched by **target id**
///   through the two draft→target maps (the checkpoint's `draft_to_target`, or the identity for
///   a full-vocabulary checkpoint; this run's `draft_vocab`), so a different V_d or a recounted
///   vocabulary keeps every row the two share; a draft id the checkpoint lacks starts at 0, as
///   in [`Params::init`]. `W1` is indexed by target id in both.
///
/// Returns a one-line account (rows matched). Errors name the file, the tensor or the setting
/// that differs, and what this run expects: the checks of [`check_drafter`]; a tensor missing,
/// of another shape, or left over (the checkpoint has parameters this run's drafter lacks,
/// among them an own `embed_tokens` / `lm_head`, which the engine accepts but the trainer
/// borrows from the target; checked before any parameter is set; RoPE `inv_freq` tables are
/// ignored); a `draft_to_target` map with an id outside the target vocabulary or an id twice.
pub fn from_drafter(params: &Params, dir: &Path, dcfg: &DrafterConfig, n_feat: usize, scale: &[f32], draft_vocab: Option<&DraftVocab>) -> Result<String> {
    check_drafter(dir, dcfg)?;
    let st = dir.join("model.safetensors");
    let mut all = candle_core::safetensors::load(&st, &Device::Cpu).map_err(|e| Error::file(&st, e))?;
    // Their draft id → target id (identity for a full-vocabulary checkpoint), checked (ids in
    // range, none twice) and inverted by the engine's own map type.
    let their_ids: Vec<i64> = match all.remove(sparkling::model::draft_vocab::MAP_TENSOR) {
        Some(m) => m.to_dtype(DType::I64)?.flatten_all()?.to_vec1::<i64>()?,
        None => (0..dcfg.vocab as i64).collect(),
    };
    let theirs = DraftVocab::new(&st, &[their_ids.len()], &their_ids, dcfg.vocab, their_ids.len())?;
    let our_d2t: Vec<u32> = match draft_vocab {
        Some(dv) => dv.draft_to_target().to_vec(),
        None => (0..dcfg.vocab as u32).collect(),
    };
    // Tensors this run has no parameter for, refused before any parameter is set. The engine
    // ignores RoPE frequency tables and accepts a drafter's own embedding / lm_head; the
    // trainer borrows the target's, so those are named apart.
    all.retain(|n, _| !n.ends_with("rotary_emb.inv_freq"));
    let mut left: Vec<&str> = all.keys().map(String::as_str).filter(|n| !params.vars.contains_key(*n)).collect();
    left.sort_unstable();
    if left.iter().any(|n| *n == "embed_tokens.weight" || *n == "lm_head.weight") {
        return Err(Error::file(
            &st,
            format!("carries its own {left:?}; the trainer borrows the target's embedding and lm_head, so drop these tensors to warm-start from it"),
        ));
    }
    if !left.is_empty() {
        return Err(Error::file(
            &st,
            format!("tensors {left:?} are not parameters of this run's drafter (a checkpoint of another layout?); expected exactly its {}", params.vars.len()),
        ));
    }
    let mut matched = 0usize;
    for (name, var) in &params.vars {
        let t = all.remove(name).ok_or_else(|| Error::file(&st, format!("tensor `{name}` missing (this run's drafter has it)")))?.to_dtype(DType::F32)?;
        let value = if name == "fc.weight" {
            if t.dims() != [dcfg.hidden, n_feat] {
                return Err(Error::file(&st, format!("tensor `{name}`: shape {:?}, expected {:?}", t.dims(), [dcfg.hidden, n_feat])));
            }
            t.broadcast_div(&Tensor::from_vec(scale.to_vec(), (1, n_feat), &Device::Cpu)?)?
        } else if name == "markov_head.markov_w2.weight" {
            let r = dcfg.markov_rank;
            if t.dims() != [theirs.len(), r] {
                return Err(Error::file(&st, format!("tensor `{name}`: shape {:?}, expected [{}, {r}] (its draft_to_target map)", t.dims(), theirs.len())));
            }
            let rows: Vec<f32> = t.flatten_all()?.to_vec1()?;
            let mut out = vec![0f32; our_d2t.len() * r];
            for (d, &tid) in our_d2t.iter().enumerate() {
                if let Some(j) = theirs.draft_id(tid) {
                    out[d * r..(d + 1) * r].copy_from_slice(&rows[j as usize * r..(j as usize + 1) * r]);
                    matched += 1;
                }
            }
            Tensor::from_vec(out, (our_d2t.len(), r), &Device::Cpu)?
        } else {
            if t.dims() != var.dims() {
                return Err(Error::file(&st, format!("tensor `{name}`: shape {:?}, expected {:?}", t.dims(), var.dims())));
            }
            t
        };
        var.set(&value)?;
    }
    Ok(if dcfg.kind == DrafterKind::DSpark && dcfg.markov_rank > 0 {
        format!("Markov W2: {matched} of {} draft ids matched by target id, the rest start at 0", our_d2t.len())
    } else {
        "no Markov head".to_string()
    })
}

/// Warm start from the target (`--init-from-target F`): draft layer `l` takes target layer
/// `F+l`'s attention and MLP weights and norms (q/k norms, absent in Llama targets, start at 1);
/// `fc` maps the first tapped layer's raw output through unchanged (on the preconditioned
/// features: `diag(1/s)`, plus `N(0, 0.02²)` elsewhere) and `hidden_norm` takes target layer
/// `F`'s input norm, so the context rows enter as the normalised residual stream a target layer
/// would see (exactly so when `F = tap_layers[0] + 1`). The draft layers thus start with the
/// target's own attention heads (previous-token and copy heads matter for drafting) instead of
/// learning attention from scratch in a few hundred CPU steps. Errors name the missing tensor or
/// a layer outside the target.
///
/// The draft layers have per-head q/k RMSNorms that the Llama target lacks; with weights 1 they
/// would cap attention logits at `√hd` and flatten the copied heads to near-uniform attention
/// over hundreds of context rows. Each layer's `q_norm` / `k_norm` weight is therefore set to
/// the mean per-head RMS of the target's own queries / keys on `sample_rows` (raw first-tap rows
/// `[n, H]`, normalised with that layer's input norm), which restores the target's logit scale.
pub fn from_target(params: &Params, target: &Path, tcfg: &TargetConfig, dcfg: &DrafterConfig, first: usize, scale: &[f32], sample_rows: &Tensor) -> Result<()> {
    if first + dcfg.layers > tcfg.layers {
        return Err(Error::arg("init-from-target", format!("layers {first}..{} exceed the target's {}", first + dcfg.layers, tcfg.layers)));
    }
    if dcfg.hidden != tcfg.hidden || dcfg.n_heads != tcfg.n_heads || dcfg.n_kv_heads != tcfg.n_kv_heads || dcfg.intermediate != tcfg.intermediate {
        return Err(Error::arg("init-from-target", "draft and target layer geometry differ"));
    }
    let set = |name: &str, data: Vec<f32>| -> Result<()> {
        let v = params.vars.get(name).ok_or_else(|| Error(format!("parameter `{name}` missing")))?;
        v.set(&Tensor::from_vec(data, v.shape(), &Device::Cpu)?)?;
        Ok(())
    };
    for l in 0..dcfg.layers {
        let t = first + l;
        for part in [
            "input_layernorm.weight",
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
            "post_attention_layernorm.weight",
            "mlp.gate_proj.weight",
            "mlp.up_proj.weight",
            "mlp.down_proj.weight",
        ] {
            set(&format!("layers.{l}.{part}"), crate::gen::load_target_tensor(target, &format!("model.layers.{t}.{part}"))?)?;
        }
        let y = crate::model::rms_norm(sample_rows, params.get(&format!("layers.{l}.input_layernorm.weight"))?, dcfg.rms_eps)?;
        for (w, norm) in [("q_proj", "q_norm"), ("k_proj", "k_norm")] {
            let p = y.matmul(&params.get(&format!("layers.{l}.self_attn.{w}.weight"))?.t()?)?;
            let rms = p.sqr()?.mean_all()?.sqrt()?.to_scalar::<f32>()?;
            set(&format!("layers.{l}.self_attn.{norm}.weight"), vec![rms; dcfg.head_dim])?;
            eprintln!("warm start: layer {l} {norm} = {rms:.2}");
        }
    }
    set("hidden_norm.weight", crate::gen::load_target_tensor(target, &format!("model.layers.{first}.input_layernorm.weight"))?)?;
    let (h, nf) = (dcfg.hidden, scale.len());
    let fc = params.get("fc.weight")?;
    let mut w: Vec<f32> = fc.flatten_all()?.to_vec1()?;
    for r in 0..h {
        for c in 0..h.min(nf) {
            w[r * nf + c] = if r == c { 1.0 / scale[c] } else { 0.0 };
        }
    }
    set("fc.weight", w)?;
    Ok(())
}
