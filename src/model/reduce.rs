//! Making a reduced-vocabulary drafter from a full one (`sparkling reduce-vocab`):
//! count target tokens, keep the V_d most frequent, slice the drafter's own output rows
//! (`lm_head.weight`, when it has one) and the Markov head's `W2` to them, keep everything else
//! (the input embedding and `W1` stay indexed by target id), and add the map
//! [`MAP_TENSOR`](super::draft_vocab::MAP_TENSOR) plus `draft_vocab_size`.

use super::config::{read_json, DrafterConfig};
use super::draft_vocab::{DraftVocab, MAP_TENSOR};
use super::synth::StoreDtype;
use crate::error::{Error, Result};
use crate::loader::open_source;
use safetensors::tensor::{Dtype, TensorView};
use std::path::Path;

/// The draft vocabulary of the `v_d` most frequent ids of `counts` (`counts[t]` = occurrences
/// of target id `t` in the target's answers), most frequent first, with `always` (e.g. the
/// end-of-sequence ids: a drafter should be able to propose the end of an answer) placed first
/// when not already among them. Ties — in practice the long tail of ids the answers never
/// produced — are broken by `secondary` (e.g. token counts of the training prompts, which are
/// cheap to count in bulk and share the answers' identifiers and names; empty: none), then by
/// lower id (in a BPE vocabulary earlier merges were the more frequent pairs of the tokenizer's
/// corpus). `v_d` is clamped to `counts.len()`.
pub fn top_ids(counts: &[u64], secondary: &[u64], v_d: usize, always: &[u32]) -> Vec<u32> {
    let v_d = v_d.min(counts.len());
    let sec = |t: u32| secondary.get(t as usize).copied().unwrap_or(0);
    let mut order: Vec<u32> = (0..counts.len() as u32).collect();
    order.sort_by(|&a, &b| counts[b as usize].cmp(&counts[a as usize]).then(sec(b).cmp(&sec(a))).then(a.cmp(&b)));
    let mut ids: Vec<u32> = always.iter().copied().filter(|&t| (t as usize) < counts.len()).collect();
    ids.dedup();
    ids.truncate(v_d);
    for t in order {
        if ids.len() >= v_d {
            break;
        }
        if !ids.contains(&t) {
            ids.push(t);
        }
    }
    ids
}

/// The share of `counts`' total that the ids `ids` cover (1.0 for an empty count).
pub fn coverage(counts: &[u64], ids: &[u32]) -> f64 {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return 1.0;
    }
    let kept: u64 = ids.iter().map(|&t| counts.get(t as usize).copied().unwrap_or(0)).sum();
    kept as f64 / total as f64
}

/// Write the drafter of `src` (an HF drafter directory) reduced to the draft vocabulary
/// `d2t` (target ids, draft id order) into `out`, atomically ([`crate::fsio::publish_dir`]):
/// `config.json` (the source's, plus `draft_vocab_size`), `model.safetensors` (every tensor of
/// the source in `dtype`; `lm_head.weight` and `markov_head.markov_w2.weight` sliced to the
/// rows `d2t`; [`MAP_TENSOR`] as I64) and, when given, `extra` files (name, bytes: provenance).
/// Errors: a source that is already reduced, a bad map (out of range, duplicate: the
/// [`DraftVocab`] checks), unreadable files.
pub fn write_reduced_drafter(src: &Path, out: &Path, d2t: &[u32], dtype: StoreDtype, extra: &[(&str, Vec<u8>)]) -> Result<DrafterConfig> {
    let (cp, mut v) = read_json(src)?;
    let cfg = DrafterConfig::from_hf_json(&cp, &v)?;
    if cfg.is_reduced() {
        return Err(Error::config(&cp, "draft_vocab_size", "the drafter is already reduced: reduce its full-vocabulary original"));
    }
    let map = DraftVocab::from_ids(d2t, cfg.vocab)?;
    let st = open_source(src)?;
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let enc = |d: &[f32]| -> Vec<u8> {
        match dtype {
            StoreDtype::F32 => d.iter().flat_map(|x| x.to_le_bytes()).collect(),
            StoreDtype::Bf16 => d.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect(),
        }
    };
    let fdt = match dtype {
        StoreDtype::F32 => Dtype::F32,
        StoreDtype::Bf16 => Dtype::BF16,
    };
    for name in st.names() {
        let t = st.load(&name)?;
        let sliced = name == "lm_head.weight" || name == "markov_head.markov_w2.weight";
        if sliced {
            if t.shape.len() != 2 || t.shape[0] != cfg.vocab {
                return Err(Error::tensor(st.path(), &name, format!("expected [{} (vocab_size), k], found {:?}", cfg.vocab, t.shape)));
            }
            let k = t.shape[1];
            let rows: Vec<f32> = map.draft_to_target().iter().flat_map(|&r| t.data[r as usize * k..][..k].iter().copied()).collect();
            tensors.push((name, fdt, vec![map.len(), k], enc(&rows)));
        } else {
            tensors.push((name, fdt, t.shape, enc(&t.data)));
        }
    }
    let ids: Vec<u8> = d2t.iter().flat_map(|&t| (t as i64).to_le_bytes()).collect();
    tensors.push((MAP_TENSOR.to_string(), Dtype::I64, vec![d2t.len()], ids));
    let views = tensors
        .iter()
        .map(|(n, dt, s, b)| TensorView::new(*dt, s.clone(), b).map(|x| (n.clone(), x)).map_err(|e| Error::tensor(out, n, e.to_string())))
        .collect::<Result<Vec<_>>>()?;
    if let Some(o) = v.as_object_mut() {
        o.insert("draft_vocab_size".into(), serde_json::json!(d2t.len()));
    }
    let text = serde_json::to_string_pretty(&v).map_err(|e| Error::file(&cp, e.to_string()))?;
    let shown = out.join("model.safetensors");
    crate::fsio::publish_dir(out, |tmp| {
        crate::fsio::write_safetensors(&tmp.join("model.safetensors"), &shown, views, None)?;
        std::fs::write(tmp.join("config.json"), &text).map_err(|e| Error::file(&out.join("config.json"), format!("cannot write: {e}")))?;
        for (name, bytes) in extra {
            std::fs::write(tmp.join(name), bytes).map_err(|e| Error::file(&out.join(name), format!("cannot write: {e}")))?;
        }
        Ok(())
    })?;
    let (cp2, v2) = read_json(out)?;
    DrafterConfig::from_hf_json(&cp2, &v2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_ids_orders_by_count_and_keeps_always() {
        let counts = [5u64, 0, 9, 5, 1, 0];
        assert_eq!(top_ids(&counts, &[], 3, &[]), vec![2, 0, 3]);
        assert_eq!(top_ids(&counts, &[], 3, &[5]), vec![5, 2, 0]);
        assert_eq!(top_ids(&counts, &[], 10, &[]), vec![2, 0, 3, 4, 1, 5]);
        // The secondary counts order ties (the unseen tail too), never the primary order.
        assert_eq!(top_ids(&counts, &[0, 0, 0, 7, 0, 3], 10, &[]), vec![2, 3, 0, 4, 5, 1]);
        assert!((coverage(&counts, &[2, 0]) - 14.0 / 20.0).abs() < 1e-12);
        assert_eq!(coverage(&[0, 0], &[]), 1.0);
    }
}
