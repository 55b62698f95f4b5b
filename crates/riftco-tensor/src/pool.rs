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
//! Limit: `RIFTCO_BUFFER_POOL_MIB` (read once, a whole number of MiB; default 1024, `0` — or a
//! value that is not a number — disables pooling), or [`set_limit_bytes`]. When a buffer would
//! push the pool over its limit, buffers of the least recently used other lengths are freed
//! first, so a change of shapes (another sequence length, a smaller last batch) does not leave
//! the pool full of lengths nobody asks for. [`release_cached_buffers`] returns everything to the
//! allocator.
//!
//! In debug builds [`take`] hands out buffers filled with NaN (fresh or reused), so a kernel that
//! fails to overwrite every element produces NaNs in tests instead of plausible values.

use crate::Result;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

/// Buffers with fewer elements (64 KiB) go straight back to the allocator: small allocations are
/// cheap and would only fill the pool with many keys.
pub const MIN_POOLED_ELEMENTS: usize = 16 * 1024;

const DEFAULT_LIMIT_MIB: usize = 1024;

/// Cached buffers of one length, with the time (a counter of pool operations) that length was
/// last given or taken, for least-recently-used eviction.
struct Bucket {
    buffers: Vec<Vec<f32>>,
    last_use: u64,
}

struct Pool {
    buckets: BTreeMap<usize, Bucket>,
    cached_bytes: usize,
    /// `None` until first use, when `RIFTCO_BUFFER_POOL_MIB` is read.
    limit: Option<usize>,
    clock: u64,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    buckets: BTreeMap::new(),
    cached_bytes: 0,
    limit: None,
    clock: 0,
});

/// The limit in bytes for a `RIFTCO_BUFFER_POOL_MIB` value: unset means the default, a
/// non-negative whole number of MiB is taken as is, anything else is `None`.
fn parse_limit(value: Option<&str>) -> Option<usize> {
    match value {
        None => Some(DEFAULT_LIMIT_MIB << 20),
        Some(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .map(|mib| mib.saturating_mul(1 << 20)),
    }
}

/// The limit from `RIFTCO_BUFFER_POOL_MIB`. A value that is not a whole number of MiB disables
/// pooling (the safe reading of a typo such as `off`) and says so once on stderr.
fn limit_from_env() -> usize {
    let value = std::env::var("RIFTCO_BUFFER_POOL_MIB").ok();
    parse_limit(value.as_deref()).unwrap_or_else(|| {
        eprintln!(
            "riftco: RIFTCO_BUFFER_POOL_MIB={:?} is not a whole number of MiB; the buffer pool is disabled",
            value.unwrap_or_default()
        );
        0
    })
}

fn pool() -> MutexGuard<'static, Pool> {
    // Every operation leaves the pool consistent between statements, so a poisoned lock (a
    // panic elsewhere while holding it cannot happen: no code here panics) is still usable.
    let mut p = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if p.limit.is_none() {
        p.limit = Some(limit_from_env());
    }
    p
}

fn bytes_of(len: usize) -> usize {
    len * std::mem::size_of::<f32>()
}

