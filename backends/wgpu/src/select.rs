//! The selection ops that end in a small read-back: row-wise top-k + log-sum-exp
//! (shaders/topk.wgsl), the Markov candidate table (shaders/markov_gather.wgsl +
//! shaders/markov_bias.wgsl + shaders/table_topk.wgsl), the fused SparklingTree tree prep
//! `candidate_table` (topk + shaders/candidate_union.wgsl + the table kernels) and sampling
//! (shaders/sample.wgsl). Each op checks its arguments on the host, records its dispatches into
//! the open batch and ends with one read-back of only its result (a sync point): `rows·(2k+1)`
//! words for top-k, `ld·n·2k` for the table, `1 + n_max + ld·n_max·2k` for candidate_table
//! (sized for the largest possible union `n_max = min(ld·C + 1, V)`, since the actual n is
//! known only on the device), `1 + 4·budget` for `sparkling_tree` (the same pipeline plus
//! shaders/tree_heap.wgsl: the best-first tree built on the device), `rows` for sampling.

use crate::ctx::{Batch, Bind, Pending};
use crate::pipelines::{Kernel, BIAS_COLS, BIAS_ROWS, GATHER_PER_GROUP};
use crate::tensor::WgpuTensor;
use crate::WgpuBackend;
use sparkling_core::select::{check_candidate_table_args, check_markov_table_args};
use sparkling_core::{CandidateArgs, CandidateTable, DraftTree, Error, Result, SampleParams, TopK};

/// Buffers and parent chunking of one candidate-table computation
/// ([`WgpuBackend::plan_markov_table`]).
struct TablePlan {
    ld: usize,
    /// Candidate capacity (the actual count may be lower, read from the cand header word).
    n_max: usize,
    /// Children per row requested of the kernels (≤ n_max; the kernel clamps to n).
    k: usize,
    /// Parents per chunk.
    pc: usize,
    /// `[ld·n_max, 2k]`; the table is packed at its front with the actual n and k.
    out: WgpuTensor,
    bias: Option<WgpuTensor>,
    e2t: Option<WgpuTensor>,
    scratch: WgpuTensor,
}

/// Buffers of the fused top-C → union → table pipeline ([`WgpuBackend::plan_union_table`]).
struct UnionPlan {
    /// Candidates per depth row (C).
    c: usize,
    /// Largest possible union: `min(ld·C + 1, V)`.
    n_max: usize,
    top: WgpuTensor,
    top_scratch: WgpuTensor,
    bitmap: WgpuTensor,
    /// `[n, ascending ids]`, capacity `1 + n_max`.
    cand: WgpuTensor,
    /// Dispatch grids of the table kernels for the actual n (candidate_union.wgsl writes them):
    /// gather, then (bias, table) per parent chunk, three words each.
    grids: WgpuTensor,
    table: TablePlan,
}

/// Split `[ld·n, 2k]` table words (`[slots: k][vals: k]` per row) into the [`CandidateTable`]
/// over `cand` (`n = cand.len()`).
fn unpack_table(cand: Vec<u32>, ld: usize, w: &[u32], k: usize) -> CandidateTable {
    let mut t = CandidateTable { cand, ld, k, vals: Vec::with_capacity(w.len() / 2), slots: Vec::with_capacity(w.len() / 2) };
    if k == 0 {
        return t;
    }
    for row in w.chunks_exact(2 * k) {
        t.slots.extend_from_slice(&row[..k]);
        t.vals.extend(row[k..].iter().map(|&v| f32::from_bits(v)));
    }
    t
}

impl WgpuBackend {
    /// Row-wise argmax on the device (shaders/argmax.wgsl), then a read-back of one `u32` per
    /// row (a sync point).
    pub(crate) fn start_argmax(&self, logits: &WgpuTensor) -> Result<Pending<Vec<u32>>> {
        let g = &self.gpu;
        g.check()?;
        let rows = logits.rows;
        if rows == 0 {
            return Ok(Pending::ready(Vec::new()));
        }
        if logits.cols == 0 {
            return Ok(Pending::ready(vec![0; rows]));
        }
        let ids = g.alloc("argmax", rows, 1)?;
        let mut b = g.batch();
        g.dispatch(&mut b, Kernel::Argmax(g.reduce), &[rows as u32, logits.cols as u32], &[Bind::t(logits), Bind::t(&ids)], rows as u64)?;
        g.submit(b);
        let r = g.start_read(&[(ids.buffer(), 0, rows as u64 * 4)])?;
        Ok(Pending::new(r, |parts| Ok(bytemuck::pod_collect_to_vec(&parts[0]))))
    }

