//! `checkpoint(fn, x, dependencies, save=...)`: the activation-checkpointing primitive with a
//! Python callable, and `named(name, fn, *inputs)`: the named values a selective checkpoint
//! keeps.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use riftco_autograd::{
    AutogradError, CheckpointOptions, CheckpointPass, DeterminismCheck, Variable,
};

use crate::errors::{autograd_err, guarded, PythonError};
use crate::variable::{variables, PyVariable};

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(checkpoint, m)?)?;
    let named = wrap_pyfunction!(named, m)?;
    m.add_function(named.clone())?;
    // The same function object is also `functional.named`, beside the ops it names.
    m.getattr("functional")?
        .cast_into::<PyModule>()?
        .add("named", named)?;
    Ok(())
}

/// Calls the Python callable on `args` with the GIL held; a Python exception travels as
/// `AutogradError::External(PythonError)` and is re-raised unchanged at the boundary. `what`
/// names the caller in the type error for a result that is not a Variable; `note`, when given,
/// is added to the exception (PEP 678 ``add_note``, or ``__notes__`` before Python 3.11) so the
/// traceback says which checkpoint's replay raised it.
fn call_python(
    f: &Py<PyAny>,
    args: &[Variable],
    what: &str,
    note: Option<&str>,
) -> Result<Variable, AutogradError> {
    Python::attach(|py| {
        let out = PyTuple::new(py, args.iter().map(|v| PyVariable(v.clone())))
            .and_then(|args| f.bind(py).call1(args))
            .and_then(|o| {
                let type_name = o
                    .get_type()
                    .name()
                    .map_or_else(|_| "?".into(), |n| n.to_string());
                o.cast_into::<PyVariable>()
                    .map(|v| v.get().inner().clone())
                    .map_err(|_| {
                        PyTypeError::new_err(format!(
                            "{what}: the callable must return a riftco.Variable; it returned \
                             {type_name}"
                        ))
                    })
            });
        out.map_err(|e| {
            if let Some(note) = note {
                add_note(e.value(py), note);
            }
            AutogradError::external(PythonError::new(py, e))
        })
    })
}

/// PEP 678: appends `note` to the exception's notes (best effort: an exception object that
/// refuses attributes keeps its message alone).
fn add_note(exc: &Bound<'_, pyo3::exceptions::PyBaseException>, note: &str) {
    if exc.hasattr("add_note").unwrap_or(false) {
        let _ = exc.call_method1("add_note", (note,));
        return;
    }
    let notes = match exc.getattr("__notes__") {
        Ok(n) => n,
        Err(_) => {
            let n = pyo3::types::PyList::empty(exc.py()).into_any();
            if exc.setattr("__notes__", &n).is_err() {
                return;
            }
            n
        }
    };
    let _ = notes.call_method1("append", (note,));
}

