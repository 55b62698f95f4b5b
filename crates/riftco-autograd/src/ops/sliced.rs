//! Ops over a frozen `[vocab, d_model]` weight that is never whole in memory: the caller
//! fetches it a slice of vocabulary rows at a time, in order, each slice once per op (a tied
//! embedding sharded over data-parallel processes and gathered by slices). Host tensors only.

use super::{output_shape, ACT, GRAD};
use crate::error::Result;
use crate::variable::{Saves, Variable};
use riftco_tensor::sliced_head::{embedding_rows_from_slice, SlicedHeadLoss};
use riftco_tensor::{Tensor, TensorError};
use std::ops::Range;

/// Fetches rows `range` of the frozen weight as a `[range.len(), d_model]` tensor (f32,
/// 16-bit or quantized storage, on the host).
pub type FetchRows<'a> = &'a mut dyn FnMut(Range<usize>) -> Result<Tensor>;

/// The slices `0..vocab` in order, `slice_rows` rows each (the last fewer).
fn slices(vocab: usize, slice_rows: usize) -> impl Iterator<Item = Range<usize>> {
    (0..vocab)
        .step_by(slice_rows)
        .map(move |s| s..(s + slice_rows).min(vocab))
}

fn check_slice_rows(op: &'static str, slice_rows: usize, vocab: usize) -> Result<()> {
    if slice_rows == 0 || vocab == 0 {
        return Err(TensorError::InvalidArgument {
            op,
            message: format!(
                "slices need at least 1 row and the weight at least 1 row; got {slice_rows} \
                 rows per slice of {vocab}"
            ),
        }
        .into());
    }
    Ok(())
}

/// [`super::linear_cross_entropy`] of `x [rows, d_model]` against `targets [rows]` under a
/// frozen head of `vocab` rows that `fetch` gives `slice_rows` rows at a time (each slice
/// fetched once, in order): the mean cross-entropy, a scalar, in one pass with an online
/// logsumexp (`riftco_kernels::linear_loss::sliced`, whose rounding it shares: within f32
/// rounding of the unsliced op, not bitwise). `∂loss/∂x` is computed during the forward (no
/// slice is fetched again in the backward pass); the head gets no gradient. The logits of a
/// pass stay within `workspace_bytes`.
///
/// # Errors
/// Shape errors (`x` not `[targets.len() >= 1, d]`, a fetched slice not `[rows, d]`), a
/// target `>= vocab`, `slice_rows == 0`, `x` on a device; `fetch`'s errors unchanged.
pub fn sliced_linear_cross_entropy(
    x: &Variable,
    vocab: usize,
    targets: &[u32],
    slice_rows: usize,
    workspace_bytes: u64,
    fetch: FetchRows<'_>,
) -> Result<Variable> {
    const OP: &str = "sliced_linear_cross_entropy";
    check_slice_rows(OP, slice_rows, vocab)?;
    if let Some(&bad) = targets.iter().find(|&&t| t as usize >= vocab) {
        return Err(TensorError::TokenOutOfRange {
            op: OP,
            what: "target",
            token: bad,
            vocab_size: vocab,
        }
        .into());
    }
    let with_dx = crate::grad_mode::is_grad_enabled() && x.requires_grad();
    let mut state = SlicedHeadLoss::new(
        OP,
        x.value(),
        targets,
        vocab,
        slice_rows,
        workspace_bytes,
        with_dx,
    )?;
    for range in slices(vocab, slice_rows) {
        let w = fetch(range)?;
        state.absorb(&w)?;
    }
    let (loss, dx) = state.finish(ACT)?;
    Ok(Variable::from_op_saving(
        OP,
        loss,
        vec![x.clone()],
        Saves::NOTHING,
        move |_, _, g| {
            let Some(dx) = dx.as_ref() else {
                return Ok(vec![None]);
            };
            let be = dx.backend()?;
            let gv = g.to_host()?.first().copied().unwrap_or(0.0);
            let out = match gv == 1.0 {
                true => be.copy("sliced_linear_cross_entropy (vjp)", dx, GRAD)?,
                false => be.scale("sliced_linear_cross_entropy (vjp)", dx, gv, GRAD)?,
            };
            Ok(vec![Some(out)])
        },
    ))
}

/// The rows `ids` of a frozen table of `vocab` rows of `d_model` that `fetch` gives
/// `slice_rows` rows at a time (every slice fetched once, in order, whichever ids there are:
/// callers on several processes make the same fetches): `[ids.len(), d_model]` f32, bitwise the
/// rows [`super::embedding()`] would read (16-bit rows upcast, quantized rows dequantized). A
/// constant: the table gets no gradient.
///
/// # Errors
/// An id `>= vocab`, `slice_rows == 0`, a fetched slice not `[rows, d_model]`; `fetch`'s
/// errors unchanged.
pub fn sliced_embedding(
    ids: &[u32],
    vocab: usize,
    d_model: usize,
    slice_rows: usize,
    fetch: FetchRows<'_>,
) -> Result<Variable> {
    const OP: &str = "sliced_embedding";
    check_slice_rows(OP, slice_rows, vocab)?;
    if let Some(&bad) = ids.iter().find(|&&i| i as usize >= vocab) {
        return Err(TensorError::TokenOutOfRange {
            op: OP,
            what: "token id",
            token: bad,
            vocab_size: vocab,
        }
        .into());
    }
    let shape = output_shape(OP, [ids.len(), d_model])?;
    let out = Tensor::try_zeros(shape, ACT)?;
    for range in slices(vocab, slice_rows) {
        let start = range.start;
        let w = fetch(range)?;
        embedding_rows_from_slice(OP, &out, ids, start, &w)?;
    }
    Ok(Variable::constant(out))
}