    /// Row-wise top-`k` + log-sum-exp on the device ([`sparkling_core::Backend::topk_async`]):
    /// `k` is clamped to `cols`; ids/vals exact (f32::total_cmp order, ties by lower id), `lse`
    /// in f32 (topk.wgsl documents the precision). Reads back `rows·(2k+1)` words.
    /// Errors: `k == 0` ([`Error::Invalid`]); outputs beyond one storage binding
    /// ([`Error::Device`]).
    pub(crate) fn start_topk(&self, logits: &WgpuTensor, k: usize) -> Result<Pending<TopK>> {
        if k == 0 {
            return Err(Error::Invalid("topk: k must be at least 1".into()));
        }
        let g = &self.gpu;
        g.check()?;
        let (rows, cols) = (logits.rows, logits.cols);
        let k = k.min(cols);
        if k == 0 || rows == 0 {
            // No columns: like the CPU reference, nothing per row (not even an lse).
            return Ok(Pending::ready(TopK { k, ids: Vec::new(), vals: Vec::new(), lse: Vec::new() }));
        }
        let words = 2 * k + 1;
        let out = g.alloc("topk (ids, values, lse)", rows, words)?;
        let scratch = g.alloc("topk (scratch)", rows, 2 * k)?;
        let mut b = g.batch();
        let params = [rows as u32, cols as u32, k as u32];
        g.dispatch(&mut b, Kernel::TopK(g.reduce), &params, &[Bind::t(logits), Bind::t(&out), Bind::t(&scratch)], rows as u64)?;
        g.submit(b);
        let reading = g.start_read(&[(out.buffer(), 0, out.bytes())])?;
        Ok(Pending::new(reading, move |parts| {
            let w: Vec<u32> = bytemuck::pod_collect_to_vec(&parts[0]);
            let mut r = TopK { k, ids: Vec::with_capacity(rows * k), vals: Vec::with_capacity(rows * k), lse: Vec::with_capacity(rows) };
            for row in w.chunks_exact(words) {
                r.ids.extend_from_slice(&row[..k]);
                r.vals.extend(row[k..2 * k].iter().map(|&v| f32::from_bits(v)));
                r.lse.push(f32::from_bits(row[2 * k]));
            }
            Ok(r)
        }))
    }

    /// The Markov candidate table on the device ([`sparkling_core::Backend::markov_table_async`]):
    /// the candidates are uploaded as `[n, id_0, ..., id_{n-1}]` (the header-word layout that
    /// candidate_union.wgsl also produces, so both ops share the kernels); markov_gather.wgsl
    /// transposes W2's candidate rows once; for each chunk of parent slots, markov_bias.wgsl
    /// fills `bias [chunk, n]` (both skipped without a Markov head), then table_topk.wgsl
    /// computes every (depth, parent) row of the chunk; one read-back of the whole `[ld, n, k]`
    /// table at the end. Parent chunks keep the bias and scratch buffers within one storage
    /// binding.
    /// Errors: the argument checks of `check_markov_table_args` (empty or
    /// unsorted candidates, an id `≥ V`, `k == 0`, W1/W2 not `[V, r]`); a table larger than
    /// one storage binding ([`Error::Device`]).
    pub(crate) fn start_markov_table(
        &self,
        base: &WgpuTensor,
        markov: Option<(&WgpuTensor, &WgpuTensor)>,
        cand: &[u32],
        k: usize,
    ) -> Result<Pending<CandidateTable>> {
        let g = &self.gpu;
        let vocab = base.cols;
        check_markov_table_args(vocab, markov.map(|(a, b)| ((a.rows, a.cols), (b.rows, b.cols))), cand, k)?;
        g.check()?;
        let (ld, n) = (base.rows, cand.len());
        let k = k.min(n);
        if ld == 0 {
            return Ok(Pending::ready(CandidateTable { cand: cand.to_vec(), ld, k, vals: Vec::new(), slots: Vec::new() }));
        }
        let plan = self.plan_markov_table("markov_table", ld, n, k, markov)?;
        let mut words = Vec::with_capacity(n + 1);
        words.push(n as u32);
        words.extend_from_slice(cand);
        let cand_buf = g.upload_u32(&words)?;
        let mut b = g.batch();
        self.record_markov_table(&mut b, &plan, base, markov, Bind::b(cand_buf.buffer(), words.len() as u64 * 4), None)?;
        b.keep(cand_buf);
        g.submit(b);
        let r = g.start_read(&[(plan.out.buffer(), 0, plan.out.bytes())])?;
        let cand = cand.to_vec();
        Ok(Pending::new(r, move |parts| Ok(unpack_table(cand, ld, &bytemuck::pod_collect_to_vec(&parts[0]), k))))
    }

