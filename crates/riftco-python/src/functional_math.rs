//! The math of `riftco._native.functional` (broadcasting arithmetic, comparisons, element-wise
//! maps, reductions over axes, log-softmax) and the helpers behind `Variable`'s operators.
//!
//! Broadcasting follows NumPy (shapes aligned from the right, size-1 axes stretch); a Python
//! `int` or `float` (or a NumPy number scalar) is accepted wherever an operand may be a scalar. Mismatched shapes raise
//! `ShapeError` naming both.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyTuple};
use riftco_autograd::ops::{self, GeluApproximation};
use riftco_autograd::Variable;
pub(crate) use riftco_tensor::backend::BinaryOp;
use riftco_tensor::{MemoryCategory, Shape, Tensor};

use crate::errors::{compute, Exc};
use crate::variable::PyVariable;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(add, m)?)?;
    m.add_function(wrap_pyfunction!(sub, m)?)?;
    m.add_function(wrap_pyfunction!(mul, m)?)?;
    m.add_function(wrap_pyfunction!(div, m)?)?;
    m.add_function(wrap_pyfunction!(neg, m)?)?;
    m.add_function(wrap_pyfunction!(pow, m)?)?;
    m.add_function(wrap_pyfunction!(exp, m)?)?;
    m.add_function(wrap_pyfunction!(log, m)?)?;
    m.add_function(wrap_pyfunction!(tanh, m)?)?;
    m.add_function(wrap_pyfunction!(sigmoid, m)?)?;
    m.add_function(wrap_pyfunction!(relu, m)?)?;
    m.add_function(wrap_pyfunction!(gelu, m)?)?;
    m.add_function(wrap_pyfunction!(log_softmax, m)?)?;
    m.add_function(wrap_pyfunction!(sum, m)?)?;
    m.add_function(wrap_pyfunction!(mean, m)?)?;
    m.add_function(wrap_pyfunction!(lt, m)?)?;
    m.add_function(wrap_pyfunction!(le, m)?)?;
    m.add_function(wrap_pyfunction!(gt, m)?)?;
    m.add_function(wrap_pyfunction!(ge, m)?)?;
    m.add_function(wrap_pyfunction!(eq, m)?)?;
    m.add_function(wrap_pyfunction!(ne, m)?)?;
    Ok(())
}

/// An operand: a Variable or a Python number.
pub(crate) enum Operand {
    Var(Variable),
    Scalar(f32),
}

/// `obj` as an operand, or `None` for any other type.
pub(crate) fn operand(obj: &Bound<'_, PyAny>) -> PyResult<Option<Operand>> {
    if let Ok(v) = obj.cast::<PyVariable>() {
        return Ok(Some(Operand::Var(v.get().inner().clone())));
    }
    if obj.is_instance_of::<PyFloat>() || obj.is_instance_of::<PyInt>() || is_numpy_scalar(obj)? {
        // A float64 or an int rounds to the nearest float32 (large ints to ±inf).
        return Ok(Some(Operand::Scalar(obj.extract::<f64>()? as f32)));
    }
    Ok(None)
}

/// Whether `obj` is a NumPy number or bool scalar (`numpy.float32(2.0)`; not an array).
fn is_numpy_scalar(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    let Ok(module) = obj.get_type().module() else {
        return Ok(false);
    };
    if module.to_cow().map(|m| m != "numpy").unwrap_or(true) {
        return Ok(false);
    }
    let np = obj.py().import("numpy")?;
    Ok(obj.is_instance(&np.getattr("number")?)? || obj.is_instance(&np.getattr("bool_")?)?)
}

/// Whether `obj` is a NumPy array (`numpy.ndarray` or a subclass).
fn is_numpy_array(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    if obj.is_instance_of::<PyFloat>() || obj.is_instance_of::<PyInt>() {
        return Ok(false);
    }
    let np = obj.py().import("numpy")?;
    obj.is_instance(&np.getattr("ndarray")?)
}

