//! HF safetensors checkpoints: `model.safetensors`, or shards listed in
//! `model.safetensors.index.json` (`weight_map: name → file`); bf16 / f16 / f32 tensors.

use super::bytes::FileBytes;
use super::{HostTensor, TensorSource};
use crate::error::{Error, Result};
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A set of safetensors files (memory-mapped, or bytes in memory) with a name → file index.
pub struct SafetensorsSource {
    root: PathBuf,
    files: Vec<(PathBuf, FileBytes)>,
    index: BTreeMap<String, usize>,
}

impl SafetensorsSource {
    /// Open a directory (containing `model.safetensors` or `model.safetensors.index.json`) or a
    /// single `.safetensors` file. Headers are validated here (a truncated file is an error
    /// naming it).
    pub fn open(path: &Path) -> Result<Self> {
        let mut paths = Vec::new();
        if path.is_dir() {
            let single = path.join("model.safetensors");
            let index = path.join("model.safetensors.index.json");
            if single.exists() {
                paths.push(single);
            } else if index.exists() {
                super::bytes::regular_file(&index, "a safetensors index")?;
                let text = std::fs::read_to_string(&index).map_err(|e| Error::file(&index, e.to_string()))?;
                let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::file(&index, format!("invalid JSON: {e}")))?;
                let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| Error::config(&index, "weight_map", "missing or not an object"))?;
                let mut shard_names: Vec<String> = map.values().filter_map(|f| f.as_str().map(String::from)).collect();
                // Shards live in the model directory: a path elsewhere (`../x`, `/etc/passwd`)
                // is not a shard of this model.
                if let Some(bad) = shard_names.iter().find(|f| f.is_empty() || f.contains('/') || f.contains('\\') || f.starts_with('.')) {
                    return Err(Error::config(&index, "weight_map", format!("shard `{bad}` is not a file name in the model directory")));
                }
                shard_names.sort();
                shard_names.dedup();
                paths.extend(shard_names.into_iter().map(|f| path.join(f)));
            } else {
                return Err(Error::file(path, "no model.safetensors or model.safetensors.index.json in this directory"));
            }
        } else if path.exists() {
            paths.push(path.to_path_buf());
        } else {
            return Err(Error::file(path, "no such file or directory"));
        }
        let files = paths.into_iter().map(|p| FileBytes::open(&p).map(|b| (p, b))).collect::<Result<Vec<_>>>()?;
        SafetensorsSource::index(path.to_path_buf(), files)
    }

    /// A checkpoint held in memory (one `model.safetensors` worth of bytes, e.g. fetched by a
    /// browser or built by `model::synth`); `name` stands for the file in error messages.
    /// Errors: [`Error::File`] naming `name` when the bytes are not a valid safetensors file.
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<Self> {
        let p = PathBuf::from(name);
        SafetensorsSource::index(p.clone(), vec![(p, FileBytes::Owned(bytes))])
    }

    /// Validate every file's header and build the name → file index.
    fn index(root: PathBuf, files: Vec<(PathBuf, FileBytes)>) -> Result<Self> {
        let mut index = BTreeMap::new();
        for (i, (p, bytes)) in files.iter().enumerate() {
            let st = SafeTensors::deserialize(bytes).map_err(|e| Error::file(p, format!("not a valid safetensors file (truncated or corrupt?): {e}")))?;
            for name in st.names() {
                index.insert(name.to_string(), i);
            }
        }
        Ok(SafetensorsSource { root, files, index })
    }
}

impl TensorSource for SafetensorsSource {
    fn path(&self) -> &Path {
        &self.root
    }

    fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn names(&self) -> Vec<String> {
        self.index.keys().cloned().collect()
    }

    fn load(&self, name: &str) -> Result<HostTensor> {
        let &fi = self.index.get(name).ok_or_else(|| Error::tensor(&self.root, name, "not found in checkpoint"))?;
        let (path, map) = &self.files[fi];
        let st = SafeTensors::deserialize(map).map_err(|e| Error::file(path, e.to_string()))?;
        let view = st.tensor(name).map_err(|e| Error::tensor(path, name, e.to_string()))?;
        let bytes = view.data();
        let data: Vec<f32> = match view.dtype() {
            Dtype::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            Dtype::BF16 => bytes.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            Dtype::F16 => bytes.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            other => return Err(Error::tensor(path, name, format!("unsupported dtype {other:?}; expected F32, BF16 or F16"))),
        };
        Ok(HostTensor { shape: view.shape().to_vec(), data })
    }

    fn load_ints(&self, name: &str) -> Result<(Vec<usize>, Vec<i64>)> {
        let &fi = self.index.get(name).ok_or_else(|| Error::tensor(&self.root, name, "not found in checkpoint"))?;
        let (path, map) = &self.files[fi];
        let st = SafeTensors::deserialize(map).map_err(|e| Error::file(path, e.to_string()))?;
        let view = st.tensor(name).map_err(|e| Error::tensor(path, name, e.to_string()))?;
        let b = view.data();
        let data: Vec<i64> = match view.dtype() {
            Dtype::I64 => b.chunks_exact(8).map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect(),
            Dtype::I32 => b.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64).collect(),
            Dtype::U32 => b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64).collect(),
            Dtype::I16 => b.chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]]) as i64).collect(),
            Dtype::U16 => b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as i64).collect(),
            Dtype::U8 => b.iter().map(|&x| x as i64).collect(),
            other => return Err(Error::tensor(path, name, format!("unsupported dtype {other:?}; expected an integer tensor (I64, I32, U32, I16, U16, U8)"))),
        };
        Ok((view.shape().to_vec(), data))
    }
}
