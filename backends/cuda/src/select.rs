//! The read-back ops: argmax, sampling, top-k + log-sum-exp, the Markov candidate table and
//! the fused SparklingTree tree prep (shaders/cuda/argmax.cu, sample.cu, topk.cu,
//! markov_table.cu, candidate_union.cu, tree_heap.cu). Each ends with one device→host copy of
//! its (small) result: `candidate_table` reads back `1 + n_max + 2·ld·n_max·k'` words (the
//! candidate buffer and the packed table, sized for the largest possible union
//! `n_max = min(ld·C + 1, V)` since the actual n is known only on the device), and
//! `sparkling_tree` only the tree, `1 + 4·budget` words.

use crate::tensor::CudaTensor;
use crate::{dev, shape_err, to_u32, CudaBackend};
use cudarc::driver::{CudaSlice, CudaViewMut, LaunchConfig, PushKernelArg};
use sparkling_core::select::{self, check_candidate_table_args, check_markov_table_args};
use sparkling_core::{CandidateTable, DraftTree, Error, Result, SampleParams, TopK};

/// `TOPK_MAX` of block_topk.cuh: the largest k selected on the device.
pub(crate) const TOPK_MAX: usize = 2048;
/// Columns per first-stage block of topk.cu (at least k).
const TOPK_SEGMENT: usize = 8192;
/// Candidate counts up to this keep a Markov row's logits in shared memory.
const MARKOV_SHARED_MAX_N: usize = 6144;
/// `UNION_THREADS` of candidate_union.cu: threads of its single block.
const UNION_THREADS: u32 = 1024;

fn cfg(blocks: u32, threads: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
}

impl CudaBackend {
    /// Row-wise argmax on the device (lowest index on ties, NaN never wins), then a read-back of
    /// one `u32` per row.
    pub(crate) fn op_argmax(&self, logits: &CudaTensor) -> Result<Vec<u32>> {
        let rows = logits.rows;
        if rows == 0 {
            return Ok(Vec::new());
        }
        if logits.cols == 0 {
            return Ok(vec![0; rows]);
        }
        let mut ids = self.alloc::<u32>("argmax", rows)?;
        let c = to_u32("argmax", "cols", logits.cols)?;
        let mut b = self.stream.launch_builder(self.k.get("argmax_rows"));
        b.arg(&logits.buf).arg(&c).arg(&mut ids);
        // SAFETY: logits holds rows*cols values, ids rows.
        unsafe { b.launch(cfg(to_u32("argmax", "rows", rows)?, 256)) }.map_err(dev("argmax"))?;
        self.read("argmax", &ids, rows)
    }

