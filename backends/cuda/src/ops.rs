//! The [`Backend`] implementation, grouped as the trait is: buffers and weights, compute
//! (embedding, matmul, RMSNorm, RoPE, elementwise ops, the row/column copies, attention), the
//! read-backs and the selection ops (their kernel launches are in `select.rs`, `linear.rs`
//! and `attention.rs`). Each op validates shapes on the host exactly as the CPU backend does,
//! then enqueues its kernel or copy without waiting; a read-back ends with one device→host
//! copy, so its future is ready when first polled.

use crate::attention::{AttParams, CHUNK, MAX_HEAD_DIM, MAX_PARTIAL_FLOATS, MAX_SPLITS, THREADS};
use crate::linear::to_i32;
use crate::select::{cfg, TableLaunch, TOPK_MAX};
use crate::tensor::{CudaTensor, CudaWeight, WeightData, WeightDtype};
use crate::{dev, grid_1d, shape_err, to_u32, CudaBackend};
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use sparkling_core::select::{self, attention_mask_mode, check_markov_table_args};
use sparkling_core::{AttnMask, AttnShape, Backend, CandidateArgs, CandidateTable, DraftTree, Error, Result, SampleParams, TopK};
use std::ffi::c_void;

/// Threads per block of rms_norm.cu (`RMS_THREADS`).
const RMS_THREADS: u32 = 256;

impl Backend for CudaBackend {
    type Tensor = CudaTensor;
    type Weight = CudaWeight;

    // ---- Core ops: buffers and weights -----------------------------------------------------------

    fn name(&self) -> String {
        let i = &self.info;
        format!(
            "cuda ({}, sm_{}{}, {}, {} weights, {}-row GEMM blocks)",
            i.name,
            i.compute_capability.0,
            i.compute_capability.1,
            self.kernel_target(),
            self.weight_dtype.name(),
            self.row_block
        )
    }

    /// Upload `data` as `[rows, cols]`. Errors: length mismatch ([`Error::Shape`]).
    fn upload(&self, data: &[f32], rows: usize, cols: usize) -> Result<CudaTensor> {
        if Some(data.len()) != rows.checked_mul(cols) {
            return Err(shape_err("upload", format!("{} values for [{rows}, {cols}]", data.len())));
        }
        Ok(CudaTensor { rows, cols, buf: self.upload_slice("upload", data)? })
    }

    /// Kernels launched (NVRTC kernels and cuBLAS GEMM calls), device→host copies and
    /// synchronizations, bytes copied host→device and device allocations so far.
    fn op_counts(&self) -> Option<sparkling_core::OpCounts> {
        Some(self.counts.snapshot())
    }

    /// A zero-filled `[rows, cols]` tensor.
    fn zeros(&self, rows: usize, cols: usize) -> Result<CudaTensor> {
        let n = rows.checked_mul(cols).ok_or_else(|| shape_err("zeros", format!("[{rows}, {cols}] overflows")))?;
        crate::Counters::add(&self.counts.allocs, 1);
        let buf = self.stream.alloc_zeros::<f32>(n.max(1)).map_err(|e| Error::Device(format!("zeros: allocating [{rows}, {cols}]: {e}")))?;
        Ok(CudaTensor { rows, cols, buf })
    }

