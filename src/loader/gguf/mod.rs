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
use std::path::{Path, PathBuf};

use crate::loader::bytes::FileBytes;
use half::{bf16, f16};

/// Error of the GGUF reader: a human-readable message that names the file path, tensor or
/// metadata key at fault and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufError(pub String);

/// GGUF errors already name the file (and the offset, key or tensor), so they convert to an
/// engine error without a second path prefix.
impl From<GgufError> for crate::error::Error {
    fn from(e: GgufError) -> Self {
        crate::error::Error::Input(e.0)
    }
}

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
fn byte_size(ggml_type: u32, n_elements: u64) -> Result<u64, String> {
    let (name, block, bytes) = type_layout(ggml_type).ok_or_else(|| format!("unknown ggml type id {ggml_type}"))?;
    if !n_elements.is_multiple_of(block as u64) {
        return Err(format!("{n_elements} values of type {name} are not a whole number of {block}-value blocks"));
    }
    (n_elements / block as u64).checked_mul(bytes as u64).ok_or_else(|| format!("size of {n_elements} values of type {name} overflows"))
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
    mmap: FileBytes,
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
        String::from_utf8(bytes.to_vec()).map_err(|e| GgufError(format!("{}: {} at byte {at} is not valid UTF-8: {e}", self.path.display(), what())))
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
            _ => return err(format!("{}: metadata key `{key}` has unknown value type {ty} (expected 0..=12)", self.path.display())),
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
        let mmap = FileBytes::open(path).map_err(|e| GgufError(format!("{}: cannot open GGUF file: {e}", path.display())))?;
        GgufFile::parse(path, mmap)
    }

    /// Parse a GGUF file held in memory (e.g. fetched by a browser); `name` stands for the file
    /// in error messages. Errors: as [`GgufFile::open`].
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        GgufFile::parse(Path::new(name), FileBytes::Owned(bytes))
    }

    fn parse(path: &Path, mmap: FileBytes) -> Result<GgufFile, GgufError> {
        let p = path.display();
        let len = mmap.len() as u64;
        if len < 24 {
            return err(format!("{p}: file is {len} bytes, too small to be a GGUF file (header alone is 24 bytes)"));
        }
        let buf: &[u8] = &mmap;

        if &buf[0..4] != MAGIC {
            return err(format!("{p}: not a GGUF file: magic bytes are {:02x?}, expected \"GGUF\" (47 47 55 46)", &buf[0..4]));
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
                _ => return err(format!("{p}: metadata key `general.alignment` is {v:?}, expected a positive power-of-two integer")),
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
        // (start, end, index) of every tensor's bytes, to check that no two overlap.
        let mut spans: Vec<(u64, u64, usize)> = Vec::with_capacity(raw.len());
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
                return err(format!("{p}: tensor `{name}` has data offset {rel}, which is not a multiple of the alignment {alignment}"));
            }
            let offset = data_start.checked_add(rel).ok_or_else(|| GgufError(format!("{p}: tensor `{name}`: data offset {rel} overflows")))?;
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
            spans.push((offset, end, tensors.len()));
            tensors.push(TensorInfo { name, dims, ggml_type: ty, offset });
        }
        // Two tensors sharing file bytes (a corrupt or hand-edited offset, or a type id that
        // makes one tensor run into the next) would load the wrong weights without a word.
        spans.sort_unstable();
        for w in spans.windows(2) {
            let ((_, end_a, a), (start_b, _, b)) = (w[0], w[1]);
            if start_b < end_a {
                let (ta, tb) = (&tensors[a], &tensors[b]);
                return err(format!(
                    "{p}: tensors `{}` (bytes {}..{end_a}) and `{}` (from byte {start_b}) overlap: corrupt tensor table (wrong offset or type id?)",
                    ta.name, ta.offset, tb.name
                ));
            }
        }

        // Everything before the data section is parsed into owned values: its pages (for a
        // tokenizer-carrying file, megabytes of vocabulary strings) need not stay resident.
        mmap.release(0, data_start as usize);
        Ok(GgufFile { path: path.to_path_buf(), version, metadata, tensors, alignment, index, mmap })
    }

    /// Alignment (bytes) of the data section and tensor offsets (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Remove and return the metadata value of `key` (e.g. the tokenizer's vocabulary arrays,
    /// megabytes of owned strings, once the tokenizer is built); `None` if absent.
    pub fn remove_metadata(&mut self, key: &str) -> Option<MetaValue> {
        self.metadata.remove(key)
    }

    /// The metadata value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    fn need(&self, key: &str) -> Result<&MetaValue, GgufError> {
        self.metadata.get(key).ok_or_else(|| GgufError(format!("{}: metadata key `{key}` is missing", self.path.display())))
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
            Some(i) => err(format!("{}: metadata key `{key}` is {i}, expected a non-negative integer", self.path.display())),
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
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| GgufError(format!("{}: metadata key `{key}`: element {i} is a {}, expected a string", self.path.display(), v.type_name())))
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
                v.as_int()
                    .and_then(|x| i64::try_from(x).ok())
                    .ok_or_else(|| GgufError(format!("{}: metadata key `{key}`: element {i} is {v:?}, expected an integer", self.path.display())))
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
        let t = self.tensor(name).ok_or_else(|| GgufError(format!("{p}: tensor `{name}`: not found")))?;
        let size =
            byte_size(t.ggml_type, t.n_elements()).map_err(|e| GgufError(format!("{p}: tensor `{name}`: {e}; supported types: {}", supported_list())))?;
        // Bounds were checked against the file length in `open`.
        let (start, end) = (t.offset as usize, (t.offset + size) as usize);
        Ok(&self.mmap[start..end])
    }

    /// Drop tensor `name`'s file pages from the resident set once it has been copied out
    /// ([`FileBytes::release`]; reading it again still works). Unknown names: nothing.
    pub fn release_tensor(&self, name: &str) {
        if let Some(t) = self.tensor(name) {
            if let Ok(size) = byte_size(t.ggml_type, t.n_elements()) {
                self.mmap.release(t.offset as usize, size as usize);
            }
        }
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
        let t = self.tensor(name).ok_or_else(|| GgufError(format!("{p}: tensor `{name}`: not found")))?;
        if !SUPPORTED.contains(&t.ggml_type) {
            return err(format!(
                "{p}: tensor `{name}`: ggml type {} (id {}) cannot be dequantized; supported types: {}",
                type_name(t.ggml_type),
                t.ggml_type,
                supported_list()
            ));
        }
        let n = usize::try_from(t.n_elements()).map_err(|_| GgufError(format!("{p}: tensor `{name}`: too large for this platform")))?;
        let bytes = self.tensor_data(name)?;
        let mut out = vec![0f32; n];
        dequantize(t.ggml_type, bytes, n, &mut out).map_err(|e| GgufError(format!("{p}: tensor `{name}`: {e}")))?;
        Ok((t.shape(), out))
    }
}

mod dequant;
pub use dequant::dequantize;

#[cfg(test)]
pub(crate) mod tests;
