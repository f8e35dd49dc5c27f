//! A size-bucketed buffer pool: tensors, readback staging buffers and uniform parameter blocks
//! are recycled instead of allocated per op.
//!
//! Reuse without waiting for the GPU: the queue executes submissions (and `write_buffer`
//! uploads) in order (WebGPU queue-timeline semantics), so a buffer whose last use has been
//! *submitted* may be handed out again. Ops record into a shared, not-yet-submitted batch
//! (see `ctx.rs`), and a `write_buffer` lands before *every* command of that batch, so a buffer
//! released while a batch is open is parked ("retired") and only becomes reusable after that
//! batch is submitted ([`Pool::recycle`]).

use sparkling_core::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What a pooled buffer is used for (each kind has its own usage flags and free lists).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// Activation tensors and scratch: `STORAGE | COPY_SRC | COPY_DST` (`| INDIRECT` where the
    /// adapter supports indirect dispatch).
    Storage,
    /// Readback: `MAP_READ | COPY_DST`.
    Staging,
    /// Kernel parameters: `UNIFORM | COPY_DST`.
    Uniform,
}

impl Kind {
    /// Usage flags; `indirect`: storage buffers may also hold dispatch grids written by a
    /// kernel (candidate_union.wgsl) — only where the adapter executes indirect dispatches
    /// (wgpu refuses `INDIRECT` buffers otherwise).
    fn usage(self, indirect: bool) -> wgpu::BufferUsages {
        use wgpu::BufferUsages as U;
        match self {
            Kind::Storage if indirect => U::STORAGE | U::COPY_SRC | U::COPY_DST | U::INDIRECT,
            Kind::Storage => U::STORAGE | U::COPY_SRC | U::COPY_DST,
            Kind::Staging => U::MAP_READ | U::COPY_DST,
            Kind::Uniform => U::UNIFORM | U::COPY_DST,
        }
    }
}

/// Smallest bucket, bytes (also keeps zero-sized tensors bindable).
const MIN_BUCKET: u64 = 256;
/// Above this size buckets are 1 MiB multiples instead of powers of two (limits the waste on
/// KV caches and logits).
const POW2_LIMIT: u64 = 16 << 20;
/// At most this many bytes of idle buffers are kept; beyond it released buffers are freed.
const MAX_IDLE_BYTES: u64 = 512 << 20;

/// Bucket size for a request of `bytes`.
pub(crate) fn bucket(bytes: u64) -> u64 {
    let b = bytes.max(MIN_BUCKET);
    if b <= POW2_LIMIT {
        b.next_power_of_two()
    } else {
        b.div_ceil(1 << 20) << 20
    }
}

struct State {
    free: HashMap<(Kind, u64), Vec<wgpu::Buffer>>,
    idle_bytes: u64,
    /// Released while a batch was open: reusable after the next submit.
    retired: Vec<(Kind, u64, wgpu::Buffer)>,
    /// A batch is being recorded (set by the context before the first command).
    batch_open: bool,
}

/// The pool. Shared (`Arc`) by every [`PooledBuffer`] it hands out.
pub(crate) struct Pool {
    device: wgpu::Device,
    /// Storage buffers get `INDIRECT` usage (the adapter executes indirect dispatches).
    indirect: bool,
    state: Mutex<State>,
    /// Buffers created on this device through the pool (misses, weights, tables).
    created: std::sync::atomic::AtomicU64,
}

