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
