//! KV cache storage on the CPU ([`KvDtype`]): f32, f16, or llama.cpp's q8_0 blocks ([`q8`]),
//! and the row operations that read or write a cache, behind the backend's `kv_zeros`,
//! `write_rows`, `compact_rows` (KV compaction after a tree round) and the downloads. The
//! attention reads the three storages in `crate::attention`.

pub mod q8;

use crate::{shape_err, CpuTensor};
use half::slice::HalfFloatSliceExt;
use sparkling_core::{Error, Result};

/// Storage precision of the KV cache ([`sparkling_core::Backend::kv_zeros`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvDtype {
    /// f32 (the reference; the default of [`crate::CpuBackend::new`]).
    #[default]
    F32,
    /// f16 (IEEE half, round to nearest even on write; llama.cpp's default cache type): half
    /// the bytes every attention reads, so long contexts and batches decode faster. The
    /// attention converts each loaded value exactly back to f32 (F16C on AVX2), so a row's
    /// result equals the f32 path over the f16-rounded keys and values, and `ar` and every
    /// speculative method still read the same cache (every method still equals `ar`).
    F16,
    /// q8_0 blocks (llama.cpp's `q8_0` cache type: 32 values, 8-bit codes and an f16 scale;
    /// [`q8`]): 0.56× the bytes of f16. The attention dequantizes each loaded value exactly
    /// (`code·d` in f32), so a row's result equals the f32 path over the dequantized keys and
    /// values, and every method still reads the same cache as `ar`. Faster where the attention
    /// waits on memory (decode rows: `ar`, batches, at long contexts); where it is bound by
    /// arithmetic (a tree verify's or drafter block's many rows over one cache) each value
    /// costs a conversion and a multiply instead of one; BENCHMARKS.md §32.
    Q8_0,
}

impl KvDtype {
    /// Lower-case name as `--kv-cache` spells it.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Q8_0 => "q8_0",
        }
    }
}

/// The codes and scales of a q8_0 KV cache ([`q8`]): row `r`'s codes at
/// `codes[r·cols..]`, its [`q8::blocks`]`(cols)` scales at `d[r·blocks..]`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Q8Rows {
    /// `rows·cols` codes.
    pub codes: Vec<i8>,
    /// `rows·⌈cols/32⌉` scales (f32 values that are exactly f16 values).
    pub d: Vec<f32>,
}

/// A `[rows, cols]` cache of `dtype`, zeroed (an empty one is plain f32).
pub(crate) fn zeros(dtype: KvDtype, rows: usize, cols: usize) -> CpuTensor {
    if dtype == KvDtype::F32 || rows * cols == 0 {
        return CpuTensor::from_f32(rows, cols, vec![0.0; rows * cols]);
    }
    if dtype == KvDtype::Q8_0 {
        let q8 = Q8Rows { codes: vec![0; rows * cols], d: vec![0.0; rows * q8::blocks(cols)] };
        return CpuTensor { rows, cols, data: Vec::new(), half: Vec::new(), q8 };
    }
    CpuTensor { rows, cols, data: Vec::new(), half: vec![half::f16::ZERO; rows * cols], q8: Q8Rows::default() }
}

/// Rows `start..start + n` of `t` as f32 (a cache's values converted exactly).
/// Errors: rows outside the tensor.
pub(crate) fn download_rows(t: &CpuTensor, start: usize, n: usize) -> Result<Vec<f32>> {
    if start.checked_add(n).is_none_or(|end| end > t.rows) {
        return Err(shape_err("download_rows", format!("{n} rows from row {start} of a {}-row tensor", t.rows)));
    }
    let c = t.cols;
    if t.is_f16() {
        return Ok(t.half[start * c..(start + n) * c].iter().map(|h| h.to_f32()).collect());
    }
    if t.is_q8() {
        let nb = q8::blocks(c);
        let (mut out, mut row) = (Vec::with_capacity(n * c), Vec::new());
        for r in start..start + n {
            q8::dequantize(&t.q8.codes[r * c..(r + 1) * c], &t.q8.d[r * nb..(r + 1) * nb], 0, c, &mut row);
            out.extend_from_slice(&row);
        }
        return Ok(out);
    }
    Ok(t.data[start * c..(start + n) * c].to_vec())
}

/// Write the f32 rows of `src` into `dst` from row `at`, rounding to `dst`'s storage (f16:
/// nearest even; q8_0: [`q8::quantize_row`]). Errors: shapes that do not fit, a source that is
/// itself a cache.
pub(crate) fn write_rows(dst: &mut CpuTensor, at: usize, src: &CpuTensor) -> Result<()> {
    if src.cols != dst.cols || at + src.rows > dst.rows {
        return Err(shape_err("write_rows", format!("[{}, {}] at row {at} into [{}, {}]", src.rows, src.cols, dst.rows, dst.cols)));
    }
    if src.is_f16() || src.is_q8() {
        return Err(Error::Invalid(format!(
            "write_rows: the source is a KV cache stored in {}; only f32 activations are written into a tensor",
            src.storage()
        )));
    }
    let range = at * dst.cols..(at + src.rows) * dst.cols;
    if dst.is_q8() {
        let (c, nb) = (dst.cols, q8::blocks(dst.cols));
        for (i, x) in src.data.chunks_exact(c).enumerate() {
            let r = at + i;
            q8::quantize_row(x, &mut dst.q8.codes[r * c..(r + 1) * c], &mut dst.q8.d[r * nb..(r + 1) * nb]);
        }
    } else if dst.is_f16() {
        // The slice conversion runs F16C 8 values at a time where the CPU has it (the same
        // round-to-nearest-even as `f16::from_f32`).
        dst.half[range].convert_from_f32_slice(&src.data);
    } else {
        dst.data[range].copy_from_slice(&src.data);
    }
    Ok(())
}

/// KV compaction (reference §4.10): rows `start + keep[i]` move to `start + i`, codes and
/// scales alike. Errors: a kept row outside the cache.
pub(crate) fn compact_rows(cache: &mut CpuTensor, start: usize, keep: &[usize]) -> Result<()> {
    let c = cache.cols;
    if keep.iter().any(|&k| start + k >= cache.rows) {
        return Err(shape_err("compact_rows", format!("keep {keep:?} from row {start} of {}", cache.rows)));
    }
    fn compact<T: Copy>(v: &mut [T], c: usize, start: usize, keep: &[usize]) {
        let gathered: Vec<T> = keep.iter().flat_map(|&k| v[(start + k) * c..(start + k + 1) * c].iter().copied()).collect();
        v[start * c..(start + keep.len()) * c].copy_from_slice(&gathered);
    }
    if cache.is_f16() {
        compact(&mut cache.half, c, start, keep);
    } else if cache.is_q8() {
        compact(&mut cache.q8.codes, c, start, keep);
        compact(&mut cache.q8.d, q8::blocks(c), start, keep);
    } else {
        compact(&mut cache.data, c, start, keep);
    }
    Ok(())
}
