//! GGUF (v2/v3) reader with f32 dequantization of the common ggml tensor types.
//!
//! Format facts used here come from ggml's `docs/gguf.md` (file layout) and the block layouts of
//! `ggml-common.h` / `ggml-quants.c` (quantized types), restated in our own words:
//!
//! ```text
//! file   := header kv* tensor_info* padding data
//! header := magic "GGUF" (4 bytes) | version u32 | tensor_count u64 | kv_count u64
//! kv     := key gguf_string | value_type u32 | value
//! string := len u64 | len bytes of UTF-8 (no terminator)
//! array  := elem_type u32 | count u64 | count values (arrays may nest)
//! tensor_info := name gguf_string | n_dims u32 | dims u64[n_dims] | ggml_type u32 | offset u64
//! ```
//!
//! All integers are little-endian. `dims[0]` is the fastest-varying dimension (a row of a 2-D
//! weight). The data section starts at the first multiple of the alignment (`general.alignment`,
//! default 32) after the tensor infos; each tensor's `offset` is relative to that start and is itself
//! a multiple of the alignment. Quantized types store a row as consecutive blocks of
//! `block_size` values (32 for the legacy `Q*_0/Q*_1` types, 256 for the K-quants), so `dims[0]`
//! must be a multiple of the block size.
//!
//! The file is memory-mapped ([`memmap2`]); tensors are dequantized on request with
//! [`GgufFile::tensor_f32`] or, for raw bytes, [`dequantize`].

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;

/// Error of the GGUF reader: a human-readable message that names the file path, tensor or
/// metadata key at fault and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufError(pub String);

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for GgufError {}

fn err<T>(msg: impl Into<String>) -> Result<T, GgufError> {
    Err(GgufError(msg.into()))
}

// ---------------------------------------------------------------------------------------------
// ggml type table
// ---------------------------------------------------------------------------------------------

/// ggml type ids (the `ggml_type` field of a tensor info), as numbered in `ggml.h` / gguf.md.
pub mod ggml_type {
    /// 32-bit IEEE float.
    pub const F32: u32 = 0;
    /// 16-bit IEEE half float.
    pub const F16: u32 = 1;
    /// 4-bit, 32-value blocks with one f16 scale.
    pub const Q4_0: u32 = 2;
    /// 4-bit, 32-value blocks with f16 scale and min.
    pub const Q4_1: u32 = 3;
    /// 5-bit, 32-value blocks with one f16 scale.
    pub const Q5_0: u32 = 6;
    /// 5-bit, 32-value blocks with f16 scale and min.
    pub const Q5_1: u32 = 7;
    /// 8-bit, 32-value blocks with one f16 scale.
    pub const Q8_0: u32 = 8;
    /// 8-bit with precomputed sums (activations only; not dequantized here).
    pub const Q8_1: u32 = 9;
    /// 2-bit K-quant, 256-value super-blocks.
    pub const Q2_K: u32 = 10;
    /// 3-bit K-quant, 256-value super-blocks.
    pub const Q3_K: u32 = 11;
    /// 4-bit K-quant, 256-value super-blocks.
    pub const Q4_K: u32 = 12;
    /// 5-bit K-quant, 256-value super-blocks.
    pub const Q5_K: u32 = 13;
    /// 6-bit K-quant, 256-value super-blocks.
    pub const Q6_K: u32 = 14;
    /// 8-bit K-quant (activations only; not dequantized here).
    pub const Q8_K: u32 = 15;
    /// bfloat16 (upper half of an f32).
    pub const BF16: u32 = 30;
}

/// Values per super-block of the K-quants.
const QK_K: usize = 256;

/// `(name, block_size in values, bytes per block)` for every ggml type id this reader knows the
/// size of (used to bound-check tensors even when they cannot be dequantized). Sizes follow the
/// block structs of `ggml-common.h`.
fn type_layout(t: u32) -> Option<(&'static str, usize, usize)> {
    Some(match t {
        0 => ("F32", 1, 4),
        1 => ("F16", 1, 2),
        2 => ("Q4_0", 32, 18),
        3 => ("Q4_1", 32, 20),
        6 => ("Q5_0", 32, 22),
        7 => ("Q5_1", 32, 24),
        8 => ("Q8_0", 32, 34),
        9 => ("Q8_1", 32, 36),
        10 => ("Q2_K", QK_K, 84),
        11 => ("Q3_K", QK_K, 110),
        12 => ("Q4_K", QK_K, 144),
        13 => ("Q5_K", QK_K, 176),
        14 => ("Q6_K", QK_K, 210),
        15 => ("Q8_K", QK_K, 292),
        16 => ("IQ2_XXS", QK_K, 66),
        17 => ("IQ2_XS", QK_K, 74),
        18 => ("IQ3_XXS", QK_K, 98),
        19 => ("IQ1_S", QK_K, 50),
        20 => ("IQ4_NL", 32, 18),
        21 => ("IQ3_S", QK_K, 110),
        22 => ("IQ2_S", QK_K, 82),
        23 => ("IQ4_XS", QK_K, 136),
        24 => ("I8", 1, 1),
        25 => ("I16", 1, 2),
        26 => ("I32", 1, 4),
        27 => ("I64", 1, 8),
        28 => ("F64", 1, 8),
        29 => ("IQ1_M", QK_K, 56),
        30 => ("BF16", 1, 2),
        34 => ("TQ1_0", QK_K, 54),
        35 => ("TQ2_0", QK_K, 66),
        39 => ("MXFP4", 32, 17),
        _ => return None,
    })
}

/// The types [`dequantize`] supports, by id.
const SUPPORTED: [u32; 13] = [0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 30];

fn supported_list() -> String {
    SUPPORTED.iter().map(|&t| type_name(t)).collect::<Vec<_>>().join(", ")
}

/// The ggml name of a type id (`"Q4_K"`, `"BF16"`, ...), or `"unknown"` for an id this reader
/// does not know.
pub fn type_name(ggml_type: u32) -> &'static str {
    type_layout(ggml_type).map_or("unknown", |l| l.0)
}

/// Number of bytes `n_elements` values of `ggml_type` occupy, or an error message when the type is
/// unknown or `n_elements` is not a whole number of blocks.
#[allow(clippy::manual_is_multiple_of)] // `is_multiple_of` needs Rust 1.87; the workspace MSRV is 1.85
fn byte_size(ggml_type: u32, n_elements: u64) -> Result<u64, String> {
    let (name, block, bytes) = type_layout(ggml_type).ok_or_else(|| format!("unknown ggml type id {ggml_type}"))?;
    if n_elements % block as u64 != 0 {
        return Err(format!("{n_elements} values of type {name} are not a whole number of {block}-value blocks"));
    }
    (n_elements / block as u64)
        .checked_mul(bytes as u64)
        .ok_or_else(|| format!("size of {n_elements} values of type {name} overflows"))
}

// ---------------------------------------------------------------------------------------------
// Metadata values
// ---------------------------------------------------------------------------------------------

/// One metadata value. The variants map one-to-one onto the GGUF value types
/// (`UINT8`=0, `INT8`=1, `UINT16`=2, `INT16`=3, `UINT32`=4, `INT32`=5, `FLOAT32`=6, `BOOL`=7,
/// `STRING`=8, `ARRAY`=9, `UINT64`=10, `INT64`=11, `FLOAT64`=12).
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// GGUF `UINT8`.
    U8(u8),
    /// GGUF `INT8`.
    I8(i8),
    /// GGUF `UINT16`.
    U16(u16),
    /// GGUF `INT16`.
    I16(i16),
    /// GGUF `UINT32`.
    U32(u32),
    /// GGUF `INT32`.
    I32(i32),
    /// GGUF `UINT64`.
    U64(u64),
    /// GGUF `INT64`.
    I64(i64),
    /// GGUF `FLOAT32`.
    F32(f32),
    /// GGUF `FLOAT64`.
    F64(f64),
    /// GGUF `BOOL` (one byte, 0 or 1).
    Bool(bool),
    /// GGUF `STRING` (UTF-8).
    Str(String),
    /// An array; GGUF arrays are homogeneous (every element has the array's element type).
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// The GGUF type name of this value (`"u32"`, `"string"`, `"array"`, ...), for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F32(_) => "f32",
            MetaValue::F64(_) => "f64",
            MetaValue::Bool(_) => "bool",
            MetaValue::Str(_) => "string",
            MetaValue::Array(_) => "array",
        }
    }

    /// Any integer variant as `i128` (wide enough for both `u64` and `i64`); `None` otherwise.
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            MetaValue::U8(v) => v as i128,
            MetaValue::I8(v) => v as i128,
            MetaValue::U16(v) => v as i128,
            MetaValue::I16(v) => v as i128,
            MetaValue::U32(v) => v as i128,
            MetaValue::I32(v) => v as i128,
            MetaValue::U64(v) => v as i128,
            MetaValue::I64(v) => v as i128,
            _ => return None,
        })
    }

    /// Float or integer variants as `f64`; `None` otherwise.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v as f64),
            MetaValue::F64(v) => Some(v),
            _ => self.as_int().map(|v| v as f64),
        }
    }

    /// The string of a `Str` value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tensor infos and the file
// ---------------------------------------------------------------------------------------------

/// Where and how one tensor is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name as written in the file (llama.cpp naming, e.g. `blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions in GGUF order: `dims[0]` varies fastest (the columns of a 2-D weight).
    pub dims: Vec<u64>,
    /// ggml type id; see [`type_name`].
    pub ggml_type: u32,
    /// Absolute file offset of the tensor's first byte (data-section start + relative offset).
    pub offset: u64,
}

impl TensorInfo {
    /// Number of values (product of `dims`; 1 for zero dimensions).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Dimensions slowest first (`dims` reversed), e.g. `[rows, cols]` = HF `[out, in]` for a
    /// 2-D weight. This is the shape [`GgufFile::tensor_f32`] returns.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// Bytes the tensor occupies in the file (validated by [`GgufFile::open`]).
    pub fn n_bytes(&self) -> u64 {
        byte_size(self.ggml_type, self.n_elements()).unwrap_or(0)
    }
}

/// An opened, validated, memory-mapped GGUF file.
///
/// [`GgufFile::open`] parses the header, metadata and tensor infos and checks every tensor lies
/// inside the file; tensor data is read lazily from the mapping.
#[derive(Debug)]
pub struct GgufFile {
    /// The path the file was opened from (used in every error message).
    pub path: PathBuf,
    /// GGUF version (2 or 3; both share this layout).
    pub version: u32,
    /// All metadata key/values.
    pub metadata: BTreeMap<String, MetaValue>,
    /// Tensor infos in file order (treat as read-only: [`GgufFile::tensor`] uses an index built
    /// by [`GgufFile::open`]).
    pub tensors: Vec<TensorInfo>,
    /// Alignment of the data section and of every tensor offset.
    alignment: u64,
    /// Name -> index into `tensors`.
    index: HashMap<String, usize>,
    mmap: Mmap,
}

