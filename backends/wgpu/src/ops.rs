//! The [`Backend`] implementation, grouped as the trait is: buffers and weights (row chunks
//! that each fit one storage binding), compute (embedding, matmul, RMSNorm, RoPE, elementwise
//! ops, the row/column copies, attention), and the async read-backs. Each op validates shapes
//! on the host exactly as the CPU backend does, then encodes and submits without waiting; a
//! read-back ends with one buffer mapping, awaited (the selection ops record their kernels in
//! `select.rs`).

use crate::ctx::Bind;
use crate::pipelines::{Kernel, MatmulTile, ELEMS_PER_GROUP, MAX_HEAD_DIM};
use crate::quant::QFormat;
use crate::tensor::{chunk_stride, encode, rows_per_chunk, stored_chunk_bytes, transpose_rows, WeightChunk, WgpuTensor, WgpuWeight};
use crate::tensor::{WeightDtype, WeightStorage};
use crate::WgpuBackend;
use sparkling_core::select::attention_mask_mode;
use sparkling_core::{ggml, AttnMask, AttnShape, Backend, CandidateArgs, CandidateTable, DraftTree, Error, GgmlWeight, RaggedSeq, Result, SampleParams, TopK};

fn shape_err(op: &'static str, detail: String) -> Error {
    Error::Shape { op, detail }
}

/// Workgroups of a 1-D elementwise kernel over `elems` values.
fn groups_for(elems: usize) -> u64 {
    (elems as u64).div_ceil(ELEMS_PER_GROUP)
}

impl Backend for WgpuBackend {
    type Tensor = WgpuTensor;
    type Weight = WgpuWeight;

    // ---- Core ops: buffers and weights -----------------------------------------------------------

    /// Dispatches encoded, host waits, bytes written (uniform parameter blocks excepted) and
    /// buffers created on this backend's device so far.
    fn op_counts(&self) -> Option<sparkling_core::OpCounts> {
        use std::sync::atomic::Ordering::Relaxed;
        let g = &self.gpu;
        Some(sparkling_core::OpCounts {
            kernels: g.kernels.load(Relaxed),
            host_syncs: g.syncs.load(Relaxed),
            bytes_uploaded: g.uploaded.load(Relaxed),
            buffers_created: g.pool.created(),
        })
    }

    fn name(&self) -> String {
        let i = &self.gpu.info;
        // Browsers may hide the adapter name (WebGPU exposes vendor / architecture at most).
        let name = if i.name.is_empty() { format!("unnamed {:?} adapter", i.device_type) } else { i.name.clone() };
        format!("wgpu ({name}, {:?}, {} weights)", i.backend, self.weight_dtype.name())
    }

    /// Upload `data` as `[rows, cols]`. Errors: length mismatch ([`Error::Shape`]), a tensor
    /// beyond one storage binding ([`Error::Device`]).
    fn upload(&self, data: &[f32], rows: usize, cols: usize) -> Result<WgpuTensor> {
        let g = &self.gpu;
        g.check()?;
        if data.len() != rows.saturating_mul(cols) {
            return Err(shape_err("upload", format!("{} values for [{rows}, {cols}]", data.len())));
        }
        let t = g.alloc("upload", rows, cols)?;
        if !data.is_empty() {
            g.write(t.buffer(), bytemuck::cast_slice(data));
        }
        Ok(t)
    }

