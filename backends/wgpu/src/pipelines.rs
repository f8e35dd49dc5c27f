//! WGSL kernels (one op per file under `shaders/`, included with `include_str!`) and their
//! compute pipelines, compiled lazily on first use and cached.
//!
//! Every kernel source is `prelude.wgsl` + (for weight-reading kernels) one weight-storage
//! prelude + generated `const` lines (tile shapes) + the op's file. This is also where a
//! per-backend subgroup prelude would go (`enable subgroups;` for Chrome, nothing for naga,
//! platform.md §1); no kernel uses subgroups today, so the non-subgroup path is the only one.

use crate::tensor::WeightDtype;
use sparkling_core::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

const PRELUDE: &str = include_str!("../../../shaders/prelude.wgsl");
const WEIGHTS_F32: &str = include_str!("../../../shaders/weights_f32.wgsl");
const WEIGHTS_F16: &str = include_str!("../../../shaders/weights_f16.wgsl");
const WEIGHTS_BF16: &str = include_str!("../../../shaders/weights_bf16.wgsl");
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
    Matmul(WeightDtype, MatmulTile),
    Embedding(WeightDtype),
    RmsNorm,
    Rope,
    SiluMul,
    Add,
    CopyCols,
    GatherRows,
    Attention,
    Argmax,
}

impl Kernel {
    fn weights_prelude(dtype: WeightDtype) -> &'static str {
        match dtype {
            WeightDtype::F32 => WEIGHTS_F32,
            WeightDtype::F16 => WEIGHTS_F16,
            WeightDtype::Bf16 => WEIGHTS_BF16,
        }
    }

    /// The full WGSL source of the kernel.
    pub(crate) fn source(self) -> String {
        let mut s = String::from(PRELUDE);
        match self {
            Kernel::Matmul(dt, MatmulTile::Tiled) => {
                let (wx, wy, tm, tn, bk) = MatmulTile::TILED;
                s.push_str(Kernel::weights_prelude(dt));
                s.push_str(&format!(
                    "const WX: u32 = {wx}u;\nconst WY: u32 = {wy}u;\nconst TM: u32 = {tm}u;\nconst TN: u32 = {tn}u;\nconst BK: u32 = {bk}u;\n"
                ));
                s.push_str(MATMUL);
            }
            Kernel::Matmul(dt, MatmulTile::Direct) => {
                s.push_str(Kernel::weights_prelude(dt));
                s.push_str(MATMUL_DIRECT);
            }
            Kernel::Embedding(dt) => {
                s.push_str(Kernel::weights_prelude(dt));
                s.push_str(EMBEDDING);
            }
            Kernel::RmsNorm => s.push_str(RMS_NORM),
            Kernel::Rope => s.push_str(ROPE),
            Kernel::SiluMul => s.push_str(SILU_MUL),
            Kernel::Add => s.push_str(ADD),
            Kernel::CopyCols => s.push_str(COPY_COLS),
            Kernel::GatherRows => s.push_str(GATHER_ROWS),
            Kernel::Attention => s.push_str(ATTENTION),
            Kernel::Argmax => s.push_str(ARGMAX),
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
}

impl Pipelines {
    /// An empty cache.
    pub(crate) fn new() -> Pipelines {
        Pipelines { cache: Mutex::new(HashMap::new()) }
    }

    /// The pipeline of `k`, compiling it on first use.
    /// Errors: [`Error::Device`] with wgpu's (naga's) message when the shader or pipeline is
    /// rejected by this adapter.
    pub(crate) fn get(&self, device: &wgpu::Device, k: Kernel) -> Result<Arc<Pipeline>> {
        if let Some(p) = self.cache.lock().unwrap_or_else(|e| e.into_inner()).get(&k) {
            return Ok(Arc::clone(p));
        }
        let label = format!("{k:?}");
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(&label),
            source: wgpu::ShaderSource::Wgsl(k.source().into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Device(format!("compiling kernel {label} failed: {e}")));
        }
        let layout = pipeline.get_bind_group_layout(0);
        let p = Arc::new(Pipeline { pipeline, layout });
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).insert(k, Arc::clone(&p));
        Ok(p)
    }
}
