//! The selection ops that end in a small read-back: row-wise top-k + log-sum-exp
//! (shaders/topk.wgsl), the Markov candidate table (shaders/markov_bias.wgsl +
//! shaders/table_topk.wgsl) and sampling (shaders/sample.wgsl). Each op checks its arguments on
//! the host, records its dispatches into the open batch and ends with one read-back of only
//! its result (a sync point): `rows·(2k+1)` words for top-k, `ld·n·2k` for the table, `rows`
//! for sampling.

use crate::ctx::Bind;
use crate::pipelines::{Kernel, BIAS_COLS, BIAS_ROWS, GATHER_PER_GROUP};
use crate::tensor::WgpuTensor;
use crate::WgpuBackend;
use sparkling_core::{Error, MarkovTable, Result, SampleParams, TopK};

impl WgpuBackend {
    /// Row-wise top-`k` + log-sum-exp on the device ([`sparkling_core::Backend::topk`]):
    /// `k` is clamped to `cols`; ids/vals exact (f32::total_cmp order, ties by lower id), `lse`
    /// in f32 (topk.wgsl documents the precision). Reads back `rows·(2k+1)` words.
    /// Errors: `k == 0` ([`Error::Invalid`]); outputs beyond one storage binding
    /// ([`Error::Device`]).
    pub(crate) fn op_topk(&self, logits: &WgpuTensor, k: usize) -> Result<TopK> {
        if k == 0 {
            return Err(Error::Invalid("topk: k must be at least 1".into()));
        }
        let g = &self.gpu;
        g.check()?;
        let (rows, cols) = (logits.rows, logits.cols);
        let k = k.min(cols);
        if k == 0 || rows == 0 {
            // No columns: like the CPU reference, nothing per row (not even an lse).
            return Ok(TopK { k, ids: Vec::new(), vals: Vec::new(), lse: Vec::new() });
        }
        let words = 2 * k + 1;
        let out = g.alloc("topk (ids, values, lse)", rows, words)?;
        let scratch = g.alloc("topk (scratch)", rows, 2 * k)?;
        let mut b = g.batch();
        let params = [rows as u32, cols as u32, k as u32];
        g.dispatch(&mut b, Kernel::TopK(g.reduce), &params, &[Bind::t(logits), Bind::t(&out), Bind::t(&scratch)], rows as u64)?;
        g.submit(b);
        let bytes = g.read_back(out.buffer(), 0, out.bytes())?;
        let w: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
        let mut r = TopK { k, ids: Vec::with_capacity(rows * k), vals: Vec::with_capacity(rows * k), lse: Vec::with_capacity(rows) };
        for row in w.chunks_exact(words) {
            r.ids.extend_from_slice(&row[..k]);
            r.vals.extend(row[k..2 * k].iter().map(|&v| f32::from_bits(v)));
            r.lse.push(f32::from_bits(row[2 * k]));
        }
        Ok(r)
    }

