//! Shape ops: reshape (no copy) and swapping axes 1 and 2 of a 4-D tensor (heads layout).

use super::{backend, ACT, GRAD};
use crate::error::Result;
use crate::variable::Variable;
use riftco_tensor::{Shape, TensorError};

/// The same elements with another shape of equal element count (shares storage). VJP: the
/// gradient reshaped back.
///
/// # Errors
/// A shape whose element count overflows (`ShapeOverflow`), or element counts differ.
pub fn reshape(x: &Variable, shape: impl Into<Shape>) -> Result<Variable> {
    let value = x.value().reshape(shape)?;
    let original = x.value().shape().clone();
    Ok(Variable::from_op(
        "reshape",
        value,
        vec![x.clone()],
        move |_, _, g| Ok(vec![Some(g.reshape(original.clone())?)]),
    ))
}

/// `[a, b, c, d] → [a, c, b, d]` (e.g. `[batch, seq, heads, d_head] ↔ [batch, heads, seq,
/// d_head]`). VJP: the same swap of the gradient.
///
/// # Errors
/// Input is not 4-D.
pub fn swap_axes_1_2(x: &Variable) -> Result<Variable> {
    let d = x.dims().to_vec();
    if d.len() != 4 {
        return Err(TensorError::RankMismatch {
            op: "swap_axes_1_2",
            expected: 4,
            got: d,
        }
        .into());
    }
    let dims = [d[0], d[1], d[2], d[3]];
    let be = backend("swap_axes_1_2", &[x])?;
    let value = be.transpose_0213("swap_axes_1_2", x.value(), dims, ACT)?;
    Ok(Variable::from_op(
        "swap_axes_1_2",
        value,
        vec![x.clone()],
        move |_, _, g| {
            let swapped = [dims[0], dims[2], dims[1], dims[3]];
            Ok(vec![Some(be.transpose_0213(
                "swap_axes_1_2 (vjp)",
                g,
                swapped,
                GRAD,
            )?)])
        },
    ))
}
