//! The Backend seam of SparklingTree (design §3): coarse ops, each one kernel (or one library
//! call) on a device. Model code (target, drafter, Markov head) is written once against
//! [`Backend`]; the CPU reference backend, the wgpu backend and the CUDA backend implement it.
//!
//! Conventions for every op:
//! - Activations are [`Backend::Tensor`]s of `f32`, 2-D, row-major `[rows, cols]`.
//! - Weights are [`Backend::Weight`]s: a matrix `W[N, K]` in the HF layout (`y = x·Wᵀ`),
//!   stored in whatever precision the backend chooses (the CPU backend keeps f32).
//! - Host slices (`positions`, `parents`, token ids) are small per-call inputs.
//! - Every op returns [`Result`]; shape mismatches are reported as [`Error::Shape`] naming the
//!   op and both shapes, never as a panic.
#![warn(missing_docs)]

use std::fmt;

pub mod select;
pub mod tree;

pub use select::check_candidate_table_args;
pub use tree::{CandidateTable, ChildMap, DraftTree, TopK, NO_PARENT};

/// The one error type of the engine's backends.
#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// Operand shapes do not fit the op: `op` names the op, `detail` the shapes expected/found.
    Shape {
        /// The op that refused its operands.
        op: &'static str,
        /// The shapes expected and found.
        detail: String,
    },
    /// The backend cannot run here (no driver, no adapter, feature missing).
    Unavailable(String),
    /// A device-side failure (out of memory, lost device, kernel launch).
    Device(String),
    /// Invalid argument that is not a shape problem (empty input, out-of-range id, ...).
    Invalid(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Shape { op, detail } => write!(f, "shape mismatch in {op}: {detail}"),
            Error::Unavailable(m) => write!(f, "backend unavailable: {m}"),
            Error::Device(m) => write!(f, "device error: {m}"),
            Error::Invalid(m) => write!(f, "invalid argument: {m}"),
        }
    }
}

impl std::error::Error for Error {}

/// Result alias used by every backend op.
pub type Result<T> = std::result::Result<T, Error>;

/// Which keys a query row may see in [`Backend::attention`].
///
/// The query block is always the *last* `q_rows` entries of the key range `0..kv_len`
/// (its own K/V have already been written to the cache); keys `0..kv_len - q_rows` are the
/// prefix and are visible to every query.
#[derive(Debug, Clone, Copy)]
pub enum AttnMask<'a> {
    /// Causal inside the block: query `i` sees block keys `0..=i` (prefill, chain verify).
    Causal,
    /// Tree verify (DDTree §4.8): query `i` sees block keys that are ancestors of `i` or `i`
    /// itself. `parents[i] < i` for `i ≥ 1`, `parents[0] == NO_PARENT` (the root). Visible keys
    /// are visited in ascending slot order, so a chain-shaped tree gives bit-identical results
    /// to [`AttnMask::Causal`]. [`select::ancestor_table`] lists each row's visible block keys.
    Tree {
        /// Parent row of each block row (`NO_PARENT` for the root).
        parents: &'a [u32],
    },
    /// Every key visible (the drafter's non-causal context + block attention, DFlash §2.4).
    Full,
}

/// Geometry of one attention call (GQA: query head `h` reads KV head `h / (n_heads / n_kv_heads)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    /// Number of query heads.
    pub n_heads: usize,
    /// Number of KV heads (divides `n_heads`).
    pub n_kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
}

/// One sequence of a ragged (multi-cache) attention call, [`Backend::attention_ragged`]: its
/// own K/V cache, valid length and mask, and how many consecutive rows of the packed query
/// tensor are its query block.
#[derive(Debug, Clone, Copy)]
pub struct RaggedSeq<'a, T> {
    /// This sequence's key cache `[cap, n_kv_heads*head_dim]`.
    pub k_cache: &'a T,
    /// This sequence's value cache, same shape.
    pub v_cache: &'a T,
    /// Valid cache rows; the last `q_rows` of them are this sequence's query block.
    pub kv_len: usize,
    /// Rows of the packed query tensor that belong to this sequence (≥ 1), taken in order.
    pub q_rows: usize,
    /// Mask over this sequence's block (a causal prefill / decode row, or a tree block).
    pub mask: AttnMask<'a>,
}

