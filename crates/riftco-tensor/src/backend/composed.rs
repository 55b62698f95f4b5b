//! Default implementations of [`Backend`] methods composed of the trait's other methods, for
//! backends without a fused kernel of their own.

use super::{Backend, LossAndGradients, MatmulSpec, StridedView};
use crate::{MemoryCategory, Result, Shape, Tensor, TensorError};

/// [`Backend::linear_cross_entropy`] from the backend's own row gather, products and
/// cross-entropy kernels, chunk by chunk: per chunk of `r` rows the rows of `x` are gathered,
/// `z = x_c · Wᵀ` and its cross-entropy computed, the chunk's mean loss added into the total
/// with the weight `r / rows`, and with gradients `dz` (for the upstream gradient `r / rows`,
/// so that it is the whole mean's) multiplied into `dx`'s rows and added into `dW`. Every
/// intermediate is workspace memory and lives for one chunk. The loss equals the unchunked
/// mean within f32 rounding (the chunks' means are combined in f32).
///
/// # Errors
/// [`TensorError::InvalidArgument`] for `chunk_rows == 0`, no rows or a `w` whose length is not
/// a multiple of `x`'s row length; the backend's errors.
#[allow(clippy::too_many_arguments)]
pub fn linear_cross_entropy<B: Backend + ?Sized>(
    be: &B,
    op: &'static str,
    x: &Tensor,
    w: &Tensor,
    targets: &[u32],
    chunk_rows: usize,
    [want_dx, want_dw]: [bool; 2],
    c: MemoryCategory,
) -> Result<LossAndGradients> {
    const WS: MemoryCategory = MemoryCategory::Workspace;
    let (rows, d, vocab) = linear_cross_entropy_sizes(op, x, w, targets, chunk_rows)?;
    let device = be.device();
    let total = Tensor::try_full_on(Shape::scalar(), 0.0, c, device)?;
    let grad = MemoryCategory::Gradient;
    let dx = match want_dx {
        true => Some(Tensor::try_full_on([rows, d], 0.0, grad, device)?),
        false => None,
    };
    let mut dw: Option<Tensor> = None;
    let mut r0 = 0;
    while r0 < rows {
        let r = chunk_rows.min(rows - r0);
        let tc = &targets[r0..r0 + r];
        let view = StridedView {
            dims: vec![r, d],
            strides: vec![d as isize, 1],
            offset: r0 * d,
        };
        let xc = be.gather_strided(op, x, &view, WS)?;
        let spec = MatmulSpec::new(r, d, vocab).trans_b(true);
        let z = be.matmul(op, spec, &xc, w, [r, vocab].into(), WS)?;
        let (loss, lse) = be.cross_entropy(op, &z, tc, WS)?;
        let weight = r as f32 / rows as f32;
        be.axpy(op, weight, &loss, &total)?;
        if want_dx || want_dw {
            let g = Tensor::try_full_on(Shape::scalar(), weight, WS, device)?;
            let dz = be.cross_entropy_backward(op, &z, tc, &lse, &g, WS)?;
            drop(z);
            if let Some(dx) = &dx {
                let spec = MatmulSpec::new(r, vocab, d);
                let dxc = be.matmul(op, spec, &dz, w, [r, d].into(), WS)?;
                be.copy_range(op, dx, r0 * d, &dxc, 0, r * d)?;
            }
            if want_dw {
                let spec = MatmulSpec::new(vocab, r, d).trans_a(true);
                match &dw {
                    None => dw = Some(be.matmul(op, spec, &dz, &xc, [vocab, d].into(), grad)?),
                    Some(acc) => {
                        let part = be.matmul(op, spec, &dz, &xc, [vocab, d].into(), WS)?;
                        be.add_assign(op, acc, &part)?;
                    }
                }
            }
        }
        r0 += r;
    }
    Ok(LossAndGradients {
        loss: total,
        d_first: dx,
        d_second: dw,
    })
}

/// `(rows, d, vocab)` of a [`Backend::linear_cross_entropy`] call: `x [rows, d]` with one row
/// per target, `w [vocab, d]`, `chunk_rows >= 1`.
///
/// # Errors
/// [`TensorError::InvalidArgument`] naming the sizes otherwise.
pub(super) fn linear_cross_entropy_sizes(
    op: &'static str,
    x: &Tensor,
    w: &Tensor,
    targets: &[u32],
    chunk_rows: usize,
) -> Result<(usize, usize, usize)> {
    let rows = targets.len();
    let d = x.dims().last().copied().unwrap_or(0);
    if chunk_rows == 0 || rows == 0 || d == 0 || w.numel() % d != 0 || x.numel() != rows * d {
        return Err(TensorError::InvalidArgument {
            op,
            message: format!(
                "linear_cross_entropy needs x [rows, d] with rows = {rows} targets, W [vocab, d] \
                 and chunk_rows >= 1; got x {:?}, W {:?}, chunk_rows {chunk_rows}",
                x.dims(),
                w.dims()
            ),
        });
    }
    Ok((rows, d, w.numel() / d))
}
