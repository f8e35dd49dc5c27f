//! WGSL kernels (one op per file under `shaders/`, included with `include_str!`) and their
//! compute pipelines, compiled lazily on first use and cached.
//!
//! Every kernel source is `prelude.wgsl` + (for weight-reading kernels) one weight-storage
//! prelude + generated `const` lines (tile shapes, workgroup sizes) + the op's file. Kernels
//! with workgroup reductions (argmax, topk, table_topk, sample) also get a reduction library:
//! `reduce.wgsl` (shared memory only; always available and always tested) or
//! `reduce_subgroup.wgsl` ([`Reduce::Subgroup`], only when the device was opened with
//! `wgpu::Features::SUBGROUP`), and the top-k ones `select.wgsl`; candidate_union.wgsl always
//! uses `reduce.wgsl` (one prefix sum per call). A subgroup kernel starts with
//! the per-backend directive of [`subgroup_directive`] (platform.md §1: naga rejects
//! `enable subgroups;`, Chrome requires it).

use crate::quant::QFormat;
use crate::tensor::WeightStorage;
use sparkling_core::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

const PRELUDE: &str = include_str!("../../../shaders/prelude.wgsl");
const WEIGHTS_F32: &str = include_str!("../../../shaders/weights_f32.wgsl");
const WEIGHTS_F16: &str = include_str!("../../../shaders/weights_f16.wgsl");
const WEIGHTS_BF16: &str = include_str!("../../../shaders/weights_bf16.wgsl");
const WEIGHTS_QUANT: &str = include_str!("../../../shaders/weights_quant.wgsl");
const WEIGHTS_Q8_0: &str = include_str!("../../../shaders/weights_q8_0.wgsl");
const WEIGHTS_Q4_0: &str = include_str!("../../../shaders/weights_q4_0.wgsl");
const WEIGHTS_Q4_1: &str = include_str!("../../../shaders/weights_q4_1.wgsl");
const WEIGHTS_Q5_0: &str = include_str!("../../../shaders/weights_q5_0.wgsl");
const WEIGHTS_Q4_K: &str = include_str!("../../../shaders/weights_q4_k.wgsl");
const WEIGHTS_Q6_K: &str = include_str!("../../../shaders/weights_q6_k.wgsl");
const MATMUL: &str = include_str!("../../../shaders/matmul.wgsl");
const MATMUL_DIRECT: &str = include_str!("../../../shaders/matmul_direct.wgsl");
const EMBEDDING: &str = include_str!("../../../shaders/embedding.wgsl");
const RMS_NORM: &str = include_str!("../../../shaders/rms_norm.wgsl");
const ROPE: &str = include_str!("../../../shaders/rope.wgsl");
const SILU_MUL: &str = include_str!("../../../shaders/silu_mul.wgsl");
const ADD: &str = include_str!("../../../shaders/add.wgsl");
const COPY_COLS: &str = include_str!("../../../shaders/copy_cols.wgsl");
const GATHER_ROWS: &str = include_str!("../../../shaders/gather_rows.wgsl");
const ATTENTION: &str = include_str!("../../../shaders/attention.wgsl");
const ARGMAX: &str = include_str!("../../../shaders/argmax.wgsl");
const REDUCE: &str = include_str!("../../../shaders/reduce.wgsl");
const REDUCE_SUBGROUP: &str = include_str!("../../../shaders/reduce_subgroup.wgsl");
const SELECT: &str = include_str!("../../../shaders/select.wgsl");
const TOPK: &str = include_str!("../../../shaders/topk.wgsl");
const MARKOV_GATHER: &str = include_str!("../../../shaders/markov_gather.wgsl");
const MARKOV_BIAS: &str = include_str!("../../../shaders/markov_bias.wgsl");
const TABLE_TOPK: &str = include_str!("../../../shaders/table_topk.wgsl");
const CANDIDATE_UNION: &str = include_str!("../../../shaders/candidate_union.wgsl");
const TREE_HEAP: &str = include_str!("../../../shaders/tree_heap.wgsl");
const SAMPLE: &str = include_str!("../../../shaders/sample.wgsl");

