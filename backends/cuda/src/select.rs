//! The kernel launches of the read-back ops (the ops are the `Backend` impl in `ops.rs`): argmax,
//! sampling, top-k + log-sum-exp, the Markov candidate table and the fused SparklingTree tree prep (shaders/cuda/argmax.cu, sample.cu, topk.cu,
//! markov_table.cu, candidate_union.cu, tree_heap.cu). Each ends with one device→host copy of
//! its (small) result: `candidate_table` reads back `1 + n_max + 2·ld·n_max·k'` words (the
//! candidate buffer and the packed table, sized for the largest possible union
//! `n_max = min(ld·C + 1, V)` since the actual n is known only on the device), and
//! `sparkling_tree` only the tree, `1 + 4·budget` words.

use crate::tensor::CudaTensor;
use crate::{dev, to_u32, CudaBackend};
use cudarc::driver::{CudaSlice, CudaViewMut, LaunchConfig, PushKernelArg};
use sparkling_core::select::{check_candidate_table_args, check_markov_table_args};
use sparkling_core::{Error, Result};

/// `TOPK_MAX` of block_topk.cuh: the largest k selected on the device.
pub(crate) const TOPK_MAX: usize = 2048;
/// Columns per first-stage block of topk.cu (at least k).
const TOPK_SEGMENT: usize = 8192;
/// Candidate counts up to this keep a Markov row's logits in shared memory.
const MARKOV_SHARED_MAX_N: usize = 6144;
/// `UNION_THREADS` of candidate_union.cu: threads of its single block.
const UNION_THREADS: u32 = 1024;

/// The inputs of one markov_table.cu launch ([`CudaBackend::launch_markov_table`]).
pub(crate) struct TableLaunch<'a> {
    /// The op named in errors.
    pub(crate) op: &'static str,
    /// Drafter logits `U [ld, V]`.
    pub(crate) base: &'a CudaTensor,
    /// The Markov head's `(W1, W2)`, each `[V, r]` (shapes already checked).
    pub(crate) markov: Option<(&'a CudaTensor, &'a CudaTensor)>,
    /// The header-word candidate buffer `[n, ids...]`.
    pub(crate) cand: &'a CudaSlice<u32>,
    /// Candidate capacity (`n ≤ n_max`).
    pub(crate) n_max: usize,
    /// Children requested per row.
    pub(crate) k: usize,
}

pub(crate) fn cfg(blocks: u32, threads: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
}

