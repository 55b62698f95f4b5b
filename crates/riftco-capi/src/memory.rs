//! Process-wide tensor memory statistics by category.

use crate::error::{guard, out_ptr, rt_status};
use crate::strings::str_arg;
use riftco_tensor::{
    memory_stats, memory_stats_for, reset_peak_memory_stats, CategoryStats, MemoryCategory,
    MemoryStats,
};
use riftco_transformer::device::resolve_device;
use std::ffi::c_char;

/// Current and peak bytes of one memory category.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rt_memory_category_stats {
    /// Bytes allocated now.
    pub current_bytes: u64,
    /// Highest current_bytes since the last rt_reset_peak_memory_stats.
    pub peak_bytes: u64,
}

impl From<CategoryStats> for rt_memory_category_stats {
    fn from(s: CategoryStats) -> Self {
        Self {
            current_bytes: s.current_bytes as u64,
            peak_bytes: s.peak_bytes as u64,
        }
    }
}

/// Tensor memory of the whole process (every model), by category.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rt_memory_stats {
    /// Model weights (trainable or frozen).
    pub parameter: rt_memory_category_stats,
    /// Gradients.
    pub gradient: rt_memory_category_stats,
    /// Optimizer state (Adam moments).
    pub optimizer_state: rt_memory_category_stats,
    /// Forward values retained by graphs or produced during forwards.
    pub activation: rt_memory_category_stats,
    /// Temporaries (kernel scratch, inputs built from user data).
    pub workspace: rt_memory_category_stats,
    /// All categories together (the peak of the sum, not the sum of peaks).
    pub total: rt_memory_category_stats,
}

/// Writes the current memory statistics.
///
/// Errors: RT_ERROR_NULL_POINTER.
#[no_mangle]
pub unsafe extern "C" fn rt_get_memory_stats(out: *mut rt_memory_stats) -> rt_status {
    guard("rt_get_memory_stats", || {
        let out = out_ptr(out, "out")?;
        *out = (&memory_stats()).into();
        Ok(())
    })
}

impl From<&MemoryStats> for rt_memory_stats {
    fn from(s: &MemoryStats) -> Self {
        Self {
            parameter: s.get(MemoryCategory::Parameter).into(),
            gradient: s.get(MemoryCategory::Gradient).into(),
            optimizer_state: s.get(MemoryCategory::OptimizerState).into(),
            activation: s.get(MemoryCategory::Activation).into(),
            workspace: s.get(MemoryCategory::Workspace).into(),
            total: s.total.into(),
        }
    }
}

/// Writes the memory statistics of one device (each device has its own counters: a model
/// moved with rt_model_to_device counts its bytes there, and rt_get_memory_stats reports the
/// host's): `device` is a name rt_model_to_device accepts (NUL-terminated UTF-8,
/// case-insensitive; a GPU backend is opened on first use). Since 2.5.
///
/// Errors: RT_ERROR_NULL_POINTER (device or out), RT_ERROR_INVALID_STRING,
/// RT_ERROR_INVALID_ARGUMENT (an unknown name, listing the accepted ones),
/// RT_ERROR_DEVICE_UNAVAILABLE (no backend or adapter for it).
#[no_mangle]
pub unsafe extern "C" fn rt_get_memory_stats_for_device(
    device: *const c_char,
    out: *mut rt_memory_stats,
) -> rt_status {
    guard("rt_get_memory_stats_for_device", || {
        let name = str_arg(device, "device")?;
        let out = out_ptr(out, "out")?;
        let device = resolve_device(name)?;
        *out = (&memory_stats_for(device)).into();
        Ok(())
    })
}

/// Sets every peak to its current value.
///
/// Errors: none (always RT_OK).
#[no_mangle]
pub extern "C" fn rt_reset_peak_memory_stats() -> rt_status {
    guard("rt_reset_peak_memory_stats", || {
        reset_peak_memory_stats();
        Ok(())
    })
}

/// Writes the bytes of freed tensor buffers that riftco's buffer pool keeps for reuse. They
/// belong to no category of rt_memory_stats; the pool is bounded by the environment variable
/// RIFTCO_BUFFER_POOL_MIB (read once; default 1024, 0 disables pooling).
///
/// Errors: RT_ERROR_NULL_POINTER.
#[no_mangle]
pub unsafe extern "C" fn rt_get_cached_bytes(out: *mut u64) -> rt_status {
    guard("rt_get_cached_bytes", || {
        *out_ptr(out, "out")? = riftco_tensor::pool::cached_bytes() as u64;
        Ok(())
    })
}

/// Frees every buffer the pool caches and writes the bytes released to `released` (which may
/// be NULL when the caller does not need the figure).
///
/// Errors: none (always RT_OK).
#[no_mangle]
pub unsafe extern "C" fn rt_empty_cache(released: *mut u64) -> rt_status {
    guard("rt_empty_cache", || {
        let bytes = riftco_tensor::pool::release_cached_buffers() as u64;
        if !released.is_null() {
            // SAFETY: non-null, and the caller promises it points to a writable u64.
            unsafe { *released = bytes };
        }
        Ok(())
    })
}
