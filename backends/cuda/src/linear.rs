//! The matmul's helpers. `Backend::matmul` (in `ops.rs`) runs cuBLAS:
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

use crate::tensor::CudaTensor;
use crate::{dev, grid_1d, to_u32, CudaBackend};
use cudarc::driver::PushKernelArg;
use sparkling_core::{Error, Result};

impl CudaBackend {
    /// `y[r, :] += bias` for rows `r < m` (shaders/cuda/add_bias.cu).
    pub(crate) fn add_bias(&self, y: &mut cudarc::driver::CudaSlice<f32>, bias: &CudaTensor, m: usize, n: usize) -> Result<()> {
        let (m32, n32) = (to_u32("matmul", "rows", m)?, to_u32("matmul", "N", n)?);
        let mut b = self.launch_builder(self.k.get("add_bias"));
        b.arg(y).arg(&bias.buf).arg(&m32).arg(&n32);
        // SAFETY: y holds at least m*n values, bias n.
        unsafe { b.launch(grid_1d(m * n)) }.map_err(dev("matmul bias"))?;
        Ok(())
    }
}

pub(crate) fn to_i32(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Device(format!("matmul: dimension {v} exceeds cuBLAS's 32-bit range")))
}