/// A NumPy array operand of an operator as a constant float32 Variable on `like`'s device;
/// `TypeError` naming the dtype for a non-numeric array.
fn array_operand(arr: &Bound<'_, PyAny>, like: &Variable) -> PyResult<Operand> {
    let dtype = arr.getattr("dtype")?;
    let kind: String = dtype.getattr("kind")?.extract()?;
    if !matches!(kind.as_str(), "b" | "i" | "u" | "f") {
        return Err(PyTypeError::new_err(format!(
            "a NumPy array of dtype {} cannot be an operand of a Variable operator: expected a \
             bool, integer or float array",
            dtype.str()?
        )));
    }
    let (data, shape) = crate::variable::float32_data(arr)?;
    let mut t = Tensor::from_vec(data, Shape::new(shape), MemoryCategory::Activation)
        .map_err(crate::errors::tensor_err)?;
    t.transfer_to(like.value().device())
        .map_err(crate::errors::tensor_err)?;
    Ok(Operand::Var(Variable::constant(t)))
}

/// The operands of an operator method (`None`: `NotImplemented`): Variables, numbers, and a
/// NumPy array beside a Variable (a constant on its device, as PyTorch accepts).
fn method_operands(
    lhs: &Bound<'_, PyAny>,
    rhs: &Bound<'_, PyAny>,
) -> PyResult<Option<(Operand, Operand)>> {
    let (a, b) = (operand(lhs)?, operand(rhs)?);
    let (a, b) = match (a, b) {
        (None, Some(Operand::Var(v))) if is_numpy_array(lhs)? => {
            (Some(array_operand(lhs, &v)?), Some(Operand::Var(v)))
        }
        (Some(Operand::Var(v)), None) if is_numpy_array(rhs)? => {
            let b = array_operand(rhs, &v)?;
            (Some(Operand::Var(v)), Some(b))
        }
        other => other,
    };
    match (a, b) {
        (Some(Operand::Scalar(_)), Some(Operand::Scalar(_))) => Ok(None),
        (Some(a), Some(b)) => Ok(Some((a, b))),
        _ => Ok(None),
    }
}

/// Whether `obj` is a NumPy integer scalar (`numpy.int64(1)`; not a bool).
fn is_numpy_integer(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    if !is_numpy_scalar(obj)? {
        return Ok(false);
    }
    obj.is_instance(&obj.py().import("numpy")?.getattr("integer")?)
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

/// Both operands of a functional op; a `TypeError` naming `what` for other types or two numbers.
fn operands(
    what: &str,
    a: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
) -> PyResult<(Operand, Operand)> {
    let bad = |o: &Bound<'_, PyAny>| {
        PyTypeError::new_err(format!(
            "{what}: expected a Variable or a Python int/float operand, got {}",
            type_name(o)
        ))
    };
    let x = operand(a)?.ok_or_else(|| bad(a))?;
    let y = operand(b)?.ok_or_else(|| bad(b))?;
    if let (Operand::Scalar(_), Operand::Scalar(_)) = (&x, &y) {
        return Err(PyTypeError::new_err(format!(
            "{what}: at least one operand must be a Variable, got two numbers"
        )));
    }
    Ok((x, y))
}

fn run(
    py: Python<'_>,
    f: impl FnOnce() -> riftco_autograd::Result<Variable> + Send,
) -> PyResult<PyVariable> {
    compute(py, f).map(PyVariable)
}

/// The four arithmetic operators.
#[derive(Clone, Copy)]
pub(crate) enum Arith {
    Add,
    Sub,
    Mul,
    Div,
}

/// `a op b` for operands already converted (at least one a Variable).
fn arith_operands(py: Python<'_>, op: Arith, a: Operand, b: Operand) -> PyResult<PyVariable> {
    use Operand::{Scalar as S, Var as V};
    run(py, move || match (op, a, b) {
        (Arith::Add, V(a), V(b)) => ops::broadcast_add(&a, &b),
        (Arith::Add, V(x), S(c)) | (Arith::Add, S(c), V(x)) => ops::add_scalar(&x, c),
        (Arith::Sub, V(a), V(b)) => ops::broadcast_sub(&a, &b),
        (Arith::Sub, V(x), S(c)) => ops::sub_scalar(&x, c),
        (Arith::Sub, S(c), V(x)) => ops::rsub_scalar(c, &x),
        (Arith::Mul, V(a), V(b)) => ops::broadcast_mul(&a, &b),
        (Arith::Mul, V(x), S(c)) | (Arith::Mul, S(c), V(x)) => ops::mul_scalar(&x, c),
        (Arith::Div, V(a), V(b)) => ops::broadcast_div(&a, &b),
        (Arith::Div, V(x), S(c)) => ops::div_scalar(&x, c),
        (Arith::Div, S(c), V(x)) => ops::rdiv_scalar(c, &x),
        (_, S(_), S(_)) => unreachable!("checked by the callers: one operand is a Variable"),
    })
}

