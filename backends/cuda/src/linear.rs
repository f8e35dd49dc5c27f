//! Weight upload, embedding gather and matmul (cuBLAS).
//!
//! Matmul `y[M, N] = x[M, K] · W[N, K]ᵀ (+ bias)`: in cuBLAS's column-major terms this is
//! `yᵀ[N, M] = op(W)·xᵀ` with `W` read as the column-major `K×N` matrix it is in memory
//! (`transa = T`, `lda = K`), `xᵀ` as column-major `K×M` (`transb = N`, `ldb = K`) and `yᵀ`
//! written as column-major `N×M` (`ldc = N`) = row-major `y`.
//!
//! **Why every GEMM has exactly `row_block` rows.** cuBLAS picks its kernel (tile shape,
//! split-K, reduction order) per problem shape, so the same output row computed in a 1-row call
//! and in a 65-row call may be rounded differently — which would break the engine's invariant
//! that a tree verify reproduces plain decoding bit for bit. The input is therefore packed into
//! `ceil(M / row_block)` blocks of exactly `row_block` rows (the last one zero-padded,
//! shaders/cuda/pack_input.cu) and each block is one GEMM of the same shape `(N, row_block, K)`:
//! a row's result depends only on its own values. For decode and verify (M ≤ 128 with the
//! default block) the padding is free in practice: at batch 1 the weights are read from HBM
//! once either way and a 128-row bf16 GEMM on H100/H200 stays below the compute/bandwidth
//! ridge point.

use crate::tensor::{CudaTensor, CudaWeight, WeightData, WeightDtype};
use crate::{dev, grid_1d, shape_err, to_u32, CudaBackend};
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{DevicePtr, DevicePtrMut, PushKernelArg};
use sparkling_core::{Error, Result};
use std::ffi::c_void;

impl CudaBackend {
    /// Upload a `[n, k]` weight in this backend's [`WeightDtype`] (bf16: round to nearest even).
    /// Errors: `data.len() != n*k` ([`Error::Shape`]); allocation failure ([`Error::Device`]).
    pub(crate) fn op_upload_weight(&self, data: Vec<f32>, n: usize, k: usize) -> Result<CudaWeight> {
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

    /// `out[i] = table[ids[i]]` → `[ids.len(), K]` (shaders/cuda/embedding.cu).
    /// Errors: an id `≥ N` ([`Error::Invalid`], like the CPU backend).
    pub(crate) fn op_embedding(&self, table: &CudaWeight, ids: &[u32]) -> Result<CudaTensor> {
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
                    let mut b = self.stream.launch_builder(self.k.get("embedding_f32"));
                    b.arg(t).arg(idb.as_ref()).arg(&ni).arg(&k32).arg(&mut out);
                    // SAFETY: ids < N checked above; out holds ids.len()*K values.
                    unsafe { b.launch(cfg) }.map_err(dev("embedding"))?;
                }
                WeightData::Bf16(t) => {
                    let mut b = self.stream.launch_builder(self.k.get("embedding_bf16"));
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
    pub(crate) fn op_matmul(&self, x: &CudaTensor, w: &CudaWeight, bias: Option<&CudaTensor>) -> Result<CudaTensor> {
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
            let mut y = self.op_zeros(m, n)?;
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
                let mut b = self.stream.launch_builder(self.k.get("pack_f32"));
                b.arg(&x.buf).arg(&m32).arg(&k32).arg(&mp32).arg(&mut xp);
                // SAFETY: x holds M*K values, xp Mp*K.
                unsafe { b.launch(grid_1d(mp * k)) }.map_err(dev("matmul"))?;
                let (wp, _r1) = wd.device_ptr(&self.stream);
                let (xb, _r2) = xp.device_ptr(&self.stream);
                let (yb, _r3) = y.device_ptr_mut(&self.stream);
                for blk in 0..blocks {
                    let xo = xb + (blk * rb * k * 4) as u64;
                    let yo = yb + (blk * rb * n * 4) as u64;
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
                let mut b = self.stream.launch_builder(self.k.get("pack_bf16"));
                b.arg(&x.buf).arg(&m32).arg(&k32).arg(&mp32).arg(&mut xp);
                // SAFETY: x holds M*K values, xp Mp*K.
                unsafe { b.launch(grid_1d(mp * k)) }.map_err(dev("matmul"))?;
                let (wp, _r1) = wd.device_ptr(&self.stream);
                let (xb, _r2) = xp.device_ptr(&self.stream);
                let (yb, _r3) = y.device_ptr_mut(&self.stream);
                for blk in 0..blocks {
                    let xo = xb + (blk * rb * k * 2) as u64;
                    let yo = yb + (blk * rb * n * 4) as u64;
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

    /// `y[r, :] += bias` for rows `r < m` (shaders/cuda/add_bias.cu).
    fn add_bias(&self, y: &mut cudarc::driver::CudaSlice<f32>, bias: &CudaTensor, m: usize, n: usize) -> Result<()> {
        let (m32, n32) = (to_u32("matmul", "rows", m)?, to_u32("matmul", "N", n)?);
        let mut b = self.stream.launch_builder(self.k.get("add_bias"));
        b.arg(y).arg(&bias.buf).arg(&m32).arg(&n32);
        // SAFETY: y holds at least m*n values, bias n.
        unsafe { b.launch(grid_1d(m * n)) }.map_err(dev("matmul bias"))?;
        Ok(())
    }
}

fn to_i32(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Device(format!("matmul: dimension {v} exceeds cuBLAS's 32-bit range")))
}
