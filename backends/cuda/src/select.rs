//! The read-back ops: argmax, sampling, top-k + log-sum-exp and the Markov candidate table
//! (shaders/cuda/argmax.cu, sample.cu, topk.cu, markov_table.cu). Each ends with one
//! device→host copy of its (small) result.

use crate::tensor::CudaTensor;
use crate::{dev, shape_err, to_u32, CudaBackend};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use sparkling_core::{Backend, Error, MarkovTable, Result, SampleParams, TopK};

/// `TOPK_MAX` of block_topk.cuh: the largest k selected on the device.
pub(crate) const TOPK_MAX: usize = 2048;
/// Columns per first-stage block of topk.cu (at least k).
const TOPK_SEGMENT: usize = 8192;
/// Candidate counts up to this keep a Markov row's logits in shared memory.
const MARKOV_SHARED_MAX_N: usize = 6144;

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

    /// Row-wise top-k + log-sum-exp (see [`Backend::topk`]). `k ≤ 2048` runs on the device
    /// (two-stage exact selection, shaders/cuda/topk.cu); a larger k (beyond any tree budget)
    /// reads the logits back and uses the CPU reference. Errors: `k == 0` ([`Error::Invalid`]).
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
            let host = sparkling_cpu::CpuTensor { rows, cols, data: self.op_download_rows(logits, 0, rows)? };
            return sparkling_cpu::CpuBackend::new().topk(&host, k);
        }
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
        Ok(TopK { k, ids: self.read("topk", &ids, rows * k)?, vals: self.read("topk", &vals, rows * k)?, lse: self.read("topk", &lse, rows)? })
    }

    /// The Markov candidate table on the device (see [`Backend::markov_table`];
    /// shaders/cuda/markov_table.cu). `k` beyond 2048 (after clamping to the candidate count)
    /// falls back to the CPU reference on read-back copies. Errors as the trait documents
    /// (shared checks of the CPU backend).
    pub(crate) fn op_markov_table(&self, base: &CudaTensor, markov: Option<(&CudaTensor, &CudaTensor)>, cand: &[u32], k: usize) -> Result<MarkovTable> {
        let vocab = base.cols;
        sparkling_cpu::check_markov_table_args(vocab, markov.map(|(a, b)| ((a.rows, a.cols), (b.rows, b.cols))), cand, k)?;
        let (ld, n) = (base.rows, cand.len());
        let k = k.min(n);
        if ld == 0 {
            return Ok(MarkovTable { k, vals: Vec::new(), slots: Vec::new() });
        }
        if k > TOPK_MAX {
            let dl = |t: &CudaTensor| -> Result<sparkling_cpu::CpuTensor> { Ok(sparkling_cpu::CpuTensor { rows: t.rows, cols: t.cols, data: self.op_download_rows(t, 0, t.rows)? }) };
            let b = dl(base)?;
            let m = match markov {
                Some((w1, w2)) => Some((dl(w1)?, dl(w2)?)),
                None => None,
            };
            return sparkling_cpu::CpuBackend::new().markov_table(&b, m.as_ref().map(|(a, c)| (a, c)), cand, k);
        }
        let (v32, n32, k32) = (to_u32("markov_table", "vocab", vocab)?, to_u32("markov_table", "candidates", n)?, k as u32);
        let cand_dev = self.upload_slice("markov_table", cand)?;
        let bias = match markov {
            Some((w1, w2)) => {
                let r32 = to_u32("markov_table", "rank", w1.cols)?;
                let mut bias = self.alloc::<f32>("markov_table", n * n)?;
                let tiles = to_u32("markov_table", "tiles", n.div_ceil(16))?;
                if tiles > 65535 {
                    return Err(Error::Invalid(format!("markov_table: {n} candidates exceed the bias kernel's grid")));
                }
                let grid = LaunchConfig { grid_dim: (tiles, tiles, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
                let mut b = self.stream.launch_builder(self.k.get("markov_bias"));
                b.arg(&w1.buf).arg(&w2.buf).arg(&r32).arg(&cand_dev).arg(&n32).arg(&mut bias);
                // SAFETY: W1/W2 are [vocab, r] (checked), candidates < vocab, bias n*n.
                unsafe { b.launch(grid) }.map_err(dev("markov_table"))?;
                Some(bias)
            }
            None => None,
        };
        let has_bias = u32::from(bias.is_some());
        let blocks = if bias.is_some() { ld * n } else { ld };
        let mut vals = self.alloc::<f32>("markov_table", ld * n * k)?;
        let mut slots = self.alloc::<u32>("markov_table", ld * n * k)?;
        let shared = n <= MARKOV_SHARED_MAX_N;
        let launch = LaunchConfig {
            grid_dim: (to_u32("markov_table", "rows", blocks)?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: if shared { (n * 4) as u32 } else { 0 },
        };
        let null = 0u64;
        let mut b = self.stream.launch_builder(self.k.get(if shared { "markov_rows_shared" } else { "markov_rows_global" }));
        b.arg(&base.buf).arg(&v32).arg(&cand_dev).arg(&n32);
        match &bias {
            Some(bb) => b.arg(bb),
            None => b.arg(&null),
        };
        b.arg(&has_bias).arg(&k32).arg(&mut vals).arg(&mut slots);
        // SAFETY: base [ld, vocab], candidates < vocab, bias n*n or null with has_bias = 0,
        // outputs ld*n*k.
        unsafe { b.launch(launch) }.map_err(dev("markov_table"))?;
        Ok(MarkovTable { k, vals: self.read("markov_table", &vals, ld * n * k)?, slots: self.read("markov_table", &slots, ld * n * k)? })
    }
}
