//! The [`Backend`] implementation: argument checks live in the op modules; this file maps the
//! trait onto them and holds `argmax` (the selection read-backs are in `select.rs`).

use crate::ctx::Bind;
use crate::pipelines::Kernel;
use crate::tensor::{WgpuTensor, WgpuWeight};
use crate::WgpuBackend;
use sparkling_core::{AttnMask, AttnShape, Backend, MarkovTable, Result, SampleParams, TopK};

impl WgpuBackend {
    /// Row-wise argmax on the device (shaders/argmax.wgsl), then a read-back of one `u32` per
    /// row (a sync point).
    pub(crate) fn op_argmax(&self, logits: &WgpuTensor) -> Result<Vec<u32>> {
        let g = &self.gpu;
        g.check()?;
        let rows = logits.rows;
        if rows == 0 {
            return Ok(Vec::new());
        }
        if logits.cols == 0 {
            return Ok(vec![0; rows]);
        }
        let ids = g.alloc("argmax", rows, 1)?;
        let mut b = g.batch();
        g.dispatch(&mut b, Kernel::Argmax(g.reduce), &[rows as u32, logits.cols as u32], &[Bind::t(logits), Bind::t(&ids)], rows as u64)?;
        g.submit(b);
        let bytes = g.read_back(ids.buffer(), 0, rows as u64 * 4)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }
}

impl Backend for WgpuBackend {
    type Tensor = WgpuTensor;
    type Weight = WgpuWeight;

    fn name(&self) -> String {
        let i = &self.gpu.info;
        format!("wgpu ({}, {:?}, {} weights)", i.name, i.backend, self.weight_dtype.name())
    }

    fn upload(&self, data: &[f32], rows: usize, cols: usize) -> Result<WgpuTensor> {
        self.op_upload(data, rows, cols)
    }

    fn zeros(&self, rows: usize, cols: usize) -> Result<WgpuTensor> {
        self.op_zeros(rows, cols)
    }

    fn download(&self, t: &WgpuTensor) -> Result<Vec<f32>> {
        self.gpu.read_f32(t, 0, t.rows * t.cols)
    }

    fn download_rows(&self, t: &WgpuTensor, start: usize, n: usize) -> Result<Vec<f32>> {
        self.op_download_rows(t, start, n)
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

    fn attention(
        &self,
        q: &WgpuTensor,
        k_cache: &WgpuTensor,
        v_cache: &WgpuTensor,
        kv_len: usize,
        shape: AttnShape,
        mask: AttnMask<'_>,
    ) -> Result<WgpuTensor> {
        self.op_attention(q, k_cache, v_cache, kv_len, shape, mask)
    }

    fn argmax(&self, logits: &WgpuTensor) -> Result<Vec<u32>> {
        self.op_argmax(logits)
    }

    fn sample(&self, logits: &WgpuTensor, params: SampleParams, uniforms: &[f32]) -> Result<Vec<u32>> {
        self.op_sample(logits, params, uniforms)
    }

    fn topk(&self, logits: &WgpuTensor, k: usize) -> Result<TopK> {
        self.op_topk(logits, k)
    }

    fn markov_table(&self, base: &WgpuTensor, markov: Option<(&WgpuTensor, &WgpuTensor)>, cand: &[u32], k: usize) -> Result<MarkovTable> {
        self.op_markov_table(base, markov, cand, k)
    }
}
