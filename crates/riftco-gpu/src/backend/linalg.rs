//! Matrix products and layout ops of the GPU backend: tiled matmul (every `MatmulSpec`
//! transpose, batched), the `[0, 2, 1, 3]` transpose (a strided gather) and strided gather /
//! scatter.

use riftco_tensor::backend::{check_view, MatmulSpec, StridedView};
use riftco_tensor::{MemoryCategory, Result, Shape, Tensor, TensorError};

use super::GpuBackend;
use crate::kernels;

#[allow(clippy::too_many_arguments)]
pub(super) fn batched_matmul(
    g: &GpuBackend,
    op: &'static str,
    batch: usize,
    spec: MatmulSpec,
    a: &Tensor,
    b: &Tensor,
    shape: Shape,
    c: MemoryCategory,
) -> Result<Tensor> {
    let want = batch
        .checked_mul(spec.m)
        .and_then(|v| v.checked_mul(spec.n));
    if want != Some(shape.numel()) {
        return Err(TensorError::LengthMismatch {
            op,
            shape: shape.dims().to_vec(),
            expected: shape.numel(),
            got: want.unwrap_or(usize::MAX),
        });
    }
    let r = g.read(op, &[a, b])?;
    let out =
        kernels::batched_matmul(&g.ctx, batch, spec, r.get(0), r.get(1)).map_err(g.err(op))?;
    g.tensor(out, shape, c)
}

/// `x [d0, d1, d2, d3]` → `[d0, d2, d1, d3]`.
pub(super) fn transpose_0213(
    g: &GpuBackend,
    op: &'static str,
    x: &Tensor,
    dims: [usize; 4],
    c: MemoryCategory,
) -> Result<Tensor> {
    let [d0, d1, d2, d3] = dims;
    let numel = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    if numel != Some(x.numel()) {
        return Err(TensorError::LengthMismatch {
            op,
            shape: dims.to_vec(),
            expected: numel.unwrap_or(usize::MAX),
            got: x.numel(),
        });
    }
    let s = |v: usize| isize::try_from(v).unwrap_or(isize::MAX);
    let view = StridedView {
        dims: vec![d0, d2, d1, d3],
        strides: vec![s(d1 * d2 * d3), s(d3), s(d2 * d3), 1],
        offset: 0,
    };
    gather_strided(g, op, x, &view, c)
}

pub(super) fn gather_strided(
    g: &GpuBackend,
    op: &'static str,
    x: &Tensor,
    view: &StridedView,
    c: MemoryCategory,
) -> Result<Tensor> {
    let shape = check_view(op, view, x.numel())?;
    let r = g.read(op, &[x])?;
    let out = kernels::gather(&g.ctx, r.get(0), &view.dims, &view.strides, view.offset)
        .map_err(g.err(op))?;
    g.tensor(out, shape, c)
}

pub(super) fn scatter_strided(
    g: &GpuBackend,
    op: &'static str,
    dst: &Tensor,
    src: &Tensor,
    view: &StridedView,
    accumulate: bool,
) -> Result<()> {
    let shape = check_view(op, view, dst.numel())?;
    if src.numel() != shape.numel() {
        return Err(TensorError::LengthMismatch {
            op,
            shape: view.dims.clone(),
            expected: shape.numel(),
            got: src.numel(),
        });
    }
    g.in_place(op, dst, src, |s, d| {
        kernels::scatter(
            &g.ctx,
            d,
            s,
            &view.dims,
            &view.strides,
            view.offset,
            accumulate,
        )
    })
}
