//! Token embedding lookup.

use super::{activation, buf, gradient, output_shape, zeroed};
use crate::error::Result;
use crate::variable::Variable;
use riftco_kernels::embedding as k;
use riftco_tensor::TensorError;
use std::sync::Arc;

/// `out[i, :] = table[ids[i], :]`, table `[vocab, d]`, result `[ids.len(), d]` (reshape as
/// needed). VJP: scatter-add of the gradient rows into `dtable`.
///
/// # Errors
/// An id `>= vocab` (names the id), or a table that is not 2-D.
pub fn embedding(table: &Variable, ids: &[u32]) -> Result<Variable> {
    let td = table.dims();
    if td.len() != 2 {
        return Err(TensorError::RankMismatch {
            op: "embedding (table)",
            expected: 2,
            got: td.to_vec(),
        }
        .into());
    }
    let (vocab, d) = (td[0], td[1]);
    if let Some(&bad) = ids.iter().find(|&&i| i as usize >= vocab) {
        return Err(TensorError::TokenOutOfRange {
            op: "embedding",
            what: "token id",
            token: bad,
            vocab_size: vocab,
        }
        .into());
    }
    let shape = output_shape("embedding", [ids.len(), d])?;
    let mut out = buf("embedding", shape.numel())?;
    k::embedding(&table.value().read(), d, ids, &mut out);
    let value = activation(out, shape);
    let ids: Arc<[u32]> = ids.into();
    Ok(Variable::from_op(
        "embedding",
        value,
        vec![table.clone()],
        move |p, _, g| {
            // The table's own element count (a valid shape).
            let mut dt = zeroed("embedding (vjp)", vocab * d)?;
            k::embedding_backward(&ids, &g.read(), d, &mut dt);
            Ok(vec![Some(gradient(dt, p[0].value().shape().clone()))])
        },
    ))
}
