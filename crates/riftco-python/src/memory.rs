//! Memory accounting by category (`riftco_tensor::memory_stats`).

use pyo3::prelude::*;
use pyo3::types::PyDict;
use riftco_tensor::{CategoryStats, MemoryCategory};

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(reset_peak_memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(peak_memory_breakdown, m)?)?;
    m.add_function(wrap_pyfunction!(cached_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(empty_cache, m)?)?;
    Ok(())
}

fn entry<'py>(py: Python<'py>, s: CategoryStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("current_bytes", s.current_bytes)?;
    d.set_item("peak_bytes", s.peak_bytes)?;
    Ok(d)
}

/// Current and peak bytes of every tensor allocation, by category.
///
/// Every tensor riftco allocates is counted: ``parameter`` (weights, LoRA adapters),
/// ``gradient`` (committed gradients and those alive during backward), ``optimizer_state``
/// (Adam moments), ``activation`` (forward values retained by graphs), ``workspace`` (inputs
/// built from user data, temporaries). ``total`` is the peak of the sum, not the sum of peaks.
///
/// Each device has its own counters (like ``torch.cuda.memory_stats(device)``); a transfer
/// moves a tensor's bytes from one device's counters to the other's.
///
/// Args:
///     device: the device whose counters to read (``"cpu"``, the default).
///
/// Returns:
///     dict[str, dict[str, int]]: keys ``parameter``, ``gradient``, ``optimizer_state``,
///     ``activation``, ``workspace``, ``total``; each ``{"current_bytes", "peak_bytes"}``.
///
/// Raises:
///     ConfigError: for an unknown device name (the message lists the valid ones).
///
/// Example:
///     >>> import riftco
///     >>> sorted(riftco.memory_stats()["total"])
///     ['current_bytes', 'peak_bytes']
#[pyfunction]
#[pyo3(signature = (device = "cpu"))]
fn memory_stats(py: Python<'_>, device: &str) -> PyResult<Py<PyDict>> {
    let device = riftco_tensor::Device::parse(device).map_err(crate::errors::tensor_err)?;
    let stats = riftco_tensor::memory_stats_for(device);
    let d = PyDict::new(py);
    for c in MemoryCategory::ALL {
        d.set_item(c.name(), entry(py, stats.get(c))?)?;
    }
    d.set_item("total", entry(py, stats.total)?)?;
    Ok(d.unbind())
}

/// What the total peak of ``memory_stats()`` was made of: each category's bytes at the moment
/// the total reached its peak (since the last ``reset_peak_memory_stats()``).
///
/// ``memory_stats()`` gives each category's own peak, and those need not coincide in time (the
/// workspace may peak in the loss, the activations in the backward pass); these are the bytes
/// that were alive together at the highest point, and they sum to
/// ``memory_stats()["total"]["peak_bytes"]`` (exactly when one thread allocates at a time).
///
/// Args:
///     device: the device whose counters to read (``"cpu"``, the default).
///
/// Returns:
///     dict[str, int]: keys ``parameter``, ``gradient``, ``optimizer_state``, ``activation``,
///     ``workspace``.
///
/// Raises:
///     ConfigError: for an unknown device name (the message lists the valid ones).
///
/// Example:
///     >>> import riftco
///     >>> riftco.reset_peak_memory_stats()
///     >>> parts = riftco.peak_memory_breakdown()
///     >>> sum(parts.values()) == riftco.memory_stats()["total"]["peak_bytes"]
///     True
#[pyfunction]
#[pyo3(signature = (device = "cpu"))]
fn peak_memory_breakdown(py: Python<'_>, device: &str) -> PyResult<Py<PyDict>> {
    let device = riftco_tensor::Device::parse(device).map_err(crate::errors::tensor_err)?;
    let at = riftco_tensor::memory_at_total_peak_for(device);
    let d = PyDict::new(py);
    for (c, bytes) in MemoryCategory::ALL.into_iter().zip(at) {
        d.set_item(c.name(), bytes)?;
    }
    Ok(d.unbind())
}

/// Sets every peak counter of ``memory_stats()`` to its current value.
#[pyfunction]
fn reset_peak_memory_stats() {
    riftco_tensor::reset_peak_memory_stats();
}

/// Bytes of freed tensor buffers riftco's buffer pool keeps for reuse.
///
/// These belong to no tensor and to no ``memory_stats()`` category (like PyTorch's "reserved"
/// minus "allocated" CUDA memory). The pool is bounded by ``RIFTCO_BUFFER_POOL_MIB`` (read once
/// at first use; default 1024, ``0`` disables pooling).
///
/// Returns:
///     int: bytes currently cached.
#[pyfunction]
fn cached_bytes() -> usize {
    riftco_tensor::pool::cached_bytes()
}

/// Frees every buffer the pool caches (like ``torch.cuda.empty_cache()``).
///
/// Returns:
///     int: the bytes released.
#[pyfunction]
fn empty_cache() -> usize {
    riftco_tensor::pool::release_cached_buffers()
}
