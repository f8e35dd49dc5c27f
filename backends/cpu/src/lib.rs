//! CPU reference backend: plain Rust, multithreaded on a fork-join [`team`] (helpers that stay
//! awake between ops; rayon's pool size); f32/f16 weights in packed
//! panels ([`gemm`]) or ggml 32-value quantized blocks with integer dot products ([`quant`]).
//!
//! Every output element is produced by one reduction whose order does not depend on how many
//! rows share the call or on the thread count, so results are bit-identical between a 1-row
//! decode step and a 65-row tree verify (the property the exactness tests rely on). The
//! instruction-set path is chosen at run time ([`isa`]; `SPARKLING_CPU_ISA` forces a lower one).
#![warn(missing_docs)]

mod attention;
// Lint allowed here, not in gemm.rs, while the quantized-weights branch rewrites that file.
#[allow(clippy::needless_range_loop)]
pub mod gemm;
pub mod isa;
mod kernels;
pub mod kv;
pub mod quant;
pub mod select;
pub mod team;
mod vmath;

pub use kv::{KvDtype, Q8Rows};

use sparkling_core::select::check_markov_table_args;
use sparkling_core::{check_ragged, ggml, AttnMask, AttnShape, Backend, CandidateTable, Error, GgmlWeight, RaggedSeq, Result, SampleParams, TopK};

/// An `f32 [rows, cols]` row-major host tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuTensor {
    /// Number of rows.
    pub rows: usize,
    /// Number of columns.
    pub cols: usize,
    /// `rows*cols` values, row-major (empty for a KV cache stored in f16: see `half`).
    pub data: Vec<f32>,
    /// A KV cache's `rows*cols` values stored in f16 ([`Backend::kv_zeros`] on a backend with
    /// [`KvDtype::F16`]); empty for every other tensor. Only `write_rows`, `compact_rows`,
    /// `attention`, `attention_ragged` and the downloads read or write a cache.
    pub half: Vec<half::f16>,
    /// A KV cache stored as q8_0 blocks ([`KvDtype::Q8_0`], [`kv::q8`]); empty otherwise.
    pub q8: Q8Rows,
    /// Column panels ([`kv`]): a KV cache from [`Backend::kv_zeros`] stores its `cols` as one
    /// panel per KV head, each `[rows, cols / panels]` row-major and contiguous (panel `j`'s
    /// value `(r, c)` at `j·rows·w + r·w + c`, `w = cols / panels`), so the attention streams a
    /// head's keys and values from consecutive memory. 1 (plain row-major) for every other
    /// tensor.
    pub panels: usize,
}

impl CpuTensor {
    /// An f32 tensor of `rows × cols` values (`data`, row-major).
    pub fn from_f32(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        CpuTensor { rows, cols, data, half: Vec::new(), q8: Q8Rows::default(), panels: 1 }
    }

    /// Columns per panel (`cols / panels`; all of them for a row-major tensor).
    pub fn panel_width(&self) -> usize {
        self.cols / self.panels.max(1)
    }

    /// Whether the values are stored in f16 (`half`) rather than f32 (`data`).
    pub fn is_f16(&self) -> bool {
        !self.half.is_empty()
    }

    /// Whether the values are stored as q8_0 blocks (`q8`).
    pub fn is_q8(&self) -> bool {
        !self.q8.codes.is_empty()
    }

    /// How the values are stored: `f32`, `f16` or `q8_0`.
    pub fn storage(&self) -> &'static str {
        if self.is_f16() {
            "f16"
        } else if self.is_q8() {
            "q8_0"
        } else {
            "f32"
        }
    }
}

/// A `[n, k]` weight matrix (HF layout, `y = x·Wᵀ`) in the form its matmul kernel reads.
#[derive(Debug, Clone)]
pub struct CpuWeight {
    /// Output features.
    pub n: usize,
    /// Input features.
    pub k: usize,
    /// The stored values.
    pub data: WeightData,
}

