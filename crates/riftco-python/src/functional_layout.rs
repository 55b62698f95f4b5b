//! Layout ops of `riftco._native.functional` (`transpose`, `permute`, `concat`/`cat`, `stack`)
//! and the bodies of the `Variable` layout methods (`__getitem__`, `.T`, `transpose`,
//! `permute`, `reshape`). Indexing follows NumPy's basic indexing; an integer out of range
//! raises `IndexOutOfRangeError`, a subclass of both `ShapeError` and the built-in
//! `IndexError` (so `for row in v` stops at the end, as for a NumPy array).

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PySlice, PyTuple, PyType};
use riftco_autograd::ops::{self, IndexItem};
use riftco_autograd::{AutogradError, Variable};
use riftco_tensor::TensorError;

use crate::errors::{compute, Exc};
use crate::variable::PyVariable;

static INDEX_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

pub(crate) fn register(
    native: &Bound<'_, PyModule>,
    functional: &Bound<'_, PyModule>,
) -> PyResult<()> {
    functional.add_function(wrap_pyfunction!(transpose, functional)?)?;
    functional.add_function(wrap_pyfunction!(permute, functional)?)?;
    let concat = wrap_pyfunction!(concat, functional)?;
    functional.add_function(concat.clone())?;
    functional.add("cat", concat)?;
    functional.add_function(wrap_pyfunction!(stack, functional)?)?;
    native.add("IndexOutOfRangeError", index_error(native.py())?)?;
    Ok(())
}