    /// The Markov candidate table on the device ([`sparkling_core::Backend::markov_table`]):
    /// markov_gather.wgsl transposes W2's candidate rows once; for each chunk of parent slots,
    /// markov_bias.wgsl fills `bias [chunk, n]` (both skipped without a Markov head), then
    /// table_topk.wgsl computes every (depth, parent) row of the chunk; one read-back of the
    /// whole `[ld, n, k]` table at the end. Parent chunks keep the
    /// bias and scratch buffers within one storage binding.
    /// Errors: the argument checks of `sparkling_cpu::check_markov_table_args` (empty or
    /// unsorted candidates, an id `≥ V`, `k == 0`, W1/W2 not `[V, r]`); a table larger than
    /// one storage binding ([`Error::Device`]).
    pub(crate) fn op_markov_table(
        &self,
        base: &WgpuTensor,
        markov: Option<(&WgpuTensor, &WgpuTensor)>,
        cand: &[u32],
        k: usize,
    ) -> Result<MarkovTable> {
        let g = &self.gpu;
        let vocab = base.cols;
        sparkling_cpu::check_markov_table_args(vocab, markov.map(|(a, b)| ((a.rows, a.cols), (b.rows, b.cols))), cand, k)?;
        g.check()?;
        let (ld, n) = (base.rows, cand.len());
        let k = k.min(n);
        if ld == 0 {
            return Ok(MarkovTable { k, vals: Vec::new(), slots: Vec::new() });
        }
        let words = 2 * k;
        let out = g.alloc("markov_table (slots, values)", ld * n, words)?;
        // Parent slots per chunk: the bias [pc, n] and the scratch [ld·pc, 2k] each fit a binding.
        let per_bias_row = 4 * n as u64;
        let per_scratch_row = (ld * words * 4) as u64;
        let pc = if markov.is_some() { (g.max_binding / per_bias_row).min(g.max_binding / per_scratch_row) } else { g.max_binding / per_scratch_row };
        let pc = (pc as usize).min(n);
        if pc == 0 {
            return Err(Error::Device(format!(
                "markov_table: one parent row of {n} candidates × {ld} depths × k = {k} exceeds the storage binding limit of {} bytes",
                g.max_binding
            )));
        }
        let cand_buf = g.upload_u32(cand)?;
        let cand_bytes = n as u64 * 4;
        let bias = match markov {
            Some(_) => Some(g.alloc("markov_table (bias)", pc, n)?),
            None => None,
        };
        let scratch = g.alloc("markov_table (scratch)", ld * pc, words)?;
        let mut b = g.batch();
        // W2's candidate rows, transposed: e2t [r, n].
        let e2t = match markov {
            Some((_, w2)) => {
                let e2t = g.alloc("markov_table (candidate W2ᵀ)", w2.cols, n)?;
                let total = (w2.cols * n) as u64;
                g.dispatch(
                    &mut b,
                    Kernel::MarkovGather,
                    &[n as u32, w2.cols as u32],
                    &[Bind::t(w2), Bind::b(cand_buf.buffer(), cand_bytes), Bind::t(&e2t)],
                    total.div_ceil(GATHER_PER_GROUP),
                )?;
                Some(e2t)
            }
            None => None,
        };
        for p0 in (0..n).step_by(pc) {
            let rows = pc.min(n - p0);
            if let (Some((w1, _)), Some(bias), Some(e2t)) = (markov, bias.as_ref(), e2t.as_ref()) {
                let col_groups = (n as u64).div_ceil(BIAS_COLS);
                let params = [n as u32, w1.cols as u32, p0 as u32, rows as u32, col_groups as u32];
                g.dispatch(
                    &mut b,
                    Kernel::MarkovBias,
                    &params,
                    &[Bind::t(w1), Bind::t(e2t), Bind::b(cand_buf.buffer(), cand_bytes), Bind::t(bias)],
                    (rows as u64).div_ceil(BIAS_ROWS) * col_groups,
                )?;
            }
            let bias_bind = match bias.as_ref() {
                Some(t) => Bind::t(t),
                None => Bind::b(&self.dummy, 16),
            };
            let params = [ld as u32, n as u32, k as u32, vocab as u32, p0 as u32, rows as u32, bias.is_some() as u32];
            g.dispatch(
                &mut b,
                Kernel::TableTopK(g.reduce),
                &params,
                &[Bind::t(base), Bind::b(cand_buf.buffer(), cand_bytes), bias_bind, Bind::t(&out), Bind::t(&scratch)],
                (ld * rows) as u64,
            )?;
        }
        b.keep(cand_buf);
        g.submit(b);
        let bytes = g.read_back(out.buffer(), 0, out.bytes())?;
        let w: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
        let mut t = MarkovTable { k, vals: Vec::with_capacity(ld * n * k), slots: Vec::with_capacity(ld * n * k) };
        for row in w.chunks_exact(words) {
            t.slots.extend_from_slice(&row[..k]);
            t.vals.extend(row[k..].iter().map(|&v| f32::from_bits(v)));
        }
        Ok(t)
    }

    /// Row-wise sampling on the device ([`sparkling_core::Backend::sample`]). At `T < 1e-5`
    /// this is the device argmax; otherwise sample.wgsl draws from softmax(logits/T) filtered
    /// by top-k / top-p with the CPU backend's rule (inverse CDF over kept tokens in ascending
    /// id order, one uniform per row; f32 arithmetic — see sample.wgsl for the precision).
    /// Reads back one `u32` per row.
    /// Errors: `uniforms.len() != rows` ([`Error::Shape`]); a NaN temperature or top-p
    /// ([`Error::Invalid`]).
    pub(crate) fn op_sample(&self, logits: &WgpuTensor, params: SampleParams, uniforms: &[f32]) -> Result<Vec<u32>> {
        if uniforms.len() != logits.rows {
            return Err(Error::Shape { op: "sample", detail: format!("{} uniforms for {} rows", uniforms.len(), logits.rows) });
        }
        if params.temperature.is_nan() || params.top_p.is_nan() {
            return Err(Error::Invalid(format!(
                "sample: temperature ({}) and top_p ({}) must be numbers",
                params.temperature, params.top_p
            )));
        }
        if params.temperature < 1e-5 {
            return self.op_argmax(logits);
        }
        let g = &self.gpu;
        g.check()?;
        let (rows, cols) = (logits.rows, logits.cols);
        if rows == 0 {
            return Ok(Vec::new());
        }
        if cols == 0 {
            return Ok(vec![0; rows]);
        }
        let top_k_on = params.top_k > 0 && params.top_k < cols;
        let filter = top_k_on || params.top_p < 1.0;
        let k_eff = if top_k_on { params.top_k } else { cols };
        let inv_t = (1.0 / params.temperature as f64) as f32;
        let u_words: Vec<u32> = uniforms.iter().map(|u| u.to_bits()).collect();
        let u_buf = g.upload_u32(&u_words)?;
        let out = g.alloc("sample", rows, 1)?;
        let p = [rows as u32, cols as u32, inv_t.to_bits(), k_eff as u32, params.top_p.to_bits(), filter as u32];
        let mut b = g.batch();
        g.dispatch(
            &mut b,
            Kernel::Sample(g.reduce),
            &p,
            &[Bind::t(logits), Bind::b(u_buf.buffer(), rows as u64 * 4), Bind::t(&out)],
            rows as u64,
        )?;
        b.keep(u_buf);
        g.submit(b);
        let bytes = g.read_back(out.buffer(), 0, rows as u64 * 4)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }
}
