//! `riftco._native.functional`: thin differentiable wrappers over `riftco_autograd::ops`.
//!
//! Every function releases the GIL while it computes and records a graph node (unless inputs
//! need no gradient). Shape problems raise `ShapeError` naming both shapes.

use pyo3::prelude::*;
use riftco_autograd::{ops, Variable};

use crate::errors::compute;
use crate::tokens::token_ids;
use crate::variable::PyVariable;

pub(crate) fn register(parent: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = parent.py();
    let m = PyModule::new(py, "functional")?;
    m.setattr(
        "__doc__",
        "Differentiable ops on riftco Variables (thin wrappers over riftco_autograd::ops).",
    )?;
    m.add_function(wrap_pyfunction!(scale, &m)?)?;
    m.add_function(wrap_pyfunction!(matmul, &m)?)?;
    m.add_function(wrap_pyfunction!(linear, &m)?)?;
    m.add_function(wrap_pyfunction!(silu, &m)?)?;
    m.add_function(wrap_pyfunction!(swiglu, &m)?)?;
    m.add_function(wrap_pyfunction!(softmax, &m)?)?;
    m.add_function(wrap_pyfunction!(rms_norm, &m)?)?;
    m.add_function(wrap_pyfunction!(reshape, &m)?)?;
    m.add_function(wrap_pyfunction!(cross_entropy, &m)?)?;
    m.add_function(wrap_pyfunction!(dropout, &m)?)?;
    // Broadcasting arithmetic, comparisons, maps and reductions (add, mul and sum among them).
    crate::functional_math::register(&m)?;
    crate::functional_layout::register(parent, &m)?;
    parent.add_submodule(&m)?;
    // `import riftco._native.functional` and stubtest find it through sys.modules.
    m.setattr("__name__", "riftco._native.functional")?;
    py.import("sys")?
        .getattr("modules")?
        .set_item("riftco._native.functional", &m)?;
    Ok(())
}

fn unary(
    py: Python<'_>,
    x: &PyVariable,
    f: impl FnOnce(&Variable) -> riftco_autograd::Result<Variable> + Send,
) -> PyResult<PyVariable> {
    let x = x.inner().clone();
    compute(py, move || f(&x)).map(PyVariable)
}

fn binary(
    py: Python<'_>,
    a: &PyVariable,
    b: &PyVariable,
    f: impl FnOnce(&Variable, &Variable) -> riftco_autograd::Result<Variable> + Send,
) -> PyResult<PyVariable> {
    let (a, b) = (a.inner().clone(), b.inner().clone());
    compute(py, move || f(&a, &b)).map(PyVariable)
}

/// ``alpha * x``.
///
/// Args:
///     x: Variable of any shape.
///     alpha: the float factor.
///
/// Returns:
///     Variable: same shape.
#[pyfunction]
fn scale(py: Python<'_>, x: PyRef<'_, PyVariable>, alpha: f32) -> PyResult<PyVariable> {
    unary(py, &x, move |x| ops::scale(x, alpha))
}

/// Matrix product ``a @ b`` of 2-D variables.
///
/// Args:
///     a: Variable ``[m, k]``.
///     b: Variable ``[k, n]``.
///
/// Returns:
///     Variable: ``[m, n]``.
///
/// Raises:
///     ShapeError: when an operand is not 2-D or the inner dimensions differ.
#[pyfunction]
fn matmul(
    py: Python<'_>,
    a: PyRef<'_, PyVariable>,
    b: PyRef<'_, PyVariable>,
) -> PyResult<PyVariable> {
    binary(py, &a, &b, ops::matmul)
}

/// Linear layer ``x @ w.T (+ bias)`` (PyTorch ``nn.functional.linear``, ``nn.Linear`` layout).
///
/// With a bias the result is one graph node (the product before the bias is added is not
/// kept); values and gradients are bitwise those of ``add(linear(x, w), bias)``.
///
/// Args:
///     x: Variable ``[..., in]``.
///     w: Variable ``[out, in]``.
///     bias: optional Variable ``[out]``.
///
/// Returns:
///     Variable: ``[..., out]``.
///
/// Raises:
///     ShapeError: when ``w`` is not 2-D, its ``in`` differs from ``x``'s last dimension, or
///         ``bias`` is not ``[out]``.
#[pyfunction]
#[pyo3(signature = (x, w, bias = None))]
fn linear(
    py: Python<'_>,
    x: PyRef<'_, PyVariable>,
    w: PyRef<'_, PyVariable>,
    bias: Option<PyRef<'_, PyVariable>>,
) -> PyResult<PyVariable> {
    match bias {
        None => binary(py, &x, &w, ops::linear),
        Some(b) => {
            let (x, w, b) = (x.inner().clone(), w.inner().clone(), b.inner().clone());
            compute(py, move || ops::linear_bias(&x, &w, &b)).map(PyVariable)
        }
    }
}

/// SiLU, ``x * sigmoid(x)`` (Elfwing et al. 2018).
///
/// Args:
///     x: Variable of any shape.
///
/// Returns:
///     Variable: same shape.
#[pyfunction]
fn silu(py: Python<'_>, x: PyRef<'_, PyVariable>) -> PyResult<PyVariable> {
    unary(py, &x, ops::silu)
}

/// SwiGLU, ``silu(gate) * up`` (Shazeer 2020, eq. 6), fused.
///
/// Args:
///     gate: Variable of any shape.
///     up: Variable of the same shape.
///
/// Returns:
///     Variable: same shape.
///
/// Raises:
///     ShapeError: when the shapes differ.
#[pyfunction]
fn swiglu(
    py: Python<'_>,
    gate: PyRef<'_, PyVariable>,
    up: PyRef<'_, PyVariable>,
) -> PyResult<PyVariable> {
    binary(py, &gate, &up, ops::swiglu)
}

