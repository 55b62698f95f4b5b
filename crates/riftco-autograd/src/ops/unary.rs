//! Element-wise maps of one variable (negation, exp, log, tanh, sigmoid, ReLU, GELU, powers,
//! scalar arithmetic), each one [`riftco_tensor::Backend::unary`] kernel forward and one
//! [`riftco_tensor::Backend::unary_backward`] kernel for its VJP `dx = g · f'(x)`.

use super::{backend, ACT, GRAD};
use crate::error::Result;
use crate::variable::{Saves, Variable};
use riftco_tensor::backend::UnaryOp;
use riftco_tensor::TensorError;

/// Which GELU: PyTorch's `approximate="none"` (exact, with erf) or `approximate="tanh"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GeluApproximation {
    /// `x · Φ(x) = x/2 · (1 + erf(x/√2))`.
    #[default]
    None,
    /// `x/2 · (1 + tanh(√(2/π)(x + 0.044715 x³)))`.
    Tanh,
}

/// `f(x)` for the map `kind`, recorded with its VJP.
///
/// # Errors
/// Out of memory; the device's backend unavailable.
pub fn unary(x: &Variable, kind: UnaryOp) -> Result<Variable> {
    let name = name_of(kind);
    let be = backend(name, &[x])?;
    let value = be.unary(name, kind, x.value(), ACT)?;
    let reads = reads_of(kind);
    let saves = match reads {
        Reads::Nothing => Saves::NOTHING,
        Reads::Input => Saves::parents(&[0]),
        Reads::Output => Saves::NOTHING.and_output(),
        Reads::Both => Saves::parents(&[0]).and_output(),
    };
    Ok(Variable::from_op_saving(
        name,
        value,
        vec![x.clone()],
        saves,
        move |p, y, g| {
            // The kernel takes x and y; a value the formula does not read may have been
            // released, so another operand of the same length stands in for it.
            let (x, y) = match reads {
                Reads::Nothing => (g, g),
                Reads::Input => (p[0].value(), p[0].value()),
                Reads::Output => (y, y),
                Reads::Both => (p[0].value(), y),
            };
            Ok(vec![Some(be.unary_backward(
                "unary (vjp)",
                kind,
                x,
                y,
                g,
                GRAD,
            )?)])
        },
    ))
}

/// Which forward values the derivative of a map reads.
#[derive(Clone, Copy)]
enum Reads {
    Nothing,
    Input,
    Output,
    Both,
}

/// What `f'` reads: the output for `exp`, `tanh`, `sigmoid` and ReLU (`y > 0` exactly where
/// `x > 0`), the input for `log`, GELU and powers, both for `c / x`, nothing for the affine
/// maps.
fn reads_of(kind: UnaryOp) -> Reads {
    match kind {
        UnaryOp::Neg
        | UnaryOp::AddScalar(_)
        | UnaryOp::MulScalar(_)
        | UnaryOp::DivScalar(_)
        | UnaryOp::RSubScalar(_) => Reads::Nothing,
        UnaryOp::Exp | UnaryOp::Tanh | UnaryOp::Sigmoid | UnaryOp::Relu => Reads::Output,
        UnaryOp::Log | UnaryOp::Gelu | UnaryOp::GeluTanh | UnaryOp::PowScalar(_) => Reads::Input,
        UnaryOp::RDivScalar(_) => Reads::Both,
    }
}

fn name_of(kind: UnaryOp) -> &'static str {
    match kind {
        UnaryOp::Neg => "neg",
        UnaryOp::Exp => "exp",
        UnaryOp::Log => "log",
        UnaryOp::Tanh => "tanh",
        UnaryOp::Sigmoid => "sigmoid",
        UnaryOp::Relu => "relu",
        UnaryOp::Gelu | UnaryOp::GeluTanh => "gelu",
        UnaryOp::PowScalar(_) => "pow",
        UnaryOp::AddScalar(_) => "add_scalar",
        UnaryOp::MulScalar(_) => "mul_scalar",
        UnaryOp::DivScalar(_) => "div_scalar",
        UnaryOp::RSubScalar(_) => "rsub_scalar",
        UnaryOp::RDivScalar(_) => "rdiv_scalar",
    }
}