/// Bounded little-endian reader over the mapped header; every failure names the file, the offset
/// and what was being read.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.buf.len() => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            _ => err(format!(
                "{}: unexpected end of file at byte {} while reading {} ({} bytes needed, file is {} bytes; truncated?)",
                self.path.display(),
                self.pos,
                what(),
                n,
                self.buf.len()
            )),
        }
    }

    fn arr<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let at = self.pos;
        let len = self.u64(what)?;
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|e| GgufError(format!("{}: {} at byte {at} is not valid UTF-8: {e}", self.path.display(), what())))
    }

    /// Read one value of GGUF value type `ty` (arrays recurse, at most `depth` levels).
    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<MetaValue, GgufError> {
        let what = || format!("the value of metadata key `{key}`");
        Ok(match ty {
            0 => MetaValue::U8(self.arr::<1>(&what)?[0]),
            1 => MetaValue::I8(self.arr::<1>(&what)?[0] as i8),
            2 => MetaValue::U16(u16::from_le_bytes(self.arr(&what)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.arr(&what)?)),
            4 => MetaValue::U32(u32::from_le_bytes(self.arr(&what)?)),
            5 => MetaValue::I32(i32::from_le_bytes(self.arr(&what)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.arr(&what)?)),
            7 => {
                // One byte; like ggml, any non-zero value reads as true.
                MetaValue::Bool(self.arr::<1>(&what)?[0] != 0)
            }
            8 => MetaValue::Str(self.string(&what)?),
            9 => {
                if depth == 0 {
                    return err(format!("{}: metadata key `{key}`: arrays nested too deeply", self.path.display()));
                }
                let elem = self.u32(&what)?;
                let count = self.u64(&what)?;
                // Every element takes at least one byte: reject absurd counts before allocating.
                let left = (self.buf.len() - self.pos) as u64;
                if count > left {
                    return err(format!(
                        "{}: metadata key `{key}`: array of {count} elements cannot fit in the {left} bytes left in the file (truncated or corrupt?)",
                        self.path.display()
                    ));
                }
                let mut v = Vec::with_capacity(count.min(1 << 20) as usize);
                for _ in 0..count {
                    v.push(self.value(elem, key, depth - 1)?);
                }
                MetaValue::Array(v)
            }
            10 => MetaValue::U64(u64::from_le_bytes(self.arr(&what)?)),
            11 => MetaValue::I64(i64::from_le_bytes(self.arr(&what)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.arr(&what)?)),
            _ => {
                return err(format!(
                    "{}: metadata key `{key}` has unknown value type {ty} (expected 0..=12)",
                    self.path.display()
                ))
            }
        })
    }
}

/// GGUF magic: the bytes `G G U F` at offset 0.
const MAGIC: &[u8; 4] = b"GGUF";
/// Maximum tensor rank in ggml.
const MAX_DIMS: u32 = 4;

impl GgufFile {
    /// Open and validate a GGUF file.
    ///
    /// Memory-maps `path`, checks the magic (`GGUF`) and version (2 or 3, little-endian), parses
    /// all metadata and tensor infos, reads the alignment from `general.alignment` (default 32;
    /// must be a power of two), and checks that every tensor has 1–4 dimensions, a row length
    /// that is a whole number of blocks, an aligned offset and data that lies entirely inside the
    /// file. A tensor of a type id this reader does not know is still listed (only its offset is
    /// bound-checked); [`GgufFile::tensor_f32`] reports it.
    ///
    /// # Errors
    /// A [`GgufError`] naming the path and, as applicable, the offset, metadata key or tensor at
    /// fault: unreadable file, bad magic, unsupported version, truncated header, invalid UTF-8,
    /// duplicate key or tensor name, bad alignment, or a tensor whose data ends past the end of
    /// the file (a truncated download).
    ///
    /// The mapping assumes the file is not modified while the `GgufFile` lives (as for any
    /// memory-mapped model loader).
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let p = path.display();
        let file = File::open(path).map_err(|e| GgufError(format!("{p}: cannot open GGUF file: {e}")))?;
        let len = file.metadata().map_err(|e| GgufError(format!("{p}: cannot stat GGUF file: {e}")))?.len();
        if len < 24 {
            return err(format!("{p}: file is {len} bytes, too small to be a GGUF file (header alone is 24 bytes)"));
        }
        // SAFETY: the mapping is read-only; like every mmap-based loader we rely on the file not
        // being truncated or rewritten by another process while it is mapped.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| GgufError(format!("{p}: cannot memory-map file: {e}")))?;
        let buf: &[u8] = &mmap;

        if &buf[0..4] != MAGIC {
            return err(format!(
                "{p}: not a GGUF file: magic bytes are {:02x?}, expected \"GGUF\" (47 47 55 46)",
                &buf[0..4]
            ));
        }
        let mut c = Cursor { buf, pos: 4, path };
        let version = c.u32(&|| "the version".into())?;
        if version != 2 && version != 3 {
            let hint = if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
                " (this looks like a big-endian GGUF, which is not supported)"
            } else if version == 1 {
                " (GGUF v1 used 32-bit counts and is obsolete; re-convert the model)"
            } else {
                ""
            };
            return err(format!("{p}: unsupported GGUF version {version}, expected 2 or 3{hint}"));
        }
        let n_tensors = c.u64(&|| "the tensor count".into())?;
        let n_kv = c.u64(&|| "the metadata count".into())?;

        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = c.string(&|| format!("the key of metadata entry {i}"))?;
            let ty = c.u32(&|| format!("the value type of metadata key `{key}`"))?;
            let v = c.value(ty, &key, 8)?;
            if metadata.insert(key.clone(), v).is_some() {
                return err(format!("{p}: metadata key `{key}` appears twice"));
            }
        }

        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => match v.as_int() {
                Some(a) if a > 0 && (a as u64).is_power_of_two() && a <= u32::MAX as i128 => a as u64,
                _ => {
                    return err(format!(
                        "{p}: metadata key `general.alignment` is {v:?}, expected a positive power-of-two integer"
                    ))
                }
            },
        };

        // Counts are untrusted: cap pre-allocation; a bogus count fails at end of file instead.
        let mut raw = Vec::with_capacity(n_tensors.min(1 << 16) as usize);
        for i in 0..n_tensors {
            let name = c.string(&|| format!("the name of tensor info {i}"))?;
            let what = || format!("the info of tensor `{name}`");
            let n_dims = c.u32(&what)?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return err(format!("{p}: tensor `{name}` has {n_dims} dimensions, expected 1..={MAX_DIMS}"));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64(&what)?);
            }
            let ty = c.u32(&what)?;
            let rel = c.u64(&what)?;
            raw.push((name, dims, ty, rel));
        }
        let data_start = (c.pos as u64).div_ceil(alignment) * alignment;

        let mut tensors = Vec::with_capacity(raw.len());
        let mut index = HashMap::with_capacity(raw.len());
        for (name, dims, ty, rel) in raw {
            let tname = type_name(ty);
            let n = dims
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .ok_or_else(|| GgufError(format!("{p}: tensor `{name}` dims {dims:?}: element count overflows")))?;
            if let Some((_, block, _)) = type_layout(ty) {
                if dims[0] % block as u64 != 0 {
                    return err(format!(
                        "{p}: tensor `{name}` of type {tname} has row length dims[0] = {}, which is not a multiple of the {block}-value block size",
                        dims[0]
                    ));
                }
            }
            if rel % alignment != 0 {
                return err(format!(
                    "{p}: tensor `{name}` has data offset {rel}, which is not a multiple of the alignment {alignment}"
                ));
            }
            let offset = data_start
                .checked_add(rel)
                .ok_or_else(|| GgufError(format!("{p}: tensor `{name}`: data offset {rel} overflows")))?;
            // Unknown types cannot be sized; they are still listed and fail in `tensor_f32`.
            let size = byte_size(ty, n).unwrap_or(0);
            let end = offset.saturating_add(size);
            if end > len || offset > len {
                return err(format!(
                    "{p}: tensor `{name}` ({tname}, dims {dims:?}) needs file bytes {offset}..{end}, but the file is only {len} bytes (truncated download?)"
                ));
            }
            if index.insert(name.clone(), tensors.len()).is_some() {
                return err(format!("{p}: tensor name `{name}` appears twice"));
            }
            tensors.push(TensorInfo { name, dims, ggml_type: ty, offset });
        }

        Ok(GgufFile { path: path.to_path_buf(), version, metadata, tensors, alignment, index, mmap })
    }

    /// Alignment (bytes) of the data section and tensor offsets (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// The metadata value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    fn need(&self, key: &str) -> Result<&MetaValue, GgufError> {
        self.metadata
            .get(key)
            .ok_or_else(|| GgufError(format!("{}: metadata key `{key}` is missing", self.path.display())))
    }

    fn wrong(&self, key: &str, v: &MetaValue, expected: &str) -> GgufError {
        GgufError(format!("{}: metadata key `{key}` is a {}, expected {expected}", self.path.display(), v.type_name()))
    }

    /// `key` as an unsigned integer; accepts any integer type (negative values are an error).
    ///
    /// # Errors
    /// Names the key when it is missing, not an integer, or negative.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.need(key)?;
        match v.as_int() {
            Some(i) if i >= 0 => Ok(i as u64),
            Some(i) => {
                err(format!("{}: metadata key `{key}` is {i}, expected a non-negative integer", self.path.display()))
            }
            None => Err(self.wrong(key, v, "an integer")),
        }
    }

    /// `key` as `f64`; accepts float and integer types.
    ///
    /// # Errors
    /// Names the key when it is missing or not a number.
    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        let v = self.need(key)?;
        v.as_f64().ok_or_else(|| self.wrong(key, v, "a number"))
    }

    /// `key` as a string.
    ///
    /// # Errors
    /// Names the key when it is missing or not a string.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.need(key)?;
        v.as_str().ok_or_else(|| self.wrong(key, v, "a string"))
    }

    /// `key` as a bool (GGUF `BOOL`).
    ///
    /// # Errors
    /// Names the key when it is missing or not a bool.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.need(key)? {
            MetaValue::Bool(b) => Ok(*b),
            v => Err(self.wrong(key, v, "a bool")),
        }
    }

    /// `key` as an array of strings (e.g. `tokenizer.ggml.tokens`), copied out.
    ///
    /// # Errors
    /// Names the key when it is missing, not an array, or has a non-string element (with its index).
    pub fn get_str_array(&self, key: &str) -> Result<Vec<String>, GgufError> {
        let items = self.get_array(key)?;
        items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str().map(str::to_owned).ok_or_else(|| {
                    GgufError(format!(
                        "{}: metadata key `{key}`: element {i} is a {}, expected a string",
                        self.path.display(),
                        v.type_name()
                    ))
                })
            })
            .collect()
    }

    /// `key` as an array of integers (any integer element type, e.g. `tokenizer.ggml.token_type`
    /// which is `i32`), widened to `i64`.
    ///
    /// # Errors
    /// Names the key when it is missing, not an array, or has a non-integer (or out of `i64`
    /// range) element.
    pub fn get_int_array(&self, key: &str) -> Result<Vec<i64>, GgufError> {
        let items = self.get_array(key)?;
        items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_int().and_then(|x| i64::try_from(x).ok()).ok_or_else(|| {
                    GgufError(format!(
                        "{}: metadata key `{key}`: element {i} is {v:?}, expected an integer",
                        self.path.display()
                    ))
                })
            })
            .collect()
    }

    fn get_array(&self, key: &str) -> Result<&[MetaValue], GgufError> {
        match self.need(key)? {
            MetaValue::Array(a) => Ok(a),
            v => Err(self.wrong(key, v, "an array")),
        }
    }

    /// The info of tensor `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw (possibly quantized) bytes of tensor `name`, straight from the mapping.
    ///
    /// # Errors
    /// Names the file and tensor when the tensor is missing or its type's size is unknown.
    pub fn tensor_data(&self, name: &str) -> Result<&[u8], GgufError> {
        let p = self.path.display();
        let t = self.tensor(name).ok_or_else(|| GgufError(format!("{p}: tensor `{name}` not found")))?;
        let size = byte_size(t.ggml_type, t.n_elements())
            .map_err(|e| GgufError(format!("{p}: tensor `{name}`: {e}; supported types: {}", supported_list())))?;
        // Bounds were checked against the file length in `open`.
        let (start, end) = (t.offset as usize, (t.offset + size) as usize);
        Ok(&self.mmap[start..end])
    }

    /// Dequantize tensor `name` to f32.
    ///
    /// Returns `(shape, data)` with `shape` = `dims` reversed (slowest dimension first; for a 2-D
    /// weight `[dims[1], dims[0]]` = HF `[out, in]`) and `data` row-major,
    /// `shape.iter().product()` values. No llama.cpp Q/K head permutation is undone here.
    ///
    /// # Errors
    /// Names the file and tensor when the tensor is missing or its type is not supported by
    /// [`dequantize`] (the message lists the supported types).
    pub fn tensor_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>), GgufError> {
        let p = self.path.display();
        let t = self.tensor(name).ok_or_else(|| GgufError(format!("{p}: tensor `{name}` not found")))?;
        if !SUPPORTED.contains(&t.ggml_type) {
            return err(format!(
                "{p}: tensor `{name}` has ggml type {} (id {}), which cannot be dequantized; supported types: {}",
                type_name(t.ggml_type),
                t.ggml_type,
                supported_list()
            ));
        }
        let n = usize::try_from(t.n_elements())
            .map_err(|_| GgufError(format!("{p}: tensor `{name}` is too large for this platform")))?;
        let bytes = self.tensor_data(name)?;
        let mut out = vec![0f32; n];
        dequantize(t.ggml_type, bytes, n, &mut out).map_err(|e| GgufError(format!("{p}: tensor `{name}`: {e}")))?;
        Ok((t.shape(), out))
    }
}

