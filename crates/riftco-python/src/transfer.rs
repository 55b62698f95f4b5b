//! `Variable.to(device)`: a copy of a value on another device.

use riftco_autograd::Variable;
use riftco_tensor::{Device, MemoryCategory, Shape, Tensor};
use riftco_transformer::device::resolve_device;

/// A copy of `t` on `device` in `category`: read to the host (a GPU value is synchronised),
/// then uploaded. The copy has its own storage, so moving it bumps no version of `t`.
fn copy_to(t: &Tensor, device: Device, category: MemoryCategory) -> riftco_tensor::Result<Tensor> {
    let host = t.to_host()?;
    let mut out = Tensor::from_vec(host, Shape::new(t.dims().to_vec()), category)?;
    if device != Device::Cpu {
        out.transfer_to(device)?;
    }
    Ok(out)
}

/// `v` on the device named `name` (see `PyVariable::to`): `None` when it is there already,
/// otherwise for a leaf a new leaf (same `requires_grad` and name), and for an op result a
/// graph node whose VJP copies the gradient back to `v`'s device.
///
/// # Errors
/// As [`resolve_device`] (an unknown name, a GPU without adapter); `OutOfMemory` when the copy
/// cannot be allocated.
pub(crate) fn variable_to(
    v: &Variable,
    name: &str,
) -> riftco_transformer::Result<Option<Variable>> {
    let device = resolve_device(name)?;
    let from = v.value().device();
    if from == device {
        return Ok(None);
    }
    if v.is_leaf() {
        let category = if v.requires_grad() {
            MemoryCategory::Parameter
        } else {
            MemoryCategory::Workspace
        };
        let copy = copy_to(v.value(), device, category)?;
        return Ok(Some(match v.name() {
            Some(n) => Variable::named_leaf(copy, v.requires_grad(), n),
            None => Variable::leaf(copy, v.requires_grad()),
        }));
    }
    let copy = copy_to(v.value(), device, MemoryCategory::Activation)?;
    Ok(Some(Variable::from_op(
        "to_device",
        copy,
        vec![v.clone()],
        move |_, _, grad| Ok(vec![Some(copy_to(grad, from, MemoryCategory::Gradient)?)]),
    )))
}