    /// Buffers and parent chunking of the candidate table for at most `n_max` candidates and
    /// `k` (≤ `n_max`) children per row: `out [ld·n_max, 2k]`, and per chunk of `pc` parents
    /// `bias [pc, n_max]` (with a Markov head) and `scratch [ld·pc, 2k]`, each within one
    /// storage binding; `e2t [r, n_max]` with a head.
    /// Errors: one parent row (or the output) exceeding the binding limit ([`Error::Device`],
    /// naming `op`).
    fn plan_markov_table(&self, op: &str, ld: usize, n_max: usize, k: usize, markov: Option<(&WgpuTensor, &WgpuTensor)>) -> Result<TablePlan> {
        let g = &self.gpu;
        let words = 2 * k;
        let out = g.alloc(&format!("{op} (slots, values)"), ld * n_max, words)?;
        // Parent slots per chunk: the bias [pc, n] and the scratch [ld·pc, 2k] each fit a binding.
        let per_bias_row = 4 * n_max as u64;
        let per_scratch_row = (ld * words * 4) as u64;
        let pc = if markov.is_some() { (g.max_binding / per_bias_row).min(g.max_binding / per_scratch_row) } else { g.max_binding / per_scratch_row };
        let pc = (pc as usize).min(n_max);
        if pc == 0 {
            return Err(Error::Device(format!(
                "{op}: one parent row of {n_max} candidates × {ld} depths × k = {k} exceeds the storage binding limit of {} bytes",
                g.max_binding
            )));
        }
        let bias = match markov {
            Some(_) => Some(g.alloc(&format!("{op} (bias)"), pc, n_max)?),
            None => None,
        };
        let e2t = match markov {
            Some((_, w2)) => Some(g.alloc(&format!("{op} (candidate W2ᵀ)"), w2.cols, n_max)?),
            None => None,
        };
        let scratch = g.alloc(&format!("{op} (scratch)"), ld * pc, words)?;
        Ok(TablePlan { ld, n_max, k, pc, out, bias, e2t, scratch })
    }

    /// Record the candidate-table dispatches of `plan` into the open batch `b`: `cand` is the
    /// `[n, id_0, ..., id_{n-1}]` buffer (n ≤ n_max, known only on the device for the fused
    /// op); grids and chunks are sized for n_max and the kernels exit beyond n.
    fn record_markov_table(
        &self,
        b: &mut Batch,
        plan: &TablePlan,
        base: &WgpuTensor,
        markov: Option<(&WgpuTensor, &WgpuTensor)>,
        cand: Bind<'_>,
        grids: Option<&WgpuTensor>,
    ) -> Result<()> {
        let g = &self.gpu;
        let TablePlan { ld, n_max, k, pc, .. } = *plan;
        let cand_bind = || Bind::b(cand.buffer, cand.bytes);
        // Grid `i` (three words at 12·i bytes) of candidate_union.wgsl, else `groups` sized for n_max.
        let run = |b: &mut Batch, kernel: Kernel, params: &[u32], binds: &[Bind<'_>], i: u64, groups: u64| match grids {
            Some(t) => g.dispatch_indirect(b, kernel, params, binds, t.buffer(), 12 * i),
            None => g.dispatch(b, kernel, params, binds, groups),
        };
        // W2's candidate rows, transposed: e2t [r, n].
        if let (Some((_, w2)), Some(e2t)) = (markov, plan.e2t.as_ref()) {
            let total = (w2.cols * n_max) as u64;
            run(b, Kernel::MarkovGather, &[w2.cols as u32], &[Bind::t(w2), cand_bind(), Bind::t(e2t)], 0, total.div_ceil(GATHER_PER_GROUP))?;
        }
        for (i, p0) in (0..n_max).step_by(pc).enumerate() {
            let rows = pc.min(n_max - p0);
            let i = i as u64;
            if let (Some((w1, _)), Some(bias), Some(e2t)) = (markov, plan.bias.as_ref(), plan.e2t.as_ref()) {
                let col_groups = (n_max as u64).div_ceil(BIAS_COLS);
                let params = [w1.cols as u32, p0 as u32, rows as u32];
                let binds = [Bind::t(w1), Bind::t(e2t), cand_bind(), Bind::t(bias)];
                run(b, Kernel::MarkovBias, &params, &binds, 1 + 2 * i, (rows as u64).div_ceil(BIAS_ROWS) * col_groups)?;
            }
            let bias_bind = match plan.bias.as_ref() {
                Some(t) => Bind::t(t),
                None => Bind::b(&self.dummy, 16),
            };
            let params = [ld as u32, k as u32, base.cols as u32, p0 as u32, rows as u32, plan.bias.is_some() as u32];
            let binds = [Bind::t(base), cand_bind(), bias_bind, Bind::t(&plan.out), Bind::t(&plan.scratch)];
            run(b, Kernel::TableTopK(g.reduce), &params, &binds, 2 + 2 * i, (ld * rows) as u64)?;
        }
        Ok(())
    }

