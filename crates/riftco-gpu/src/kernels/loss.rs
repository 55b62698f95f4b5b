//! Softmax cross-entropy with logits (`shaders/loss.wgsl`), the GPU twin of
//! `riftco_kernels::loss::{cross_entropy, cross_entropy_backward}`:
//! `loss_r = logsumexp(z_r) − z_r[t_r]`, averaged over rows.
//!
//! The targets are host values (`&[u32]`), validated against `vocab` on the host and uploaded
//! with the call. The logsumexp uses a fixed tree of 256 strided partials per row and the mean
//! is the block-tree sum of the row losses ([`super::sum`], in f32; the CPU kernel adds them in
//! f64) times `1 / rows`.

use super::shape::{grid_rows, id_bits, ids_below, positive, product};
use super::{dispatch_at, expect_len, grid_1d, to_u32, words};
use crate::error::Result;
use crate::pipelines::{Family, Kernel};
use crate::pool::GpuBuffer;
use crate::GpuContext;

/// Checks `logits` against `targets` and `vocab`; returns `rows = targets.len()`.
fn check(op: &'static str, logits: &GpuBuffer, targets: &[u32], vocab: usize) -> Result<usize> {
    positive(op, "vocab", vocab)?;
    let rows = targets.len();
    let total = product(op, "rows · vocab", rows, vocab)?;
    expect_len(op, "logits", logits, total)?;
    to_u32(op, "rows · vocab", total)?;
    ids_below(op, "targets", targets, vocab)?;
    Ok(rows)
}

/// Forward; `logits`: `[rows, vocab]` f32 with `rows = targets.len()`. Returns `(loss, lse)`:
/// the mean loss as a one-value buffer (0 when `rows == 0`) and the per-row logsumexp `[rows]`
/// that [`cross_entropy_backward`] reuses.
///
/// # Errors
/// [`crate::GpuError::Shape`] when `vocab` is 0, `logits.len() != rows · vocab`, or a target
/// is `>= vocab` (naming it and its row); device errors.
pub fn cross_entropy(
    ctx: &GpuContext,
    logits: &GpuBuffer,
    targets: &[u32],
    vocab: usize,
) -> Result<(GpuBuffer, GpuBuffer)> {
    let op = "cross_entropy";
    let rows = check(op, logits, targets, vocab)?;
    let lse = ctx.alloc(rows)?;
    if rows == 0 {
        return Ok((ctx.upload(&[0.0])?, lse));
    }
    let row_loss = ctx.alloc(rows)?;
    let targets = ctx.upload(&id_bits(targets))?;
    let params = words(&[to_u32(op, "rows", rows)?, to_u32(op, "vocab", vocab)?, 0, 0]);
    let kernel = Kernel::new(Family::Loss, "cross_entropy_rows");
    let storage = [(0, logits), (1, &targets), (4, &lse), (5, &row_loss)];
    dispatch_at(ctx, kernel, &storage, 7, &params, grid_rows(op, rows)?)?;
    // The mean: the block-tree sum of the row losses (no invocation loops over the rows)
    // times 1 / rows.
    let loss = super::scale(ctx, &super::sum(ctx, &row_loss)?, 1.0 / rows as f32)?;
    Ok((loss, lse))
}

/// Backward of the mean loss times the upstream scalar `grad`:
/// `dlogits = (softmax(z) − onehot(t)) · grad / rows`, with `softmax(z) = exp(z − lse)` from the
/// forward's `lse` (`[rows]`). Returns `[rows, vocab]`.
///
/// # Errors
/// [`crate::GpuError::Shape`] when `targets` is empty, `vocab` is 0, `logits.len() != rows ·
/// vocab`, `lse.len() != rows`, or a target is `>= vocab`; device errors.
pub fn cross_entropy_backward(
    ctx: &GpuContext,
    logits: &GpuBuffer,
    targets: &[u32],
    lse: &GpuBuffer,
    vocab: usize,
    grad: f32,
) -> Result<GpuBuffer> {
    // The device factor 1 leaves the host scale grad / rows exact.
    let one = ctx.upload(&[1.0])?;
    backward(ctx, logits, targets, lse, vocab, grad, &one)
}

/// [`cross_entropy_backward`] with the upstream scalar read on the device from `grad` (one
/// value, e.g. the upstream gradient of an autograd graph): no read-back and no extra pass, the
/// kernel multiplies by `(1 / rows) · grad[0]`.
///
/// # Errors
/// As [`cross_entropy_backward`], and [`crate::GpuError::Shape`] when `grad` is not one value.
pub fn cross_entropy_backward_by(
    ctx: &GpuContext,
    logits: &GpuBuffer,
    targets: &[u32],
    lse: &GpuBuffer,
    vocab: usize,
    grad: &GpuBuffer,
) -> Result<GpuBuffer> {
    expect_len("cross_entropy_backward", "grad", grad, 1)?;
    backward(ctx, logits, targets, lse, vocab, 1.0, grad)
}

/// The backward kernel with `scale = host_grad / rows` (host f32) times `device_grad[0]`.
fn backward(
    ctx: &GpuContext,
    logits: &GpuBuffer,
    targets: &[u32],
    lse: &GpuBuffer,
    vocab: usize,
    host_grad: f32,
    device_grad: &GpuBuffer,
) -> Result<GpuBuffer> {
    let op = "cross_entropy_backward";
    positive(op, "rows (targets)", targets.len())?;
    let rows = check(op, logits, targets, vocab)?;
    expect_len(op, "lse", lse, rows)?;
    let dlogits = ctx.alloc(logits.len())?;
    let targets = ctx.upload(&id_bits(targets))?;
    let scale = host_grad / rows as f32;
    let params = words(&[
        to_u32(op, "rows", rows)?,
        to_u32(op, "vocab", vocab)?,
        scale.to_bits(),
        0,
    ]);
    let kernel = Kernel::new(Family::Loss, op);
    let storage = [
        (0, logits),
        (1, &targets),
        (2, lse),
        (8, device_grad),
        (6, &dlogits),
    ];
    dispatch_at(
        ctx,
        kernel,
        &storage,
        7,
        &params,
        grid_1d(op, logits.len())?,
    )?;
    Ok(dlogits)
}