/// Activation checkpointing (Chen et al. 2016): computes ``fn(x)`` now, keeps only its output
/// value, and runs ``fn`` once more during backward to rebuild the graph it needs.
///
/// Several inputs: with ``x`` a tuple or list of Variables, ``fn`` is called with them as
/// positional arguments (``fn(*x)``, PyTorch's ``checkpoint(fn, *args)``); the checkpoint's
/// parents are the inputs then the dependencies, and each input receives its own gradient. The
/// output must depend on every input (whether it requires grad or not): an input it does not
/// use raises ``CheckpointError`` naming its position. Each input must be a distinct Variable
/// and none may also be listed in ``dependencies``.
///
/// ``fn`` is called exactly twice per forward-and-backward: once now, once during
/// ``backward()`` (with the GIL re-acquired from the backward pass). It must be deterministic
/// and replay-safe (random numbers only through riftco's generator, see below). Every pre-existing leaf it reads (parameters) must be listed in
/// ``dependencies``; they receive their gradients through the checkpoint.
///
/// An exception raised by ``fn`` — now or during replay — propagates unchanged (the same
/// exception object) and, during replay, leaves every public gradient untouched; a replay's
/// exception also carries a note (PEP 678, shown under its traceback) naming the checkpoint:
/// ``raised in the replay of checkpoint "NAME" ...``, NAME being ``name`` or the callable's
/// ``__qualname__``.
///
/// During its replay ``fn`` must not call ``backward()`` or ``backward_accumulate()`` of any
/// graph: such a call raises ``CheckpointError`` and commits nothing (so the outer pass either
/// commits all its gradients or, on failure, none). Nor may ``fn`` change a value the graph read
/// (an optimizer ``step()``, ``load_weights``, ``merge_lora``): the outer ``backward()`` then
/// raises ``StaleGraphError`` naming the tensor and commits nothing.
///
/// Selective checkpointing: values ``fn`` computes through ``named(name, f, *inputs)`` whose
/// name is in ``save`` are kept from the first run, and at the replay ``named`` returns them
/// (with the graph ``f`` recorded, so every VJP sees the same values) instead of calling ``f``
/// again; everything else is recomputed. Gradients are those of ``save=None`` bit for bit;
/// the memory is that of the kept values. This is the save-list form of JAX's
/// ``save_only_these_names`` remat policy and PyTorch's selective activation checkpointing.
///
/// Random numbers: ``fn`` may draw through riftco's generator (``manual_seed``,
/// ``get_rng_state``; random ops such as dropout). With ``preserve_rng_state=True`` (the
/// default, as in PyTorch) the replay starts from the generator state the first run started
/// from, so it draws the same numbers, and the calling thread's state is restored afterwards
/// (the replay does not disturb the caller's stream). With ``False`` the replay draws from
/// whatever the state is when ``backward()`` reaches it.
///
/// ``determinism_check`` selects what the replay is compared on: ``"off"`` (the output shape
/// only, kept so that a wrong-shaped gradient is always an error), ``"metadata"`` (the
/// default, PyTorch's level: shape and device, and the graph the replay records — its op
/// names and shapes: a replay taking another path, e.g. a module switched between ``train()``
/// and ``eval()`` before ``backward()``, raises ``CheckpointError``; a replay computing other
/// values through the same ops is NOT caught), ``"values"`` (also a 64-bit hash of the output values and the
/// generator counter: a replay computing other values, or drawing other random blocks, raises
/// ``CheckpointError`` from ``backward()`` naming the checkpoint and the first differing
/// element with both values, and no gradient is committed).
///
/// Args:
///     fn: callable ``fn(Variable) -> Variable`` (``fn(*x) -> Variable`` for a tuple ``x``).
///     x: the input Variable (its gradient flows through the checkpoint), or a non-empty tuple
///         or list of Variables.
///     dependencies: the distinct leaf Variables ``fn`` reads besides ``x``.
///     save: names of ``named`` values to keep from the first run (a list or tuple of str;
///         ``None`` or empty: recompute everything, the plain checkpoint).
///     preserve_rng_state: replay the first run's random draws (bool, default ``True``).
///     determinism_check: ``"off"``, ``"metadata"`` (default) or ``"values"``.
///     name: what error messages call this checkpoint (default: ``fn.__qualname__``; for a
///         ``functools.partial`` ``partial(<function>)``, for a callable object its type's name).
///     prune_unused_dependencies: drop a dependency the first run's output does not depend on
///         (it gets no gradient) instead of refusing it (default ``False``: the list must be
///         exact). ``riftco.checkpoint`` sets it for the dependencies it discovers.
///
/// Returns:
///     Variable: a node with the output's value whose parents are ``x`` (each of its Variables)
///     and ``dependencies``.
///
/// Raises:
///     CheckpointError: an empty tuple ``x``, the same Variable twice in ``x`` or in ``x`` and
///         ``dependencies``, duplicate or non-leaf dependencies, a leaf read but not declared, a
///         captured graph node from outside, a new trainable leaf created inside, an output not
///         depending on ``x`` or on a dependency, a replay changing the output shape; from the
///         outer ``backward()``, ``fn`` calling ``backward()`` during its replay. With ``save``:
///         a name in ``save`` that no ``named`` call of the first run used (the message lists
///         the names used), a saved ``named`` function reading a graph value that is not one of
///         its ``inputs``, or a replay calling the saved names in another order or with other
///         input shapes than the first run. With ``determinism_check="values"``, from the outer
///         ``backward()``: a replay output differing from the first run's (the message names
///         the checkpoint, the flat index of the first differing element and both values) or
///         a replay drawing other generator blocks (both offsets).
///     ConfigError: an unknown ``determinism_check`` spelling (naming it and the three
///         accepted ones).
///     TypeError: ``x`` is neither a Variable nor a tuple or list of Variables (naming its type,
///         or the position and type of the item that is not a Variable); ``save`` is a str or
///         holds a non-str.
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
///     >>> def block(h):
///     ...     z = riftco.named("z", lambda a: F.linear(a, w), h)
///     ...     return F.silu(z)
///     >>> y = riftco.checkpoint(block, x, [w], save=["z"])  # the replay reuses z
#[pyfunction]
#[pyo3(signature = (r#fn, x, dependencies = Vec::new(), *, save = None,
                    preserve_rng_state = true, determinism_check = "metadata", name = None,
                    prune_unused_dependencies = false))]