impl Pool {
    /// An empty pool for `device`; `indirect`: give storage buffers `INDIRECT` usage.
    pub(crate) fn new(device: wgpu::Device, indirect: bool) -> Arc<Pool> {
        Arc::new(Pool {
            device,
            indirect,
            state: Mutex::new(State { free: HashMap::new(), idle_bytes: 0, retired: Vec::new(), batch_open: false }),
            created: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// A buffer of at least `bytes` bytes (contents unspecified: a recycled buffer keeps old
    /// data). Errors: the allocation failed (out of memory) — reported by wgpu's error scope.
    pub(crate) fn get(self: &Arc<Self>, kind: Kind, bytes: u64) -> Result<PooledBuffer> {
        let size = bucket(bytes);
        let reused = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let hit = st.free.get_mut(&(kind, size)).and_then(|v| v.pop());
            if hit.is_some() {
                st.idle_bytes -= size;
            }
            hit
        };
        let buffer = match reused {
            Some(b) => b,
            None => self.create(kind.usage(self.indirect), size, "sparkling pooled buffer")?,
        };
        Ok(PooledBuffer { buffer, kind, size, pool: Arc::clone(self) })
    }

    fn put(&self, kind: Kind, size: u64, buffer: wgpu::Buffer) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.batch_open {
            st.retired.push((kind, size, buffer));
            return;
        }
        Pool::make_free(&mut st, kind, size, buffer);
    }

    fn make_free(st: &mut State, kind: Kind, size: u64, buffer: wgpu::Buffer) {
        if st.idle_bytes + size > MAX_IDLE_BYTES {
            // Dropping (not destroying) lets wgpu free it once in-flight work is done.
            drop(buffer);
            return;
        }
        st.idle_bytes += size;
        st.free.entry((kind, size)).or_default().push(buffer);
    }

    /// A batch is about to receive commands: park released buffers from now on.
    pub(crate) fn open_batch(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).batch_open = true;
    }

    /// The open batch was submitted: parked buffers become reusable.
    pub(crate) fn recycle(&self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.batch_open = false;
        for (kind, size, buffer) in std::mem::take(&mut st.retired) {
            Pool::make_free(&mut st, kind, size, buffer);
        }
    }

    /// A new buffer outside the free lists (a weight chunk, a table), counted with the
    /// pool's own misses in [`Pool::created`]. Errors as [`create_buffer`].
    pub(crate) fn create(&self, usage: wgpu::BufferUsages, size: u64, label: &str) -> Result<wgpu::Buffer> {
        let b = create_buffer(&self.device, usage, size, label)?;
        self.created.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(b)
    }

    /// Buffers created so far ([`Pool::create`], and every miss of [`Pool::get`]).
    pub(crate) fn created(&self) -> u64 {
        self.created.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes currently idle in the pool (for tests and stats).
    pub(crate) fn idle_bytes(&self) -> u64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).idle_bytes
    }
}

/// Create a buffer, turning an out-of-memory or validation failure into [`Error::Device`]
/// instead of wgpu's default panic.
pub(crate) fn create_buffer(device: &wgpu::Device, usage: wgpu::BufferUsages, size: u64, label: &str) -> Result<wgpu::Buffer> {
    let (buffer, err) =
        crate::device::checked(device, || device.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size, usage, mapped_at_creation: false }));
    if let Some(e) = err {
        return Err(Error::Device(format!("allocating a {size}-byte buffer ({label}) failed: {e}")));
    }
    Ok(buffer)
}

/// A buffer on loan from the [`Pool`]; returned to it when dropped.
pub(crate) struct PooledBuffer {
    buffer: wgpu::Buffer,
    kind: Kind,
    size: u64,
    pool: Arc<Pool>,
}

impl PooledBuffer {
    /// The underlying wgpu buffer (its size is the bucket size, ≥ the requested bytes).
    pub(crate) fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        self.pool.put(self.kind, self.size, self.buffer.clone());
    }
}

impl std::fmt::Debug for PooledBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PooledBuffer({:?}, {} bytes)", self.kind, self.size)
    }
}

#[cfg(test)]
mod tests {
    use super::bucket;

    #[test]
    fn buckets_are_powers_of_two_then_mib_multiples() {
        assert_eq!(bucket(0), 256);
        assert_eq!(bucket(257), 512);
        assert_eq!(bucket(16 << 20), 16 << 20);
        assert_eq!(bucket((16 << 20) + 1), 17 << 20);
    }
}
