//! The constants and parameter block of the attention kernel (shaders/cuda/attention.cu:
//! causal prefill, tree verify, full drafter block; GQA; f32 softmax). The op,
//! `Backend::attention`, is in `ops.rs`.

use cudarc::driver::DeviceRepr;

/// `ATT_MAX_HD` of attention.cu.
pub(crate) const MAX_HEAD_DIM: usize = 256;
/// `ATT_CHUNK`, `ATT_MAX_SPLITS`, `ATT_THREADS` of attention.cu.
pub(crate) const CHUNK: usize = 256;
pub(crate) const MAX_SPLITS: usize = 16;
pub(crate) const THREADS: u32 = 256;
/// Partial-result floats per launch at most (rows are launched in groups below this).
pub(crate) const MAX_PARTIAL_FLOATS: usize = 1 << 24;

/// `AttParams` of attention.cu (same field order, all 4-byte fields).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttParams {
    pub(crate) t: u32,
    pub(crate) kv_len: u32,
    pub(crate) prefix: u32,
    pub(crate) n_heads: u32,
    pub(crate) group: u32,
    pub(crate) head_dim: u32,
    pub(crate) q_cols: u32,
    pub(crate) kv_cols: u32,
    pub(crate) mode: u32,
    pub(crate) scale: f32,
    pub(crate) row0: u32,
    pub(crate) splits_max: u32,
}

// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for AttParams {}

/// Splits of a visible sequence of `n` keys (`att_splits` of attention.cu; the host only needs
/// their upper bound, the tests check the two agree).
#[cfg(test)]
pub(crate) fn splits(n: usize) -> usize {
    let chunks = n.div_ceil(CHUNK);
    let cps = chunks.div_ceil(MAX_SPLITS).max(1);
    chunks.div_ceil(cps)
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
