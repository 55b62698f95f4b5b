//! `is_grad_enabled()` and `_set_grad_enabled(flag)`: the calling thread's graph-recording
//! switch (`riftco_autograd::grad_mode`), under the Python context managers `riftco.no_grad`,
//! `riftco.enable_grad` and `riftco.set_grad_enabled`.
//!
//! The switch is thread-local and every op binding computes on the calling thread (the GIL is
//! released, the thread stays the same), so the setting made here is the one ops see.

use pyo3::prelude::*;
use riftco_autograd::grad_mode;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(is_grad_enabled, m)?)?;
    m.add_function(wrap_pyfunction!(_set_grad_enabled, m)?)?;
    Ok(())
}

/// Whether ops on the calling thread record a graph (``True`` unless inside ``riftco.no_grad()``
/// or ``riftco.set_grad_enabled(False)``); a new thread starts with ``True``.
///
/// Returns:
///     bool: the calling thread's setting.
#[pyfunction]
fn is_grad_enabled() -> bool {
    grad_mode::is_grad_enabled()
}

/// Sets whether ops on the calling thread record a graph and returns the previous setting
/// (the primitive under ``riftco.no_grad``, ``enable_grad`` and ``set_grad_enabled``, which
/// restore the returned value on exit).
///
/// Args:
///     enabled: ``True`` to record, ``False`` to compute constants only.
///
/// Returns:
///     bool: the setting before the call.
///
/// Raises:
///     TypeError: ``enabled`` is not a bool.
#[pyfunction]
fn _set_grad_enabled(enabled: bool) -> bool {
    grad_mode::set_grad_enabled(enabled)
}
