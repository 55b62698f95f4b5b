//! Joining tensors: [`concat()`] along an existing axis and [`stack`] along a new one. The
//! forward writes each input into its slot of the output
//! ([`riftco_tensor::Backend::scatter_strided`]); the VJP hands each input its slice of the
//! gradient ([`riftco_tensor::Backend::gather_strided`]).

use super::shape::{contiguous_strides, normalize_axis, reshape};
use super::{output_shape, ACT, GRAD};
use crate::error::Result;
use crate::variable::{Saves, Variable};
use riftco_tensor::backend::{backend_of_devices, StridedView};
use riftco_tensor::{Tensor, TensorError};

/// The inputs joined along `axis` (negative counts from the end; NumPy's `concatenate`,
/// PyTorch's `cat`): every input has the same rank and the same dimensions except along
/// `axis`, whose sizes add up (size-0 slices included).
///
/// # Errors
/// [`TensorError::InvalidArgument`] for an empty list; [`TensorError::JoinShapeMismatch`]
/// naming both shapes and the axis when an input's rank or another dimension differs from
/// input 0's; [`TensorError::AxisOutOfRange`]; [`TensorError::DeviceMismatch`].
pub fn concat(xs: &[Variable], axis: isize) -> Result<Variable> {
    join("concat", xs, axis)
}

fn join(op: &'static str, xs: &[Variable], axis: isize) -> Result<Variable> {
    let Some(first) = xs.first() else {
        return Err(TensorError::InvalidArgument {
            op,
            message: "needs at least one input tensor; got an empty list".into(),
        }
        .into());
    };
    let first_dims = first.dims().to_vec();
    let rank = first_dims.len();
    if rank == 0 {
        return Err(TensorError::InvalidArgument {
            op,
            message: "zero-dimensional (rank-0) tensors cannot be concatenated; stack them".into(),
        }
        .into());
    }
    let axis = normalize_axis(op, axis, rank)?;
    let mut total = 0usize;
    for (i, x) in xs.iter().enumerate() {
        let d = x.dims();
        let agrees = d.len() == rank
            && d.iter()
                .zip(&first_dims)
                .enumerate()
                .all(|(k, (a, b))| k == axis || a == b);
        if !agrees {
            return Err(TensorError::JoinShapeMismatch {
                op,
                axis,
                index: i,
                first: first_dims.clone(),
                got: d.to_vec(),
                rule: "inputs must have the same rank and agree on every axis except the \
                       joined one",
            }
            .into());
        }
        total = total.saturating_add(d[axis]);
    }
    let be = backend_of_devices(op, xs.iter().map(|x| x.value().device()))?;
    let mut out_dims = first_dims;
    out_dims[axis] = total;
    let shape = output_shape(op, out_dims.clone())?;
    let strides = contiguous_strides(&out_dims);
    let mut views = Vec::with_capacity(xs.len());
    let mut start = 0usize;
    for x in xs {
        views.push(StridedView {
            dims: x.dims().to_vec(),
            strides: strides.clone(),
            offset: start * strides[axis] as usize,
        });
        start += x.dims()[axis];
    }
    let buffer = be.alloc(op, shape.numel(), None)?;
    let value = Tensor::from_buffer(buffer, shape, be.device(), ACT)?;
    for (x, view) in xs.iter().zip(&views) {
        be.scatter_strided(op, &value, x.value(), view, false)?;
    }
    Ok(Variable::from_op_saving(
        op,
        value,
        xs.to_vec(),
        Saves::NOTHING,
        move |_, _, g| {
            views
                .iter()
                .map(|v| Ok(Some(be.gather_strided("concat (vjp)", g, v, GRAD)?)))
                .collect()
        },
    ))
}

/// The inputs stacked along a new axis `axis` of the output (negative counts from the end of
/// the output's `rank + 1` axes; NumPy's and PyTorch's `stack`): every input has the same
/// shape. Built from [`reshape`] (a size-1 axis inserted) and [`concat()`].
///
/// # Errors
/// [`TensorError::InvalidArgument`] for an empty list; [`TensorError::JoinShapeMismatch`]
/// naming both shapes when an input's shape differs from input 0's;
/// [`TensorError::AxisOutOfRange`].
pub fn stack(xs: &[Variable], axis: isize) -> Result<Variable> {
    let op = "stack";
    let Some(first) = xs.first() else {
        return Err(TensorError::InvalidArgument {
            op,
            message: "needs at least one input tensor; got an empty list".into(),
        }
        .into());
    };
    let dims = first.dims().to_vec();
    let axis = normalize_axis(op, axis, dims.len() + 1)?;
    let mut expanded = Vec::with_capacity(xs.len());
    for (i, x) in xs.iter().enumerate() {
        if x.dims() != dims.as_slice() {
            return Err(TensorError::JoinShapeMismatch {
                op,
                axis,
                index: i,
                first: dims.clone(),
                got: x.dims().to_vec(),
                rule: "inputs must all have the same shape",
            }
            .into());
        }
        let mut d = dims.clone();
        d.insert(axis, 1);
        expanded.push(reshape(x, d)?);
    }
    join(op, &expanded, axis as isize)
}