/// Invocations per workgroup of argmax.wgsl and topk.wgsl (one workgroup per row).
pub(crate) const WIDE_ROW_WG: u32 = 256;
/// Invocations per workgroup of sample.wgsl (its 16-bin reductions use 2 × 16 × WG words of
/// workgroup memory).
pub(crate) const SAMPLE_WG: u32 = 128;
/// Invocations per workgroup of table_topk.wgsl (rows of n ≈ 1000–2000 candidates).
pub(crate) const TABLE_WG: u32 = 64;
/// Candidates (columns) per workgroup of markov_bias.wgsl.
pub(crate) const BIAS_COLS: u64 = 64;
/// Parents (rows) per workgroup of markov_bias.wgsl (`PB` there).
pub(crate) const BIAS_ROWS: u64 = 4;
/// Invocations of the single workgroup of candidate_union.wgsl.
pub(crate) const UNION_WG: u32 = 256;
/// Outputs per workgroup of markov_gather.wgsl.
pub(crate) const GATHER_PER_GROUP: u64 = 256;
/// Bins per radix pass of sample.wgsl (4-bit digits).
const SAMPLE_BINS: u32 = 16;

/// The WGSL directive a subgroup kernel needs on `backend` (platform.md §1, §4): browsers'
/// WGSL compilers (wgpu's `BrowserWebGpu` backend hands WGSL to the browser) require
/// `enable subgroups;`, while naga — which compiles WGSL for every native backend (Vulkan,
/// Metal, DX12, GL) — rejects it as not yet implemented (gfx-rs/wgpu#5555) and exposes the
/// subgroup built-ins given `wgpu::Features::SUBGROUP` alone. (wgpu 30's WebGPU backend does
/// not map the subgroups feature, so today the browser line is never reached; it is here so
/// the kernels stay correct when it does.)
pub(crate) fn subgroup_directive(backend: wgpu::Backend) -> &'static str {
    match backend {
        wgpu::Backend::BrowserWebGpu => "enable subgroups;\n",
        _ => "",
    }
}

/// Which reduction library a kernel is built with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Reduce {
    /// reduce.wgsl: workgroup-memory trees and scans, barriers only (every adapter).
    Workgroup,
    /// reduce_subgroup.wgsl: subgroup operations (adapters with `Features::SUBGROUP`).
    Subgroup,
}

/// Threads per workgroup of the 1-D elementwise kernels (embedding, rope, silu_mul, add,
/// copy_cols, gather_rows): each workgroup covers this many elements.
pub(crate) const ELEMS_PER_GROUP: u64 = 256;

/// Largest head dimension the attention kernel supports (`MAX_HD` in attention.wgsl).
pub(crate) const MAX_HEAD_DIM: usize = 256;

/// Matmul kernel variants. Both run the same per-output fma chain over k = 0..K, so they are
/// bit-identical and the choice never changes a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum MatmulTile {
    /// matmul_direct.wgsl: no workgroup memory; 4 columns (a vec4) x 4 rows per invocation.
    Direct,
    /// matmul.wgsl: 16 x 16 threads, a 32 x 64 output tile staged through workgroup memory,
    /// K tiles of 16.
    Tiled,
}

/// Rows per invocation of the direct kernel (unrolled in matmul_direct.wgsl).
const DIRECT_ROWS: u32 = 4;

impl MatmulTile {
    /// `(WX, WY, TM, TN, BK)` of the tiled variant (see matmul.wgsl).
    const TILED: (u32, u32, u32, u32, u32) = (16, 16, 2, 4, 16);

    /// Output tile `(rows, cols)` of one workgroup.
    pub(crate) fn tile(self) -> (u64, u64) {
        match self {
            MatmulTile::Direct => (DIRECT_ROWS as u64, 256),
            MatmulTile::Tiled => {
                let (wx, wy, tm, tn, _) = MatmulTile::TILED;
                ((wy * tm) as u64, (wx * tn) as u64)
            }
        }
    }

