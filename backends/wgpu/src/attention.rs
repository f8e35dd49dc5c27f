//! Attention (causal prefill, tree verify, full drafter block; GQA; f32 softmax) and the
//! host-side construction of the tree table the kernel reads (shaders/attention.wgsl).

use crate::ctx::Bind;
use crate::pipelines::{Kernel, MAX_HEAD_DIM};
use crate::tensor::WgpuTensor;
use crate::WgpuBackend;
use sparkling_core::select::ancestor_table;
use sparkling_core::{AttnMask, AttnShape, Error, Result};

fn shape_err(detail: String) -> Error {
    Error::Shape { op: "attention", detail }
}

impl WgpuBackend {
    /// Scaled dot-product attention (see [`sparkling_core::Backend::attention`]): one
    /// workgroup per (query row, head), keys visited in ascending slot order.
    /// Errors: inconsistent head geometry, a head dimension above 256, a cache shorter than
    /// `kv_len` or fewer keys than queries ([`Error::Shape`]); a bad parent ([`Error::Invalid`]).
    pub(crate) fn op_attention(
        &self,
        q: &WgpuTensor,
        k_cache: &WgpuTensor,
        v_cache: &WgpuTensor,
        kv_len: usize,
        shape: AttnShape,
        mask: AttnMask<'_>,
    ) -> Result<WgpuTensor> {
        let g = &self.gpu;
        g.check()?;
        let AttnShape { n_heads, n_kv_heads, head_dim } = shape;
        let t = q.rows;
        if n_kv_heads == 0 || n_heads % n_kv_heads != 0 || q.cols != n_heads * head_dim {
            return Err(shape_err(format!("q [{t}, {}] for {n_heads}x{head_dim} heads / {n_kv_heads} kv", q.cols)));
        }
        if k_cache.cols != n_kv_heads * head_dim || v_cache.cols != k_cache.cols || v_cache.rows != k_cache.rows || kv_len > k_cache.rows || t > kv_len {
            return Err(shape_err(format!("kv [{}, {}] len {kv_len} for {t} queries", k_cache.rows, k_cache.cols)));
        }
        if head_dim > MAX_HEAD_DIM {
            return Err(shape_err(format!("head_dim {head_dim} above the kernel's maximum of {MAX_HEAD_DIM}")));
        }
        let prefix = kv_len - t;
        let (mode, table) = match mask {
            AttnMask::Causal => (0u32, None),
            AttnMask::Full => (1u32, None),
            AttnMask::Tree { parents } => {
                if parents.len() != t {
                    return Err(shape_err(format!("{} parents for {t} tree rows", parents.len())));
                }
                (2u32, Some(ancestor_table(parents)?))
            }
        };
        let out = g.alloc("attention", t, q.cols)?;
        if t == 0 || head_dim == 0 || n_heads == 0 {
            return Ok(out);
        }
        let tree_buf = match &table {
            Some(words) => Some(g.upload_u32(words)?),
            None => None,
        };
        let (tb, tbytes) = match (&tree_buf, &table) {
            (Some(b), Some(w)) => (b.buffer(), w.len() as u64 * 4),
            _ => (&self.dummy, 16),
        };
        let total = (t * n_heads) as u64;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let params = [
            t as u32,
            kv_len as u32,
            prefix as u32,
            n_heads as u32,
            (n_heads / n_kv_heads) as u32,
            head_dim as u32,
            q.cols as u32,
            k_cache.cols as u32,
            mode,
            scale.to_bits(),
            total as u32,
        ];
        let kv_bytes = (kv_len * k_cache.cols * 4) as u64;
        let mut b = g.batch();
        g.dispatch(
            &mut b,
            Kernel::Attention,
            &params,
            &[Bind::t(q), Bind::b(k_cache.buffer(), kv_bytes), Bind::b(v_cache.buffer(), kv_bytes), Bind::b(tb, tbytes), Bind::t(&out)],
            total,
        )?;
        if let Some(tb) = tree_buf {
            b.keep(tb);
        }
        g.submit(b);
        Ok(out)
    }
}