/// `lhs op rhs` for an operator method: `None` (Python's `NotImplemented`) when `rhs` is not a
/// Variable or a number.
pub(crate) fn arith_method(
    py: Python<'_>,
    op: Arith,
    lhs: &Bound<'_, PyAny>,
    rhs: &Bound<'_, PyAny>,
) -> PyResult<Option<PyVariable>> {
    let Some((a, b)) = method_operands(lhs, rhs)? else {
        return Ok(None);
    };
    arith_operands(py, op, a, b).map(Some)
}

fn scalar_var(c: f32, like: &Variable) -> riftco_autograd::Result<Variable> {
    ops::scalar_like(c, like)
}

/// `a kind b` for a comparison, with scalars as rank-0 constants on the Variable's device.
fn compare_operands(
    py: Python<'_>,
    kind: BinaryOp,
    a: Operand,
    b: Operand,
) -> PyResult<PyVariable> {
    use Operand::{Scalar as S, Var as V};
    run(py, move || match (a, b) {
        (V(a), V(b)) => ops::compare(&a, &b, kind),
        (V(a), S(c)) => ops::compare(&a, &scalar_var(c, &a)?, kind),
        (S(c), V(b)) => ops::compare(&scalar_var(c, &b)?, &b, kind),
        (S(_), S(_)) => unreachable!("checked by the callers: one operand is a Variable"),
    })
}

/// A comparison operator method (`None`: `NotImplemented`).
pub(crate) fn compare_method(
    py: Python<'_>,
    kind: BinaryOp,
    lhs: &Bound<'_, PyAny>,
    rhs: &Bound<'_, PyAny>,
) -> PyResult<Option<PyVariable>> {
    let Some((a, b)) = method_operands(lhs, rhs)? else {
        return Ok(None);
    };
    compare_operands(py, kind, a, b).map(Some)
}

/// `x ** exponent` for a Python number `exponent`.
pub(crate) fn pow_impl(
    py: Python<'_>,
    x: &Variable,
    exponent: &Bound<'_, PyAny>,
) -> PyResult<PyVariable> {
    if exponent.is_instance_of::<PyVariable>() {
        return Err(PyTypeError::new_err(
            "pow: the exponent must be a Python int or float, got a Variable (tensor exponents \
             are not supported)",
        ));
    }
    if !(exponent.is_instance_of::<PyFloat>() || exponent.is_instance_of::<PyInt>()) {
        return Err(PyTypeError::new_err(format!(
            "pow: the exponent must be a Python int or float, got {}",
            type_name(exponent)
        )));
    }
    let p = exponent.extract::<f64>()?;
    if !p.is_finite() || !(p as f32).is_finite() {
        return Err(PyValueError::new_err(format!(
            "pow: the exponent must be a finite number (as a float32), got {p}"
        )));
    }
    let x = x.clone();
    run(py, move || ops::pow_scalar(&x, p as f32))
}