/// How a [`CpuWeight`] is stored.
#[derive(Debug, Clone)]
pub enum WeightData {
    /// f32 or f16 values packed into column panels ([`gemm`]).
    Panels(gemm::Packed),
    /// ggml blocks ([`quant`]): Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K.
    Quant(quant::QWeight),
}

impl CpuWeight {
    /// Row `r` (`k` values) dequantized / widened to f32 into `out` (the embedding lookup).
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        match &self.data {
            WeightData::Panels(p) => p.row_into(r, out),
            WeightData::Quant(q) => q.row_into(r, out),
        }
    }

    /// Storage format name: `f32`, `f16`, or the ggml block format (`q4_1`, …).
    pub fn format_name(&self) -> &'static str {
        match &self.data {
            WeightData::Panels(gemm::Packed { panels: gemm::Panels::F32(_), .. }) => "f32",
            WeightData::Panels(gemm::Packed { panels: gemm::Panels::F16(_), .. }) => "f16",
            WeightData::Quant(q) => q.format.name(),
        }
    }

    /// Bytes the stored weight occupies.
    pub fn bytes(&self) -> usize {
        match &self.data {
            WeightData::Panels(gemm::Packed { panels: gemm::Panels::F32(v), .. }) => 4 * v.len(),
            WeightData::Panels(gemm::Packed { panels: gemm::Panels::F16(v), .. }) => 2 * v.len(),
            WeightData::Quant(q) => q.bytes(),
        }
    }
}

/// How the CPU backend stores uploaded weights (`--weights`). Costs per weight, bytes read by
/// every decode step: f32 4 B, f16 2 B, q8_0 1.06 B, Q4_1 0.625 B, Q4_0 0.56 B.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightDtype {
    /// Keep f32 (exact copy of what the loader produced).
    #[default]
    F32,
    /// Round to f16 at upload (halves memory and decode bandwidth; llama.cpp's F16 format).
    F16,
    /// Quantize float weights (f32 uploads, GGUF F16/F32) to Q8_0 blocks (ggml's quantizer;
    /// matrices whose K is not a multiple of 32 stay f16). GGUF Q8_0/Q4_0/Q4_1/Q5_0/Q4_K/Q6_K blocks are kept
    /// as stored, as with [`WeightDtype::Native`].
    Q8_0,
    /// Keep GGUF tensors in their stored format where the CPU has a kernel for it (Q8_0,
    /// Q4_0, Q4_1, Q5_0, Q4_K, Q6_K blocks; F16; F32); f32 uploads (other formats, dequantized by the
    /// loader) are stored as f16.
    Native,
}

impl WeightDtype {
    /// Lower-case name as `--weights` spells it.
    pub fn name(self) -> &'static str {
        match self {
            WeightDtype::F32 => "f32",
            WeightDtype::F16 => "f16",
            WeightDtype::Q8_0 => "q8_0",
            WeightDtype::Native => "native",
        }
    }
}

/// The CPU backend. Runs its parallel ops on [`team`], sized like rayon's current pool
/// (`--threads` / `RAYON_NUM_THREADS`).
#[derive(Debug, Default, Clone)]
pub struct CpuBackend {
    weight_dtype: WeightDtype,
    kv_dtype: KvDtype,
}

impl CpuBackend {
    /// A backend storing weights and the KV cache in f32.
    pub fn new() -> Self {
        CpuBackend::default()
    }

    /// A backend storing weights in `dtype` (the KV cache in f32).
    pub fn with_weight_dtype(dtype: WeightDtype) -> Self {
        CpuBackend { weight_dtype: dtype, kv_dtype: KvDtype::F32 }
    }

    /// This backend with its KV caches stored in `kv` ([`KvDtype`]).
    pub fn with_kv_dtype(self, kv: KvDtype) -> Self {
        CpuBackend { kv_dtype: kv, ..self }
    }

    /// The weight storage precision.
    pub fn weight_dtype(&self) -> WeightDtype {
        self.weight_dtype
    }

    /// The KV cache storage precision.
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }
}

fn shape_err(op: &'static str, detail: String) -> Error {
    Error::Shape { op, detail }
}