// ---------------------------------------------------------------------------------------------
// Dequantization
// ---------------------------------------------------------------------------------------------

#[inline]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Decode `n_elements` values of ggml type `ggml_type` from `bytes` into `out` (f32).
///
/// Supported types and their block layouts (per block of `B` values; f16 = IEEE half, LE):
/// - `F32` (0), `F16` (1), `BF16` (30): plain arrays of one value each.
/// - `Q4_0` (2), B=32, 18 bytes: scale `d` f16, 16 bytes of 4-bit codes; byte `j` holds value `j`
///   in its low nibble and value `j+16` in its high nibble; `x = d * (q - 8)`.
/// - `Q4_1` (3), B=32, 20 bytes: `d` f16, min `m` f16, 16 bytes of nibbles as Q4_0; `x = d*q + m`.
/// - `Q5_0` (6), B=32, 22 bytes: `d` f16, 32-bit LE mask of 5th bits (bit `i` for value `i`),
///   16 bytes of low nibbles as Q4_0; `x = d * (q - 16)`.
/// - `Q5_1` (7), B=32, 24 bytes: `d` f16, `m` f16, 5th-bit mask, nibbles; `x = d*q + m`.
/// - `Q8_0` (8), B=32, 34 bytes: `d` f16, 32 signed bytes; `x = d * q`.
/// - `Q2_K` (10), B=256, 84 bytes: 16 bytes of 4-bit (scale, min) pairs (low nibble scale),
///   64 bytes of 2-bit codes, `d` f16, `dmin` f16; 16 sub-blocks of 16 values,
///   `x = d*scale*q - dmin*min`.
/// - `Q3_K` (11), B=256, 110 bytes: 32-byte high-bit mask, 64 bytes of 2-bit low codes, 12 bytes
///   packing sixteen 6-bit scales, `d` f16; `x = d*(scale-32) * (low - (high bit clear ? 4 : 0))`.
/// - `Q4_K` (12), B=256, 144 bytes: `d`, `dmin` f16, 12 bytes packing eight 6-bit (scale, min)
///   pairs, 128 bytes of nibbles; 8 sub-blocks of 32, `x = d*scale*q - dmin*min`.
/// - `Q5_K` (13), B=256, 176 bytes: as Q4_K plus a 32-byte mask supplying each value's 5th bit.
/// - `Q6_K` (14), B=256, 210 bytes: 128 bytes of low nibbles, 64 bytes of 2-bit high parts,
///   sixteen signed 8-bit scales, `d` f16; `x = d*scale*(q - 32)`.
///
/// Products are evaluated in f32 in the same order as ggml's reference C code and gguf-py (no
/// fused multiply-add), so results are bit-identical to gguf-py's `gguf.quants.dequantize`.
///
/// # Errors
/// If the type is not one of the above (the message names it and lists the supported types), if
/// `n_elements` is not a multiple of the block size, or if `bytes.len()` / `out.len()` do not
/// match `n_elements`.
pub fn dequantize(ggml_type: u32, bytes: &[u8], n_elements: usize, out: &mut [f32]) -> Result<(), GgufError> {
    if !SUPPORTED.contains(&ggml_type) {
        return err(format!(
            "ggml type {} (id {ggml_type}) cannot be dequantized; supported types: {}",
            type_name(ggml_type),
            supported_list()
        ));
    }
    let Some((name, block, block_bytes)) = type_layout(ggml_type) else {
        return err(format!("ggml type id {ggml_type} has no known block layout"));
    };
    let expected = byte_size(ggml_type, n_elements as u64).map_err(GgufError)?;
    if bytes.len() as u64 != expected {
        return err(format!("{n_elements} values of type {name} need {expected} bytes, got {}", bytes.len()));
    }
    if out.len() != n_elements {
        return err(format!("output buffer has {} slots, expected {n_elements}", out.len()));
    }
    let blocks = bytes.chunks_exact(block_bytes).zip(out.chunks_exact_mut(block));
    match ggml_type {
        ggml_type::F32 => {
            for (b, y) in blocks {
                y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        ggml_type::F16 => {
            for (b, y) in blocks {
                y[0] = f16_at(b, 0);
            }
        }
        ggml_type::BF16 => {
            for (b, y) in blocks {
                y[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        ggml_type::Q4_0 => blocks.for_each(|(b, y)| q4_0(b, y)),
        ggml_type::Q4_1 => blocks.for_each(|(b, y)| q4_1(b, y)),
        ggml_type::Q5_0 => blocks.for_each(|(b, y)| q5_0(b, y)),
        ggml_type::Q5_1 => blocks.for_each(|(b, y)| q5_1(b, y)),
        ggml_type::Q8_0 => blocks.for_each(|(b, y)| q8_0(b, y)),
        ggml_type::Q2_K => blocks.for_each(|(b, y)| q2_k(b, y)),
        ggml_type::Q3_K => blocks.for_each(|(b, y)| q3_k(b, y)),
        ggml_type::Q4_K => blocks.for_each(|(b, y)| q4_k(b, y)),
        ggml_type::Q5_K => blocks.for_each(|(b, y)| q5_k(b, y)),
        ggml_type::Q6_K => blocks.for_each(|(b, y)| q6_k(b, y)),
        _ => unreachable!("checked against SUPPORTED above"),
    }
    Ok(())
}

// Each block decoder takes exactly one block of bytes and writes exactly one block of values;
// `dequantize` guarantees both lengths.

fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        y[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
        y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qs = &b[4..20];
    for j in 0..16 {
        y[j] = d * (qs[j] & 0x0F) as f32 + m;
        y[j + 16] = d * (qs[j] >> 4) as f32 + m;
    }
}

fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let lo = (qs[j] & 0x0F) as u32 | (((qh >> j) & 1) << 4);
        let hi = (qs[j] >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4);
        y[j] = d * (lo as i32 - 16) as f32;
        y[j + 16] = d * (hi as i32 - 16) as f32;
    }
}

fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..16 {
        let lo = (qs[j] & 0x0F) as u32 | (((qh >> j) & 1) << 4);
        let hi = (qs[j] >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4);
        y[j] = d * lo as f32 + m;
        y[j + 16] = d * hi as f32 + m;
    }
}

fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[2..34]) {
        *v = (q as i8) as f32 * d;
    }
}

fn q2_k(b: &[u8], y: &mut [f32]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    // Two halves of 128 values; each uses 32 code bytes, four 2-bit planes of 32 values each,
    // and every 16 consecutive values share one (scale, min) byte.
    for half in 0..2 {
        let q = &qs[half * 32..half * 32 + 32];
        for plane in 0..4 {
            let shift = 2 * plane;
            for l in 0..32 {
                let sub = half * 8 + plane * 2 + l / 16;
                let sc = scales[sub];
                let dl = d * (sc & 0x0F) as f32;
                let ml = dmin * (sc >> 4) as f32;
                y[half * 128 + plane * 32 + l] = dl * ((q[l] >> shift) & 3) as f32 - ml;
            }
        }
    }
}

