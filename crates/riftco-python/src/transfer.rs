//! `Variable.to(device)`: the device name resolved (a GPU opened on first use), then
//! `riftco_autograd::ops::to_device`.

use riftco_autograd::{ops, Variable};
use riftco_transformer::device::resolve_device;

/// `v` on the device named `name` (see `PyVariable::to`): `None` when it is there already.
///
/// # Errors
/// As [`resolve_device`] (an unknown name, a GPU without adapter) and [`ops::to_device`].
pub(crate) fn variable_to(
    v: &Variable,
    name: &str,
) -> riftco_transformer::Result<Option<Variable>> {
    Ok(ops::to_device(v, resolve_device(name)?)?)
}

/// Moves the leaves `vars` (and their gradients) to the device named `device` in place, each
/// tensor keeping its identity (`riftco_transformer::device::move_parameters`: all or none).
/// For `Module.to`: optimizers built before the move hold the same leaves.
///
/// Raises:
///     ConfigError: an unknown device name. DeviceUnavailableError: no adapter. ValueError: a
///         Variable that is not a leaf. OutOfMemoryError: a copy cannot be allocated (every
///         leaf already moved is moved back).
#[pyo3::pyfunction]
pub(crate) fn _move_leaves_(
    py: pyo3::Python<'_>,
    vars: Vec<pyo3::PyRef<'_, crate::variable::PyVariable>>,
    device: &str,
) -> pyo3::PyResult<()> {
    let leaves: Vec<Variable> = vars.iter().map(|v| v.0.clone()).collect();
    if let Some(i) = leaves.iter().position(|v| !v.is_leaf()) {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "_move_leaves_: variable {i} is not a leaf (only leaves move in place; use \
             Variable.to for a copy)"
        )));
    }
    crate::errors::compute(py, || {
        let d = resolve_device(device)?;
        riftco_transformer::device::move_parameters(&leaves, d)
    })
}