/// Below this many multiply-adds a matmul (or a [`Backend::matmul_many`] set) runs on the
/// calling thread.
const PAR_MIN_MACS: usize = 1 << 18;

/// The `[m, n]` row-major output of column tasks: task `t` holds columns `t·cols ..` of every
/// row as `[m, width]` (its last columns may be padding past `n`), then `+ bias` per row.
fn assemble_columns(parts: &[Vec<f32>], m: usize, n: usize, cols: usize, bias: Option<&[f32]>) -> Vec<f32> {
    let mut y = vec![0.0f32; m * n];
    for (t, buf) in parts.iter().enumerate() {
        let c0 = t * cols;
        let width = buf.len() / m.max(1);
        let take = width.min(n - c0);
        for i in 0..m {
            y[i * n + c0..i * n + c0 + take].copy_from_slice(&buf[i * width..i * width + take]);
        }
    }
    add_bias(&mut y, n, bias);
    y
}

/// `y[i, j] += bias[j]` for every row of the row-major `[·, n]` matrix `y` (nothing without a
/// bias).
fn add_bias(y: &mut [f32], n: usize, bias: Option<&[f32]>) {
    if let Some(b) = bias {
        for row in y.chunks_mut(n.max(1)) {
            for (v, bb) in row.iter_mut().zip(b) {
                *v += bb;
            }
        }
    }
}

/// A raw output pointer that column tasks on several threads write through, each to its own
/// columns (the callers' safety arguments say why the columns are disjoint).
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);

// SAFETY: only passed to tasks that write disjoint parts of one live buffer.
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The pointer (a method, so closures capture the `Sync` wrapper, not the raw field).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// The shape check of `matmul` (`op` names the caller in the error).
fn check_matmul(op: &'static str, x: &CpuTensor, w: &CpuWeight, bias: Option<&CpuTensor>) -> Result<()> {
    if x.cols != w.k {
        return Err(shape_err(op, format!("x [{}, {}] vs W [{}, {}]", x.rows, x.cols, w.n, w.k)));
    }
    if let Some(b) = bias {
        if b.data.len() != w.n {
            return Err(shape_err(op, format!("bias of {} for N = {}", b.data.len(), w.n)));
        }
    }
    Ok(())
}

/// Below this many elements an elementwise op runs on the calling thread: a dispatch to the
/// [`team`] (≈ 0.1 µs while its helpers spin) plus the split costs more than the work. At this
/// size a 1 + 8-row verify's norms, RoPE and SwiGLU (9 × 576 or 9 × 1 536 values) run on
/// every thread.
const PAR_MIN_ELEMS: usize = 1 << 12;

impl Backend for CpuBackend {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;

    fn name(&self) -> String {
        let n = team::threads();
        format!(
            "cpu ({n} thread{}, {}, {} weights, {} kv cache, isa {})",
            if n == 1 { "" } else { "s" },
            kernels::simd_name(),
            self.weight_dtype.name(),
            self.kv_dtype.name(),
            isa::active().name()
        )
    }

    fn host_memory(&self) -> bool {
        true
    }

    fn upload(&self, data: &[f32], rows: usize, cols: usize) -> Result<CpuTensor> {
        if data.len() != rows * cols {
            return Err(shape_err("upload", format!("{} values for [{rows}, {cols}]", data.len())));
        }
        Ok(CpuTensor::from_f32(rows, cols, data.to_vec()))
    }

    fn zeros(&self, rows: usize, cols: usize) -> Result<CpuTensor> {
        Ok(CpuTensor::from_f32(rows, cols, vec![0.0; rows * cols]))
    }

    fn kv_zeros(&self, rows: usize, heads: usize, head_dim: usize) -> Result<CpuTensor> {
        if heads == 0 || head_dim == 0 {
            return Err(shape_err("kv_zeros", format!("a cache of {heads} KV heads of {head_dim} values")));
        }
        Ok(kv::zeros(self.kv_dtype, rows, heads, head_dim))
    }

