//! Checkpoint loaders: a [`TensorSource`] hands out named tensors as f32 in the HF naming and
//! layout (`[out, in]`), whatever the file format (safetensors directory or GGUF file).

pub mod bytes;
pub mod gguf;
pub mod gguf_source;
#[cfg(not(target_arch = "wasm32"))]
pub mod hub;
pub mod safetensors_source;

use crate::error::{Error, Result};
use std::path::Path;

/// A tensor on the host: `shape` slowest dimension first, `data` row-major f32.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Dimensions, slowest first (HF/PyTorch order).
    pub shape: Vec<usize>,
    /// `shape.iter().product()` values.
    pub data: Vec<f32>,
}

/// Something that serves named tensors (HF names, HF layout) converted to f32.
pub trait TensorSource {
    /// The file or directory this source reads, for error messages.
    fn path(&self) -> &Path;
    /// Whether a tensor of this (HF) name exists.
    fn contains(&self, name: &str) -> bool;
    /// All tensor names (HF naming).
    fn names(&self) -> Vec<String>;
    /// Load and convert one tensor. Errors name the file and tensor.
    fn load(&self, name: &str) -> Result<HostTensor>;

    /// The name tensor `name` (HF naming) has in the file, for error messages: the GGUF name
    /// for a GGUF file (`blk.0.ffn_up.weight` for `model.layers.0.mlp.up_proj.weight`), else
    /// `name` itself.
    fn file_name(&self, name: &str) -> String {
        name.to_string()
    }

    /// The ggml type id of tensor `name` when the source stores ggml blocks (GGUF); `None` for
    /// other sources and missing tensors.
    fn ggml_type(&self, name: &str) -> Option<u32> {
        let _ = name;
        None
    }

    /// Tensor `name` as stored (ggml blocks, HF row order), checked to be a matrix of `shape`
    /// `[n, k]`; `Ok(None)` for sources that do not store ggml blocks. Errors name the file and
    /// tensor (missing, wrong shape).
    fn load_ggml(&self, name: &str, shape: [usize; 2]) -> Result<Option<sparkling_core::GgmlWeight>> {
        let _ = (name, shape);
        Ok(None)
    }

    /// Load an integer tensor (safetensors I64, I32, U32, I16, U16, U8) as i64 values with its
    /// shape. Errors name the file and tensor (missing, a float or other dtype); the default
    /// refuses: the source stores no integer tensors.
    fn load_ints(&self, name: &str) -> Result<(Vec<usize>, Vec<i64>)> {
        Err(Error::tensor(self.path(), name, "this checkpoint format stores no integer tensors"))
    }

    /// Load a tensor and check its shape; the error names the tensor, expected and found shape.
    fn load_shaped(&self, name: &str, shape: &[usize]) -> Result<HostTensor> {
        let t = self.load(name)?;
        if t.shape != shape {
            return Err(Error::tensor(self.path(), &self.file_name(name), format!("expected shape {shape:?}, found {:?}", t.shape)));
        }
        if let Some(i) = t.data.iter().position(|x| !x.is_finite()) {
            return Err(Error::tensor(self.path(), &self.file_name(name), format!("value {} at index {i} is not finite (corrupt weights)", t.data[i])));
        }
        Ok(t)
    }
}

/// Open a checkpoint: a `.gguf` file, or a directory / `.safetensors` file in HF layout.
pub fn open_source(path: &Path) -> Result<Box<dyn TensorSource>> {
    if path.extension().is_some_and(|e| e == "gguf") {
        Ok(Box::new(gguf_source::GgufSource::open(path)?))
    } else {
        Ok(Box::new(safetensors_source::SafetensorsSource::open(path)?))
    }
}
