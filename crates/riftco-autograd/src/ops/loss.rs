//! Mean softmax cross-entropy with logits.

use super::{backend, ACT, GRAD};
use crate::error::Result;
use crate::variable::Variable;
use riftco_tensor::TensorError;
use std::sync::Arc;

/// `mean_r (logsumexp(z_r) − z_r[t_r])` over rows of `logits [rows, vocab]`; a scalar. The per-row
/// logsumexp is saved; VJP: `dz = (softmax(z) − onehot(t)) · g / rows`.
///
/// # Errors
/// Logits not 2-D, `targets.len() != rows`, no rows, or a target `>= vocab`.
pub fn cross_entropy(logits: &Variable, targets: &[u32]) -> Result<Variable> {
    let ld = logits.dims();
    if ld.len() != 2 || ld[0] != targets.len() || ld[0] == 0 || ld[1] == 0 {
        return Err(TensorError::ShapeMismatch {
            op: "cross_entropy (logits [rows, vocab] vs targets [rows])",
            expected: vec![targets.len(), ld.last().copied().unwrap_or(0)],
            got: ld.to_vec(),
        }
        .into());
    }
    let vocab = ld[1];
    if let Some(&bad) = targets.iter().find(|&&t| t as usize >= vocab) {
        return Err(TensorError::TokenOutOfRange {
            op: "cross_entropy",
            what: "target",
            token: bad,
            vocab_size: vocab,
        }
        .into());
    }
    let be = backend("cross_entropy", &[logits])?;
    let (value, lse) = be.cross_entropy("cross_entropy", logits.value(), targets, ACT)?;
    let targets: Arc<[u32]> = targets.into();
    Ok(Variable::from_op(
        "cross_entropy",
        value,
        vec![logits.clone()],
        move |p, _, g| {
            let d = be.cross_entropy_backward(
                "cross_entropy (vjp)",
                p[0].value(),
                &targets,
                &lse,
                g,
                GRAD,
            )?;
            Ok(vec![Some(d)])
        },
    ))
}
