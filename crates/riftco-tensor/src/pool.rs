//! A caching pool of tensor buffers, so a training step reuses the previous step's memory instead
//! of asking the allocator for fresh pages (page faults) or zero-filled ones (memset).
//!
//! When the last reference to a tensor's storage drops, its buffer (at least
//! [`MIN_POOLED_ELEMENTS`] elements) goes to the pool, keyed by its exact length, as long as the
//! pool stays under its limit. [`take`] hands such a buffer back to a producer that overwrites
//! every element; [`take_zeroed`] to one that accumulates. This is the CPU counterpart of
//! PyTorch's CUDA caching allocator ("reserved" versus "allocated" memory): the bytes a pool holds
//! are not in any [`crate::MemoryCategory`] (no tensor owns them) and are reported separately by
//! [`cached_bytes`] and [`crate::MemoryStats::cached_bytes`].
//!
//! Limit: `RIFTCO_BUFFER_POOL_MIB` (read once; default 1024, `0` disables pooling), or
//! [`set_limit_bytes`]. [`release_cached_buffers`] returns everything to the allocator.
//!
//! In debug builds a reused buffer is filled with NaN before it is handed out by [`take`], so a
//! kernel that fails to overwrite every element produces NaNs in tests instead of stale values.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Buffers with fewer elements (64 KiB) go straight back to the allocator: small allocations are
/// cheap and would only fill the pool with many keys.
pub const MIN_POOLED_ELEMENTS: usize = 16 * 1024;

const DEFAULT_LIMIT_MIB: usize = 1024;

static FREE: Mutex<BTreeMap<usize, Vec<Vec<f32>>>> = Mutex::new(BTreeMap::new());
static CACHED: AtomicUsize = AtomicUsize::new(0);
static LIMIT: OnceLock<AtomicUsize> = OnceLock::new();

fn limit() -> &'static AtomicUsize {
    LIMIT.get_or_init(|| {
        let mib = std::env::var("RIFTCO_BUFFER_POOL_MIB")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(DEFAULT_LIMIT_MIB);
        AtomicUsize::new(mib.saturating_mul(1 << 20))
    })
}

fn free_lists() -> MutexGuard<'static, BTreeMap<usize, Vec<Vec<f32>>>> {
    // The map stays consistent across a panic (every operation is a single push or pop).
    FREE.lock().unwrap_or_else(|e| e.into_inner())
}

fn bytes_of(len: usize) -> usize {
    len * std::mem::size_of::<f32>()
}

fn pop(len: usize) -> Option<Vec<f32>> {
    if len < MIN_POOLED_ELEMENTS {
        return None;
    }
    let mut free = free_lists();
    let list = free.get_mut(&len)?;
    let v = list.pop()?;
    if list.is_empty() {
        free.remove(&len);
    }
    CACHED.fetch_sub(bytes_of(len), Ordering::Relaxed);
    Some(v)
}

/// A buffer of exactly `len` elements whose contents are unspecified (finite or not): the caller
/// must overwrite every element before reading any. Reuses a pooled buffer when one of that
/// length is cached, else allocates a zeroed one.
pub fn take(len: usize) -> Vec<f32> {
    match pop(len) {
        Some(mut v) => {
            if cfg!(debug_assertions) {
                v.fill(f32::NAN);
            }
            v
        }
        None => vec![0.0; len],
    }
}

/// A zero-filled buffer of exactly `len` elements (pooled when possible).
pub fn take_zeroed(len: usize) -> Vec<f32> {
    match pop(len) {
        Some(mut v) => {
            v.fill(0.0);
            v
        }
        None => vec![0.0; len],
    }
}

/// Returns a buffer to the pool (called when a storage drops). Buffers that are too small, not
/// exactly sized, or would push the pool over its limit are freed.
pub(crate) fn give(v: Vec<f32>) {
    let len = v.len();
    if len < MIN_POOLED_ELEMENTS || v.capacity() != len {
        return;
    }
    let bytes = bytes_of(len);
    let limit = limit().load(Ordering::Relaxed);
    let mut free = free_lists();
    if CACHED.load(Ordering::Relaxed) + bytes > limit {
        return;
    }
    CACHED.fetch_add(bytes, Ordering::Relaxed);
    free.entry(len).or_default().push(v);
}

/// Bytes held by the pool: freed tensor buffers kept for reuse, owned by no tensor.
pub fn cached_bytes() -> usize {
    CACHED.load(Ordering::Relaxed)
}

/// Frees every cached buffer (like `torch.cuda.empty_cache()`); returns the bytes released.
pub fn release_cached_buffers() -> usize {
    let drained = std::mem::take(&mut *free_lists());
    let bytes: usize = drained
        .iter()
        .map(|(len, list)| bytes_of(*len) * list.len())
        .sum();
    CACHED.fetch_sub(bytes, Ordering::Relaxed);
    bytes
}

/// Sets the most bytes the pool may hold (`0` disables pooling) and releases buffers beyond it.
pub fn set_limit_bytes(bytes: usize) {
    limit().store(bytes, Ordering::Relaxed);
    if cached_bytes() > bytes {
        release_cached_buffers();
    }
}

/// The pool's current limit in bytes.
pub fn limit_bytes() -> usize {
    limit().load(Ordering::Relaxed)
}
