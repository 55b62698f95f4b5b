//! Mean softmax cross-entropy with logits.

use super::{backend, ACT, GRAD};
use crate::error::Result;
use crate::variable::{Saves, Variable};
use riftco_tensor::TensorError;
use std::sync::Arc;

/// `mean_r (logsumexp(z_r) − z_r[t_r])` over rows of `logits [rows, vocab]`; a scalar. The per-row
/// logsumexp is saved; VJP: `dz = (softmax(z) − onehot(t)) · g / rows`.
///
/// # Errors
/// Logits not 2-D, `targets.len() != rows`, no rows, or a target `>= vocab`.
pub fn cross_entropy(logits: &Variable, targets: &[u32]) -> Result<Variable> {
    let ld = logits.dims();
    if ld.len() == 2 && ld[0] == targets.len() && (ld[0] == 0 || ld[1] == 0) {
        // Shapes that agree but hold nothing: no rows to average, or no classes.
        return Err(TensorError::ZeroSized {
            op: "cross_entropy (logits [rows, vocab]: no rows or no classes)",
            shape: ld.to_vec(),
        }
        .into());
    }
    if ld.len() != 2 || ld[0] != targets.len() {
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
    Ok(Variable::from_op_saving(
        "cross_entropy",
        value,
        vec![logits.clone()],
        Saves::parents(&[0]),
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

/// The LM head and the mean cross-entropy fused: `cross_entropy(linear(x, W), targets)` for
/// hidden states `x [rows, d]` and a head `W [vocab, d]`, computed `chunk_rows` rows at a time
/// so that the `[rows, vocab]` logits and their gradient never exist whole (at most
/// `chunk_rows · vocab` logits at a time, in workspace memory). A scalar Variable.
///
/// The chunked scheme is Liger Kernel's fused linear cross-entropy (Hsu et al. 2024, §3.2):
/// while a graph is recorded, the forward pass also computes the loss's gradients with respect
/// to `x` and to `W` (each only when that operand requires grad: a frozen head costs no
/// weight-gradient work), and the node keeps them instead of the logits; the VJP scales them by
/// the upstream gradient (a copy for an upstream gradient of 1, so a second `backward()` gives
/// the same gradients). The loss and `dx` equal [`cross_entropy`] of [`crate::ops::linear`]
/// within the rounding of the products (a chunk's product may sum a row in another order than
/// the whole product; bitwise with one chunk of all rows); `dW` sums the rows chunk by chunk.
///
/// # Errors
/// `x` not 2-D, `W` not `[vocab, d]` with `x`'s `d`, `targets.len() != rows`, no rows,
/// `chunk_rows == 0`, or a target `>= vocab`.
pub fn linear_cross_entropy(
    x: &Variable,
    w: &Variable,
    targets: &[u32],
    chunk_rows: usize,
) -> Result<Variable> {
    const OP: &str = "linear_cross_entropy";
    let (xd, wd) = (x.dims(), w.dims());
    if xd.len() == 2 && xd[0] == targets.len() && xd[0] == 0 {
        return Err(TensorError::ZeroSized {
            op: "linear_cross_entropy (x [rows, d]: no rows)",
            shape: xd.to_vec(),
        }
        .into());
    }
    if xd.len() != 2 || xd[0] != targets.len() {
        return Err(TensorError::ShapeMismatch {
            op: "linear_cross_entropy (x [rows, d] vs targets [rows])",
            expected: vec![targets.len(), xd.last().copied().unwrap_or(0)],
            got: xd.to_vec(),
        }
        .into());
    }
    if wd.len() != 2 || wd[1] != xd[1] || wd[0] == 0 {
        return Err(TensorError::ShapeMismatch {
            op: "linear_cross_entropy (W [vocab, d] vs x [rows, d])",
            expected: vec![wd.first().copied().unwrap_or(0).max(1), xd[1]],
            got: wd.to_vec(),
        }
        .into());
    }
    if chunk_rows == 0 {
        return Err(TensorError::InvalidArgument {
            op: OP,
            message: "chunk_rows must be at least 1, got 0".into(),
        }
        .into());
    }
    let vocab = wd[0];
    if let Some(&bad) = targets.iter().find(|&&t| t as usize >= vocab) {
        return Err(TensorError::TokenOutOfRange {
            op: OP,
            what: "target",
            token: bad,
            vocab_size: vocab,
        }
        .into());
    }
    let be = backend(OP, &[x, w])?;
    let recording = crate::grad_mode::is_grad_enabled();
    let want = [
        recording && x.requires_grad(),
        recording && w.requires_grad(),
    ];
    let out = be.linear_cross_entropy(OP, x.value(), w.value(), targets, chunk_rows, want, ACT)?;
    let saved = [out.d_first, out.d_second];
    Ok(Variable::from_op_saving(
        OP,
        out.loss,
        vec![x.clone(), w.clone()],
        Saves::NOTHING,
        move |_, _, g| {
            let gv = g.to_host()?.first().copied().unwrap_or(0.0);
            saved
                .iter()
                .map(|d| {
                    d.as_ref()
                        .map(|d| match gv == 1.0 {
                            true => be.copy("linear_cross_entropy (vjp)", d, GRAD),
                            false => be.scale("linear_cross_entropy (vjp)", d, gv, GRAD),
                        })
                        .transpose()
                        .map_err(Into::into)
                })
                .collect()
        },
    ))
}