    fn shape(&self, t: &CudaTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    /// Upload a `[n, k]` weight in this backend's [`WeightDtype`] (bf16: round to nearest even).
    /// Errors: `data.len() != n*k` ([`Error::Shape`]); allocation failure ([`Error::Device`]).
    fn upload_weight(&self, data: Vec<f32>, n: usize, k: usize) -> Result<CudaWeight> {
        if Some(data.len()) != n.checked_mul(k) {
            return Err(shape_err("upload_weight", format!("{} values for [{n}, {k}]", data.len())));
        }
        let data = match self.weight_dtype {
            WeightDtype::F32 => WeightData::F32(self.upload_slice("upload_weight", &data)?),
            WeightDtype::Bf16 => {
                let bits: Vec<u16> = data.iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect();
                WeightData::Bf16(self.upload_slice("upload_weight", &bits)?)
            }
        };
        Ok(CudaWeight { n, k, data })
    }

    fn weight_shape(&self, w: &CudaWeight) -> (usize, usize) {
        (w.n, w.k)
    }

    fn weight_bytes(&self, w: &CudaWeight) -> usize {
        match &w.data {
            WeightData::F32(s) => 4 * s.len(),
            WeightData::Bf16(s) => 2 * s.len(),
        }
    }

    // ---- Core ops: compute -----------------------------------------------------------------------

    /// `out[i] = table[ids[i]]` → `[ids.len(), K]` (shaders/cuda/embedding.cu).
    /// Errors: an id `≥ N` ([`Error::Invalid`], like the CPU backend).
    fn embedding(&self, table: &CudaWeight, ids: &[u32]) -> Result<CudaTensor> {
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= table.n) {
            return Err(Error::Invalid(format!("token id {bad} out of range for an embedding table of {} rows", table.n)));
        }
        let k = table.k;
        let n = ids.len() * k;
        let mut out = self.alloc_f32("embedding", n)?;
        if n > 0 {
            let idb = self.upload_u32_cached("embedding", ids)?;
            let (ni, k32) = (to_u32("embedding", "ids", ids.len())?, to_u32("embedding", "cols", k)?);
            let cfg = grid_1d(n);
            match &table.data {
                WeightData::F32(t) => {
                    let mut b = self.launch_builder(self.k.get("embedding_f32"));
                    b.arg(t).arg(idb.as_ref()).arg(&ni).arg(&k32).arg(&mut out);
                    // SAFETY: ids < N checked above; out holds ids.len()*K values.
                    unsafe { b.launch(cfg) }.map_err(dev("embedding"))?;
                }
                WeightData::Bf16(t) => {
                    let mut b = self.launch_builder(self.k.get("embedding_bf16"));
                    b.arg(t).arg(idb.as_ref()).arg(&ni).arg(&k32).arg(&mut out);
                    // SAFETY: as above.
                    unsafe { b.launch(cfg) }.map_err(dev("embedding"))?;
                }
            }
        }
        Ok(CudaTensor { rows: ids.len(), cols: k, buf: out })
    }

    /// `x[M,K] · W[N,K]ᵀ (+ bias[1,N])` → `[M, N]` on cuBLAS, in blocks of exactly
    /// `row_block` rows (module docs). Errors: `x.cols != K` or a bias that is not `N` values
    /// ([`Error::Shape`]); sizes beyond cuBLAS's 32-bit dimensions or a cuBLAS failure
    /// ([`Error::Device`]).
    fn matmul(&self, x: &CudaTensor, w: &CudaWeight, bias: Option<&CudaTensor>) -> Result<CudaTensor> {
        if x.cols != w.k {
            return Err(shape_err("matmul", format!("x [{}, {}] vs W [{}, {}]", x.rows, x.cols, w.n, w.k)));
        }
        if let Some(b) = bias {
            if b.len() != w.n {
                return Err(shape_err("matmul", format!("bias of {} for N = {}", b.len(), w.n)));
            }
        }
        let (m, n, k) = (x.rows, w.n, w.k);
        if m == 0 || n == 0 {
            return Ok(CudaTensor { rows: m, cols: n, buf: self.alloc_f32("matmul", m * n)? });
        }
        if k == 0 {
            // An empty dot product: y = bias (or 0) on every row.
            let mut y = self.zeros(m, n)?;
            if let Some(b) = bias {
                self.add_bias(&mut y.buf, b, m, n)?;
            }
            return Ok(y);
        }
        let rb = self.row_block;
        let blocks = m.div_ceil(rb);
        let mp = blocks * rb;
        let (m32, k32, mp32) = (to_u32("matmul", "rows", m)?, to_u32("matmul", "K", k)?, to_u32("matmul", "padded rows", mp)?);
        let (ni, ki, rbi) = (to_i32(n)?, to_i32(k)?, to_i32(rb)?);
        let mut y = self.alloc_f32("matmul", mp * n)?;
        let blas = self.blas.lock().unwrap_or_else(|e| e.into_inner());
        let handle = *blas.handle();
        let (alpha, beta) = (1.0f32, 0.0f32);
        match &w.data {
            WeightData::F32(wd) => {
                let mut xp = self.alloc_f32("matmul", mp * k)?;
                let mut b = self.launch_builder(self.k.get("pack_f32"));
                b.arg(&x.buf).arg(&m32).arg(&k32).arg(&mp32).arg(&mut xp);
                // SAFETY: x holds M*K values, xp Mp*K.
                unsafe { b.launch(grid_1d(mp * k)) }.map_err(dev("matmul"))?;
                let (wp, _r1) = wd.device_ptr(&self.stream);
                let (xb, _r2) = xp.device_ptr(&self.stream);
                let (yb, _r3) = y.device_ptr_mut(&self.stream);
                for blk in 0..blocks {
                    let xo = xb + (blk * rb * k * 4) as u64;
                    let yo = yb + (blk * rb * n * 4) as u64;
                    crate::Counters::add(&self.counts.kernels, 1);
                    // SAFETY: W is K×N (lda K), the x block K×rb (ldb K), the y block N×rb
                    // (ldc N), all inside their allocations; host alpha/beta.
                    unsafe {
                        cudarc::cublas::result::sgemm(
                            handle,
                            cublasOperation_t::CUBLAS_OP_T,
                            cublasOperation_t::CUBLAS_OP_N,
                            ni,
                            rbi,
                            ki,
                            &alpha,
                            wp as *const f32,
                            ki,
                            xo as *const f32,
                            ki,
                            &beta,
                            yo as *mut f32,
                            ni,
                        )
                    }
                    .map_err(|e| Error::Device(format!("matmul: cublasSgemm [{rb}, {k}]·[{n}, {k}]ᵀ: {e}")))?;
                }
            }
            WeightData::Bf16(wd) => {
                let mut xp = self.alloc::<u16>("matmul", mp * k)?;
                let mut b = self.launch_builder(self.k.get("pack_bf16"));
                b.arg(&x.buf).arg(&m32).arg(&k32).arg(&mp32).arg(&mut xp);
                // SAFETY: x holds M*K values, xp Mp*K.
                unsafe { b.launch(grid_1d(mp * k)) }.map_err(dev("matmul"))?;
                let (wp, _r1) = wd.device_ptr(&self.stream);
                let (xb, _r2) = xp.device_ptr(&self.stream);
                let (yb, _r3) = y.device_ptr_mut(&self.stream);
                for blk in 0..blocks {
                    let xo = xb + (blk * rb * k * 2) as u64;
                    let yo = yb + (blk * rb * n * 4) as u64;
                    crate::Counters::add(&self.counts.kernels, 1);
                    // SAFETY: as the f32 case; A/B bf16, C f32, f32 compute.
                    unsafe {
                        cudarc::cublas::result::gemm_ex(
                            handle,
                            cublasOperation_t::CUBLAS_OP_T,
                            cublasOperation_t::CUBLAS_OP_N,
                            ni,
                            rbi,
                            ki,
                            &alpha as *const f32 as *const c_void,
                            wp as *const c_void,
                            cudaDataType::CUDA_R_16BF,
                            ki,
                            xo as *const c_void,
                            cudaDataType::CUDA_R_16BF,
                            ki,
                            &beta as *const f32 as *const c_void,
                            yo as *mut c_void,
                            cudaDataType::CUDA_R_32F,
                            ni,
                            cublasComputeType_t::CUBLAS_COMPUTE_32F,
                            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                        )
                    }
                    .map_err(|e| Error::Device(format!("matmul: cublasGemmEx bf16 [{rb}, {k}]·[{n}, {k}]ᵀ: {e}")))?;
                }
            }
        }
        drop(blas);
        if let Some(b) = bias {
            self.add_bias(&mut y, b, m, n)?;
        }
        Ok(CudaTensor { rows: m, cols: n, buf: y })
    }