#[allow(clippy::too_many_arguments)]
fn checkpoint(
    r#fn: Py<PyAny>,
    x: Bound<'_, PyAny>,
    dependencies: Vec<Bound<'_, PyVariable>>,
    save: Option<Bound<'_, PyAny>>,
    preserve_rng_state: bool,
    determinism_check: &str,
    name: Option<String>,
    prune_unused_dependencies: bool,
) -> PyResult<PyVariable> {
    let check: DeterminismCheck = determinism_check.parse().map_err(autograd_err)?;
    let options = CheckpointOptions::saving(save_names(save.as_ref())?)
        .with_preserve_rng_state(preserve_rng_state)
        .with_determinism_check(check)
        .with_prune_unused_dependencies(prune_unused_dependencies);
    let name = match name {
        Some(n) => n,
        None => Python::attach(|py| callable_name(r#fn.bind(py))),
    };
    let deps = variables(&dependencies);
    let inputs = checkpoint_inputs(&x)?;
    let replay_note = format!(
        "raised in the replay of checkpoint {name:?} (its recomputation during backward())"
    );
    guarded(move || {
        let f = r#fn;
        riftco_autograd::checkpoint_multi_with_options(
            &name,
            &inputs,
            &deps,
            &options,
            move |xs, pass| match pass {
                CheckpointPass::Forward => call_python(&f, xs, "checkpoint", None),
                CheckpointPass::Replay => call_python(&f, xs, "checkpoint", Some(&replay_note)),
            },
        )
        .map(PyVariable)
        .map_err(autograd_err)
    })
}

/// The inputs of `checkpoint`: one Variable, or a tuple or list of Variables.
fn checkpoint_inputs(x: &Bound<'_, PyAny>) -> PyResult<Vec<Variable>> {
    let type_name = |o: &Bound<'_, PyAny>| {
        o.get_type()
            .name()
            .map_or_else(|_| "?".into(), |n| n.to_string())
    };
    if let Ok(v) = x.cast::<PyVariable>() {
        return Ok(vec![v.get().inner().clone()]);
    }
    let items: Vec<Bound<'_, PyAny>> = if let Ok(t) = x.cast::<PyTuple>() {
        t.iter().collect()
    } else if let Ok(l) = x.cast::<pyo3::types::PyList>() {
        l.iter().collect()
    } else {
        return Err(PyTypeError::new_err(format!(
            "checkpoint: x must be a riftco.Variable or a tuple or list of Variables; got {}",
            type_name(x)
        )));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            item.cast::<PyVariable>()
                .map(|v| v.get().inner().clone())
                .map_err(|_| {
                    PyTypeError::new_err(format!(
                        "checkpoint: input {i} of x must be a riftco.Variable; got {}",
                        type_name(item)
                    ))
                })
        })
        .collect()
}