    fn shape(&self, t: &CpuTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn upload_weight(&self, data: Vec<f32>, n: usize, k: usize) -> Result<CpuWeight> {
        if data.len() != n * k {
            return Err(shape_err("upload_weight", format!("{} values for [{n}, {k}]", data.len())));
        }
        if self.weight_dtype == WeightDtype::Q8_0 && k.is_multiple_of(quant::QK) && k > 0 {
            let q = quant::QWeight::quantize_q8_0(&data, n, k).map_err(|e| Error::Invalid(format!("upload_weight: {e}")))?;
            return Ok(CpuWeight { n, k, data: WeightData::Quant(q) });
        }
        let f16 = self.weight_dtype != WeightDtype::F32;
        let packed = gemm::Packed::pack(&data, n, k, f16);
        Ok(CpuWeight { n, k, data: WeightData::Panels(packed) })
    }

    /// `native` storage keeps a drafter's float matrices as Q8_0 blocks (when K is a multiple
    /// of 32): the int8 kernels run its 20-row forward faster than f16 panels
    /// (BENCHMARKS.md §16), and only the drafter's speed depends on it. Other storages as
    /// [`Backend::upload_weight`].
    fn upload_draft_weight(&self, data: Vec<f32>, n: usize, k: usize) -> Result<CpuWeight> {
        if self.weight_dtype == WeightDtype::Native {
            return CpuBackend::with_weight_dtype(WeightDtype::Q8_0).upload_weight(data, n, k);
        }
        self.upload_weight(data, n, k)
    }

    fn accepts_ggml(&self, ggml_type: u32) -> bool {
        let native = matches!(self.weight_dtype, WeightDtype::Native | WeightDtype::Q8_0);
        native && (quant::QFormat::from_ggml(ggml_type).is_some() || ggml_type == ggml::F16 || ggml_type == ggml::F32)
    }

    fn upload_weight_ggml(&self, w: GgmlWeight) -> Result<CpuWeight> {
        let GgmlWeight { ggml_type, n, k, bytes } = w;
        let floats = |width: usize| -> Result<()> {
            if bytes.len() != n * k * width {
                return Err(shape_err("upload_weight_ggml", format!("{} bytes for a [{n}, {k}] weight of ggml type {ggml_type}", bytes.len())));
            }
            Ok(())
        };
        let data = match (quant::QFormat::from_ggml(ggml_type), ggml_type) {
            (Some(f), _) => WeightData::Quant(quant::QWeight::from_ggml(f, &bytes, n, k).map_err(|e| match e {
                quant::QuantError::Shape(m) => shape_err("upload_weight_ggml", m),
                quant::QuantError::Corrupt(m) => Error::Invalid(m),
            })?),
            (None, ggml::F16) => {
                floats(2)?;
                let vals: Vec<f32> = bytes.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect();
                if self.weight_dtype == WeightDtype::Q8_0 {
                    return self.upload_weight(vals, n, k);
                }
                WeightData::Panels(gemm::Packed::pack(&vals, n, k, true))
            }
            (None, ggml::F32) => {
                floats(4)?;
                let vals: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
                if self.weight_dtype == WeightDtype::Q8_0 {
                    return self.upload_weight(vals, n, k);
                }
                WeightData::Panels(gemm::Packed::pack(&vals, n, k, false))
            }
            (None, other) => return Err(Error::Unavailable(format!("upload_weight_ggml: the CPU backend has no kernel for ggml type {other}"))),
        };
        Ok(CpuWeight { n, k, data })
    }

    fn weight_kernel(&self, w: &CpuWeight) -> String {
        let path = match (&w.data, isa::active()) {
            (WeightData::Quant(_), isa::Isa::Avx512Vnni) => "avx512 int8 (vpdpbusd)",
            (WeightData::Quant(_), isa::Isa::Avx2) => "avx2 int8 (maddubs)",
            (WeightData::Quant(_), isa::Isa::Scalar) => "scalar int8",
            (WeightData::Panels(_), isa::Isa::Avx2 | isa::Isa::Avx512Vnni) => "avx2+fma f32",
            (WeightData::Panels(_), isa::Isa::Scalar) => "scalar f32",
        };
        format!("{path}, {} weights", w.format_name())
    }

    fn weight_shape(&self, w: &CpuWeight) -> (usize, usize) {
        (w.n, w.k)
    }

    fn weight_bytes(&self, w: &CpuWeight) -> usize {
        w.bytes()
    }

    fn embedding(&self, table: &CpuWeight, ids: &[u32]) -> Result<CpuTensor> {
        let k = table.k;
        let mut data = vec![0.0f32; ids.len() * k];
        for (row, &id) in data.chunks_mut(k.max(1)).zip(ids) {
            let id = id as usize;
            if id >= table.n {
                return Err(Error::Invalid(format!("token id {id} out of range for an embedding table of {} rows", table.n)));
            }
            table.row_into(id, row);
        }
        Ok(CpuTensor::from_f32(ids.len(), k, data))
    }

    fn matmul(&self, x: &CpuTensor, w: &CpuWeight, bias: Option<&CpuTensor>) -> Result<CpuTensor> {
        check_matmul("matmul", x, w, bias)?;
        let bias = bias.map(|b| b.data.as_slice());
        let (m, n) = (x.rows, w.n);
        if m == 0 {
            return Ok(CpuTensor::from_f32(0, n, Vec::new()));
        }
        let data = match &w.data {
            WeightData::Panels(p) => gemm::matmul(&x.data, m, p, bias),
            WeightData::Quant(q) => quant::matmul(isa::active(), &x.data, m, q, bias),
        };
        Ok(CpuTensor::from_f32(m, n, data))
    }

    /// One pass: the input is quantized once for every quantized weight, and the column tasks
    /// of all weights share one parallel dispatch (each task runs the kernel `matmul` runs, so
    /// the outputs are the same bits).
    fn matmul_many(&self, x: &CpuTensor, ws: &[(&CpuWeight, Option<&CpuTensor>)]) -> Result<Vec<CpuTensor>> {
        for &(w, bias) in ws {
            check_matmul("matmul_many", x, w, bias)?;
        }
        let m = x.rows;
        if m == 0 {
            return Ok(ws.iter().map(|(w, _)| CpuTensor::from_f32(0, w.n, Vec::new())).collect());
        }
        let isa = isa::active();
        let threads = team::threads();
        let acts = ws.iter().any(|(w, _)| matches!(w.data, WeightData::Quant(_))).then(|| quant::quantize_acts(&x.data, m, x.cols));
        // Per weight: (tasks, columns per task, groups per task for quantized weights).
        let plans: Vec<(usize, usize, usize)> = ws
            .iter()
            .map(|(w, _)| match &w.data {
                WeightData::Quant(q) => {
                    let (gpt, tasks) = quant::tasks(q, threads);
                    (tasks, gpt * 8, gpt)
                }
                WeightData::Panels(p) => (gemm::tasks(p), gemm::TASK_PANELS * gemm::NR, 0),
            })
            .collect();
        // Quantized weights whose tasks can write their columns in place (`quant::direct_output`)
        // get their output now; the others (f16/f32 panels, N not a multiple of 8) return
        // per-task buffers that are copied into place after the parallel part.
        let mut direct: Vec<Option<quant::DirectOutput>> = ws
            .iter()
            .map(|(w, _)| match &w.data {
                WeightData::Quant(q) if acts.is_some() => quant::direct_output(q, m),
                _ => None,
            })
            .collect();
        let outs: Vec<Option<SendPtr>> = direct.iter_mut().map(|d| d.as_mut().map(|y| SendPtr(y.ptr()))).collect();
        let jobs: Vec<(usize, usize)> = plans.iter().enumerate().flat_map(|(wi, &(tasks, _, _))| (0..tasks).map(move |t| (wi, t))).collect();
        let run = |&(wi, t): &(usize, usize)| -> Option<Vec<f32>> {
            match (&ws[wi].0.data, acts.as_ref(), outs[wi]) {
                (WeightData::Quant(q), Some(a), Some(y)) => {
                    // SAFETY: `y` is weight `wi`'s `[m, n]` output, `n` a multiple of 8
                    // (`direct_output`), and task `t` writes only its own columns.
                    unsafe { quant::task_into(isa, q, a, t, plans[wi].2, y.get(), q.n) };
                    None
                }
                (WeightData::Quant(q), Some(a), None) => Some(quant::task(isa, q, a, t, plans[wi].2)),
                (WeightData::Panels(p), _, _) => Some(gemm::task(&x.data, m, p, t)),
                // Not reached (`acts` exists when any weight is quantized); correct all the same.
                (WeightData::Quant(q), None, _) => Some(quant::task(isa, q, &quant::quantize_acts(&x.data, m, x.cols), t, plans[wi].2)),
            }
        };
        let macs: usize = ws.iter().map(|(w, _)| m * w.n * w.k).sum();
        let mut parts: Vec<Option<Vec<f32>>> = if macs >= PAR_MIN_MACS { team::map(jobs.len(), |j| run(&jobs[j])) } else { jobs.iter().map(run).collect() };
        let mut out = Vec::with_capacity(ws.len());
        let mut at = 0;
        for ((&(w, bias), &(tasks, cols, _)), d) in ws.iter().zip(&plans).zip(direct) {
            let bias = bias.map(|b| b.data.as_slice());
            let data = match d {
                Some(d) => {
                    // SAFETY: every task of this weight ran (`jobs`), each writing its columns
                    // of every row.
                    let mut y = unsafe { d.filled() };
                    add_bias(&mut y, w.n, bias);
                    y
                }
                None => {
                    let bufs: Vec<Vec<f32>> = parts[at..at + tasks].iter_mut().map(|p| p.take().unwrap_or_default()).collect();
                    assemble_columns(&bufs, m, w.n, cols, bias)
                }
            };
            out.push(CpuTensor::from_f32(m, w.n, data));
            at += tasks;
        }
        Ok(out)
    }

    fn rms_norm(&self, x: &CpuTensor, w: &CpuTensor, group: usize, eps: f32) -> Result<CpuTensor> {
        let w = w.data.as_slice();
        if group == 0 || !x.cols.is_multiple_of(group) || w.len() != group {
            return Err(shape_err("rms_norm", format!("cols {} group {group} weight {}", x.cols, w.len())));
        }
        let mut out = x.data.clone();
        let norm = |g: &mut [f32]| {
            let ss: f32 = g.iter().map(|v| v * v).sum::<f32>() / group as f32;
            let inv = 1.0 / (ss + eps).sqrt();
            for (v, wv) in g.iter_mut().zip(w) {
                *v = *v * inv * wv;
            }
        };
        if out.len() >= PAR_MIN_ELEMS {
            team::for_each_chunk(&mut out, group, |_, g| norm(g));
        } else {
            out.chunks_mut(group).for_each(norm);
        }
        Ok(CpuTensor::from_f32(x.rows, x.cols, out))
    }

    fn rope(&self, x: &mut CpuTensor, positions: &[u32], head_dim: usize, theta: f32) -> Result<()> {
        if positions.len() != x.rows || !head_dim.is_multiple_of(2) || !x.cols.is_multiple_of(head_dim) {
            return Err(shape_err("rope", format!("x [{}, {}], {} positions, head_dim {head_dim}", x.rows, x.cols, positions.len())));
        }
        let half = head_dim / 2;
        let inv_freq: Vec<f32> = (0..half).map(|j| 1.0 / (theta as f64).powf(2.0 * j as f64 / head_dim as f64) as f32).collect();
        let cols = x.cols;
        let rotate = |(row, &p): (&mut [f32], &u32)| {
            let (cos, sin): (Vec<f32>, Vec<f32>) = inv_freq
                .iter()
                .map(|f| {
                    let a = p as f32 * f;
                    (a.cos(), a.sin())
                })
                .unzip();
            for head in row.chunks_mut(head_dim) {
                for j in 0..half {
                    let (a, b) = (head[j], head[j + half]);
                    head[j] = a * cos[j] - b * sin[j];
                    head[j + half] = b * cos[j] + a * sin[j];
                }
            }
        };
        if x.data.len() >= PAR_MIN_ELEMS {
            team::for_each_chunk(&mut x.data, cols, |i, row| rotate((row, &positions[i])));
        } else {
            x.data.chunks_mut(cols).zip(positions.iter()).for_each(rotate);
        }
        Ok(())
    }

    fn silu_mul(&self, gate: &CpuTensor, up: &CpuTensor) -> Result<CpuTensor> {
        if gate.rows != up.rows || gate.cols != up.cols {
            return Err(shape_err("silu_mul", format!("[{}, {}] vs [{}, {}]", gate.rows, gate.cols, up.rows, up.cols)));
        }
        let mut data = vec![0.0f32; gate.data.len()];
        if data.len() >= PAR_MIN_ELEMS {
            // Chunks of a multiple of 8 values: every value takes the same path as in one call.
            let chunk = data.len().div_ceil(2 * team::threads()).next_multiple_of(64);
            team::for_each_chunk(&mut data, chunk, |i, out| {
                vmath::silu_mul(&gate.data[i * chunk..i * chunk + out.len()], &up.data[i * chunk..i * chunk + out.len()], out)
            });
        } else {
            vmath::silu_mul(&gate.data, &up.data, &mut data);
        }
        Ok(CpuTensor::from_f32(gate.rows, gate.cols, data))
    }

    fn add_assign(&self, x: &mut CpuTensor, y: &CpuTensor) -> Result<()> {
        if x.rows != y.rows || x.cols != y.cols {
            return Err(shape_err("add_assign", format!("[{}, {}] vs [{}, {}]", x.rows, x.cols, y.rows, y.cols)));
        }
        x.data.iter_mut().zip(&y.data).for_each(|(a, b)| *a += b);
        Ok(())
    }

    fn concat_cols(&self, parts: &[&CpuTensor]) -> Result<CpuTensor> {
        let rows = parts.first().map_or(0, |p| p.rows);
        if parts.iter().any(|p| p.rows != rows) {
            return Err(shape_err("concat_cols", "parts have different row counts".into()));
        }
        let cols: usize = parts.iter().map(|p| p.cols).sum();
        let mut data = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            for p in parts {
                data.extend_from_slice(&p.data[r * p.cols..(r + 1) * p.cols]);
            }
        }
        Ok(CpuTensor::from_f32(rows, cols, data))
    }

