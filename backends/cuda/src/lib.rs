//! CUDA backend of SparklingTree (design §3, §9): every [`sparkling_core::Backend`] op as
//! a CUDA C kernel compiled at run time by NVRTC (`shaders/cuda/`, one op per file), with the
//! matmuls on cuBLAS, all through `cudarc` with dynamic loading — the crate builds with no CUDA
//! toolkit and no driver, and [`CudaBackend::new`] returns [`Error::Unavailable`] (never a
//! panic) when libcuda, a device, libnvrtc or libcublas is missing ([`probe`]).
//!
//! - Weights are bfloat16 by default (`cublasGemmEx`: bf16 weights and bf16-rounded
//!   activations, f32 accumulation and output) or f32 (`cublasSgemm`, pedantic math, no TF32),
//!   see [`WeightDtype`]. Activations, KV cache and every reduction are f32 (softmax
//!   normalisers and sampling sums in f64).
//! - **Row-count independence** (the Backend contract that makes a 65-row tree verify reproduce
//!   a 1-row decode step bit for bit): cuBLAS chooses its algorithm per problem shape, so every
//!   GEMM runs on blocks of exactly [`CudaOptions::gemm_row_block`] rows (default 128; the last
//!   block zero-padded) — a 1-row decode and a 65-row verify execute the identical GEMM. At
//!   batch 1 on H100/H200 a 128-row block is still bandwidth-bound (the weights are read once
//!   either way), so the padding costs little. Our own kernels reduce in fixed orders that
//!   depend only on the reduced length (see `shaders/cuda/prelude.cuh`); attention splits its
//!   keys by visible-key ordinal, so a row's output depends only on its own visible keys.
//! - One non-blocking stream per backend; ops only enqueue work. `download*`, `argmax`,
//!   `sample`, `topk` and `markov_table` are the sync points (a device→host copy).
//! - Memory comes from the device's stream-ordered pool (`cuMemAllocAsync`) with its release
//!   threshold raised, so per-op temporaries are recycled instead of returned to the driver.
//! - Small host arrays that repeat from layer to layer (positions, the tree table, compaction
//!   indices) are uploaded once per distinct content and reused (a tiny LRU).
//! - Numerics against the CPU backend (f32 weights): elementwise ops are bit-identical except
//!   `rope`/`silu_mul` (f64 libm-quality cos/sin/exp rounded to f32: almost always identical);
//!   reductions differ in order only (see the conformance tests for the measured tolerances);
//!   `argmax`, `topk` ids, `markov_table` slots and the Markov bias are exact; `sample` draws the
//!   CPU's token except at measure-zero CDF boundaries (`shaders/cuda/sample.cu`).

#![warn(missing_docs)]

mod attention;
pub mod kernels;
mod linear;
mod ops;
mod select;
mod tensor;

pub use tensor::{CudaTensor, CudaWeight, WeightDtype};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DriverError, LaunchConfig};
use sparkling_core::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Options of [`CudaBackend::with_options`]. `Default`: device 0, bf16 weights, 128-row GEMM
/// blocks.
#[derive(Debug, Clone)]
pub struct CudaOptions {
    /// CUDA device ordinal.
    pub device: usize,
    /// Storage precision of uploaded weights.
    pub weight_dtype: WeightDtype,
    /// Rows of every cuBLAS GEMM call (inputs are processed in blocks of exactly this many
    /// rows, the last one zero-padded), so that a row's result never depends on the number of
    /// rows in the call. Trees of up to `gemm_row_block - 1` nodes verify in one GEMM per
    /// weight. Must be ≥ 1.
    pub gemm_row_block: usize,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions { device: 0, weight_dtype: WeightDtype::Bf16, gemm_row_block: 128 }
    }
}

/// What [`probe`] found: the device, its compute capability and the loaded library versions.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// Device ordinal.
    pub ordinal: usize,
    /// Device name (e.g. `NVIDIA H200`).
    pub name: String,
    /// Compute capability `(major, minor)`.
    pub compute_capability: (i32, i32),
    /// Total device memory, bytes.
    pub total_mem: usize,
    /// CUDA driver version as reported (`13000` = 13.0).
    pub driver_version: i32,
    /// NVRTC `(major, minor)`.
    pub nvrtc_version: (i32, i32),
}

