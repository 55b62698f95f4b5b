//! Row softmax and the causal, scaled softmax of materialized attention.

use super::{backend, ACT, GRAD};
use crate::error::Result;
use crate::variable::{Saves, Variable};
use riftco_tensor::backend::AttentionDims;
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
    let be = backend("softmax", &[x])?;
    let value = be.softmax("softmax", x.value(), cols, ACT)?;
    Ok(Variable::from_op_saving(
        "softmax",
        value,
        vec![x.clone()],
        Saves::NOTHING.and_output(),
        move |_, y, g| {
            let d = be.softmax_backward("softmax (vjp)", y, g, cols, 1.0, GRAD)?;
            Ok(vec![Some(d)])
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
        n_kv_heads: 1,
        seq_q: sq,
        seq_k: sk,
        d_head: 1,
    };
    let be = backend("causal_softmax", &[scores])?;
    let value = be.causal_softmax("causal_softmax", scores.value(), dims, scale, causal, ACT)?;
    Ok(Variable::from_op_saving(
        "causal_softmax",
        value,
        vec![scores.clone()],
        Saves::NOTHING.and_output(),
        move |_, y, g| {
            let dx = be.softmax_backward("causal_softmax (vjp)", y, g, sk, scale, GRAD)?;
            Ok(vec![Some(dx)])
        },
    ))
}
