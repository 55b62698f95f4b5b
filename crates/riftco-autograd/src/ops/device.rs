//! Copies of values between devices (PyTorch's `tensor.to(device)`).

use crate::error::Result;
use crate::variable::{Saves, Variable};
use riftco_tensor::{Device, MemoryCategory, Shape, Tensor};

/// A copy of `t` on `device` in `category`: read to the host (a GPU value waits for its pending
/// work), then uploaded. The copy has its own storage, so `t`'s version is not bumped.
fn copy_to(t: &Tensor, device: Device, category: MemoryCategory) -> riftco_tensor::Result<Tensor> {
    let host = t.to_host()?;
    let mut out = Tensor::from_vec(host, Shape::new(t.dims().to_vec()), category)?;
    if device != Device::Cpu {
        out.transfer_to(device)?;
    }
    Ok(out)
}

/// `x` on `device`: `None` when it is there already; for a leaf, a new leaf with the same
/// `requires_grad` and name holding a copy (so a moved parameter is still a parameter an
/// optimizer can step, unlike PyTorch, where the copy of a leaf is a graph node); for an op
/// result, a graph node `"to_device"` whose VJP copies the gradient back to `x`'s device.
///
/// # Errors
/// `DeviceUnavailable` when `device` has no backend; `OutOfMemory` when the copy cannot be
/// allocated.
pub fn to_device(x: &Variable, device: Device) -> Result<Option<Variable>> {
    let from = x.value().device();
    if from == device {
        return Ok(None);
    }
    if x.is_leaf() {
        let category = if x.requires_grad() {
            MemoryCategory::Parameter
        } else {
            MemoryCategory::Workspace
        };
        let copy = copy_to(x.value(), device, category)?;
        return Ok(Some(match x.name() {
            Some(n) => Variable::named_leaf(copy, x.requires_grad(), n),
            None => Variable::leaf(copy, x.requires_grad()),
        }));
    }
    let copy = copy_to(x.value(), device, MemoryCategory::Activation)?;
    Ok(Some(Variable::from_op_saving(
        "to_device",
        copy,
        vec![x.clone()],
        Saves::NOTHING,
        move |_, _, grad| Ok(vec![Some(copy_to(grad, from, MemoryCategory::Gradient)?)]),
    )))
}