/// Run `f`, turning a panic inside cudarc (its dynamic loader panics on a missing symbol or
/// library) into [`Error::Unavailable`].
fn no_panic<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
            Err(Error::Unavailable(format!("{what}: the CUDA libraries could not be used: {msg}")))
        }
    }
}

/// Check that the CUDA driver library, a device `ordinal`, libnvrtc and libcublas are all
/// present, without panicking (cudarc panics when a library it needs is missing, platform.md
/// §2). Errors: [`Error::Unavailable`] naming what is missing and how to provide it.
pub fn probe(ordinal: usize) -> Result<DeviceInfo> {
    no_panic("probe", || {
        // SAFETY: these only try to dlopen candidate library names.
        let (has_cuda, has_nvrtc, has_cublas) =
            unsafe { (cudarc::driver::sys::is_culib_present(), cudarc::nvrtc::sys::is_culib_present(), cudarc::cublas::sys::is_culib_present()) };
        if !has_cuda {
            return Err(Error::Unavailable(
                "no NVIDIA driver: libcuda.so(.1) was not found (install the NVIDIA driver, or run on a machine with a GPU)".into(),
            ));
        }
        cudarc::driver::result::init().map_err(|e| Error::Unavailable(format!("the CUDA driver failed to initialise ({e}): no usable GPU")))?;
        let count = cudarc::driver::result::device::get_count().map_err(|e| Error::Unavailable(format!("cuDeviceGetCount failed: {e}")))?;
        if count <= 0 {
            return Err(Error::Unavailable("the CUDA driver reports no GPU".into()));
        }
        if ordinal >= count as usize {
            return Err(Error::Unavailable(format!("CUDA device {ordinal} requested but only {count} device(s) exist")));
        }
        if !has_nvrtc {
            return Err(Error::Unavailable(
                "libnvrtc was not found (libnvrtc.so / .so.13 / .so.12): install the CUDA toolkit or the `nvidia-cuda-nvrtc` wheel and put its lib directory on LD_LIBRARY_PATH".into(),
            ));
        }
        if !has_cublas {
            return Err(Error::Unavailable(
                "libcublas was not found (libcublas.so / .so.13 / .so.12): install the CUDA toolkit's cuBLAS (or the `nvidia-cublas` wheel) and put its lib directory on LD_LIBRARY_PATH".into(),
            ));
        }
        let dev = cudarc::driver::result::device::get(ordinal as i32).map_err(|e| Error::Unavailable(format!("cuDeviceGet({ordinal}): {e}")))?;
        let name = cudarc::driver::result::device::get_name(dev).unwrap_or_else(|_| "unknown CUDA device".into());
        use cudarc::driver::sys::CUdevice_attribute as A;
        let attr = |a| unsafe { cudarc::driver::result::device::get_attribute(dev, a) }.unwrap_or(0);
        let cc = (attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR), attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR));
        let total_mem = unsafe { cudarc::driver::result::device::total_mem(dev) }.unwrap_or(0);
        let mut driver_version: std::ffi::c_int = 0;
        let _ = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) };
        let nvrtc_version = kernels::nvrtc_version()?;
        Ok(DeviceInfo { ordinal, name, compute_capability: cc, total_mem, driver_version, nvrtc_version })
    })
}

/// Every compiled kernel of the program.
pub(crate) struct Kernels {
    _module: Arc<CudaModule>,
    f: HashMap<&'static str, CudaFunction>,
}

impl Kernels {
    pub(crate) fn get(&self, name: &'static str) -> &CudaFunction {
        // Every name of kernels::KERNEL_NAMES was loaded at creation (checked there).
        &self.f[name]
    }
}

/// A small LRU of uploaded `u32` arrays keyed by content (positions, tree tables, indices that
/// repeat across the layers of one forward).
struct U32Cache {
    entries: Vec<(Vec<u32>, Arc<CudaSlice<u32>>)>,
}

