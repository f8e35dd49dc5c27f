//! Tensor creation, elementwise ops, RMSNorm, RoPE and the row/column copies (concat, gather,
//! KV write and compaction). Each op validates shapes on the host exactly as the CPU backend
//! does, then encodes and submits without waiting.

use crate::ctx::Bind;
use crate::pipelines::{Kernel, ELEMS_PER_GROUP};
use crate::tensor::WgpuTensor;
use crate::WgpuBackend;
use sparkling_core::{Error, Result};

fn shape_err(op: &'static str, detail: String) -> Error {
    Error::Shape { op, detail }
}

/// Workgroups of a 1-D elementwise kernel over `elems` values.
fn groups_for(elems: usize) -> u64 {
    (elems as u64).div_ceil(ELEMS_PER_GROUP)
}

impl WgpuBackend {
    /// Upload `data` as `[rows, cols]`. Errors: length mismatch ([`Error::Shape`]), a tensor
    /// beyond one storage binding ([`Error::Device`]).
    pub(crate) fn op_upload(&self, data: &[f32], rows: usize, cols: usize) -> Result<WgpuTensor> {
        let g = &self.gpu;
        g.check()?;
        if data.len() != rows.saturating_mul(cols) {
            return Err(shape_err("upload", format!("{} values for [{rows}, {cols}]", data.len())));
        }
        let t = g.alloc("upload", rows, cols)?;
        if !data.is_empty() {
            g.queue.write_buffer(t.buffer(), 0, bytemuck::cast_slice(data));
        }
        Ok(t)
    }

    /// A zero-filled `[rows, cols]` tensor (pooled buffers are cleared on the GPU).
    pub(crate) fn op_zeros(&self, rows: usize, cols: usize) -> Result<WgpuTensor> {
        let g = &self.gpu;
        g.check()?;
        let t = g.alloc("zeros", rows, cols)?;
        if t.bytes() > 0 {
            let mut b = g.batch();
            b.enc.clear_buffer(t.buffer(), 0, Some(t.bytes()));
            g.submit(b);
        }
        Ok(t)
    }

    /// Rows `start..start+n` back to the host (a sync point).
    pub(crate) fn op_download_rows(&self, t: &WgpuTensor, start: usize, n: usize) -> Result<crate::ctx::Pending<Vec<f32>>> {
        if start.checked_add(n).is_none_or(|e| e > t.rows) {
            return Err(shape_err("download_rows", format!("rows {start}..{} of {}", start.saturating_add(n), t.rows)));
        }
        self.gpu.read_f32(t, start * t.cols, n * t.cols)
    }

    /// RMSNorm over groups of `group` columns with weight `w: [1, group]` (reference §1.3).
    /// Errors: `group == 0`, `cols % group != 0` or a weight of the wrong length.
    pub(crate) fn op_rms_norm(&self, x: &WgpuTensor, w: &WgpuTensor, group: usize, eps: f32) -> Result<WgpuTensor> {
        let g = &self.gpu;
        g.check()?;
        let wl = w.rows * w.cols;
        if group == 0 || !x.cols.is_multiple_of(group) || wl != group {
            return Err(shape_err("rms_norm", format!("cols {} group {group} weight {wl}", x.cols)));
        }
        let out = g.alloc("rms_norm", x.rows, x.cols)?;
        let n_groups = (x.rows * x.cols / group) as u64;
        let mut b = g.batch();
        let params = [group as u32, n_groups as u32, eps.to_bits()];
        g.dispatch(&mut b, Kernel::RmsNorm, &params, &[Bind::t(x), Bind::t(w), Bind::t(&out)], n_groups)?;
        g.submit(b);
        Ok(out)
    }

