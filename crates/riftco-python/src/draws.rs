//! `uniform(shape, low, high)` and `normal(shape, mean, std)`: new leaf Variables drawn from
//! the calling thread's generator (`riftco.manual_seed`), for parameter initialisation
//! (`riftco.nn`).
//!
//! Each call reserves one generator block (`riftco_autograd::rng::reserve(1)`), so consecutive
//! draws are independent and a `manual_seed(s)` followed by the same calls gives the same
//! values. The block's Philox4x32-10 output (key from the seed, counter the reserved offset on
//! stream `[0, 1]`) seeds riftco's portable xoshiro256++ generator
//! (`riftco_tensor::random::Rng`), whose uniform and Box–Muller normal samples are the values,
//! in row-major order: the same bits on every platform.

use pyo3::prelude::*;
use riftco_autograd::ops::dropout::philox_key;
use riftco_autograd::{rng, AutogradError, Variable};
use riftco_kernels::philox::philox4x32_10;
use riftco_tensor::alloc::try_vec_with_capacity;
use riftco_tensor::random::Rng;
use riftco_tensor::{MemoryCategory, Shape, Tensor};

use crate::errors::{compute, Exc};
use crate::variable::PyVariable;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(uniform, m)?)?;
    m.add_function(wrap_pyfunction!(normal, m)?)?;
    Ok(())
}

/// The counter words 2 and 3 of the block a draw reserves (dropout's functional stream is
/// `[0, 0]`; the blocks never coincide anyway, since reserved offsets are disjoint).
const DRAW_STREAM: [u32; 2] = [0, 1];

/// A generator seeded from one block reserved on this thread's generator.
fn reserved_rng() -> Result<Rng, AutogradError> {
    let state = rng::reserve(1)?;
    let n = state.offset;
    let words = philox4x32_10(
        [n as u32, (n >> 32) as u32, DRAW_STREAM[0], DRAW_STREAM[1]],
        philox_key(state.seed),
    );
    let seed = u64::from(words[0]) | (u64::from(words[1]) << 32);
    Ok(Rng::new(seed))
}

/// A leaf of `shape` whose values `sample` draws in row-major order.
fn draw(
    py: Python<'_>,
    op: &'static str,
    shape: Vec<usize>,
    requires_grad: bool,
    sample: impl Fn(&mut Rng) -> f32 + Send,
) -> PyResult<PyVariable> {
    let category = if requires_grad {
        MemoryCategory::Parameter
    } else {
        MemoryCategory::Workspace
    };
    let v = compute(py, move || {
        let shape = Shape::try_new(op, shape)?;
        let numel = shape.check(op)?;
        let mut data = try_vec_with_capacity::<f32>(op, numel)?;
        let mut g = reserved_rng()?;
        data.extend((0..numel).map(|_| sample(&mut g)));
        let t = Tensor::from_vec(data, shape, category)?;
        Ok::<_, AutogradError>(Variable::leaf(t, requires_grad))
    })?;
    Ok(PyVariable(v))
}

/// A new leaf with values drawn uniformly from ``[low, high)`` on this thread's generator
/// (``riftco.manual_seed``), like ``torch.empty(shape).uniform_(low, high)``.
///
/// Rounding to float32 can give ``high`` itself for ranges where its neighbours are coarse;
/// values are always within ``[low, high]``.
///
/// Args:
///     shape: the dimensions (a sequence of ints >= 0).
///     low: the lower bound (finite).
///     high: the upper bound (finite, > ``low``).
///     requires_grad: whether the leaf is trainable (then its memory counts as a parameter).
///
/// Returns:
///     Variable: float32 of ``shape``.
///
/// Raises:
///     ConfigError: a non-finite bound or ``low >= high`` (naming both).
///     ShapeError: a shape with more elements than a buffer can hold.
///     OutOfMemoryError: when the values cannot be allocated.
#[pyfunction]
#[pyo3(signature = (shape, low = 0.0, high = 1.0, requires_grad = false))]
fn uniform(
    py: Python<'_>,
    shape: Vec<usize>,
    low: f32,
    high: f32,
    requires_grad: bool,
) -> PyResult<PyVariable> {
    if !(low.is_finite() && high.is_finite() && low < high) {
        return Err(Exc::Config.err(format!(
            "uniform: low and high must be finite with low < high; got low={low}, high={high}"
        )));
    }
    draw(py, "uniform", shape, requires_grad, move |g| {
        g.uniform(low, high).clamp(low, high)
    })
}

/// A new leaf with normally distributed values of mean ``mean`` and standard deviation ``std``
/// drawn on this thread's generator (``riftco.manual_seed``), like
/// ``torch.empty(shape).normal_(mean, std)`` (Box–Muller in float64, rounded once).
///
/// Args:
///     shape: the dimensions (a sequence of ints >= 0).
///     mean: the mean (finite).
///     std: the standard deviation (finite, >= 0).
///     requires_grad: whether the leaf is trainable (then its memory counts as a parameter).
///
/// Returns:
///     Variable: float32 of ``shape``.
///
/// Raises:
///     ConfigError: a non-finite ``mean`` or ``std``, or ``std < 0`` (naming it).
///     ShapeError: a shape with more elements than a buffer can hold.
///     OutOfMemoryError: when the values cannot be allocated.
#[pyfunction]
#[pyo3(signature = (shape, mean = 0.0, std = 1.0, requires_grad = false))]
fn normal(
    py: Python<'_>,
    shape: Vec<usize>,
    mean: f32,
    std: f32,
    requires_grad: bool,
) -> PyResult<PyVariable> {
    if !(mean.is_finite() && std.is_finite() && std >= 0.0) {
        return Err(Exc::Config.err(format!(
            "normal: mean must be finite and std finite and >= 0; got mean={mean}, std={std}"
        )));
    }
    let (mean, std) = (f64::from(mean), f64::from(std));
    draw(py, "normal", shape, requires_grad, move |g| {
        (mean + std * g.normal()) as f32
    })
}
