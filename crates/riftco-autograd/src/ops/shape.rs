//! Shape ops: reshape (no copy) and swapping axes 1 and 2 of a 4-D tensor (heads layout).

use super::{activation, buf, gradient};
use crate::error::Result;
use crate::variable::Variable;
use riftco_kernels::layout::transpose_0213;
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
    let mut out = buf("swap_axes_1_2", x.value().numel())?;
    transpose_0213(&x.value().read(), dims, &mut out);
    let value = activation(out, [d[0], d[2], d[1], d[3]]);
    Ok(Variable::from_op(
        "swap_axes_1_2",
        value,
        vec![x.clone()],
        move |_, _, g| {
            let mut dx = buf("swap_axes_1_2 (vjp)", g.numel())?;
            transpose_0213(&g.read(), [dims[0], dims[2], dims[1], dims[3]], &mut dx);
            Ok(vec![Some(gradient(dx, dims))])
        },
    ))
}
