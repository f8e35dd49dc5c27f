//! GGUF files as a [`TensorSource`]: llama.cpp tensor names are mapped to HF names, tensors are
//! handed over in their ggml blocks (`load_ggml`, for a backend that keeps them) or dequantized
//! to f32 at load, each tensor's mapped pages are released once copied, and llama-architecture
//! Q/K projections are un-permuted so one NeoX (rotate-half) RoPE serves every model.

use super::gguf::{GgufError, GgufFile};
use super::{HostTensor, TensorSource};
use crate::error::{Error, Result};
use std::path::Path;

/// A GGUF file serving tensors under their HF names.
pub struct GgufSource {
    /// The parsed file (metadata is read by the config loader and tokenizer).
    pub file: GgufFile,
    arch: String,
    n_heads: usize,
    n_kv_heads: usize,
}

/// HF suffix ↔ GGUF suffix of per-layer tensors.
const LAYER_MAP: &[(&str, &str)] = &[
    ("input_layernorm.weight", "attn_norm.weight"),
    ("self_attn.q_proj.weight", "attn_q.weight"),
    ("self_attn.q_proj.bias", "attn_q.bias"),
    ("self_attn.k_proj.weight", "attn_k.weight"),
    ("self_attn.k_proj.bias", "attn_k.bias"),
    ("self_attn.v_proj.weight", "attn_v.weight"),
    ("self_attn.v_proj.bias", "attn_v.bias"),
    ("self_attn.o_proj.weight", "attn_output.weight"),
    ("self_attn.q_norm.weight", "attn_q_norm.weight"),
    ("self_attn.k_norm.weight", "attn_k_norm.weight"),
    ("post_attention_layernorm.weight", "ffn_norm.weight"),
    ("mlp.gate_proj.weight", "ffn_gate.weight"),
    ("mlp.up_proj.weight", "ffn_up.weight"),
    ("mlp.down_proj.weight", "ffn_down.weight"),
];

const GLOBAL_MAP: &[(&str, &str)] =
    &[("model.embed_tokens.weight", "token_embd.weight"), ("model.norm.weight", "output_norm.weight"), ("lm_head.weight", "output.weight")];