    fn concat_rows(&self, parts: &[&CpuTensor]) -> Result<CpuTensor> {
        let cols = parts.first().map_or(0, |p| p.cols);
        if parts.iter().any(|p| p.cols != cols) {
            return Err(shape_err("concat_rows", "parts have different column counts".into()));
        }
        let data: Vec<f32> = parts.iter().flat_map(|p| p.data.iter().copied()).collect();
        Ok(CpuTensor::from_f32(data.len() / cols.max(1), cols, data))
    }

    fn gather_rows(&self, x: &CpuTensor, rows: &[usize]) -> Result<CpuTensor> {
        let mut data = Vec::with_capacity(rows.len() * x.cols);
        for &r in rows {
            if r >= x.rows {
                return Err(shape_err("gather_rows", format!("row {r} of {}", x.rows)));
            }
            data.extend_from_slice(&x.data[r * x.cols..(r + 1) * x.cols]);
        }
        Ok(CpuTensor::from_f32(rows.len(), x.cols, data))
    }

    fn write_rows(&self, dst: &mut CpuTensor, at: usize, src: &CpuTensor) -> Result<()> {
        kv::write_rows(dst, at, src)
    }

    fn compact_rows(&self, cache: &mut CpuTensor, start: usize, keep: &[usize]) -> Result<()> {
        kv::compact_rows(cache, start, keep)
    }