    /// SparklingTree tree prep with ONE read-back ([`sparkling_core::Backend::candidate_table_async`]):
    /// topk.wgsl writes the per-row top-`candidates` into a device buffer `[ld, 2C+1]` (not read
    /// back); candidate_union.wgsl (one workgroup, a `ceil(V/32)`-word bitmap) turns the ids and
    /// the anchor into `[n, ascending distinct ids]`; the candidate-table kernels read n from
    /// that header word; then the candidate buffer and the packed table come back together
    /// (`Gpu::read_back_parts`, one map and one wait).
    ///
    /// Trade: n is only known on the device, so buffers and the read-back are sized for
    /// `n_max = min(ld·C + 1, V)` — the read-back is `1 + n_max + ld·n_max·2k'` words
    /// (`k' = min(k, n_max)`) instead of the `ld·n·2·min(k, n)` of the two-call path. The
    /// table kernels' grids, though, follow the actual n: candidate_union.wgsl writes them and
    /// they run as indirect dispatches (adapters without indirect execution fall back to grids
    /// sized for n_max whose extra workgroups exit at once). The decode loop avoids the large
    /// read-back altogether with [`WgpuBackend::start_sparkling_tree`].
    ///
    /// `candidates ≥ V`: the union is the whole vocabulary, built on the host, and the table is
    /// [`WgpuBackend::start_markov_table`] (also one read-back). `ld == 0`: `cand = [anchor]`, an
    /// empty table, no GPU work.
    /// Errors: `k == 0`, `candidates == 0`, `anchor ≥ V` ([`Error::Invalid`]); W1/W2 not
    /// `[V, r]` ([`Error::Shape`]); buffers beyond one storage binding or a device failure
    /// ([`Error::Device`]).
    pub(crate) fn start_candidate_table(&self, a: CandidateArgs<'_, WgpuTensor>) -> Result<Pending<CandidateTable>> {
        let CandidateArgs { base, markov, candidates, anchor, k } = a;
        let g = &self.gpu;
        let (ld, vocab) = (base.rows, base.cols);
        self.check_union_args(base, markov, candidates, anchor, k)?;
        if candidates >= vocab {
            let cand: Vec<u32> = (0..vocab as u32).collect();
            return self.start_markov_table(base, markov, &cand, k);
        }
        if ld == 0 {
            return Ok(Pending::ready(CandidateTable { cand: vec![anchor], ld: 0, k: 1, vals: Vec::new(), slots: Vec::new() }));
        }
        let u = self.plan_union_table("candidate_table", ld, vocab, candidates, k, markov)?;
        let mut b = g.batch();
        self.record_union_table(&mut b, &u, base, markov, anchor)?;
        g.submit(b);
        let (cand, plan, n_max) = (&u.cand, &u.table, u.n_max);
        let r = g.start_read(&[(cand.buffer(), 0, cand.bytes()), (plan.out.buffer(), 0, plan.out.bytes())])?;
        Ok(Pending::new(r, move |parts| {
            let cw: Vec<u32> = bytemuck::pod_collect_to_vec(&parts[0]);
            let n = cw[0] as usize;
            if n == 0 || n > n_max {
                return Err(Error::Device(format!("candidate_table: the device reported {n} candidates, expected 1..={n_max}")));
            }
            let cand: Vec<u32> = cw[1..1 + n].to_vec();
            let k_eff = k.min(n);
            let tw: Vec<u32> = bytemuck::pod_collect_to_vec(&parts[1]);
            Ok(unpack_table(cand, ld, &tw[..ld * n * 2 * k_eff], k_eff))
        }))
    }

