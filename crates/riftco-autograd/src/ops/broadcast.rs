//! Binary element-wise ops with NumPy broadcasting, their scalar forms, and comparisons.
//!
//! Shapes are aligned from the right; an axis of size 1 (or a missing leading axis) stretches
//! to the other operand's size. The VJP of broadcasting sums the gradient over the stretched
//! axes (a [`riftco_tensor::Backend::reduce`] to the operand's keepdims shape), so each
//! operand's gradient has the operand's shape. The same-shape [`super::add`] and
//! [`super::mul`] (used by the transformer) are unchanged; the broadcasting ones give bitwise
//! their values on equal shapes.

use super::{backend, ACT, GRAD};
use crate::error::Result;
use crate::variable::{Saves, Variable};
use riftco_tensor::backend::{BinaryOp, ReduceOp, UnaryOp};
use riftco_tensor::{Backend, MemoryCategory, Shape, Tensor, TensorError};

/// The broadcast shape of `a` and `b`.
///
/// # Errors
/// [`TensorError::BroadcastMismatch`] naming `op` and both shapes.
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Shape> {
    let dims = riftco_tensor::backend::broadcast_shape(a, b).ok_or_else(|| {
        TensorError::BroadcastMismatch {
            op,
            lhs: a.to_vec(),
            rhs: b.to_vec(),
        }
    })?;
    super::output_shape(op, dims)
}

/// `g` (of a broadcast output's shape) summed over the axes that `dims` stretched, with shape
/// `dims`: the VJP of broadcasting an operand of shape `dims`.
pub(crate) fn reduce_to(
    be: &dyn Backend,
    op: &'static str,
    g: &Tensor,
    dims: &[usize],
    c: MemoryCategory,
) -> Result<Tensor> {
    if g.dims() == dims {
        return Ok(g.clone());
    }
    let rank = g.dims().len();
    let mut keep = vec![1; rank - dims.len()];
    keep.extend_from_slice(dims);
    let r = be.reduce(op, ReduceOp::Sum, g, Shape::new(keep), c)?;
    Ok(r.reshape(Shape::new(dims.to_vec()))?)
}

/// A rank-0 constant `value` on the device of `like` (the scalar operand of a broadcasting op).
///
/// # Errors
/// Out of memory; the device's backend unavailable.
pub fn scalar_like(value: f32, like: &Variable) -> Result<Variable> {
    Ok(Variable::constant(Tensor::try_full_on(
        Shape::scalar(),
        value,
        MemoryCategory::Activation,
        like.value().device(),
    )?))
}

fn binary_op(kind: BinaryOp, name: &'static str, a: &Variable, b: &Variable) -> Result<Variable> {
    let shape = broadcast_shapes(name, a.dims(), b.dims())?;
    let be = backend(name, &[a, b])?;
    let value = be.binary(name, kind, a.value(), b.value(), shape, ACT)?;
    if kind.is_comparison() {
        return Ok(Variable::constant(value));
    }
    // What the VJP reads besides the operands' shapes: nothing for sums and differences, both
    // operands for a product, the divisor and the quotient for a division.
    let saves = match kind {
        BinaryOp::Add | BinaryOp::Sub => Saves::NOTHING,
        BinaryOp::Mul => Saves::parents(&[0, 1]),
        BinaryOp::Div => Saves::parents(&[1]).and_output(),
        _ => Saves::ALL,
    };
    Ok(Variable::from_op_saving(
        name,
        value,
        vec![a.clone(), b.clone()],
        saves,
        move |p, y, g| {
            let (a, b) = (p[0].value(), p[1].value());
            let vjp = "broadcast (vjp)";
            let da = |t: Tensor| reduce_to(be, vjp, &t, a.dims(), GRAD);
            let db = |t: Tensor| reduce_to(be, vjp, &t, b.dims(), GRAD);
            let ga = p[0].requires_grad();
            let gb = p[1].requires_grad();
            let (ra, rb) = match kind {
                BinaryOp::Add => (
                    ga.then(|| da(g.clone())).transpose()?,
                    gb.then(|| db(g.clone())).transpose()?,
                ),
                BinaryOp::Sub => (
                    ga.then(|| da(g.clone())).transpose()?,
                    gb.then(|| db(be.unary(vjp, UnaryOp::Neg, g, GRAD)?))
                        .transpose()?,
                ),
                BinaryOp::Mul => (
                    ga.then(|| da(be.binary(vjp, BinaryOp::Mul, g, b, g.shape().clone(), GRAD)?))
                        .transpose()?,
                    gb.then(|| db(be.binary(vjp, BinaryOp::Mul, g, a, g.shape().clone(), GRAD)?))
                        .transpose()?,
                ),
                BinaryOp::Div => {
                    let ra = ga
                        .then(|| {
                            da(be.binary(vjp, BinaryOp::Div, g, b, g.shape().clone(), GRAD)?)
                        })
                        .transpose()?;
                    // d(a/b)/db = −(a/b)/b = −y/b.
                    let rb = gb
                        .then(|| {
                            let yb =
                                be.binary(vjp, BinaryOp::Div, y, b, g.shape().clone(), GRAD)?;
                            let t =
                                be.binary(vjp, BinaryOp::Mul, g, &yb, g.shape().clone(), GRAD)?;
                            db(be.unary(vjp, UnaryOp::Neg, &t, GRAD)?)
                        })
                        .transpose()?;
                    (ra, rb)
                }
                _ => (None, None),
            };
            Ok(vec![ra, rb])
        },
    ))
}