const U32_CACHE_ENTRIES: usize = 8;

/// The CUDA backend: one device context, one stream, one cuBLAS handle and the compiled kernels.
pub struct CudaBackend {
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) blas: Mutex<CudaBlas>,
    pub(crate) k: Kernels,
    pub(crate) weight_dtype: WeightDtype,
    pub(crate) row_block: usize,
    pub(crate) info: DeviceInfo,
    target: kernels::Target,
    u32_cache: Mutex<U32Cache>,
    inv_freq: Mutex<InvFreqCache>,
    /// What [`Backend::op_counts`](sparkling_core::Backend::op_counts) reports.
    pub(crate) counts: Counters,
}

/// The counters behind [`sparkling_core::OpCounts`]: kernels launched (NVRTC kernels and
/// cuBLAS GEMM calls), host waits (device→host copies, `synchronize`), bytes copied host→device,
/// device buffers allocated (cudarc allocates per op; the driver's stream-ordered pool reuses
/// the memory, but every allocation is a call).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) kernels: std::sync::atomic::AtomicU64,
    pub(crate) syncs: std::sync::atomic::AtomicU64,
    pub(crate) uploaded: std::sync::atomic::AtomicU64,
    pub(crate) allocs: std::sync::atomic::AtomicU64,
}

impl Counters {
    pub(crate) fn add(c: &std::sync::atomic::AtomicU64, n: u64) {
        c.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> sparkling_core::OpCounts {
        use std::sync::atomic::Ordering::Relaxed;
        sparkling_core::OpCounts {
            kernels: self.kernels.load(Relaxed),
            host_syncs: self.syncs.load(Relaxed),
            bytes_uploaded: self.uploaded.load(Relaxed),
            buffers_created: self.allocs.load(Relaxed),
        }
    }
}

/// Device `inv_freq` tables keyed by `(head_dim, theta bits)`.
type InvFreqCache = HashMap<(usize, u32), Arc<CudaSlice<f32>>>;

impl CudaBackend {
    /// Open CUDA device 0 with bf16 weights. Errors as [`CudaBackend::with_options`].
    pub fn new() -> Result<Self> {
        CudaBackend::with_options(&CudaOptions::default())
    }

    /// Open a device with explicit [`CudaOptions`]: probe the libraries and the device, create
    /// a context and a stream, compile the kernels with NVRTC (once per process and
    /// architecture), create the cuBLAS handle.
    /// Errors: [`Error::Unavailable`] when the driver, the device, libnvrtc or libcublas is
    /// missing (see [`probe`]); [`Error::Invalid`] for `gemm_row_block == 0`;
    /// [`Error::Device`] when the kernels do not compile or load, or a CUDA call fails.
    pub fn with_options(opts: &CudaOptions) -> Result<Self> {
        if opts.gemm_row_block == 0 {
            return Err(Error::Invalid("CudaOptions::gemm_row_block must be at least 1".into()));
        }
        let info = probe(opts.device)?;
        no_panic("CudaBackend::with_options", || CudaBackend::open(opts, info))
    }