    /// The argument checks of the fused ops: `candidates`, `anchor`, `k`
    /// (`check_candidate_table_args`), W1/W2 shapes (the anchor alone is a valid candidate
    /// list for `check_markov_table_args`), and the device's health.
    fn check_union_args(&self, base: &WgpuTensor, markov: Option<(&WgpuTensor, &WgpuTensor)>, candidates: usize, anchor: u32, k: usize) -> Result<()> {
        check_candidate_table_args(base.cols, candidates, anchor, k)?;
        check_markov_table_args(base.cols, markov.map(|(a, b)| ((a.rows, a.cols), (b.rows, b.cols))), &[anchor], k)?;
        self.gpu.check()
    }

    /// Buffers of the fused top-C → union → table pipeline for `ld` depth rows of `vocab`
    /// logits, `c` candidates per row and `k` children: top-C `[ld, 2c+1]` + scratch, the
    /// union bitmap `ceil(V/32)` words, the candidate buffer `[1 + n_max]` and the table plan,
    /// all sized for `n_max = min(ld·c + 1, V)`. Errors: buffers beyond one storage binding.
    fn plan_union_table(&self, op: &str, ld: usize, vocab: usize, c: usize, k: usize, markov: Option<(&WgpuTensor, &WgpuTensor)>) -> Result<UnionPlan> {
        let g = &self.gpu;
        let n_max = ld.saturating_mul(c).saturating_add(1).min(vocab);
        let top_words = 2 * c + 1;
        let table = self.plan_markov_table(op, ld, n_max, k.min(n_max), markov)?;
        Ok(UnionPlan {
            c,
            n_max,
            top: g.alloc(&format!("{op} (top-C ids, values, lse)"), ld, top_words)?,
            top_scratch: g.alloc(&format!("{op} (top-C scratch)"), ld, 2 * c)?,
            bitmap: g.alloc(&format!("{op} (union bitmap)"), 1, vocab.div_ceil(32))?,
            cand: g.alloc(&format!("{op} (candidate union)"), 1, 1 + n_max)?,
            grids: g.alloc(&format!("{op} (table dispatch grids)"), 1, 3 + 6 * n_max.div_ceil(table.pc))?,
            table,
        })
    }

    /// Record topk.wgsl (top-C per row, kept on the device), candidate_union.wgsl and the
    /// table kernels of `u` into the open batch.
    fn record_union_table(&self, b: &mut Batch, u: &UnionPlan, base: &WgpuTensor, markov: Option<(&WgpuTensor, &WgpuTensor)>, anchor: u32) -> Result<()> {
        let g = &self.gpu;
        let (ld, vocab, c) = (base.rows, base.cols, u.c);
        g.dispatch(b, Kernel::TopK(g.reduce), &[ld as u32, vocab as u32, c as u32], &[Bind::t(base), Bind::t(&u.top), Bind::t(&u.top_scratch)], ld as u64)?;
        let t = &u.table;
        let rank = markov.map_or(0, |(w1, _)| w1.cols);
        let chunks = t.n_max.div_ceil(t.pc);
        let params = [ld as u32, c as u32, (2 * c + 1) as u32, vocab as u32, anchor, rank as u32, t.pc as u32, chunks as u32, g.max_groups];
        g.dispatch(b, Kernel::CandidateUnion, &params, &[Bind::t(&u.top), Bind::t(&u.bitmap), Bind::t(&u.cand), Bind::t(&u.grids)], 1)?;
        self.record_markov_table(b, t, base, markov, Bind::t(&u.cand), g.indirect.then_some(&u.grids))
    }

