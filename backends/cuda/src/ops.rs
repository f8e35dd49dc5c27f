//! Tensor creation and read-back, elementwise ops, RMSNorm, RoPE and the row/column copies
//! (concat, gather, KV write and compaction). Each op validates shapes on the host exactly as
//! the CPU backend does, then enqueues its kernel or copy without waiting.

use crate::tensor::CudaTensor;
use crate::{dev, grid_1d, shape_err, to_u32, CudaBackend};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use sparkling_core::{Error, Result};

/// Threads per block of rms_norm.cu (`RMS_THREADS`).
const RMS_THREADS: u32 = 256;

impl CudaBackend {
    /// Upload `data` as `[rows, cols]`. Errors: length mismatch ([`Error::Shape`]).
    pub(crate) fn op_upload(&self, data: &[f32], rows: usize, cols: usize) -> Result<CudaTensor> {
        if Some(data.len()) != rows.checked_mul(cols) {
            return Err(shape_err("upload", format!("{} values for [{rows}, {cols}]", data.len())));
        }
        Ok(CudaTensor { rows, cols, buf: self.upload_slice("upload", data)? })
    }

    /// A zero-filled `[rows, cols]` tensor.
    pub(crate) fn op_zeros(&self, rows: usize, cols: usize) -> Result<CudaTensor> {
        let n = rows.checked_mul(cols).ok_or_else(|| shape_err("zeros", format!("[{rows}, {cols}] overflows")))?;
        let buf = self.stream.alloc_zeros::<f32>(n.max(1)).map_err(|e| Error::Device(format!("zeros: allocating [{rows}, {cols}]: {e}")))?;
        Ok(CudaTensor { rows, cols, buf })
    }

    /// Rows `start..start+n` back to the host (a sync point). Errors: rows beyond the tensor.
    pub(crate) fn op_download_rows(&self, t: &CudaTensor, start: usize, n: usize) -> Result<Vec<f32>> {
        if start.checked_add(n).is_none_or(|e| e > t.rows) {
            return Err(shape_err("download_rows", format!("rows {start}..{} of {}", start.saturating_add(n), t.rows)));
        }
        if n == 0 || t.cols == 0 {
            return Ok(Vec::new());
        }
        self.stream.clone_dtoh(&t.buf.slice(start * t.cols..(start + n) * t.cols)).map_err(|e| Error::Device(format!("download: device→host copy: {e}")))
    }

    /// RMSNorm over groups of `group` columns with weight `w: [1, group]` (reference §1.3),
    /// shaders/cuda/rms_norm.cu. Errors: `group == 0`, `cols % group != 0` or a weight of the
    /// wrong length ([`Error::Shape`]).
    pub(crate) fn op_rms_norm(&self, x: &CudaTensor, w: &CudaTensor, group: usize, eps: f32) -> Result<CudaTensor> {
        let wl = w.len();
        if group == 0 || !x.cols.is_multiple_of(group) || wl != group {
            return Err(shape_err("rms_norm", format!("cols {} group {group} weight {wl}", x.cols)));
        }
        let mut out = self.alloc_f32("rms_norm", x.len())?;
        let n_groups = x.len() / group;
        if n_groups > 0 {
            let g = to_u32("rms_norm", "group", group)?;
            let cfg = LaunchConfig { grid_dim: (to_u32("rms_norm", "groups", n_groups)?, 1, 1), block_dim: (RMS_THREADS, 1, 1), shared_mem_bytes: 0 };
            let mut b = self.stream.launch_builder(self.k.get("rms_norm"));
            b.arg(&x.buf).arg(&w.buf).arg(&mut out).arg(&g).arg(&eps);
            // SAFETY: x and out hold n_groups*group values, w holds group values.
            unsafe { b.launch(cfg) }.map_err(dev("rms_norm"))?;
        }
        Ok(CudaTensor { rows: x.rows, cols: x.cols, buf: out })
    }

    /// In-place NeoX RoPE with explicit positions (reference §1.3), shaders/cuda/rope.cu.
    /// Errors: not one position per row, or an odd `head_dim` not dividing `cols`.
    pub(crate) fn op_rope(&self, x: &mut CudaTensor, positions: &[u32], head_dim: usize, theta: f32) -> Result<()> {
        if positions.len() != x.rows || head_dim == 0 || !head_dim.is_multiple_of(2) || !x.cols.is_multiple_of(head_dim) {
            return Err(shape_err("rope", format!("x [{}, {}], {} positions, head_dim {head_dim}", x.rows, x.cols, positions.len())));
        }
        if x.len() == 0 {
            return Ok(());
        }
        let inv_freq = self.inv_freq(head_dim, theta)?;
        let pos = self.upload_u32_cached("rope positions", positions)?;
        let (rows, cols, hd) = (to_u32("rope", "rows", x.rows)?, to_u32("rope", "cols", x.cols)?, to_u32("rope", "head_dim", head_dim)?);
        let cfg = grid_1d(x.len() / 2);
        let mut b = self.stream.launch_builder(self.k.get("rope"));
        b.arg(&mut x.buf).arg(&rows).arg(&cols).arg(&hd).arg(pos.as_ref()).arg(inv_freq.as_ref());
        // SAFETY: x holds rows*cols values, pos one per row, inv_freq head_dim/2.
        unsafe { b.launch(cfg) }.map_err(dev("rope"))?;
        Ok(())
    }

