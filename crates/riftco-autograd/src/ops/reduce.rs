//! Reductions over axes (sum, mean) and the log-softmax built on them.
//!
//! Axes follow NumPy: `None` reduces every axis, negative axes count from the end, a repeated
//! or out-of-range axis is an error, and an empty list reduces nothing. Sums accumulate in
//! `f64` in row-major order per output element ([`riftco_tensor::Backend::reduce`]).

use super::broadcast::broadcast_sub;
use super::unary::{exp, log};
use super::{backend, output_shape, ACT, GRAD};
use crate::error::Result;
use crate::variable::{Saves, Variable};
use riftco_tensor::backend::{BinaryOp, ReduceOp, UnaryOp};
use riftco_tensor::{MemoryCategory, Shape, Tensor, TensorError};

/// Which axes of a rank-`rank` tensor `axes` names (`None`: all of them).
///
/// # Errors
/// [`TensorError::BadAxis`] naming `op`, the axis and the rank for an axis outside
/// `-rank..rank` or one named twice.
pub fn normalize_axes(op: &'static str, axes: Option<&[i64]>, rank: usize) -> Result<Vec<bool>> {
    let Some(axes) = axes else {
        return Ok(vec![true; rank]);
    };
    let mut mask = vec![false; rank];
    for &axis in axes {
        let bad = |problem| TensorError::BadAxis {
            op,
            axis,
            rank,
            problem,
        };
        let r = rank as i64;
        if axis < -r || axis >= r {
            return Err(bad("is out of range").into());
        }
        let k = if axis < 0 { axis + r } else { axis } as usize;
        if mask[k] {
            return Err(bad("is repeated").into());
        }
        mask[k] = true;
    }
    Ok(mask)
}

/// `(keepdims shape, output shape, number of elements reduced into each output)`.
fn reduced_shapes(
    op: &'static str,
    dims: &[usize],
    mask: &[bool],
    keepdims: bool,
) -> Result<(Shape, Shape, usize)> {
    let keep: Vec<usize> = dims
        .iter()
        .zip(mask)
        .map(|(&d, &m)| if m { 1 } else { d })
        .collect();
    let out: Vec<usize> = if keepdims {
        keep.clone()
    } else {
        dims.iter()
            .zip(mask)
            .filter(|(_, &m)| !m)
            .map(|(&d, _)| d)
            .collect()
    };
    let count = dims
        .iter()
        .zip(mask)
        .filter(|(_, &m)| m)
        .map(|(&d, _)| d)
        .product();
    Ok((output_shape(op, keep)?, output_shape(op, out)?, count))
}

fn reduce_axes(
    name: &'static str,
    x: &Variable,
    axes: Option<&[i64]>,
    keepdims: bool,
    mean: bool,
) -> Result<Variable> {
    let mask = normalize_axes(name, axes, x.dims().len())?;
    let (keep, out, count) = reduced_shapes(name, x.dims(), &mask, keepdims)?;
    let be = backend(name, &[x])?;
    let mut value = be.reduce(name, ReduceOp::Sum, x.value(), keep.clone(), ACT)?;
    if mean {
        value = be.unary(name, UnaryOp::DivScalar(count as f32), &value, ACT)?;
    }
    let value = value.reshape(out)?;
    Ok(Variable::from_op_saving(
        name,
        value,
        vec![x.clone()],
        // Only the input's shape and device are read.
        Saves::NOTHING,
        move |p, _, g| {
            // Broadcast g back over the reduced axes: g · 1 (exact) or g / count.
            let x = p[0].value();
            let vjp = "reduce (vjp)";
            let (kind, c) = if mean {
                (BinaryOp::Div, count as f32)
            } else {
                (BinaryOp::Mul, 1.0)
            };
            let c = Tensor::try_full_on(Shape::scalar(), c, MemoryCategory::Gradient, x.device())?;
            let gk = g.reshape(keep.clone())?;
            Ok(vec![Some(be.binary(
                vjp,
                kind,
                &gk,
                &c,
                x.shape().clone(),
                GRAD,
            )?)])
        },
    ))
}

/// The sum over `axes` (`None`: all; negative axes count from the end), keeping them as size-1
/// axes with `keepdims`. VJP: `g` broadcast back over the reduced axes.
///
/// # Errors
/// [`TensorError::BadAxis`] for an out-of-range or repeated axis.
pub fn sum_axes(x: &Variable, axes: Option<&[i64]>, keepdims: bool) -> Result<Variable> {
    reduce_axes("sum", x, axes, keepdims, false)
}

/// The mean over `axes` (the sum divided by the number of elements reduced; NaN over an
/// empty axis). VJP: `g / n` broadcast back.
///
/// # Errors
/// As [`sum_axes`].
pub fn mean_axes(x: &Variable, axes: Option<&[i64]>, keepdims: bool) -> Result<Variable> {
    reduce_axes("mean", x, axes, keepdims, true)
}

/// `log softmax` along `axis`: `x − m − log Σ exp(x − m)` with `m` the maximum along the axis
/// (numerically stable: no overflow for large `x`). Composed from the primitives (max as a
/// constant, broadcasting subtraction, exp, sum, log), so its VJP, `g − softmax · Σ g`, comes
/// from theirs; `m` needs no gradient because the result does not depend on it.
///
/// # Errors
/// [`TensorError::BadAxis`] for an axis outside `-rank..rank` (a rank-0 tensor has none).
pub fn log_softmax(x: &Variable, axis: i64) -> Result<Variable> {
    let name = "log_softmax";
    let mask = normalize_axes(name, Some(&[axis]), x.dims().len())?;
    let (keep, _, _) = reduced_shapes(name, x.dims(), &mask, true)?;
    let be = backend(name, &[x])?;
    let m = Variable::constant(be.reduce(name, ReduceOp::Max, x.value(), keep, ACT)?);
    let z = broadcast_sub(x, &m)?;
    let lse = log(&sum_axes(&exp(&z)?, Some(&[axis]), true)?)?;
    broadcast_sub(&z, &lse)
}