    /// SparklingTree's whole tree prep on the device ([`sparkling_core::Backend::sparkling_tree_async`]):
    /// the pipeline of [`WgpuBackend::start_candidate_table`], then tree_heap.wgsl runs the
    /// best-first precompute heap over the table on the device; the read-back is only the tree,
    /// `1 + 4·budget` words, instead of the n_max-sized table. `None` when `candidates ≥ V`
    /// (the union is then the whole vocabulary: use `candidate_table`).
    /// Errors: as `start_candidate_table`; the anchor missing from the device's union (a device
    /// fault: it is always inserted) is [`Error::Device`].
    pub(crate) fn start_sparkling_tree(&self, a: CandidateArgs<'_, WgpuTensor>, budget: usize) -> Result<Pending<Option<DraftTree>>> {
        let CandidateArgs { base, markov, candidates, anchor, k } = a;
        let g = &self.gpu;
        let (ld, vocab) = (base.rows, base.cols);
        self.check_union_args(base, markov, candidates, anchor, k)?;
        if candidates >= vocab {
            return Ok(Pending::ready(None));
        }
        if ld == 0 || budget == 0 {
            return Ok(Pending::ready(Some(DraftTree::root(anchor))));
        }
        let u = self.plan_union_table("sparkling_tree", ld, vocab, candidates, k, markov)?;
        let heap = g.alloc("sparkling_tree (heap)", 2 * budget + 1, 5)?;
        let slots = g.alloc("sparkling_tree (node slots)", budget + 1, 1)?;
        let out = g.alloc("sparkling_tree (nodes)", 1 + 4 * budget, 1)?;
        let mut b = g.batch();
        self.record_union_table(&mut b, &u, base, markov, anchor)?;
        let params = [ld as u32, u.table.k as u32, budget as u32, anchor];
        g.dispatch(&mut b, Kernel::TreeHeap, &params, &[Bind::t(&u.cand), Bind::t(&u.table.out), Bind::t(&heap), Bind::t(&slots), Bind::t(&out)], 1)?;
        g.submit(b);
        let r = g.start_read(&[(out.buffer(), 0, out.bytes())])?;
        Ok(Pending::new(r, move |parts| {
            let w: Vec<u32> = bytemuck::pod_collect_to_vec(&parts[0]);
            Ok(Some(DraftTree::from_device_words("sparkling_tree", &w, anchor, budget)?))
        }))
    }

    /// Row-wise sampling on the device ([`sparkling_core::Backend::sample_async`]). At `T < 1e-5`
    /// this is the device argmax; otherwise sample.wgsl draws from softmax(logits/T) filtered
    /// by top-k / top-p with the CPU backend's rule (inverse CDF over kept tokens in ascending
    /// id order, one uniform per row; f32 arithmetic — see sample.wgsl for the precision).
    /// Reads back one `u32` per row.
    /// Errors: `uniforms.len() != rows` ([`Error::Shape`]); a NaN temperature or top-p
    /// ([`Error::Invalid`]).
    pub(crate) fn start_sample(&self, logits: &WgpuTensor, params: SampleParams, uniforms: &[f32]) -> Result<Pending<Vec<u32>>> {
        if uniforms.len() != logits.rows {
            return Err(Error::Shape { op: "sample", detail: format!("{} uniforms for {} rows", uniforms.len(), logits.rows) });
        }
        if params.temperature.is_nan() || params.top_p.is_nan() {
            return Err(Error::Invalid(format!("sample: temperature ({}) and top_p ({}) must be numbers", params.temperature, params.top_p)));
        }
        if params.temperature < 1e-5 {
            return self.start_argmax(logits);
        }
        let g = &self.gpu;
        g.check()?;
        let (rows, cols) = (logits.rows, logits.cols);
        if rows == 0 {
            return Ok(Pending::ready(Vec::new()));
        }
        if cols == 0 {
            return Ok(Pending::ready(vec![0; rows]));
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
        g.dispatch(&mut b, Kernel::Sample(g.reduce), &p, &[Bind::t(logits), Bind::b(u_buf.buffer(), rows as u64 * 4), Bind::t(&out)], rows as u64)?;
        b.keep(u_buf);
        g.submit(b);
        let r = g.start_read(&[(out.buffer(), 0, rows as u64 * 4)])?;
        Ok(Pending::new(r, |parts| Ok(bytemuck::pod_collect_to_vec(&parts[0]))))
    }
}
