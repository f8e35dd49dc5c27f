//! `export`: a trained run → the HF-layout drafter checkpoint the engine loads unchanged
//! (`config.json` in the spelling `DrafterConfig::to_hf_json` produces + `model.safetensors`
//! in bf16; no `embed_tokens` / `lm_head`: they are the target's, borrowed at load), then
//! **verified** by loading it with `sparkling::model::drafter::Drafter::load`.

use crate::error::{io, Error, Result};
use crate::model::{tensor_shapes, Params};
use candle_core::DType;
use safetensors::tensor::{Dtype, TensorView};
use sparkling::cpu::CpuBackend;
use sparkling::loader::open_source;
use sparkling::model::config::{read_json, DrafterConfig, TargetConfig};
use sparkling::model::draft_vocab::{DraftVocab, MAP_TENSOR};
use sparkling::model::drafter::Drafter;
use std::path::Path;

/// Storage precision of an exported checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportDtype {
    /// bfloat16 (the default: what published drafters use, half the size).
    Bf16,
    /// 32-bit float (exact copy of the trained values; used by tests).
    F32,
}

/// What [`write_hf`] writes: a drafter's parameters and how to store them.
#[derive(Clone, Copy)]
pub struct Export<'a> {
    /// The drafter's configuration.
    pub cfg: &'a DrafterConfig,
    /// Layers of the target the drafter was trained for.
    pub num_target_layers: usize,
    /// Context width `n_feat` (tapped layers × target hidden size).
    pub n_feat: usize,
    /// The trained parameters.
    pub params: &'a Params,
    /// A reduced drafter's draft vocabulary (`None` for the full vocabulary).
    pub draft_vocab: Option<&'a DraftVocab>,
    /// Storage precision.
    pub dtype: ExportDtype,
}

/// Write `e.params` of a drafter `e.cfg` (for a target of `e.num_target_layers` layers and
/// context width `e.n_feat`) into `dir` as `config.json` + `model.safetensors`. A reduced drafter
/// (`cfg.is_reduced()`) needs its `draft_vocab`: `config.json` then carries
/// `draft_vocab_size` and the safetensors the map [`MAP_TENSOR`] (`[V_d]`, I64, absolute target
/// ids; no `lm_head.weight`: the engine gathers the target's rows, models/README.md). Extra
/// JSON `meta` is stored as `training.json` when given. With `verify_against` (the target's
/// config) the written files are loaded with the engine ([`verify_with_engine`]) before they
/// take `dir`'s place, so a checkpoint the engine refuses is never left in `dir`. Errors name
/// the file, or the argument when the map is missing or does not match `cfg.draft_vocab`.
pub fn write_hf(dir: &Path, e: Export<'_>, meta: Option<&serde_json::Value>, verify_against: Option<&TargetConfig>) -> Result<()> {
    let (cfg, draft_vocab) = (e.cfg, e.draft_vocab);
    match draft_vocab {
        Some(dv) if !cfg.is_reduced() || dv.len() != cfg.draft_vocab => {
            return Err(Error::arg(
                "draft vocabulary",
                format!("a map of {} ids for a drafter with draft_vocab_size {} (reduced: {})", dv.len(), cfg.draft_vocab, cfg.is_reduced()),
            ));
        }
        None if cfg.is_reduced() => {
            return Err(Error::arg("draft vocabulary", format!("the drafter is reduced to {} ids but no draft_to_target map was given", cfg.draft_vocab)))
        }
        _ => {}
    }
    // Built in a temporary sibling directory and moved into place when complete: an
    // interrupted export never leaves a half-written checkpoint.
    let mut inner: Option<Error> = None;
    sparkling::fsio::publish_dir(dir, |tmp| {
        write_hf_files(tmp, e, meta)
            .and_then(|()| match verify_against {
                Some(t) => verify_with_engine(tmp, t)
                    .map(|_| ())
                    .map_err(|e| Error(format!("the exported checkpoint does not load in the engine, so {} was not written: {e}", dir.display()))),
                None => Ok(()),
            })
            .map_err(|e| {
                let m = e.to_string();
                inner = Some(e);
                sparkling::Error::Input(m)
            })
    })
    .map_err(|e| inner.take().unwrap_or_else(|| e.into()))
}

fn write_hf_files(dir: &Path, e: Export<'_>, meta: Option<&serde_json::Value>) -> Result<()> {
    let Export { cfg, num_target_layers, n_feat, params, draft_vocab, dtype } = e;
    let cp = dir.join("config.json");
    let text = serde_json::to_string_pretty(&cfg.to_hf_json(num_target_layers)).map_err(|e| Error::file(&cp, e))?;
    std::fs::write(&cp, text).map_err(|e| io(&cp, e))?;
    let dt = match dtype {
        ExportDtype::Bf16 => Dtype::BF16,
        ExportDtype::F32 => Dtype::F32,
    };
    let mut bufs: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, shape) in tensor_shapes(cfg, n_feat) {
        let t = params.get(&name)?.to_dtype(DType::F32)?.flatten_all()?;
        let v: Vec<f32> = t.to_vec1()?;
        let bytes: Vec<u8> = match dtype {
            ExportDtype::Bf16 => v.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect(),
            ExportDtype::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        };
        bufs.push((name, dt, shape, bytes));
    }
    if let Some(dv) = draft_vocab {
        let ids: Vec<u8> = dv.draft_to_target().iter().flat_map(|&t| (t as i64).to_le_bytes()).collect();
        bufs.push((MAP_TENSOR.to_string(), Dtype::I64, vec![dv.len()], ids));
    }
    let st = dir.join("model.safetensors");
    let views = bufs
        .iter()
        .map(|(n, dt, s, b)| TensorView::new(*dt, s.clone(), b).map(|v| (n.clone(), v)).map_err(|e| Error::file(&st, format!("tensor `{n}`: {e}"))))
        .collect::<Result<Vec<_>>>()?;
    let mut md = std::collections::HashMap::new();
    md.insert("format".to_string(), "pt".to_string());
    sparkling::fsio::write_safetensors(&st, &st, views, Some(md))?;
    if let Some(m) = meta {
        let mp = dir.join("training.json");
        std::fs::write(&mp, serde_json::to_string_pretty(m).map_err(|e| Error::file(&mp, e))?).map_err(|e| io(&mp, e))?;
    }
    Ok(())
}

/// Load an exported checkpoint with the engine's own loader (config parser + `Drafter::load`
/// on the CPU backend) against `target`; returns the parsed config. This is the check that the
/// engine accepts the files unchanged.
pub fn verify_with_engine(dir: &Path, target: &TargetConfig) -> Result<DrafterConfig> {
    let (cp, v) = read_json(dir)?;
    let cfg = DrafterConfig::from_hf_json(&cp, &v)?;
    let src = open_source(dir)?;
    let d = Drafter::load(&CpuBackend::new(), src.as_ref(), cfg.clone(), target)?;
    if d.cfg != cfg {
        return Err(Error::file(dir, "loaded config differs from the written one"));
    }
    Ok(cfg)
}