/// `a @ b`: 2-D × 2-D (`ops::matmul`), `[..., m, k] @ [k, n]` (flattened to one matrix
/// product), or `[..., m, k] @ [..., k, n]` with equal leading axes (`ops::bmm`).
pub(crate) fn matmul_impl(py: Python<'_>, a: &Variable, b: &Variable) -> PyResult<PyVariable> {
    let (ra, rb) = (a.dims().len(), b.dims().len());
    // Name both operands' shapes (the ops name one shape and what they expected).
    let both = |what: &str| {
        Exc::Shape.err(format!(
            "matmul: shapes {:?} @ {:?}: {what}",
            a.dims(),
            b.dims()
        ))
    };
    if ra >= 2 && rb >= 2 && a.dims()[ra - 1] != b.dims()[rb - 2] {
        return Err(both(&format!(
            "the inner dimensions {} and {} differ",
            a.dims()[ra - 1],
            b.dims()[rb - 2]
        )));
    }
    if ra >= 3 && ra == rb && a.dims()[..ra - 2] != b.dims()[..rb - 2] {
        return Err(both(
            "the leading (batch) axes differ (they are not broadcast)",
        ));
    }
    let (a, b) = (a.clone(), b.clone());
    if ra == 2 && rb == 2 {
        return run(py, move || ops::matmul(&a, &b));
    }
    if ra >= 3 && rb == 2 {
        let lead = a.dims()[..ra - 1].to_vec();
        let k = a.dims()[ra - 1];
        let rows: usize = lead.iter().product();
        return run(py, move || {
            let flat = ops::reshape(&a, vec![rows, k])?;
            let y = ops::matmul(&flat, &b)?;
            let mut dims = lead;
            dims.push(y.dims()[1]);
            ops::reshape(&y, dims)
        });
    }
    if ra >= 3 && ra == rb {
        return run(py, move || ops::bmm(&a, &b, false));
    }
    Err(Exc::Shape.err(format!(
        "matmul: unsupported operand shapes {:?} @ {:?} (supported: 2-D @ 2-D, N-D @ 2-D, and \
         N-D @ N-D with equal leading axes, N >= 3)",
        a.dims(),
        b.dims()
    )))
}

/// An `axis` argument: `None`, an int, or a tuple/list of ints (bools rejected).
fn axes_arg(axis: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<i64>>> {
    let Some(axis) = axis.filter(|a| !a.is_none()) else {
        return Ok(None);
    };
    let one = |o: &Bound<'_, PyAny>| -> PyResult<i64> {
        // An int or a NumPy integer scalar (`numpy.int64(1)`); bools are refused.
        if o.is_instance_of::<PyBool>() || !(o.is_instance_of::<PyInt>() || is_numpy_integer(o)?) {
            return Err(PyTypeError::new_err(format!(
                "axis must be None, an int or a tuple of ints, got {}",
                type_name(o)
            )));
        }
        o.extract::<i64>()
    };
    if axis.is_instance_of::<PyTuple>() || axis.is_instance_of::<pyo3::types::PyList>() {
        return axis
            .try_iter()?
            .map(|o| one(&o?))
            .collect::<PyResult<_>>()
            .map(Some);
    }
    Ok(Some(vec![one(axis)?]))
}

/// `sum` or `mean` of `x` over `axis`.
pub(crate) fn reduce_impl(
    py: Python<'_>,
    x: &Variable,
    axis: Option<&Bound<'_, PyAny>>,
    keepdims: bool,
    mean: bool,
) -> PyResult<PyVariable> {
    let axes = axes_arg(axis)?;
    let x = x.clone();
    run(py, move || {
        if mean {
            ops::mean_axes(&x, axes.as_deref(), keepdims)
        } else {
            ops::sum_axes(&x, axes.as_deref(), keepdims)
        }
    })
}

/// A one-Variable map.
pub(crate) fn map_impl(
    py: Python<'_>,
    x: &Variable,
    f: fn(&Variable) -> riftco_autograd::Result<Variable>,
) -> PyResult<PyVariable> {
    let x = x.clone();
    run(py, move || f(&x))
}

fn arith_fn(
    py: Python<'_>,
    what: &str,
    op: Arith,
    a: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
) -> PyResult<PyVariable> {
    let (a, b) = operands(what, a, b)?;
    arith_operands(py, op, a, b)
}

fn compare_fn(
    py: Python<'_>,
    what: &str,
    kind: BinaryOp,
    a: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
) -> PyResult<PyVariable> {
    let (a, b) = operands(what, a, b)?;
    compare_operands(py, kind, a, b)
}

/// Elementwise ``a + b`` with NumPy broadcasting.
///
/// Args:
///     a: Variable, or a Python int/float.
///     b: Variable, or a Python int/float (at least one operand is a Variable).
///
/// Returns:
///     Variable: the broadcast shape (float32). VJP: ``g`` summed to each operand's shape.
///
/// Raises:
///     ShapeError: when the shapes do not broadcast (the message names both).
///     TypeError: for another operand type, or two numbers.
#[pyfunction]
fn add(py: Python<'_>, a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> PyResult<PyVariable> {
    arith_fn(py, "add", Arith::Add, a, b)
}