/// Per-row sampling parameters for [`Backend::sample_async`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleParams {
    /// Temperature; `< 1e-5` means argmax.
    pub temperature: f32,
    /// Keep only the `top_k` largest logits (0 = off).
    pub top_k: usize,
    /// Nucleus mass (1.0 = off).
    pub top_p: f32,
}

/// ggml type ids of the weight formats a backend may keep as stored (the `ggml_type` field of
/// a GGUF tensor info, numbered as in `ggml.h` / gguf.md).
pub mod ggml {
    /// 32-bit IEEE float.
    pub const F32: u32 = 0;
    /// 16-bit IEEE half float.
    pub const F16: u32 = 1;
    /// 4-bit, 32-value blocks of 18 bytes: f16 scale `d`, 16 nibble bytes; `x = d·(q − 8)`.
    pub const Q4_0: u32 = 2;
    /// 4-bit, 32-value blocks of 20 bytes: f16 `d`, f16 min `m`, 16 nibble bytes; `x = d·q + m`.
    pub const Q4_1: u32 = 3;
    /// 5-bit, 32-value blocks of 22 bytes: f16 `d`, 32-bit `qh` (bit `t` = fifth bit of value
    /// `t`), 16 nibble bytes (value `t` and `t+16` in byte `t`); `x = d·(q − 16)`.
    pub const Q5_0: u32 = 6;
    /// 8-bit, 32-value blocks of 34 bytes: f16 `d`, 32 signed bytes; `x = d·q`.
    pub const Q8_0: u32 = 8;
    /// 4-bit K-quant, 256-value super-blocks of 144 bytes: f16 `d`, f16 `dmin`, 12 bytes of
    /// packed 6-bit sub-block scales and mins, 128 nibble bytes; `x = d·sc·q − dmin·m`.
    pub const Q4_K: u32 = 12;
    /// 6-bit K-quant, 256-value super-blocks of 210 bytes: 128 bytes of low nibbles, 64 of
    /// high 2-bit pairs, 16 int8 sub-block scales, f16 `d`; `x = d·sc·(q − 32)`.
    pub const Q6_K: u32 = 14;
}

/// A weight matrix `[n, k]` exactly as a GGUF file stores it (HF row order): `n` rows of `k`
/// values, each row a run of ggml blocks of type `ggml_type` (see [`ggml`]), rows back to back.
#[derive(Debug, Clone, PartialEq)]
pub struct GgmlWeight {
    /// ggml type id of the blocks.
    pub ggml_type: u32,
    /// Output features (rows).
    pub n: usize,
    /// Input features (values per row; a multiple of the type's block size).
    pub k: usize,
    /// `n` rows of `k / block · block_bytes` bytes.
    pub bytes: Vec<u8>,
}

/// The shared argument check of [`Backend::attention_ragged`]: at least one sequence, no empty
/// query block, and blocks that add up to the `rows` of the packed query tensor.
pub fn check_ragged<T>(rows: usize, seqs: &[RaggedSeq<'_, T>]) -> Result<()> {
    if seqs.is_empty() {
        return Err(Error::Invalid("attention_ragged: no sequences".into()));
    }
    if let Some(i) = seqs.iter().position(|s| s.q_rows == 0) {
        return Err(Error::Invalid(format!("attention_ragged: sequence {i} has an empty query block")));
    }
    let total: usize = seqs.iter().map(|s| s.q_rows).sum();
    if total != rows {
        return Err(Error::Shape { op: "attention_ragged", detail: format!("query blocks of {total} rows for a q of {rows} rows") });
    }
    Ok(())
}

/// The inputs of SparklingTree's tree prep, [`Backend::candidate_table_async`] and
/// [`Backend::sparkling_tree_async`]: the candidate union of the per-row top-`candidates` ids
/// of `base` plus `anchor`, and the Markov candidate table over it with `k` children per row.
pub struct CandidateArgs<'a, T> {
    /// Drafter logits `U [ld, V]`.
    pub base: &'a T,
    /// `Some((W1, W2))`, each `[V, r]`, or `None` (see [`Backend::markov_table_async`]).
    pub markov: Option<(&'a T, &'a T)>,
    /// `C`, ids kept per depth row; `C ≥ V` takes the whole vocabulary.
    pub candidates: usize,
    /// The tree root's token (always in the union).
    pub anchor: u32,
    /// Children kept per row, clamped to the union size `n`.
    pub k: usize,
}

