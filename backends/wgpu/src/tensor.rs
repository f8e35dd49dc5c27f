//! Device tensors and weights of the wgpu backend, and the host-side packing of f16 / bf16
//! weights into `u32` words (two values per word, low half first) for the WGSL preludes
//! `shaders/weights_f16.wgsl` / `weights_bf16.wgsl`.

use crate::pool::PooledBuffer;
use crate::quant::QFormat;

/// An `f32 [rows, cols]` row-major activation tensor in a pooled storage buffer (returned to
/// the pool when dropped).
#[derive(Debug)]
pub struct WgpuTensor {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) buf: PooledBuffer,
}

impl WgpuTensor {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of valid data (`rows * cols * 4`).
    pub(crate) fn bytes(&self) -> u64 {
        (self.rows * self.cols * 4) as u64
    }

    /// The storage buffer (its size is a pool bucket, ≥ [`Self::bytes`]).
    pub(crate) fn buffer(&self) -> &wgpu::Buffer {
        self.buf.buffer()
    }
}

/// Precision in which [`crate::WgpuBackend`] stores uploaded weights. Activations and
/// accumulation are always f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WeightDtype {
    /// 32-bit floats (exact copy of what the loader produced).
    #[default]
    F32,
    /// IEEE half, round-to-nearest-even at upload (the same rounding as the CPU backend's
    /// `WeightDtype::F16`), widened in-shader with `unpack2x16float`.
    F16,
    /// bfloat16, round-to-nearest-even at upload (lossless for bf16 checkpoints), widened
    /// in-shader by a 16-bit shift.
    Bf16,
    /// GGUF tensors of a block format with a WGSL prelude ([`QFormat`]: Q8_0, Q4_0, Q4_1, Q5_0,
    /// Q4_K, Q6_K) stay as stored, dequantized in registers by the matmul kernels
    /// (`shaders/weights_quant.wgsl`); every other weight is stored as [`WeightDtype::F16`].
    Native,
}

impl WeightDtype {
    /// Bytes of a chunk of `elems` weight values in this storage (packed formats round up to
    /// whole `u32` words; `Native` floats are f16).
    pub(crate) fn chunk_bytes(self, elems: u64) -> u64 {
        match self {
            WeightDtype::F32 => elems * 4,
            WeightDtype::F16 | WeightDtype::Bf16 | WeightDtype::Native => elems.div_ceil(2) * 4,
        }
    }

    /// Short name (`f32`, `f16`, `bf16`, `native`).
    pub fn name(self) -> &'static str {
        match self {
            WeightDtype::F32 => "f32",
            WeightDtype::F16 => "f16",
            WeightDtype::Bf16 => "bf16",
            WeightDtype::Native => "native",
        }
    }

    /// How a float matrix is stored under this choice (`Native` keeps floats in f16).
    pub(crate) fn float_storage(self) -> WeightStorage {
        match self {
            WeightDtype::F32 => WeightStorage::F32,
            WeightDtype::F16 | WeightDtype::Native => WeightStorage::F16,
            WeightDtype::Bf16 => WeightStorage::Bf16,
        }
    }
}

/// How one uploaded weight is stored on the device: which WGSL prelude its kernels read it
/// through (`shaders/weights_*.wgsl`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightStorage {
    /// f32 values, `Wᵀ[K, stride]`.
    F32,
    /// IEEE half values, two per word, `Wᵀ[K, stride]`.
    F16,
    /// bfloat16 values, two per word, `Wᵀ[K, stride]`.
    Bf16,
    /// GGUF blocks of this format, in the chunk layout of `quant.rs`.
    Quant(QFormat),
}

impl WeightStorage {
    /// Short name (`f32`, `f16`, `bf16`, or the block format's: `q4_k`, …).
    pub fn name(self) -> &'static str {
        match self {
            WeightStorage::F32 => "f32",
            WeightStorage::F16 => "f16",
            WeightStorage::Bf16 => "bf16",
            WeightStorage::Quant(f) => f.name(),
        }
    }
}

/// One binding-sized piece of a weight: rows `row0 .. row0 + rows` of the `[n, k]` matrix,
/// stored transposed (`[k, stride]`, see [`transpose_rows`]).
#[derive(Debug)]
pub(crate) struct WeightChunk {
    pub(crate) row0: usize,
    pub(crate) rows: usize,
    pub(crate) stride: usize,
    pub(crate) bytes: u64,
    pub(crate) buffer: wgpu::Buffer,
}

/// A `[n, k]` weight matrix (HF layout, `y = x·Wᵀ`), split by rows into chunks that each fit
/// one storage binding (`max_storage_buffer_binding_size`, 128 MiB on WebGPU and lavapipe).
#[derive(Debug)]
pub struct WgpuWeight {
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) storage: WeightStorage,
    pub(crate) chunks: Vec<WeightChunk>,
}

impl WgpuWeight {
    /// Output features (rows).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input features (columns).
    pub fn k(&self) -> usize {
        self.k
    }

    /// How the weight is stored (float precision or block format).
    pub fn storage(&self) -> WeightStorage {
        self.storage
    }

    /// Number of storage bindings the weight is split across.
    pub fn n_chunks(&self) -> usize {
        self.chunks.len()
    }
}

/// Stored columns of a chunk of `rows` weight rows: `rows` rounded up to a multiple of 4 (the
/// direct matmul kernel reads 4 columns as one vec4).
pub(crate) fn chunk_stride(rows: usize) -> usize {
    rows.div_ceil(4) * 4
}

