//! `checkpoint(fn, x, dependencies)`: the activation-checkpointing primitive with a
//! Python callable.

use pyo3::prelude::*;
use riftco_autograd::{AutogradError, Variable};

use crate::errors::{autograd_err, guarded, PythonError};
use crate::variable::{variables, PyVariable};

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(checkpoint, m)?)?;
    Ok(())
}

/// Calls the Python callable with the GIL held; a Python exception travels as
/// `AutogradError::External(PythonError)` and is re-raised unchanged at the boundary.
fn call_python(f: &Py<PyAny>, x: &Variable) -> Result<Variable, AutogradError> {
    Python::attach(|py| {
        let out = f.bind(py).call1((PyVariable(x.clone()),)).and_then(|o| {
            o.cast_into::<PyVariable>()
                .map(|v| v.get().inner().clone())
                .map_err(|e| {
                    pyo3::exceptions::PyTypeError::new_err(format!(
                        "checkpoint: the callable must return a riftco.Variable ({e})"
                    ))
                })
        });
        out.map_err(|e| AutogradError::external(PythonError::new(py, e)))
    })
}

/// Activation checkpointing (Chen et al. 2016): computes ``fn(x)`` now, keeps only its output
/// value, and runs ``fn`` once more during backward to rebuild the graph it needs.
///
/// ``fn`` is called exactly twice per forward-and-backward: once now, once during
/// ``backward()`` (with the GIL re-acquired from the backward pass). It must be deterministic
/// and replay-safe. Every pre-existing leaf it reads (parameters) must be listed in
/// ``dependencies``; they receive their gradients through the checkpoint.
///
/// An exception raised by ``fn`` — now or during replay — propagates unchanged (the same
/// exception object) and, during replay, leaves every public gradient untouched.
///
/// During its replay ``fn`` must not call ``backward()`` or ``backward_accumulate()`` of any
/// graph: such a call raises ``CheckpointError`` and commits nothing (so the outer pass either
/// commits all its gradients or, on failure, none). Nor may ``fn`` change a value the graph read
/// (an optimizer ``step()``, ``load_weights``, ``merge_lora``): the outer ``backward()`` then
/// raises ``StaleGraphError`` naming the tensor and commits nothing.
///
/// Args:
///     fn: callable ``fn(Variable) -> Variable``.
///     x: the input Variable (its gradient flows through the checkpoint).
///     dependencies: the distinct leaf Variables ``fn`` reads besides ``x``.
///
/// Returns:
///     Variable: a node with the output's value whose parents are ``x`` and ``dependencies``.
///
/// Raises:
///     CheckpointError: duplicate or non-leaf dependencies, a leaf read but not declared, a
///         captured graph node from outside, a new trainable leaf created inside, an output not
///         depending on ``x`` or on a dependency, a replay changing the output shape; from the
///         outer ``backward()``, ``fn`` calling ``backward()`` during its replay.
///     StaleGraphError: ``fn`` changed ``x`` or a dependency during this first run.
///     Exception: whatever ``fn`` raises.
///
/// Example:
///     >>> import numpy as np, riftco
///     >>> from riftco import functional as F
///     >>> w = riftco.Variable(np.ones((3, 3)), requires_grad=True)
///     >>> x = riftco.Variable(np.ones((2, 3)))
///     >>> y = riftco.checkpoint(lambda h: F.silu(F.linear(h, w)), x, [w])
///     >>> F.sum(y).backward()
///     >>> w.grad.shape
///     (3, 3)
#[pyfunction]
#[pyo3(signature = (r#fn, x, dependencies = Vec::new()))]
fn checkpoint(
    r#fn: Py<PyAny>,
    x: PyRef<'_, PyVariable>,
    dependencies: Vec<Bound<'_, PyVariable>>,
) -> PyResult<PyVariable> {
    let deps = variables(&dependencies);
    let input = x.inner().clone();
    guarded(move || {
        let f = r#fn;
        riftco_autograd::checkpoint(&input, &deps, move |x| call_python(&f, x))
            .map(PyVariable)
            .map_err(autograd_err)
    })
}
