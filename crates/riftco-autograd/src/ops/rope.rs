//! Rotary position embedding (Su et al. 2021) with the rotate-half pairing.

use super::{backend, ACT, GRAD};
use crate::error::Result;
use crate::variable::{Saves, Variable};
use riftco_tensor::backend::RopeTable;
use riftco_tensor::{Tensor, TensorError};
use std::sync::Arc;

/// Rotates `x [batch, seq, n_heads, d_head]`; the token at sequence index `s` has position
/// `start_pos + s`. VJP: the inverse rotation of the gradient.
///
/// # Errors
/// Rank or `d_head` mismatch with the table, or positions beyond the table.
pub fn rope(x: &Variable, table: &Arc<RopeTable>, start_pos: usize) -> Result<Variable> {
    let xd = x.dims().to_vec();
    if xd.len() != 4 || xd[3] != table.d_head {
        return Err(TensorError::ShapeMismatch {
            op: "rope (expected [batch, seq, n_heads, d_head])",
            expected: vec![0, 0, 0, table.d_head],
            got: xd,
        }
        .into());
    }
    let (seq, heads) = (xd[1], xd[2]);
    match start_pos.checked_add(seq) {
        Some(end) if end <= table.max_positions => {}
        _ => {
            return Err(TensorError::IndexOutOfRange {
                op: "rope",
                what: "position",
                index: start_pos.saturating_add(seq.saturating_sub(1)),
                bound: table.max_positions,
            }
            .into())
        }
    }
    let be = backend("rope", &[x])?;
    if x.value().numel() == 0 {
        // Nothing to rotate (batch, seq or n_heads is 0): an empty output, an empty VJP.
        let buffer = be.alloc("rope", 0, None)?;
        let value = Tensor::from_buffer(buffer, x.value().shape().clone(), be.device(), ACT)?;
        return Ok(Variable::from_op_saving(
            "rope",
            value,
            vec![x.clone()],
            Saves::NOTHING,
            |_, _, g| Ok(vec![Some(g.clone())]),
        ));
    }
    let value = be.rope("rope", x.value(), table, seq, heads, start_pos, false, ACT)?;
    let table = table.clone();
    Ok(Variable::from_op_saving(
        "rope",
        value,
        vec![x.clone()],
        Saves::NOTHING,
        move |_, _, g| {
            let d = be.rope("rope (vjp)", g, &table, seq, heads, start_pos, true, GRAD)?;
            Ok(vec![Some(d)])
        },
    ))
}
