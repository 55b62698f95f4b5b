//! The buffer pool: f32 storage buffers reused by size bucket, with byte accounting.
//!
//! A buffer of `len` f32 values lives in the bucket of the next power of two of `4 · len` bytes
//! (at least [`MIN_BUCKET_BYTES`]); dropping a [`GpuBuffer`] returns it to its bucket, and the
//! next request of that bucket reuses it instead of allocating. Reuse is safe while commands
//! that read the old contents are still pending: every kernel and copy is recorded in one
//! command stream, in order, so a later write cannot overtake an earlier read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// The smallest bucket, in bytes.
pub const MIN_BUCKET_BYTES: u64 = 256;

/// The bucket (bytes actually allocated) for a buffer of `len` f32 values.
pub fn bucket_bytes(len: usize) -> u64 {
    let bytes = (len as u64).saturating_mul(4).max(MIN_BUCKET_BYTES);
    bytes.checked_next_power_of_two().unwrap_or(bytes)
}

/// Byte counts of one context's buffers (all in bytes of device memory).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes held by live [`GpuBuffer`]s (their buckets, not their lengths).
    pub live_bytes: u64,
    /// Bytes of freed buffers kept in the pool for reuse.
    pub cached_bytes: u64,
    /// The highest `live_bytes` seen.
    pub peak_live_bytes: u64,
    /// Buffers created on the device (pool misses).
    pub allocations: u64,
    /// Requests served from the pool (pool hits).
    pub reuses: u64,
}

#[derive(Default)]
pub(crate) struct PoolState {
    free: HashMap<u64, Vec<wgpu::Buffer>>,
    pub(crate) stats: MemoryStats,
}

/// Shared between the context and every buffer it handed out.
pub(crate) struct Pool {
    state: Mutex<PoolState>,
    /// The adapter of the owning context (named in [`crate::GpuError::ForeignBuffer`]).
    pub(crate) adapter: String,
}

impl Pool {
    pub(crate) fn new(adapter: String) -> Self {
        Self {
            state: Mutex::new(PoolState::default()),
            adapter,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, PoolState> {
        // A panic while holding the lock cannot leave the counts inconsistent in a way that
        // matters more than losing them: recover the guard.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A cached buffer of `bucket` bytes, if any (counted as live).
    pub(crate) fn take(&self, bucket: u64) -> Option<wgpu::Buffer> {
        let mut s = self.lock();
        let buf = s.free.get_mut(&bucket).and_then(Vec::pop)?;
        s.stats.cached_bytes -= bucket;
        s.stats.reuses += 1;
        s.stats.live_bytes += bucket;
        s.stats.peak_live_bytes = s.stats.peak_live_bytes.max(s.stats.live_bytes);
        Some(buf)
    }

    /// Count a freshly created buffer of `bucket` bytes as live.
    pub(crate) fn created(&self, bucket: u64) {
        let mut s = self.lock();
        s.stats.allocations += 1;
        s.stats.live_bytes += bucket;
        s.stats.peak_live_bytes = s.stats.peak_live_bytes.max(s.stats.live_bytes);
    }

    fn give_back(&self, bucket: u64, buffer: wgpu::Buffer) {
        let mut s = self.lock();
        s.stats.live_bytes -= bucket;
        s.stats.cached_bytes += bucket;
        s.free.entry(bucket).or_default().push(buffer);
    }

    /// Drop every cached buffer (device memory is freed once pending commands finish).
    pub(crate) fn trim(&self) -> u64 {
        let mut s = self.lock();
        let freed = s.stats.cached_bytes;
        s.free.clear();
        s.stats.cached_bytes = 0;
        freed
    }
}

/// A device buffer of `len` f32 values (STORAGE | COPY_SRC | COPY_DST), owned: dropping it
/// returns the memory to its context's pool.
pub struct GpuBuffer {
    buffer: Option<wgpu::Buffer>,
    len: usize,
    bucket: u64,
    pool: Arc<Pool>,
}

impl GpuBuffer {
    pub(crate) fn new(buffer: wgpu::Buffer, len: usize, bucket: u64, pool: Arc<Pool>) -> Self {
        Self {
            buffer: Some(buffer),
            len,
            bucket,
            pool,
        }
    }

    /// The number of f32 values.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no values.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the values occupy (`4 · len`).
    pub fn bytes(&self) -> u64 {
        self.len as u64 * 4
    }

    /// Bytes allocated on the device (the pool bucket, ≥ [`Self::bytes`]).
    pub fn allocated_bytes(&self) -> u64 {
        self.bucket
    }

    /// Whether this buffer was created by the context that owns `pool`.
    pub(crate) fn belongs_to(&self, pool: &Arc<Pool>) -> bool {
        Arc::ptr_eq(&self.pool, pool)
    }

    /// The adapter of the context that created this buffer.
    pub(crate) fn owner(&self) -> &str {
        &self.pool.adapter
    }

    pub(crate) fn raw(&self) -> &wgpu::Buffer {
        // Only `Drop` takes the buffer out.
        self.buffer
            .as_ref()
            .unwrap_or_else(|| unreachable!("GpuBuffer used after drop"))
    }

    /// The binding of the first `len` values (the whole bucket when `len` is 0, since a
    /// binding cannot be empty; kernels never read it then).
    pub(crate) fn binding(&self) -> wgpu::BindingResource<'_> {
        let size = std::num::NonZeroU64::new(self.bytes());
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: self.raw(),
            offset: 0,
            size,
        })
    }
}

impl std::fmt::Debug for GpuBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuBuffer")
            .field("len", &self.len)
            .field("allocated_bytes", &self.bucket)
            .finish()
    }
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            self.pool.give_back(self.bucket, buffer);
        }
    }
}
