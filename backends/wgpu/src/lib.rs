//! wgpu/WGSL backend of SparklingTree (design §3, §9): every [`sparkling_core::Backend`]
//! op as a WGSL compute kernel (`shaders/`, one op per file), running on Vulkan, Metal, DX12,
//! GL or WebGPU through wgpu 30 — and on machines without a GPU on Mesa's lavapipe
//! (`scripts/install-lavapipe`, platform.md §1).
//!
//! - Tensors are f32 storage buffers from a size-bucketed pool; weights are f32, or f16 / bf16
//!   packed two per `u32` and widened in-shader ([`WeightDtype`]), stored transposed per chunk
//!   (`Wᵀ[K, N]`, so neighbouring invocations read neighbouring addresses), or — under
//!   [`WeightDtype::Native`] — GGUF Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q4_K / Q6_K blocks as stored
//!   ([`QFormat`]; repacked so neighbouring output rows' words are neighbours, no byte added
//!   but ≤ 3 padding rows per chunk) and dequantized in registers by the same matmul and
//!   embedding kernels, into the same f32 fma chain: a native matmul is bit-identical to the
//!   f32 matmul of the loader's dequantized values. Weights larger than
//!   one storage binding (`max_storage_buffer_binding_size`) are split by rows across
//!   bindings; an activation tensor that does not fit one binding is a clear [`Error::Device`].
//! - Matmul has two kernels with bit-identical results ([`MatmulKernel`]): a workgroup-memory
//!   tiled one for many rows on GPUs and a barrier-free vec4 one for decode rows and for CPU
//!   adapters (lavapipe emulates barriers).
//! - Dispatches are folded into 2-D grids so no dimension exceeds
//!   `max_compute_workgroups_per_dimension` (65,535).
//! - Ops only record commands into a shared batch that is submitted every few dozen dispatches
//!   (no per-op `device.poll(Wait)`); see "Host syncs" below for the only places that wait.
//! - Determinism: every reduction has a fixed shape that does not depend on the number of
//!   rows in the call (matmul: one sequential fma chain over K per output; attention: chunks
//!   cut by visible-key ordinal; argmax / topk / table / sample: one workgroup per row), so a
//!   tree verify reproduces 1-row decoding bit for bit on one adapter, as the Backend contract
//!   requires.
//! - Selection ops run on the device and read back only their result: `topk` (radix select +
//!   log-sum-exp, `rows·(2k+1)` words), `markov_table` (Markov bias over the candidate union +
//!   per-(depth, parent) log-softmax top-k, `ld·n·2k` words), `candidate_table` (top-C, the
//!   union of candidate_union.wgsl and the table in one read-back sized for the largest
//!   possible union), `sample` (top-k / top-p filter + inverse CDF in f32, one word per row),
//!   `argmax` (one word per row).
//! - Every read-back can be awaited instead of waited for (`Backend::*_async`): the browser
//!   build (`web/`) cannot block on WebGPU, so there the decode loop awaits the buffer mapping.
//! - Subgroups ([`Subgroups`], platform.md §1/§4): the reduction kernels (argmax, topk,
//!   table_topk, sample) are built from `shaders/reduce.wgsl` (workgroup memory + barriers;
//!   every adapter; always tested) or, only when the adapter reports
//!   `wgpu::Features::SUBGROUP` (and a subgroup size ≤ 64), from `shaders/reduce_subgroup.wgsl`.
//!   Subgroup kernels get a per-backend directive line (`enable subgroups;` for a browser's
//!   WGSL compiler, nothing for naga, which rejects it). `WgpuOptions::subgroups =
//!   Subgroups::Off` or the environment variable `SPARKLING_WGPU_SUBGROUPS=0` forces the
//!   portable path (the tests run both). Both paths are exact where the CPU is (ids, slots,
//!   argmax) and differ only in f32 summation order elsewhere.
//! - Tolerances against the CPU backend are documented and measured in `tests/` (matmul
//!   `≤ 2e-6·Σ|x·w|`, attention `2e-6 + 2e-5·|y|`, topk lse `2e-6·(1 + |lse|)` with exact ids
//!   and values, table values `1e-5 + 2e-6·|v|`, sampling equal draws except within 1e-5 of a
//!   CDF / top-p boundary, copies and argmax exact).
//!
//! # Host syncs
//!
//! The host waits for the GPU (`device.poll(Wait)` after mapping a staging buffer) in exactly
//! one place, `Gpu::finish_read_async` (ctx.rs; the browser awaits the buffer mapping instead
//! of polling), reached only from the ops that return host data —
//! `download`, `download_rows`, `argmax`, `sample`, `topk`, `markov_table`, `candidate_table`,
//! `sparkling_tree`,
//! each with one submit and one wait for just its result — and from [`WgpuBackend::synchronize`]
//! (benchmarks). Every other op (matmul, attention, norms, KV writes and compaction, …) only
//! records commands; the batch is submitted without waiting every `FLUSH_EVERY` dispatches.
//! Buffer-pool misses and first-use pipeline compilation pop a wgpu error scope (a host-side
//! check, no GPU wait).
//! Per decoding round the engine (src/decode) therefore syncs at: `topk` (DDTree) or
//! `sparkling_tree` (SparklingTree device prep: top-C, union, Markov table and the best-first
//! heap on the device, one read-back of the `budget` nodes), or one draft-logits `download`
//! (host prep, DSpark, TreeSpark), plus the acceptance read-back (`argmax` / `sample` of the
//! verify rows) — at most two per round.