    /// `silu(gate) * up`, elementwise (shaders/cuda/silu_mul.cu). Errors: different shapes.
    pub(crate) fn op_silu_mul(&self, gate: &CudaTensor, up: &CudaTensor) -> Result<CudaTensor> {
        if gate.rows != up.rows || gate.cols != up.cols {
            return Err(shape_err("silu_mul", format!("[{}, {}] vs [{}, {}]", gate.rows, gate.cols, up.rows, up.cols)));
        }
        let n = gate.len();
        let mut out = self.alloc_f32("silu_mul", n)?;
        if n > 0 {
            let n32 = to_u32("silu_mul", "elements", n)?;
            let mut b = self.stream.launch_builder(self.k.get("silu_mul"));
            b.arg(&gate.buf).arg(&up.buf).arg(&mut out).arg(&n32);
            // SAFETY: all three buffers hold n values.
            unsafe { b.launch(grid_1d(n)) }.map_err(dev("silu_mul"))?;
        }
        Ok(CudaTensor { rows: gate.rows, cols: gate.cols, buf: out })
    }

    /// `x += y`, elementwise (shaders/cuda/add.cu). Errors: different shapes.
    pub(crate) fn op_add_assign(&self, x: &mut CudaTensor, y: &CudaTensor) -> Result<()> {
        if x.rows != y.rows || x.cols != y.cols {
            return Err(shape_err("add_assign", format!("[{}, {}] vs [{}, {}]", x.rows, x.cols, y.rows, y.cols)));
        }
        let n = x.len();
        if n > 0 {
            let n32 = to_u32("add_assign", "elements", n)?;
            let mut b = self.stream.launch_builder(self.k.get("add_assign"));
            b.arg(&mut x.buf).arg(&y.buf).arg(&n32);
            // SAFETY: both buffers hold n values.
            unsafe { b.launch(grid_1d(n)) }.map_err(dev("add_assign"))?;
        }
        Ok(())
    }

    /// `[T, a] ++ [T, b] ++ … → [T, a+b+…]`: one column-band copy kernel per part (a plain
    /// copy for a single part). Errors: parts with different row counts.
    pub(crate) fn op_concat_cols(&self, parts: &[&CudaTensor]) -> Result<CudaTensor> {
        let rows = parts.first().map_or(0, |p| p.rows);
        if parts.iter().any(|p| p.rows != rows) {
            return Err(shape_err("concat_cols", "parts have different row counts".into()));
        }
        let cols: usize = parts.iter().map(|p| p.cols).sum();
        let mut out = self.alloc_f32("concat_cols", rows * cols)?;
        if parts.len() == 1 {
            if parts[0].len() > 0 {
                self.stream.memcpy_dtod(&parts[0].view(), &mut out.slice_mut(0..rows * cols)).map_err(dev("concat_cols"))?;
            }
            return Ok(CudaTensor { rows, cols, buf: out });
        }
        let (r32, c32) = (to_u32("concat_cols", "rows", rows)?, to_u32("concat_cols", "cols", cols)?);
        let mut off = 0usize;
        for p in parts {
            if p.len() > 0 {
                let (pc, o) = (to_u32("concat_cols", "cols", p.cols)?, to_u32("concat_cols", "offset", off)?);
                let mut b = self.stream.launch_builder(self.k.get("copy_cols"));
                b.arg(&p.buf).arg(&r32).arg(&pc).arg(&mut out).arg(&c32).arg(&o);
                // SAFETY: p holds rows*p.cols values; out holds rows*cols with off+p.cols <= cols.
                unsafe { b.launch(grid_1d(p.len())) }.map_err(dev("concat_cols"))?;
            }
            off += p.cols;
        }
        Ok(CudaTensor { rows, cols, buf: out })
    }

