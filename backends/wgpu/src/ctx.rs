//! The device context shared by every op: device, queue, limits, buffer pool, pipelines, and
//! the encode → submit helpers.
//!
//! Ops record into one shared command encoder (the open batch), which is submitted every
//! [`FLUSH_EVERY`] dispatches and at each read-back, so a decode step costs a handful of
//! `queue.submit`s, not one per op. [`Gpu::read_back`] is the only place that waits for the GPU
//! (reached from `download*`, `argmax`, `sample`, `topk`, `markov_table`; see the crate docs).

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
    pub(crate) pool: Arc<Pool>,
    pub(crate) pipelines: Pipelines,
    /// Reduction library of the argmax / topk / table / sample kernels (subgroups or not).
    pub(crate) reduce: crate::pipelines::Reduce,
    pub(crate) health: Arc<Health>,
    /// The open batch (commands recorded, not yet submitted).
    pub(crate) open: Mutex<Option<Batch>>,
    /// Host waits for the GPU so far (read-backs and `synchronize`), for the sync audit.
    pub(crate) syncs: std::sync::atomic::AtomicU64,
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
            self.queue.write_buffer(b.buffer(), 0, bytemuck::cast_slice(words));
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
        let pipe = self.pipelines.get(&self.device, kernel)?;
        debug_assert!(params.len() * 4 <= UNIFORM_BYTES as usize);
        let uni = self.pool.get(Kind::Uniform, UNIFORM_BYTES)?;
        let mut words = [0u32; (UNIFORM_BYTES / 4) as usize];
        words[..params.len()].copy_from_slice(params);
        self.queue.write_buffer(uni.buffer(), 0, bytemuck::cast_slice(&words));
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: uni.buffer(),
                offset: 0,
                size: NonZeroU64::new(UNIFORM_BYTES),
            }),
        }];
        for (i, b) in binds.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: b.buffer,
                    offset: 0,
                    size: NonZeroU64::new(b.bytes.max(4)),
                }),
            });
        }
        let bg = self.device.create_bind_group(&wgpu::BindGroupDescriptor { label: None, layout: &pipe.layout, entries: &entries });
        {
            let mut pass = batch.enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
            pass.set_pipeline(&pipe.pipeline);
            pass.set_bind_group(0, &bg, &[]);
            pass.dispatch_workgroups(gx, gy, 1);
        }
        batch.dispatches += 1;
        batch.keep(uni);
        Ok(())
    }

    /// Copy `bytes` bytes of `src` from byte `offset` to the host (a sync point: submits,
    /// maps, waits). Returns `bytes / 4` floats.
    pub(crate) fn read_back(&self, src: &wgpu::Buffer, offset: u64, bytes: u64) -> Result<Vec<u8>> {
        self.check()?;
        if bytes == 0 {
            return Ok(Vec::new());
        }
        let staging = self.pool.get(Kind::Staging, bytes)?;
        {
            let mut b = self.batch();
            b.enc.copy_buffer_to_buffer(src, offset, staging.buffer(), 0, bytes);
            Gpu::flush_slot(&self.queue, &self.pool, &mut b.slot);
        }
        let slice = staging.buffer().slice(0..bytes);
        let (tx, rx) = std::sync::mpsc::channel();
        self.syncs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Device(format!("waiting for the GPU failed: {e}")))?;
        let mapped = rx.recv().map_err(|_| Error::Device("buffer map callback never ran".into()))?;
        mapped.map_err(|e| Error::Device(format!("mapping a read-back buffer failed: {e}")))?;
        let out = {
            let view = slice.get_mapped_range().map_err(|e| Error::Device(format!("reading a mapped buffer failed: {e:?}")))?;
            view.to_vec()
        };
        staging.buffer().unmap();
        self.check()?;
        Ok(out)
    }

    /// Read back `n` f32 values starting at element `start` of `t`.
    pub(crate) fn read_f32(&self, t: &WgpuTensor, start: usize, n: usize) -> Result<Vec<f32>> {
        let bytes = self.read_back(t.buffer(), start as u64 * 4, n as u64 * 4)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }
}
