//! Row softmax and the causal, scaled softmax of materialized attention.

use super::{activation, buf, gradient};
use crate::error::Result;
use crate::variable::Variable;
use riftco_kernels::attention::{causal_softmax_rows, AttentionDims};
use riftco_kernels::softmax::{softmax_rows, softmax_rows_backward};
use riftco_tensor::TensorError;

/// Softmax over the last axis. VJP: `dx = y ⊙ (g − Σ g⊙y)`.
///
/// # Errors
/// Scalar or zero-sized last axis.
pub fn softmax(x: &Variable) -> Result<Variable> {
    let cols = x.dims().last().copied().unwrap_or(0);
    if cols == 0 {
        return Err(TensorError::ZeroSized {
            op: "softmax",
            shape: x.dims().to_vec(),
        }
        .into());
    }
    let mut out = buf("softmax", x.value().numel())?;
    softmax_rows(&x.value().read(), cols, &mut out);
    let value = activation(out, x.value().shape().clone());
    Ok(Variable::from_op(
        "softmax",
        value,
        vec![x.clone()],
        move |_, y, g| {
            let mut d = buf("softmax (vjp)", g.numel())?;
            softmax_rows_backward(&y.read(), &g.read(), cols, &mut d);
            Ok(vec![Some(gradient(d, g.shape().clone()))])
        },
    ))
}

/// Attention probabilities from raw scores `[..., seq_q, seq_k]`: `softmax(scale · s)` where,
/// with `causal`, query `i` sees keys `j <= i + (seq_k − seq_q)` and masked entries are exactly 0.
/// VJP: `ds = scale · y ⊙ (g − Σ g⊙y)` (masked entries get 0 because `y = 0` there).
///
/// # Errors
/// Rank below 2 or zero-sized axes.
pub fn causal_softmax(scores: &Variable, scale: f32, causal: bool) -> Result<Variable> {
    let d = scores.dims().to_vec();
    if d.len() < 2 || d.contains(&0) {
        return Err(TensorError::ShapeMismatch {
            op: "causal_softmax (expected [..., seq_q, seq_k])",
            expected: vec![1, 1],
            got: d,
        }
        .into());
    }
    let (sq, sk) = (d[d.len() - 2], d[d.len() - 1]);
    if causal && sq > sk {
        return Err(TensorError::InvalidArgument {
            op: "causal_softmax",
            message: format!("seq_q {sq} exceeds seq_k {sk}: some queries would see no key"),
        }
        .into());
    }
    let rows = scores.value().numel() / sk;
    let dims = AttentionDims {
        batch: rows / sq,
        n_heads: 1,
        seq_q: sq,
        seq_k: sk,
        d_head: 1,
    };
    let mut out = buf("causal_softmax", scores.value().numel())?;
    causal_softmax_rows(&scores.value().read(), dims, scale, causal, &mut out);
    let value = activation(out, scores.value().shape().clone());
    Ok(Variable::from_op(
        "causal_softmax",
        value,
        vec![scores.clone()],
        move |_, y, g| {
            let mut dx = buf("causal_softmax (vjp)", g.numel())?;
            softmax_rows_backward(&y.read(), &g.read(), sk, &mut dx);
            if scale != 1.0 {
                for v in dx.iter_mut() {
                    *v *= scale;
                }
            }
            Ok(vec![Some(gradient(dx, g.shape().clone()))])
        },
    ))
}