/// What error messages call a checkpoint given no `name`: the callable's `__qualname__` (or
/// `__name__`); for a `functools.partial`, `partial(<its function's name>)`; for any other
/// callable object, its type's `__qualname__` (a module's class, an instance with
/// `__call__`); `"checkpoint"` only when none of these exists.
fn callable_name(f: &Bound<'_, PyAny>) -> String {
    let own = |o: &Bound<'_, PyAny>| {
        ["__qualname__", "__name__"]
            .iter()
            .find_map(|attr| o.getattr(*attr).ok()?.extract::<String>().ok())
    };
    if let Some(name) = own(f) {
        return name;
    }
    // functools.partial (and look-alikes) keep the wrapped callable in `.func`.
    if let Ok(inner) = f.getattr("func") {
        if let Some(name) = own(&inner) {
            return format!("partial({name})");
        }
    }
    own(f.get_type().as_any()).unwrap_or_else(|| "checkpoint".to_string())
}

/// The names of `save`: `None`, or a list or tuple of str (a lone str is refused: it would be
/// read as its characters).
fn save_names(save: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<String>> {
    let Some(save) = save.filter(|s| !s.is_none()) else {
        return Ok(Vec::new());
    };
    if save.is_instance_of::<pyo3::types::PyString>() {
        return Err(PyTypeError::new_err(format!(
            "checkpoint: save must be a list or tuple of names, not a str; got {}",
            save.repr().map_or_else(|_| "?".into(), |r| r.to_string())
        )));
    }
    save.extract::<Vec<String>>().map_err(|_| {
        PyTypeError::new_err(format!(
            "checkpoint: save must be None or a list or tuple of str names; got {}",
            save.repr().map_or_else(|_| "?".into(), |r| r.to_string())
        ))
    })
}

/// Names the value ``fn(*inputs)``: inside a ``checkpoint`` whose ``save`` lists ``name``, the
/// first run keeps the value (and the graph ``fn`` recorded) and the replay returns it instead
/// of calling ``fn`` again; anywhere else it is just ``fn(*inputs)``.
///
/// ``fn`` may read, besides ``inputs``, only leaves (parameters, constants); a saved name keeps
/// every value ``fn`` recorded, so wrap the one expensive op rather than a large group. Nested
/// ``named`` calls inside a saved ``fn`` just run.
///
/// Args:
///     name: the value's name (what ``checkpoint(..., save=[...])`` lists).
///     fn: callable ``fn(*inputs) -> Variable``.
///     *inputs: the Variables ``fn`` computes from (graph values of the checkpoint's callable:
///         the replay passes its recomputed ones, with the same shapes).
///
/// Returns:
///     Variable: ``fn(*inputs)`` (at a saving replay: the kept value, as a node of the replay's
///     graph).
///
/// Raises:
///     CheckpointError: inside a checkpoint saving ``name``, when ``fn`` read a graph value that
///         is not in ``inputs``, or when the replay calls the saved names in another order or
///         with other input shapes than the first run.
///     TypeError: an input that is not a Variable, or ``fn`` returning something else.
///     Exception: whatever ``fn`` raises, unchanged.
///
/// Example:
///     >>> import numpy as np, riftco
///     >>> from riftco import functional as F
///     >>> w = riftco.Variable(np.ones((3, 3)), requires_grad=True)
///     >>> x = riftco.Variable(np.ones((2, 3)))
///     >>> riftco.named("z", lambda a: F.linear(a, w), x).shape
///     (2, 3)
#[pyfunction]
#[pyo3(signature = (name, r#fn, *inputs))]
fn named(name: &str, r#fn: Py<PyAny>, inputs: &Bound<'_, PyTuple>) -> PyResult<PyVariable> {
    let mut vars = Vec::with_capacity(inputs.len());
    for (i, item) in inputs.iter().enumerate() {
        let v = item.cast::<PyVariable>().map_err(|_| {
            let type_name = item
                .get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string());
            PyTypeError::new_err(format!(
                "named({name:?}): input {i} must be a riftco.Variable; got {type_name}"
            ))
        })?;
        vars.push(v.get().inner().clone());
    }
    guarded(move || {
        let refs: Vec<&Variable> = vars.iter().collect();
        let what = format!("named({name:?})");
        riftco_autograd::named(name, &refs, || call_python(&r#fn, &vars, &what, None))
            .map(PyVariable)
            .map_err(autograd_err)
    })
}
