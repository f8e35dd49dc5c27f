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

/// The codes and scales of a q8_0 KV cache ([`q8`]), in the cache's panels ([`CpuTensor::panels`],
/// width `w`): panel `j`'s row `r` has its `w` codes at `codes[(j·rows + r)·w ..]` and its
/// [`q8::blocks`]`(w)` scales at `d[(j·rows + r)·blocks ..]`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Q8Rows {
    /// `rows·cols` codes.
    pub codes: Vec<i8>,
    /// `rows·panels·⌈w/32⌉` scales (f32 values that are exactly f16 values).
    pub d: Vec<f32>,
}

/// A zeroed cache of `rows` rows and `heads` KV heads of `head_dim` values, in `dtype`, one
/// panel per head ([`CpuTensor::panels`]).
pub(crate) fn zeros(dtype: KvDtype, rows: usize, heads: usize, head_dim: usize) -> CpuTensor {
    let cols = heads * head_dim;
    let mut t = CpuTensor::from_f32(rows, cols, Vec::new());
    t.panels = heads.max(1);
    match dtype {
        // An empty cache is plain f32 whatever the dtype (nothing to store).
        _ if rows * cols == 0 => {}
        KvDtype::F32 => t.data = vec![0.0; rows * cols],
        KvDtype::F16 => t.half = vec![half::f16::ZERO; rows * cols],
        KvDtype::Q8_0 => t.q8 = Q8Rows { codes: vec![0; rows * cols], d: vec![0.0; rows * heads * q8::blocks(head_dim)] },
    }
    t
}

/// Element offset of panel `j`'s row `r` in a tensor of `rows` rows and panels `w` wide.
#[inline]
fn at(rows: usize, w: usize, j: usize, r: usize) -> usize {
    (j * rows + r) * w
}

/// Rows `start..start + n` of `t` as f32, row-major (a cache's values converted exactly, its
/// panels put back side by side). Errors: rows outside the tensor.
pub(crate) fn download_rows(t: &CpuTensor, start: usize, n: usize) -> Result<Vec<f32>> {
    if start.checked_add(n).is_none_or(|end| end > t.rows) {
        return Err(shape_err("download_rows", format!("{n} rows from row {start} of a {}-row tensor", t.rows)));
    }
    let (w, p) = (t.panel_width(), t.panels.max(1));
    let nb = q8::blocks(w);
    let (mut out, mut row) = (Vec::with_capacity(n * t.cols), Vec::new());
    for r in start..start + n {
        for j in 0..p {
            let o = at(t.rows, w, j, r);
            if t.is_f16() {
                out.extend(t.half[o..o + w].iter().map(|h| h.to_f32()));
            } else if t.is_q8() {
                let so = at(t.rows, nb, j, r);
                q8::dequantize(&t.q8.codes[o..o + w], &t.q8.d[so..so + nb], 0, w, &mut row);
                out.extend_from_slice(&row);
            } else {
                out.extend_from_slice(&t.data[o..o + w]);
            }
        }
    }
    Ok(out)
}

/// Write the f32 rows of `src` (row-major) into `dst` from row `at`, each panel's columns
/// into that panel, rounding to `dst`'s storage (f16: nearest even; q8_0:
/// [`q8::quantize_row`] per panel row). Errors: shapes that do not fit, a source that is
/// itself a cache.
pub(crate) fn write_rows(dst: &mut CpuTensor, at_row: usize, src: &CpuTensor) -> Result<()> {
    if src.cols != dst.cols || at_row + src.rows > dst.rows {
        return Err(shape_err("write_rows", format!("[{}, {}] at row {at_row} into [{}, {}]", src.rows, src.cols, dst.rows, dst.cols)));
    }
    if src.is_f16() || src.is_q8() || src.panels > 1 {
        return Err(Error::Invalid(format!(
            "write_rows: the source is a KV cache stored in {}; only f32 activations are written into a tensor",
            src.storage()
        )));
    }
    let (rows, w, p) = (dst.rows, dst.panel_width(), dst.panels.max(1));
    let nb = q8::blocks(w);
    for (i, x) in src.data.chunks_exact(src.cols.max(1)).enumerate() {
        for j in 0..p {
            let (o, xs) = (at(rows, w, j, at_row + i), &x[j * w..(j + 1) * w]);
            if dst.is_q8() {
                let so = at(rows, nb, j, at_row + i);
                q8::quantize_row(xs, &mut dst.q8.codes[o..o + w], &mut dst.q8.d[so..so + nb]);
            } else if dst.is_f16() {
                // The slice conversion runs F16C 8 values at a time where the CPU has it (the
                // same round-to-nearest-even as `f16::from_f32`).
                dst.half[o..o + w].convert_from_f32_slice(xs);
            } else {
                dst.data[o..o + w].copy_from_slice(xs);
            }
        }
    }
    Ok(())
}

/// KV compaction (reference §4.10): rows `start + keep[i]` move to `start + i` in every panel,
/// codes and scales alike. Errors: a kept row outside the cache.
pub(crate) fn compact_rows(cache: &mut CpuTensor, start: usize, keep: &[usize]) -> Result<()> {
    if keep.iter().any(|&k| start + k >= cache.rows) {
        return Err(shape_err("compact_rows", format!("keep {keep:?} from row {start} of {}", cache.rows)));
    }
    /// Compacts each of the `v.len() / (rows·c)` panels of `rows` rows of `c` elements.
    fn compact<T: Copy>(v: &mut [T], rows: usize, c: usize, start: usize, keep: &[usize]) {
        let mut gathered: Vec<T> = Vec::with_capacity(keep.len() * c);
        for panel in v.chunks_exact_mut((rows * c).max(1)) {
            gathered.clear();
            gathered.extend(keep.iter().flat_map(|&k| panel[(start + k) * c..(start + k + 1) * c].iter().copied()));
            panel[start * c..(start + keep.len()) * c].copy_from_slice(&gathered);
        }
    }
    let (rows, w) = (cache.rows, cache.panel_width());
    if cache.is_f16() {
        compact(&mut cache.half, rows, w, start, keep);
    } else if cache.is_q8() {
        compact(&mut cache.q8.codes, rows, w, start, keep);
        compact(&mut cache.q8.d, rows, q8::blocks(w), start, keep);
    } else {
        compact(&mut cache.data, rows, w, start, keep);
    }
    Ok(())
}
