//! Device tensors and weights of the CUDA backend.

use cudarc::driver::{CudaSlice, CudaView};

/// An `f32 [rows, cols]` row-major activation tensor in device memory. The allocation may be
/// longer than `rows * cols` (matmul outputs keep the GEMM's padded rows); only the first
/// `rows * cols` values are the tensor.
#[derive(Debug)]
pub struct CudaTensor {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) buf: CudaSlice<f32>,
}

impl CudaTensor {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// `rows * cols`.
    pub(crate) fn len(&self) -> usize {
        self.rows * self.cols
    }

    /// The valid values.
    pub(crate) fn view(&self) -> CudaView<'_, f32> {
        self.buf.slice(0..self.len())
    }
}

/// Precision in which [`crate::CudaBackend`] stores uploaded weights. Activations and
/// accumulation are always f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WeightDtype {
    /// bfloat16, round-to-nearest-even at upload (lossless for bf16 checkpoints). Matmuls run
    /// as cuBLAS `GemmEx` with bf16 weights **and bf16-rounded activations**, f32 accumulation
    /// and f32 output (tensor cores); embeddings are widened exactly.
    #[default]
    Bf16,
    /// f32 (exact copy of what the loader produced). Matmuls run as cuBLAS `Sgemm` with
    /// pedantic math (no TF32, no reduced-precision reductions): the mode the conformance tests
    /// use so that logits match the CPU backend closely.
    F32,
}

impl WeightDtype {
    /// Short name (`bf16`, `f32`).
    pub fn name(self) -> &'static str {
        match self {
            WeightDtype::Bf16 => "bf16",
            WeightDtype::F32 => "f32",
        }
    }
}

/// Device storage of a weight matrix.
#[derive(Debug)]
pub(crate) enum WeightData {
    F32(CudaSlice<f32>),
    Bf16(CudaSlice<u16>),
}

/// A `[n, k]` weight matrix (HF layout, `y = x·Wᵀ`), row-major in device memory.
#[derive(Debug)]
pub struct CudaWeight {
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) data: WeightData,
}

impl CudaWeight {
    /// Output features (rows).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input features (columns).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Storage precision.
    pub fn dtype(&self) -> WeightDtype {
        match self.data {
            WeightData::F32(_) => WeightDtype::F32,
            WeightData::Bf16(_) => WeightDtype::Bf16,
        }
    }
}
