//! Shared, versioned, accounted storage.

use crate::memory::{record_alloc, record_free, MemoryCategory};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The buffer behind one or more [`crate::Tensor`]s (reshapes share it).
///
/// Registers `4 · len` bytes with its category on creation and releases them on drop. The
/// version starts at 0 and is bumped by every write access and every device transfer.
#[derive(Debug)]
pub struct Storage {
    data: RwLock<Vec<f32>>,
    version: AtomicU64,
    category: MemoryCategory,
    bytes: usize,
}

impl Storage {
    /// Takes ownership of `data`, shrinking its capacity to its length so the accounted bytes
    /// are exactly what is held.
    pub fn new(mut data: Vec<f32>, category: MemoryCategory) -> Self {
        data.shrink_to_fit();
        let bytes = data.capacity() * std::mem::size_of::<f32>();
        record_alloc(category, bytes);
        Self {
            data: RwLock::new(data),
            version: AtomicU64::new(0),
            category,
            bytes,
        }
    }

    /// Shared read access.
    pub fn read(&self) -> RwLockReadGuard<'_, Vec<f32>> {
        self.data.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Exclusive write access; bumps the version.
    pub fn write(&self) -> RwLockWriteGuard<'_, Vec<f32>> {
        self.version.fetch_add(1, Ordering::AcqRel);
        self.data.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The current version.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Bumps the version without touching the data (device transfers).
    pub fn bump_version(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// The accounting category.
    pub fn category(&self) -> MemoryCategory {
        self.category
    }

    /// Accounted bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        record_free(self.category, self.bytes);
        let data = std::mem::take(self.data.get_mut().unwrap_or_else(|e| e.into_inner()));
        crate::pool::give(data);
    }
}
