//! The [`Backend`] implementation: argument checks live in the op modules; this file maps the
//! trait onto them.

use crate::tensor::{CudaTensor, CudaWeight, WeightData};
use crate::CudaBackend;
use sparkling_core::{AttnMask, AttnShape, Backend, CandidateTable, DraftTree, Result, SampleParams, TopK};

impl Backend for CudaBackend {
    type Tensor = CudaTensor;
    type Weight = CudaWeight;

    fn name(&self) -> String {
        let i = &self.info;
        format!(
            "cuda ({}, sm_{}{}, {}, {} weights, {}-row GEMM blocks)",
            i.name,
            i.compute_capability.0,
            i.compute_capability.1,
            self.kernel_target(),
            self.weight_dtype.name(),
            self.row_block
        )
    }

    fn upload(&self, data: &[f32], rows: usize, cols: usize) -> Result<CudaTensor> {
        self.op_upload(data, rows, cols)
    }

    fn zeros(&self, rows: usize, cols: usize) -> Result<CudaTensor> {
        self.op_zeros(rows, cols)
    }

    fn download(&self, t: &CudaTensor) -> Result<Vec<f32>> {
        self.op_download_rows(t, 0, t.rows)
    }

    fn download_rows(&self, t: &CudaTensor, start: usize, n: usize) -> Result<Vec<f32>> {
        self.op_download_rows(t, start, n)
    }

    fn shape(&self, t: &CudaTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn upload_weight(&self, data: Vec<f32>, n: usize, k: usize) -> Result<CudaWeight> {
        self.op_upload_weight(data, n, k)
    }

    fn weight_shape(&self, w: &CudaWeight) -> (usize, usize) {
        (w.n, w.k)
    }

    fn weight_bytes(&self, w: &CudaWeight) -> usize {
        match &w.data {
            WeightData::F32(s) => 4 * s.len(),
            WeightData::Bf16(s) => 2 * s.len(),
        }
    }

    fn embedding(&self, table: &CudaWeight, ids: &[u32]) -> Result<CudaTensor> {
        self.op_embedding(table, ids)
    }

    fn matmul(&self, x: &CudaTensor, w: &CudaWeight, bias: Option<&CudaTensor>) -> Result<CudaTensor> {
        self.op_matmul(x, w, bias)
    }

    fn rms_norm(&self, x: &CudaTensor, w: &CudaTensor, group: usize, eps: f32) -> Result<CudaTensor> {
        self.op_rms_norm(x, w, group, eps)
    }

    fn rope(&self, x: &mut CudaTensor, positions: &[u32], head_dim: usize, theta: f32) -> Result<()> {
        self.op_rope(x, positions, head_dim, theta)
    }

    fn silu_mul(&self, gate: &CudaTensor, up: &CudaTensor) -> Result<CudaTensor> {
        self.op_silu_mul(gate, up)
    }

    fn add_assign(&self, x: &mut CudaTensor, y: &CudaTensor) -> Result<()> {
        self.op_add_assign(x, y)
    }

    fn concat_cols(&self, parts: &[&CudaTensor]) -> Result<CudaTensor> {
        self.op_concat_cols(parts)
    }

    fn concat_rows(&self, parts: &[&CudaTensor]) -> Result<CudaTensor> {
        self.op_concat_rows(parts)
    }

    fn gather_rows(&self, x: &CudaTensor, rows: &[usize]) -> Result<CudaTensor> {
        self.op_gather_rows(x, rows)
    }

    fn write_rows(&self, dst: &mut CudaTensor, at: usize, src: &CudaTensor) -> Result<()> {
        self.op_write_rows(dst, at, src)
    }

    fn compact_rows(&self, cache: &mut CudaTensor, start: usize, keep: &[usize]) -> Result<()> {
        self.op_compact_rows(cache, start, keep)
    }

    fn attention(&self, q: &CudaTensor, k_cache: &CudaTensor, v_cache: &CudaTensor, kv_len: usize, shape: AttnShape, mask: AttnMask<'_>) -> Result<CudaTensor> {
        self.op_attention(q, k_cache, v_cache, kv_len, shape, mask)
    }

    fn argmax(&self, logits: &CudaTensor) -> Result<Vec<u32>> {
        self.op_argmax(logits)
    }

    fn sample(&self, logits: &CudaTensor, params: SampleParams, uniforms: &[f32]) -> Result<Vec<u32>> {
        self.op_sample(logits, params, uniforms)
    }

    fn topk(&self, logits: &CudaTensor, k: usize) -> Result<TopK> {
        self.op_topk(logits, k)
    }

    fn markov_table(&self, base: &CudaTensor, markov: Option<(&CudaTensor, &CudaTensor)>, cand: &[u32], k: usize) -> Result<CandidateTable> {
        self.op_markov_table(base, markov, cand, k)
    }

    fn candidate_table(
        &self,
        base: &CudaTensor,
        markov: Option<(&CudaTensor, &CudaTensor)>,
        candidates: usize,
        anchor: u32,
        k: usize,
    ) -> Result<CandidateTable> {
        self.op_candidate_table(base, markov, candidates, anchor, k)
    }

    fn sparkling_tree(
        &self,
        base: &CudaTensor,
        markov: Option<(&CudaTensor, &CudaTensor)>,
        candidates: usize,
        anchor: u32,
        k: usize,
        budget: usize,
    ) -> Result<Option<DraftTree>> {
        self.op_sparkling_tree(base, markov, candidates, anchor, k, budget)
    }
}