/// `a + b` with NumPy broadcasting (output: the broadcast shape). VJP: `g` summed to each
/// operand's shape.
///
/// # Errors
/// [`TensorError::BroadcastMismatch`] naming both shapes; [`TensorError::DeviceMismatch`].
pub fn broadcast_add(a: &Variable, b: &Variable) -> Result<Variable> {
    binary_op(BinaryOp::Add, "add", a, b)
}

/// `a − b` with broadcasting. VJP: `da = Σ g`, `db = −Σ g` (summed to each shape).
///
/// # Errors
/// As [`broadcast_add`].
pub fn broadcast_sub(a: &Variable, b: &Variable) -> Result<Variable> {
    binary_op(BinaryOp::Sub, "sub", a, b)
}

/// `a ⊙ b` with broadcasting. VJP: `da = Σ g ⊙ b`, `db = Σ g ⊙ a`.
///
/// # Errors
/// As [`broadcast_add`].
pub fn broadcast_mul(a: &Variable, b: &Variable) -> Result<Variable> {
    binary_op(BinaryOp::Mul, "mul", a, b)
}

/// `a / b` with broadcasting (IEEE division: `x / 0` is `±inf` or NaN). VJP: `da = Σ g / b`,
/// `db = −Σ g ⊙ (a/b) / b`.
///
/// # Errors
/// As [`broadcast_add`].
pub fn broadcast_div(a: &Variable, b: &Variable) -> Result<Variable> {
    binary_op(BinaryOp::Div, "div", a, b)
}

/// The comparison `kind` (`Lt`, `Le`, `Gt`, `Ge`, `Eq`, `Ne`) with broadcasting: `1.0` where it
/// holds, `0.0` elsewhere. The result is a constant (no graph, never requires grad).
///
/// # Errors
/// As [`broadcast_add`]; [`TensorError::InvalidArgument`] for an arithmetic `kind`.
pub fn compare(a: &Variable, b: &Variable, kind: BinaryOp) -> Result<Variable> {
    if !kind.is_comparison() {
        return Err(TensorError::InvalidArgument {
            op: "compare",
            message: format!("{kind:?} is not a comparison (expected Lt, Le, Gt, Ge, Eq or Ne)"),
        }
        .into());
    }
    let name = match kind {
        BinaryOp::Lt => "lt",
        BinaryOp::Le => "le",
        BinaryOp::Gt => "gt",
        BinaryOp::Ge => "ge",
        BinaryOp::Eq => "eq",
        _ => "ne",
    };
    binary_op(kind, name, a, b)
}
