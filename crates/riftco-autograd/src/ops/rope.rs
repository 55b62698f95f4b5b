//! Rotary position embedding (Su et al. 2021) with the rotate-half pairing.

use super::{activation, buf, gradient};
use crate::error::Result;
use crate::variable::Variable;
use riftco_kernels::rope::{rope as rope_kernel, RopeTable};
use riftco_tensor::TensorError;
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
    let mut out = buf("rope", x.value().numel())?;
    rope_kernel(
        table,
        &x.value().read(),
        seq,
        heads,
        start_pos,
        false,
        &mut out,
    );
    let value = activation(out, x.value().shape().clone());
    let table = table.clone();
    Ok(Variable::from_op(
        "rope",
        value,
        vec![x.clone()],
        move |_, _, g| {
            let mut d = buf("rope (vjp)", g.numel())?;
            rope_kernel(&table, &g.read(), seq, heads, start_pos, true, &mut d);
            Ok(vec![Some(gradient(d, g.shape().clone()))])
        },
    ))
}
