//! Shape ops: reshape (no copy; one `-1` inferred with [`reshape_infer`]), permutations of
//! axes ([`permute`], [`transpose`]) and swapping axes 1 and 2 of a 4-D tensor (heads layout).

use super::{backend, output_shape, ACT, GRAD};
use crate::error::Result;
use crate::variable::{Saves, Variable};
use riftco_tensor::backend::StridedView;
use riftco_tensor::{Shape, TensorError};

/// The same elements with another shape of equal element count (shares storage). VJP: the
/// gradient reshaped back.
///
/// # Errors
/// A shape whose element count overflows (`ShapeOverflow`), or element counts differ.
pub fn reshape(x: &Variable, shape: impl Into<Shape>) -> Result<Variable> {
    let value = x.value().reshape(shape)?;
    let original = x.value().shape().clone();
    Ok(Variable::from_op_saving(
        "reshape",
        value,
        vec![x.clone()],
        Saves::NOTHING,
        move |_, _, g| Ok(vec![Some(g.reshape(original.clone())?)]),
    ))
}

/// `[a, b, c, d] → [a, c, b, d]` (e.g. `[batch, seq, heads, d_head] ↔ [batch, heads, seq,
/// d_head]`). VJP: the same swap of the gradient.
///
/// # Errors
/// Input is not 4-D.
pub fn swap_axes_1_2(x: &Variable) -> Result<Variable> {
    let d = x.dims().to_vec();
    if d.len() != 4 {
        return Err(TensorError::RankMismatch {
            op: "swap_axes_1_2",
            expected: 4,
            got: d,
        }
        .into());
    }
    let dims = [d[0], d[1], d[2], d[3]];
    let be = backend("swap_axes_1_2", &[x])?;
    let value = be.transpose_0213("swap_axes_1_2", x.value(), dims, ACT)?;
    Ok(Variable::from_op_saving(
        "swap_axes_1_2",
        value,
        vec![x.clone()],
        Saves::NOTHING,
        move |_, _, g| {
            let swapped = [dims[0], dims[2], dims[1], dims[3]];
            Ok(vec![Some(be.transpose_0213(
                "swap_axes_1_2 (vjp)",
                g,
                swapped,
                GRAD,
            )?)])
        },
    ))
}

/// `axis` of a tensor of `rank` axes, counted from the end when negative (`-1` is the last).
///
/// # Errors
/// [`TensorError::AxisOutOfRange`] naming `op` for an axis outside `-rank..rank`.
pub fn normalize_axis(op: &'static str, axis: isize, rank: usize) -> Result<usize> {
    let r = rank as isize;
    if axis < -r || axis >= r {
        return Err(TensorError::AxisOutOfRange { op, axis, rank }.into());
    }
    Ok(if axis < 0 { axis + r } else { axis } as usize)
}

/// The row-major strides (in elements) of a contiguous tensor of `dims`.
pub(crate) fn contiguous_strides(dims: &[usize]) -> Vec<isize> {
    StridedView::contiguous(dims).strides
}