    /// Row-wise sampling on the device (shaders/cuda/sample.cu: the CPU's inverse-CDF draw in
    /// ascending id order after top-k / top-p, f64 sums). `T < 1e-5` → argmax.
    /// Errors: `uniforms.len() != rows` ([`Error::Shape`]).
    pub(crate) fn op_sample(&self, logits: &CudaTensor, params: SampleParams, uniforms: &[f32]) -> Result<Vec<u32>> {
        let rows = logits.rows;
        if uniforms.len() != rows {
            return Err(shape_err("sample", format!("{} uniforms for {rows} rows", uniforms.len())));
        }
        if params.temperature < 1e-5 {
            return self.op_argmax(logits);
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
        let mut b = self.stream.launch_builder(self.k.get("sample_rows"));
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

    /// Row-wise top-k + log-sum-exp (see [`sparkling_core::Backend::topk`]). `k ≤ 2048` runs on the device
    /// (two-stage exact selection, shaders/cuda/topk.cu); a larger k (beyond any tree budget)
    /// reads the logits back and uses the host reference (`sparkling_core::select`). Errors: `k == 0` ([`Error::Invalid`]).
    pub(crate) fn op_topk(&self, logits: &CudaTensor, k: usize) -> Result<TopK> {
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
            return select::topk(&self.op_download_rows(logits, 0, rows)?, rows, cols, k);
        }
        let (ids, vals, lse) = self.launch_topk(logits, k)?;
        Ok(TopK { k, ids: self.read("topk", &ids, rows * k)?, vals: self.read("topk", &vals, rows * k)?, lse: self.read("topk", &lse, rows)? })
    }

    /// Launch topk.cu for `1 ≤ k ≤ min(cols, TOPK_MAX)` and `rows ≥ 1`; the results stay on the
    /// device: ids `[rows, k]`, values `[rows, k]`, lse `[rows]`.
    #[allow(clippy::type_complexity)]
    fn launch_topk(&self, logits: &CudaTensor, k: usize) -> Result<(CudaSlice<u32>, CudaSlice<f32>, CudaSlice<f32>)> {
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
        let mut b = self.stream.launch_builder(self.k.get("topk_segments"));
        b.arg(&logits.buf).arg(&c32).arg(&s32).arg(&k32).arg(&mut part_key).arg(&mut part_id).arg(&mut part_max).arg(&mut part_sum);
        // SAFETY: partial buffers hold rows*n_seg*k (keys/ids) and rows*n_seg (max/sum) values.
        unsafe { b.launch(grid) }.map_err(dev("topk"))?;
        let mut ids = self.alloc::<u32>("topk", rows * k)?;
        let mut vals = self.alloc::<f32>("topk", rows * k)?;
        let mut lse = self.alloc::<f32>("topk", rows)?;
        let mut b = self.stream.launch_builder(self.k.get("topk_merge"));
        b.arg(&logits.buf).arg(&c32).arg(&ns32).arg(&k32).arg(&cnt32).arg(&part_key).arg(&part_id).arg(&part_max).arg(&part_sum);
        b.arg(&mut ids).arg(&mut vals).arg(&mut lse);
        // SAFETY: count ≤ n_seg*k valid candidates per row; outputs rows*k and rows.
        unsafe { b.launch(cfg(rows as u32, 256)) }.map_err(dev("topk"))?;
        Ok((ids, vals, lse))
    }

    /// The Markov candidate table on the device (see [`sparkling_core::Backend::markov_table`];
    /// shaders/cuda/markov_table.cu). `k` beyond 2048 (after clamping to the candidate count)
    /// falls back to the host reference (`sparkling_core::select`) on read-back copies. Errors
    /// as the trait documents (the shared checks of `sparkling_core::select`).
    pub(crate) fn op_markov_table(&self, base: &CudaTensor, markov: Option<(&CudaTensor, &CudaTensor)>, cand: &[u32], k: usize) -> Result<CandidateTable> {
        let vocab = base.cols;
        check_markov_table_args(vocab, markov.map(|(a, b)| ((a.rows, a.cols), (b.rows, b.cols))), cand, k)?;
        let (ld, n) = (base.rows, cand.len());
        let k = k.min(n);
        if ld == 0 {
            return Ok(CandidateTable { cand: cand.to_vec(), ld, k, vals: Vec::new(), slots: Vec::new() });
        }
        if k > TOPK_MAX {
            let dl = |t: &CudaTensor| self.op_download_rows(t, 0, t.rows);
            let b = dl(base)?;
            let m = match markov {
                Some((w1, w2)) => Some((dl(w1)?, dl(w2)?, w1.cols)),
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
        self.launch_markov_table("markov_table", base, markov, &cand_dev, n, k, &mut vals.slice_mut(..), &mut slots.slice_mut(..))?;
        Ok(CandidateTable {
            cand: cand.to_vec(),
            ld,
            k,
            vals: self.read("markov_table", &vals, ld * n * k)?,
            slots: self.read("markov_table", &slots, ld * n * k)?,
        })
    }

    /// Launch markov_table.cu over the header-word candidate buffer `cand` = `[n, ids...]` with
    /// `1 ≤ n ≤ n_max` (n possibly known only on the device) and `1 ≤ k ≤ min(n_max, TOPK_MAX)`
    /// children requested (the kernels clamp to n). Grids are sized for `n_max` (markov_bias:
    /// `ceil(n_max/16)²` tiles; markov_rows: `ld·n_max` blocks with a head, `ld` without) and
    /// blocks past n exit; the kernels use the actual n for every stride, so the `[ld, n, k']`
    /// table (`k' = min(k, n)`) is packed at the front of `vals` / `slots` (each of at least
    /// `ld·n_max·k` words). Shapes of W1/W2 must have been checked.
    #[allow(clippy::too_many_arguments)]
    fn launch_markov_table<V>(
        &self,
        op: &'static str,
        base: &CudaTensor,
        markov: Option<(&CudaTensor, &CudaTensor)>,
        cand: &CudaSlice<u32>,
        n_max: usize,
        k: usize,
        vals: &mut CudaViewMut<'_, V>,
        slots: &mut CudaViewMut<'_, u32>,
    ) -> Result<()> {
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
                let mut b = self.stream.launch_builder(self.k.get("markov_bias"));
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
        let mut b = self.stream.launch_builder(self.k.get(if shared { "markov_rows_shared" } else { "markov_rows_global" }));
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
    fn check_union_args(&self, base: &CudaTensor, markov: Option<(&CudaTensor, &CudaTensor)>, candidates: usize, anchor: u32, k: usize) -> Result<()> {
        check_candidate_table_args(base.cols, candidates, anchor, k)?;
        check_markov_table_args(base.cols, markov.map(|(a, b)| ((a.rows, a.cols), (b.rows, b.cols))), &[anchor], k)
    }

    /// topk.cu (top-`c` per depth row, kept on the device) then candidate_union.cu: returns
    /// the candidate buffer `[n, ascending distinct ids]` of capacity `1 + n_max`. Requires
    /// `ld ≥ 1` and `1 ≤ c ≤ min(V - 1, TOPK_MAX)`.
    fn launch_union(&self, op: &'static str, base: &CudaTensor, c: usize, anchor: u32, n_max: usize) -> Result<CudaSlice<u32>> {
        let (ld, vocab) = (base.rows, base.cols);
        let (ids, _vals, _lse) = self.launch_topk(base, c)?;
        let (ld32, c32, v32) = (to_u32(op, "depth rows", ld)?, to_u32(op, "candidates", c)?, to_u32(op, "vocab", vocab)?);
        to_u32(op, "ld·candidates", ld * c)?;
        let mut bits = self.alloc::<u32>(op, vocab.div_ceil(32))?;
        let mut cand = self.alloc::<u32>(op, 1 + n_max)?;
        let mut b = self.stream.launch_builder(self.k.get("candidate_union"));
        b.arg(&ids).arg(&ld32).arg(&c32).arg(&v32).arg(&anchor).arg(&mut bits).arg(&mut cand);
        // SAFETY: ids [ld, c] with every id < vocab, anchor < vocab (checked), bits
        // ceil(vocab/32) words, cand 1 + n_max ≥ 1 + n words (n ≤ min(ld·c + 1, vocab)).
        unsafe { b.launch(cfg(1, UNION_THREADS)) }.map_err(dev(op))?;
        Ok(cand)
    }

    /// SparklingTree tree prep with ONE read-back ([`sparkling_core::Backend::candidate_table`]): topk.cu
    /// writes the per-row top-`candidates` ids into a device buffer `[ld, C]` (not read back);
    /// candidate_union.cu (one block, a `ceil(V/32)`-word bitmap) turns them and the anchor into
    /// `[n, ascending distinct ids]`; markov_table.cu reads n from that header word (grids
    /// sized for `n_max = min(ld·C + 1, V)`, blocks past n exit, the table packed with the
    /// actual n); the candidate buffer is copied (device to device) in front of the table and
    /// `1 + n_max + 2·ld·n_max·k'` words (`k' = min(k, n_max)`) come back in one copy.
    ///
    /// `candidates ≥ V`: the whole vocabulary and the plain [`CudaBackend::op_markov_table`].
    /// `ld == 0`: `cand = [anchor]`, an empty table, no device work. `C` or `k'` above the
    /// device top-k limit (2048): the trait's default composition (topk + host union +
    /// markov_table, which fall back to the CPU reference themselves).
    /// Errors: `k == 0`, `candidates == 0`, `anchor ≥ V` ([`Error::Invalid`]); W1/W2 not
    /// `[V, r]` ([`Error::Shape`]); device failures.
    pub(crate) fn op_candidate_table(
        &self,
        base: &CudaTensor,
        markov: Option<(&CudaTensor, &CudaTensor)>,
        candidates: usize,
        anchor: u32,
        k: usize,
    ) -> Result<CandidateTable> {
        const OP: &str = "candidate_table";
        let (ld, vocab) = (base.rows, base.cols);
        self.check_union_args(base, markov, candidates, anchor, k)?;
        if candidates >= vocab {
            let cand: Vec<u32> = (0..vocab as u32).collect();
            return self.op_markov_table(base, markov, &cand, k);
        }
        if ld == 0 {
            return Ok(CandidateTable { cand: vec![anchor], ld: 0, k: 1, vals: Vec::new(), slots: Vec::new() });
        }
        let n_max = ld.saturating_mul(candidates).saturating_add(1).min(vocab);
        let kk = k.min(n_max);
        if candidates > TOPK_MAX || kk > TOPK_MAX {
            return self.host_union_table(base, markov, candidates, anchor, k);
        }
        let cand = self.launch_union(OP, base, candidates, anchor, n_max)?;
        let cand_words = 1 + n_max;
        let table_words = ld * n_max * kk;
        let total = cand_words + 2 * table_words;
        let mut res = self.alloc::<u32>(OP, total)?;
        {
            let (mut head, mut tail) = res.split_at_mut(cand_words);
            let (mut slots, mut vals) = tail.split_at_mut(table_words);
            self.launch_markov_table(OP, base, markov, &cand, n_max, kk, &mut vals, &mut slots)?;
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

    /// The trait's default composition of [`sparkling_core::Backend::candidate_table`] (two read-backs), for
    /// the sizes the fused device path does not take.
    fn host_union_table(
        &self,
        base: &CudaTensor,
        markov: Option<(&CudaTensor, &CudaTensor)>,
        candidates: usize,
        anchor: u32,
        k: usize,
    ) -> Result<CandidateTable> {
        let cand = select::candidate_union(self.op_topk(base, candidates)?.ids, anchor);
        self.op_markov_table(base, markov, &cand, k.min(cand.len()))
    }

    /// SparklingTree's whole tree prep on the device ([`sparkling_core::Backend::sparkling_tree`]): the
    /// pipeline of [`CudaBackend::op_candidate_table`] (topk.cu → candidate_union.cu →
    /// markov_table.cu, nothing read back), then tree_heap.cu (one thread) runs the best-first
    /// precompute heap over the table; only the tree comes back, `1 + 4·budget` words.
    /// `None` when `candidates ≥ V` (the union is the whole vocabulary: use
    /// `candidate_table`) or when `C` / `k'` exceed the device top-k limit (2048).
    /// Errors: as `op_candidate_table`; the anchor missing from the device's union (a device
    /// fault: it is always inserted) or a node count above the budget is [`Error::Device`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn op_sparkling_tree(
        &self,
        base: &CudaTensor,
        markov: Option<(&CudaTensor, &CudaTensor)>,
        candidates: usize,
        anchor: u32,
        k: usize,
        budget: usize,
    ) -> Result<Option<DraftTree>> {
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
        self.launch_markov_table(OP, base, markov, &cand, n_max, kk, &mut vals.slice_mut(..), &mut slots.slice_mut(..))?;
        let mut heap = self.alloc::<u32>(OP, 5 * (2 * budget + 1))?;
        let mut node_slot = self.alloc::<u32>(OP, budget + 1)?;
        let mut out = self.alloc::<u32>(OP, 1 + 4 * budget)?;
        let (ld32, k32) = (to_u32(OP, "depth rows", ld)?, kk as u32);
        let mut b = self.stream.launch_builder(self.k.get("tree_heap"));
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