    fn open(opts: &CudaOptions, info: DeviceInfo) -> Result<Self> {
        let dev_err = |what: &str| {
            let what = what.to_string();
            move |e: DriverError| Error::Device(format!("{what}: {e}"))
        };
        let ctx = CudaContext::new(opts.device).map_err(dev_err("creating the CUDA context"))?;
        // One stream per backend and no cross-stream use of its buffers: cudarc's per-buffer
        // event tracking is not needed (it would record two events per allocation).
        // SAFETY: every buffer of this backend is created, used and freed on `stream` only.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(dev_err("creating a CUDA stream"))?;
        keep_pool_memory(&ctx);
        let target = kernels::target_for(info.compute_capability)?;
        let image = kernels::compile_all(target)?;
        let ptx = cudarc::nvrtc::Ptx::from_binary(image.as_ref().clone());
        let module = ctx.load_module(ptx).map_err(dev_err(&format!("loading the compiled kernels ({})", target.arch_flag())))?;
        let mut f = HashMap::new();
        for &name in kernels::KERNEL_NAMES {
            let func = module.load_function(name).map_err(dev_err(&format!("kernel {name}")))?;
            f.insert(name, func);
        }
        let blas = CudaBlas::new(stream.clone()).map_err(|e| Error::Device(format!("creating the cuBLAS handle: {e}")))?;
        let mode = match opts.weight_dtype {
            // f32 weights: IEEE f32 throughout (no TF32 tensor cores, no reduced-precision
            // split-K reductions).
            WeightDtype::F32 => cudarc::cublas::sys::cublasMath_t::CUBLAS_PEDANTIC_MATH,
            // bf16 weights: tensor cores with f32 accumulation (CUBLAS_COMPUTE_32F).
            WeightDtype::Bf16 => cudarc::cublas::sys::cublasMath_t::CUBLAS_DEFAULT_MATH,
        };
        // SAFETY: a live handle.
        unsafe { cudarc::cublas::sys::cublasSetMathMode(*blas.handle(), mode) }.result().map_err(|e| Error::Device(format!("cublasSetMathMode: {e}")))?;
        Ok(CudaBackend {
            stream,
            blas: Mutex::new(blas),
            k: Kernels { _module: module, f },
            weight_dtype: opts.weight_dtype,
            row_block: opts.gemm_row_block,
            info,
            target,
            u32_cache: Mutex::new(U32Cache { entries: Vec::new() }),
            inv_freq: Mutex::new(HashMap::new()),
            counts: Counters::default(),
        })
    }

    /// The device this backend runs on.
    pub fn device_info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Storage precision of uploaded weights.
    pub fn weight_dtype(&self) -> WeightDtype {
        self.weight_dtype
    }

    /// Rows per cuBLAS GEMM call ([`CudaOptions::gemm_row_block`]).
    pub fn gemm_row_block(&self) -> usize {
        self.row_block
    }

    /// The NVRTC target the kernels were compiled for (`sm_90` CUBIN on an H100/H200).
    pub fn kernel_target(&self) -> String {
        self.target.arch_flag()
    }

    /// Wait until every enqueued op has finished (for timing; ops never need it).
    /// Errors: a failure of any earlier enqueued op ([`Error::Device`]).
    pub fn synchronize(&self) -> Result<()> {
        Counters::add(&self.counts.syncs, 1);
        self.stream.synchronize().map_err(|e| Error::Device(format!("synchronize: {e}")))
    }

    /// A launch of kernel `f` on this backend's stream, counted in [`Counters::kernels`].
    pub(crate) fn launch_builder<'a>(&'a self, f: &'a CudaFunction) -> cudarc::driver::LaunchArgs<'a> {
        Counters::add(&self.counts.kernels, 1);
        self.stream.launch_builder(f)
    }

    /// `f32` device buffer of `n` (≥ 1 allocated) uninitialised values.
    pub(crate) fn alloc_f32(&self, op: &str, n: usize) -> Result<CudaSlice<f32>> {
        Counters::add(&self.counts.allocs, 1);
        // SAFETY: every caller writes the values it later reads.
        unsafe { self.stream.alloc::<f32>(n.max(1)) }.map_err(|e| Error::Device(format!("{op}: allocating {n} f32 values: {e}")))
    }

    /// Typed uninitialised device buffer of `n` (≥ 1 allocated) values.
    pub(crate) fn alloc<T: cudarc::driver::DeviceRepr>(&self, op: &str, n: usize) -> Result<CudaSlice<T>> {
        Counters::add(&self.counts.allocs, 1);
        // SAFETY: every caller writes the values it later reads.
        unsafe { self.stream.alloc::<T>(n.max(1)) }.map_err(|e| Error::Device(format!("{op}: allocating {n} values: {e}")))
    }

