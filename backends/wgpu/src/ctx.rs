//! The device context shared by every op: device, queue, limits, buffer pool, pipelines, and
//! the encode → submit helpers.
//!
//! Ops record into one shared command encoder (the open batch), which is submitted every
//! [`FLUSH_EVERY`] dispatches and at each read-back, so a decode step costs a handful of
//! `queue.submit`s, not one per op. Ops that return host data (`download*`, `argmax`,
//! `sample`, `topk`, `markov_table`, `candidate_table`, `sparkling_tree`) end with
//! [`Gpu::start_read`] and hand
//! back a [`Pending`] result; [`Gpu::wait_async`] finishes it (native: polls the device until
//! the mapping is done, so a `pollster::block_on` of it never hangs; the browser: awaits the
//! mapping). Those are the only places the host waits for
//! the GPU (see the crate docs).

use crate::device::Health;
use crate::pipelines::{Kernel, Pipelines};
use crate::pool::{Kind, Pool, PooledBuffer};
use crate::tensor::WgpuTensor;
use sparkling_core::{Error, Result};
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex, MutexGuard};

/// Submit the open batch once it holds this many dispatches (lets the GPU start early).
pub(crate) const FLUSH_EVERY: usize = 48;

/// Size of every uniform parameter block (bytes); kernels use at most 16 words.
const UNIFORM_BYTES: u64 = 64;

/// Everything an op needs.
pub(crate) struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) info: wgpu::AdapterInfo,
    pub(crate) limits: wgpu::Limits,
    /// Effective bytes per storage binding (adapter limit, or a lower test override).
    pub(crate) max_binding: u64,
    /// Effective workgroups per dispatch dimension (adapter limit, or a lower test override).
    pub(crate) max_groups: u32,
    /// Whether the adapter executes indirect dispatches (`DownlevelFlags::INDIRECT_EXECUTION`;
    /// every Vulkan, Metal, DX12 and WebGPU adapter): the fused candidate-table ops then size
    /// their grids by the union's actual size instead of its upper bound.
    pub(crate) indirect: bool,
    pub(crate) pool: Arc<Pool>,
    pub(crate) pipelines: Pipelines,
    /// Reduction library of the argmax / topk / table / sample kernels (subgroups or not).
    pub(crate) reduce: crate::pipelines::Reduce,
    pub(crate) health: Arc<Health>,
    /// The open batch (commands recorded, not yet submitted).
    pub(crate) open: Mutex<Option<Batch>>,
    /// Host waits for the GPU so far (read-backs and `synchronize`), for the sync audit.
    pub(crate) syncs: std::sync::atomic::AtomicU64,
    /// Compute dispatches encoded so far (`OpCounts::kernels`).
    pub(crate) kernels: std::sync::atomic::AtomicU64,
    /// Bytes written from the host so far, uniforms excepted (`OpCounts::bytes_uploaded`).
    pub(crate) uploaded: std::sync::atomic::AtomicU64,
}

/// One storage binding of a dispatch: buffer and the bytes of it the kernel may touch.
pub(crate) struct Bind<'a> {
    pub(crate) buffer: &'a wgpu::Buffer,
    pub(crate) bytes: u64,
}

impl<'a> Bind<'a> {
    /// Bind the valid part of a tensor.
    pub(crate) fn t(t: &'a WgpuTensor) -> Bind<'a> {
        Bind { buffer: t.buffer(), bytes: t.bytes() }
    }

    /// Bind `bytes` of a buffer.
    pub(crate) fn b(buffer: &'a wgpu::Buffer, bytes: u64) -> Bind<'a> {
        Bind { buffer, bytes }
    }
}

/// The workgroup grid of one dispatch.
enum Grid<'a> {
    /// `(x, y)` workgroups, known on the host.
    Direct(u32, u32),
    /// Three u32 `(x, y, z)` at a byte offset of a buffer, written on the device.
    Indirect(&'a wgpu::Buffer, u64),
}

/// A command encoder plus the pooled temporaries its commands use (released after submit).
pub(crate) struct Batch {
    pub(crate) enc: wgpu::CommandEncoder,
    keep: Vec<PooledBuffer>,
    dispatches: usize,
}

impl Batch {
    /// Keep a temporary alive until the batch is submitted.
    pub(crate) fn keep(&mut self, b: PooledBuffer) {
        self.keep.push(b);
    }
}

/// A read-back in flight (see [`Gpu::start_read`]): staging buffer, part sizes, and the
/// channel the mapping callback answers on (`None` when there was nothing to copy).
pub(crate) struct Reading {
    staging: Option<PooledBuffer>,
    sizes: Vec<u64>,
    rx: Option<MapReceiver>,
}

/// The channel a `map_async` callback reports its result on.
type MapReceiver = futures_channel::oneshot::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>;

/// An op result waiting on its read-back: the reading, and how to turn the read bytes (one
/// `Vec` per part) into the result. The selection ops return this so a fused op can fall back to
/// another's recording; [`Gpu::wait_async`] finishes it.
pub(crate) struct Pending<T> {
    reading: Option<Reading>,
    parse: Box<dyn FnOnce(Vec<Vec<u8>>) -> Result<T>>,
}

impl<T: 'static> Pending<T> {
    /// A result that needs no read-back.
    pub(crate) fn ready(v: T) -> Pending<T> {
        Pending { reading: None, parse: Box::new(move |_| Ok(v)) }
    }

    /// A result parsed from the parts of `r`.
    pub(crate) fn new(r: Reading, parse: impl FnOnce(Vec<Vec<u8>>) -> Result<T> + 'static) -> Pending<T> {
        Pending { reading: Some(r), parse: Box::new(parse) }
    }
}

/// Exclusive access to the open batch for the duration of one op (ops are recorded one at a
/// time; the GPU runs them in recording order).
pub(crate) struct BatchGuard<'a> {
    slot: MutexGuard<'a, Option<Batch>>,
}