    /// In-place NeoX RoPE with explicit positions (reference §1.3); cos/sin from the host
    /// table of [`WgpuBackend::rope_table`].
    /// Errors: one position per row, even `head_dim` dividing `cols` ([`Error::Shape`]).
    pub(crate) fn op_rope(&self, x: &mut WgpuTensor, positions: &[u32], head_dim: usize, theta: f32) -> Result<()> {
        let g = &self.gpu;
        g.check()?;
        if positions.len() != x.rows || head_dim == 0 || !head_dim.is_multiple_of(2) || !x.cols.is_multiple_of(head_dim) {
            return Err(shape_err("rope", format!("x [{}, {}], {} positions, head_dim {head_dim}", x.rows, x.cols, positions.len())));
        }
        if x.rows == 0 || x.cols == 0 {
            return Ok(());
        }
        let max_pos = positions.iter().copied().max().unwrap_or(0) as usize;
        let table = self.rope_table(head_dim, theta, max_pos)?;
        let pos = g.upload_u32(positions)?;
        let elems = x.rows * x.cols / 2;
        let groups = groups_for(elems);
        let params = [x.rows as u32, x.cols as u32, head_dim as u32, (head_dim / 2) as u32, table.n_pos as u32, groups as u32];
        let table_bytes = (table.n_pos * head_dim * 4) as u64;
        let mut b = g.batch();
        g.dispatch(
            &mut b,
            Kernel::Rope,
            &params,
            &[Bind::t(x), Bind::b(pos.buffer(), positions.len() as u64 * 4), Bind::b(&table.buffer, table_bytes)],
            groups,
        )?;
        b.keep(pos);
        g.submit(b);
        Ok(())
    }

    /// `silu(gate) * up`, elementwise. Errors: different shapes.
    pub(crate) fn op_silu_mul(&self, gate: &WgpuTensor, up: &WgpuTensor) -> Result<WgpuTensor> {
        let g = &self.gpu;
        g.check()?;
        if gate.rows != up.rows || gate.cols != up.cols {
            return Err(shape_err("silu_mul", format!("[{}, {}] vs [{}, {}]", gate.rows, gate.cols, up.rows, up.cols)));
        }
        let out = g.alloc("silu_mul", gate.rows, gate.cols)?;
        let len = gate.rows * gate.cols;
        let groups = groups_for(len);
        let mut b = g.batch();
        g.dispatch(&mut b, Kernel::SiluMul, &[len as u32, groups as u32], &[Bind::t(gate), Bind::t(up), Bind::t(&out)], groups)?;
        g.submit(b);
        Ok(out)
    }

    /// `x += y`, elementwise. Errors: different shapes.
    pub(crate) fn op_add_assign(&self, x: &mut WgpuTensor, y: &WgpuTensor) -> Result<()> {
        let g = &self.gpu;
        g.check()?;
        if x.rows != y.rows || x.cols != y.cols {
            return Err(shape_err("add_assign", format!("[{}, {}] vs [{}, {}]", x.rows, x.cols, y.rows, y.cols)));
        }
        let len = x.rows * x.cols;
        let groups = groups_for(len);
        let mut b = g.batch();
        g.dispatch(&mut b, Kernel::Add, &[len as u32, groups as u32], &[Bind::t(x), Bind::t(y)], groups)?;
        g.submit(b);
        Ok(())
    }

    /// `[T, a] ++ [T, b] ++ … → [T, a+b+…]`: one column-band copy kernel per part.
    /// Errors: parts with different row counts.
    pub(crate) fn op_concat_cols(&self, parts: &[&WgpuTensor]) -> Result<WgpuTensor> {
        let g = &self.gpu;
        g.check()?;
        let rows = parts.first().map_or(0, |p| p.rows);
        if parts.iter().any(|p| p.rows != rows) {
            return Err(shape_err("concat_cols", "parts have different row counts".into()));
        }
        let cols: usize = parts.iter().map(|p| p.cols).sum();
        let out = g.alloc("concat_cols", rows, cols)?;
        let mut b = g.batch();
        let mut off = 0usize;
        for p in parts {
            if parts.len() == 1 {
                // A single part is contiguous: a plain copy.
                if p.bytes() > 0 {
                    b.enc.copy_buffer_to_buffer(p.buffer(), 0, out.buffer(), 0, p.bytes());
                }
                continue;
            }
            let elems = p.rows * p.cols;
            let groups = groups_for(elems);
            let params = [rows as u32, p.cols as u32, cols as u32, off as u32, groups as u32];
            g.dispatch(&mut b, Kernel::CopyCols, &params, &[Bind::t(p), Bind::t(&out)], groups)?;
            off += p.cols;
        }
        g.submit(b);
        Ok(out)
    }

