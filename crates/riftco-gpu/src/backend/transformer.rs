//! The transformer ops of the GPU backend: SiLU / SwiGLU and their VJPs, RMSNorm (+ VJP),
//! RoPE, row softmax and its VJP, the causal softmax of materialized attention, dropout,
//! embedding (+ VJP) and cross-entropy (+ VJP), one kernel of `crate::kernels` each (their
//! math and tolerances vs the CPU kernels are documented there and in `docs/metal.md`).
//! Outputs have the shapes of the CPU backend's; a length that disagrees with the shape
//! arguments is the kernel's `GpuError::Shape`, returned as `TensorError::InvalidArgument`
//! naming the op and the values.

use riftco_tensor::backend::{AttentionDims, DropoutMask, Pair, RopeTable};
use riftco_tensor::{MemoryCategory, Result, Shape, Tensor, TensorError};

use super::GpuBackend;
use crate::kernels;

/// The rows of `x` read as `[rows, cols]`, or the CPU-style error naming both.
fn rows_of(op: &'static str, x: &Tensor, cols: usize) -> Result<usize> {
    if cols == 0 || x.numel() % cols != 0 {
        return Err(TensorError::InvalidArgument {
            op,
            message: format!(
                "{} elements (shape {:?}) are not rows of cols = {cols} (expected cols > 0 dividing the length)",
                x.numel(),
                x.dims()
            ),
        });
    }
    Ok(x.numel() / cols)
}

pub(super) fn silu(
    g: &GpuBackend,
    op: &'static str,
    x: &Tensor,
    c: MemoryCategory,
) -> Result<Tensor> {
    let r = g.read(op, &[x])?;
    let out = kernels::silu(&g.ctx, r.get(0)).map_err(g.err(op))?;
    g.tensor(out, x.shape().clone(), c)
}

pub(super) fn silu_backward(
    g: &GpuBackend,
    op: &'static str,
    x: &Tensor,
    dy: &Tensor,
    c: MemoryCategory,
) -> Result<Tensor> {
    let r = g.read(op, &[x, dy])?;
    let dx = kernels::silu_backward(&g.ctx, r.get(0), r.get(1)).map_err(g.err(op))?;
    g.tensor(dx, dy.shape().clone(), c)
}

pub(super) fn swiglu(
    g: &GpuBackend,
    op: &'static str,
    gate: &Tensor,
    up: &Tensor,
    c: MemoryCategory,
) -> Result<Tensor> {
    let r = g.read(op, &[gate, up])?;
    let out = kernels::swiglu(&g.ctx, r.get(0), r.get(1)).map_err(g.err(op))?;
    g.tensor(out, gate.shape().clone(), c)
}

pub(super) fn swiglu_backward(
    g: &GpuBackend,
    op: &'static str,
    gate: &Tensor,
    up: &Tensor,
    dy: &Tensor,
    c: MemoryCategory,
) -> Result<Pair> {
    let r = g.read(op, &[gate, up, dy])?;
    let (dg, du) =
        kernels::swiglu_backward(&g.ctx, r.get(0), r.get(1), r.get(2)).map_err(g.err(op))?;
    Ok((
        g.tensor(dg, dy.shape().clone(), c)?,
        g.tensor(du, dy.shape().clone(), c)?,
    ))
}

pub(super) fn swiglu_backward_in_place(
    g: &GpuBackend,
    op: &'static str,
    gate: &Tensor,
    up: &Tensor,
    dy: &Tensor,
    c: MemoryCategory,
) -> Result<Tensor> {
    riftco_tensor::backend::check_in_place_target(op, dy, &[gate, up])?;
    let r = g.read(op, &[gate, up])?;
    let du = {
        let guard = dy.buffer_mut();
        kernels::swiglu_backward_in_place(&g.ctx, r.get(0), r.get(1), g.own_buffer(op, &guard)?)
            .map_err(g.err(op))?
    };
    g.tensor(du, dy.shape().clone(), c)
}