/// The same elements with another shape, one dimension of which may be `-1` (inferred from the
/// element count, NumPy's rule). Shares storage, like [`reshape`].
///
/// # Errors
/// [`TensorError::InvalidArgument`] for more than one `-1`, a negative dimension other than
/// `-1`, or a `-1` that cannot be inferred (the other dimensions multiply to 0 or do not
/// divide the element count); [`TensorError::ShapeMismatch`] when the element counts differ.
pub fn reshape_infer(x: &Variable, shape: &[isize]) -> Result<Variable> {
    let op = "reshape";
    let bad = |message: String| -> crate::error::AutogradError {
        TensorError::InvalidArgument { op, message }.into()
    };
    if shape.iter().filter(|&&d| d == -1).count() > 1 {
        return Err(bad(format!(
            "shape {shape:?} has more than one -1; at most one dimension can be inferred"
        )));
    }
    if let Some(d) = shape.iter().find(|&&d| d < -1) {
        return Err(bad(format!(
            "shape {shape:?} has the negative dimension {d}; dimensions are >= 0 (or one -1)"
        )));
    }
    let numel = x.value().numel();
    let known = shape
        .iter()
        .filter(|&&d| d >= 0)
        .try_fold(1usize, |n, &d| n.checked_mul(d as usize));
    let dims: Vec<usize> = if shape.contains(&-1) {
        match known {
            Some(k) if k != 0 && numel % k == 0 => shape
                .iter()
                .map(|&d| if d == -1 { numel / k } else { d as usize })
                .collect(),
            _ => {
                return Err(bad(format!(
                    "cannot reshape a tensor of shape {:?} ({numel} elements) into {shape:?}: \
                     the -1 cannot be inferred",
                    x.dims()
                )))
            }
        }
    } else {
        shape.iter().map(|&d| d as usize).collect()
    };
    reshape(x, output_shape(op, dims)?)
}

/// Reorders the axes: output axis `i` is input axis `axes[i]` (negative axes count from the
/// end; NumPy's `transpose(x, axes)`). A copy through [`riftco_tensor::Backend::gather_strided`].
/// VJP: the inverse permutation of the gradient.
///
/// # Errors
/// [`TensorError::InvalidArgument`] when `axes` is not a permutation of the axes (wrong count
/// or a repeated axis); [`TensorError::AxisOutOfRange`].
pub fn permute(x: &Variable, axes: &[isize]) -> Result<Variable> {
    let op = "permute";
    let dims = x.dims().to_vec();
    let rank = dims.len();
    if axes.len() != rank {
        return Err(TensorError::InvalidArgument {
            op,
            message: format!(
                "axes {axes:?} do not match a tensor of shape {dims:?}: expected {rank} axes"
            ),
        }
        .into());
    }
    let mut perm = Vec::with_capacity(rank);
    for &a in axes {
        let a = normalize_axis(op, a, rank)?;
        if perm.contains(&a) {
            return Err(TensorError::InvalidArgument {
                op,
                message: format!("axes {axes:?} repeat axis {a}; expected a permutation"),
            }
            .into());
        }
        perm.push(a);
    }
    let be = backend(op, &[x])?;
    let value = be.gather_strided(op, x.value(), &permuted_view(&dims, &perm), ACT)?;
    let mut inverse = vec![0; rank];
    for (i, &p) in perm.iter().enumerate() {
        inverse[p] = i;
    }
    let out_dims: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    Ok(Variable::from_op_saving(
        op,
        value,
        vec![x.clone()],
        Saves::NOTHING,
        move |_, _, g| {
            let view = permuted_view(&out_dims, &inverse);
            Ok(vec![Some(be.gather_strided(
                "permute (vjp)",
                g,
                &view,
                GRAD,
            )?)])
        },
    ))
}

/// The view of a contiguous tensor of `dims` whose axis `i` is axis `perm[i]`.
fn permuted_view(dims: &[usize], perm: &[usize]) -> StridedView {
    let strides = contiguous_strides(dims);
    StridedView {
        dims: perm.iter().map(|&p| dims[p]).collect(),
        strides: perm.iter().map(|&p| strides[p]).collect(),
        offset: 0,
    }
}

/// Swaps axes `a` and `b` (negative axes count from the end; PyTorch's `transpose(dim0,
/// dim1)`). VJP: the same swap of the gradient.
///
/// # Errors
/// [`TensorError::AxisOutOfRange`].
pub fn transpose(x: &Variable, a: isize, b: isize) -> Result<Variable> {
    let rank = x.dims().len();
    let (a, b) = (
        normalize_axis("transpose", a, rank)?,
        normalize_axis("transpose", b, rank)?,
    );
    let mut axes: Vec<isize> = (0..rank as isize).collect();
    axes.swap(a, b);
    permute(x, &axes)
}