// Manual impls: a derive would require `T: Clone` although only references are copied.
impl<T> Clone for CandidateArgs<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for CandidateArgs<'_, T> {}

/// Work a device backend has issued since it was created ([`Backend::op_counts`]), for
/// auditing what a decode step or a verify round costs besides its time (`sparkling profile`).
/// Every counter only grows; [`OpCounts::since`] gives what ran between two reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpCounts {
    /// Kernels launched (compute dispatches, indirect ones included).
    pub kernels: u64,
    /// Times the host waited for the device: one per read-back op, one per explicit sync.
    pub host_syncs: u64,
    /// Bytes of data written from the host into device buffers (tensors, index lists, tree
    /// tables, weights at load time), not counting each kernel's small uniform block of
    /// parameters.
    pub bytes_uploaded: u64,
    /// Device buffers created (a buffer pool's misses, weights and tables at load time); none
    /// in a steady-state decode step when the pool recycles everything.
    pub buffers_created: u64,
}

impl OpCounts {
    /// The counts between `earlier` and `self` (a later read of the same backend).
    pub fn since(self, earlier: OpCounts) -> OpCounts {
        OpCounts {
            kernels: self.kernels.saturating_sub(earlier.kernels),
            host_syncs: self.host_syncs.saturating_sub(earlier.host_syncs),
            bytes_uploaded: self.bytes_uploaded.saturating_sub(earlier.bytes_uploaded),
            buffers_created: self.buffers_created.saturating_sub(earlier.buffers_created),
        }
    }
}

/// A compute backend: buffers plus the coarse ops of design §3, in three families.
///
/// - **Core ops** (buffers, weights, matmul, norms, RoPE, attention, row moves): each one
///   kernel or library call on the device; no host sync.
/// - **Read-backs** (`download_async`, `download_rows_async`, `argmax_async`, `sample_async`,
///   `gather_weight_rows_async`): the only ops that wait for the device. They are `async`
///   because a browser cannot block on WebGPU; native callers that want a blocking call use
///   [`ReadBack`] (same names without `_async`), which every backend gets for free.
/// - **Selection ops** (`topk_async`, `markov_table_async`, `candidate_table_async`,
///   `sparkling_tree_async`): the draft-tree prep, also read-backs. Each has a default that
///   downloads what it needs and computes on the host (`select`); device backends override
///   them with kernels so only the small result comes back.
///
/// Implementations must be deterministic: the same inputs give bit-identical outputs, and an
/// output row never depends on how many other rows are in the same call (this is what makes
/// tree verification exactly reproduce plain decoding at temperature 0 on one backend).
// The async read-backs are only awaited in place (never spawned across threads), so their
// futures need no `Send` bound.
#[allow(async_fn_in_trait)]
pub trait Backend: Send + Sync {
    /// Device activation tensor, `f32 [rows, cols]`.
    type Tensor: Send + Sync;
    /// Device weight matrix `[N, K]` (HF layout, `y = x·Wᵀ`).
    type Weight: Send + Sync;

    // ---- Core ops: buffers and weights ------------------------------------------------------

    /// Human-readable backend and device name (e.g. `cpu (2 threads)`).
    fn name(&self) -> String;

    /// Whether tensors live in host memory, so a download costs no transfer. The engine then
    /// resolves `TreePrep::Auto` to host selection of the draft candidates (and picks smaller
    /// default trees); device backends keep the default `false` and select on the device.
    /// Callers of the engine never need to ask. Default: `false`.
    fn host_memory(&self) -> bool {
        false
    }

    /// The work this backend has issued so far ([`OpCounts`]), where it counts it (device
    /// backends); `None` where ops are plain host function calls. Default: `None`.
    fn op_counts(&self) -> Option<OpCounts> {
        None
    }