pub(super) fn rms_norm(
    g: &GpuBackend,
    op: &'static str,
    x: &Tensor,
    weight: &Tensor,
    eps: f32,
    c: MemoryCategory,
) -> Result<Pair> {
    let rows = rows_of(op, x, weight.numel())?;
    let r = g.read(op, &[x, weight])?;
    let (y, rstd) = kernels::rms_norm(&g.ctx, r.get(0), r.get(1), eps).map_err(g.err(op))?;
    Ok((
        g.tensor(y, x.shape().clone(), c)?,
        g.tensor(rstd, Shape::from([rows]), c)?,
    ))
}

/// `(dx, dweight)`; the kernel's `dweight` is a fresh sum over the rows, which is what the CPU
/// backend returns too (its kernel adds into a zeroed buffer).
#[allow(clippy::too_many_arguments)]
pub(super) fn rms_norm_backward(
    g: &GpuBackend,
    op: &'static str,
    x: &Tensor,
    weight: &Tensor,
    rstd: &Tensor,
    dy: &Tensor,
    weight_grad: bool,
    c: MemoryCategory,
) -> Result<(Tensor, Option<Tensor>)> {
    let r = g.read(op, &[x, weight, rstd, dy])?;
    let (dx, dw) = kernels::rms_norm_backward(&g.ctx, r.get(0), r.get(1), r.get(2), r.get(3))
        .map_err(g.err(op))?;
    let dx = g.tensor(dx, dy.shape().clone(), c)?;
    let dw = if weight_grad {
        Some(g.tensor(dw, Shape::from([weight.numel()]), c)?)
    } else {
        None
    };
    Ok((dx, dw))
}

/// RoPE; the table's `cos`/`sin` (`[max_positions, d_head/2]` each) are uploaded on its first
/// call and then read from the backend's cache (keyed by [`RopeTable::id`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn rope(
    g: &GpuBackend,
    op: &'static str,
    x: &Tensor,
    table: &RopeTable,
    seq: usize,
    heads: usize,
    start_pos: usize,
    inverse: bool,
    c: MemoryCategory,
) -> Result<Tensor> {
    let t = g.rope_tables.get(&g.ctx, table).map_err(g.err(op))?;
    let r = g.read(op, &[x])?;
    let out =
        kernels::rope(&g.ctx, &t, r.get(0), seq, heads, start_pos, inverse).map_err(g.err(op))?;
    g.tensor(out, x.shape().clone(), c)
}

pub(super) fn softmax(
    g: &GpuBackend,
    op: &'static str,
    x: &Tensor,
    cols: usize,
    c: MemoryCategory,
) -> Result<Tensor> {
    let rows = rows_of(op, x, cols)?;
    let r = g.read(op, &[x])?;
    let y = kernels::softmax_rows(&g.ctx, r.get(0), rows, cols).map_err(g.err(op))?;
    g.tensor(y, x.shape().clone(), c)
}

/// `scale · y ⊙ (dy − Σ dy·y)`: the VJP kernel, then one multiply by `scale` when it is not 1
/// (the CPU's order of operations).
pub(super) fn softmax_backward(
    g: &GpuBackend,
    op: &'static str,
    y: &Tensor,
    dy: &Tensor,
    cols: usize,
    scale: f32,
    c: MemoryCategory,
) -> Result<Tensor> {
    rows_of(op, y, cols)?;
    let r = g.read(op, &[y, dy])?;
    let mut dx =
        kernels::softmax_rows_backward(&g.ctx, r.get(0), r.get(1), cols).map_err(g.err(op))?;
    if scale != 1.0 {
        dx = kernels::scale(&g.ctx, &dx, scale).map_err(g.err(op))?;
    }
    g.tensor(dx, dy.shape().clone(), c)
}