/// The sixteen 6-bit scales of a Q3_K block: low 4 bits from bytes 0..8 (low nibble for scales
/// 0..8, high nibble for 8..16), high 2 bits from bytes 8..12 (byte `8 + i%4`, bit pair `i/4`).
fn q3_k_scale(s: &[u8], i: usize) -> i32 {
    let low = if i < 8 { s[i] & 0x0F } else { s[i - 8] >> 4 };
    let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    (low | (high << 4)) as i32 - 32
}

fn q3_k(b: &[u8], y: &mut [f32]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let scales = &b[96..108];
    let d = f16_at(b, 108);
    // Eight groups of 32 values: group g takes its 2 low bits from code bytes
    // `32*(g/4) ..` at bit pair `g%4`, and its high bit from bit `g` of the mask bytes.
    for g in 0..8 {
        let q = &qs[(g / 4) * 32..(g / 4) * 32 + 32];
        let shift = 2 * (g % 4);
        for l in 0..32 {
            let dl = d * q3_k_scale(scales, 2 * g + l / 16) as f32;
            let low = ((q[l] >> shift) & 3) as i32;
            let sub = if hmask[l] & (1 << g) != 0 { 0 } else { 4 };
            y[g * 32 + l] = dl * (low - sub) as f32;
        }
    }
}

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes of a Q4_K/Q5_K block: for
/// `j < 4` the low 6 bits of bytes `j` and `j+4`; otherwise the nibbles of byte `j+4` topped up by
/// the 2 spare high bits of bytes `j-4` and `j`.
fn k4_scale_min(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let qs = &b[16..144];
    // Four chunks of 64 values; chunk c uses code bytes 32c..32c+32: low nibbles are sub-block
    // 2c, high nibbles sub-block 2c+1.
    for c in 0..4 {
        let q = &qs[c * 32..c * 32 + 32];
        let (sc1, m1) = k4_scale_min(scales, 2 * c);
        let (sc2, m2) = k4_scale_min(scales, 2 * c + 1);
        let (d1, dm1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, dm2) = (d * sc2 as f32, dmin * m2 as f32);
        for l in 0..32 {
            y[c * 64 + l] = d1 * (q[l] & 0x0F) as f32 - dm1;
            y[c * 64 + 32 + l] = d2 * (q[l] >> 4) as f32 - dm2;
        }
    }
}

fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    // As Q4_K; the 5th bit of value l of sub-block s is bit s of mask byte l.
    for c in 0..4 {
        let q = &qs[c * 32..c * 32 + 32];
        let (s1, s2) = (2 * c, 2 * c + 1);
        let (sc1, m1) = k4_scale_min(scales, s1);
        let (sc2, m2) = k4_scale_min(scales, s2);
        let (d1, dm1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, dm2) = (d * sc2 as f32, dmin * m2 as f32);
        for l in 0..32 {
            let lo = (q[l] & 0x0F) | (((qh[l] >> s1) & 1) << 4);
            let hi = (q[l] >> 4) | (((qh[l] >> s2) & 1) << 4);
            y[c * 64 + l] = d1 * lo as f32 - dm1;
            y[c * 64 + 32 + l] = d2 * hi as f32 - dm2;
        }
    }
}