    /// Upload `data` (length `rows*cols`) as a `[rows, cols]` tensor.
    fn upload(&self, data: &[f32], rows: usize, cols: usize) -> Result<Self::Tensor>;
    /// A zero-filled `[rows, cols]` tensor.
    fn zeros(&self, rows: usize, cols: usize) -> Result<Self::Tensor>;
    /// A zeroed K or V cache of `rows` rows and `heads` KV heads of `head_dim` values each,
    /// shaped `[rows, heads·head_dim]` (one per layer, `model::layer::KvCache`): it is only
    /// written by [`Backend::write_rows`], reordered by [`Backend::compact_rows`], read by
    /// [`Backend::attention`] / [`Backend::attention_ragged`] (with `heads` KV heads) and
    /// downloaded. A backend may store it in a lower precision (the CPU backend's f16 cache,
    /// `--kv-cache f16`) and in its own layout (the CPU backend keeps each KV head's rows
    /// contiguous); `ar` and every speculative method read the same cache, so every method
    /// still equals `ar`. Default: [`Backend::zeros`] (f32, row-major).
    fn kv_zeros(&self, rows: usize, heads: usize, head_dim: usize) -> Result<Self::Tensor> {
        self.zeros(rows, heads * head_dim)
    }
    /// `(rows, cols)` of a tensor.
    fn shape(&self, t: &Self::Tensor) -> (usize, usize);
    /// Upload a weight matrix `data[N*K]` of shape `[n, k]`.
    fn upload_weight(&self, data: Vec<f32>, n: usize, k: usize) -> Result<Self::Weight>;
    /// Upload a drafter's own matrix `data[N*K]` of shape `[n, k]`. The target verifies every
    /// token, so a drafter's precision moves only its speed and acceptance, never the output:
    /// a backend may store it in a cheaper format than [`Backend::upload_weight`] would (the
    /// CPU backend's `native` storage: Q8_0 blocks on the int8 kernels instead of f16).
    /// Default: [`Backend::upload_weight`]. Errors: as `upload_weight`.
    fn upload_draft_weight(&self, data: Vec<f32>, n: usize, k: usize) -> Result<Self::Weight> {
        self.upload_weight(data, n, k)
    }
    /// `(N, K)` of a weight.
    fn weight_shape(&self, w: &Self::Weight) -> (usize, usize);
    /// Whether [`Backend::upload_weight_ggml`] keeps weights of ggml type `ggml_type` in a
    /// form of their own (quantized blocks stay quantized). Default: `false` — the loader then
    /// dequantizes to f32 and calls [`Backend::upload_weight`], so device backends need not
    /// know any ggml format.
    fn accepts_ggml(&self, ggml_type: u32) -> bool {
        let _ = ggml_type;
        false
    }
    /// Upload a weight in its stored ggml format (only called when [`Backend::accepts_ggml`]
    /// says yes). Errors: [`Error::Shape`] when the byte count does not fit `[n, k]` of that
    /// type; the default is [`Error::Unavailable`] (the backend takes f32 only).
    fn upload_weight_ggml(&self, w: GgmlWeight) -> Result<Self::Weight> {
        Err(Error::Unavailable(format!("this backend keeps no ggml type {} weights ([{}, {}]): upload f32", w.ggml_type, w.n, w.k)))
    }
    /// Bytes the weight `w` occupies as stored on this backend (quantized blocks with their
    /// scales, f16 / bf16 or f32 values, layout padding included): what one pass over it
    /// reads from memory. Default: 4 per value (f32 `[N, K]`).
    fn weight_bytes(&self, w: &Self::Weight) -> usize {
        let (n, k) = self.weight_shape(w);
        n * k * 4
    }
    /// A short description of the matmul kernel path a weight runs on (e.g. `avx2 int8, q4_1`),
    /// for `sparkling profile` and the stats. Default: the backend's name.
    fn weight_kernel(&self, w: &Self::Weight) -> String {
        let _ = w;
        self.name()
    }

    // ---- Core ops: compute ------------------------------------------------------------------