    /// A zero-filled `[rows, cols]` tensor (pooled buffers are cleared on the GPU).
    fn zeros(&self, rows: usize, cols: usize) -> Result<WgpuTensor> {
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

    fn shape(&self, t: &WgpuTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    /// Upload a `[n, k]` weight in this backend's [`crate::WeightDtype`] (`native`: f16), split
    /// by rows into chunks of at most `max_storage_buffer_binding_size` bytes each, each chunk
    /// stored transposed (`[k, rows]`) for coalesced reads by the matmul kernels.
    /// Errors: `data.len() != n*k` ([`Error::Shape`]); one row larger than a binding, or an
    /// allocation failure ([`Error::Device`], naming the sizes and the limit).
    fn upload_weight(&self, data: Vec<f32>, n: usize, k: usize) -> Result<WgpuWeight> {
        self.gpu.check()?;
        if data.len() != n.saturating_mul(k) {
            return Err(shape_err("upload_weight", format!("{} values for [{n}, {k}]", data.len())));
        }
        let dt = if self.weight_dtype == WeightDtype::Native { WeightDtype::F16 } else { self.weight_dtype };
        let per_chunk = rows_per_chunk(dt, k, self.gpu.max_binding);
        self.upload_chunks(
            n,
            k,
            dt.float_storage(),
            per_chunk,
            |rows| stored_chunk_bytes(dt, k, rows),
            |row0, rows| {
                let vals = transpose_rows(&data, k, row0, rows);
                match dt {
                    WeightDtype::F32 => bytemuck::cast_slice(&vals).to_vec(),
                    _ => encode(dt, &vals),
                }
            },
        )
    }

    /// Under [`WeightDtype::Native`]: the block formats of [`QFormat`] (kept as stored) and
    /// f16 (stored as f16).
    fn accepts_ggml(&self, ggml_type: u32) -> bool {
        self.weight_dtype == WeightDtype::Native && (QFormat::from_ggml(ggml_type).is_some() || ggml_type == ggml::F16)
    }

    /// Upload a GGUF tensor as stored: its blocks repacked into the chunk layout of
    /// `quant.rs` (no value changes; row padding only), read by the quantized WGSL preludes.
    /// An f16 tensor is widened and stored as f16 (exact).
    /// Errors: a byte count that does not fit `[n, k]` of the type, or `k` not a multiple of
    /// the block ([`Error::Shape`]); a type without a prelude ([`Error::Unavailable`]); a
    /// chunk of 4 rows beyond one binding or an allocation failure ([`Error::Device`]).
    fn upload_weight_ggml(&self, w: GgmlWeight) -> Result<WgpuWeight> {
        let GgmlWeight { ggml_type, n, k, bytes } = w;
        let Some(f) = QFormat::from_ggml(ggml_type) else {
            if ggml_type == ggml::F16 {
                if bytes.len() != n.saturating_mul(k).saturating_mul(2) {
                    return Err(shape_err("upload_weight_ggml", format!("{} bytes for a [{n}, {k}] f16 weight", bytes.len())));
                }
                let vals = bytes.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect();
                return self.upload_weight(vals, n, k);
            }
            return Err(Error::Unavailable(format!("upload_weight_ggml: the wgpu backend has no kernel for ggml type {ggml_type}")));
        };
        self.gpu.check()?;
        let block = f.layout().values;
        if !k.is_multiple_of(block) || bytes.len() != f.file_bytes(n, k) {
            return Err(shape_err(
                "upload_weight_ggml",
                format!("{} bytes for a [{n}, {k}] {} weight (K must be a multiple of {block}; expected {} bytes)", bytes.len(), f.name(), f.file_bytes(n, k)),
            ));
        }
        let per_chunk = f.rows_per_chunk(k, self.gpu.max_binding);
        self.upload_chunks(
            n,
            k,
            WeightStorage::Quant(f),
            per_chunk,
            |rows| f.chunk_bytes(k, rows),
            |row0, rows| bytemuck::cast_slice(&f.repack_chunk(&bytes, k, row0, rows)).to_vec(),
        )
    }

    fn weight_kernel(&self, w: &WgpuWeight) -> String {
        let how = match w.storage {
            WeightStorage::Quant(_) => "dequantized in registers",
            WeightStorage::F32 => "read as stored",
            WeightStorage::F16 | WeightStorage::Bf16 => "widened in registers",
        };
        format!("wgsl f32 fma, {} weights {how}", w.storage.name())
    }

    fn weight_shape(&self, w: &WgpuWeight) -> (usize, usize) {
        (w.n, w.k)
    }

    fn weight_bytes(&self, w: &WgpuWeight) -> usize {
        w.chunks.iter().map(|c| c.bytes as usize).sum()
    }

    // ---- Core ops: compute -----------------------------------------------------------------------

    /// `out[i] = table[ids[i]]` → `[ids.len(), K]`; one dispatch per chunk of table rows.
    /// Errors: an id `≥ N` ([`Error::Invalid`], like the CPU backend).
    fn embedding(&self, table: &WgpuWeight, ids: &[u32]) -> Result<WgpuTensor> {
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
                Kernel::Embedding(table.storage),
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
    fn matmul(&self, x: &WgpuTensor, w: &WgpuWeight, bias: Option<&WgpuTensor>) -> Result<WgpuTensor> {
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
                Kernel::Matmul(w.storage, tile),
                &params,
                &[Bind::b(&c.buffer, c.bytes), Bind::t(x), Bind::b(bias_buf, bias_bytes), Bind::t(&out)],
                total,
            )?;
        }
        g.submit(b);
        Ok(out)
    }

    /// RMSNorm over groups of `group` columns with weight `w: [1, group]` (reference §1.3).
    /// Errors: `group == 0`, `cols % group != 0` or a weight of the wrong length.
    fn rms_norm(&self, x: &WgpuTensor, w: &WgpuTensor, group: usize, eps: f32) -> Result<WgpuTensor> {
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
    fn rope(&self, x: &mut WgpuTensor, positions: &[u32], head_dim: usize, theta: f32) -> Result<()> {
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
    fn silu_mul(&self, gate: &WgpuTensor, up: &WgpuTensor) -> Result<WgpuTensor> {
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
    fn add_assign(&self, x: &mut WgpuTensor, y: &WgpuTensor) -> Result<()> {
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
    fn concat_cols(&self, parts: &[&WgpuTensor]) -> Result<WgpuTensor> {
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
    fn concat_rows(&self, parts: &[&WgpuTensor]) -> Result<WgpuTensor> {
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
    fn gather_rows(&self, x: &WgpuTensor, rows: &[usize]) -> Result<WgpuTensor> {
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

    /// Write `src[T, C]` into rows `at..at+T` of `dst[cap, C]` (one buffer copy).
    /// Errors: column mismatch or rows beyond the cache ([`Error::Shape`]).
    fn write_rows(&self, dst: &mut WgpuTensor, at: usize, src: &WgpuTensor) -> Result<()> {
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
    fn compact_rows(&self, cache: &mut WgpuTensor, start: usize, keep: &[usize]) -> Result<()> {
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

    /// Scaled dot-product attention (see [`sparkling_core::Backend::attention`]): one
    /// workgroup per (query row, head), keys visited in ascending slot order.
    /// Errors: inconsistent head geometry, a head dimension above 256, a cache shorter than
    /// `kv_len` or fewer keys than queries ([`Error::Shape`]); a bad parent ([`Error::Invalid`]).
    fn attention(&self, q: &WgpuTensor, k_cache: &WgpuTensor, v_cache: &WgpuTensor, kv_len: usize, shape: AttnShape, mask: AttnMask<'_>) -> Result<WgpuTensor> {
        let g = &self.gpu;
        g.check()?;
        check_attention(q.rows, q.cols, k_cache, v_cache, kv_len, shape)?;
        let out = g.alloc("attention", q.rows, q.cols)?;
        let mut b = g.batch();
        self.encode_attention(&mut b, q, &out, 0, q.rows, k_cache, v_cache, kv_len, shape, mask)?;
        g.submit(b);
        Ok(out)
    }

    /// Every sequence's block in place in one output: one attention dispatch per sequence
    /// reading its rows of the packed `q` and writing the same rows of the output (no gathers,
    /// no concatenation), each row computed exactly as [`Backend::attention`] computes it.
    /// Errors: as [`sparkling_core::check_ragged`] and `attention`, naming the sequence.
    fn attention_ragged(&self, q: &WgpuTensor, seqs: &[RaggedSeq<'_, WgpuTensor>], shape: AttnShape) -> Result<WgpuTensor> {
        let g = &self.gpu;
        g.check()?;
        sparkling_core::check_ragged(q.rows, seqs)?;
        for (i, s) in seqs.iter().enumerate() {
            check_attention(s.q_rows, q.cols, s.k_cache, s.v_cache, s.kv_len, shape)
                .map_err(|e| shape_err("attention_ragged", format!("sequence {i}: {e}")))?;
        }
        let out = g.alloc("attention", q.rows, q.cols)?;
        let mut b = g.batch();
        let mut r0 = 0;
        for s in seqs {
            self.encode_attention(&mut b, q, &out, r0, s.q_rows, s.k_cache, s.v_cache, s.kv_len, shape, s.mask)?;
            r0 += s.q_rows;
        }
        g.submit(b);
        Ok(out)
    }

    // ---- Read-backs ------------------------------------------------------------------------------

    async fn download_async(&self, t: &WgpuTensor) -> Result<Vec<f32>> {
        self.gpu.wait_async(self.gpu.read_f32(t, 0, t.rows * t.cols)?).await
    }

    /// Rows `start..start+n` back to the host (a sync point).
    async fn download_rows_async(&self, t: &WgpuTensor, start: usize, n: usize) -> Result<Vec<f32>> {
        if start.checked_add(n).is_none_or(|e| e > t.rows) {
            return Err(shape_err("download_rows", format!("rows {start}..{} of {}", start.saturating_add(n), t.rows)));
        }
        self.gpu.wait_async(self.gpu.read_f32(t, start * t.cols, n * t.cols)?).await
    }

    async fn argmax_async(&self, logits: &WgpuTensor) -> Result<Vec<u32>> {
        self.gpu.wait_async(self.start_argmax(logits)?).await
    }

    async fn sample_async(&self, logits: &WgpuTensor, params: SampleParams, uniforms: &[f32]) -> Result<Vec<u32>> {
        self.gpu.wait_async(self.start_sample(logits, params, uniforms)?).await
    }

    // ---- Selection ops (recorded in select.rs) ---------------------------------------------------

    async fn topk_async(&self, logits: &WgpuTensor, k: usize) -> Result<TopK> {
        self.gpu.wait_async(self.start_topk(logits, k)?).await
    }

    async fn markov_table_async(&self, base: &WgpuTensor, markov: Option<(&WgpuTensor, &WgpuTensor)>, cand: &[u32], k: usize) -> Result<CandidateTable> {
        self.gpu.wait_async(self.start_markov_table(base, markov, cand, k)?).await
    }

    async fn candidate_table_async(&self, a: CandidateArgs<'_, WgpuTensor>) -> Result<CandidateTable> {
        self.gpu.wait_async(self.start_candidate_table(a)?).await
    }

    async fn sparkling_tree_async(&self, a: CandidateArgs<'_, WgpuTensor>, budget: usize) -> Result<Option<DraftTree>> {
        self.gpu.wait_async(self.start_sparkling_tree(a, budget)?).await
    }
}

impl WgpuBackend {
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
}

impl WgpuBackend {
    /// Upload a `[n, k]` weight in `storage` as row chunks of `per_chunk` rows (the last one
    /// shorter), chunk `rows` rows taking `chunk_bytes(rows)` bytes filled by
    /// `fill(row0, rows)`. Errors: `per_chunk == 0` (4 rows beyond one binding) or an
    /// allocation failure ([`Error::Device`], naming the sizes and the limit).
    fn upload_chunks(
        &self,
        n: usize,
        k: usize,
        storage: WeightStorage,
        per_chunk: usize,
        chunk_bytes: impl Fn(usize) -> u64,
        fill: impl Fn(usize, usize) -> Vec<u8>,
    ) -> Result<WgpuWeight> {
        let g = &self.gpu;
        let name = storage.name();
        if per_chunk == 0 {
            return Err(Error::Device(format!(
                "upload_weight: a [{n}, {k}] {name} weight is split by rows, 4 at a time, and 4 rows need {} bytes, but {} allows at most {} bytes per storage binding",
                chunk_bytes(4),
                g.info.name,
                g.max_binding
            )));
        }
        let mut chunks = Vec::new();
        let mut row0 = 0usize;
        while row0 < n || (n == 0 && chunks.is_empty()) {
            let rows = per_chunk.min(n - row0);
            let bytes = chunk_bytes(rows);
            let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
            let buffer = g
                .pool
                .create(usage, bytes.max(4), "weight chunk")
                .map_err(|e| Error::Device(format!("upload_weight: a [{n}, {k}] {name} weight does not fit: {e}")))?;
            let data = if rows > 0 { fill(row0, rows) } else { Vec::new() };
            if !data.is_empty() {
                g.write(&buffer, &data);
            }
            chunks.push(WeightChunk { row0, rows, stride: chunk_stride(rows), bytes, buffer });
            row0 += rows;
            if n == 0 {
                break;
            }
        }
        Ok(WgpuWeight { n, k, storage, chunks })
    }
}

/// The shape checks of one attention block: `t` query rows of `q_cols` columns against caches
/// of `kv_len` valid rows. Errors: [`Error::Shape`] naming what does not fit.
fn check_attention(t: usize, q_cols: usize, k_cache: &WgpuTensor, v_cache: &WgpuTensor, kv_len: usize, shape: AttnShape) -> Result<()> {
    let AttnShape { n_heads, n_kv_heads, head_dim } = shape;
    if n_kv_heads == 0 || n_heads % n_kv_heads != 0 || q_cols != n_heads * head_dim {
        return Err(shape_err("attention", format!("q [{t}, {q_cols}] for {n_heads}x{head_dim} heads / {n_kv_heads} kv")));
    }
    if k_cache.cols != n_kv_heads * head_dim || v_cache.cols != k_cache.cols || v_cache.rows != k_cache.rows || kv_len > k_cache.rows || t > kv_len {
        return Err(shape_err("attention", format!("kv [{}, {}] len {kv_len} for {t} queries", k_cache.rows, k_cache.cols)));
    }
    if head_dim > MAX_HEAD_DIM {
        return Err(shape_err("attention", format!("head_dim {head_dim} above the kernel's maximum of {MAX_HEAD_DIM}")));
    }
    Ok(())
}

impl WgpuBackend {
    /// Encode attention.wgsl for query rows `row0 .. row0 + t` of `q` into the same rows of
    /// `out` (shapes checked by [`check_attention`]). Errors: a tree mask of the wrong length,
    /// a failed allocation or dispatch.
    #[allow(clippy::too_many_arguments)]
    fn encode_attention(
        &self,
        b: &mut crate::ctx::Batch,
        q: &WgpuTensor,
        out: &WgpuTensor,
        row0: usize,
        t: usize,
        k_cache: &WgpuTensor,
        v_cache: &WgpuTensor,
        kv_len: usize,
        shape: AttnShape,
        mask: AttnMask<'_>,
    ) -> Result<()> {
        let g = &self.gpu;
        let AttnShape { n_heads, n_kv_heads, head_dim } = shape;
        let prefix = kv_len - t;
        let (mode, table) = attention_mask_mode(mask, t)?;
        if t == 0 || head_dim == 0 || n_heads == 0 {
            return Ok(());
        }
        let tree_buf = match &table {
            Some(words) => Some(g.upload_u32(words)?),
            None => None,
        };
        let (tb, tbytes) = match (&tree_buf, &table) {
            (Some(b), Some(w)) => (b.buffer(), w.len() as u64 * 4),
            _ => (&self.dummy, 16),
        };
        let total = (t * n_heads) as u64;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let params = [
            t as u32,
            kv_len as u32,
            prefix as u32,
            n_heads as u32,
            (n_heads / n_kv_heads) as u32,
            head_dim as u32,
            q.cols as u32,
            k_cache.cols as u32,
            mode,
            scale.to_bits(),
            total as u32,
            row0 as u32,
        ];
        let kv_bytes = (kv_len * k_cache.cols * 4) as u64;
        g.dispatch(
            b,
            Kernel::Attention,
            &params,
            &[Bind::t(q), Bind::b(k_cache.buffer(), kv_bytes), Bind::b(v_cache.buffer(), kv_bytes), Bind::b(tb, tbytes), Bind::t(out)],
            total,
        )?;
        if let Some(tb) = tree_buf {
            b.keep(tb);
        }
        Ok(())
    }
}