/// Elementwise ``a - b`` with broadcasting.
///
/// Args:
///     a: Variable or number.
///     b: Variable or number.
///
/// Returns:
///     Variable: the broadcast shape.
///
/// Raises:
///     ShapeError: shapes that do not broadcast.
///     TypeError: another operand type, or two numbers.
#[pyfunction]
fn sub(py: Python<'_>, a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> PyResult<PyVariable> {
    arith_fn(py, "sub", Arith::Sub, a, b)
}

/// Elementwise ``a * b`` with broadcasting.
///
/// Args:
///     a: Variable or number.
///     b: Variable or number.
///
/// Returns:
///     Variable: the broadcast shape.
///
/// Raises:
///     ShapeError: shapes that do not broadcast.
///     TypeError: another operand type, or two numbers.
#[pyfunction]
fn mul(py: Python<'_>, a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> PyResult<PyVariable> {
    arith_fn(py, "mul", Arith::Mul, a, b)
}

/// Elementwise true division ``a / b`` with broadcasting (IEEE: ``x / 0`` is ``±inf`` or NaN).
///
/// Args:
///     a: Variable or number.
///     b: Variable or number.
///
/// Returns:
///     Variable: the broadcast shape.
///
/// Raises:
///     ShapeError: shapes that do not broadcast.
///     TypeError: another operand type, or two numbers.
#[pyfunction]
fn div(py: Python<'_>, a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> PyResult<PyVariable> {
    arith_fn(py, "div", Arith::Div, a, b)
}

/// ``-x``.
///
/// Args:
///     x: Variable of any shape.
///
/// Returns:
///     Variable: same shape.
#[pyfunction]
fn neg(py: Python<'_>, x: PyRef<'_, PyVariable>) -> PyResult<PyVariable> {
    map_impl(py, x.inner(), ops::neg)
}

/// ``x ** exponent`` for a scalar exponent (``x * x`` for 2; NaN for negative ``x`` and a
/// non-integer exponent). VJP: ``g * exponent * x ** (exponent - 1)`` (0 for exponent 0).
///
/// Args:
///     x: Variable of any shape.
///     exponent: a Python int or float, finite as a float32.
///
/// Returns:
///     Variable: same shape.
///
/// Raises:
///     TypeError: when ``exponent`` is a Variable or not a number.
///     ValueError: when ``exponent`` is NaN or infinite.
#[pyfunction]
fn pow(
    py: Python<'_>,
    x: PyRef<'_, PyVariable>,
    exponent: &Bound<'_, PyAny>,
) -> PyResult<PyVariable> {
    pow_impl(py, x.inner(), exponent)
}

/// ``exp(x)`` (about 1 ulp; results below ``2**-125`` flush to 0).
///
/// Args:
///     x: Variable of any shape.
///
/// Returns:
///     Variable: same shape.
#[pyfunction]
fn exp(py: Python<'_>, x: PyRef<'_, PyVariable>) -> PyResult<PyVariable> {
    map_impl(py, x.inner(), ops::exp)
}

/// Natural logarithm (NaN for negative inputs, ``-inf`` at 0).
///
/// Args:
///     x: Variable of any shape.
///
/// Returns:
///     Variable: same shape.
#[pyfunction]
fn log(py: Python<'_>, x: PyRef<'_, PyVariable>) -> PyResult<PyVariable> {
    map_impl(py, x.inner(), ops::log)
}

/// ``tanh(x)``.
///
/// Args:
///     x: Variable of any shape.
///
/// Returns:
///     Variable: same shape.
#[pyfunction]
fn tanh(py: Python<'_>, x: PyRef<'_, PyVariable>) -> PyResult<PyVariable> {
    map_impl(py, x.inner(), ops::tanh)
}

/// The logistic sigmoid ``1 / (1 + exp(-x))``.
///
/// Args:
///     x: Variable of any shape.
///
/// Returns:
///     Variable: same shape, values in ``[0, 1]``.
#[pyfunction]
fn sigmoid(py: Python<'_>, x: PyRef<'_, PyVariable>) -> PyResult<PyVariable> {
    map_impl(py, x.inner(), ops::sigmoid)
}