/// Softmax over the last axis.
///
/// Args:
///     x: Variable ``[..., n]`` with ``n >= 1``.
///
/// Returns:
///     Variable: same shape; rows sum to 1.
///
/// Raises:
///     ShapeError: for a 0-d input or a zero-sized last axis.
#[pyfunction]
fn softmax(py: Python<'_>, x: PyRef<'_, PyVariable>) -> PyResult<PyVariable> {
    unary(py, &x, ops::softmax)
}

/// RMSNorm (Zhang & Sennrich 2019): ``x / sqrt(mean(x**2, -1) + eps) * weight``.
///
/// Args:
///     x: Variable ``[..., d]``.
///     weight: Variable ``[d]``.
///     eps: added to the mean square (default 1e-5); as a float32 it must be finite and > 0.
///
/// Returns:
///     Variable: ``[..., d]``.
///
/// Raises:
///     ConfigError: when ``eps`` (as a float32) is NaN, infinite, zero or negative.
///     ShapeError: when ``weight`` is not ``[d]``.
#[pyfunction]
#[pyo3(signature = (x, weight, eps = 1e-5))]
fn rms_norm(
    py: Python<'_>,
    x: PyRef<'_, PyVariable>,
    weight: PyRef<'_, PyVariable>,
    eps: f32,
) -> PyResult<PyVariable> {
    binary(py, &x, &weight, move |x, w| ops::rms_norm(x, w, eps))
}

/// The same elements with another shape (shares storage with ``x``).
///
/// Args:
///     x: Variable of any shape.
///     shape: the new shape, with the same element count; one dimension may be ``-1``
///         (inferred from the element count).
///
/// Returns:
///     Variable: of shape ``shape``.
///
/// Raises:
///     ShapeError: when the element counts differ. ConfigError (a ValueError): more than one
///         ``-1``, another negative dimension, or a ``-1`` that cannot be inferred.
#[pyfunction]
fn reshape(
    py: Python<'_>,
    x: PyRef<'_, PyVariable>,
    shape: Vec<Bound<'_, PyAny>>,
) -> PyResult<PyVariable> {
    crate::functional_layout::reshape_items(py, &x, &shape)
}

/// Mean softmax cross-entropy, ``mean_r(logsumexp(z_r) - z_r[t_r])``.
///
/// Args:
///     logits: Variable ``[rows, vocab]``.
///     targets: integer array-like ``[rows]`` of class ids in ``[0, vocab)``.
///
/// Returns:
///     Variable: a one-element scalar.
///
/// Raises:
///     ShapeError: when ``logits`` is not 2-D or the row counts differ.
///     TokenError: for a target outside ``[0, vocab)`` (the message names it) or a non-integer
///         or non-1-D ``targets``.
#[pyfunction]
fn cross_entropy(
    py: Python<'_>,
    logits: PyRef<'_, PyVariable>,
    targets: &Bound<'_, PyAny>,
) -> PyResult<PyVariable> {
    let vocab = logits.inner().dims().last().copied().unwrap_or(0);
    let (targets, _) = token_ids(targets, 1, vocab, "targets")?;
    unary(py, &logits, move |z| ops::cross_entropy(z, &targets))
}

/// Dropout (Srivastava et al. 2014) with inverted scaling: each element of ``x`` is kept with
/// probability ``1 - p`` and scaled by ``1 / (1 - p)``, or set to exactly 0.
///
/// The mask is a pure function of a counter-based generator's key and counter (Philox4x32-10,
/// Salmon et al. 2011): independent of the thread count, and regenerated (not stored) by the VJP
/// ``dx = g * mask / (1 - p)``. With ``seed``, the mask depends on the seed and the shape only.
/// Without, it is drawn from this thread's generator (``riftco.manual_seed``,
/// ``riftco.get_rng_state``), which advances; inside ``riftco.checkpoint`` with
/// ``preserve_rng_state=True`` (the default) the replay draws the forward's mask.
///
/// Args:
///     x: Variable of any shape (float32).
///     p: drop probability in ``[0, 1)`` (default 0.5, as PyTorch).
///     seed: optional non-negative int below 2**64.
///     training: when False, returns ``x`` unchanged (as ``torch.nn.functional.dropout``).
///
/// Returns:
///     Variable: same shape. ``p == 0`` or ``training=False`` returns ``x`` itself.
///
/// Raises:
///     ConfigError: ``p`` not a number, a bool, NaN or outside ``[0, 1)`` (names ``p``);
///         ``seed`` not an int in ``[0, 2**64)`` (a bool included).
#[pyfunction]
#[pyo3(signature = (x, p=None, seed=None, training=true))]
fn dropout(
    py: Python<'_>,
    x: PyRef<'_, PyVariable>,
    p: Option<&Bound<'_, PyAny>>,
    seed: Option<&Bound<'_, PyAny>>,
    training: bool,
) -> PyResult<PyVariable> {
    let seed = seed.map(|s| crate::rng::u64_arg(s, "seed")).transpose()?;
    let p = match p {
        Some(p) => crate::config::probability("p", p)?,
        None => 0.5,
    };
    if !training {
        return Ok(PyVariable(x.inner().clone()));
    }
    unary(py, &x, move |x| match seed {
        Some(seed) => ops::dropout_seeded(x, p, seed),
        None => ops::dropout_random(x, p),
    })
}
