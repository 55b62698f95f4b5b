//! RMSNorm (Zhang & Sennrich 2019, eq. 4).

use super::{backend, ACT, GRAD};
use crate::error::Result;
use crate::variable::{Saves, Variable};
use riftco_tensor::TensorError;

/// `y = x / sqrt(mean(x²) + eps) ⊙ weight` over the last axis; `x [..., d]`, `weight [d]`.
/// The per-row reciprocal RMS is saved for the VJP.
///
/// # Errors
/// [`TensorError::InvalidArgument`] when `eps` is not finite and `> 0` (a NaN `eps` would make
/// every output NaN, a negative one can divide by zero); zero-sized when `x`'s last dimension
/// `d` is 0 (or `x` is a scalar); shape mismatch when `weight` is not `[d]`.
pub fn rms_norm(x: &Variable, weight: &Variable, eps: f32) -> Result<Variable> {
    if !(eps.is_finite() && eps > 0.0) {
        return Err(TensorError::InvalidArgument {
            op: "rms_norm",
            message: format!("eps must be finite and > 0; got {eps:?}"),
        }
        .into());
    }
    let d = x.dims().last().copied().unwrap_or(0);
    if d == 0 {
        // Normalising over no features: zero-sized, whatever the weight (a weight [0] would
        // otherwise be reported as "expected [0], got [0]").
        return Err(TensorError::ZeroSized {
            op: "rms_norm (x: the normalised last dimension)",
            shape: x.dims().to_vec(),
        }
        .into());
    }
    if weight.dims() != [d] {
        return Err(TensorError::ShapeMismatch {
            op: "rms_norm (weight)",
            expected: vec![d],
            got: weight.dims().to_vec(),
        }
        .into());
    }
    let be = backend("rms_norm", &[x, weight])?;
    let (value, rstd) = be.rms_norm("rms_norm", x.value(), weight.value(), eps, ACT)?;
    Ok(Variable::from_op_saving(
        "rms_norm",
        value,
        vec![x.clone(), weight.clone()],
        Saves::parents(&[0, 1]),
        move |p, _, g| {
            let (dx, dw) = be.rms_norm_backward(
                "rms_norm (vjp)",
                p[0].value(),
                p[1].value(),
                &rstd,
                g,
                p[1].requires_grad(),
                GRAD,
            )?;
            Ok(vec![p[0].requires_grad().then_some(dx), dw])
        },
    ))
}
