//! The [`Backend`] implementation: argument checks live in the op modules; this file maps the
//! trait onto them and holds `argmax` (the selection read-backs are in `select.rs`).

use crate::ctx::{Bind, Pending};
use crate::pipelines::Kernel;
use crate::tensor::{WgpuTensor, WgpuWeight};
use crate::WgpuBackend;
use sparkling_core::{AttnMask, AttnShape, Backend, CandidateTable, DraftTree, Result, SampleParams, TopK};

impl WgpuBackend {
    /// Row-wise argmax on the device (shaders/argmax.wgsl), then a read-back of one `u32` per
    /// row (a sync point).
    pub(crate) fn op_argmax(&self, logits: &WgpuTensor) -> Result<Pending<Vec<u32>>> {
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
}

impl Backend for WgpuBackend {
    type Tensor = WgpuTensor;
    type Weight = WgpuWeight;

    fn name(&self) -> String {
        let i = &self.gpu.info;
        // Browsers may hide the adapter name (WebGPU exposes vendor / architecture at most).
        let name = if i.name.is_empty() { format!("unnamed {:?} adapter", i.device_type) } else { i.name.clone() };
        format!("wgpu ({name}, {:?}, {} weights)", i.backend, self.weight_dtype.name())
    }

    fn upload(&self, data: &[f32], rows: usize, cols: usize) -> Result<WgpuTensor> {
        self.op_upload(data, rows, cols)
    }

    fn zeros(&self, rows: usize, cols: usize) -> Result<WgpuTensor> {
        self.op_zeros(rows, cols)
    }

    fn download(&self, t: &WgpuTensor) -> Result<Vec<f32>> {
        self.gpu.wait(self.gpu.read_f32(t, 0, t.rows * t.cols)?)
    }

    fn download_rows(&self, t: &WgpuTensor, start: usize, n: usize) -> Result<Vec<f32>> {
        self.gpu.wait(self.op_download_rows(t, start, n)?)
    }

