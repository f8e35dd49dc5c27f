//! Weight upload (row chunks that each fit one storage binding), embedding gather and matmul.

use crate::ctx::Bind;
use crate::pipelines::{Kernel, MatmulTile, ELEMS_PER_GROUP};
use crate::pool;
use crate::tensor::{chunk_stride, encode, rows_per_chunk, stored_chunk_bytes, transpose_rows, WeightChunk, WgpuTensor, WgpuWeight};
use crate::WgpuBackend;
use sparkling_core::{Error, Result};

fn shape_err(op: &'static str, detail: String) -> Error {
    Error::Shape { op, detail }
}

impl WgpuBackend {
    /// Upload a `[n, k]` weight in this backend's [`crate::WeightDtype`], split by rows into
    /// chunks of at most `max_storage_buffer_binding_size` bytes each, each chunk stored
    /// transposed (`[k, rows]`) for coalesced reads by the matmul kernels.
    /// Errors: `data.len() != n*k` ([`Error::Shape`]); one row larger than a binding, or an
    /// allocation failure ([`Error::Device`], naming the sizes and the limit).
    pub(crate) fn op_upload_weight(&self, data: Vec<f32>, n: usize, k: usize) -> Result<WgpuWeight> {
        let g = &self.gpu;
        g.check()?;
        if data.len() != n.saturating_mul(k) {
            return Err(shape_err("upload_weight", format!("{} values for [{n}, {k}]", data.len())));
        }
        let dt = self.weight_dtype;
        let per_chunk = rows_per_chunk(dt, k, g.max_binding);
        if per_chunk == 0 {
            return Err(Error::Device(format!(
                "upload_weight: a [{n}, {k}] {} weight is split by rows, 4 at a time, and 4 rows need {} bytes, but {} allows at most {} bytes per storage binding",
                dt.name(),
                stored_chunk_bytes(dt, k, 4),
                g.info.name,
                g.max_binding
            )));
        }
        let mut chunks = Vec::new();
        let mut row0 = 0usize;
        while row0 < n || (n == 0 && chunks.is_empty()) {
            let rows = per_chunk.min(n - row0);
            let vals = transpose_rows(&data, k, row0, rows);
            let bytes = stored_chunk_bytes(dt, k, rows);
            let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
            let buffer = pool::create_buffer(&g.device, usage, bytes.max(4), "weight chunk").map_err(|e| {
                Error::Device(format!("upload_weight: a [{n}, {k}] {} weight ({} bytes in all) does not fit: {e}", dt.name(), dt.chunk_bytes((n * k) as u64)))
            })?;
            if !vals.is_empty() {
                match dt {
                    crate::WeightDtype::F32 => g.queue.write_buffer(&buffer, 0, bytemuck::cast_slice(&vals)),
                    _ => g.queue.write_buffer(&buffer, 0, &encode(dt, &vals)),
                }
            }
            chunks.push(WeightChunk { row0, rows, stride: chunk_stride(rows), bytes, buffer });
            row0 += rows;
            if n == 0 {
                break;
            }
        }
        Ok(WgpuWeight { n, k, dtype: dt, chunks })
    }

    /// `out[i] = table[ids[i]]` → `[ids.len(), K]`; one dispatch per chunk of table rows.
    /// Errors: an id `≥ N` ([`Error::Invalid`], like the CPU backend).
    pub(crate) fn op_embedding(&self, table: &WgpuWeight, ids: &[u32]) -> Result<WgpuTensor> {
        let g = &self.gpu;
        g.check()?;
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= table.n) {
            return Err(Error::Invalid(format!("token id {bad} out of range for an embedding table of {} rows", table.n)));
        }
        let k = table.k;
        let out = g.alloc("embedding", ids.len(), k)?;
        if ids.is_empty() || k == 0 {
            return Ok(out);
        }
        let idb = g.upload_u32(ids)?;
        let elems = (ids.len() * k) as u64;
        let groups = elems.div_ceil(ELEMS_PER_GROUP);
        let mut b = g.batch();
        for c in &table.chunks {
            // Only chunks that hold one of the ids need a dispatch.
            if !ids.iter().any(|&id| (id as usize) >= c.row0 && (id as usize) < c.row0 + c.rows) {
                continue;
            }
            let params = [ids.len() as u32, k as u32, c.row0 as u32, c.rows as u32, groups as u32, c.stride as u32];
            g.dispatch(
                &mut b,
                Kernel::Embedding(table.dtype),
                &params,
                &[Bind::b(&c.buffer, c.bytes), Bind::b(idb.buffer(), ids.len() as u64 * 4), Bind::t(&out)],
                groups,
            )?;
        }
        b.keep(idb);
        g.submit(b);
        Ok(out)
    }

    /// `x[M,K] · W[N,K]ᵀ (+ bias[1,N])` → `[M, N]`; one dispatch per weight chunk, each
    /// writing its band of output columns. The kernel variant is chosen by `M` and the adapter
    /// type ([`crate::MatmulKernel`]); both give bit-identical results (see matmul.wgsl).
    /// Errors: `x.cols != K` or a bias that is not `N` values ([`Error::Shape`]).
    pub(crate) fn op_matmul(&self, x: &WgpuTensor, w: &WgpuWeight, bias: Option<&WgpuTensor>) -> Result<WgpuTensor> {
        let g = &self.gpu;
        g.check()?;
        if x.cols != w.k {
            return Err(shape_err("matmul", format!("x [{}, {}] vs W [{}, {}]", x.rows, x.cols, w.n, w.k)));
        }
        if let Some(b) = bias {
            if b.rows * b.cols != w.n {
                return Err(shape_err("matmul", format!("bias of {} for N = {}", b.rows * b.cols, w.n)));
            }
        }
        let (m, n, k) = (x.rows, w.n, w.k);
        let out = g.alloc("matmul", m, n)?;
        if m == 0 || n == 0 {
            return Ok(out);
        }
        let mut b = g.batch();
        if k == 0 {
            // An empty dot product: y = bias (or 0).
            match bias {
                Some(bt) => {
                    for r in 0..m {
                        b.enc.copy_buffer_to_buffer(bt.buffer(), 0, out.buffer(), (r * n * 4) as u64, (n * 4) as u64);
                    }
                }
                None => b.enc.clear_buffer(out.buffer(), 0, Some(out.bytes())),
            }
            g.submit(b);
            return Ok(out);
        }
        let tile = MatmulTile::pick(self.matmul_kernel, m, g.info.device_type == wgpu::DeviceType::Cpu);
        let (bm, bn) = tile.tile();
        let (bias_buf, bias_bytes, has_bias) = match bias {
            Some(t) => (t.buffer(), t.bytes(), 1u32),
            None => (&self.dummy, 16, 0u32),
        };
        for c in &w.chunks {
            let tiles_n = (c.rows as u64).div_ceil(bn);
            let total = tiles_n * (m as u64).div_ceil(bm);
            if total > u32::MAX as u64 {
                return Err(Error::Device(format!("matmul: {total} workgroups for [{m}, {k}] x [{n}, {k}]ᵀ")));
            }
            let params = [m as u32, n as u32, k as u32, c.row0 as u32, c.rows as u32, tiles_n as u32, total as u32, has_bias, c.stride as u32];
            g.dispatch(
                &mut b,
                Kernel::Matmul(w.dtype, tile),
                &params,
                &[Bind::b(&c.buffer, c.bytes), Bind::t(x), Bind::b(bias_buf, bias_bytes), Bind::t(&out)],
                total,
            )?;
        }
        g.submit(b);
        Ok(out)
    }
}