/// Map an HF tensor name to its GGUF name.
pub fn gguf_name(hf: &str) -> Option<String> {
    if let Some((_, g)) = GLOBAL_MAP.iter().find(|(h, _)| *h == hf) {
        return Some(g.to_string());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (idx, suffix) = rest.split_once('.')?;
    let i: usize = idx.parse().ok()?;
    LAYER_MAP.iter().find(|(h, _)| *h == suffix).map(|(_, g)| format!("blk.{i}.{g}"))
}

/// Map a GGUF tensor name to its HF name.
pub fn hf_name(gguf: &str) -> Option<String> {
    if let Some((h, _)) = GLOBAL_MAP.iter().find(|(_, g)| *g == gguf) {
        return Some(h.to_string());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (idx, suffix) = rest.split_once('.')?;
    let i: usize = idx.parse().ok()?;
    LAYER_MAP.iter().find(|(_, g)| *g == suffix).map(|(h, _)| format!("model.layers.{i}.{h}"))
}

/// Undo llama.cpp's Q/K row permutation (convert_hf_to_gguf `permute`): within each head of
/// `head_dim` rows, GGUF row `2j + half` holds HF row `half*head_dim/2 + j`.
/// `data` is `[n_heads*head_dim, cols]` row-major (cols = 1 for a bias).
pub fn unpermute_rows(data: &[f32], n_heads: usize, cols: usize) -> Vec<f32> {
    unpermute(data, n_heads, cols)
}

/// [`unpermute_rows`] on raw bytes: `data` holds `rows` equal-sized rows (ggml blocks, which
/// are whole rows, so the permutation moves them unchanged).
pub fn permute_row_bytes(data: &[u8], rows: usize, n_heads: usize) -> Vec<u8> {
    if rows == 0 {
        return data.to_vec();
    }
    unpermute(data, n_heads, data.len() / rows)
}

/// The row permutation of [`unpermute_rows`] for rows of `cols` elements of any type.
fn unpermute<T: Copy + Default>(data: &[T], n_heads: usize, cols: usize) -> Vec<T> {
    if cols == 0 || n_heads == 0 {
        // A malformed file (a zero dimension, no heads): left as is for the shape checks to
        // report, never a division by zero (found by tests/fuzz.rs).
        return data.to_vec();
    }
    let rows = data.len() / cols;
    let hd = rows / n_heads;
    let mut out = vec![T::default(); data.len()];
    for h in 0..n_heads {
        for j in 0..hd / 2 {
            for half in 0..2 {
                let src = h * hd + 2 * j + half;
                let dst = h * hd + half * hd / 2 + j;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

impl GgufSource {
    /// Open and index a GGUF file.
    pub fn open(path: &Path) -> Result<Self> {
        let file = GgufFile::open(path)?;
        GgufSource::from_file(file)
    }

    /// Index a GGUF file held in memory (a browser's fetch); `name` stands for the file in
    /// error messages. Errors: an invalid GGUF file or missing architecture keys (named).
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<Self> {
        let file = GgufFile::from_bytes(name, bytes)?;
        GgufSource::from_file(file)
    }

    /// Index a parsed GGUF file.
    pub fn from_file(file: GgufFile) -> Result<Self> {
        let arch = file.get_str("general.architecture")?.to_string();
        let n_heads = file.get_u64(&format!("{arch}.attention.head_count"))? as usize;
        let n_kv_heads = file.get_u64(&format!("{arch}.attention.head_count_kv")).map(|v| v as usize).unwrap_or(n_heads);
        Ok(GgufSource { file, arch, n_heads, n_kv_heads })
    }
}

impl GgufSource {
    /// Heads whose rows llama.cpp permuted in GGUF tensor `g` (llama architecture Q/K), if any.
    fn permuted_heads(&self, g: &str) -> Option<usize> {
        if self.arch != "llama" {
            None
        } else if g.contains(".attn_q.") {
            Some(self.n_heads)
        } else if g.contains(".attn_k.") {
            Some(self.n_kv_heads)
        } else {
            None
        }
    }
}

/// A [`GgufError`] about tensor `g` as an [`Error::Tensor`], without repeating the file and
/// tensor prefix the GGUF reader's message already starts with.
fn tensor_error(path: &Path, g: &str, e: GgufError) -> Error {
    let s = e.to_string();
    let file = format!("{}: ", path.display());
    let tensor = format!("tensor `{g}`: ");
    let rest = s.strip_prefix(&file).unwrap_or(&s);
    let rest = rest.strip_prefix(&tensor).unwrap_or(rest);
    Error::tensor(path, g, rest)
}

impl TensorSource for GgufSource {
    fn file_name(&self, name: &str) -> String {
        gguf_name(name).unwrap_or_else(|| name.to_string())
    }

    fn ggml_type(&self, name: &str) -> Option<u32> {
        gguf_name(name).and_then(|g| self.file.tensor(&g)).map(|t| t.ggml_type)
    }

    fn load_ggml(&self, name: &str, shape: [usize; 2]) -> Result<Option<sparkling_core::GgmlWeight>> {
        let g = gguf_name(name).ok_or_else(|| Error::tensor(&self.file.path, name, "no GGUF equivalent for this HF tensor name"))?;
        let info = self.file.tensor(&g).ok_or_else(|| Error::tensor(&self.file.path, &g, "tensor not found"))?;
        if info.shape() != shape {
            return Err(Error::tensor(&self.file.path, &g, format!("expected shape {shape:?}, found {:?}", info.shape())));
        }
        let ggml_type = info.ggml_type;
        let raw = self.file.tensor_data(&g).map_err(|e| tensor_error(&self.file.path, &g, e))?;
        let [n, k] = shape;
        // Rows are whole runs of blocks, so the Q/K un-permutation moves row byte ranges.
        let bytes = match self.permuted_heads(&g) {
            Some(h) if n > 0 && h > 0 && raw.len() % n == 0 && n % h == 0 => permute_row_bytes(raw, n, h),
            Some(_) => return Err(Error::tensor(&self.file.path, &g, format!("{n} rows do not split into heads"))),
            None => raw.to_vec(),
        };
        self.file.release_tensor(&g);
        Ok(Some(sparkling_core::GgmlWeight { ggml_type, n, k, bytes }))
    }

    fn path(&self) -> &Path {
        &self.file.path
    }

    fn contains(&self, name: &str) -> bool {
        gguf_name(name).is_some_and(|g| self.file.tensor(&g).is_some())
    }

    fn names(&self) -> Vec<String> {
        self.file.tensors.iter().filter_map(|t| hf_name(&t.name)).collect()
    }

    fn load(&self, name: &str) -> Result<HostTensor> {
        let g = gguf_name(name).ok_or_else(|| Error::tensor(&self.file.path, name, "no GGUF equivalent for this HF tensor name"))?;
        let (shape, data) = self.file.tensor_f32(&g).map_err(|e| tensor_error(&self.file.path, &g, e))?;
        self.file.release_tensor(&g);
        let data = match self.permuted_heads(&g) {
            Some(h) => {
                let cols = if shape.len() == 2 { shape[1] } else { 1 };
                unpermute_rows(&data, h, cols)
            }
            None => data,
        };
        Ok(HostTensor { shape, data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for hf in ["model.embed_tokens.weight", "model.layers.7.self_attn.k_proj.bias", "lm_head.weight"] {
            let g = gguf_name(hf).unwrap();
            assert_eq!(hf_name(&g).as_deref(), Some(hf));
        }
        assert_eq!(gguf_name("model.layers.3.mlp.down_proj.weight").as_deref(), Some("blk.3.ffn_down.weight"));
    }

    /// Errors about a GGUF tensor name it as the file does (`blk.0.ffn_up.weight`, not the
    /// engine's HF name) and say the file and tensor once.
    #[test]
    fn errors_name_the_gguf_tensor_once() {
        use crate::loader::gguf::tests::{gguf_bytes, TempFile};
        use crate::loader::gguf::MetaValue;
        let kvs = [("general.architecture", MetaValue::Str("qwen2".into())), ("qwen2.attention.head_count", MetaValue::U32(1))];
        // IQ2_XXS (16): a known size, no dequantizer; f32 (0) with a NaN.
        let nan: Vec<u8> = [1.0f32, f32::NAN].iter().flat_map(|x| x.to_le_bytes()).collect();
        let f = TempFile::with(&gguf_bytes(&kvs, &[("blk.0.ffn_up.weight", vec![256], 16, vec![0; 66]), ("blk.0.attn_norm.weight", vec![2], 0, nan)]));
        let src = GgufSource::open(&f.0).unwrap();
        let e = src.load("model.layers.0.mlp.up_proj.weight").unwrap_err().to_string();
        assert!(e.contains("tensor `blk.0.ffn_up.weight`: ") && e.contains("IQ2_XXS"), "{e}");
        assert_eq!(e.matches(&*f.0.display().to_string()).count(), 1, "{e}");
        assert_eq!(e.matches("blk.0.ffn_up.weight").count(), 1, "{e}");
        let e = src.load("model.layers.0.self_attn.q_proj.bias").unwrap_err().to_string();
        assert!(e.ends_with("tensor `blk.0.attn_q.bias`: not found") && e.matches("blk.0.attn_q.bias").count() == 1, "{e}");
        let e = src.load_shaped("model.layers.0.input_layernorm.weight", &[2]).unwrap_err().to_string();
        assert!(e.contains("tensor `blk.0.attn_norm.weight`") && e.contains("not finite"), "{e}");
        let e = src.load_shaped("model.layers.0.input_layernorm.weight", &[3]).unwrap_err().to_string();
        assert!(e.contains("tensor `blk.0.attn_norm.weight`") && e.contains("expected shape [3]"), "{e}");
        assert_eq!(src.file_name("lm_head.weight"), "output.weight");
    }

    #[test]
    fn unpermute_inverts_llama_permute() {
        // HF rows of one head (hd = 4): r0..r3; llama.cpp permute interleaves halves:
        // GGUF rows = [r0, r2, r1, r3].
        let gguf = [0.0f32, 2.0, 1.0, 3.0, 10.0, 12.0, 11.0, 13.0];
        assert_eq!(unpermute_rows(&gguf, 2, 1), vec![0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0]);
        // Raw rows (2 bytes each) move exactly as the f32 rows do; no rows or no heads: unchanged.
        let bytes: Vec<u8> = gguf.iter().flat_map(|&v| [v as u8, v as u8 + 100]).collect();
        let moved: Vec<u8> = unpermute_rows(&gguf, 2, 1).iter().flat_map(|&v| [v as u8, v as u8 + 100]).collect();
        assert_eq!(permute_row_bytes(&bytes, 8, 2), moved);
        assert_eq!(permute_row_bytes(&bytes, 0, 2), bytes);
        assert_eq!(permute_row_bytes(&bytes, 8, 0), bytes);
    }
}