#![warn(missing_docs)]

mod ctx;
mod device;
mod ops;
mod pipelines;
mod pool;
mod quant;
mod select;
mod tensor;

pub use quant::QFormat;
pub use tensor::{WeightDtype, WeightStorage, WgpuTensor, WgpuWeight};

use ctx::Gpu;
use sparkling_core::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Options of [`WgpuBackend::with_options`]. `Default` = the default adapter, f32 weights and
/// the adapter's own limits.
#[derive(Debug, Clone, Default)]
pub struct WgpuOptions {
    /// Adapter to use: an index into [`list_adapters`] or a case-insensitive substring of an
    /// adapter name. `None`: `WGPU_ADAPTER_NAME` if set, else wgpu's default adapter.
    pub adapter: Option<String>,
    /// Storage precision of uploaded weights.
    pub weight_dtype: WeightDtype,
    /// Use at most this many bytes per storage binding (below the adapter's
    /// `max_storage_buffer_binding_size`); for exercising the weight-splitting path in tests.
    pub max_binding_bytes: Option<u64>,
    /// Use at most this many workgroups per dispatch dimension (below the adapter's
    /// `max_compute_workgroups_per_dimension`); for exercising the 2-D grid folding in tests.
    pub max_workgroups_per_dim: Option<u32>,
    /// Matmul kernel choice.
    pub matmul_kernel: MatmulKernel,
    /// Whether the reduction kernels may use subgroup operations.
    pub subgroups: Subgroups,
    /// Never use indirect dispatch, as on adapters without `INDIRECT_EXECUTION` (some GL
    /// drivers): the candidate-table kernels then run grids sized for the largest possible
    /// union. For testing that path.
    pub no_indirect: bool,
}

/// Subgroup use of the reduction kernels (argmax, topk, markov_table, sample; platform.md §1/§4).
///
/// Both paths are exact where the CPU reference is exact (argmax, top-k ids and values, the
/// table's slots) and agree with it within the same documented tolerances elsewhere; they
/// differ from each other only in f32 summation order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Subgroups {
    /// Use subgroup kernels when the adapter reports `wgpu::Features::SUBGROUP` with a maximum
    /// subgroup size of at most 64 invocations, unless the environment variable
    /// `SPARKLING_WGPU_SUBGROUPS=0` forces them off (to run any test or benchmark on the
    /// portable path).
    #[default]
    Auto,
    /// Never use subgroup operations (the portable path: workgroup-memory trees and barriers).
    Off,
}

/// Largest subgroup size the subgroup kernels accept: their smallest workgroup
/// (`TABLE_WG`) must hold at least one whole subgroup.
const MAX_SUBGROUP_SIZE: u32 = pipelines::TABLE_WG;

/// Whether kernels on `adapter` use subgroups under `mode` (see [`Subgroups::Auto`]).
fn want_subgroups(adapter: &wgpu::Adapter, mode: Subgroups) -> bool {
    let env_off = std::env::var("SPARKLING_WGPU_SUBGROUPS").is_ok_and(|v| v.trim() == "0");
    let info = adapter.get_info();
    mode == Subgroups::Auto
        && !env_off
        && adapter.features().contains(wgpu::Features::SUBGROUP)
        && info.subgroup_max_size >= 1
        && info.subgroup_max_size <= MAX_SUBGROUP_SIZE
}

/// Which matmul kernel to run (a tuning / testing knob; every choice gives bit-identical
/// results because both kernels compute each output as one sequential fma chain over K).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MatmulKernel {
    /// Direct kernel for `M ≤ 4` (decode GEMV) and on CPU adapters; tiled kernel otherwise.
    #[default]
    Auto,
    /// Always the barrier-free direct kernel (shaders/matmul_direct.wgsl).
    Direct,
    /// Always the workgroup-memory tiled kernel (shaders/matmul.wgsl).
    Tiled,
}