impl std::ops::Deref for BatchGuard<'_> {
    type Target = Batch;
    fn deref(&self) -> &Batch {
        self.slot.as_ref().expect("a guard always holds a batch")
    }
}

impl std::ops::DerefMut for BatchGuard<'_> {
    fn deref_mut(&mut self) -> &mut Batch {
        self.slot.as_mut().expect("a guard always holds a batch")
    }
}

impl Gpu {
    /// `Err` if the device was lost or an uncaptured wgpu error happened earlier.
    pub(crate) fn check(&self) -> Result<()> {
        self.health.check()
    }

    /// The open batch (created on first use), locked for one op.
    pub(crate) fn batch(&self) -> BatchGuard<'_> {
        let mut slot = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            self.pool.open_batch();
            let enc = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("sparkling batch") });
            *slot = Some(Batch { enc, keep: Vec::new(), dispatches: 0 });
        }
        BatchGuard { slot }
    }

    /// End an op: submit the batch if it is long enough (no wait), else leave it open.
    pub(crate) fn submit(&self, mut g: BatchGuard<'_>) {
        if g.dispatches >= FLUSH_EVERY {
            Gpu::flush_slot(&self.queue, &self.pool, &mut g.slot);
        }
    }

    /// Submit the open batch, if any, and make its temporaries reusable (no wait).
    pub(crate) fn flush(&self) {
        let mut slot = self.open.lock().unwrap_or_else(|e| e.into_inner());
        Gpu::flush_slot(&self.queue, &self.pool, &mut slot);
    }

    fn flush_slot(queue: &wgpu::Queue, pool: &Pool, slot: &mut Option<Batch>) {
        if let Some(b) = slot.take() {
            queue.submit([b.enc.finish()]);
            drop(b.keep);
            pool.recycle();
        }
    }

    /// Bytes of a `[rows, cols]` f32 tensor, checked against the binding limit.
    /// Errors: [`Error::Device`] naming the shape, its size and the adapter's limit.
    pub(crate) fn tensor_bytes(&self, op: &str, rows: usize, cols: usize) -> Result<u64> {
        let bytes = (rows as u64).checked_mul(cols as u64).and_then(|e| e.checked_mul(4)).unwrap_or(u64::MAX);
        if bytes > self.max_binding {
            return Err(Error::Device(format!(
                "{op}: an f32 tensor [{rows}, {cols}] needs {bytes} bytes in one storage binding, but {} allows at most {} bytes \
                 (max_storage_buffer_binding_size)",
                self.info.name, self.max_binding
            )));
        }
        Ok(bytes)
    }

    /// Write `data` from the host at the start of `buffer`, counted in `uploaded`.
    pub(crate) fn write(&self, buffer: &wgpu::Buffer, data: &[u8]) {
        self.uploaded.fetch_add(data.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.queue.write_buffer(buffer, 0, data);
    }

    /// An uninitialised `[rows, cols]` tensor from the pool.
    pub(crate) fn alloc(&self, op: &str, rows: usize, cols: usize) -> Result<WgpuTensor> {
        let bytes = self.tensor_bytes(op, rows, cols)?;
        Ok(WgpuTensor { rows, cols, buf: self.pool.get(Kind::Storage, bytes)? })
    }

    /// A pooled storage buffer holding `words` (for index lists, positions, tree tables).
    pub(crate) fn upload_u32(&self, words: &[u32]) -> Result<PooledBuffer> {
        let bytes = (words.len() as u64 * 4).max(4);
        if bytes > self.max_binding {
            return Err(Error::Device(format!("an index list of {} entries exceeds the binding limit of {} bytes", words.len(), self.max_binding)));
        }
        let b = self.pool.get(Kind::Storage, bytes)?;
        if !words.is_empty() {
            self.write(b.buffer(), bytemuck::cast_slice(words));
        }
        Ok(b)
    }

    /// Split `groups` workgroups into a grid `(gx, gy)` with both ≤ the per-dimension limit.
    /// Errors: more workgroups than `limit²`.
    pub(crate) fn fold(&self, groups: u64) -> Result<(u32, u32)> {
        let lim = self.max_groups.max(1) as u64;
        let gy = groups.div_ceil(lim);
        if gy > lim {
            return Err(Error::Device(format!("a dispatch of {groups} workgroups exceeds {lim} x {lim}")));
        }
        let gx = groups.div_ceil(gy.max(1));
        Ok((gx as u32, gy.max(1) as u32))
    }

    /// Encode one dispatch of `kernel` over `groups` workgroups (linear, folded into 2-D) with
    /// uniform `params` at binding 0 and `binds` at bindings 1, 2, ... in order.
    /// A dispatch of 0 workgroups encodes nothing.
    pub(crate) fn dispatch(&self, batch: &mut Batch, kernel: Kernel, params: &[u32], binds: &[Bind<'_>], groups: u64) -> Result<()> {
        if groups == 0 {
            return Ok(());
        }
        let (gx, gy) = self.fold(groups)?;
        self.encode(batch, kernel, params, binds, Grid::Direct(gx, gy))
    }

    /// Encode one dispatch whose grid `(x, y, z)` a kernel wrote into `args` at byte `offset`
    /// (three u32; e.g. sized by a count known only on the device). Kernels index workgroups
    /// with `linear_group`, as for [`Gpu::dispatch`]; the writer folds large grids into 2-D.
    pub(crate) fn dispatch_indirect(
        &self,
        batch: &mut Batch,
        kernel: Kernel,
        params: &[u32],
        binds: &[Bind<'_>],
        args: &wgpu::Buffer,
        offset: u64,
    ) -> Result<()> {
        self.encode(batch, kernel, params, binds, Grid::Indirect(args, offset))
    }

    fn encode(&self, batch: &mut Batch, kernel: Kernel, params: &[u32], binds: &[Bind<'_>], grid: Grid<'_>) -> Result<()> {
        let pipe = self.pipelines.get(&self.device, kernel)?;
        debug_assert!(params.len() * 4 <= UNIFORM_BYTES as usize);
        let uni = self.pool.get(Kind::Uniform, UNIFORM_BYTES)?;
        let mut words = [0u32; (UNIFORM_BYTES / 4) as usize];
        words[..params.len()].copy_from_slice(params);
        self.queue.write_buffer(uni.buffer(), 0, bytemuck::cast_slice(&words));
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer: uni.buffer(), offset: 0, size: NonZeroU64::new(UNIFORM_BYTES) }),
        }];
        for (i, b) in binds.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer: b.buffer, offset: 0, size: NonZeroU64::new(b.bytes.max(4)) }),
            });
        }
        let bg = self.device.create_bind_group(&wgpu::BindGroupDescriptor { label: None, layout: &pipe.layout, entries: &entries });
        {
            let mut pass = batch.enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
            pass.set_pipeline(&pipe.pipeline);
            pass.set_bind_group(0, &bg, &[]);
            match grid {
                Grid::Direct(gx, gy) => pass.dispatch_workgroups(gx, gy, 1),
                Grid::Indirect(args, offset) => pass.dispatch_workgroups_indirect(args, offset),
            }
        }
        batch.dispatches += 1;
        self.kernels.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        batch.keep(uni);
        Ok(())
    }

    /// First half of a read-back: record the copies of `parts` — `(buffer, byte offset, bytes)`
    /// ranges, offsets and sizes multiples of 4 — back to back into ONE staging buffer, submit
    /// the batch and request the mapping — no wait; finishing it is one host sync however many
    /// parts there are (an empty `Vec` per 0-byte part; no sync when every part is empty). Finish with
    /// [`Gpu::finish_read_async`].
    /// Errors: the device failed earlier; the staging buffer cannot be allocated.
    pub(crate) fn start_read(&self, parts: &[(&wgpu::Buffer, u64, u64)]) -> Result<Reading> {
        self.check()?;
        let sizes: Vec<u64> = parts.iter().map(|p| p.2).collect();
        let total: u64 = sizes.iter().sum();
        if total == 0 {
            return Ok(Reading { staging: None, sizes, rx: None });
        }
        let staging = self.pool.get(Kind::Staging, total)?;
        {
            let mut b = self.batch();
            let mut at = 0;
            for &(src, offset, bytes) in parts {
                if bytes > 0 {
                    b.enc.copy_buffer_to_buffer(src, offset, staging.buffer(), at, bytes);
                    at += bytes;
                }
            }
            Gpu::flush_slot(&self.queue, &self.pool, &mut b.slot);
        }
        let (tx, rx) = futures_channel::oneshot::channel();
        staging.buffer().slice(0..total).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        Ok(Reading { staging: Some(staging), sizes, rx: Some(rx) })
    }

    /// Poll the device until the mapping callback behind `rx` has run and return what it
    /// reported (native only).
    ///
    /// One `poll(wait)` is not enough when several threads share the device: wgpu fires map
    /// callbacks from whichever thread is polling, so another thread's poll can have taken our
    /// callback off the queue and not yet run it when our own poll returns. So we poll again
    /// (sleeping 200 µs in between) until the callback has run, for at most 30 s of wall time.
    /// Errors: [`Error::Device`] when the wait fails, the callback was dropped unrun, or it still
    /// had not run after 30 s.
    #[cfg(not(target_arch = "wasm32"))]
    fn wait_for_mapping(&self, mut rx: MapReceiver) -> Result<std::result::Result<(), wgpu::BufferAsyncError>> {
        let start = std::time::Instant::now();
        loop {
            self.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| Error::Device(format!("waiting for the GPU failed: {e}")))?;
            match rx.try_recv() {
                Ok(Some(mapped)) => return Ok(mapped),
                Ok(None) if start.elapsed() < std::time::Duration::from_secs(30) => std::thread::sleep(std::time::Duration::from_micros(200)),
                Ok(None) => return Err(Error::Device("a read-back's buffer mapping did not finish within 30 s of waiting for the GPU".into())),
                Err(_) => return Err(Error::Device("buffer map callback was dropped without running (device lost?)".into())),
            }
        }
    }

    /// Await a read-back: the browser yields to its event loop until the mapping resolves;
    /// native targets poll the device until the mapping is done (`wait_for_mapping`: the
    /// future is ready on its first poll, so blocking on it never waits on a waker), then take
    /// the mapping. One host sync.
    /// Errors: [`Error::Device`] when the wait, the mapping or the device fails.
    pub(crate) async fn finish_read_async(&self, r: Reading) -> Result<Vec<Vec<u8>>> {
        let Some(rx) = r.rx else { return Ok(r.sizes.iter().map(|_| Vec::new()).collect()) };
        self.syncs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let unmap = |r: &Option<PooledBuffer>| {
            if let Some(s) = r {
                s.buffer().unmap();
            }
        };
        #[cfg(not(target_arch = "wasm32"))]
        let mapped = match self.wait_for_mapping(rx) {
            Ok(m) => m,
            Err(e) => {
                unmap(&r.staging);
                return Err(e);
            }
        };
        #[cfg(target_arch = "wasm32")]
        let Ok(mapped) = rx.await
        else {
            unmap(&r.staging);
            return Err(Error::Device("buffer map callback never ran (device lost?)".into()));
        };
        self.collect(r.staging, &r.sizes, mapped)
    }

    /// Split a mapped staging buffer into the parts' bytes and unmap it.
    fn collect(&self, staging: Option<PooledBuffer>, sizes: &[u64], mapped: std::result::Result<(), wgpu::BufferAsyncError>) -> Result<Vec<Vec<u8>>> {
        let staging = staging.ok_or_else(|| Error::Device("read-back without a staging buffer".into()))?;
        if let Err(e) = mapped {
            staging.buffer().unmap();
            return Err(Error::Device(format!("mapping a read-back buffer failed: {e}")));
        }
        let total: u64 = sizes.iter().sum();
        let slice = staging.buffer().slice(0..total);
        let out = {
            let view = match slice.get_mapped_range() {
                Ok(v) => v,
                Err(e) => {
                    staging.buffer().unmap();
                    return Err(Error::Device(format!("reading a mapped buffer failed: {e:?}")));
                }
            };
            let mut out = Vec::with_capacity(sizes.len());
            let mut at = 0usize;
            for &bytes in sizes {
                out.push(view[at..at + bytes as usize].to_vec());
                at += bytes as usize;
            }
            out
        };
        staging.buffer().unmap();
        self.check()?;
        Ok(out)
    }

    /// Finish a pending op result, awaiting ([`Gpu::finish_read_async`]).
    pub(crate) async fn wait_async<T>(&self, p: Pending<T>) -> Result<T> {
        let parts = match p.reading {
            Some(r) => self.finish_read_async(r).await?,
            None => Vec::new(),
        };
        (p.parse)(parts)
    }

    /// Start reading back `n` f32 values from element `start` of `t`.
    pub(crate) fn read_f32(&self, t: &WgpuTensor, start: usize, n: usize) -> Result<Pending<Vec<f32>>> {
        let r = self.start_read(&[(t.buffer(), start as u64 * 4, n as u64 * 4)])?;
        Ok(Pending::new(r, |parts| Ok(bytemuck::pod_collect_to_vec(&parts[0]))))
    }
}