    /// RMSNorm over groups of `group` columns with weight `w: [1, group]` (reference §1.3),
    /// shaders/cuda/rms_norm.cu. Errors: `group == 0`, `cols % group != 0` or a weight of the
    /// wrong length ([`Error::Shape`]).
    fn rms_norm(&self, x: &CudaTensor, w: &CudaTensor, group: usize, eps: f32) -> Result<CudaTensor> {
        let wl = w.len();
        if group == 0 || !x.cols.is_multiple_of(group) || wl != group {
            return Err(shape_err("rms_norm", format!("cols {} group {group} weight {wl}", x.cols)));
        }
        let mut out = self.alloc_f32("rms_norm", x.len())?;
        let n_groups = x.len() / group;
        if n_groups > 0 {
            let g = to_u32("rms_norm", "group", group)?;
            let cfg = LaunchConfig { grid_dim: (to_u32("rms_norm", "groups", n_groups)?, 1, 1), block_dim: (RMS_THREADS, 1, 1), shared_mem_bytes: 0 };
            let mut b = self.launch_builder(self.k.get("rms_norm"));
            b.arg(&x.buf).arg(&w.buf).arg(&mut out).arg(&g).arg(&eps);
            // SAFETY: x and out hold n_groups*group values, w holds group values.
            unsafe { b.launch(cfg) }.map_err(dev("rms_norm"))?;
        }
        Ok(CudaTensor { rows: x.rows, cols: x.cols, buf: out })
    }

    /// In-place NeoX RoPE with explicit positions (reference §1.3), shaders/cuda/rope.cu.
    /// Errors: not one position per row, or an odd `head_dim` not dividing `cols`.
    fn rope(&self, x: &mut CudaTensor, positions: &[u32], head_dim: usize, theta: f32) -> Result<()> {
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
        let mut b = self.launch_builder(self.k.get("rope"));
        b.arg(&mut x.buf).arg(&rows).arg(&cols).arg(&hd).arg(pos.as_ref()).arg(inv_freq.as_ref());
        // SAFETY: x holds rows*cols values, pos one per row, inv_freq head_dim/2.
        unsafe { b.launch(cfg) }.map_err(dev("rope"))?;
        Ok(())
    }