    /// Upload host values to a new device buffer (≥ 1 element allocated).
    pub(crate) fn upload_slice<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits + Default + Clone>(
        &self,
        op: &str,
        data: &[T],
    ) -> Result<CudaSlice<T>> {
        Counters::add(&self.counts.allocs, 1);
        if data.is_empty() {
            return self.stream.alloc_zeros::<T>(1).map_err(|e| Error::Device(format!("{op}: {e}")));
        }
        Counters::add(&self.counts.uploaded, std::mem::size_of_val(data) as u64);
        self.stream.clone_htod(data).map_err(|e| Error::Device(format!("{op}: host→device copy of {} values: {e}", data.len())))
    }

    /// `data` on the device, reusing the buffer of an earlier upload of the same content.
    pub(crate) fn upload_u32_cached(&self, op: &str, data: &[u32]) -> Result<Arc<CudaSlice<u32>>> {
        let mut cache = self.u32_cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pos) = cache.entries.iter().position(|(k, _)| k.as_slice() == data) {
            let e = cache.entries.remove(pos);
            let buf = Arc::clone(&e.1);
            cache.entries.push(e);
            return Ok(buf);
        }
        let buf = Arc::new(self.upload_slice(op, data)?);
        if cache.entries.len() >= U32_CACHE_ENTRIES {
            // Freed in stream order: kernels already enqueued with it still see valid memory.
            cache.entries.remove(0);
        }
        cache.entries.push((data.to_vec(), Arc::clone(&buf)));
        Ok(buf)
    }

    /// `inv_freq[j] = 1 / theta^(2j/head_dim)` (f64, rounded to f32: the CPU backend's
    /// expression) on the device, cached per `(head_dim, theta)`.
    pub(crate) fn inv_freq(&self, head_dim: usize, theta: f32) -> Result<Arc<CudaSlice<f32>>> {
        let key = (head_dim, theta.to_bits());
        let mut cache = self.inv_freq.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = cache.get(&key) {
            return Ok(Arc::clone(b));
        }
        let half = head_dim / 2;
        let v: Vec<f32> = (0..half).map(|j| 1.0 / (theta as f64).powf(2.0 * j as f64 / head_dim as f64) as f32).collect();
        let b = Arc::new(self.upload_slice("rope inv_freq", &v)?);
        cache.insert(key, Arc::clone(&b));
        Ok(b)
    }

    /// Device→host copy of a buffer prefix (a sync point).
    pub(crate) fn read<T: cudarc::driver::DeviceRepr + Default + Clone>(&self, op: &str, buf: &CudaSlice<T>, n: usize) -> Result<Vec<T>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        Counters::add(&self.counts.syncs, 1);
        self.stream.clone_dtoh(&buf.slice(0..n)).map_err(|e| Error::Device(format!("{op}: device→host copy: {e}")))
    }
}

/// Keep freed memory in the device's default stream-ordered pool instead of returning it to
/// the driver at every synchronisation (per-op temporaries are then recycled cheaply). Best
/// effort: a driver without memory pools simply keeps its default.
fn keep_pool_memory(ctx: &Arc<CudaContext>) {
    use cudarc::driver::{result, sys};
    // SAFETY: the context's own device; a u64 attribute value as the API specifies.
    unsafe {
        if let Ok(pool) = result::device::get_default_mem_pool(ctx.cu_device()) {
            let mut threshold: u64 = u64::MAX;
            let _ = result::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                &mut threshold as *mut u64 as *mut std::ffi::c_void,
            );
        }
    }
}

/// `(grid, block)` for a grid-stride elementwise kernel over `n` items.
pub(crate) fn grid_1d(n: usize) -> LaunchConfig {
    const THREADS: u32 = 256;
    let blocks = n.div_ceil(THREADS as usize).clamp(1, 1 << 20) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

/// The error of a failed launch or copy inside `op`.
pub(crate) fn dev(op: &'static str) -> impl Fn(DriverError) -> Error {
    move |e| Error::Device(format!("{op}: {e}"))
}

/// A shape error of `op`.
pub(crate) fn shape_err(op: &'static str, detail: String) -> Error {
    Error::Shape { op, detail }
}

/// Largest value a `u32` kernel argument may carry; bigger sizes are rejected, not truncated.
pub(crate) fn to_u32(op: &'static str, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::Invalid(format!("{op}: {what} = {v} exceeds the kernels' 32-bit index range")))
}
