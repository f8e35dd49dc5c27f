//! Attention (causal prefill, tree verify, full drafter block; GQA; f32 softmax) and the
//! host-side tree table the kernel reads (shaders/cuda/attention.cu).

use crate::tensor::CudaTensor;
use crate::{dev, shape_err, to_u32, CudaBackend};
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use sparkling_core::select::ancestor_table;
use sparkling_core::{AttnMask, AttnShape, Result};

/// `ATT_MAX_HD` of attention.cu.
pub(crate) const MAX_HEAD_DIM: usize = 256;
/// `ATT_CHUNK`, `ATT_MAX_SPLITS`, `ATT_THREADS` of attention.cu.
const CHUNK: usize = 256;
const MAX_SPLITS: usize = 16;
const THREADS: u32 = 256;
/// Partial-result floats per launch at most (rows are launched in groups below this).
const MAX_PARTIAL_FLOATS: usize = 1 << 24;

/// `AttParams` of attention.cu (same field order, all 4-byte fields).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct AttParams {
    t: u32,
    kv_len: u32,
    prefix: u32,
    n_heads: u32,
    group: u32,
    head_dim: u32,
    q_cols: u32,
    kv_cols: u32,
    mode: u32,
    scale: f32,
    row0: u32,
    splits_max: u32,
}

// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for AttParams {}

/// Splits of a visible sequence of `n` keys (`att_splits` of attention.cu; the host only needs
/// their upper bound, the tests check the two agree).
#[cfg(test)]
fn splits(n: usize) -> usize {
    let chunks = n.div_ceil(CHUNK);
    let cps = chunks.div_ceil(MAX_SPLITS).max(1);
    chunks.div_ceil(cps)
}

impl CudaBackend {
    /// Scaled dot-product attention (see [`sparkling_core::Backend::attention`]).
    /// Errors: inconsistent head geometry, a head dimension above 256, a cache shorter than
    /// `kv_len` or fewer keys than queries ([`sparkling_core::Error::Shape`]); a bad parent ([`sparkling_core::Error::Invalid`]).
    pub(crate) fn op_attention(
        &self,
        q: &CudaTensor,
        k_cache: &CudaTensor,
        v_cache: &CudaTensor,
        kv_len: usize,
        shape: AttnShape,
        mask: AttnMask<'_>,
    ) -> Result<CudaTensor> {
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
        let (mode, table) = match mask {
            AttnMask::Causal => (0u32, None),
            AttnMask::Full => (1u32, None),
            AttnMask::Tree { parents } => {
                if parents.len() != t {
                    return Err(shape_err("attention", format!("{} parents for {t} tree rows", parents.len())));
                }
                (2u32, Some(ancestor_table(parents)?))
            }
        };
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
            let mut b = self.stream.launch_builder(self.k.get("attention_split"));
            b.arg(&p).arg(&q.buf).arg(&k_cache.buf).arg(&v_cache.buf).arg(tree.as_ref()).arg(&mut part_m).arg(&mut part_l).arg(&mut part_o);
            // SAFETY: shapes checked above; partial buffers sized for rows_per_launch rows.
            unsafe { b.launch(cfg) }.map_err(dev("attention"))?;
            let cfg = LaunchConfig { grid_dim: (to_u32("attention", "blocks", rows * n_heads)?, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
            let mut b = self.stream.launch_builder(self.k.get("attention_combine"));
            b.arg(&p).arg(tree.as_ref()).arg(&part_m).arg(&part_l).arg(&part_o).arg(&mut out);
            // SAFETY: as above; out holds t*q_cols values.
            unsafe { b.launch(cfg) }.map_err(dev("attention"))?;
            row0 += rows;
        }
        Ok(CudaTensor { rows: t, cols: q.cols, buf: out })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_depend_only_on_the_visible_length() {
        assert_eq!(splits(1), 1);
        assert_eq!(splits(256), 1);
        assert_eq!(splits(257), 2);
        assert_eq!(splits(16 * 256), 16);
        // Beyond 16 chunks, splits take several chunks each and never exceed 16.
        assert_eq!(splits(17 * 256), 9);
        // Every row's splits fit the per-call bound used for the partial buffers.
        for kv_len in [1usize, 300, 4096, 4097, 5000, 40_000, 1 << 20] {
            let s_max = kv_len.div_ceil(CHUNK).clamp(1, MAX_SPLITS);
            for n in (1..=kv_len).step_by(97).chain([kv_len]) {
                assert!((1..=s_max).contains(&splits(n)), "kv_len {kv_len} n {n}");
            }
        }
    }
}