    /// `silu(gate) * up`, elementwise (shaders/cuda/silu_mul.cu). Errors: different shapes.
    fn silu_mul(&self, gate: &CudaTensor, up: &CudaTensor) -> Result<CudaTensor> {
        if gate.rows != up.rows || gate.cols != up.cols {
            return Err(shape_err("silu_mul", format!("[{}, {}] vs [{}, {}]", gate.rows, gate.cols, up.rows, up.cols)));
        }
        let n = gate.len();
        let mut out = self.alloc_f32("silu_mul", n)?;
        if n > 0 {
            let n32 = to_u32("silu_mul", "elements", n)?;
            let mut b = self.launch_builder(self.k.get("silu_mul"));
            b.arg(&gate.buf).arg(&up.buf).arg(&mut out).arg(&n32);
            // SAFETY: all three buffers hold n values.
            unsafe { b.launch(grid_1d(n)) }.map_err(dev("silu_mul"))?;
        }
        Ok(CudaTensor { rows: gate.rows, cols: gate.cols, buf: out })
    }

    /// `x += y`, elementwise (shaders/cuda/add.cu). Errors: different shapes.
    fn add_assign(&self, x: &mut CudaTensor, y: &CudaTensor) -> Result<()> {
        if x.rows != y.rows || x.cols != y.cols {
            return Err(shape_err("add_assign", format!("[{}, {}] vs [{}, {}]", x.rows, x.cols, y.rows, y.cols)));
        }
        let n = x.len();
        if n > 0 {
            let n32 = to_u32("add_assign", "elements", n)?;
            let mut b = self.launch_builder(self.k.get("add_assign"));
            b.arg(&mut x.buf).arg(&y.buf).arg(&n32);
            // SAFETY: both buffers hold n values.
            unsafe { b.launch(grid_1d(n)) }.map_err(dev("add_assign"))?;
        }
        Ok(())
    }