pub(super) fn causal_softmax(
    g: &GpuBackend,
    op: &'static str,
    scores: &Tensor,
    dims: AttentionDims,
    scale: f32,
    causal: bool,
    c: MemoryCategory,
) -> Result<Tensor> {
    let r = g.read(op, &[scores])?;
    let p =
        kernels::causal_softmax_rows(&g.ctx, r.get(0), dims, scale, causal).map_err(g.err(op))?;
    g.tensor(p, scores.shape().clone(), c)
}

pub(super) fn dropout(
    g: &GpuBackend,
    op: &'static str,
    x: &Tensor,
    mask: &DropoutMask,
    c: MemoryCategory,
) -> Result<Tensor> {
    riftco_tensor::backend::check_dropout(op, Some(mask))?;
    let r = g.read(op, &[x])?;
    let out = kernels::dropout(&g.ctx, r.get(0), mask).map_err(g.err(op))?;
    g.tensor(out, x.shape().clone(), c)
}

pub(super) fn embedding(
    g: &GpuBackend,
    op: &'static str,
    table: &Tensor,
    ids: &[u32],
    c: MemoryCategory,
) -> Result<Tensor> {
    let &[_, d] = table.dims() else {
        return Err(TensorError::InvalidArgument {
            op,
            message: format!("table of shape {:?}, expected [vocab, d]", table.dims()),
        });
    };
    let shape = Shape::try_new(op, [ids.len(), d])?;
    let r = g.read(op, &[table])?;
    let out = kernels::embedding(&g.ctx, r.get(0), d, ids).map_err(g.err(op))?;
    g.tensor(out, shape, c)
}

/// The table gradient `[vocab, d]`: the kernel's fresh sums, as the CPU backend's (zeros plus
/// each row of `dy` at its id, in increasing position).
pub(super) fn embedding_backward(
    g: &GpuBackend,
    op: &'static str,
    ids: &[u32],
    dy: &Tensor,
    vocab: usize,
    c: MemoryCategory,
) -> Result<Tensor> {
    let d = dy.dims().last().copied().unwrap_or(0);
    let shape = Shape::try_new(op, [vocab, d])?;
    let r = g.read(op, &[dy])?;
    let dt = kernels::embedding_backward(&g.ctx, ids, r.get(0), d, vocab).map_err(g.err(op))?;
    g.tensor(dt, shape, c)
}

pub(super) fn cross_entropy(
    g: &GpuBackend,
    op: &'static str,
    logits: &Tensor,
    targets: &[u32],
    c: MemoryCategory,
) -> Result<Pair> {
    let vocab = logits.dims().last().copied().unwrap_or(0);
    let r = g.read(op, &[logits])?;
    let (loss, lse) =
        kernels::cross_entropy(&g.ctx, r.get(0), targets, vocab).map_err(g.err(op))?;
    Ok((
        g.tensor(loss, Shape::scalar(), c)?,
        g.tensor(lse, Shape::from([targets.len()]), c)?,
    ))
}

/// `dlogits = (softmax(z) − onehot(t)) / rows · g`. The upstream scalar `g` stays on the
/// device (no read-back): the kernel runs with `grad = 1`, then one broadcasting multiply by
/// `g`, which is exact when `g = 1` (the loss's own seed).
#[allow(clippy::too_many_arguments)]
pub(super) fn cross_entropy_backward(
    g: &GpuBackend,
    op: &'static str,
    logits: &Tensor,
    targets: &[u32],
    lse: &Tensor,
    dy: &Tensor,
    c: MemoryCategory,
) -> Result<Tensor> {
    if dy.numel() != 1 {
        return Err(TensorError::InvalidArgument {
            op,
            message: format!(
                "upstream gradient of shape {:?}, expected one value (the loss is a scalar)",
                dy.dims()
            ),
        });
    }
    let vocab = logits.dims().last().copied().unwrap_or(0);
    let r = g.read(op, &[logits, lse, dy])?;
    let d =
        kernels::cross_entropy_backward_by(&g.ctx, r.get(0), targets, r.get(1), vocab, r.get(2))
            .map_err(g.err(op))?;
    g.tensor(d, logits.shape().clone(), c)
}
