//! The causal (masked, scaled) softmax of materialized attention and the softmax VJP
//! (`shaders/masked_softmax.wgsl`): the GPU twins of
//! `riftco_kernels::attention::causal_softmax_rows` and
//! `riftco_kernels::softmax::softmax_rows_backward`.
//!
//! Causal mask (as the CPU attention kernels): query `i` may attend key `j` iff
//! `j <= i + (seq_k − seq_q)` (queries are the last `seq_q` positions); masked entries are
//! exactly 0, and a row with no allowed key is all 0. Row sums use a fixed tree of 256 strided
//! partials, not the CPU order.

use riftco_kernels::attention::AttentionDims;

use super::shape::{grid_rows, positive, product};
use super::{dispatch, dispatch_at, expect_len, to_u32, words};
use crate::error::Result;
use crate::pipelines::{Family, Kernel};
use crate::pool::GpuBuffer;
use crate::GpuContext;

struct Rows {
    rows: usize,
    cols: usize,
    seq_q: usize,
}

fn params(op: &'static str, r: &Rows, causal: bool, scale: f32) -> Result<Vec<u8>> {
    Ok(words(&[
        to_u32(op, "rows", r.rows)?,
        to_u32(op, "cols", r.cols)?,
        to_u32(op, "seq_q", r.seq_q)?,
        u32::from(causal),
        scale.to_bits(),
        0,
        0,
        0,
    ]))
}

/// The rows of an attention score matrix `[batch · n_heads · seq_q, seq_k]`.
fn attention_rows(op: &'static str, dims: AttentionDims) -> Result<(Rows, usize)> {
    let pairs = product(op, "batch · n_heads", dims.batch, dims.n_heads)?;
    let rows = product(op, "batch · n_heads · seq_q", pairs, dims.seq_q)?;
    let total = product(op, "batch · n_heads · seq_q · seq_k", rows, dims.seq_k)?;
    to_u32(op, "batch · n_heads · seq_q · seq_k", total)?;
    let r = Rows {
        rows,
        cols: dims.seq_k,
        seq_q: dims.seq_q.max(1),
    };
    Ok((r, total))
}

fn backward(
    ctx: &GpuContext,
    op: &'static str,
    y: &GpuBuffer,
    dy: &GpuBuffer,
    r: &Rows,
    scale: f32,
) -> Result<GpuBuffer> {
    let dx = ctx.alloc(y.len())?;
    if y.is_empty() {
        return Ok(dx);
    }
    let kernel = Kernel::new(Family::MaskedSoftmax, "softmax_backward");
    let p = params(op, r, false, scale)?;
    dispatch(ctx, kernel, &[y, dy, &dx], &p, grid_rows(op, r.rows)?)?;
    Ok(dx)
}

/// VJP of row softmax given its output `y` (`[rows, cols]` f32, `rows = y.len() / cols`) and
/// upstream `dy` (same shape): `dx = y ⊙ (dy − Σ_j dy_j y_j)`.
///
/// # Errors
/// [`crate::GpuError::Shape`] when `cols` is 0, `y.len()` is not a multiple of `cols` or
/// `dy.len() != y.len()`; device errors.
pub fn softmax_rows_backward(
    ctx: &GpuContext,
    y: &GpuBuffer,
    dy: &GpuBuffer,
    cols: usize,
) -> Result<GpuBuffer> {
    let op = "softmax_rows_backward";
    positive(op, "cols", cols)?;
    let rows = y.len() / cols;
    expect_len(op, "y", y, product(op, "rows · cols", rows, cols)?)?;
    expect_len(op, "dy", dy, y.len())?;
    to_u32(op, "y length", y.len())?;
    let r = Rows {
        rows,
        cols,
        seq_q: 1,
    };
    backward(ctx, op, y, dy, &r, 1.0)
}

/// Materialized-attention softmax: for `scores` `[batch · n_heads · seq_q, seq_k]` f32 (row
/// `r` is query `r mod seq_q`), returns `probs = softmax(scale · scores)` per row with the
/// causal mask of the module docs when `causal`.
///
/// # Errors
/// [`crate::GpuError::Shape`] when `scores.len()` is not `batch · n_heads · seq_q · seq_k`
/// (or that product overflows the shaders' 32-bit indices); device errors.
pub fn causal_softmax_rows(
    ctx: &GpuContext,
    scores: &GpuBuffer,
    dims: AttentionDims,
    scale: f32,
    causal: bool,
) -> Result<GpuBuffer> {
    let op = "causal_softmax_rows";
    let (r, total) = attention_rows(op, dims)?;
    expect_len(op, "scores", scores, total)?;
    let probs = ctx.alloc(total)?;
    if total == 0 {
        return Ok(probs);
    }
    let kernel = Kernel::new(Family::MaskedSoftmax, op);
    let p = params(op, &r, causal, scale)?;
    let storage = [(0, scores), (2, &probs)];
    dispatch_at(ctx, kernel, &storage, 3, &p, grid_rows(op, r.rows)?)?;
    Ok(probs)
}

/// VJP of [`causal_softmax_rows`] with respect to `scores`, given its output `probs` and
/// upstream `dprobs` (both `[batch · n_heads · seq_q, seq_k]`):
/// `dscores = scale · probs ⊙ (dprobs − Σ_j dprobs_j probs_j)`; masked entries (`probs = 0`)
/// get 0. The CPU has no separate kernel for it: this is `softmax_rows_backward` times `scale`.
///
/// # Errors
/// [`crate::GpuError::Shape`] when `probs` or `dprobs` is not `batch · n_heads · seq_q ·
/// seq_k` long; device errors.
pub fn causal_softmax_rows_backward(
    ctx: &GpuContext,
    probs: &GpuBuffer,
    dprobs: &GpuBuffer,
    dims: AttentionDims,
    scale: f32,
) -> Result<GpuBuffer> {
    let op = "causal_softmax_rows_backward";
    let (r, total) = attention_rows(op, dims)?;
    expect_len(op, "probs", probs, total)?;
    expect_len(op, "dprobs", dprobs, total)?;
    backward(ctx, op, probs, dprobs, &r, scale)
}