/// Bytes of a stored chunk of `rows` rows of width `k` in `dtype` (padding included).
pub(crate) fn stored_chunk_bytes(dtype: WeightDtype, k: usize, rows: usize) -> u64 {
    dtype.chunk_bytes((k * chunk_stride(rows)) as u64)
}

/// Rows per chunk so that one stored chunk of `k`-wide rows in `dtype` fits `limit` bytes;
/// 0 when even 4 rows (one vec4 of columns) do not fit.
pub(crate) fn rows_per_chunk(dtype: WeightDtype, k: usize, limit: u64) -> usize {
    if k == 0 {
        return usize::MAX;
    }
    let per_row = match dtype {
        WeightDtype::F32 => 4 * k as u64,
        WeightDtype::F16 | WeightDtype::Bf16 | WeightDtype::Native => 2 * k as u64,
    };
    // Whole groups of 4 rows only, so every chunk but the last needs no padding.
    let mut r = (limit / per_row) / 4 * 4;
    while r > 0 && stored_chunk_bytes(dtype, k, r as usize) > limit {
        r -= 4;
    }
    r.min(usize::MAX as u64) as usize
}

/// Rows `row0 .. row0+rows` of a row-major `[n, k]` matrix, transposed to `[k, stride]` with
/// `stride = chunk_stride(rows)` (element `(j, c)` at `c * stride + j`, padding columns zero):
/// the layout every weight chunk is stored in, so that invocations owning consecutive output
/// columns read consecutive addresses.
pub(crate) fn transpose_rows(data: &[f32], k: usize, row0: usize, rows: usize) -> Vec<f32> {
    const B: usize = 32;
    let stride = chunk_stride(rows);
    let mut out = vec![0.0f32; stride * k];
    for j0 in (0..rows).step_by(B) {
        for c0 in (0..k).step_by(B) {
            for j in j0..(j0 + B).min(rows) {
                let src = &data[(row0 + j) * k..(row0 + j + 1) * k];
                for c in c0..(c0 + B).min(k) {
                    out[c * stride + j] = src[c];
                }
            }
        }
    }
    out
}

/// Encode `vals` in `dtype` as little-endian bytes ready for a storage buffer.
pub(crate) fn encode(dtype: WeightDtype, vals: &[f32]) -> Vec<u8> {
    match dtype {
        WeightDtype::F32 => bytemuck::cast_slice(vals).to_vec(),
        WeightDtype::F16 | WeightDtype::Native => pack_u16(vals, |v| half::f16::from_f32(v).to_bits()),
        WeightDtype::Bf16 => pack_u16(vals, |v| half::bf16::from_f32(v).to_bits()),
    }
}

/// Two 16-bit codes per `u32` word, element `2i` in the low half; an odd count is padded
/// with a zero half.
fn pack_u16(vals: &[f32], code: impl Fn(f32) -> u16) -> Vec<u8> {
    let mut words: Vec<u32> = Vec::with_capacity(vals.len().div_ceil(2));
    for pair in vals.chunks(2) {
        let lo = code(pair[0]) as u32;
        let hi = pair.get(1).map_or(0, |&v| code(v) as u32);
        words.push(lo | (hi << 16));
    }
    bytemuck::cast_slice(&words).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_rows_fit_the_limit() {
        for dt in [WeightDtype::F32, WeightDtype::F16, WeightDtype::Bf16] {
            for k in [1usize, 3, 33, 250] {
                let r = rows_per_chunk(dt, k, 4096);
                assert!(r > 0 && r.is_multiple_of(4), "{dt:?} k {k}: {r}");
                assert!(stored_chunk_bytes(dt, k, r) <= 4096, "{dt:?} k {k}");
                assert!(stored_chunk_bytes(dt, k, r + 4) > 4096, "{dt:?} k {k} not maximal");
            }
        }
        assert_eq!(rows_per_chunk(WeightDtype::F32, 300, 4096), 0);
    }

    #[test]
    fn transpose_rows_of_a_chunk() {
        // [3, 2] = [[0, 1], [2, 3], [4, 5]]; rows 1..3 transposed = [[2, 4, 0, 0], [3, 5, 0, 0]].
        let d = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(transpose_rows(&d, 2, 1, 2), vec![2.0, 4.0, 0.0, 0.0, 3.0, 5.0, 0.0, 0.0]);
        let big: Vec<f32> = (0..70 * 33).map(|i| i as f32).collect();
        let t = transpose_rows(&big, 33, 5, 61);
        assert_eq!(t.len(), 33 * 64);
        for j in 0..61 {
            for c in 0..33 {
                assert_eq!(t[c * 64 + j], big[(5 + j) * 33 + c]);
            }
        }
    }

    #[test]
    fn packing_puts_even_elements_in_the_low_half() {
        let b = encode(WeightDtype::Bf16, &[1.0, -2.0, 0.5]);
        let w: &[u32] = bytemuck::cast_slice(&b);
        assert_eq!(w.len(), 2);
        assert_eq!(f32::from_bits(w[0] << 16), 1.0);
        assert_eq!(f32::from_bits(w[0] & 0xffff_0000), -2.0);
        assert_eq!(f32::from_bits(w[1] << 16), 0.5);
        let h = encode(WeightDtype::F16, &[1.0, 0.25]);
        let w: &[u32] = bytemuck::cast_slice(&h);
        assert_eq!(half::f16::from_bits((w[0] & 0xffff) as u16).to_f32(), 1.0);
        assert_eq!(half::f16::from_bits((w[0] >> 16) as u16).to_f32(), 0.25);
    }
}