    /// The variant for `m` rows under `choice` on an adapter that is (`cpu_adapter`) or is
    /// not a CPU implementation: `Auto` picks direct for `m ≤ 4` (GEMV) and everywhere on CPU
    /// adapters (emulated barriers), tiled otherwise.
    pub(crate) fn pick(choice: crate::MatmulKernel, m: usize, cpu_adapter: bool) -> MatmulTile {
        match choice {
            crate::MatmulKernel::Direct => MatmulTile::Direct,
            crate::MatmulKernel::Tiled => MatmulTile::Tiled,
            crate::MatmulKernel::Auto if m <= DIRECT_ROWS as usize || cpu_adapter => MatmulTile::Direct,
            crate::MatmulKernel::Auto => MatmulTile::Tiled,
        }
    }
}

/// Every compiled kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kernel {
    Matmul(WeightStorage, MatmulTile),
    Embedding(WeightStorage),
    RmsNorm,
    Rope,
    SiluMul,
    Add,
    CopyCols,
    GatherRows,
    Attention,
    Argmax(Reduce),
    TopK(Reduce),
    MarkovGather,
    MarkovBias,
    TableTopK(Reduce),
    /// candidate_union.wgsl (always on the workgroup-memory scan: one prefix sum per call).
    CandidateUnion,
    /// tree_heap.wgsl: the SparklingTree best-first heap over the candidate table (one invocation).
    TreeHeap,
    Sample(Reduce),
}

impl Kernel {
    /// Every kernel variant an adapter may run: both matmul tiles and the embedding for each
    /// weight storage (float precisions and block formats), every elementwise / attention / selection kernel, with the reduction
    /// library `reduce` (plus the portable one, which `CandidateUnion` always uses).
    pub(crate) fn all(reduce: Reduce) -> Vec<Kernel> {
        let mut v = Vec::new();
        let floats = [WeightStorage::F32, WeightStorage::F16, WeightStorage::Bf16];
        for dt in floats.into_iter().chain(QFormat::ALL.map(WeightStorage::Quant)) {
            v.extend([Kernel::Matmul(dt, MatmulTile::Direct), Kernel::Matmul(dt, MatmulTile::Tiled), Kernel::Embedding(dt)]);
        }
        v.extend([
            Kernel::RmsNorm,
            Kernel::Rope,
            Kernel::SiluMul,
            Kernel::Add,
            Kernel::CopyCols,
            Kernel::GatherRows,
            Kernel::Attention,
            Kernel::MarkovGather,
            Kernel::MarkovBias,
            Kernel::CandidateUnion,
            Kernel::TreeHeap,
        ]);
        let mut reds = vec![Reduce::Workgroup];
        if reduce == Reduce::Subgroup {
            reds.push(Reduce::Subgroup);
        }
        for r in reds {
            v.extend([Kernel::Argmax(r), Kernel::TopK(r), Kernel::TableTopK(r), Kernel::Sample(r)]);
        }
        v
    }

    /// The weight-storage prelude (binding 1, `load_w` / `load_w4`): a float one, or for a
    /// block format its constants, the shared helpers and its own decoder.
    fn weights_prelude(storage: WeightStorage) -> String {
        match storage {
            WeightStorage::F32 => WEIGHTS_F32.to_string(),
            WeightStorage::F16 => WEIGHTS_F16.to_string(),
            WeightStorage::Bf16 => WEIGHTS_BF16.to_string(),
            WeightStorage::Quant(f) => {
                let decoder = match f {
                    QFormat::Q8_0 => WEIGHTS_Q8_0,
                    QFormat::Q4_0 => WEIGHTS_Q4_0,
                    QFormat::Q4_1 => WEIGHTS_Q4_1,
                    QFormat::Q5_0 => WEIGHTS_Q5_0,
                    QFormat::Q4K => WEIGHTS_Q4_K,
                    QFormat::Q6K => WEIGHTS_Q6_K,
                };
                format!("{}{WEIGHTS_QUANT}{decoder}", f.wgsl_consts())
            }
        }
    }