    fn shape(&self, t: &WgpuTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn upload_weight(&self, data: Vec<f32>, n: usize, k: usize) -> Result<WgpuWeight> {
        self.op_upload_weight(data, n, k)
    }

    fn weight_shape(&self, w: &WgpuWeight) -> (usize, usize) {
        (w.n, w.k)
    }

    fn weight_bytes(&self, w: &WgpuWeight) -> usize {
        w.chunks.iter().map(|c| c.bytes as usize).sum()
    }

    fn embedding(&self, table: &WgpuWeight, ids: &[u32]) -> Result<WgpuTensor> {
        self.op_embedding(table, ids)
    }

    fn matmul(&self, x: &WgpuTensor, w: &WgpuWeight, bias: Option<&WgpuTensor>) -> Result<WgpuTensor> {
        self.op_matmul(x, w, bias)
    }

    fn rms_norm(&self, x: &WgpuTensor, w: &WgpuTensor, group: usize, eps: f32) -> Result<WgpuTensor> {
        self.op_rms_norm(x, w, group, eps)
    }

    fn rope(&self, x: &mut WgpuTensor, positions: &[u32], head_dim: usize, theta: f32) -> Result<()> {
        self.op_rope(x, positions, head_dim, theta)
    }

    fn silu_mul(&self, gate: &WgpuTensor, up: &WgpuTensor) -> Result<WgpuTensor> {
        self.op_silu_mul(gate, up)
    }

    fn add_assign(&self, x: &mut WgpuTensor, y: &WgpuTensor) -> Result<()> {
        self.op_add_assign(x, y)
    }

    fn concat_cols(&self, parts: &[&WgpuTensor]) -> Result<WgpuTensor> {
        self.op_concat_cols(parts)
    }

    fn concat_rows(&self, parts: &[&WgpuTensor]) -> Result<WgpuTensor> {
        self.op_concat_rows(parts)
    }

    fn gather_rows(&self, x: &WgpuTensor, rows: &[usize]) -> Result<WgpuTensor> {
        self.op_gather_rows(x, rows)
    }

    fn write_rows(&self, dst: &mut WgpuTensor, at: usize, src: &WgpuTensor) -> Result<()> {
        self.op_write_rows(dst, at, src)
    }

    fn compact_rows(&self, cache: &mut WgpuTensor, start: usize, keep: &[usize]) -> Result<()> {
        self.op_compact_rows(cache, start, keep)
    }

    fn attention(&self, q: &WgpuTensor, k_cache: &WgpuTensor, v_cache: &WgpuTensor, kv_len: usize, shape: AttnShape, mask: AttnMask<'_>) -> Result<WgpuTensor> {
        self.op_attention(q, k_cache, v_cache, kv_len, shape, mask)
    }

    fn argmax(&self, logits: &WgpuTensor) -> Result<Vec<u32>> {
        self.gpu.wait(self.op_argmax(logits)?)
    }

    fn sample(&self, logits: &WgpuTensor, params: SampleParams, uniforms: &[f32]) -> Result<Vec<u32>> {
        self.gpu.wait(self.op_sample(logits, params, uniforms)?)
    }

    fn topk(&self, logits: &WgpuTensor, k: usize) -> Result<TopK> {
        self.gpu.wait(self.op_topk(logits, k)?)
    }

    fn markov_table(&self, base: &WgpuTensor, markov: Option<(&WgpuTensor, &WgpuTensor)>, cand: &[u32], k: usize) -> Result<CandidateTable> {
        self.gpu.wait(self.op_markov_table(base, markov, cand, k)?)
    }

    fn candidate_table(
        &self,
        base: &WgpuTensor,
        markov: Option<(&WgpuTensor, &WgpuTensor)>,
        candidates: usize,
        anchor: u32,
        k: usize,
    ) -> Result<CandidateTable> {
        self.gpu.wait(self.op_candidate_table(base, markov, candidates, anchor, k)?)
    }

    fn sparkling_tree(
        &self,
        base: &WgpuTensor,
        markov: Option<(&WgpuTensor, &WgpuTensor)>,
        candidates: usize,
        anchor: u32,
        k: usize,
        budget: usize,
    ) -> Result<Option<DraftTree>> {
        self.gpu.wait(self.op_sparkling_tree(base, markov, candidates, anchor, k, budget)?)
    }

    async fn sparkling_tree_async(
        &self,
        base: &WgpuTensor,
        markov: Option<(&WgpuTensor, &WgpuTensor)>,
        candidates: usize,
        anchor: u32,
        k: usize,
        budget: usize,
    ) -> Result<Option<DraftTree>> {
        self.gpu.wait_async(self.op_sparkling_tree(base, markov, candidates, anchor, k, budget)?).await
    }

    async fn download_async(&self, t: &WgpuTensor) -> Result<Vec<f32>> {
        self.gpu.wait_async(self.gpu.read_f32(t, 0, t.rows * t.cols)?).await
    }

    async fn argmax_async(&self, logits: &WgpuTensor) -> Result<Vec<u32>> {
        self.gpu.wait_async(self.op_argmax(logits)?).await
    }

    async fn sample_async(&self, logits: &WgpuTensor, params: SampleParams, uniforms: &[f32]) -> Result<Vec<u32>> {
        self.gpu.wait_async(self.op_sample(logits, params, uniforms)?).await
    }

    async fn topk_async(&self, logits: &WgpuTensor, k: usize) -> Result<TopK> {
        self.gpu.wait_async(self.op_topk(logits, k)?).await
    }

    async fn candidate_table_async(
        &self,
        base: &WgpuTensor,
        markov: Option<(&WgpuTensor, &WgpuTensor)>,
        candidates: usize,
        anchor: u32,
        k: usize,
    ) -> Result<CandidateTable> {
        self.gpu.wait_async(self.op_candidate_table(base, markov, candidates, anchor, k)?).await
    }
}