    /// `[a, C] ++ [b, C] ++ … → [a+b+…, C]`: device-to-device copies (rows are contiguous).
    /// Errors: parts with different column counts.
    pub(crate) fn op_concat_rows(&self, parts: &[&CudaTensor]) -> Result<CudaTensor> {
        let cols = parts.first().map_or(0, |p| p.cols);
        if parts.iter().any(|p| p.cols != cols) {
            return Err(shape_err("concat_rows", "parts have different column counts".into()));
        }
        let rows: usize = if cols == 0 { 0 } else { parts.iter().map(|p| p.rows).sum() };
        let mut out = self.alloc_f32("concat_rows", rows * cols)?;
        let mut at = 0usize;
        for p in parts {
            let n = p.len();
            if n > 0 {
                self.stream.memcpy_dtod(&p.view(), &mut out.slice_mut(at..at + n)).map_err(dev("concat_rows"))?;
            }
            at += n;
        }
        Ok(CudaTensor { rows, cols, buf: out })
    }

    /// `out[i] = x[rows[i]]`. Errors: a row index `≥ x.rows` ([`Error::Shape`]).
    pub(crate) fn op_gather_rows(&self, x: &CudaTensor, rows: &[usize]) -> Result<CudaTensor> {
        if let Some(&r) = rows.iter().find(|&&r| r >= x.rows) {
            return Err(shape_err("gather_rows", format!("row {r} of {}", x.rows)));
        }
        let mut out = self.alloc_f32("gather_rows", rows.len() * x.cols)?;
        self.encode_gather("gather_rows", x, 0, rows, &mut out)?;
        Ok(CudaTensor { rows: rows.len(), cols: x.cols, buf: out })
    }

    /// Enqueue `out[i] = x[base + idx[i]]` (shaders/cuda/gather_rows.cu).
    fn encode_gather(&self, op: &'static str, x: &CudaTensor, base: usize, idx: &[usize], out: &mut cudarc::driver::CudaSlice<f32>) -> Result<()> {
        let n = idx.len() * x.cols;
        if n == 0 {
            return Ok(());
        }
        let words = idx.iter().map(|&r| to_u32(op, "row index", r)).collect::<Result<Vec<u32>>>()?;
        let ib = self.upload_u32_cached(op, &words)?;
        let (ni, c, b0) = (to_u32(op, "rows", idx.len())?, to_u32(op, "cols", x.cols)?, to_u32(op, "start row", base)?);
        let mut b = self.stream.launch_builder(self.k.get("gather_rows"));
        b.arg(&x.buf).arg(ib.as_ref()).arg(&ni).arg(&c).arg(&b0).arg(out);
        // SAFETY: every base+idx[i] < x.rows (checked by the callers); out holds idx.len()*cols.
        unsafe { b.launch(grid_1d(n)) }.map_err(dev(op))?;
        Ok(())
    }

    /// Write `src[T, C]` into rows `at..at+T` of `dst[cap, C]` (one device copy).
    /// Errors: column mismatch or rows beyond the cache ([`Error::Shape`]).
    pub(crate) fn op_write_rows(&self, dst: &mut CudaTensor, at: usize, src: &CudaTensor) -> Result<()> {
        if src.cols != dst.cols || at.checked_add(src.rows).is_none_or(|e| e > dst.rows) {
            return Err(shape_err("write_rows", format!("[{}, {}] at row {at} into [{}, {}]", src.rows, src.cols, dst.rows, dst.cols)));
        }
        let n = src.len();
        if n > 0 {
            let o = at * dst.cols;
            self.stream.memcpy_dtod(&src.view(), &mut dst.buf.slice_mut(o..o + n)).map_err(dev("write_rows"))?;
        }
        Ok(())
    }

    /// KV compaction (reference §4.10): gather rows `start + keep[j]` into a temporary, then
    /// copy it over rows `start..start+keep.len()` (read-all-then-write, overlap safe).
    /// Errors: a kept row beyond the cache, or more kept rows than fit below `start`
    /// ([`Error::Shape`]).
    pub(crate) fn op_compact_rows(&self, cache: &mut CudaTensor, start: usize, keep: &[usize]) -> Result<()> {
        if keep.iter().any(|&k| start.checked_add(k).is_none_or(|r| r >= cache.rows)) || start.checked_add(keep.len()).is_none_or(|e| e > cache.rows) {
            return Err(shape_err("compact_rows", format!("keep {keep:?} from row {start} of {}", cache.rows)));
        }
        let n = keep.len() * cache.cols;
        if n == 0 {
            return Ok(());
        }
        let mut tmp = self.alloc_f32("compact_rows", n)?;
        self.encode_gather("compact_rows", cache, start, keep, &mut tmp)?;
        let o = start * cache.cols;
        self.stream.memcpy_dtod(&tmp.slice(0..n), &mut cache.buf.slice_mut(o..o + n)).map_err(dev("compact_rows"))?;
        Ok(())
    }
}