    /// `[T, a] ++ [T, b] ++ … → [T, a+b+…]`: one column-band copy kernel per part (a plain
    /// copy for a single part). Errors: parts with different row counts.
    fn concat_cols(&self, parts: &[&CudaTensor]) -> Result<CudaTensor> {
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
                let mut b = self.launch_builder(self.k.get("copy_cols"));
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
    fn concat_rows(&self, parts: &[&CudaTensor]) -> Result<CudaTensor> {
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
    fn gather_rows(&self, x: &CudaTensor, rows: &[usize]) -> Result<CudaTensor> {
        if let Some(&r) = rows.iter().find(|&&r| r >= x.rows) {
            return Err(shape_err("gather_rows", format!("row {r} of {}", x.rows)));
        }
        let mut out = self.alloc_f32("gather_rows", rows.len() * x.cols)?;
        self.encode_gather("gather_rows", x, 0, rows, &mut out)?;
        Ok(CudaTensor { rows: rows.len(), cols: x.cols, buf: out })
    }

    /// Write `src[T, C]` into rows `at..at+T` of `dst[cap, C]` (one device copy).
    /// Errors: column mismatch or rows beyond the cache ([`Error::Shape`]).
    fn write_rows(&self, dst: &mut CudaTensor, at: usize, src: &CudaTensor) -> Result<()> {
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
    fn compact_rows(&self, cache: &mut CudaTensor, start: usize, keep: &[usize]) -> Result<()> {
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

    /// Scaled dot-product attention (see [`sparkling_core::Backend::attention`]).
    /// Errors: inconsistent head geometry, a head dimension above 256, a cache shorter than
    /// `kv_len` or fewer keys than queries ([`sparkling_core::Error::Shape`]); a bad parent ([`sparkling_core::Error::Invalid`]).
    fn attention(&self, q: &CudaTensor, k_cache: &CudaTensor, v_cache: &CudaTensor, kv_len: usize, shape: AttnShape, mask: AttnMask<'_>) -> Result<CudaTensor> {
        let AttnShape { n_heads, n_kv_heads, head_dim } = shape;
        let t = q.rows;
        if n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) || q.cols != n_heads * head_dim {
            return Err(shape_err("attention", format!("q [{t}, {}] for {n_heads}x{head_dim} heads / {n_kv_heads} kv", q.cols)));
        }
        if k_cache.cols != n_kv_heads * head_dim || v_cache.cols != k_cache.cols || v_cache.rows != k_cache.rows || kv_len > k_cache.rows || t > kv_len {
            return Err(shape_err("attention", format!("kv [{}, {}] len {kv_len} for {t} queries", k_cache.rows, k_cache.cols)));
        }
        if head_dim > MAX_HEAD_DIM {
            return Err(shape_err("attention", format!("head_dim {head_dim} above the kernel's maximum of {MAX_HEAD_DIM}")));
        }
        let prefix = kv_len - t;
        let (mode, table) = attention_mask_mode(mask, t)?;
        let mut out = self.alloc_f32("attention", t * q.cols)?;
        if t == 0 || head_dim == 0 || n_heads == 0 {
            return Ok(CudaTensor { rows: t, cols: q.cols, buf: out });
        }
        let tree = self.upload_u32_cached("attention tree", table.as_deref().unwrap_or(&[0]))?;
        // The most splits any row of this call can need: n_vis ≤ kv_len, and splits(n) = the
        // chunk count up to MAX_SPLITS chunks, at most MAX_SPLITS beyond (not monotone there).
        let s_max = kv_len.div_ceil(CHUNK).clamp(1, MAX_SPLITS);
        let per_row = n_heads * s_max * (head_dim + 2);
        let rows_per_launch = (MAX_PARTIAL_FLOATS / per_row).clamp(1, t);
        let mut part_m = self.alloc_f32("attention", rows_per_launch * n_heads * s_max)?;
        let mut part_l = self.alloc_f32("attention", rows_per_launch * n_heads * s_max)?;
        let mut part_o = self.alloc_f32("attention", rows_per_launch * n_heads * s_max * head_dim)?;
        let mut p = AttParams {
            t: to_u32("attention", "rows", t)?,
            kv_len: to_u32("attention", "kv_len", kv_len)?,
            prefix: prefix as u32,
            n_heads: to_u32("attention", "heads", n_heads)?,
            group: (n_heads / n_kv_heads) as u32,
            head_dim: head_dim as u32,
            q_cols: to_u32("attention", "q cols", q.cols)?,
            kv_cols: to_u32("attention", "kv cols", k_cache.cols)?,
            mode,
            scale: 1.0 / (head_dim as f32).sqrt(),
            row0: 0,
            splits_max: s_max as u32,
        };
        let mut row0 = 0usize;
        while row0 < t {
            let rows = rows_per_launch.min(t - row0);
            p.row0 = row0 as u32;
            let blocks = to_u32("attention", "blocks", rows * n_heads * s_max)?;
            let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
            let mut b = self.launch_builder(self.k.get("attention_split"));
            b.arg(&p).arg(&q.buf).arg(&k_cache.buf).arg(&v_cache.buf).arg(tree.as_ref()).arg(&mut part_m).arg(&mut part_l).arg(&mut part_o);
            // SAFETY: shapes checked above; partial buffers sized for rows_per_launch rows.
            unsafe { b.launch(cfg) }.map_err(dev("attention"))?;
            let cfg = LaunchConfig { grid_dim: (to_u32("attention", "blocks", rows * n_heads)?, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
            let mut b = self.launch_builder(self.k.get("attention_combine"));
            b.arg(&p).arg(tree.as_ref()).arg(&part_m).arg(&part_l).arg(&part_o).arg(&mut out);
            // SAFETY: as above; out holds t*q_cols values.
            unsafe { b.launch(cfg) }.map_err(dev("attention"))?;
            row0 += rows;
        }
        Ok(CudaTensor { rows: t, cols: q.cols, buf: out })
    }

    // ---- Read-backs ------------------------------------------------------------------------------

    async fn download_async(&self, t: &CudaTensor) -> Result<Vec<f32>> {
        self.download_rows_async(t, 0, t.rows).await
    }

    /// Rows `start..start+n` back to the host (a sync point). Errors: rows beyond the tensor.
    async fn download_rows_async(&self, t: &CudaTensor, start: usize, n: usize) -> Result<Vec<f32>> {
        if start.checked_add(n).is_none_or(|e| e > t.rows) {
            return Err(shape_err("download_rows", format!("rows {start}..{} of {}", start.saturating_add(n), t.rows)));
        }
        if n == 0 || t.cols == 0 {
            return Ok(Vec::new());
        }
        crate::Counters::add(&self.counts.syncs, 1);
        self.stream.clone_dtoh(&t.buf.slice(start * t.cols..(start + n) * t.cols)).map_err(|e| Error::Device(format!("download: device→host copy: {e}")))
    }

    /// Row-wise argmax on the device (lowest index on ties, NaN never wins), then a read-back of
    /// one `u32` per row.
    async fn argmax_async(&self, logits: &CudaTensor) -> Result<Vec<u32>> {
        let rows = logits.rows;
        if rows == 0 {
            return Ok(Vec::new());
        }
        if logits.cols == 0 {
            return Ok(vec![0; rows]);
        }
        let mut ids = self.alloc::<u32>("argmax", rows)?;
        let c = to_u32("argmax", "cols", logits.cols)?;
        let mut b = self.launch_builder(self.k.get("argmax_rows"));
        b.arg(&logits.buf).arg(&c).arg(&mut ids);
        // SAFETY: logits holds rows*cols values, ids rows.
        unsafe { b.launch(cfg(to_u32("argmax", "rows", rows)?, 256)) }.map_err(dev("argmax"))?;
        self.read("argmax", &ids, rows)
    }

    /// Row-wise sampling on the device (shaders/cuda/sample.cu: the CPU's inverse-CDF draw in
    /// ascending id order after top-k / top-p, f64 sums). `T < 1e-5` → argmax.
    /// Errors: `uniforms.len() != rows` ([`Error::Shape`]).
    async fn sample_async(&self, logits: &CudaTensor, params: SampleParams, uniforms: &[f32]) -> Result<Vec<u32>> {
        let rows = logits.rows;
        if uniforms.len() != rows {
            return Err(shape_err("sample", format!("{} uniforms for {rows} rows", uniforms.len())));
        }
        if params.temperature < 1e-5 {
            return self.argmax_async(logits).await;
        }
        if rows == 0 {
            return Ok(Vec::new());
        }
        if logits.cols == 0 {
            return Ok(vec![0; rows]);
        }
        let cols = to_u32("sample", "cols", logits.cols)?;
        let inv_t = 1.0 / params.temperature as f64;
        let top_k = u32::try_from(params.top_k).unwrap_or(u32::MAX);
        let top_p = params.top_p;
        let u = self.upload_slice("sample", uniforms)?;
        let pbuf = if top_p < 1.0 { Some(self.alloc::<f64>("sample", rows * logits.cols)?) } else { None };
        let mut out = self.alloc::<u32>("sample", rows)?;
        let null = 0u64;
        let mut b = self.launch_builder(self.k.get("sample_rows"));
        b.arg(&logits.buf).arg(&cols).arg(&inv_t).arg(&top_k).arg(&top_p).arg(&u);
        match &pbuf {
            Some(p) => b.arg(p),
            None => b.arg(&null),
        };
        b.arg(&mut out);
        // SAFETY: logits rows*cols, uniforms rows, pbuf rows*cols f64 or a null pointer, out rows.
        unsafe { b.launch(cfg(to_u32("sample", "rows", rows)?, 1024)) }.map_err(dev("sample"))?;
        self.read("sample", &out, rows)
    }

    // ---- Selection ops (kernel launches in select.rs) --------------------------------------------

    /// Row-wise top-k + log-sum-exp (see [`sparkling_core::Backend::topk_async`]). `k ≤ 2048` runs on the device
    /// (two-stage exact selection, shaders/cuda/topk.cu); a larger k (beyond any tree budget)
    /// reads the logits back and uses the host reference (`sparkling_core::select`). Errors: `k == 0` ([`Error::Invalid`]).
    async fn topk_async(&self, logits: &CudaTensor, k: usize) -> Result<TopK> {
        if k == 0 {
            return Err(Error::Invalid("topk: k must be at least 1".into()));
        }
        let (rows, cols) = (logits.rows, logits.cols);
        let k = k.min(cols);
        if rows == 0 || k == 0 {
            // As the CPU backend: an empty result (no lse either) when there is nothing to rank.
            return Ok(TopK { k, ids: Vec::new(), vals: Vec::new(), lse: Vec::new() });
        }
        if k > TOPK_MAX {
            return select::topk(&self.download_async(logits).await?, rows, cols, k);
        }
        let (ids, vals, lse) = self.launch_topk(logits, k)?;
        Ok(TopK { k, ids: self.read("topk", &ids, rows * k)?, vals: self.read("topk", &vals, rows * k)?, lse: self.read("topk", &lse, rows)? })
    }

    /// The Markov candidate table on the device (see [`sparkling_core::Backend::markov_table_async`];
    /// shaders/cuda/markov_table.cu). `k` beyond 2048 (after clamping to the candidate count)
    /// falls back to the host reference (`sparkling_core::select`) on read-back copies. Errors
    /// as the trait documents (the shared checks of `sparkling_core::select`).
    async fn markov_table_async(&self, base: &CudaTensor, markov: Option<(&CudaTensor, &CudaTensor)>, cand: &[u32], k: usize) -> Result<CandidateTable> {
        let vocab = base.cols;
        check_markov_table_args(vocab, markov.map(|(a, b)| ((a.rows, a.cols), (b.rows, b.cols))), cand, k)?;
        let (ld, n) = (base.rows, cand.len());
        let k = k.min(n);
        if ld == 0 {
            return Ok(CandidateTable { cand: cand.to_vec(), ld, k, vals: Vec::new(), slots: Vec::new() });
        }
        if k > TOPK_MAX {
            let b = self.download_async(base).await?;
            let m = match markov {
                Some((w1, w2)) => Some((self.download_async(w1).await?, self.download_async(w2).await?, w1.cols)),
                None => None,
            };
            return Ok(select::markov_table(&b, ld, vocab, m.as_ref().map(|(a, c, r)| (a.as_slice(), c.as_slice(), *r)), cand, k));
        }
        // The kernels read the candidates as [n, id_0, ..., id_{n-1}] (candidate_union.cu's layout).
        let mut words = Vec::with_capacity(n + 1);
        words.push(to_u32("markov_table", "candidates", n)?);
        words.extend_from_slice(cand);
        let cand_dev = self.upload_slice("markov_table", &words)?;
        let mut vals = self.alloc::<f32>("markov_table", ld * n * k)?;
        let mut slots = self.alloc::<u32>("markov_table", ld * n * k)?;
        self.launch_markov_table(
            TableLaunch { op: "markov_table", base, markov, cand: &cand_dev, n_max: n, k },
            &mut vals.slice_mut(..),
            &mut slots.slice_mut(..),
        )?;
        Ok(CandidateTable {
            cand: cand.to_vec(),
            ld,
            k,
            vals: self.read("markov_table", &vals, ld * n * k)?,
            slots: self.read("markov_table", &slots, ld * n * k)?,
        })
    }

    /// SparklingTree tree prep with ONE read-back ([`sparkling_core::Backend::candidate_table_async`]): topk.cu
    /// writes the per-row top-`candidates` ids into a device buffer `[ld, C]` (not read back);
    /// candidate_union.cu (one block, a `ceil(V/32)`-word bitmap) turns them and the anchor into
    /// `[n, ascending distinct ids]`; markov_table.cu reads n from that header word (grids
    /// sized for `n_max = min(ld·C + 1, V)`, blocks past n exit, the table packed with the
    /// actual n); the candidate buffer is copied (device to device) in front of the table and
    /// `1 + n_max + 2·ld·n_max·k'` words (`k' = min(k, n_max)`) come back in one copy.
    ///
    /// `candidates ≥ V`: the whole vocabulary and the plain [`Backend::markov_table_async`].
    /// `ld == 0`: `cand = [anchor]`, an empty table, no device work. `C` or `k'` above the
    /// device top-k limit (2048): the trait's default composition (topk + host union +
    /// markov_table, which fall back to the CPU reference themselves).
    /// Errors: `k == 0`, `candidates == 0`, `anchor ≥ V` ([`Error::Invalid`]); W1/W2 not
    /// `[V, r]` ([`Error::Shape`]); device failures.
    async fn candidate_table_async(&self, a: CandidateArgs<'_, CudaTensor>) -> Result<CandidateTable> {
        let CandidateArgs { base, markov, candidates, anchor, k } = a;
        const OP: &str = "candidate_table";
        let (ld, vocab) = (base.rows, base.cols);
        self.check_union_args(base, markov, candidates, anchor, k)?;
        if candidates >= vocab {
            let cand: Vec<u32> = (0..vocab as u32).collect();
            return self.markov_table_async(base, markov, &cand, k).await;
        }
        if ld == 0 {
            return Ok(CandidateTable { cand: vec![anchor], ld: 0, k: 1, vals: Vec::new(), slots: Vec::new() });
        }
        let n_max = ld.saturating_mul(candidates).saturating_add(1).min(vocab);
        let kk = k.min(n_max);
        if candidates > TOPK_MAX || kk > TOPK_MAX {
            // The trait's default composition (two read-backs).
            let cand = select::candidate_union(self.topk_async(base, candidates).await?.ids, anchor);
            return self.markov_table_async(base, markov, &cand, k.min(cand.len())).await;
        }
        let cand = self.launch_union(OP, base, candidates, anchor, n_max)?;
        let cand_words = 1 + n_max;
        let table_words = ld * n_max * kk;
        let total = cand_words + 2 * table_words;
        let mut res = self.alloc::<u32>(OP, total)?;
        {
            let (mut head, mut tail) = res.split_at_mut(cand_words);
            let (mut slots, mut vals) = tail.split_at_mut(table_words);
            self.launch_markov_table(TableLaunch { op: OP, base, markov, cand: &cand, n_max, k: kk }, &mut vals, &mut slots)?;
            self.stream.memcpy_dtod(&cand, &mut head).map_err(dev(OP))?;
        }
        let w = self.read(OP, &res, total)?;
        let n = w[0] as usize;
        if n == 0 || n > n_max {
            return Err(Error::Device(format!("{OP}: the device reported {n} candidates, expected 1..={n_max}")));
        }
        let cand: Vec<u32> = w[1..1 + n].to_vec();
        let k_eff = kk.min(n);
        let used = ld * n * k_eff;
        let t = &w[cand_words..];
        let slots = t[..used].to_vec();
        let vals = t[table_words..table_words + used].iter().map(|&v| f32::from_bits(v)).collect();
        Ok(CandidateTable { cand, ld, k: k_eff, vals, slots })
    }

    /// SparklingTree's whole tree prep on the device ([`sparkling_core::Backend::sparkling_tree_async`]): the
    /// pipeline of [`Backend::candidate_table_async`] (topk.cu → candidate_union.cu →
    /// markov_table.cu, nothing read back), then tree_heap.cu (one thread) runs the best-first
    /// precompute heap over the table; only the tree comes back, `1 + 4·budget` words.
    /// `None` when `candidates ≥ V` (the union is the whole vocabulary: use
    /// `candidate_table`) or when `C` / `k'` exceed the device top-k limit (2048).
    /// Errors: as `candidate_table_async`; the anchor missing from the device's union (a device
    /// fault: it is always inserted) or a node count above the budget is [`Error::Device`].
    async fn sparkling_tree_async(&self, a: CandidateArgs<'_, CudaTensor>, budget: usize) -> Result<Option<DraftTree>> {
        let CandidateArgs { base, markov, candidates, anchor, k } = a;
        const OP: &str = "sparkling_tree";
        let (ld, vocab) = (base.rows, base.cols);
        self.check_union_args(base, markov, candidates, anchor, k)?;
        if candidates >= vocab {
            return Ok(None);
        }
        if ld == 0 || budget == 0 {
            return Ok(Some(DraftTree::root(anchor)));
        }
        let n_max = ld.saturating_mul(candidates).saturating_add(1).min(vocab);
        let kk = k.min(n_max);
        if candidates > TOPK_MAX || kk > TOPK_MAX {
            return Ok(None);
        }
        let budget32 = to_u32(OP, "budget", budget)?;
        to_u32(OP, "tree words", 1 + 4 * budget)?;
        let cand = self.launch_union(OP, base, candidates, anchor, n_max)?;
        let mut vals = self.alloc::<f32>(OP, ld * n_max * kk)?;
        let mut slots = self.alloc::<u32>(OP, ld * n_max * kk)?;
        self.launch_markov_table(TableLaunch { op: OP, base, markov, cand: &cand, n_max, k: kk }, &mut vals.slice_mut(..), &mut slots.slice_mut(..))?;
        let mut heap = self.alloc::<u32>(OP, 5 * (2 * budget + 1))?;
        let mut node_slot = self.alloc::<u32>(OP, budget + 1)?;
        let mut out = self.alloc::<u32>(OP, 1 + 4 * budget)?;
        let (ld32, k32) = (to_u32(OP, "depth rows", ld)?, kk as u32);
        let mut b = self.launch_builder(self.k.get("tree_heap"));
        b.arg(&cand).arg(&vals).arg(&slots).arg(&ld32).arg(&k32).arg(&budget32).arg(&anchor);
        b.arg(&mut heap).arg(&mut node_slot).arg(&mut out);
        // SAFETY: cand [n, ids] with n ≤ n_max, the packed [ld, n, min(k, n)] table in
        // ld·n_max·k-value buffers, heap 5·(2·budget + 1) words (at most budget + 1 entries are
        // ever live), node_slot budget + 1, out 1 + 4·budget.
        unsafe { b.launch(cfg(1, 1)) }.map_err(dev(OP))?;
        let w = self.read(OP, &out, 1 + 4 * budget)?;
        Ok(Some(DraftTree::from_device_words(OP, &w, anchor, budget)?))
    }
}

impl CudaBackend {
    /// Enqueue `out[i] = x[base + idx[i]]` (shaders/cuda/gather_rows.cu).
    fn encode_gather(&self, op: &'static str, x: &CudaTensor, base: usize, idx: &[usize], out: &mut cudarc::driver::CudaSlice<f32>) -> Result<()> {
        let n = idx.len() * x.cols;
        if n == 0 {
            return Ok(());
        }
        let words = idx.iter().map(|&r| to_u32(op, "row index", r)).collect::<Result<Vec<u32>>>()?;
        let ib = self.upload_u32_cached(op, &words)?;
        let (ni, c, b0) = (to_u32(op, "rows", idx.len())?, to_u32(op, "cols", x.cols)?, to_u32(op, "start row", base)?);
        let mut b = self.launch_builder(self.k.get("gather_rows"));
        b.arg(&x.buf).arg(ib.as_ref()).arg(&ni).arg(&c).arg(&b0).arg(out);
        // SAFETY: every base+idx[i] < x.rows (checked by the callers); out holds idx.len()*cols.
        unsafe { b.launch(grid_1d(n)) }.map_err(dev(op))?;
        Ok(())
    }
}