    /// Workgroup-size and bin-count `const` lines plus the reduction library.
    fn reduction(red: Reduce, wg: u32, bins: u32) -> String {
        let lib = match red {
            Reduce::Workgroup => REDUCE,
            Reduce::Subgroup => REDUCE_SUBGROUP,
        };
        format!("const WG: u32 = {wg}u;\nconst NB: u32 = {bins}u;\n{lib}")
    }

    /// The full WGSL source of the kernel for an adapter on `backend`.
    pub(crate) fn source(self, backend: wgpu::Backend) -> String {
        let sg = matches!(self, Kernel::Argmax(r) | Kernel::TopK(r) | Kernel::TableTopK(r) | Kernel::Sample(r) if r == Reduce::Subgroup);
        let mut s = String::from(if sg { subgroup_directive(backend) } else { "" });
        s.push_str(PRELUDE);
        match self {
            Kernel::Matmul(dt, MatmulTile::Tiled) => {
                let (wx, wy, tm, tn, bk) = MatmulTile::TILED;
                s.push_str(&Kernel::weights_prelude(dt));
                s.push_str(&format!(
                    "const WX: u32 = {wx}u;\nconst WY: u32 = {wy}u;\nconst TM: u32 = {tm}u;\nconst TN: u32 = {tn}u;\nconst BK: u32 = {bk}u;\n"
                ));
                s.push_str(MATMUL);
            }
            Kernel::Matmul(dt, MatmulTile::Direct) => {
                s.push_str(&Kernel::weights_prelude(dt));
                s.push_str(MATMUL_DIRECT);
            }
            Kernel::Embedding(dt) => {
                s.push_str(&Kernel::weights_prelude(dt));
                s.push_str(EMBEDDING);
            }
            Kernel::RmsNorm => s.push_str(RMS_NORM),
            Kernel::Rope => s.push_str(ROPE),
            Kernel::SiluMul => s.push_str(SILU_MUL),
            Kernel::Add => s.push_str(ADD),
            Kernel::CopyCols => s.push_str(COPY_COLS),
            Kernel::GatherRows => s.push_str(GATHER_ROWS),
            Kernel::Attention => s.push_str(ATTENTION),
            Kernel::Argmax(r) => {
                s.push_str(&Kernel::reduction(r, WIDE_ROW_WG, 1));
                s.push_str(ARGMAX);
            }
            Kernel::TopK(r) => {
                s.push_str(&Kernel::reduction(r, WIDE_ROW_WG, 1));
                s.push_str(SELECT);
                s.push_str(TOPK);
            }
            Kernel::MarkovGather => s.push_str(MARKOV_GATHER),
            Kernel::MarkovBias => s.push_str(MARKOV_BIAS),
            Kernel::TableTopK(r) => {
                s.push_str(&Kernel::reduction(r, TABLE_WG, 1));
                s.push_str(SELECT);
                s.push_str(TABLE_TOPK);
            }
            Kernel::CandidateUnion => {
                s.push_str(&Kernel::reduction(Reduce::Workgroup, UNION_WG, 1));
                s.push_str(CANDIDATE_UNION);
            }
            Kernel::TreeHeap => s.push_str(TREE_HEAP),
            Kernel::Sample(r) => {
                s.push_str(&Kernel::reduction(r, SAMPLE_WG, SAMPLE_BINS));
                s.push_str(SAMPLE);
            }
        }
        s
    }
}

/// A compiled kernel and the bind-group layout derived from its source.
pub(crate) struct Pipeline {
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) layout: wgpu::BindGroupLayout,
}