impl Pool {
    fn limit(&self) -> usize {
        self.limit.unwrap_or(0)
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn pop(&mut self, len: usize) -> Option<Vec<f32>> {
        let now = self.tick();
        let bucket = self.buckets.get_mut(&len)?;
        let v = bucket.buffers.pop()?;
        bucket.last_use = now;
        if bucket.buffers.is_empty() {
            self.buckets.remove(&len);
        }
        self.cached_bytes -= bytes_of(len);
        Some(v)
    }

    /// Frees buffers, least recently used length first (never `keep`), until `cached + extra`
    /// fits the limit. Returns whether it fits.
    fn evict_for(&mut self, extra: usize, keep: Option<usize>) -> bool {
        while self.cached_bytes + extra > self.limit() {
            let victim = self
                .buckets
                .iter()
                .filter(|(len, _)| Some(**len) != keep)
                .min_by_key(|(_, b)| b.last_use)
                .map(|(len, _)| *len);
            let Some(len) = victim else {
                return false;
            };
            let bucket = self.buckets.get_mut(&len).expect("victim exists");
            bucket.buffers.pop();
            if bucket.buffers.is_empty() {
                self.buckets.remove(&len);
            }
            self.cached_bytes -= bytes_of(len);
        }
        true
    }
}

fn pop(len: usize) -> Option<Vec<f32>> {
    if len < MIN_POOLED_ELEMENTS {
        return None;
    }
    pool().pop(len)
}

/// A buffer of exactly `len` elements whose contents are unspecified (finite or not): the caller
/// must overwrite every element before reading any. Reuses a pooled buffer when one of that
/// length is cached, else allocates. Debug builds fill it with NaN, fresh or reused.
///
/// # Errors
/// [`crate::TensorError::OutOfMemory`] naming `op` when a fresh allocation fails.
pub fn try_take(op: &'static str, len: usize) -> Result<Vec<f32>> {
    let mut v = match pop(len) {
        Some(v) => v,
        None => crate::alloc::try_zeroed_vec(op, len)?,
    };
    if cfg!(debug_assertions) {
        v.fill(f32::NAN);
    }
    Ok(v)
}

/// A zero-filled buffer of exactly `len` elements (pooled when possible).
///
/// # Errors
/// [`crate::TensorError::OutOfMemory`] naming `op` when a fresh allocation fails.
pub fn try_take_zeroed(op: &'static str, len: usize) -> Result<Vec<f32>> {
    match pop(len) {
        Some(mut v) => {
            v.fill(0.0);
            Ok(v)
        }
        None => crate::alloc::try_zeroed_vec(op, len),
    }
}

/// [`try_take`] for buffers whose size is bounded by memory that already exists (a copy of a
/// live tensor).
///
/// # Panics
/// When the allocation fails (a panic, which the Python and C boundaries report, not an abort).
pub fn take(len: usize) -> Vec<f32> {
    try_take("buffer pool", len).unwrap_or_else(|e| panic!("{e}"))
}

/// [`try_take_zeroed`] for buffers whose size is bounded by memory that already exists.
///
/// # Panics
/// When the allocation fails.
pub fn take_zeroed(len: usize) -> Vec<f32> {
    try_take_zeroed("buffer pool", len).unwrap_or_else(|e| panic!("{e}"))
}

/// Returns a buffer to the pool (called when a storage drops). Buffers that are too small or
/// not exactly sized are freed; to make room under the limit, buffers of the least recently
/// used other lengths are freed first, and if that is not enough this one is.
pub(crate) fn give(v: Vec<f32>) {
    let len = v.len();
    if len < MIN_POOLED_ELEMENTS || v.capacity() != len {
        return;
    }
    let bytes = bytes_of(len);
    let mut p = pool();
    if !p.evict_for(bytes, Some(len)) {
        return;
    }
    let now = p.tick();
    p.cached_bytes += bytes;
    let bucket = p.buckets.entry(len).or_insert(Bucket {
        buffers: Vec::new(),
        last_use: now,
    });
    bucket.last_use = now;
    bucket.buffers.push(v);
}

/// Bytes held by the pool: freed tensor buffers kept for reuse, owned by no tensor.
pub fn cached_bytes() -> usize {
    pool().cached_bytes
}

/// Frees every cached buffer (like `torch.cuda.empty_cache()`); returns the bytes released.
pub fn release_cached_buffers() -> usize {
    let mut p = pool();
    let bytes = p.cached_bytes;
    p.buckets.clear();
    p.cached_bytes = 0;
    bytes
}

/// Sets the most bytes the pool may hold (`0` disables pooling) and frees cached buffers, least
/// recently used lengths first, until it holds no more than that.
pub fn set_limit_bytes(bytes: usize) {
    let mut p = pool();
    p.limit = Some(bytes);
    p.evict_for(0, None);
}

/// The pool's current limit in bytes.
pub fn limit_bytes() -> usize {
    pool().limit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_values() {
        assert_eq!(parse_limit(None), Some(1024 << 20));
        assert_eq!(parse_limit(Some("0")), Some(0));
        assert_eq!(parse_limit(Some(" 64 ")), Some(64 << 20));
        for bad in ["off", "-1", "512MiB", "", "1.5"] {
            assert_eq!(parse_limit(Some(bad)), None, "{bad:?}");
        }
    }
}
