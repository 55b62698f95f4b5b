//! RMSNorm (Zhang & Sennrich 2019, eq. 4).

use super::{activation, buf, gradient, zeroed};
use crate::error::Result;
use crate::variable::Variable;
use riftco_kernels::norm as k;
use riftco_tensor::{MemoryCategory, Tensor, TensorError};

/// `y = x / sqrt(mean(x²) + eps) ⊙ weight` over the last axis; `x [..., d]`, `weight [d]`.
/// The per-row reciprocal RMS is saved for the VJP.
///
/// # Errors
/// [`TensorError::InvalidArgument`] when `eps` is not finite and `> 0` (a NaN `eps` would make
/// every output NaN, a negative one can divide by zero); shape mismatch when `weight` is not
/// `[d]`.
pub fn rms_norm(x: &Variable, weight: &Variable, eps: f32) -> Result<Variable> {
    if !(eps.is_finite() && eps > 0.0) {
        return Err(TensorError::InvalidArgument {
            op: "rms_norm",
            message: format!("eps must be finite and > 0; got {eps:?}"),
        }
        .into());
    }
    let d = x.dims().last().copied().unwrap_or(0);
    if weight.dims() != [d] || d == 0 {
        return Err(TensorError::ShapeMismatch {
            op: "rms_norm (weight)",
            expected: vec![d],
            got: weight.dims().to_vec(),
        }
        .into());
    }
    let rows = x.value().numel() / d;
    let mut y = buf("rms_norm", rows * d)?;
    let mut rstd = buf("rms_norm", rows)?;
    k::rms_norm(
        &x.value().read(),
        &weight.value().read(),
        eps,
        &mut y,
        &mut rstd,
    );
    let rstd = Tensor::from_vec_unchecked(rstd, [rows].into(), MemoryCategory::Activation);
    let value = activation(y, x.value().shape().clone());
    Ok(Variable::from_op(
        "rms_norm",
        value,
        vec![x.clone(), weight.clone()],
        move |p, _, g| {
            let mut dx = buf("rms_norm (vjp)", g.numel())?;
            let mut dw = p[1]
                .requires_grad()
                .then(|| zeroed("rms_norm (vjp)", d))
                .transpose()?;
            k::rms_norm_backward(
                &p[0].value().read(),
                &p[1].value().read(),
                &rstd.read(),
                &g.read(),
                &mut dx,
                dw.as_deref_mut(),
            );
            Ok(vec![
                p[0].requires_grad()
                    .then(|| gradient(dx, g.shape().clone())),
                dw.map(|dw| gradient(dw, [d])),
            ])
        },
    ))
}
