//! Element-wise primitives: add, mul, scale, SiLU, SwiGLU, sum.

use super::{activation, buf, evaluate_value, gradient};
use crate::error::Result;
use crate::variable::Variable;
use riftco_kernels::elementwise as k;
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
/// Shape mismatch.
pub fn add(a: &Variable, b: &Variable) -> Result<Variable> {
    add_impl(a, b, true)
}

/// [`add`] recorded for its VJP only (see the
/// [graph-only variants](crate::ops#graph-only-variants)). While a graph is recorded the returned value is unspecified (NaN in debug builds), not `a + b`.
///
/// # Errors
/// Shape mismatch.
pub fn add_graph_only(a: &Variable, b: &Variable) -> Result<Variable> {
    add_impl(a, b, false)
}

fn add_impl(a: &Variable, b: &Variable, evaluate: bool) -> Result<Variable> {
    same_shape("add", a, b)?;
    let out = if evaluate_value(evaluate, &[a, b]) {
        let mut out = buf("add", a.value().numel())?;
        k::add(&a.value().read(), &b.value().read(), &mut out);
        out
    } else {
        // Never read (graph-only): an unfilled pooled buffer, not zeroed.
        buf("add", a.value().numel())?
    };
    let value = activation(out, a.value().shape().clone());
    Ok(Variable::from_op(
        "add",
        value,
        vec![a.clone(), b.clone()],
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
/// Shape mismatch.
pub fn mul(a: &Variable, b: &Variable) -> Result<Variable> {
    same_shape("mul", a, b)?;
    let mut out = buf("mul", a.value().numel())?;
    k::mul(&a.value().read(), &b.value().read(), &mut out);
    let value = activation(out, a.value().shape().clone());
    Ok(Variable::from_op(
        "mul",
        value,
        vec![a.clone(), b.clone()],
        |p, _, g| {
            let gr = g.read();
            let grad_for = |other: &Variable| -> Result<_> {
                let mut d = buf("mul (vjp)", gr.len())?;
                k::mul(&gr, &other.value().read(), &mut d);
                Ok(gradient(d, g.shape().clone()))
            };
            Ok(vec![
                p[0].requires_grad().then(|| grad_for(&p[1])).transpose()?,
                p[1].requires_grad().then(|| grad_for(&p[0])).transpose()?,
            ])
        },
    ))
}

/// `alpha · x`. VJP: `dx = alpha · g`.
pub fn scale(x: &Variable, alpha: f32) -> Result<Variable> {
    scale_impl(x, alpha, true)
}

/// [`scale`] recorded for its VJP only (see the
/// [graph-only variants](crate::ops#graph-only-variants)). While a graph is recorded the returned value is unspecified (NaN in debug builds), not `alpha · x`.
pub fn scale_graph_only(x: &Variable, alpha: f32) -> Result<Variable> {
    scale_impl(x, alpha, false)
}

fn scale_impl(x: &Variable, alpha: f32, evaluate: bool) -> Result<Variable> {
    let out = if evaluate_value(evaluate, &[x]) {
        let mut out = buf("scale", x.value().numel())?;
        k::scale(&x.value().read(), alpha, &mut out);
        out
    } else {
        // Never read (graph-only): an unfilled pooled buffer, not zeroed.
        buf("scale", x.value().numel())?
    };
    let value = activation(out, x.value().shape().clone());
    Ok(Variable::from_op(
        "scale",
        value,
        vec![x.clone()],
        move |_, _, g| {
            let mut d = buf("scale (vjp)", g.numel())?;
            k::scale(&g.read(), alpha, &mut d);
            Ok(vec![Some(gradient(d, g.shape().clone()))])
        },
    ))
}

/// SiLU, `x · σ(x)` (Elfwing et al. 2018). VJP: `dx = g · σ(x)(1 + x(1 − σ(x)))`.
pub fn silu(x: &Variable) -> Result<Variable> {
    let mut out = buf("silu", x.value().numel())?;
    k::silu(&x.value().read(), &mut out);
    let value = activation(out, x.value().shape().clone());
    Ok(Variable::from_op(
        "silu",
        value,
        vec![x.clone()],
        |p, _, g| {
            let mut d = buf("silu (vjp)", g.numel())?;
            k::silu_backward(&p[0].value().read(), &g.read(), &mut d);
            Ok(vec![Some(gradient(d, g.shape().clone()))])
        },
    ))
}

/// SwiGLU, `SiLU(gate) ⊙ up` (Shazeer 2020, eq. 6), fused.
///
/// # Errors
/// Shape mismatch between `gate` and `up`.
pub fn swiglu(gate: &Variable, up: &Variable) -> Result<Variable> {
    same_shape("swiglu", gate, up)?;
    let mut out = buf("swiglu", gate.value().numel())?;
    k::swiglu(&gate.value().read(), &up.value().read(), &mut out);
    let value = activation(out, gate.value().shape().clone());
    Ok(Variable::from_op(
        "swiglu",
        value,
        vec![gate.clone(), up.clone()],
        |p, _, g| {
            let n = g.numel();
            let (mut dg, mut du) = (buf("swiglu (vjp)", n)?, buf("swiglu (vjp)", n)?);
            k::swiglu_backward(
                &p[0].value().read(),
                &p[1].value().read(),
                &g.read(),
                &mut dg,
                &mut du,
            );
            Ok(vec![
                p[0].requires_grad()
                    .then(|| gradient(dg, g.shape().clone())),
                p[1].requires_grad()
                    .then(|| gradient(du, g.shape().clone())),
            ])
        },
    ))
}

/// Sum of all elements, a scalar (accumulated in f64 in index order). VJP: `dx = g` broadcast.
pub fn sum(x: &Variable) -> Result<Variable> {
    let total: f64 = x.value().read().iter().map(|&v| v as f64).sum();
    let value = activation(vec![total as f32], riftco_tensor::Shape::scalar());
    Ok(Variable::from_op(
        "sum",
        value,
        vec![x.clone()],
        |p, _, g| {
            let gv = g.read()[0];
            Ok(vec![Some(Tensor::try_full(
                p[0].value().shape().clone(),
                gv,
                riftco_tensor::MemoryCategory::Gradient,
            )?)])
        },
    ))
}
