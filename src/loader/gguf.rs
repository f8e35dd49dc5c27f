// TEMPORARY STUB written by the integrator so the crate compiles; the GGUF helper overwrites this file.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
#[derive(Debug)]
pub struct GgufError(pub String);
impl std::fmt::Display for GgufError { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "{}", self.0) } }
impl std::error::Error for GgufError {}
pub enum MetaValue { Str(String) }
pub struct TensorInfo { pub name: String, pub dims: Vec<u64>, pub ggml_type: u32, pub offset: u64 }
pub struct GgufFile { pub path: PathBuf, pub version: u32, pub metadata: BTreeMap<String, MetaValue>, pub tensors: Vec<TensorInfo> }
impl GgufFile {
  pub fn open(path: &Path) -> Result<GgufFile, GgufError> { Err(GgufError(format!("stub {}", path.display()))) }
  pub fn get(&self, key: &str) -> Option<&MetaValue> { self.metadata.get(key) }
  pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> { Err(GgufError(key.into())) }
  pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> { Err(GgufError(key.into())) }
  pub fn get_str(&self, key: &str) -> Result<&str, GgufError> { Err(GgufError(key.into())) }
  pub fn tensor(&self, name: &str) -> Option<&TensorInfo> { self.tensors.iter().find(|t| t.name == name) }
  pub fn tensor_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>), GgufError> { Err(GgufError(name.into())) }
}
