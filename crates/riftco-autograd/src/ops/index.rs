//! Basic indexing with NumPy's semantics: integers (negative from the end), slices with steps
//! (clamped bounds, negative steps), `...` and new axes. The result is a contiguous copy of a
//! strided view ([`riftco_tensor::Backend::gather_strided`]); the VJP scatters the gradient
//! into zeros of the input's shape ([`riftco_tensor::Backend::scatter_strided`]).

use super::shape::contiguous_strides;
use super::{backend, output_shape, ACT, GRAD};
use crate::error::Result;
use crate::variable::{Saves, Variable};
use riftco_tensor::backend::StridedView;
use riftco_tensor::{Tensor, TensorError};

/// One item of a basic index expression (`x[1, ::2, ..., None]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexItem {
    /// One position of an axis (negative counts from the end); the axis is dropped.
    Int(isize),
    /// `start:stop:step` of an axis; `None` bounds are the ends in the step's direction, bounds
    /// are clamped to the axis, and `step` defaults to 1 (0 is an error).
    Slice {
        start: Option<isize>,
        stop: Option<isize>,
        step: Option<isize>,
    },
    /// `...`: as many full slices as the axes not indexed otherwise (at most one per index).
    Ellipsis,
    /// `None` / `np.newaxis`: a new axis of size 1.
    NewAxis,
}

impl IndexItem {
    /// The full slice `:`.
    pub const FULL: IndexItem = IndexItem::Slice {
        start: None,
        stop: None,
        step: None,
    };
}

/// `(start, len, step)` of `start:stop:step` on an axis of `n` elements, as Python's
/// `slice.indices(n)` and `len(range(...))` compute them.
fn slice_bounds(
    start: Option<isize>,
    stop: Option<isize>,
    step: isize,
    n: usize,
) -> (isize, usize) {
    let n = n as isize;
    let clamp = |v: isize, lo: isize, hi: isize| v.clamp(lo, hi);
    let resolve = |v: isize| if v < 0 { v + n } else { v };
    let (start, stop) = if step > 0 {
        (
            start.map_or(0, |s| clamp(resolve(s), 0, n)),
            stop.map_or(n, |s| clamp(resolve(s), 0, n)),
        )
    } else {
        (
            start.map_or(n - 1, |s| clamp(resolve(s), -1, n - 1)),
            stop.map_or(-1, |s| clamp(resolve(s), -1, n - 1)),
        )
    };
    let len = if step > 0 && stop > start {
        (stop - start - 1) / step + 1
    } else if step < 0 && start > stop {
        (start - stop - 1) / (-step) + 1
    } else {
        0
    };
    (start, len as usize)
}

/// The strided view of a contiguous tensor of `dims` that `items` select.
///
/// # Errors
/// [`TensorError::IndexOutOfBounds`] for an integer outside `-size..size` (naming the index,
/// the axis and its size); [`TensorError::InvalidIndex`] for more than one `...` or more
/// indexed axes than the tensor has; [`TensorError::InvalidArgument`] for a step of 0.
pub fn index_view(dims: &[usize], items: &[IndexItem]) -> Result<StridedView> {
    let op = "index";
    let invalid = |message: String| -> crate::error::AutogradError {
        TensorError::InvalidArgument { op, message }.into()
    };
    let rank = dims.len();
    let consumed = items
        .iter()
        .filter(|i| matches!(i, IndexItem::Int(_) | IndexItem::Slice { .. }))
        .count();
    let ellipses = items.iter().filter(|i| **i == IndexItem::Ellipsis).count();
    let bad_index = |message: String| -> crate::error::AutogradError {
        TensorError::InvalidIndex { op, message }.into()
    };
    if ellipses > 1 {
        return Err(bad_index(format!(
            "an index can only have a single ellipsis ('...'); got {ellipses}"
        )));
    }
    if consumed > rank {
        return Err(bad_index(format!(
            "too many indices: the tensor of shape {dims:?} has {rank} axes but {consumed} \
             were indexed"
        )));
    }
    let strides = contiguous_strides(dims);
    let mut view = StridedView::default();
    let mut offset: isize = 0;
    let mut axis = 0;
    let full = [IndexItem::FULL];
    let mut expanded: Vec<IndexItem> = Vec::with_capacity(rank + items.len());
    for item in items {
        match item {
            IndexItem::Ellipsis => expanded.extend(full.iter().cycle().take(rank - consumed)),
            other => expanded.push(*other),
        }
    }
    if ellipses == 0 {
        expanded.extend(full.iter().cycle().take(rank - consumed));
    }
    for item in expanded {
        match item {
            IndexItem::Int(i) => {
                let n = dims[axis];
                let ni = n as isize;
                if i < -ni || i >= ni {
                    return Err(TensorError::IndexOutOfBounds {
                        op,
                        index: i,
                        axis,
                        size: n,
                    }
                    .into());
                }
                offset += (if i < 0 { i + ni } else { i }) * strides[axis];
                axis += 1;
            }
            IndexItem::Slice { start, stop, step } => {
                // As Python's slice.indices: a step of isize::MIN is read as -isize::MAX.
                let step = step.unwrap_or(1).max(-isize::MAX);
                if step == 0 {
                    return Err(invalid(format!(
                        "slice step cannot be zero (axis {axis} of shape {dims:?})"
                    )));
                }
                let (s, len) = slice_bounds(start, stop, step, dims[axis]);
                if len > 0 {
                    offset += s * strides[axis];
                }
                view.dims.push(len);
                // With two or more elements |step| < size, so the product cannot overflow; a
                // step of one element or none is never taken.
                view.strides
                    .push(if len > 1 { strides[axis] * step } else { 0 });
                axis += 1;
            }
            IndexItem::NewAxis => {
                view.dims.push(1);
                view.strides.push(0);
            }
            IndexItem::Ellipsis => unreachable!("expanded above"),
        }
    }
    view.offset = offset as usize;
    Ok(view)
}

/// `x[items]` with NumPy's basic-indexing semantics (see [`IndexItem`]): a copy of shape the
/// sliced and new axes (integer-indexed axes dropped; a slice selecting nothing gives a
/// dimension of 0). VJP: zeros of `x`'s shape with the gradient written into the view.
///
/// # Errors
/// As [`index_view`].
pub fn index(x: &Variable, items: &[IndexItem]) -> Result<Variable> {
    let op = "index";
    let view = index_view(x.dims(), items)?;
    output_shape(op, view.dims.clone())?;
    let be = backend(op, &[x])?;
    let value = be.gather_strided(op, x.value(), &view, ACT)?;
    let shape = x.value().shape().clone();
    Ok(Variable::from_op_saving(
        op,
        value,
        vec![x.clone()],
        Saves::NOTHING,
        move |_, _, g| {
            let buffer = be.alloc("index (vjp)", shape.numel(), Some(0.0))?;
            let dx = Tensor::from_buffer(buffer, shape.clone(), be.device(), GRAD)?;
            be.scatter_strided("index (vjp)", &dx, g, &view, false)?;
            Ok(vec![Some(dx)])
        },
    ))
}
