//! The device copies of RoPE tables: a small most-recently-used cache keyed by
//! [`RopeTable::id`], so that a model's RoPE calls (every block, forward and backward, every
//! decode step) upload its `cos`/`sin` table once instead of on every call.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use riftco_tensor::backend::RopeTable;

use crate::kernels::GpuRopeTable;
use crate::{GpuContext, GpuError};

/// How many tables stay on the device. A model has one table; a few models (or a model and
/// its rebuilt table after a config change) alternate without re-uploading. Each entry holds
/// `2 · max_positions · d_head/2` f32 in the context's pool, outside the memory categories.
pub const ROPE_CACHE_ENTRIES: usize = 4;

/// The cache (most recently used first).
#[derive(Default)]
pub(crate) struct RopeCache {
    entries: Mutex<VecDeque<(u64, Arc<GpuRopeTable>)>>,
}

impl std::fmt::Debug for RopeCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let ids: Vec<u64> = entries.iter().map(|(id, _)| *id).collect();
        f.debug_struct("RopeCache")
            .field("table_ids", &ids)
            .finish()
    }
}

impl RopeCache {
    /// The device copy of `table`, uploaded on a miss (evicting the least recently used entry
    /// beyond [`ROPE_CACHE_ENTRIES`]).
    pub(crate) fn get(
        &self,
        ctx: &GpuContext,
        table: &RopeTable,
    ) -> Result<Arc<GpuRopeTable>, GpuError> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = entries.iter().position(|(id, _)| *id == table.id()) {
            let entry = entries
                .remove(i)
                .unwrap_or_else(|| unreachable!("found at {i}"));
            let t = Arc::clone(&entry.1);
            entries.push_front(entry);
            return Ok(t);
        }
        let t = Arc::new(GpuRopeTable::upload(ctx, table)?);
        entries.push_front((table.id(), Arc::clone(&t)));
        entries.truncate(ROPE_CACHE_ENTRIES);
        Ok(t)
    }
}