/// `−x`. VJP: `−g`.
///
/// # Errors
/// Out of memory.
pub fn neg(x: &Variable) -> Result<Variable> {
    unary(x, UnaryOp::Neg)
}

/// `eˣ` (about 1 ulp; below `2^-125` flushed to 0). VJP: `g · eˣ`.
///
/// # Errors
/// Out of memory.
pub fn exp(x: &Variable) -> Result<Variable> {
    unary(x, UnaryOp::Exp)
}

/// `ln x` (NaN for `x < 0`, `−inf` at 0). VJP: `g / x`.
///
/// # Errors
/// Out of memory.
pub fn log(x: &Variable) -> Result<Variable> {
    unary(x, UnaryOp::Log)
}

/// `tanh x`. VJP: `g · (1 − tanh² x)`.
///
/// # Errors
/// Out of memory.
pub fn tanh(x: &Variable) -> Result<Variable> {
    unary(x, UnaryOp::Tanh)
}

/// The logistic sigmoid `σ(x) = 1 / (1 + e⁻ˣ)`. VJP: `g · σ(1 − σ)`.
///
/// # Errors
/// Out of memory.
pub fn sigmoid(x: &Variable) -> Result<Variable> {
    unary(x, UnaryOp::Sigmoid)
}

/// `max(x, 0)`. VJP: `g` where `x > 0`, 0 elsewhere (0 at `x = 0`, as PyTorch).
///
/// # Errors
/// Out of memory.
pub fn relu(x: &Variable) -> Result<Variable> {
    unary(x, UnaryOp::Relu)
}

/// GELU (Hendrycks & Gimpel 2016), exact or with the tanh approximation.
///
/// # Errors
/// Out of memory.
pub fn gelu(x: &Variable, approximate: GeluApproximation) -> Result<Variable> {
    unary(
        x,
        match approximate {
            GeluApproximation::None => UnaryOp::Gelu,
            GeluApproximation::Tanh => UnaryOp::GeluTanh,
        },
    )
}

/// `xᵖ` for a finite scalar `p` (`x · x` for `p = 2`; NaN for a negative `x` and a non-integer
/// `p`, as `powf`). VJP: `g · p · xᵖ⁻¹` (exactly 0 for `p = 0`).
///
/// # Errors
/// [`TensorError::InvalidArgument`] naming `p` when it is NaN or infinite.
pub fn pow_scalar(x: &Variable, p: f32) -> Result<Variable> {
    if !p.is_finite() {
        return Err(TensorError::InvalidArgument {
            op: "pow",
            message: format!("the exponent must be a finite number, got {p}"),
        }
        .into());
    }
    unary(x, UnaryOp::PowScalar(p))
}

/// `x + c`. VJP: `g`.
///
/// # Errors
/// Out of memory.
pub fn add_scalar(x: &Variable, c: f32) -> Result<Variable> {
    unary(x, UnaryOp::AddScalar(c))
}

/// `x − c` (computed as `x + (−c)`, which IEEE rounds identically). VJP: `g`.
///
/// # Errors
/// Out of memory.
pub fn sub_scalar(x: &Variable, c: f32) -> Result<Variable> {
    unary(x, UnaryOp::AddScalar(-c))
}

/// `c − x`. VJP: `−g`.
///
/// # Errors
/// Out of memory.
pub fn rsub_scalar(c: f32, x: &Variable) -> Result<Variable> {
    unary(x, UnaryOp::RSubScalar(c))
}

/// `c · x`. VJP: `c · g`.
///
/// # Errors
/// Out of memory.
pub fn mul_scalar(x: &Variable, c: f32) -> Result<Variable> {
    unary(x, UnaryOp::MulScalar(c))
}

/// `x / c` (true division, not a multiplication by `1/c`). VJP: `g / c`.
///
/// # Errors
/// Out of memory.
pub fn div_scalar(x: &Variable, c: f32) -> Result<Variable> {
    unary(x, UnaryOp::DivScalar(c))
}

/// `c / x`. VJP: `−g · (c/x) / x`.
///
/// # Errors
/// Out of memory.
pub fn rdiv_scalar(c: f32, x: &Variable) -> Result<Variable> {
    unary(x, UnaryOp::RDivScalar(c))
}