/// `IndexOutOfRangeError(ShapeError, IndexError)`, created once.
fn index_error(py: Python<'_>) -> PyResult<Bound<'_, PyType>> {
    INDEX_ERROR
        .get_or_try_init(py, || {
            let shape = Exc::Shape
                .type_object(py)
                .ok_or_else(|| PyTypeError::new_err("riftco.ShapeError is not registered"))?;
            let bases = PyTuple::new(
                py,
                [
                    shape.into_any(),
                    py.get_type::<pyo3::exceptions::PyIndexError>().into_any(),
                ],
            )?;
            let ns = PyDict::new(py);
            ns.set_item("__module__", "riftco._native")?;
            ns.set_item(
                "__doc__",
                "An integer index outside -size..size of its axis (the message names the \
                 index, the axis and its size); also a ShapeError and an IndexError.",
            )?;
            let ty = py
                .get_type::<PyType>()
                .call1(("IndexOutOfRangeError", bases, ns))?
                .cast_into::<PyType>()?;
            Ok::<_, PyErr>(ty.unbind())
        })
        .map(|t| t.bind(py).clone())
}

/// Runs a layout op; an index that does not fit the tensor (an integer out of range, too many
/// indices, two `...`) raises [`index_error`].
fn run(
    py: Python<'_>,
    f: impl FnOnce() -> riftco_autograd::Result<Variable> + Send,
) -> PyResult<PyVariable> {
    let out = compute(py, move || match f() {
        Err(AutogradError::Tensor(
            e @ (TensorError::IndexOutOfBounds { .. } | TensorError::InvalidIndex { .. }),
        )) => Ok(Err(e.to_string())),
        other => other.map(Ok),
    })?;
    match out {
        Ok(v) => Ok(PyVariable(v)),
        Err(message) => Err(PyErr::from_type(index_error(py)?, message)),
    }
}

fn type_name(o: &Bound<'_, PyAny>) -> String {
    o.get_type()
        .name()
        .map_or_else(|_| "?".into(), |n| n.to_string())
}

/// One item of an index expression.
fn index_item(py: Python<'_>, item: &Bound<'_, PyAny>, position: usize) -> PyResult<IndexItem> {
    if item.is_none() {
        return Ok(IndexItem::NewAxis);
    }
    if item.is(py.Ellipsis()) {
        return Ok(IndexItem::Ellipsis);
    }
    if let Ok(s) = item.cast::<PySlice>() {
        let bound = |name: &str| -> PyResult<Option<isize>> {
            let v = s.getattr(name)?;
            if v.is_none() {
                return Ok(None);
            }
            if let Ok(i) = v.extract::<isize>() {
                return Ok(Some(i));
            }
            // An int beyond 64 bits: every bound past the axis clamps the same way (and a step
            // that large takes one element), so saturate it.
            if v.is_instance_of::<pyo3::types::PyInt>() {
                return Ok(Some(if v.lt(0)? { isize::MIN } else { isize::MAX }));
            }
            Err(PyTypeError::new_err(format!(
                "slice {name} must be an int or None; got {}",
                type_name(&v)
            )))
        };
        return Ok(IndexItem::Slice {
            start: bound("start")?,
            stop: bound("stop")?,
            step: bound("step")?,
        });
    }
    // A bool is an advanced (mask) index in NumPy; an int or an integer scalar (__index__) is
    // basic.
    let zero_dim = match item.getattr("ndim") {
        Ok(n) => n.extract::<usize>().is_ok_and(|n| n == 0),
        Err(_) => true,
    };
    let is_int = !item.is_instance_of::<pyo3::types::PyBool>()
        && (item.is_instance_of::<pyo3::types::PyInt>() || item.hasattr("__index__")?)
        && zero_dim;
    if is_int {
        // `__index__` as Python's `operator.index`: an exception it raises propagates.
        let int = if item.is_instance_of::<pyo3::types::PyInt>() {
            item.clone()
        } else {
            item.call_method0("__index__")?
        };
        if let Ok(i) = int.extract::<isize>() {
            return Ok(IndexItem::Int(i));
        }
        // Beyond 64 bits: out of range of every axis.
        if int.is_instance_of::<pyo3::types::PyInt>() {
            return Ok(IndexItem::Int(if int.lt(0)? {
                isize::MIN
            } else {
                isize::MAX
            }));
        }
        return Err(PyTypeError::new_err(format!(
            "index item {position}: __index__ of a {} returned a {}, not an int",
            type_name(item),
            type_name(&int)
        )));
    }
    Err(PyTypeError::new_err(format!(
        "advanced indexing is not supported: index item {position} is a {}; use ints, \
         slices, ... and None",
        type_name(item)
    )))
}

/// ``x[key]`` (the body of ``Variable.__getitem__``).
pub(crate) fn getitem(
    py: Python<'_>,
    x: &PyVariable,
    key: &Bound<'_, PyAny>,
) -> PyResult<PyVariable> {
    let items: Vec<IndexItem> = match key.cast::<PyTuple>() {
        Ok(t) => t
            .iter()
            .enumerate()
            .map(|(i, item)| index_item(py, &item, i))
            .collect::<PyResult<_>>()?,
        Err(_) => vec![index_item(py, key, 0)?],
    };
    let x = x.inner().clone();
    run(py, move || ops::index(&x, &items))
}

/// ``x.T``: all axes reversed (NumPy's ``.T``).
pub(crate) fn reversed(py: Python<'_>, x: &PyVariable) -> PyResult<PyVariable> {
    let x = x.inner().clone();
    let axes: Vec<isize> = (0..x.dims().len() as isize).rev().collect();
    run(py, move || ops::permute(&x, &axes))
}

/// ``x.transpose(dim0, dim1)``.
pub(crate) fn transpose_method(
    py: Python<'_>,
    x: &PyVariable,
    dim0: isize,
    dim1: isize,
) -> PyResult<PyVariable> {
    let x = x.inner().clone();
    run(py, move || ops::transpose(&x, dim0, dim1))
}

/// The integers of ``*args``, or of a single tuple or list argument (``f(1, 2)`` or
/// ``f((1, 2))``).
fn varargs(args: &Bound<'_, PyTuple>, what: &str) -> PyResult<Vec<isize>> {
    let err = |o: &Bound<'_, PyAny>| {
        PyTypeError::new_err(format!(
            "{what} must be ints (as arguments or one tuple/list); got {}",
            type_name(o)
        ))
    };
    if args.len() == 1 {
        let a = args.get_item(0)?;
        if a.is_instance_of::<PyTuple>() || a.is_instance_of::<pyo3::types::PyList>() {
            return a.extract::<Vec<isize>>().map_err(|_| err(&a));
        }
    }
    args.iter()
        .map(|a| a.extract::<isize>().map_err(|_| err(&a)))
        .collect()
}