    /// `[a, C] ++ [b, C] ++ … → [a+b+…, C]`: buffer-to-buffer copies (rows are contiguous).
    /// Errors: parts with different column counts.
    pub(crate) fn op_concat_rows(&self, parts: &[&WgpuTensor]) -> Result<WgpuTensor> {
        let g = &self.gpu;
        g.check()?;
        let cols = parts.first().map_or(0, |p| p.cols);
        if parts.iter().any(|p| p.cols != cols) {
            return Err(shape_err("concat_rows", "parts have different column counts".into()));
        }
        let rows: usize = if cols == 0 { 0 } else { parts.iter().map(|p| p.rows).sum() };
        let out = g.alloc("concat_rows", rows, cols)?;
        let mut b = g.batch();
        let mut at = 0u64;
        for p in parts {
            if p.bytes() > 0 {
                b.enc.copy_buffer_to_buffer(p.buffer(), 0, out.buffer(), at, p.bytes());
            }
            at += p.bytes();
        }
        g.submit(b);
        Ok(out)
    }

    /// `out[i] = x[rows[i]]`. Errors: a row index `≥ x.rows` ([`Error::Shape`]).
    pub(crate) fn op_gather_rows(&self, x: &WgpuTensor, rows: &[usize]) -> Result<WgpuTensor> {
        let g = &self.gpu;
        g.check()?;
        if let Some(&r) = rows.iter().find(|&&r| r >= x.rows) {
            return Err(shape_err("gather_rows", format!("row {r} of {}", x.rows)));
        }
        let out = g.alloc("gather_rows", rows.len(), x.cols)?;
        let mut b = g.batch();
        self.encode_gather(&mut b, x, 0, rows, &out)?;
        g.submit(b);
        Ok(out)
    }

    /// Encode `out[i] = x[base + idx[i]]` into `b`.
    fn encode_gather(&self, b: &mut crate::ctx::Batch, x: &WgpuTensor, base: usize, idx: &[usize], out: &WgpuTensor) -> Result<()> {
        let g = &self.gpu;
        let elems = idx.len() * x.cols;
        if elems == 0 {
            return Ok(());
        }
        let words: Vec<u32> = idx.iter().map(|&r| r as u32).collect();
        let ib = g.upload_u32(&words)?;
        let groups = groups_for(elems);
        let params = [idx.len() as u32, x.cols as u32, base as u32, groups as u32];
        g.dispatch(b, Kernel::GatherRows, &params, &[Bind::t(x), Bind::b(ib.buffer(), words.len() as u64 * 4), Bind::t(out)], groups)?;
        b.keep(ib);
        Ok(())
    }

    /// Write `src[T, C]` into rows `at..at+T` of `dst[cap, C]` (one buffer copy).
    /// Errors: column mismatch or rows beyond the cache ([`Error::Shape`]).
    pub(crate) fn op_write_rows(&self, dst: &mut WgpuTensor, at: usize, src: &WgpuTensor) -> Result<()> {
        let g = &self.gpu;
        g.check()?;
        if src.cols != dst.cols || at.checked_add(src.rows).is_none_or(|e| e > dst.rows) {
            return Err(shape_err("write_rows", format!("[{}, {}] at row {at} into [{}, {}]", src.rows, src.cols, dst.rows, dst.cols)));
        }
        if src.bytes() > 0 {
            let mut b = g.batch();
            b.enc.copy_buffer_to_buffer(src.buffer(), 0, dst.buffer(), (at * dst.cols * 4) as u64, src.bytes());
            g.submit(b);
        }
        Ok(())
    }

    /// KV compaction (reference §4.10): gather rows `start + keep[j]` into a temporary, then
    /// copy it over rows `start..start+keep.len()` (read-all-then-write, overlap safe).
    /// Errors: a kept row beyond the cache ([`Error::Shape`]).
    pub(crate) fn op_compact_rows(&self, cache: &mut WgpuTensor, start: usize, keep: &[usize]) -> Result<()> {
        let g = &self.gpu;
        g.check()?;
        if keep.iter().any(|&k| start.checked_add(k).is_none_or(|r| r >= cache.rows)) {
            return Err(shape_err("compact_rows", format!("keep {keep:?} from row {start} of {}", cache.rows)));
        }
        if keep.is_empty() || cache.cols == 0 {
            return Ok(());
        }
        let tmp = g.alloc("compact_rows", keep.len(), cache.cols)?;
        let mut b = g.batch();
        self.encode_gather(&mut b, cache, start, keep, &tmp)?;
        b.enc.copy_buffer_to_buffer(tmp.buffer(), 0, cache.buffer(), (start * cache.cols * 4) as u64, tmp.bytes());
        g.submit(b);
        Ok(())
    }
}