/// Lazily compiled pipelines, keyed by [`Kernel`].
pub(crate) struct Pipelines {
    cache: Mutex<HashMap<Kernel, Arc<Pipeline>>>,
    /// The adapter's backend (selects the subgroup directive).
    backend: wgpu::Backend,
}

impl Pipelines {
    /// An empty cache for an adapter on `backend`.
    pub(crate) fn new(backend: wgpu::Backend) -> Pipelines {
        Pipelines { cache: Mutex::new(HashMap::new()), backend }
    }

    /// The pipeline of `k`, compiling it on first use.
    /// Errors: [`Error::Device`] with wgpu's (naga's) message when the shader or pipeline is
    /// rejected by this adapter.
    pub(crate) fn get(&self, device: &wgpu::Device, k: Kernel) -> Result<Arc<Pipeline>> {
        if let Some(p) = self.cache.lock().unwrap_or_else(|e| e.into_inner()).get(&k) {
            return Ok(Arc::clone(p));
        }
        let label = format!("{k:?}");
        let ((module, pipeline), err) = crate::device::checked(device, || {
            let module = device
                .create_shader_module(wgpu::ShaderModuleDescriptor { label: Some(&label), source: wgpu::ShaderSource::Wgsl(k.source(self.backend).into()) });
            let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&label),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
            (module, pipeline)
        });
        drop(module);
        if let Some(e) = err {
            return Err(Error::Device(format!("compiling kernel {label} failed: {e}")));
        }
        let layout = pipeline.get_bind_group_layout(0);
        let p = Arc::new(Pipeline { pipeline, layout });
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).insert(k, Arc::clone(&p));
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SELECTION: [fn(Reduce) -> Kernel; 4] = [Kernel::Argmax, Kernel::TopK, Kernel::TableTopK, Kernel::Sample];

    /// The WGSL code without `//` comments.
    fn code(src: &str) -> String {
        src.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
    }

    #[test]
    fn subgroup_directive_only_for_browsers_and_only_on_subgroup_kernels() {
        for make in SELECTION {
            let sg = make(Reduce::Subgroup);
            let wg = make(Reduce::Workgroup);
            // A browser's WGSL compiler needs the directive first, before any declaration.
            assert!(sg.source(wgpu::Backend::BrowserWebGpu).starts_with("enable subgroups;\n"), "{sg:?}");
            // naga (every native backend) rejects it.
            for b in [wgpu::Backend::Vulkan, wgpu::Backend::Metal, wgpu::Backend::Dx12, wgpu::Backend::Gl] {
                assert!(!code(&sg.source(b)).contains("enable"), "{sg:?} on {b:?}");
            }
            // The portable kernels use no subgroup feature at all.
            let src = code(&wg.source(wgpu::Backend::BrowserWebGpu));
            assert!(!src.contains("enable") && !src.contains("subgroup"), "{wg:?}");
            assert!(code(&sg.source(wgpu::Backend::Vulkan)).contains("subgroupAdd"), "{sg:?}");
        }
    }

    #[test]
    fn candidate_union_is_portable_on_every_backend() {
        // One prefix sum per call: always the workgroup-memory library, never a subgroup op.
        for b in [wgpu::Backend::Vulkan, wgpu::Backend::Metal, wgpu::Backend::BrowserWebGpu] {
            let src = code(&Kernel::CandidateUnion.source(b));
            assert!(!src.contains("enable") && !src.contains("subgroup"));
            assert_eq!(src.matches("const WG: u32").count(), 1);
            assert_eq!(src.matches("@compute").count(), 1);
        }
    }

    #[test]
    fn every_source_defines_its_workgroup_size_once() {
        for make in SELECTION {
            for r in [Reduce::Workgroup, Reduce::Subgroup] {
                let src = code(&make(r).source(wgpu::Backend::Vulkan));
                assert_eq!(src.matches("const WG: u32").count(), 1, "{:?}", make(r));
                assert_eq!(src.matches("@compute").count(), 1, "{:?}", make(r));
            }
        }
    }
}