/// Host-computed RoPE cos/sin table for one `(head_dim, theta)`: `[n_pos][head_dim]` f32
/// (`cos` for `j < half`, then `sin`), grown as larger positions appear.
struct RopeTable {
    n_pos: usize,
    buffer: wgpu::Buffer,
}

/// The wgpu backend: one adapter, one device and queue, a buffer pool and the kernels.
pub struct WgpuBackend {
    gpu: Arc<Gpu>,
    weight_dtype: WeightDtype,
    matmul_kernel: MatmulKernel,
    rope: Mutex<HashMap<(usize, u32), Arc<RopeTable>>>,
    /// 16 zero bytes bound where a kernel's optional input is absent (bias, tree table).
    dummy: wgpu::Buffer,
}

/// Every adapter wgpu can see, one line each: `index: name (backend, device type, driver)`.
/// The index and any substring of the name are accepted by [`WgpuBackend::new`].
/// Empty when there is no adapter (no GPU driver and no lavapipe). Native only.
#[cfg(not(target_arch = "wasm32"))]
pub fn list_adapters() -> Vec<String> {
    let inst = device::instance();
    device::adapters(&inst).iter().enumerate().map(|(i, a)| format!("{i}: {}", device::describe(&a.get_info()))).collect()
}

impl WgpuBackend {
    /// Open the adapter `adapter` (an index into [`list_adapters`] or a name substring;
    /// `None` = `WGPU_ADAPTER_NAME` or wgpu's default) with f32 weights.
    /// Errors: [`Error::Unavailable`] when there is no adapter at all (the message says how to
    /// install lavapipe), when nothing matches `adapter` (the message lists the adapters), or
    /// when the device cannot be opened.
    pub fn new(adapter: Option<&str>) -> Result<Self> {
        WgpuBackend::with_options(&WgpuOptions { adapter: adapter.map(str::to_string), ..Default::default() })
    }

