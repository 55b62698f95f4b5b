//! Token embedding lookup.

use super::{backend, output_shape, ACT, GRAD};
use crate::error::Result;
use crate::variable::{Saves, Variable};
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
    // The output's element count, checked before any allocation.
    output_shape("embedding", [ids.len(), d])?;
    let be = backend("embedding", &[table])?;
    let value = be.embedding("embedding", table.value(), ids, ACT)?;
    let ids: Arc<[u32]> = ids.into();
    Ok(Variable::from_op_saving(
        "embedding",
        value,
        vec![table.clone()],
        Saves::NOTHING,
        move |_, _, g| {
            // The table's own element count (a valid shape).
            let dt = be.embedding_backward("embedding (vjp)", &ids, g, vocab, GRAD)?;
            Ok(vec![Some(dt)])
        },
    ))
}
