//! Element-wise maps, broadcasting, sums and keepdims reductions of the GPU backend. Shape
//! checks are the CPU backend's (same errors), then one kernel each.

use riftco_kernels::broadcast::broadcasts_to;
use riftco_kernels::reduce::is_reduction_of;
use riftco_tensor::backend::{BinaryOp, ReduceOp, UnaryOp};
use riftco_tensor::{MemoryCategory, Result, Shape, Tensor, TensorError};

use super::GpuBackend;
use crate::kernels;
use crate::{GpuBuffer, GpuContext};

type SameShape = fn(&GpuContext, &GpuBuffer, &GpuBuffer) -> crate::Result<GpuBuffer>;

fn check_len(op: &'static str, t: &Tensor, n: usize, shape: &Tensor) -> Result<()> {
    if t.numel() != n {
        return Err(TensorError::LengthMismatch {
            op,
            shape: shape.dims().to_vec(),
            expected: n,
            got: t.numel(),
        });
    }
    Ok(())
}

/// `a ∘ b` of two operands of one length (add, mul), shape of `a`.
pub(super) fn same_shape(
    g: &GpuBackend,
    op: &'static str,
    kernel: SameShape,
    a: &Tensor,
    b: &Tensor,
    c: MemoryCategory,
) -> Result<Tensor> {
    check_len(op, b, a.numel(), a)?;
    let r = g.read(op, &[a, b])?;
    let out = kernel(&g.ctx, r.get(0), r.get(1)).map_err(g.err(op))?;
    g.tensor(out, a.shape().clone(), c)
}

pub(super) fn scale(
    g: &GpuBackend,
    op: &'static str,
    x: &Tensor,
    alpha: f32,
    c: MemoryCategory,
) -> Result<Tensor> {
    let r = g.read(op, &[x])?;
    let out = kernels::scale(&g.ctx, r.get(0), alpha).map_err(g.err(op))?;
    g.tensor(out, x.shape().clone(), c)
}

/// `dst += x` (`alpha = None`, bitwise the CPU's `a + b`) or `dst += alpha · x`, in place.
pub(super) fn axpy(
    g: &GpuBackend,
    op: &'static str,
    alpha: Option<f32>,
    x: &Tensor,
    dst: &Tensor,
) -> Result<()> {
    check_len(op, x, dst.numel(), dst)?;
    g.in_place(op, dst, x, |s, d| kernels::axpy(&g.ctx, alpha, s, d))
}

/// The sum of all elements as a rank-0 tensor (f32 in a fixed tree order; the CPU sums in
/// f64 in index order).
pub(super) fn sum(
    g: &GpuBackend,
    op: &'static str,
    x: &Tensor,
    c: MemoryCategory,
) -> Result<Tensor> {
    let r = g.read(op, &[x])?;
    let out = kernels::sum(&g.ctx, r.get(0)).map_err(g.err(op))?;
    g.tensor(out, Shape::scalar(), c)
}

pub(super) fn unary(
    g: &GpuBackend,
    op: &'static str,
    kind: UnaryOp,
    x: &Tensor,
    c: MemoryCategory,
) -> Result<Tensor> {
    let r = g.read(op, &[x])?;
    let out = kernels::unary(&g.ctx, kind, r.get(0)).map_err(g.err(op))?;
    g.tensor(out, x.shape().clone(), c)
}

pub(super) fn unary_backward(
    g: &GpuBackend,
    op: &'static str,
    kind: UnaryOp,
    x: &Tensor,
    y: &Tensor,
    dy: &Tensor,
    c: MemoryCategory,
) -> Result<Tensor> {
    let n = dy.numel();
    check_len(op, x, n, dy)?;
    check_len(op, y, n, dy)?;
    let r = g.read(op, &[x, y, dy])?;
    let out =
        kernels::unary_backward(&g.ctx, kind, r.get(0), r.get(1), r.get(2)).map_err(g.err(op))?;
    g.tensor(out, dy.shape().clone(), c)
}

pub(super) fn binary(
    g: &GpuBackend,
    op: &'static str,
    kind: BinaryOp,
    a: &Tensor,
    b: &Tensor,
    out_shape: Shape,
    c: MemoryCategory,
) -> Result<Tensor> {
    for t in [a, b] {
        if !broadcasts_to(t.dims(), out_shape.dims()) {
            return Err(TensorError::ShapeMismatch {
                op,
                expected: out_shape.dims().to_vec(),
                got: t.dims().to_vec(),
            });
        }
    }
    let r = g.read(op, &[a, b])?;
    let out = kernels::binary(
        &g.ctx,
        kind,
        r.get(0),
        a.dims(),
        r.get(1),
        b.dims(),
        out_shape.dims(),
    )
    .map_err(g.err(op))?;
    g.tensor(out, out_shape, c)
}

pub(super) fn reduce(
    g: &GpuBackend,
    op: &'static str,
    kind: ReduceOp,
    x: &Tensor,
    out_shape: Shape,
    c: MemoryCategory,
) -> Result<Tensor> {
    if !is_reduction_of(x.dims(), out_shape.dims()) {
        return Err(TensorError::ShapeMismatch {
            op,
            expected: x.dims().to_vec(),
            got: out_shape.dims().to_vec(),
        });
    }
    let r = g.read(op, &[x])?;
    let out = kernels::reduce_axes(&g.ctx, kind, r.get(0), x.dims(), out_shape.dims())
        .map_err(g.err(op))?;
    g.tensor(out, out_shape, c)
}