fn q6_k(b: &[u8], y: &mut [f32]) {
    let ql = &b[0..128];
    let qh = &b[128..192];
    let sc = &b[192..208];
    let d = f16_at(b, 208);
    // Two halves of 128 values (64 low-nibble bytes, 32 high-bit bytes, 8 scales each). In a
    // half, quarter k (32 values) takes low nibbles from byte l (k even) or l+32 (k odd), low
    // nibble for k < 2 and high nibble otherwise, and its 2 high bits from bit pair k of qh[l].
    for h in 0..2 {
        let (ql, qh, sc, y) = (&ql[h * 64..], &qh[h * 32..], &sc[h * 8..], &mut y[h * 128..]);
        for k in 0..4 {
            for l in 0..32 {
                let byte = ql[l + 32 * (k % 2)];
                let low = if k < 2 { byte & 0x0F } else { byte >> 4 };
                let q = (low | (((qh[l] >> (2 * k)) & 3) << 4)) as i32 - 32;
                let scale = sc[2 * k + l / 16] as i8 as f32;
                y[32 * k + l] = d * scale * q as f32;
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! Known-block vectors come from gguf-py (see `scripts/gen_gguf_test_vectors.py`; the version
    //! that produced them is in the first generated comment below). Tests needing the real
    //! SmolLM2 GGUF look for `$SPARKLING_ASSETS/smollm2-135m-instruct-q4_1.gguf` (default
    //! `$HOME/.cache/sparkling`) and skip with a message when it is absent.
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    // ---- synthetic GGUF files -----------------------------------------------------------------

    fn value_type(v: &MetaValue) -> u32 {
        match v {
            MetaValue::U8(_) => 0,
            MetaValue::I8(_) => 1,
            MetaValue::U16(_) => 2,
            MetaValue::I16(_) => 3,
            MetaValue::U32(_) => 4,
            MetaValue::I32(_) => 5,
            MetaValue::F32(_) => 6,
            MetaValue::Bool(_) => 7,
            MetaValue::Str(_) => 8,
            MetaValue::Array(_) => 9,
            MetaValue::U64(_) => 10,
            MetaValue::I64(_) => 11,
            MetaValue::F64(_) => 12,
        }
    }

    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }

    fn put_value(out: &mut Vec<u8>, v: &MetaValue) {
        match v {
            MetaValue::U8(x) => out.push(*x),
            MetaValue::I8(x) => out.push(*x as u8),
            MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
            MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
            MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
            MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
            MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
            MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
            MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
            MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
            MetaValue::Bool(x) => out.push(*x as u8),
            MetaValue::Str(s) => put_str(out, s),
            MetaValue::Array(a) => {
                out.extend_from_slice(&a.first().map_or(0, value_type).to_le_bytes());
                out.extend_from_slice(&(a.len() as u64).to_le_bytes());
                a.iter().for_each(|x| put_value(out, x));
            }
        }
    }

    /// A tensor for [`gguf_bytes`]: name, GGUF dims (fastest first), ggml type, raw data.
    pub(crate) type RawTensor<'a> = (&'a str, Vec<u64>, u32, Vec<u8>);

    /// Serialize a GGUF v3 file (alignment 32 unless `general.alignment` is in `kvs`).
    pub(crate) fn gguf_bytes(kvs: &[(&str, MetaValue)], tensors: &[RawTensor]) -> Vec<u8> {
        let align = kvs
            .iter()
            .find(|(k, _)| *k == "general.alignment")
            .and_then(|(_, v)| v.as_int())
            .map_or(32, |a| a as usize);
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
        for (k, v) in kvs {
            put_str(&mut out, k);
            out.extend_from_slice(&value_type(v).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut rel = 0usize;
        for (name, dims, ty, data) in tensors {
            put_str(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| out.extend_from_slice(&d.to_le_bytes()));
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(&(rel as u64).to_le_bytes());
            rel += data.len().div_ceil(align) * align;
        }
        out.resize(out.len().div_ceil(align) * align, 0);
        for (_, _, _, data) in tensors {
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(align) * align, 0);
        }
        out
    }

    /// A scratch file in the system temp dir, deleted on drop.
    pub(crate) struct TempFile(pub PathBuf);

    impl TempFile {
        pub(crate) fn with(bytes: &[u8]) -> TempFile {
            static N: AtomicUsize = AtomicUsize::new(0);
            let n = N.fetch_add(1, Ordering::Relaxed);
            let p = std::env::temp_dir().join(format!("sparkling-gguf-test-{}-{n}.gguf", std::process::id()));
            std::fs::write(&p, bytes).expect("write temp file");
            TempFile(p)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn small_file() -> TempFile {
        let w: Vec<f32> = (0..6).map(|i| i as f32 * 0.5).collect();
        TempFile::with(&gguf_bytes(
            &[
                ("general.architecture", MetaValue::Str("llama".into())),
                ("llama.block_count", MetaValue::U32(2)),
                ("llama.rope.freq_base", MetaValue::F32(10000.0)),
                ("neg", MetaValue::I32(-3)),
                ("flag", MetaValue::Bool(true)),
                ("names", MetaValue::Array(vec![MetaValue::Str("a".into()), MetaValue::Str("b".into())])),
                ("ids", MetaValue::Array(vec![MetaValue::I32(1), MetaValue::I32(4)])),
            ],
            &[
                ("w", vec![3, 2], ggml_type::F32, f32_bytes(&w)),
                ("q", vec![32], ggml_type::Q8_0, hex(Q8_0_BYTES)[..34].to_vec()),
            ],
        ))
    }

    // ---- container ------------------------------------------------------------------------------

    #[test]
    fn reads_metadata_and_tensors() {
        let f = small_file();
        let g = GgufFile::open(&f.0).unwrap();
        assert_eq!(g.version, 3);
        assert_eq!(g.alignment(), 32);
        assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(g.get_u64("llama.block_count").unwrap(), 2);
        assert_eq!(g.get_f64("llama.rope.freq_base").unwrap(), 10000.0);
        assert_eq!(g.get_f64("llama.block_count").unwrap(), 2.0);
        assert!(g.get_bool("flag").unwrap());
        assert_eq!(g.get_str_array("names").unwrap(), vec!["a", "b"]);
        assert_eq!(g.get_int_array("ids").unwrap(), vec![1, 4]);
        // Errors name the key and what was expected.
        let e = g.get_u64("neg").unwrap_err().to_string();
        assert!(e.contains("`neg`") && e.contains("non-negative"), "{e}");
        let e = g.get_u64("missing.key").unwrap_err().to_string();
        assert!(e.contains("`missing.key`") && e.contains("missing"), "{e}");
        let e = g.get_str("llama.block_count").unwrap_err().to_string();
        assert!(e.contains("`llama.block_count`") && e.contains("u32") && e.contains("string"), "{e}");
        let e = g.get_str_array("ids").unwrap_err().to_string();
        assert!(e.contains("element 0"), "{e}");

        let t = g.tensor("w").unwrap();
        assert_eq!((t.dims.clone(), t.n_elements(), t.offset % 32), (vec![3, 2], 6, 0));
        let (shape, data) = g.tensor_f32("w").unwrap();
        assert_eq!(shape, vec![2, 3]);
        assert_eq!(data, vec![0.0, 0.5, 1.0, 1.5, 2.0, 2.5]);
        let (shape, data) = g.tensor_f32("q").unwrap();
        assert_eq!(shape, vec![32]);
        assert_eq!(data, Q8_0_F32[..32].to_vec());
        let e = g.tensor_f32("nope").unwrap_err().to_string();
        assert!(e.contains("`nope`") && e.contains("not found"), "{e}");
    }

    #[test]
    fn truncated_file_names_the_tensor() {
        let f = small_file();
        let bytes = std::fs::read(&f.0).unwrap();
        let cut = TempFile::with(&bytes[..bytes.len() - 40]);
        let e = GgufFile::open(&cut.0).unwrap_err().to_string();
        assert!(e.contains("`q`") && e.contains("truncated") && e.contains(&cut.0.display().to_string()), "{e}");
        // Truncated inside the header: names what was being read.
        let cut = TempFile::with(&bytes[..60]);
        let e = GgufFile::open(&cut.0).unwrap_err().to_string();
        assert!(e.contains("unexpected end of file") && e.contains("metadata key"), "{e}");
    }

    #[test]
    fn bad_magic_and_version_are_errors() {
        let f = small_file();
        let mut bytes = std::fs::read(&f.0).unwrap();
        bytes[0..4].copy_from_slice(b"GGML");
        let bad = TempFile::with(&bytes);
        let e = GgufFile::open(&bad.0).unwrap_err().to_string();
        assert!(e.contains("not a GGUF file") && e.contains(&bad.0.display().to_string()), "{e}");
        bytes[0..4].copy_from_slice(b"GGUF");
        bytes[4..8].copy_from_slice(&7u32.to_le_bytes());
        let bad = TempFile::with(&bytes);
        let e = GgufFile::open(&bad.0).unwrap_err().to_string();
        assert!(e.contains("unsupported GGUF version 7"), "{e}");
        let e = GgufFile::open(Path::new("/nonexistent/x.gguf")).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/x.gguf"), "{e}");
    }

    #[test]
    fn unsupported_type_is_an_error_naming_tensor_and_type() {
        // IQ2_XXS (16): known size (66 bytes per 256 values), no dequantizer.
        let f = TempFile::with(&gguf_bytes(&[], &[("blk.0.ffn_up.weight", vec![256], 16, vec![0; 66])]));
        let g = GgufFile::open(&f.0).unwrap();
        let e = g.tensor_f32("blk.0.ffn_up.weight").unwrap_err().to_string();
        assert!(e.contains("`blk.0.ffn_up.weight`") && e.contains("IQ2_XXS") && e.contains("Q4_K, Q5_K, Q6_K"), "{e}");
        assert_eq!(g.tensor_data("blk.0.ffn_up.weight").unwrap().len(), 66);
        let e = dequantize(99, &[], 0, &mut []).unwrap_err().to_string();
        assert!(e.contains("unknown") && e.contains("supported types"), "{e}");
        // Row length not a whole number of blocks.
        let f = TempFile::with(&gguf_bytes(&[], &[("t", vec![16], ggml_type::Q4_0, vec![0; 18])]));
        let e = GgufFile::open(&f.0).unwrap_err().to_string();
        assert!(e.contains("`t`") && e.contains("block size"), "{e}");
    }

    #[test]
    fn dequantize_checks_lengths() {
        let mut out = [0f32; 32];
        let e = dequantize(ggml_type::Q8_0, &[0; 33], 32, &mut out).unwrap_err().to_string();
        assert!(e.contains("need 34 bytes"), "{e}");
        let e = dequantize(ggml_type::Q8_0, &[0; 34], 32, &mut out[..16]).unwrap_err().to_string();
        assert!(e.contains("output buffer"), "{e}");
        let e = dequantize(ggml_type::Q4_K, &[0; 144], 32, &mut out).unwrap_err().to_string();
        assert!(e.contains("256-value blocks"), "{e}");
    }

    // ---- known blocks (gguf-py reference) -------------------------------------------------------

    fn check(ty: u32, bytes_hex: &str, expected: &[f32]) {
        let bytes = hex(bytes_hex);
        let mut out = vec![f32::NAN; expected.len()];
        dequantize(ty, &bytes, expected.len(), &mut out).unwrap();
        for (i, (a, b)) in out.iter().zip(expected).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{} value {i}: got {a}, gguf-py {b}", type_name(ty));
        }
    }

    #[test]
    fn known_blocks_match_gguf_py() {
        check(ggml_type::F32, F32_BYTES, &F32_F32);
        check(ggml_type::F16, F16_BYTES, &F16_F32);
        check(ggml_type::BF16, BF16_BYTES, &BF16_F32);
        check(ggml_type::Q4_0, Q4_0_BYTES, &Q4_0_F32);
        check(ggml_type::Q4_1, Q4_1_BYTES, &Q4_1_F32);
        check(ggml_type::Q5_0, Q5_0_BYTES, &Q5_0_F32);
        check(ggml_type::Q5_1, Q5_1_BYTES, &Q5_1_F32);
        check(ggml_type::Q8_0, Q8_0_BYTES, &Q8_0_F32);
        check(ggml_type::Q2_K, Q2_K_BYTES, &Q2_K_F32);
        check(ggml_type::Q3_K, Q3_K_BYTES, &Q3_K_F32);
        check(ggml_type::Q4_K, Q4_K_BYTES, &Q4_K_F32);
        check(ggml_type::Q5_K, Q5_K_BYTES, &Q5_K_F32);
        check(ggml_type::Q6_K, Q6_K_BYTES, &Q6_K_F32);
    }

    // ---- the real SmolLM2 file ------------------------------------------------------------------

    /// `$SPARKLING_ASSETS/<name>` (default `$HOME/.cache/sparkling/<name>`) if it exists. When
    /// absent: with `required` and `SPARKLING_REQUIRE_ASSETS=1` (as CI sets, after fetching the
    /// SmolLM2 GGUF) the test fails; otherwise it prints why it is skipped and returns `None`.
    pub(crate) fn asset_file(name: &str, required: bool) -> Option<PathBuf> {
        let dir = std::env::var_os("SPARKLING_ASSETS")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("sparkling")))?;
        let p = dir.join(name);
        if p.is_file() {
            return Some(p);
        }
        let msg = format!("asset {} is absent (set SPARKLING_ASSETS to the folder holding {name})", p.display());
        if required && std::env::var("SPARKLING_REQUIRE_ASSETS").is_ok_and(|v| v == "1") {
            panic!("{msg}; SPARKLING_REQUIRE_ASSETS=1");
        }
        eprintln!("SKIPPED: {msg}");
        None
    }

    const SMOLLM2: &str = "smollm2-135m-instruct-q4_1.gguf";

    #[test]
    fn smollm2_metadata_and_embedding() {
        let Some(p) = asset_file(SMOLLM2, true) else { return };
        let g = GgufFile::open(&p).unwrap();
        assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(g.get_u64("llama.block_count").unwrap(), 30);
        assert_eq!(g.tensors.len(), 272);
        let (shape, data) = g.tensor_f32("token_embd.weight").unwrap();
        assert_eq!(shape, vec![49152, 576]);
        assert_eq!(data.len(), 49152 * 576);
        assert!(data.iter().all(|x| x.is_finite()));
        let n = data.len() as f64;
        let mean = data.iter().map(|&x| x as f64).sum::<f64>() / n;
        let std = (data.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
        assert!(mean.abs() < 0.05 && (0.01..1.0).contains(&std), "mean {mean} std {std}");
        // Every tensor of the file dequantizes (F32, Q4_1, Q8_0).
        for t in &g.tensors {
            let (shape, data) = g.tensor_f32(&t.name).unwrap();
            assert_eq!(shape.iter().product::<usize>(), data.len(), "{}", t.name);
        }
    }

    #[test]
    fn smollm2_attn_q_row0_matches_gguf_py() {
        let Some(p) = asset_file(SMOLLM2, true) else { return };
        let g = GgufFile::open(&p).unwrap();
        let (shape, data) = g.tensor_f32("blk.0.attn_q.weight").unwrap();
        assert_eq!(shape, vec![576, 576]);
        assert_eq!(type_name(g.tensor("blk.0.attn_q.weight").unwrap().ggml_type), "Q4_1");
        for (i, (a, b)) in data[..8].iter().zip(ATTN_Q_ROW0).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "value {i}: got {a}, gguf-py {b}");
        }
    }

    // ---- vectors (generated; kept out of rustfmt so each array stays a compact block) ------------

    #[rustfmt::skip]
    mod vectors {
        // Generated by scripts/gen_gguf_test_vectors.py with gguf-py 0.19.0, numpy 2.4.6.
        // F32: 8 values in 32 bytes.
        pub(super) const F32_BYTES: &str = "2edda53ed14a703e009da4be2ed116bfb92994bded0a1a3fe0b22a3f7186e83e";
        pub(super) const F32_F32: [f32; 8] = [
            0.3239531, 0.2346604, -0.32151031, -0.5891293, -0.072345205, 0.6017292, 0.6667919,
            0.4541507,
        ];
        // F16: 8 values in 16 bytes.
        pub(super) const F16_BYTES: &str = "8c31663aee380daf3fb8d5b1b8b28035";
        pub(super) const F16_F32: [f32; 8] = [
            0.17333984, 0.7998047, 0.61621094, -0.11016846, -0.5307617, -0.18225098, -0.20996094,
            0.34375,
        ];
        // BF16: 8 values in 16 bytes.
        pub(super) const BF16_BYTES: &str = "73bfc4bd563fecbec2be2dbd35bf85bd";
        pub(super) const BF16_F32: [f32; 8] = [
            -0.94921875, -0.095703125, 0.8359375, -0.4609375, -0.37890625, -0.042236328,
            -0.70703125, -0.064941406,
        ];
        // Q4_0: 64 values in 36 bytes.
        pub(super) const Q4_0_BYTES: &str = "80af9868ac9a55cb96b5ce7b3576a7e958709ab3c99685bba7969785878a90a8c554867c";
        pub(super) const Q4_0_F32: [f32; 64] = [
            -0.0, -0.0, -0.46875, -0.234375, 0.3515625, -0.3515625, 0.234375, 0.3515625, -0.703125,
            -0.3515625, 0.3515625, 0.234375, 0.1171875, -0.1171875, -0.0, 0.9375, -0.1171875,
            0.234375, -0.234375, -0.1171875, 0.3515625, -0.46875, -0.1171875, -0.3515625, -0.46875,
            0.1171875, 0.5859375, 0.1171875, -0.234375, -0.703125, 0.3515625, 0.1171875,
            -0.23754883, 0.47509766, 0.7126465, -0.7126465, 0.23754883, 0.47509766, 0.23754883,
            0.7126465, 0.23754883, -0.47509766, 1.9003906, -0.0, 0.7126465, 0.9501953, 0.47509766,
            -0.9501953, -0.9501953, -0.23754883, -0.0, -0.7126465, -0.47509766, -0.23754883,
            -0.23754883, -0.0, -0.0, -0.0, -0.23754883, -0.47509766, -0.9501953, 0.7126465, -0.0,
            0.23754883,
        ];
        // Q4_1: 64 values in 40 bytes.
        pub(super) const Q4_1_BYTES: &str = "6931abbc7279b70a852acb964696a77fb7a9736058313fbdaa7670a7e3cb388acb5898a95f4757c8";
        pub(super) const Q4_1_F32: [f32; 64] = [
            -0.8288574, 0.35461426, 0.016479492, 0.52368164, -0.32165527, 0.52368164, 0.692749,
            -0.15258789, -0.15258789, -0.15258789, 0.016479492, 1.3690186, 0.016479492, 0.35461426,
            -0.65979004, -1.1669922, 0.016479492, 0.016479492, 0.692749, -1.1669922, 0.18554688,
            -0.8288574, 0.8618164, 0.35461426, -0.49072266, 0.35461426, 0.52368164, 0.016479492,
            0.692749, 0.52368164, 0.016479492, -0.15258789, 0.35839844, -0.3095703, -1.3115234,
            -0.14257812, -0.8105469, 0.5253906, 0.024414062, 0.35839844, 0.5253906, 0.024414062,
            0.024414062, 0.19140625, 1.1933594, -0.14257812, -0.14257812, 0.024414062, 0.35839844,
            -0.14257812, -0.14257812, 0.35839844, 1.0263672, 0.6923828, -0.8105469, 0.024414062,
            0.6923828, -0.4765625, 0.19140625, 0.35839844, -0.4765625, -0.6435547, -0.4765625,
            0.6923828,
        ];
        // Q5_0: 64 values in 44 bytes.
        pub(super) const Q5_0_BYTES: &str = "352d4aa55ef38fb26c2084ed6296a06fb5b04f027f02a62b67961ea82230c03a7605b3937ce9e0579308bd3b";
        pub(super) const Q5_0_F32: [f32; 64] = [
            -0.08135986, 0.16271973, -0.32543945, 0.0, -0.97631836, -0.24407959, 0.16271973,
            -0.81359863, 0.0, -0.08135986, 0.40679932, -1.3017578, -0.08135986, 0.16271973,
            -0.08135986, 0.16271973, -0.6508789, 0.8949585, 0.48815918, 0.16271973, 0.6508789,
            -0.16271973, 0.48815918, -0.56951904, 0.81359863, 0.48815918, -0.40679932, -0.40679932,
            0.32543945, 0.0, 0.56951904, 0.0, 0.119506836, 0.0, 0.0, -0.3585205, -0.5975342,
            0.2987671, 0.17926025, -0.77679443, -0.23901367, 0.53778076, 0.0, -0.53778076,
            0.17926025, -0.47802734, -0.17926025, 0.6572876, -0.83654785, 0.17926025, 0.717041,
            0.17926025, 0.41827393, -0.9560547, -0.2987671, -0.41827393, -0.53778076, -0.119506836,
            -0.119506836, 0.2987671, -0.41827393, 0.0, -0.2987671, 0.17926025,
        ];
        // Q5_1: 64 values in 48 bytes.
        pub(super) const Q5_1_BYTES: &str = "762ac7bbd3fa9c47d9d23c30f8879ca523b84fc84bb6e8b70e2c8bbb4b5177222475ecac6b8530df9382cc70538b5fdf";
        pub(super) const Q5_1_F32: [f32; 64] = [
            0.2897339, -0.06359863, -0.36645508, -0.97216797, 0.23925781, -0.61883545, 0.4411621,
            0.08782959, -0.82073975, 0.23925781, -0.21502686, 0.23925781, 0.39068604, 0.13830566,
            0.23925781, 0.18878174, -0.315979, -0.315979, -0.013122559, -0.013122559, 0.59259033,
            -0.5683594, -0.5178833, 0.34020996, -0.06359863, 0.39068604, 0.037353516, -0.36645508,
            -0.7702637, -0.41693115, 0.54211426, -0.41693115, 0.32421875, 0.38757324, -0.18261719,
            0.8310547, -0.24597168, -0.62609863, 0.07080078, 0.007446289, 0.26086426, -0.8161621,
            -0.18261719, -0.9428711, 0.26086426, -0.24597168, 1.0211182, 0.007446289, 0.19750977,
            0.5142822, 0.9577637, -0.30932617, 0.45092773, 0.5776367, 0.26086426, -0.119262695,
            -0.37268066, 0.5776367, -0.18261719, -0.49938965, -0.62609863, 0.5776367, -0.62609863,
            -0.119262695,
        ];
        // Q8_0: 64 values in 68 bytes.
        pub(super) const Q8_0_BYTES: &str = concat!(
            "3721dbffde161c3023aa53cd81de3620d929f1b2e8f43d251d0499af502d1a57c1e7ee1e04f9111dcb4fbc578fe1edad",
            "fed57ff339f522ebf53af3d63314fa9637d1be1d",
        );
        pub(super) const Q8_0_F32: [f32; 64] = [
            -0.37685394, -0.010185242, -0.34629822, 0.22407532, 0.28518677, 0.4888916, 0.35648346,
            -0.8759308, 0.84537506, -0.5194473, -1.2935257, -0.34629822, 0.55000305, 0.32592773,
            -0.39722443, 0.4175949, -0.15277863, -0.79444885, -0.2444458, -0.1222229, 0.62129974,
            0.37685394, 0.295372, 0.040740967, -1.0490799, -0.8250046, 0.81481934, 0.45833588,
            0.26481628, 0.886116, -0.6416702, -0.25463104, 0.027069092, -0.04737091, 0.11504364,
            0.19625092, -0.35866547, 0.53461456, -0.46017456, 0.58875275, -0.76470184, -0.20978546,
            -0.12857819, -0.56168365, -0.013534546, -0.29099274, 0.85944366, -0.08797455,
            0.38573456, -0.07444, 0.23008728, -0.14211273, -0.07444, 0.39250183, -0.08797455,
            -0.28422546, 0.34513092, 0.13534546, -0.040603638, -0.71733093, 0.3722, -0.31806183,
            -0.44664, 0.19625092,
        ];
        // Q2_K: 256 values in 84 bytes.
        pub(super) const Q2_K_BYTES: &str = concat!(
            "3e241699cfd76cf8eaa01dd571c145c59fed9f58d9e5a1608d36d9d116cf16d0f28cb875dee66e60517071b790f43974",
            "5cf884ed6ea1b5a5ede44dad12663145592aebcc1dd7fff5f664b66cff83e9a70e99012a",
        );
        pub(super) const Q2_K_F32: [f32; 256] = [
            -0.24437714, -0.17527008, -0.24437714, -0.14071655, -0.17527008, -0.17527008,
            -0.17527008, -0.14071655, -0.17527008, -0.20982361, -0.17527008, -0.17527008,
            -0.20982361, -0.24437714, -0.20982361, -0.14071655, -0.11355591, -0.093811035,
            -0.093811035, -0.10368347, -0.11355591, -0.11355591, -0.11355591, -0.093811035,
            -0.10368347, -0.093811035, -0.10368347, -0.123428345, -0.093811035, -0.093811035,
            -0.10368347, -0.093811035, -0.09133148, -0.09133148, -0.09133148, -0.07652283,
            -0.07652283, -0.061714172, -0.046905518, -0.046905518, -0.09133148, -0.061714172,
            -0.07652283, -0.046905518, -0.061714172, -0.09133148, -0.061714172, -0.046905518,
            -0.42214966, -0.4887886, -0.46657562, -0.44436264, -0.4887886, -0.44436264, -0.4887886,
            -0.42214966, -0.42214966, -0.42214966, -0.42214966, -0.44436264, -0.42214966,
            -0.44436264, -0.46657562, -0.44436264, -0.59988785, -0.6369095, -0.59988785,
            -0.59988785, -0.59988785, -0.6369095, -0.6369095, -0.6369095, -0.5628662, -0.6739311,
            -0.59988785, -0.59988785, -0.59988785, -0.5628662, -0.59988785, -0.59988785, -0.661602,
            -0.6097717, -0.661602, -0.661602, -0.6270485, -0.64432526, -0.64432526, -0.64432526,
            -0.6270485, -0.661602, -0.661602, -0.661602, -0.6270485, -0.661602, -0.661602,
            -0.661602, -0.34066772, -0.37028503, -0.34066772, -0.31105042, -0.37028503, -0.37028503,
            -0.34066772, -0.31105042, -0.34066772, -0.2814331, -0.37028503, -0.37028503, -0.2814331,
            -0.37028503, -0.2814331, -0.37028503, -0.7628174, -0.7430725, -0.7430725, -0.72332764,
            -0.7628174, -0.7628174, -0.72332764, -0.72332764, -0.72332764, -0.72332764, -0.72332764,
            -0.7430725, -0.7430725, -0.7628174, -0.70358276, -0.72332764, -0.65667725, -0.65667725,
            -0.65667725, -0.68135834, -0.7060394, -0.68135834, -0.68135834, -0.68135834,
            -0.68135834, -0.65667725, -0.68135834, -0.68135834, -0.7060394, -0.7060394, -0.68135834,
            -0.68135834, -0.46905518, -0.46905518, -0.46905518, -0.46905518, -0.46905518,
            -0.46905518, -0.46905518, -0.46905518, -0.46905518, -0.46905518, -0.46905518,
            -0.46905518, -0.46905518, -0.46905518, -0.46905518, -0.46905518, -0.14316177,
            -0.111076355, -0.07899094, -0.14316177, -0.14316177, -0.046905518, -0.07899094,
            -0.07899094, -0.14316177, -0.07899094, -0.14316177, -0.14316177, -0.046905518,
            -0.07899094, -0.046905518, -0.07899094, -0.6344528, -0.6344528, -0.6344528, -0.64679337,
            -0.64679337, -0.6221123, -0.64679337, -0.6221123, -0.6221123, -0.6221123, -0.6221123,
            -0.64679337, -0.64679337, -0.6097717, -0.6344528, -0.6221123, -0.33080673, -0.33574295,
            -0.32833862, -0.33327484, -0.33327484, -0.33327484, -0.33574295, -0.33327484,
            -0.33327484, -0.33327484, -0.32833862, -0.33327484, -0.33080673, -0.33327484,
            -0.33574295, -0.32833862, -0.5653343, -0.5678024, -0.5678024, -0.5628662, -0.5653343,
            -0.5653343, -0.57027054, -0.57027054, -0.57027054, -0.5678024, -0.57027054, -0.5678024,
            -0.57027054, -0.5628662, -0.5678024, -0.5678024, -0.19996262, -0.2246437, -0.21230316,
            -0.2246437, -0.19996262, -0.21230316, -0.21230316, -0.21230316, -0.2246437, -0.2246437,
            -0.19996262, -0.21230316, -0.18762207, -0.19996262, -0.18762207, -0.19996262,
            -0.57520676, -0.5628662, -0.59988785, -0.59988785, -0.5628662, -0.59988785, -0.59988785,
            -0.59988785, -0.59988785, -0.57520676, -0.5875473, -0.57520676, -0.59988785, -0.5875473,
            -0.59988785, -0.5875473,
        ];
        // Q3_K: 256 values in 110 bytes.
        pub(super) const Q3_K_BYTES: &str = concat!(
            "a3aad4385c6c92969755cf6cf1ed117a0828fb882b1bc14b4ecddf0c906d6ef9471ae5abedd3215aafdef35a2babd6fb",
            "54798f4a884814175efe0def5a9ab100c1b0080eaef66e1b8477abb602fbea0364fab14a6a75cbfa1f1e206eff3e02c8",
            "9c9c480b2079a87a3836782d1123",
        );
        pub(super) const Q3_K_F32: [f32; 256] = [
            -0.8280945, 0.552063, 0.8280945, 0.2760315, 0.8280945, 0.2760315, 0.8280945, 0.552063,
            -0.8280945, -0.552063, -0.8280945, 0.552063, -0.8280945, -0.8280945, -0.552063,
            0.2760315, -0.6624756, -0.4968567, 0.4968567, -0.3312378, 0.0, 0.0, 0.0, 0.4968567,
            -0.3312378, 0.3312378, 0.1656189, -0.1656189, -0.3312378, 0.3312378, -0.4968567, 0.0,
            -0.3312378, -0.6624756, 0.9937134, 0.6624756, 0.3312378, 1.3249512, -0.0, -0.6624756,
            -0.9937134, 0.3312378, -0.0, 0.6624756, 0.6624756, 0.6624756, 0.9937134, -0.6624756,
            0.20702362, 0.13801575, -0.20702362, 0.13801575, -0.13801575, -0.13801575, 0.20702362,
            -0.06900787, -0.20702362, 0.06900787, -0.20702362, 0.06900787, 0.13801575, 0.13801575,
            -0.0, 0.2760315, -0.0, -0.0, 0.0, -0.0, 0.0, 0.0, -0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -0.0,
            0.0, -0.0, -0.0, 0.28983307, 0.09661102, 0.3864441, 0.3864441, 0.3864441, 0.3864441,
            0.28983307, 0.28983307, -0.09661102, -0.28983307, -0.0, -0.19322205, 0.28983307,
            -0.09661102, -0.28983307, 0.3864441, -0.3312378, 0.0, -0.1104126, 0.2208252, 0.3312378,
            0.3312378, -0.4416504, -0.3312378, -0.2208252, -0.1104126, 0.3312378, 0.1104126,
            -0.4416504, 0.2208252, -0.1104126, 0.3312378, 0.35884094, 0.35884094, 0.7176819,
            0.35884094, 0.7176819, 0.35884094, -1.4353638, 0.0, 0.35884094, 1.0765228, 0.0,
            1.0765228, -1.0765228, 0.7176819, 0.7176819, 0.0, -1.0351181, -1.3801575, 0.0,
            0.69007874, 0.69007874, -0.69007874, 0.69007874, 1.0351181, 0.0, 1.0351181, -0.34503937,
            -0.69007874, 0.69007874, -0.34503937, 0.69007874, 1.0351181, -1.3801575, -0.69007874,
            0.34503937, -0.69007874, -0.69007874, 0.34503937, -0.34503937, -0.69007874, -0.34503937,
            -0.69007874, 0.0, -0.69007874, 1.0351181, -0.69007874, -0.69007874, 0.0, 0.0, 0.0,
            -0.552063, 0.8280945, -0.2760315, 0.2760315, -0.2760315, -0.552063, -0.8280945,
            -0.8280945, -0.552063, 0.2760315, 0.0, 0.552063, -0.552063, 0.0, -0.0, 0.0, 0.0, -0.0,
            0.0, -0.0, -0.0, -0.0, -0.0, -0.0, -0.0, -0.0, -0.0, 0.0, 0.0, 0.0, 1.656189,
            0.41404724, -0.0, 1.656189, -0.8280945, -1.2421417, 0.8280945, 1.2421417, 1.656189,
            -1.2421417, -0.8280945, -1.2421417, -0.0, -1.2421417, 0.8280945, -0.0, 0.69007874,
            0.34503937, -1.0351181, 1.3801575, 0.69007874, 0.34503937, -0.0, -1.0351181,
            -0.34503937, -0.34503937, -0.69007874, 0.69007874, 0.34503937, -1.0351181, -0.0, -0.0,
            -0.24842834, -0.1656189, -0.0, 0.3312378, 0.1656189, 0.08280945, -0.08280945, -0.0,
            -0.1656189, 0.24842834, -0.1656189, 0.1656189, -0.0, -0.24842834, 0.08280945, 0.3312378,
            1.0351181, 0.34503937, -0.69007874, -0.34503937, 1.0351181, 1.0351181, -1.0351181,
            0.34503937, 1.3801575, -0.0, -0.0, 1.0351181, -1.0351181, 1.3801575, 1.3801575,
            -1.0351181,
        ];
        // Q4_K: 256 values in 144 bytes.
        pub(super) const Q4_K_BYTES: &str = concat!(
            "cfa782a2f9f4657e9b2c2b9fbd5762a833414ce7f3ce3ed0d9c57fe9b8b61b929132451b489a64402ce5f49b6ade4991",
            "cfcc8eec417938f0873aacbb15d615f484cde069060693eaa0c05c686820f747ab5f57e0f3f24b6b651c4558c1713951",
            "4ea665e13b7e346e5c4a2e2562013949a188c3498f344b09bf553e7818bd16ee2a7972def8b2bdc9f323a296346e1991",
        );
        pub(super) const Q4_K_F32: [f32; 256] = [
            -4.872711, -1.3954468, -20.520401, -11.82724, -4.872711, -23.997665, -23.997665,
            0.34318542, -15.304504, -8.349976, -25.736298, -15.304504, -13.565872, -10.088608,
            -18.781769, -3.134079, -1.3954468, -3.134079, -8.349976, -18.781769, -13.565872,
            -17.043137, -6.6113434, 0.34318542, -20.520401, -8.349976, -6.6113434, -18.781769,
            -17.043137, -23.997665, -15.304504, -1.3954468, -4.1990967, -5.7852173, -5.7852173,
            -21.646423, -23.232544, -18.474182, -4.1990967, -20.060303, -20.060303, -18.474182,
            -10.543579, -21.646423, -16.888062, -16.888062, -1.0268555, -13.71582, -13.71582,
            -4.1990967, -5.7852173, -1.0268555, -5.7852173, -13.71582, -8.9574585, -5.7852173,
            -2.612976, -21.646423, -23.232544, -13.71582, -8.9574585, -20.060303, -5.7852173,
            -13.71582, -16.382233, -12.996475, -15.253647, -12.996475, -0.58203125, -9.610718,
            -8.482132, 0.54655457, -7.353546, -10.739304, -12.996475, -11.867889, -5.0963745,
            -6.2249603, -5.0963745, -3.9677887, -3.9677887, -14.125061, 0.54655457, -9.610718,
            -6.2249603, -6.2249603, -2.839203, -10.739304, 0.54655457, 0.54655457, -12.996475,
            -8.482132, -8.482132, 0.54655457, -7.353546, -7.353546, -22.299698, -22.299698,
            -14.735123, -26.081985, -7.1705475, -12.843979, -5.2794037, -27.97313, -14.735123,
            -5.2794037, -18.51741, -20.408554, -1.4971161, -24.190842, -1.4971161, -27.97313,
            -14.735123, -22.299698, -26.081985, -10.952835, 0.3940277, 0.3940277, -16.626266,
            -26.081985, -18.51741, -22.299698, -9.061691, -10.952835, -10.952835, -3.38826,
            -27.97313, -7.1705475, -19.920502, -27.363068, -12.477936, 0.54655457, -5.03537,
            -3.1747284, -19.920502, -19.920502, -8.756653, -21.781143, -8.756653, -14.338577,
            -1.3140869, -1.3140869, -16.199219, -1.3140869, -25.502426, -10.617294, -8.756653,
            -1.3140869, -19.920502, -25.502426, -6.8960114, -25.502426, -21.781143, -18.05986,
            -25.502426, -8.756653, -3.1747284, -1.3140869, -16.199219, -16.199219, -16.712723,
            -8.324585, -8.324585, -23.423233, -25.10086, -25.10086, -6.6469574, -10.002213,
            -10.002213, -1.6140747, -6.6469574, -8.324585, -20.067978, -11.67984, -4.96933,
            -8.324585, -6.6469574, -16.712723, -10.002213, -23.423233, -4.96933, -11.67984,
            -4.96933, -10.002213, -8.324585, -6.6469574, -3.2917023, -3.2917023, -10.002213,
            0.06355286, -4.96933, -6.6469574, -0.47277832, -4.3160706, -1.5708618, -4.8651123,
            -8.159363, -2.1199036, -5.963196, -4.8651123, -8.159363, -2.6689453, -7.610321,
            -4.3160706, -4.3160706, -7.0612793, -3.217987, -7.610321, -5.414154, -4.8651123,
            -1.0218201, -7.610321, -4.3160706, -1.0218201, -7.0612793, -4.8651123, -1.5708618,
            -1.5708618, -1.0218201, -3.217987, -2.1199036, -7.610321, -4.8651123, -0.47277832,
            -6.7867126, -5.3226013, -8.250824, -2.3943787, -5.3226013, -1.662323, -2.3943787,
            0.533844, -7.5187683, -3.1264343, -1.662323, -4.5905457, -0.19821167, -7.5187683,
            -0.19821167, -9.714935, -0.93026733, -4.5905457, -4.5905457, -8.98288, -10.446991,
            -7.5187683, -7.5187683, -8.250824, -10.446991, -0.93026733, -6.7867126, -6.054657,
            -1.662323, -3.85849, -0.19821167, -6.054657,
        ];
        // Q5_K: 256 values in 176 bytes.
        pub(super) const Q5_K_BYTES: &str = concat!(
            "b4a8b426cd1eeb199ff5d82d096e87cd5bdbefabf30341aa6b4958f60767a5ab9bd5ca783633754e18661d118bd7c432",
            "db4e140cd04d00ecaaa443dd912091346e171d37a32b67da07ebb634b6d8374fcb6612fc6dae7e75c4183c966d9ee0db",
            "4968e18ed42712b3433464d2c8174d7a2f71b5ec51ed9785a538442cae295471121db12c8ff49afbdedf9599a32f68fe",
            "b6c5364eece3af540237340be8ff814e80250df6a66c800f42bb0cc80132b157",
        );
        pub(super) const Q5_K_F32: [f32; 256] = [
            -13.708557, -15.141541, -10.364929, -14.186218, -8.454285, -14.663879, -8.454285,
            -6.54364, -13.230896, -10.364929, -2.24469, -7.0213013, -8.931946, -8.454285, -8.931946,
            -10.364929, -15.141541, -11.797913, -7.0213013, -4.1553345, -2.24469, -13.708557,
            -11.797913, -5.588318, -4.1553345, -6.065979, -11.320251, -10.364929, -11.320251,
            -12.275574, -4.1553345, -7.9766235, -33.35431, -23.433655, -20.12677, -19.024475,
            -33.35431, -23.433655, -1.3877563, -34.456604, -30.047424, -12.410706, -5.796936,
            -33.35431, -28.94513, -21.229065, -11.308411, -22.33136, -25.638245, -2.4900513,
            -20.12677, -4.694641, -30.047424, -21.229065, -8.001526, -33.35431, -1.3877563,
            -34.456604, -13.5130005, -4.694641, -31.14972, -33.35431, -4.694641, -23.433655,
            -18.007935, -10.108154, -29.067627, -19.58789, -21.167847, -22.747803, -22.747803,
            -8.528198, -6.948242, -13.268066, -19.58789, -35.38745, -46.447144, -48.0271,
            -25.907715, -18.007935, -14.848022, -38.547363, -2.208374, -22.747803, -32.22754,
            -11.68811, -29.067627, -30.647583, -5.368286, -32.22754, -32.22754, -3.78833,
            -13.268066, -36.967407, -46.447144, -16.427979, -26.898499, -21.387024, -16.794128,
            -29.654236, -6.6897583, -10.364075, -7.6083374, -22.305603, -26.898499, -16.794128,
            -18.631287, -9.445496, -6.6897583, -9.445496, -14.038391, -27.817078, -19.549866,
            -6.6897583, -28.735657, -23.224182, -13.119812, -3.015442, -2.0968628, -25.97992,
            -19.549866, -3.934021, -21.387024, -13.119812, -26.898499, -2.0968628, -4.8526,
            -7.6083374, -65.76306, -36.442017, -11.309692, -25.970215, -36.442017, -28.064575,
            -15.498413, -11.309692, -11.309692, -17.592773, -42.725098, -59.47998, -30.158936,
            -19.687134, -9.215332, -2.932251, -38.536377, -61.57434, -2.932251, -59.47998,
            -65.76306, -42.725098, -55.29126, -23.875854, -63.6687, -32.253296, -44.819458,
            -53.1969, -7.1209717, -65.76306, -17.592773, -63.6687, -2.442749, -5.0147705,
            -15.302856, -16.84607, -12.216431, -8.615601, -6.043579, -13.759644, -14.788452,
            -2.9571533, -3.4715576, -10.673218, -6.5579834, -10.673218, -12.216431, -13.245239,
            -1.9283447, -1.9283447, -7.0723877, -10.673218, -13.759644, -17.360474, -14.274048,
            -9.130005, -8.101196, -16.331665, -6.043579, -6.043579, -6.5579834, -2.442749,
            -4.500366, -17.360474, -45.925537, -43.904663, -45.925537, -29.758545, -58.05078,
            -7.5289307, -64.1134, -9.549805, -37.84204, -47.94641, -41.88379, -56.029907, -17.6333,
            -64.1134, -3.4871826, -29.758545, -1.4663086, -43.904663, -60.071655, -45.925537,
            -13.591553, -25.716797, -33.800293, -64.1134, -5.5080566, -56.029907, -25.716797,
            -17.6333, -3.4871826, -37.84204, -35.821167, -15.612427, -5.5684814, -13.688721,
            -9.3897705, -9.867432, -14.644043, -7.001465, -5.0908203, -10.345093, -0.31420898,
            -1.7471924, -1.7471924, -7.956787, -7.001465, -7.479126, -11.778076, -9.867432,
            -11.778076, -8.912109, -7.956787, -7.479126, -5.0908203, -3.1801758, -4.135498,
            -0.31420898, -2.2248535, -5.5684814, -0.31420898, -6.0461426, -7.956787, -9.3897705,
            -13.21106, -2.7025146,
        ];
        // Q6_K: 256 values in 210 bytes.
        pub(super) const Q6_K_BYTES: &str = concat!(
            "82d2b4e14f57a22fa061cd9834a3187c80f78c7f9d34e51de7fabc993aa3f29edf890de28cc9b706d02055d364e60991",
            "6bd072d6c7aeb76f745e14a0eed65d192ac0ea8b9a05af34c2ebcc2beea2c2d629f8e7532c7af842114f3158fb0be7f7",
            "b68083e4e15803d105a2e71a1e75bcf7a9380b8b8e61a767bff90d948fea345ca741b3e54065c3b78fcd4e37d6fb7de7",
            "aab2684d20811c8fc3032dd8b5d35161395bf7073b46f095d72417477f2b56094a2408d8c8c9acb4397c804e3094cc2a",
            "525ec55dfe06d3330acac6adbb16ed5c33a2",
        );
        pub(super) const Q6_K_F32: [f32; 256] = [
            -17.871185, 13.899811, -19.856873, 14.892654, 16.878342, 8.935593, -17.871185,
            -30.778152, -15.885498, 14.892654, -12.906967, -23.828247, -3.9713745, -18.864029,
            7.942749, -27.799622, -0.0, -7.9669647, 22.762756, 1.1381378, 21.624619, 13.657654,
            30.729721, -33.005997, -26.17717, -29.591583, 4.5525513, 26.17717, 6.828827, -21.624619,
            15.933929, 2.2762756, -0.7143631, -16.430351, -13.572899, -10.001083, -14.287262,
            -5.0005417, -17.859077, -7.143631, 11.42981, 11.42981, 15.001625, -9.28672, -8.572357,
            4.2861786, 17.859077, -10.715446, -12.38633, 36.03296, -2.25206, -24.77266, 28.15075,
            20.26854, -25.89869, -34.90693, 31.52884, 20.26854, -22.5206, -0.0, 2.25206, 29.27678,
            21.39457, 25.89869, 0.19372559, -0.46009827, 0.65382385, 0.33901978, -0.67803955,
            0.12107849, -0.53274536, 0.43588257, -0.53274536, -0.62960815, -0.48431396, 0.60539246,
            -0.31480408, 0.62960815, 0.41166687, 0.16950989, -0.58117676, -2.25206, -0.58117676,
            1.8161774, -0.65382385, 2.1067657, 0.14529419, 2.25206, 1.3076477, 1.2350006,
            -0.79911804, 0.50852966, -1.3802948, 0.43588257, 0.072647095, -0.65382385, 7.0830917,
            -4.3588257, 0.0, 16.345596, -4.3588257, -2.1794128, 14.711037, 0.0, 7.0830917, 9.807358,
            -5.9933853, -10.352211, 11.986771, 16.345596, -8.717651, 13.62133, -3.7050018,
            -8.027504, 5.5575027, 1.8525009, 12.350006, -6.175003, 12.967506, -3.7050018,
            -14.202507, 16.672508, 19.14251, -16.055008, -8.645004, -17.907509, 6.7925034, 9.262505,
            0.72647095, -1.9372559, -3.1480408, -3.2691193, -3.1480408, -0.60539246, 2.0583344,
            1.4529419, -2.1794128, 2.5426483, -3.3901978, -3.2691193, -3.6323547, -2.1794128,
            -0.24215698, 1.2107849, 5.8844147, -15.691772, -16.345596, -18.960892, -13.076477,
            -3.922943, -15.691772, -19.614716, -9.807358, -11.1150055, -20.26854, 5.230591,
            -13.730301, -13.730301, -16.345596, 4.576767, 4.2135315, 0.0, -9.129318, -8.427063,
            0.70225525, -5.618042, -20.365402, -10.533829, -7.7248077, -9.8315735, -6.3202972,
            -4.2135315, 21.067657, 3.5112762, -2.809021, 4.9157867, 9.044563, -8.039612, 11.054466,
            11.054466, 14.069321, 1.0049515, 23.113884, -9.044563, 15.074272, 25.123787, -19.094078,
            20.09903, -17.084175, -6.029709, 20.09903, 12.059418, 15.037949, -3.3417664, 25.063248,
            -20.050598, 20.88604, -26.73413, 21.721481, -10.860741, -3.3417664, 11.696182,
            -3.3417664, -25.063248, 25.063248, 8.354416, -3.3417664, -15.87339, 7.9911804,
            -3.9955902, 4.7947083, 2.9300995, 7.9911804, 6.659317, -3.9955902, -5.3274536,
            -4.5283356, -5.3274536, 7.7248077, 7.1920624, -8.257553, 4.261963, 4.7947083,
            -3.9955902, -4.831032, -1.8403931, 5.521179, -4.1408844, -4.1408844, -2.5305405,
            3.6807861, 2.9906387, 3.6807861, -5.061081, -4.1408844, -3.450737, -3.450737,
            -5.7512283, -1.1502457, -3.9108353, 6.6835327, 32.30374, 35.645508, -26.73413,
            -26.73413, -24.506287, -11.139221, -6.6835327, 23.392365, 1.1139221, -0.0, 7.797455,
            26.73413, -15.59491, -21.16452, 30.075897,
        ];
        // smollm2-135m-instruct-q4_1.gguf: blk.0.attn_q.weight (Q4_1, GGUF dims [576, 576]) row 0, first 8 values:
        pub(super) const ATTN_Q_ROW0: [f32; 8] = [-0.09631348, 0.15734863, -0.09631348, -0.73046875, 1.1719971, -0.09631348, 0.030517578, 0.66467285];
    }
    use vectors::*;
}