    fn attention(&self, q: &CpuTensor, k_cache: &CpuTensor, v_cache: &CpuTensor, kv_len: usize, shape: AttnShape, mask: AttnMask<'_>) -> Result<CpuTensor> {
        attention::attend(q, &[RaggedSeq { k_cache, v_cache, kv_len, q_rows: q.rows, mask }], shape)
    }

    fn attention_ragged(&self, q: &CpuTensor, seqs: &[RaggedSeq<'_, CpuTensor>], shape: AttnShape) -> Result<CpuTensor> {
        check_ragged(q.rows, seqs)?;
        attention::attend(q, seqs, shape)
    }

    // ---- Read-backs: host memory, so each future is ready when first polled ------------------

    async fn download_async(&self, t: &CpuTensor) -> Result<Vec<f32>> {
        kv::download_rows(t, 0, t.rows)
    }

    async fn download_rows_async(&self, t: &CpuTensor, start: usize, n: usize) -> Result<Vec<f32>> {
        kv::download_rows(t, start, n)
    }

    /// The rows as stored: quantized blocks copied code for code, f32 / f16 panels repacked
    /// in their own precision (no rounding, whatever `--weights` says).
    async fn gather_weight_rows_async(&self, w: &CpuWeight, rows: &[u32]) -> Result<CpuWeight> {
        if rows.is_empty() {
            return Err(Error::Invalid("gather_weight_rows: no rows".into()));
        }
        if let Some(&bad) = rows.iter().find(|&&r| r as usize >= w.n) {
            return Err(Error::Invalid(format!("gather_weight_rows: row {bad} is outside a weight of {} rows", w.n)));
        }
        let n = rows.len();
        let data = match &w.data {
            WeightData::Quant(q) => WeightData::Quant(q.gather_rows(rows)),
            WeightData::Panels(p) => {
                let mut vals = vec![0.0f32; n * w.k];
                for (out, &r) in vals.chunks_mut(w.k.max(1)).zip(rows) {
                    p.row_into(r as usize, out);
                }
                let f16 = matches!(p.panels, gemm::Panels::F16(_));
                WeightData::Panels(gemm::Packed::pack(&vals, n, w.k, f16))
            }
        };
        Ok(CpuWeight { n, k: w.k, data })
    }

    async fn argmax_async(&self, logits: &CpuTensor) -> Result<Vec<u32>> {
        Ok(logits.data.chunks(logits.cols.max(1)).map(kernels::argmax).collect())
    }

    async fn sample_async(&self, logits: &CpuTensor, params: SampleParams, uniforms: &[f32]) -> Result<Vec<u32>> {
        if uniforms.len() != logits.rows {
            return Err(shape_err("sample", format!("{} uniforms for {} rows", uniforms.len(), logits.rows)));
        }
        // Each row's draw is independent of the others (its own logits and uniform), so rows run
        // on all threads: a row costs ~0.3 ms at a 49 152-token vocabulary (one exp per logit).
        // Many rows come from batch decoding (one per sequence) and from device-style callers;
        // the single-sequence decode loop draws one row at a time on host-memory backends.
        let cols = logits.cols.max(1);
        let rows = logits.data.len().div_ceil(cols).min(uniforms.len());
        Ok(team::map(rows, |i| kernels::sample_row(&logits.data[i * cols..((i + 1) * cols).min(logits.data.len())], params, uniforms[i])))
    }

    // ---- Selection ops: the parallel host versions (`select`) on the tensors in place -------

    async fn topk_async(&self, logits: &CpuTensor, k: usize) -> Result<TopK> {
        if k == 0 {
            return Err(Error::Invalid("topk: k must be at least 1".into()));
        }
        let k = k.min(logits.cols);
        if k == 0 {
            return Ok(TopK { k, ..TopK::default() });
        }
        Ok(select::topk(&logits.data, logits.rows, logits.cols, k))
    }

    async fn markov_table_async(&self, base: &CpuTensor, markov: Option<(&CpuTensor, &CpuTensor)>, cand: &[u32], k: usize) -> Result<CandidateTable> {
        let vocab = base.cols;
        check_markov_table_args(vocab, markov.map(|(a, b)| ((a.rows, a.cols), (b.rows, b.cols))), cand, k)?;
        let m = markov.map(|(w1, w2)| (w1.data.as_slice(), w2.data.as_slice(), w1.cols));
        Ok(select::markov_table(&base.data, base.rows, vocab, m, cand, k.min(cand.len())))
    }
}

#[cfg(test)]
mod tests;