/// ``max(x, 0)`` (gradient 0 at ``x == 0``, as PyTorch).
///
/// Args:
///     x: Variable of any shape.
///
/// Returns:
///     Variable: same shape.
#[pyfunction]
fn relu(py: Python<'_>, x: PyRef<'_, PyVariable>) -> PyResult<PyVariable> {
    map_impl(py, x.inner(), ops::relu)
}

/// GELU (Hendrycks & Gimpel 2016), as ``torch.nn.functional.gelu``.
///
/// Args:
///     x: Variable of any shape.
///     approximate: ``"none"`` (exact, ``x * Phi(x)`` with erf; the default) or ``"tanh"``.
///
/// Returns:
///     Variable: same shape.
///
/// Raises:
///     ValueError: for another ``approximate`` string (the message names it).
#[pyfunction]
#[pyo3(signature = (x, approximate = "none"))]
fn gelu(py: Python<'_>, x: PyRef<'_, PyVariable>, approximate: &str) -> PyResult<PyVariable> {
    let a = match approximate {
        "none" => GeluApproximation::None,
        "tanh" => GeluApproximation::Tanh,
        other => {
            return Err(PyValueError::new_err(format!(
                "gelu: approximate must be \"none\" or \"tanh\", got {other:?}"
            )))
        }
    };
    let x = x.inner().clone();
    run(py, move || ops::gelu(&x, a))
}

/// Log-softmax along ``axis``: ``x - max - log(sum(exp(x - max)))`` (stable for large ``x``).
///
/// Args:
///     x: Variable of rank >= 1.
///     axis: the axis (negative counts from the end; default -1).
///
/// Returns:
///     Variable: same shape. VJP ``g - softmax * sum(g, axis)``.
///
/// Raises:
///     ShapeError: for an axis outside ``[-ndim, ndim)`` (a 0-d ``x`` has none).
#[pyfunction]
#[pyo3(signature = (x, axis = -1), text_signature = "(x, axis=-1)")]
fn log_softmax(py: Python<'_>, x: PyRef<'_, PyVariable>, axis: i64) -> PyResult<PyVariable> {
    let x = x.inner().clone();
    run(py, move || ops::log_softmax(&x, axis))
}

/// Sum over ``axis`` (accumulated in float64 in index order, rounded once).
///
/// Args:
///     x: Variable of any shape.
///     axis: ``None`` (every axis, the default), an int or a tuple of ints (negative counts
///         from the end; an empty tuple reduces nothing, as NumPy).
///     keepdims: keep the reduced axes as size 1.
///
/// Returns:
///     Variable: ``x``'s shape without (or with size 1 at) the reduced axes; shape ``()`` for
///     ``axis=None`` without ``keepdims``.
///
/// Raises:
///     ShapeError: an axis outside ``[-ndim, ndim)`` or repeated (names the axis and rank).
///     TypeError: an axis that is not an int.
#[pyfunction]
#[pyo3(signature = (x, axis = None, keepdims = false))]
fn sum(
    py: Python<'_>,
    x: PyRef<'_, PyVariable>,
    axis: Option<&Bound<'_, PyAny>>,
    keepdims: bool,
) -> PyResult<PyVariable> {
    reduce_impl(py, x.inner(), axis, keepdims, false)
}

/// Mean over ``axis`` (the sum divided by the count; NaN over an empty axis).
///
/// Args:
///     x: Variable of any shape.
///     axis: as ``sum``.
///     keepdims: as ``sum``.
///
/// Returns:
///     Variable: as ``sum``.
///
/// Raises:
///     ShapeError: an axis outside ``[-ndim, ndim)`` or repeated.
///     TypeError: an axis that is not an int.
#[pyfunction]
#[pyo3(signature = (x, axis = None, keepdims = false))]
fn mean(
    py: Python<'_>,
    x: PyRef<'_, PyVariable>,
    axis: Option<&Bound<'_, PyAny>>,
    keepdims: bool,
) -> PyResult<PyVariable> {
    reduce_impl(py, x.inner(), axis, keepdims, true)
}

