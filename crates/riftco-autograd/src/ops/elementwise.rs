//! Element-wise primitives: add, mul, scale, SiLU, SwiGLU, sum.

use super::{backend, evaluate_value, placeholder, ACT, GRAD};
use crate::error::Result;
use crate::variable::{Saves, Variable};
use riftco_tensor::{Tensor, TensorError};

fn same_shape(op: &'static str, a: &Variable, b: &Variable) -> Result<()> {
    if a.dims() != b.dims() {
        return Err(TensorError::ShapeMismatch {
            op,
            expected: a.dims().to_vec(),
            got: b.dims().to_vec(),
        }
        .into());
    }
    Ok(())
}

/// `a + b` (same shapes). VJP: `da = db = g`.
///
/// # Errors
/// Shape mismatch; [`TensorError::DeviceMismatch`] when `a` and `b` live on different devices.
pub fn add(a: &Variable, b: &Variable) -> Result<Variable> {
    add_impl(a, b, true)
}

/// [`add`] recorded for its VJP only (see the
/// [graph-only variants](crate::ops#graph-only-variants)). While a graph is recorded the returned value holds no data (a placeholder: reading it is an error), not `a + b`.
///
/// # Errors
/// As [`add`].
pub fn add_graph_only(a: &Variable, b: &Variable) -> Result<Variable> {
    add_impl(a, b, false)
}

fn add_impl(a: &Variable, b: &Variable, evaluate: bool) -> Result<Variable> {
    same_shape("add", a, b)?;
    let be = backend("add", &[a, b])?;
    let value = if evaluate_value(evaluate, &[a, b]) {
        be.add("add", a.value(), b.value(), ACT)?
    } else {
        // Never read (graph-only): a placeholder without memory.
        placeholder(be, a.value().shape().clone())?
    };
    Ok(Variable::from_op_saving(
        "add",
        value,
        vec![a.clone(), b.clone()],
        Saves::NOTHING,
        |p, _, g| {
            Ok(vec![
                p[0].requires_grad().then(|| g.clone()),
                p[1].requires_grad().then(|| g.clone()),
            ])
        },
    ))
}

/// `a ⊙ b` (same shapes). VJP: `da = g ⊙ b`, `db = g ⊙ a`.
///
/// # Errors
/// Shape mismatch; [`TensorError::DeviceMismatch`].
pub fn mul(a: &Variable, b: &Variable) -> Result<Variable> {
    same_shape("mul", a, b)?;
    let be = backend("mul", &[a, b])?;
    let value = be.mul("mul", a.value(), b.value(), ACT)?;
    Ok(Variable::from_op_saving(
        "mul",
        value,
        vec![a.clone(), b.clone()],
        Saves::parents(&[0, 1]),
        move |p, _, g| {
            let grad_for = |other: &Variable| -> Result<_> {
                Ok(be.mul("mul (vjp)", g, other.value(), GRAD)?)
            };
            Ok(vec![
                p[0].requires_grad().then(|| grad_for(&p[1])).transpose()?,
                p[1].requires_grad().then(|| grad_for(&p[0])).transpose()?,
            ])
        },
    ))
}

/// `alpha · x`. VJP: `dx = alpha · g`.
///
/// # Errors
/// Out of memory.
pub fn scale(x: &Variable, alpha: f32) -> Result<Variable> {
    scale_impl(x, alpha, true)
}

/// [`scale`] recorded for its VJP only (see the
/// [graph-only variants](crate::ops#graph-only-variants)). While a graph is recorded the returned value holds no data (a placeholder: reading it is an error), not `alpha · x`.
///
/// # Errors
/// Out of memory.
pub fn scale_graph_only(x: &Variable, alpha: f32) -> Result<Variable> {
    scale_impl(x, alpha, false)
}

fn scale_impl(x: &Variable, alpha: f32, evaluate: bool) -> Result<Variable> {
    let be = backend("scale", &[x])?;
    let value = if evaluate_value(evaluate, &[x]) {
        be.scale("scale", x.value(), alpha, ACT)?
    } else {
        // Never read (graph-only): a placeholder without memory.
        placeholder(be, x.value().shape().clone())?
    };
    Ok(Variable::from_op_saving(
        "scale",
        value,
        vec![x.clone()],
        Saves::NOTHING,
        move |_, _, g| Ok(vec![Some(be.scale("scale (vjp)", g, alpha, GRAD)?)]),
    ))
}

/// SiLU, `x · σ(x)` (Elfwing et al. 2018). VJP: `dx = g · σ(x)(1 + x(1 − σ(x)))`.
///
/// # Errors
/// Out of memory.
pub fn silu(x: &Variable) -> Result<Variable> {
    let be = backend("silu", &[x])?;
    let value = be.silu("silu", x.value(), ACT)?;
    Ok(Variable::from_op_saving(
        "silu",
        value,
        vec![x.clone()],
        Saves::parents(&[0]),
        move |p, _, g| {
            Ok(vec![Some(be.silu_backward(
                "silu (vjp)",
                p[0].value(),
                g,
                GRAD,
            )?)])
        },
    ))
}

/// SwiGLU, `SiLU(gate) ⊙ up` (Shazeer 2020, eq. 6), fused. Its VJP reads `gate` and `up`
/// (not the output) and, when the pass holds the only handle to the incoming gradient, writes
/// `d gate` over it (bitwise the same values, one `[.., d_ff]` buffer less at the MLP's
/// backward).
///
/// # Errors
/// Shape mismatch between `gate` and `up`; [`TensorError::DeviceMismatch`].
pub fn swiglu(gate: &Variable, up: &Variable) -> Result<Variable> {
    same_shape("swiglu", gate, up)?;
    let be = backend("swiglu", &[gate, up])?;
    let value = be.swiglu("swiglu", gate.value(), up.value(), ACT)?;
    Ok(Variable::from_op_saving(
        "swiglu",
        value,
        vec![gate.clone(), up.clone()],
        Saves::parents(&[0, 1]),
        move |p, _, g| {
            let op = "swiglu (vjp)";
            // Written over only when nobody else holds it and it is f32 (a 16-bit seed is
            // read-only storage).
            let writable = g.is_exclusive() && g.half_dtype().is_none();
            let (dg, du) = if writable && p[0].requires_grad() {
                let du = be.swiglu_backward_in_place(op, p[0].value(), p[1].value(), g, GRAD)?;
                (g.clone(), du)
            } else {
                be.swiglu_backward(op, p[0].value(), p[1].value(), g, GRAD)?
            };
            Ok(vec![
                p[0].requires_grad().then_some(dg),
                p[1].requires_grad().then_some(du),
            ])
        },
    ))
}

/// Sum of all elements, a scalar (accumulated in f64 in index order). VJP: `dx = g` broadcast.
///
/// # Errors
/// Out of memory.
pub fn sum(x: &Variable) -> Result<Variable> {
    let be = backend("sum", &[x])?;
    let value = be.sum("sum", x.value(), ACT)?;
    Ok(Variable::from_op_saving(
        "sum",
        value,
        vec![x.clone()],
        Saves::NOTHING,
        |p, _, g| {
            let gv = g.to_host()?[0];
            Ok(vec![Some(Tensor::try_full_on(
                p[0].value().shape().clone(),
                gv,
                riftco_tensor::MemoryCategory::Gradient,
                p[0].value().device(),
            )?)])
        },
    ))
}