/// ``x.permute(*axes)``.
pub(crate) fn permute_method(
    py: Python<'_>,
    x: &PyVariable,
    axes: &Bound<'_, PyTuple>,
) -> PyResult<PyVariable> {
    let axes = varargs(axes, "permute: axes")?;
    let x = x.inner().clone();
    run(py, move || ops::permute(&x, &axes))
}

/// ``x.reshape(*shape)``.
pub(crate) fn reshape_method(
    py: Python<'_>,
    x: &PyVariable,
    shape: &Bound<'_, PyTuple>,
) -> PyResult<PyVariable> {
    let items: Vec<Bound<'_, PyAny>> = if shape.len() == 1
        && (shape.get_item(0)?.is_instance_of::<PyTuple>()
            || shape.get_item(0)?.is_instance_of::<pyo3::types::PyList>())
    {
        shape.get_item(0)?.try_iter()?.collect::<PyResult<_>>()?
    } else {
        shape.iter().collect()
    };
    reshape_items(py, x, &items)
}

/// ``reshape(x, shape)`` for Python ints: dimensions up to ``usize::MAX`` (a shape whose
/// element count wraps is then a ``ShapeError``), or one ``-1`` inferred.
pub(crate) fn reshape_items(
    py: Python<'_>,
    x: &PyVariable,
    items: &[Bound<'_, PyAny>],
) -> PyResult<PyVariable> {
    let mut dims: Vec<Option<usize>> = Vec::with_capacity(items.len());
    for item in items {
        if let Ok(d) = item.extract::<usize>() {
            dims.push(Some(d));
        } else if let Ok(d) = item.extract::<isize>() {
            if d != -1 {
                return Err(crate::errors::Exc::Config.err(format!(
                    "reshape: shape has the negative dimension {d}; dimensions are >= 0 (or \
                     one -1)"
                )));
            }
            dims.push(None);
        } else {
            return Err(PyTypeError::new_err(format!(
                "reshape: shape must be ints; got {}",
                type_name(item)
            )));
        }
    }
    let x = x.inner().clone();
    if dims.iter().all(Option::is_some) {
        let dims: Vec<usize> = dims.into_iter().flatten().collect();
        return run(py, move || ops::reshape(&x, dims));
    }
    // With a -1 every other dimension must fit in isize (else the -1 cannot be inferred).
    let signed: Option<Vec<isize>> = dims
        .iter()
        .map(|d| d.map_or(Some(-1), |d| isize::try_from(d).ok()))
        .collect();
    let Some(shape) = signed else {
        return Err(crate::errors::Exc::Config.err(format!(
            "reshape: cannot reshape a tensor of shape {:?} into {dims:?} (None = -1): the -1 \
             cannot be inferred next to a dimension above {}",
            x.dims(),
            isize::MAX
        )));
    };
    run(py, move || ops::reshape_infer(&x, &shape))
}

/// Swaps two axes (PyTorch's ``transpose(x, dim0, dim1)``; negative axes count from the end).
///
/// Args:
///     x: Variable of rank >= 1.
///     dim0, dim1: the axes to swap, in ``-rank..rank``.
///
/// Returns:
///     Variable: a contiguous copy with the two dimensions swapped. VJP: the same swap.
///
/// Raises:
///     ShapeError: an axis out of range (naming it and the rank).
///
/// Example:
///     >>> import numpy as np, riftco
///     >>> from riftco import functional as F
///     >>> x = riftco.Variable(np.zeros((2, 3, 4)))
///     >>> F.transpose(x, 0, -1).shape
///     (4, 3, 2)
///     >>> x.transpose(1, 2).shape, x.T.shape, x.permute(2, 0, 1).shape
///     ((2, 4, 3), (4, 3, 2), (4, 2, 3))
#[pyfunction]
fn transpose(
    py: Python<'_>,
    x: PyRef<'_, PyVariable>,
    dim0: isize,
    dim1: isize,
) -> PyResult<PyVariable> {
    transpose_method(py, &x, dim0, dim1)
}

/// Reorders the axes: output axis ``i`` is input axis ``axes[i]`` (NumPy's
/// ``transpose(x, axes)``, PyTorch's ``permute``).
///
/// Args:
///     x: Variable of any rank.
///     axes: a permutation of the axes (negative ones count from the end).
///
/// Returns:
///     Variable: a contiguous copy of shape ``[x.shape[a] for a in axes]``. VJP: the inverse
///     permutation.
///
/// Raises:
///     ShapeError: an axis out of range. ConfigError (a ValueError): ``axes`` of the wrong
///         length or repeating an axis.
///
/// Example:
///     >>> import numpy as np, riftco
///     >>> from riftco import functional as F
///     >>> F.permute(riftco.Variable(np.zeros((2, 3, 4))), [2, 0, -2]).shape
///     (4, 2, 3)
#[pyfunction]
fn permute(py: Python<'_>, x: PyRef<'_, PyVariable>, axes: Vec<isize>) -> PyResult<PyVariable> {
    let x = x.inner().clone();
    run(py, move || ops::permute(&x, &axes))
}

/// Joins Variables along an existing axis (NumPy's ``concatenate``; alias ``cat``).
///
/// Args:
///     xs: a non-empty sequence of Variables of equal rank (>= 1), equal dimensions except
///         along ``axis``, on one device.
///     axis: the joined axis (negative counts from the end), default 0.
///
/// Returns:
///     Variable: shape of ``xs[0]`` with ``axis`` the sum of the inputs' sizes. VJP: each
///     input gets its slice of the gradient.
///
/// Raises:
///     ShapeError: shapes that disagree off ``axis`` (naming both shapes and the axis), or an
///         axis out of range. ConfigError (a ValueError): an empty sequence or rank-0 inputs.
///
/// Example:
///     >>> import numpy as np, riftco
///     >>> from riftco import functional as F
///     >>> a = riftco.Variable(np.ones((2, 3)))
///     >>> F.concat([a, riftco.Variable(np.zeros((2, 1)))], axis=-1).numpy()
///     array([[1., 1., 1., 0.],
///            [1., 1., 1., 0.]], dtype=float32)
///     >>> F.cat([a, a]).shape
///     (4, 3)
#[pyfunction]
#[pyo3(signature = (xs, axis = 0))]
fn concat(py: Python<'_>, xs: Vec<PyRef<'_, PyVariable>>, axis: isize) -> PyResult<PyVariable> {
    let xs: Vec<Variable> = xs.iter().map(|x| x.inner().clone()).collect();
    run(py, move || ops::concat(&xs, axis))
}

/// Stacks Variables of one shape along a new axis (NumPy's and PyTorch's ``stack``).
///
/// Args:
///     xs: a non-empty sequence of Variables of the same shape.
///     axis: the new axis of the output, in ``-(rank+1)..rank+1``; default 0.
///
/// Returns:
///     Variable: shape of ``xs[0]`` with ``len(xs)`` inserted at ``axis``.
///
/// Raises:
///     ShapeError: inputs of different shapes (naming both), or an axis out of range.
///     ConfigError (a ValueError): an empty sequence.
///
/// Example:
///     >>> import numpy as np, riftco
///     >>> from riftco import functional as F
///     >>> a = riftco.Variable(np.ones((2, 3)))
///     >>> F.stack([a, a, a], axis=1).shape
///     (2, 3, 3)
#[pyfunction]
#[pyo3(signature = (xs, axis = 0))]
fn stack(py: Python<'_>, xs: Vec<PyRef<'_, PyVariable>>, axis: isize) -> PyResult<PyVariable> {
    let xs: Vec<Variable> = xs.iter().map(|x| x.inner().clone()).collect();
    run(py, move || ops::stack(&xs, axis))
}