macro_rules! comparison {
    ($name:ident, $kind:expr, $sym:literal) => {
        #[doc = concat!("``a ", $sym, " b`` elementwise with broadcasting: 1.0 where it holds, ")]
        #[doc = "0.0 elsewhere (float32; NaN compares unequal). Not differentiable: the result"]
        #[doc = "never requires grad.\n\nArgs:\n    a: Variable or number.\n    b: Variable or"]
        #[doc = "number.\n\nReturns:\n    Variable: the broadcast shape.\n\nRaises:\n    "]
        #[doc = "ShapeError: shapes that do not broadcast.\n    TypeError: another operand type."]
        #[pyfunction]
        fn $name(
            py: Python<'_>,
            a: &Bound<'_, PyAny>,
            b: &Bound<'_, PyAny>,
        ) -> PyResult<PyVariable> {
            compare_fn(py, stringify!($name), $kind, a, b)
        }
    };
}

comparison!(lt, BinaryOp::Lt, "<");
comparison!(le, BinaryOp::Le, "<=");
comparison!(gt, BinaryOp::Gt, ">");
comparison!(ge, BinaryOp::Ge, ">=");
comparison!(eq, BinaryOp::Eq, "==");
comparison!(ne, BinaryOp::Ne, "!=");

// ---- `Variable`'s operator methods ----------------------------------------------------------

fn or_not_implemented(py: Python<'_>, r: Option<PyVariable>) -> PyResult<Py<PyAny>> {
    match r {
        Some(v) => Ok(Py::new(py, v)?.into_any()),
        None => Ok(py.NotImplemented()),
    }
}

/// `lhs op rhs` for `__add__` and friends (reflected ones swap the arguments).
pub(crate) fn arith_dunder(
    lhs: &Bound<'_, PyAny>,
    rhs: &Bound<'_, PyAny>,
    op: Arith,
) -> PyResult<Py<PyAny>> {
    let py = lhs.py();
    let r = arith_method(py, op, lhs, rhs)?;
    or_not_implemented(py, r)
}

/// `slf kind other` for the rich comparisons.
pub(crate) fn compare_dunder(
    slf: &Bound<'_, PyVariable>,
    other: &Bound<'_, PyAny>,
    kind: BinaryOp,
) -> PyResult<Py<PyAny>> {
    let py = slf.py();
    let r = compare_method(py, kind, slf.as_any(), other)?;
    or_not_implemented(py, r)
}

/// `slf @ other` (`NotImplemented` unless `other` is a Variable).
pub(crate) fn matmul_dunder(
    slf: &Bound<'_, PyVariable>,
    other: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let py = slf.py();
    let Ok(other) = other.cast::<PyVariable>() else {
        return Ok(py.NotImplemented());
    };
    let r = matmul_impl(py, slf.get().inner(), other.get().inner())?;
    or_not_implemented(py, Some(r))
}

/// `x ** exponent` (three-argument `pow` is a `TypeError`).
pub(crate) fn pow_dunder(
    py: Python<'_>,
    x: &Variable,
    exponent: &Bound<'_, PyAny>,
    modulo: &Bound<'_, PyAny>,
) -> PyResult<PyVariable> {
    if !modulo.is_none() {
        return Err(PyTypeError::new_err(
            "pow() with a modulus is not supported for Variables",
        ));
    }
    pow_impl(py, x, exponent)
}

/// The default `object.__hash__` of `obj` (its address, rotated as CPython does).
pub(crate) fn identity_hash(obj: &Bound<'_, PyAny>) -> isize {
    (obj.as_ptr() as usize).rotate_right(4) as isize
}

/// `bool(x)` as PyTorch: the value of a one-element Variable is nonzero; ambiguous otherwise.
pub(crate) fn truth(x: &Variable) -> PyResult<bool> {
    let n = x.value().numel();
    if n != 1 {
        return Err(PyValueError::new_err(format!(
            "the truth value of a Variable of shape {:?} ({n} elements) is ambiguous: only a \
             one-element Variable has one (compare Variables by identity with `is`)",
            x.dims()
        )));
    }
    Ok(x.value().item().map_err(crate::errors::tensor_err)? != 0.0)
}