impl CudaBackend {
    /// Launch topk.cu for `1 ≤ k ≤ min(cols, TOPK_MAX)` and `rows ≥ 1`; the results stay on the
    /// device: ids `[rows, k]`, values `[rows, k]`, lse `[rows]`.
    #[allow(clippy::type_complexity)]
    pub(crate) fn launch_topk(&self, logits: &CudaTensor, k: usize) -> Result<(CudaSlice<u32>, CudaSlice<f32>, CudaSlice<f32>)> {
        let (rows, cols) = (logits.rows, logits.cols);
        let seg_len = TOPK_SEGMENT.max(k);
        let n_seg = cols.div_ceil(seg_len);
        let count = (n_seg - 1) * k + k.min(cols - (n_seg - 1) * seg_len);
        let (c32, s32, k32, ns32, cnt32) = (
            to_u32("topk", "cols", cols)?,
            to_u32("topk", "segment", seg_len)?,
            k as u32,
            to_u32("topk", "segments", n_seg)?,
            to_u32("topk", "candidates", count)?,
        );
        if n_seg > 65535 {
            return Err(Error::Invalid(format!("topk: {cols} columns need {n_seg} segments, above the 65535 the launch allows")));
        }
        let mut part_key = self.alloc::<u32>("topk", rows * n_seg * k)?;
        let mut part_id = self.alloc::<u32>("topk", rows * n_seg * k)?;
        let mut part_max = self.alloc::<f32>("topk", rows * n_seg)?;
        let mut part_sum = self.alloc::<f64>("topk", rows * n_seg)?;
        let grid = LaunchConfig { grid_dim: (to_u32("topk", "rows", rows)?, ns32, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.launch_builder(self.k.get("topk_segments"));
        b.arg(&logits.buf).arg(&c32).arg(&s32).arg(&k32).arg(&mut part_key).arg(&mut part_id).arg(&mut part_max).arg(&mut part_sum);
        // SAFETY: partial buffers hold rows*n_seg*k (keys/ids) and rows*n_seg (max/sum) values.
        unsafe { b.launch(grid) }.map_err(dev("topk"))?;
        let mut ids = self.alloc::<u32>("topk", rows * k)?;
        let mut vals = self.alloc::<f32>("topk", rows * k)?;
        let mut lse = self.alloc::<f32>("topk", rows)?;
        let mut b = self.launch_builder(self.k.get("topk_merge"));
        b.arg(&logits.buf).arg(&c32).arg(&ns32).arg(&k32).arg(&cnt32).arg(&part_key).arg(&part_id).arg(&part_max).arg(&part_sum);
        b.arg(&mut ids).arg(&mut vals).arg(&mut lse);
        // SAFETY: count ≤ n_seg*k valid candidates per row; outputs rows*k and rows.
        unsafe { b.launch(cfg(rows as u32, 256)) }.map_err(dev("topk"))?;
        Ok((ids, vals, lse))
    }

    /// Launch markov_table.cu over the header-word candidate buffer `cand` = `[n, ids...]` with
    /// `1 ≤ n ≤ n_max` (n possibly known only on the device) and `1 ≤ k ≤ min(n_max, TOPK_MAX)`
    /// children requested (the kernels clamp to n). Grids are sized for `n_max` (markov_bias:
    /// `ceil(n_max/16)²` tiles; markov_rows: `ld·n_max` blocks with a head, `ld` without) and
    /// blocks past n exit; the kernels use the actual n for every stride, so the `[ld, n, k']`
    /// table (`k' = min(k, n)`) is packed at the front of `vals` / `slots` (each of at least
    /// `ld·n_max·k` words). Shapes of W1/W2 must have been checked.
    pub(crate) fn launch_markov_table<V>(&self, t: TableLaunch<'_>, vals: &mut CudaViewMut<'_, V>, slots: &mut CudaViewMut<'_, u32>) -> Result<()> {
        let TableLaunch { op, base, markov, cand, n_max, k } = t;
        let (ld, vocab) = (base.rows, base.cols);
        let (v32, nmax32, k32) = (to_u32(op, "vocab", vocab)?, to_u32(op, "candidates", n_max)?, to_u32(op, "k", k)?);
        let bias = match markov {
            Some((w1, w2)) => {
                let r32 = to_u32(op, "rank", w1.cols)?;
                let mut bias = self.alloc::<f32>(op, n_max * n_max)?;
                let tiles = to_u32(op, "tiles", n_max.div_ceil(16))?;
                if tiles > 65535 {
                    return Err(Error::Invalid(format!("{op}: {n_max} candidates exceed the bias kernel's grid")));
                }
                let grid = LaunchConfig { grid_dim: (tiles, tiles, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
                let mut b = self.launch_builder(self.k.get("markov_bias"));
                b.arg(&w1.buf).arg(&w2.buf).arg(&r32).arg(cand).arg(&mut bias);
                // SAFETY: W1/W2 are [vocab, r] (checked), cand holds 1 + n ≤ 1 + n_max words with
                // ids < vocab, bias n_max² ≥ n² values.
                unsafe { b.launch(grid) }.map_err(dev(op))?;
                Some(bias)
            }
            None => None,
        };
        let has_bias = u32::from(bias.is_some());
        let blocks = if bias.is_some() { ld * n_max } else { ld };
        let shared = n_max <= MARKOV_SHARED_MAX_N;
        let launch = LaunchConfig {
            grid_dim: (to_u32(op, "rows", blocks)?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: if shared { (n_max * 4) as u32 } else { 0 },
        };
        let null = 0u64;
        let mut b = self.launch_builder(self.k.get(if shared { "markov_rows_shared" } else { "markov_rows_global" }));
        b.arg(&base.buf).arg(&v32).arg(cand).arg(&nmax32);
        match &bias {
            Some(bb) => b.arg(bb),
            None => b.arg(&null),
        };
        b.arg(&has_bias).arg(&k32).arg(vals).arg(slots);
        // SAFETY: base [ld, vocab], cand [n, ids < vocab] with n ≤ n_max, bias n_max² or null
        // with has_bias = 0, outputs ≥ ld·n_max·k ≥ ld·n·min(k, n) values.
        unsafe { b.launch(launch) }.map_err(dev(op))?;
        Ok(())
    }

    /// The argument checks of the fused ops: `candidates`, `anchor`, `k`
    /// (`check_candidate_table_args`) and the W1/W2 shapes (the anchor alone is a valid
    /// candidate list for `check_markov_table_args`).
    pub(crate) fn check_union_args(
        &self,
        base: &CudaTensor,
        markov: Option<(&CudaTensor, &CudaTensor)>,
        candidates: usize,
        anchor: u32,
        k: usize,
    ) -> Result<()> {
        check_candidate_table_args(base.cols, candidates, anchor, k)?;
        check_markov_table_args(base.cols, markov.map(|(a, b)| ((a.rows, a.cols), (b.rows, b.cols))), &[anchor], k)
    }

    /// topk.cu (top-`c` per depth row, kept on the device) then candidate_union.cu: returns
    /// the candidate buffer `[n, ascending distinct ids]` of capacity `1 + n_max`. Requires
    /// `ld ≥ 1` and `1 ≤ c ≤ min(V - 1, TOPK_MAX)`.
    pub(crate) fn launch_union(&self, op: &'static str, base: &CudaTensor, c: usize, anchor: u32, n_max: usize) -> Result<CudaSlice<u32>> {
        let (ld, vocab) = (base.rows, base.cols);
        let (ids, _vals, _lse) = self.launch_topk(base, c)?;
        let (ld32, c32, v32) = (to_u32(op, "depth rows", ld)?, to_u32(op, "candidates", c)?, to_u32(op, "vocab", vocab)?);
        to_u32(op, "ld·candidates", ld * c)?;
        let mut bits = self.alloc::<u32>(op, vocab.div_ceil(32))?;
        let mut cand = self.alloc::<u32>(op, 1 + n_max)?;
        let mut b = self.launch_builder(self.k.get("candidate_union"));
        b.arg(&ids).arg(&ld32).arg(&c32).arg(&v32).arg(&anchor).arg(&mut bits).arg(&mut cand);
        // SAFETY: ids [ld, c] with every id < vocab, anchor < vocab (checked), bits
        // ceil(vocab/32) words, cand 1 + n_max ≥ 1 + n words (n ≤ min(ld·c + 1, vocab)).
        unsafe { b.launch(cfg(1, UNION_THREADS)) }.map_err(dev(op))?;
        Ok(cand)
    }
}