    /// `out[i] = table[ids[i]]` → `[ids.len(), K]`. Errors on an id `≥ N`.
    fn embedding(&self, table: &Self::Weight, ids: &[u32]) -> Result<Self::Tensor>;
    /// `x[M,K] · W[N,K]ᵀ (+ bias[1,N] broadcast over rows)` → `[M, N]`.
    fn matmul(&self, x: &Self::Tensor, w: &Self::Weight, bias: Option<&Self::Tensor>) -> Result<Self::Tensor>;
    /// The matmuls of one input, `x·Wᵢᵀ (+ bᵢ)` for each `(Wᵢ, bᵢ)` of `ws` (all with `K` = the
    /// columns of `x`) → one `[M, Nᵢ]` per weight, in order: a layer's q/k/v projections or its
    /// MLP gate and up, so a backend can prepare the input once and run every weight's columns
    /// in one parallel pass. Each output equals [`Backend::matmul`]`(x, Wᵢ, bᵢ)` bit for bit.
    /// Default: one `matmul` per weight. Errors: as `matmul`, for the first weight that fails.
    fn matmul_many(&self, x: &Self::Tensor, ws: &[(&Self::Weight, Option<&Self::Tensor>)]) -> Result<Vec<Self::Tensor>> {
        ws.iter().map(|&(w, bias)| self.matmul(x, w, bias)).collect()
    }
    /// RMSNorm over groups of `group` columns (`group = cols` for a row norm, `head_dim` for the
    /// Qwen3 per-head q/k norm): `x * rsqrt(mean(x²) + eps) * w` with `w: [1, group]`
    /// (reference §1.3: no bias, no `1+w` offset).
    fn rms_norm(&self, x: &Self::Tensor, w: &Self::Tensor, group: usize, eps: f32) -> Result<Self::Tensor>;
    /// In-place NeoX (rotate-half) RoPE on a `[T, n_heads*head_dim]` tensor with one explicit
    /// position per row; `inv_freq[j] = theta^(-2j/head_dim)` (reference §1.3).
    fn rope(&self, x: &mut Self::Tensor, positions: &[u32], head_dim: usize, theta: f32) -> Result<()>;
    /// SwiGLU: `silu(gate) * up`, elementwise, same shapes.
    fn silu_mul(&self, gate: &Self::Tensor, up: &Self::Tensor) -> Result<Self::Tensor>;
    /// `x += y` elementwise.
    fn add_assign(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> Result<()>;
    /// Concatenate along columns: `[T, a] ++ [T, b] → [T, a+b]`.
    fn concat_cols(&self, parts: &[&Self::Tensor]) -> Result<Self::Tensor>;
    /// Concatenate along rows: `[a, C] ++ [b, C] → [a+b, C]`.
    fn concat_rows(&self, parts: &[&Self::Tensor]) -> Result<Self::Tensor>;
    /// Gather rows: `out[i] = x[rows[i]]`.
    fn gather_rows(&self, x: &Self::Tensor, rows: &[usize]) -> Result<Self::Tensor>;

    /// Write `src[T, C]` into rows `at..at+T` of the cache tensor `dst[cap, C]`.
    fn write_rows(&self, dst: &mut Self::Tensor, at: usize, src: &Self::Tensor) -> Result<()>;
    /// KV compaction (reference §4.10): read rows `start + keep[j]` of `cache` for all `j`
    /// first, then write them to rows `start + j` (read-all-then-write, overlap safe).
    fn compact_rows(&self, cache: &mut Self::Tensor, start: usize, keep: &[usize]) -> Result<()>;

    /// Scaled dot-product attention with GQA, scale `head_dim^-0.5`, f32 softmax.
    /// `q`: `[q_rows, n_heads*head_dim]`; `k_cache`/`v_cache`: `[cap, n_kv_heads*head_dim]` of
    /// which rows `0..kv_len` are valid and the last `q_rows` of those are the query block.
    /// Returns `[q_rows, n_heads*head_dim]`.
    fn attention(
        &self,
        q: &Self::Tensor,
        k_cache: &Self::Tensor,
        v_cache: &Self::Tensor,
        kv_len: usize,
        shape: AttnShape,
        mask: AttnMask<'_>,
    ) -> Result<Self::Tensor>;

    /// Ragged attention over several sequences in one call (batch decoding): the query rows of
    /// `q` are the sequences' query blocks back to back (`seqs[0].q_rows` rows, then
    /// `seqs[1].q_rows`, …), and sequence `s` attends only to its own cache, exactly as
    /// [`Backend::attention`] would with `(k_cache, v_cache, kv_len, mask)` of `seqs[s]`.
    /// Returns `[Σ q_rows, n_heads*head_dim]`, each sequence's rows bit-identical to that
    /// single-sequence call (so a sequence decodes the same tokens whatever its neighbours).
    ///
    /// The default loops over the sequences (gather each block, [`Backend::attention`], concat
    /// the results); the CPU backend overrides it with one parallel pass over every
    /// (row, head) of every sequence. The CUDA backend uses the default for now.
    /// Errors: row counts that do not add up to `q`'s rows, an empty block, and whatever
    /// [`Backend::attention`] refuses for a sequence.
    fn attention_ragged(&self, q: &Self::Tensor, seqs: &[RaggedSeq<'_, Self::Tensor>], shape: AttnShape) -> Result<Self::Tensor> {
        let rows = self.shape(q).0;
        check_ragged(rows, seqs)?;
        if let [s] = seqs {
            return self.attention(q, s.k_cache, s.v_cache, s.kv_len, shape, s.mask);
        }
        let mut outs = Vec::with_capacity(seqs.len());
        let mut r0 = 0;
        for s in seqs {
            let idx: Vec<usize> = (r0..r0 + s.q_rows).collect();
            let qs = self.gather_rows(q, &idx)?;
            outs.push(self.attention(&qs, s.k_cache, s.v_cache, s.kv_len, shape, s.mask)?);
            r0 += s.q_rows;
        }
        let parts: Vec<&Self::Tensor> = outs.iter().collect();
        self.concat_rows(&parts)
    }

    // ---- Read-backs (async; blocking versions in `ReadBack`) --------------------------------
    //
    // A browser cannot block on WebGPU, so the decode loop awaits these. Host backends return
    // ready futures; the wgpu backend records the commands and awaits the buffer mapping (the
    // browser yields to its event loop; native targets poll the device until the mapping is
    // done, so `pollster::block_on` of these futures never waits on a waker that never fires).

    /// Copy a tensor back to the host (a sync point). Returns `rows*cols` values.
    async fn download_async(&self, t: &Self::Tensor) -> Result<Vec<f32>>;
    /// Copy rows `start..start+n` of `t` back to the host. Errors: rows outside `t`.
    async fn download_rows_async(&self, t: &Self::Tensor, start: usize, n: usize) -> Result<Vec<f32>>;
    /// Row-wise argmax (lowest index wins ties) → one id per row.
    async fn argmax_async(&self, logits: &Self::Tensor) -> Result<Vec<u32>>;
    /// Row-wise sampling: row `i` draws with the uniform `uniforms[i] ∈ [0,1)` from
    /// `softmax(logits/T)` restricted by top-k/top-p (inverse-CDF over tokens in id order after
    /// filtering). At `T < 1e-5` returns the argmax. Errors: `uniforms.len()` ≠ rows.
    async fn sample_async(&self, logits: &Self::Tensor, params: SampleParams, uniforms: &[f32]) -> Result<Vec<u32>>;

    /// A new weight made of rows `rows` of `w` (`[rows.len(), K]`, row `i` = row `rows[i]` of
    /// `w`): the reduced draft vocabulary's output layer sliced from a borrowed target lm_head.
    /// Default: [`Backend::embedding`] (the rows dequantized to f32), downloaded and uploaded
    /// again with [`Backend::upload_weight`] (the backend's usual precision); a backend that
    /// keeps weights in a format of its own may override it to copy the stored rows as they are
    /// (the CPU backend does). Errors: an id `≥ N` ([`Error::Invalid`]), empty `rows`.
    async fn gather_weight_rows_async(&self, w: &Self::Weight, rows: &[u32]) -> Result<Self::Weight> {
        let (n, k) = self.weight_shape(w);
        check_gather_rows(n, rows)?;
        let t = self.embedding(w, rows)?;
        let data = self.download_async(&t).await?;
        self.upload_weight(data, rows.len(), k)
    }

    // ---- Selection ops (async read-backs with host defaults) --------------------------------

    /// Row-wise top-`k` + log-sum-exp of `logits [rows, V]` (design §3; DDTree §5.1 step 2,
    /// the SparklingTree candidate union §5.2 b). `k` is clamped to `V`. Errors: `k == 0`
    /// ([`Error::Invalid`]).
    ///
    /// Default: download the logits and select on the host ([`select::topk`]); a device
    /// backend overrides it so only `rows·(2k+1)` numbers come back.
    async fn topk_async(&self, logits: &Self::Tensor, k: usize) -> Result<TopK> {
        let (rows, cols) = self.shape(logits);
        if k == 0 {
            return Err(Error::Invalid("topk: k must be at least 1".into()));
        }
        let data = self.download_async(logits).await?;
        select::topk(&data, rows, cols, k)
    }

    /// The Markov candidate table (reference §5.2 c, design §3).
    ///
    /// - `base`: drafter logits `U [ld, V]`;
    /// - `markov`: `Some((W1, W2))`, each `[V, r]` (`markov_w1.weight`, `markov_w2.weight`),
    ///   bias `B(p)[c] = Σ_j W1[p, j]·W2[c, j]` (DSpark §3.6, accumulated in f32 over
    ///   `j = 0..r`); `None` = zero bias;
    /// - `cand`: candidate token ids (`n ≥ 1`, each `< V`, ascending, distinct);
    /// - `k`: children kept per row, clamped to `n`.
    ///
    /// Returns the `[ld, n, k]` table described at [`CandidateTable`] (with `cand` copied into
    /// it and `ld` the rows of `base`). Errors: a candidate id `≥ V`, empty `cand`, `k == 0`,
    /// or W1/W2 shapes that are not `[V, r]` ([`select::check_markov_table_args`]).
    ///
    /// Default: download `base` (and W1/W2) and build the table on the host
    /// ([`select::markov_table`]).
    async fn markov_table_async(&self, base: &Self::Tensor, markov: Option<(&Self::Tensor, &Self::Tensor)>, cand: &[u32], k: usize) -> Result<CandidateTable> {
        let (ld, vocab) = self.shape(base);
        select::check_markov_table_args(vocab, markov.map(|(a, b)| (self.shape(a), self.shape(b))), cand, k)?;
        let u = self.download_async(base).await?;
        let m = match markov {
            Some((w1, w2)) => Some((self.download_async(w1).await?, self.download_async(w2).await?, self.shape(w1).1)),
            None => None,
        };
        Ok(select::markov_table(&u, ld, vocab, m.as_ref().map(|(a, b, r)| (a.as_slice(), b.as_slice(), *r)), cand, k.min(cand.len())))
    }

    /// SparklingTree tree prep in one op (reference §5.2 b–c, design §3): the candidate union
    /// of the per-row top-`a.candidates` ids of `a.base` plus `a.anchor`, then the Markov
    /// candidate table over it (see [`CandidateArgs`]).
    ///
    /// Returns `cand` (ascending, distinct; `n ≤ min(ld·C + 1, V)`) and the `[ld, n, k]` table
    /// of [`CandidateTable`] — exactly what [`Backend::topk_async`] + host union +
    /// [`Backend::markov_table_async`] give. Errors: `k == 0`, `candidates == 0` or
    /// `anchor ≥ V` ([`Error::Invalid`], naming the argument); W1/W2 not `[V, r]`
    /// ([`Error::Shape`]); device failures.
    ///
    /// The default implementation is exactly that composition: `topk` (one read-back), the
    /// union sorted and deduplicated on the host, then `markov_table` (a second read-back).
    /// A device backend should override it with a fused version that keeps the top-C ids on
    /// the device and costs ONE read-back (the wgpu backend does).
    async fn candidate_table_async(&self, a: CandidateArgs<'_, Self::Tensor>) -> Result<CandidateTable> {
        let vocab = self.shape(a.base).1;
        check_candidate_table_args(vocab, a.candidates, a.anchor, a.k)?;
        let cand: Vec<u32> = if a.candidates >= vocab {
            (0..vocab as u32).collect()
        } else {
            select::candidate_union(self.topk_async(a.base, a.candidates).await?.ids, a.anchor)
        };
        self.markov_table_async(a.base, a.markov, &cand, a.k.min(cand.len())).await
    }

    /// SparklingTree's whole tree prep on the device: [`Backend::candidate_table_async`] of
    /// `a`, then the best-first precompute heap of reference §5.2 c
    /// (`build_sparkling_precompute` in `src/tree`: pop the heaviest path, push its next
    /// sibling and its first child) for `budget` nodes, so only the tree comes back
    /// (`4·budget + 1` words, decoded by [`DraftTree::from_device_words`] into a tree rooted at
    /// `a.anchor`) instead of the `[ld, n, k]` table. Path weights accumulate in f32 on the
    /// device (f64 on the host), so on a near-tie (≈ 1e-7 relative) the two may pick different
    /// nodes; either tree is a valid draft and verification stays exact.
    ///
    /// `Ok(None)` — the default — means the backend does not offer it: build the tree on the
    /// host from [`Backend::candidate_table_async`].
    /// Errors: as [`Backend::candidate_table_async`].
    async fn sparkling_tree_async(&self, a: CandidateArgs<'_, Self::Tensor>, budget: usize) -> Result<Option<DraftTree>> {
        let _ = (a, budget);
        Ok(None)
    }
}

/// Blocking read-backs for native callers: each method is the [`Backend`] read-back of the same
/// name plus `_async`, run to completion with `pollster::block_on` (same results and errors).
/// Every backend has it (blanket impl); bring it into scope with `use sparkling_core::ReadBack`.
///
/// Never hangs: host backends' futures are ready when first polled, and the wgpu backend's
/// futures poll the device themselves on native targets until the mapping is done. Not in the
/// browser build (a page cannot block on WebGPU): await the `_async` ops there.
#[cfg(not(target_arch = "wasm32"))]
pub trait ReadBack: Backend {
    /// [`Backend::download_async`], blocking.
    fn download(&self, t: &Self::Tensor) -> Result<Vec<f32>> {
        pollster::block_on(self.download_async(t))
    }
    /// [`Backend::download_rows_async`], blocking.
    fn download_rows(&self, t: &Self::Tensor, start: usize, n: usize) -> Result<Vec<f32>> {
        pollster::block_on(self.download_rows_async(t, start, n))
    }
    /// [`Backend::argmax_async`], blocking.
    fn argmax(&self, logits: &Self::Tensor) -> Result<Vec<u32>> {
        pollster::block_on(self.argmax_async(logits))
    }
    /// [`Backend::sample_async`], blocking.
    fn sample(&self, logits: &Self::Tensor, params: SampleParams, uniforms: &[f32]) -> Result<Vec<u32>> {
        pollster::block_on(self.sample_async(logits, params, uniforms))
    }
    /// [`Backend::gather_weight_rows_async`], blocking.
    fn gather_weight_rows(&self, w: &Self::Weight, rows: &[u32]) -> Result<Self::Weight> {
        pollster::block_on(self.gather_weight_rows_async(w, rows))
    }
    /// [`Backend::topk_async`], blocking.
    fn topk(&self, logits: &Self::Tensor, k: usize) -> Result<TopK> {
        pollster::block_on(self.topk_async(logits, k))
    }
    /// [`Backend::markov_table_async`], blocking.
    fn markov_table(&self, base: &Self::Tensor, markov: Option<(&Self::Tensor, &Self::Tensor)>, cand: &[u32], k: usize) -> Result<CandidateTable> {
        pollster::block_on(self.markov_table_async(base, markov, cand, k))
    }
    /// [`Backend::candidate_table_async`], blocking.
    fn candidate_table(&self, a: CandidateArgs<'_, Self::Tensor>) -> Result<CandidateTable> {
        pollster::block_on(self.candidate_table_async(a))
    }
    /// [`Backend::sparkling_tree_async`], blocking.
    fn sparkling_tree(&self, a: CandidateArgs<'_, Self::Tensor>, budget: usize) -> Result<Option<DraftTree>> {
        pollster::block_on(self.sparkling_tree_async(a, budget))
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl<B: Backend> ReadBack for B {}

/// The argument check of [`Backend::gather_weight_rows_async`]: `rows` non-empty,
/// every id `< n` (the weight's rows). Errors: [`Error::Invalid`] naming the bad id.
pub fn check_gather_rows(n: usize, rows: &[u32]) -> Result<()> {
    if rows.is_empty() {
        return Err(Error::Invalid("gather_weight_rows: no rows".into()));
    }
    if let Some(&bad) = rows.iter().find(|&&r| r as usize >= n) {
        return Err(Error::Invalid(format!("gather_weight_rows: row {bad} is outside a weight of {n} rows")));
    }
    Ok(())
}