    /// Open an adapter with explicit [`WgpuOptions`]. Errors as [`WgpuBackend::new`]; in the
    /// browser (wasm32) always [`Error::Unavailable`]: opening a device there is asynchronous,
    /// use [`WgpuBackend::with_options_async`].
    pub fn with_options(opts: &WgpuOptions) -> Result<Self> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            pollster::block_on(WgpuBackend::with_options_async(opts))
        }
        #[cfg(target_arch = "wasm32")]
        {
            let _ = opts;
            Err(Error::Unavailable("in the browser a WebGPU device opens asynchronously: use WgpuBackend::with_options_async".into()))
        }
    }

    /// Open an adapter with explicit [`WgpuOptions`], awaiting the adapter and device requests
    /// (the only way in a browser, where they are promises). Errors as [`WgpuBackend::new`].
    pub async fn with_options_async(opts: &WgpuOptions) -> Result<Self> {
        let inst = device::instance();
        let adapter = device::select(&inst, opts.adapter.as_deref()).await?;
        let health = Arc::new(device::Health::default());
        let subgroups = want_subgroups(&adapter, opts.subgroups);
        let features = if subgroups { wgpu::Features::SUBGROUP } else { wgpu::Features::empty() };
        let (device, queue) = device::open(&adapter, &health, features).await?;
        let limits = device.limits();
        let info = adapter.get_info();
        let adapter_binding = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size);
        let max_binding = opts.max_binding_bytes.map_or(adapter_binding, |b| b.min(adapter_binding)) & !3;
        let max_groups =
            opts.max_workgroups_per_dim.map_or(limits.max_compute_workgroups_per_dimension, |g| g.clamp(1, limits.max_compute_workgroups_per_dimension));
        let dummy = pool::create_buffer(&device, wgpu::BufferUsages::STORAGE, 16, "sparkling dummy")?;
        let indirect = !opts.no_indirect && adapter.get_downlevel_capabilities().flags.contains(wgpu::DownlevelFlags::INDIRECT_EXECUTION);
        let gpu = Gpu {
            pool: pool::Pool::new(device.clone(), indirect),
            pipelines: pipelines::Pipelines::new(info.backend),
            reduce: if subgroups { pipelines::Reduce::Subgroup } else { pipelines::Reduce::Workgroup },
            device,
            queue,
            info,
            limits,
            max_binding,
            max_groups,
            indirect,
            health,
            open: std::sync::Mutex::new(None),
            syncs: std::sync::atomic::AtomicU64::new(0),
            kernels: std::sync::atomic::AtomicU64::new(0),
            uploaded: std::sync::atomic::AtomicU64::new(0),
        };
        Ok(WgpuBackend { gpu: Arc::new(gpu), weight_dtype: opts.weight_dtype, matmul_kernel: opts.matmul_kernel, rope: Mutex::new(HashMap::new()), dummy })
    }

    /// The adapter in use (name, backend, device type, driver).
    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.gpu.info
    }

    /// The device limits in force (the adapter's own limits).
    pub fn limits(&self) -> &wgpu::Limits {
        &self.gpu.limits
    }

    /// True when the reduction kernels (argmax, topk, markov_table, sample) run their subgroup
    /// variants (see [`Subgroups`]); false on the portable workgroup-memory path.
    pub fn uses_subgroups(&self) -> bool {
        self.gpu.reduce == pipelines::Reduce::Subgroup
    }

    /// Bytes per storage binding actually used (adapter limit or [`WgpuOptions`] override).
    pub fn max_binding_bytes(&self) -> u64 {
        self.gpu.max_binding
    }

    /// Storage precision of uploaded weights.
    pub fn weight_dtype(&self) -> WeightDtype {
        self.weight_dtype
    }

    /// How many times the host has waited for the GPU on this backend so far: one per
    /// read-back (`download*`, `argmax`, `sample`, `topk`, `markov_table`) and per
    /// [`WgpuBackend::synchronize`]; every other op adds nothing (see "Host syncs" in the crate
    /// docs). For auditing the syncs of a decoding round.
    pub fn host_syncs(&self) -> u64 {
        self.gpu.syncs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes of idle buffers currently held by the pool.
    pub fn pooled_idle_bytes(&self) -> u64 {
        self.gpu.pool.idle_bytes()
    }

    /// Wait until every submitted op has finished (for benchmarks; ops never need it).
    /// Errors: the device was lost or reported an error.
    pub fn synchronize(&self) -> Result<()> {
        self.gpu.flush();
        self.gpu.syncs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.gpu.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| Error::Device(format!("waiting for the GPU failed: {e}")))?;
        self.gpu.check()
    }

    /// Compile every kernel variant this adapter may run (all weight dtypes and matmul tiles,
    /// both reduction libraries where subgroups are on), as the first use of each would.
    /// Returns how many were compiled. For conformance tests (browsers' WGSL compiler is
    /// stricter than naga) and for warming the pipeline cache before timing.
    /// Errors: [`Error::Device`] naming the first kernel the adapter rejects. In the browser a
    /// rejection arrives asynchronously and is returned by the next op after a read-back.
    pub fn compile_kernels(&self) -> Result<usize> {
        let all = pipelines::Kernel::all(self.gpu.reduce);
        for &k in &all {
            self.gpu.pipelines.get(&self.gpu.device, k)?;
        }
        self.gpu.check()?;
        Ok(all.len())
    }

    /// Destroy the device now, as a driver reset or GPU removal would (for testing the
    /// device-lost path): every later op returns [`Error::Device`] saying the device was lost,
    /// instead of panicking. The backend cannot be used again; open a new one.
    pub fn destroy_device(&self) {
        self.gpu.device.destroy();
        self.gpu.health.record("the device was destroyed (WgpuBackend::destroy_device)".into());
    }

    /// The RoPE table for `(head_dim, theta)` covering positions `0..=max_pos`.
    /// `inv_freq[j] = 1 / (theta^(2j/head_dim) computed in f64, cast to f32)`, angle
    /// `= f32(pos) * inv_freq[j]`, f32 `cos`/`sin` — the CPU backend's expressions exactly, so
    /// both backends rotate by identical factors (reference §1.3).
    /// Errors: the table would exceed one storage binding.
    fn rope_table(&self, head_dim: usize, theta: f32, max_pos: usize) -> Result<Arc<RopeTable>> {
        let key = (head_dim, theta.to_bits());
        let mut cache = self.rope.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = cache.get(&key) {
            if t.n_pos > max_pos {
                return Ok(Arc::clone(t));
            }
        }
        let n_pos = (max_pos + 1).next_power_of_two().max(256);
        let half = head_dim / 2;
        let bytes = self.gpu.tensor_bytes("rope table", n_pos, head_dim)?;
        let inv_freq: Vec<f32> = (0..half).map(|j| 1.0 / (theta as f64).powf(2.0 * j as f64 / head_dim as f64) as f32).collect();
        let mut data = vec![0.0f32; n_pos * head_dim];
        for (p, row) in data.chunks_mut(head_dim.max(1)).enumerate() {
            for (j, f) in inv_freq.iter().enumerate() {
                let a = p as u32 as f32 * f;
                row[j] = a.cos();
                row[half + j] = a.sin();
            }
        }
        let buffer = self.gpu.pool.create(wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST, bytes.max(4), "rope table")?;
        self.gpu.write(&buffer, bytemuck::cast_slice(&data));
        let t = Arc::new(RopeTable { n_pos, buffer });
        cache.insert(key, Arc::clone(&t));
        Ok(t)
    }
}
