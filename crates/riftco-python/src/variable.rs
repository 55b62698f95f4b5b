//! `Variable`: a graph node of `riftco_autograd` with NumPy conversions.

use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{IntoPyArray, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFloat, PyTuple};
use riftco_autograd::{BackwardOptions, Variable};
use riftco_tensor::{MemoryCategory, Shape, Tensor};

use crate::errors::{compute, tensor_err, Error, Exc};
use crate::functional_math as fm;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyVariable>()?;
    m.add_function(wrap_pyfunction!(tensor, m)?)?;
    Ok(())
}

/// A node of the computation graph: a float32 value, and for results of ops the record needed
/// to differentiate them.
///
/// Leaves are created from array-likes (``Variable(array, requires_grad=True)``); every op of
/// ``riftco.functional`` and every model forward returns a new node. The graph keeps alive
/// everything ``backward()`` needs, so deleting a model or inputs after a forward pass does not
/// break the backward pass.
///
/// Args:
///     array: any array-like of numbers (converted to a C-contiguous float32 copy).
///     requires_grad: whether gradients flow into this leaf (a trainable parameter).
///     name: optional name used in error messages (for example stale-graph errors).
///
/// Raises:
///     TypeError: when ``array`` cannot be converted to float32.
///
/// Example:
///     >>> import numpy as np, riftco
///     >>> w = riftco.Variable(np.ones((2, 3)), requires_grad=True)
///     >>> w.shape
///     (2, 3)
#[pyclass(name = "Variable", module = "riftco._native", frozen)]
#[derive(Clone)]
pub struct PyVariable(pub(crate) Variable);

impl PyVariable {
    pub(crate) fn inner(&self) -> &Variable {
        &self.0
    }
}

/// The float32 values and the shape of any array-like (NumPy array, nested list, scalar).
pub(crate) fn float32_data(obj: &Bound<'_, PyAny>) -> PyResult<(Vec<f32>, Vec<usize>)> {
    let py = obj.py();
    let np = py.import("numpy")?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("dtype", np.getattr("float32")?)?;
    // `numpy.array(..., order="C")` keeps 0-d inputs 0-d (`ascontiguousarray` makes them 1-D).
    kwargs.set_item("order", "C")?;
    let arr = np
        .getattr("array")?
        .call((obj,), Some(&kwargs))
        .map_err(|e| {
            PyTypeError::new_err(format!(
                "cannot convert {} to a float32 array: {}",
                obj.get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default(),
                e.value(py)
            ))
        })?;
    let arr = arr.cast_into::<PyArrayDyn<f32>>()?;
    let ro = arr.readonly();
    let shape = ro.shape().to_vec();
    let data = match ro.as_slice() {
        Ok(s) => s.to_vec(),
        Err(_) => ro.as_array().iter().copied().collect(),
    };
    Ok((data, shape))
}

/// The most axes a NumPy array built from a tensor may have (rust-numpy's limit, that of
/// NumPy 1; NumPy 2 allows 64).
pub(crate) const NUMPY_MAX_AXES: usize = 32;

/// `ShapeError` unless a tensor of shape `dims` can become a NumPy array (at most
/// [`NUMPY_MAX_AXES`] axes); every conversion to NumPy checks this first.
pub(crate) fn check_numpy_rank(dims: &[usize]) -> PyResult<()> {
    if dims.len() > NUMPY_MAX_AXES {
        return Err(Exc::Shape.err(format!(
            "cannot convert a value of rank {} (shape {dims:?}) to a NumPy array: at most \
             {NUMPY_MAX_AXES} axes are supported; reshape it first",
            dims.len()
        )));
    }
    Ok(())
}

/// A float32 NumPy copy of a tensor.
///
/// Raises `ShapeError` for a tensor of more than [`NUMPY_MAX_AXES`] axes.
pub(crate) fn tensor_to_numpy<'py>(
    py: Python<'py>,
    t: &Tensor,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let dims = t.dims().to_vec();
    check_numpy_rank(&dims)?;
    // Explicit host access: a copy from whatever device the tensor lives on.
    let data = t.to_host().map_err(crate::errors::tensor_err)?;
    let arr = ArrayD::from_shape_vec(IxDyn(&dims), data)
        .map_err(|e| Exc::Shape.err(format!("tensor of shape {dims:?}: {e}")))?;
    Ok(arr.into_pyarray(py))
}

#[pymethods]
impl PyVariable {
    #[new]
    #[pyo3(signature = (array, requires_grad = false, name = None))]
    fn new(array: &Bound<'_, PyAny>, requires_grad: bool, name: Option<String>) -> PyResult<Self> {
        // A trainable leaf's value is a parameter, any other input workspace, whatever the
        // source (a NumPy array or another Variable, copied on its device).
        let category = if requires_grad {
            MemoryCategory::Parameter
        } else {
            MemoryCategory::Workspace
        };
        if let Ok(v) = array.cast::<PyVariable>() {
            let t = v
                .get()
                .0
                .value()
                .try_deep_clone(category)
                .map_err(crate::errors::tensor_err)?;
            return Ok(Self(make_leaf(t, requires_grad, name)));
        }
        let (data, shape) = float32_data(array)?;
        // From the buffer pool, where the value's buffer returns when the Variable drops.
        let t = Tensor::from_slice(&data, Shape::new(shape), category).map_err(tensor_err)?;
        Ok(Self(make_leaf(t, requires_grad, name)))
    }

    /// ``x[key]``: NumPy basic indexing (ints, slices with steps, ``...``, ``None``, tuples of
    /// these), a differentiable copy whose VJP scatters the gradient into zeros of ``x``'s
    /// shape. Raises ``IndexOutOfRangeError`` (an ``IndexError`` and a ``ShapeError``) for an
    /// int out of range, naming the index, axis and size, for more ints and slices than axes
    /// (any int index of a 0-d Variable) and for two ``...``; ``ConfigError`` (a
    /// ``ValueError``) for a slice step of 0; ``TypeError`` for advanced indices (lists,
    /// arrays, bools); an exception raised by an index's ``__index__`` propagates.
    ///
    /// Example:
    ///     >>> import numpy as np, riftco
    ///     >>> x = riftco.Variable(np.arange(24.0).reshape(2, 3, 4))
    ///     >>> x[1, ::-2, None, -1].numpy()
    ///     array([[23.],
    ///            [15.]], dtype=float32)
    ///     >>> x[..., 1:3].shape, x[0, 5:].shape
    ///     ((2, 3, 2), (0, 4))
    fn __getitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Self> {
        crate::functional_layout::getitem(py, self, key)
    }

    /// All axes reversed (NumPy's ``.T``), a differentiable copy.
    #[getter(T)]
    fn reversed_axes(&self, py: Python<'_>) -> PyResult<Self> {
        crate::functional_layout::reversed(py, self)
    }

    /// Swaps axes ``dim0`` and ``dim1`` (PyTorch's signature; negative axes count from the end).
    fn transpose(&self, py: Python<'_>, dim0: isize, dim1: isize) -> PyResult<Self> {
        crate::functional_layout::transpose_method(py, self, dim0, dim1)
    }

    /// Reorders the axes: ``x.permute(2, 0, 1)`` or ``x.permute((2, 0, 1))``.
    #[pyo3(signature = (*axes))]
    fn permute(&self, py: Python<'_>, axes: &Bound<'_, PyTuple>) -> PyResult<Self> {
        crate::functional_layout::permute_method(py, self, axes)
    }

    /// The same elements with another shape: ``x.reshape(2, -1)`` or ``x.reshape((2, -1))``
    /// (one ``-1`` is inferred). ``ShapeError`` when the element counts differ;
    /// ``ConfigError`` for several ``-1``, another negative dimension, or a ``-1`` that
    /// cannot be inferred.
    ///
    /// Example:
    ///     >>> import numpy as np, riftco
    ///     >>> x = riftco.Variable(np.zeros((2, 3, 4)))
    ///     >>> x.reshape(4, -1).shape, x.reshape((-1,)).shape
    ///     ((4, 6), (24,))
    #[pyo3(signature = (*shape))]
    fn reshape(&self, py: Python<'_>, shape: &Bound<'_, PyTuple>) -> PyResult<Self> {
        crate::functional_layout::reshape_method(py, self, shape)
    }

    /// The device the value lives on (``"cpu"``, the device of the model whose weights or
    /// outputs this is, or the one ``to`` copied it to: ``"vulkan"``, ``"metal"``,
    /// ``"privateuseone"``).
    #[getter]
    fn device(&self) -> &'static str {
        self.0.value().device().name()
    }

    /// This value on ``device`` (PyTorch's ``Tensor.to``): ``self`` when it lives there
    /// already, otherwise a copy (the original is unchanged, so no graph that reads it goes
    /// stale).
    ///
    /// A leaf becomes a new leaf with the same ``requires_grad`` and name (a parameter moved
    /// for an optimizer built afterwards; the copy's gradient is its own, PyTorch's copy of a
    /// leaf would be a graph node instead). An op result becomes a graph node whose backward
    /// copies the gradient back to this value's device, so a graph may span devices.
    ///
    /// Args:
    ///     device: ``"cpu"``, ``"vulkan"``, ``"metal"``, ``"gpu"`` (the best adapter) or
    ///         ``"privateuseone"`` (case-insensitive), as ``DecoderOnlyTransformer.to``.
    ///
    /// Returns:
    ///     Variable: of the same shape (float32) on the resolved device.
    ///
    /// Raises:
    ///     ConfigError: an unknown device name (the message lists the valid ones).
    ///     DeviceUnavailableError: no adapter of the GPU asked for (naming what was looked for
    ///         and what was found), or no backend for ``"privateuseone"``.
    ///     OutOfMemoryError: the copy cannot be allocated.
    ///
    /// Example:
    ///     >>> import numpy as np, riftco
    ///     >>> x = riftco.Variable(np.ones(3), requires_grad=True)
    ///     >>> x.to("cpu") is x
    ///     True
    fn to<'py>(slf: Bound<'py, Self>, device: &str) -> PyResult<Bound<'py, Self>> {
        let py = slf.py();
        let v = slf.get().0.clone();
        match compute(py, || crate::transfer::variable_to(&v, device))? {
            None => Ok(slf),
            Some(moved) => Bound::new(py, Self(moved)),
        }
    }

    /// The shape of the value.
    ///
    /// Returns:
    ///     tuple[int, ...]: for example ``(batch * seq, vocab)`` for logits.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.0.dims())
    }

    /// Number of dimensions (``len(shape)``).
    #[getter]
    fn ndim(&self) -> usize {
        self.0.dims().len()
    }

    /// Number of dimensions (PyTorch's ``dim()``, the same as ``ndim``).
    fn dim(&self) -> usize {
        self.0.dims().len()
    }

    /// A float32 NumPy copy of the value.
    ///
    /// Returns:
    ///     numpy.ndarray: float32, of shape ``self.shape``.
    ///
    /// Raises:
    ///     ShapeError: the value has more than 32 axes (the most a NumPy array built here may
    ///         have; also for ``numpy.asarray(v)`` and ``grad``).
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        tensor_to_numpy(py, self.0.value())
    }

    /// ``numpy.asarray(variable)`` support (a float32 copy).
    #[pyo3(signature = (dtype = None, copy = None))]
    fn __array__<'py>(
        &self,
        py: Python<'py>,
        dtype: Option<Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = copy;
        let arr = tensor_to_numpy(py, self.0.value())?.into_any();
        match dtype {
            Some(d) if !d.is_none() => arr.call_method1("astype", (d,)),
            _ => Ok(arr),
        }
    }

    /// The value of a one-element variable as a Python float.
    ///
    /// Raises:
    ///     ShapeError: when the variable has more than one element.
    fn item(&self) -> PyResult<f32> {
        self.0.value().item().map_err(tensor_err)
    }

    /// ``float(v)``: the value of a one-element variable (as ``item()``); ``ShapeError`` for
    /// more elements.
    fn __float__(&self) -> PyResult<f64> {
        self.item().map(f64::from)
    }

    /// ``int(v)``: the value of a one-element variable truncated toward zero (as
    /// ``int(v.item())``: ``ValueError`` for NaN, ``OverflowError`` for an infinity);
    /// ``ShapeError`` for more elements.
    fn __int__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let x = self.item()?;
        Ok(PyFloat::new(py, f64::from(x))
            .call_method0("__int__")?
            .unbind())
    }

    /// ``format(v, spec)`` and f-strings: with an empty spec any variable formats as
    /// ``str(v)`` (as every Python object); with a spec a one-element variable formats its
    /// value as a float (``f"{loss:.3f}"``), and more elements are a ``TypeError`` (as NumPy).
    fn __format__(slf: &Bound<'_, Self>, spec: &str) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let v = slf.get();
        if spec.is_empty() {
            return Ok(slf.str()?.into_any().unbind());
        }
        if v.0.value().numel() == 1 {
            return Ok(PyFloat::new(py, f64::from(v.item()?))
                .call_method1("__format__", (spec,))?
                .unbind());
        }
        Err(PyTypeError::new_err(format!(
            "unsupported format string {spec:?} for a Variable of shape {:?}: only a \
             one-element Variable formats as a number",
            v.0.dims()
        )))
    }

    /// The gradient committed by the last successful backward pass, or ``None``.
    ///
    /// Returns:
    ///     numpy.ndarray | None: a float32 copy of shape ``self.shape``.
    ///
    /// Raises:
    ///     ShapeError: the variable has more than 32 axes.
    #[getter]
    fn grad<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyArrayDyn<f32>>>> {
        self.0.grad().map(|g| tensor_to_numpy(py, &g)).transpose()
    }

    /// Replaces the committed gradient of a trainable leaf (PyTorch's ``p.grad = g``); ``None``
    /// clears it as ``zero_grad()``. Data-parallel training
    /// (:mod:`riftco.distributed`) writes all-reduced gradients back with it.
    ///
    /// Args:
    ///     value: an array-like of the variable's shape (a float32 copy, moved to its device),
    ///         or ``None``.
    ///
    /// Raises:
    ///     ShapeError: ``value``'s shape differs from the variable's.
    ///     ConfigError: the variable is an op result or does not require grad.
    ///     CheckpointError: inside a checkpoint's replay (as ``zero_grad()``).
    ///     TypeError: ``value`` is not numeric.
    #[setter(grad)]
    fn set_grad(&self, value: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let g = match value {
            Some(v) if !v.is_none() => Some(gradient_tensor(v, self.0.value().device())?),
            _ => None,
        };
        self.0.replace_grad(g).map_err(|e| Error::from(e).into())
    }

    /// Overwrites the value of a leaf in place with ``array`` (PyTorch's
    /// ``with torch.no_grad(): p.copy_(src)``), on the leaf's device. The value's version moves
    /// on, so a graph recorded before reading the old value raises ``StaleGraphError`` at
    /// ``backward()``. Data-parallel training with ZeRO writes the all-gathered weights with it.
    ///
    /// Args:
    ///     array: an array-like of the variable's shape (converted to float32).
    ///
    /// Raises:
    ///     ShapeError: ``array``'s shape differs from the variable's.
    ///     ConfigError: the variable is an op result (its value belongs to a graph).
    ///     TypeError: ``array`` is not numeric.
    fn copy_(&self, array: &Bound<'_, PyAny>) -> PyResult<()> {
        if !self.0.is_leaf() {
            return Err(Exc::Config.err(format!(
                "copy_: {} is the result of op {}; only leaves can be overwritten",
                self.0.describe(),
                self.0.op_name()
            )));
        }
        let (data, shape) = float32_data(array)?;
        if shape != self.0.dims() {
            return Err(Exc::Shape.err(format!(
                "copy_: {} has shape {:?}, the array {:?}",
                self.0.describe(),
                self.0.dims(),
                shape
            )));
        }
        self.0.value().copy_from_slice(&data).map_err(tensor_err)
    }

    /// Whether gradients flow to this node.
    #[getter]
    fn requires_grad(&self) -> bool {
        self.0.requires_grad()
    }

    /// Whether this is a leaf (created from data, not by an op).
    #[getter]
    fn is_leaf(&self) -> bool {
        self.0.is_leaf()
    }

    /// The name used in messages, or ``None``.
    #[getter]
    fn name(&self) -> Option<String> {
        self.0.name()
    }

    /// The op that produced this node (``"leaf"`` for leaves).
    #[getter]
    fn op(&self) -> &'static str {
        self.0.op_name()
    }

    /// Backpropagates from this one-element output in a fresh, isolated pass and *replaces* the
    /// gradient of every trainable leaf reached. The GIL is released meanwhile (checkpoint
    /// callables written in Python re-acquire it during replay).
    ///
    /// Raises:
    ///     ShapeError: when the output has more than one element.
    ///     StaleGraphError: when a value the graph read changed since the forward pass (an
    ///         optimizer step, ``load_weights``, ``merge_lora``), also when a checkpoint
    ///         callable changed one during its replay; nothing is committed.
    ///     CheckpointError: a checkpoint replay violated its contract, or this ``backward()``
    ///         was called by a checkpoint callable during its replay; nothing is committed.
    ///     Exception: an exception raised by a Python checkpoint callable during replay,
    ///         unchanged; nothing is committed.
    ///
    /// ``retain_graph=False`` (keyword; PyTorch's name) frees each node's saved values as soon
    /// as its VJP has run, so memory falls during the pass: a graph whose tail runs plainly
    /// peaks at the larger of the tail and one checkpoint replay, not their sum. The graph can
    /// then not be differentiated again (``RiftcoError`` naming the node: run the forward
    /// again). The default (``None`` or ``True``) keeps it: a second ``backward()`` on an
    /// unchanged graph gives the same gradients (PyTorch's default frees it; training loops
    /// should pass ``False``, as ``riftco``'s stages do).
    ///
    /// ``gradient_hook`` (keyword), when given, is called as ``gradient_hook(leaf, grad)`` with
    /// each trainable leaf and its gradient (a float32 array of its shape) as soon as the pass
    /// has summed all of it (its last consumer ran), in the pass's order (the same for the same
    /// graph), with the GIL held; the native gradient is released before the call. The hook
    /// returns ``None`` (the gradient is not committed: the hook took it) or an array of the
    /// leaf's shape to commit as its gradient. Data-parallel training with ZeRO stage 2
    /// reduce-scatters gradients bucket by bucket this way. The public gradients stay
    /// all-or-nothing; what the hook did before an error is not undone. An exception raised by
    /// the hook stops the pass and propagates unchanged.
    #[pyo3(signature = (*, retain_graph = None, gradient_hook = None))]
    fn backward(
        &self,
        py: Python<'_>,
        retain_graph: Option<bool>,
        gradient_hook: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let retain_graph = retain_graph.unwrap_or(true);
        let v = self.0.clone();
        let options = BackwardOptions {
            retain_graph,
            ..BackwardOptions::default()
        };
        let Some(f) = gradient_hook else {
            return compute(py, move || v.backward_with(options));
        };
        compute(py, move || {
            let mut hook = |leaf: &Variable, g: Tensor| call_gradient_hook(&f, leaf, g);
            v.backward_with_hook(options, &mut hook)
        })
    }

    /// Like ``backward()`` but *adds* the gradients to the committed ones (gradient
    /// accumulation across micro-batches). Start an accumulation with ``zero_grad()`` or a plain
    /// ``backward()``. ``retain_graph`` as for ``backward()``.
    ///
    /// Raises:
    ///     As ``backward()``.
    #[pyo3(signature = (*, retain_graph = None))]
    fn backward_accumulate(&self, py: Python<'_>, retain_graph: Option<bool>) -> PyResult<()> {
        let retain_graph = retain_graph.unwrap_or(true);
        let v = self.0.clone();
        compute(py, move || {
            v.backward_with(BackwardOptions {
                retain_graph,
                accumulate: true,
                ..BackwardOptions::default()
            })
        })
    }

    /// Clears this node's committed gradient, releasing its buffer (PyTorch's
    /// ``set_to_none=True``).
    ///
    /// Raises:
    ///     CheckpointError: inside a checkpoint's replay (in its callable, or from a thread the
    ///         callable started, for a parameter of that checkpoint): the outer backward pass
    ///         owns the gradients until it commits; nothing changes.
    fn zero_grad(&self) -> PyResult<()> {
        self.0.zero_grad().map_err(|e| Error::from(e).into())
    }

    /// A new leaf sharing this value, detached from the graph (never requires grad).
    fn detach(&self) -> Self {
        Self(self.0.detach())
    }

    /// Size of the graph reachable from this node (memory diagnostics).
    ///
    /// Returns:
    ///     dict[str, int]: ``node_count`` (reachable nodes) and ``element_count`` (float32
    ///     elements owned by their values and gradients).
    fn graph_statistics(&self, py: Python<'_>) -> PyResult<Py<PyDict>> {
        let v = self.0.clone();
        let s = compute(py, move || Ok::<_, Error>(v.graph_statistics()))?;
        let d = PyDict::new(py);
        d.set_item("node_count", s.node_count)?;
        d.set_item("element_count", s.element_count)?;
        Ok(d.unbind())
    }

    fn __repr__(&self) -> String {
        let name = match self.0.name() {
            Some(n) => format!(", name={n:?}"),
            None => String::new(),
        };
        format!(
            "Variable(shape={:?}, op={}, requires_grad={}{name})",
            self.0.dims(),
            self.0.op_name(),
            if self.0.requires_grad() {
                "True"
            } else {
                "False"
            },
        )
    }

    fn __len__(&self) -> PyResult<usize> {
        self.0
            .dims()
            .first()
            .copied()
            .ok_or_else(|| PyTypeError::new_err("len() of a 0-d Variable"))
    }

    /// ``iter(v)``: the sub-Variables ``v[0], v[1], ...`` along the first axis (lazily);
    /// ``TypeError`` for a 0-d Variable (as NumPy: iteration over a 0-d array).
    fn __iter__(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let Some(&n) = slf.get().0.dims().first() else {
            return Err(PyTypeError::new_err("iteration over a 0-d Variable"));
        };
        let builtins = py.import("builtins")?;
        let range = builtins.getattr("range")?.call1((n,))?;
        let getitem = slf.getattr("__getitem__")?;
        Ok(builtins.getattr("map")?.call1((getitem, range))?.unbind())
    }

    // ---- operators and math methods (bodies in functional_math; see its docs) -------------

    fn __add__(slf: &Bound<'_, Self>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        fm::arith_dunder(slf.as_any(), other, fm::Arith::Add)
    }
    fn __radd__(slf: &Bound<'_, Self>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        fm::arith_dunder(other, slf.as_any(), fm::Arith::Add)
    }
    fn __sub__(slf: &Bound<'_, Self>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        fm::arith_dunder(slf.as_any(), other, fm::Arith::Sub)
    }
    fn __rsub__(slf: &Bound<'_, Self>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        fm::arith_dunder(other, slf.as_any(), fm::Arith::Sub)
    }
    fn __mul__(slf: &Bound<'_, Self>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        fm::arith_dunder(slf.as_any(), other, fm::Arith::Mul)
    }
    fn __rmul__(slf: &Bound<'_, Self>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        fm::arith_dunder(other, slf.as_any(), fm::Arith::Mul)
    }
    fn __truediv__(slf: &Bound<'_, Self>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        fm::arith_dunder(slf.as_any(), other, fm::Arith::Div)
    }
    fn __rtruediv__(slf: &Bound<'_, Self>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        fm::arith_dunder(other, slf.as_any(), fm::Arith::Div)
    }
    fn __matmul__(slf: &Bound<'_, Self>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        fm::matmul_dunder(slf, other)
    }
    fn __neg__(&self, py: Python<'_>) -> PyResult<Self> {
        fm::map_impl(py, &self.0, riftco_autograd::ops::neg)
    }
    fn __pow__(
        &self,
        py: Python<'_>,
        exponent: &Bound<'_, PyAny>,
        modulo: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        fm::pow_dunder(py, &self.0, exponent, modulo)
    }
    fn __lt__(slf: &Bound<'_, Self>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        fm::compare_dunder(slf, other, fm::BinaryOp::Lt)
    }
    fn __le__(slf: &Bound<'_, Self>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        fm::compare_dunder(slf, other, fm::BinaryOp::Le)
    }
    fn __gt__(slf: &Bound<'_, Self>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        fm::compare_dunder(slf, other, fm::BinaryOp::Gt)
    }
    fn __ge__(slf: &Bound<'_, Self>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        fm::compare_dunder(slf, other, fm::BinaryOp::Ge)
    }
    fn __eq__(slf: &Bound<'_, Self>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        fm::compare_dunder(slf, other, fm::BinaryOp::Eq)
    }
    fn __ne__(slf: &Bound<'_, Self>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        fm::compare_dunder(slf, other, fm::BinaryOp::Ne)
    }
    /// ``None``: NumPy ufuncs and ndarray operators defer to ``Variable``'s own (reflected)
    /// operators, so ``ndarray + Variable`` is a Variable (the array becomes a float32
    /// constant on the Variable's device, as in PyTorch) instead of a detached ndarray; a
    /// non-numeric array is a ``TypeError`` naming its dtype.
    #[classattr]
    fn __array_ufunc__() -> Option<()> {
        None
    }
    /// Identity-based (as ``object.__hash__``): Variables stay usable as set members and
    /// dict keys although ``==`` compares values.
    fn __hash__(slf: &Bound<'_, Self>) -> isize {
        fm::identity_hash(slf.as_any())
    }
    /// The truth of a one-element Variable (nonzero); ``ValueError`` for more elements.
    fn __bool__(&self) -> PyResult<bool> {
        fm::truth(&self.0)
    }
    /// Sum over ``axis`` (``None``: all; an int or a tuple of ints), as ``functional.sum``.
    #[pyo3(signature = (axis = None, keepdims = false))]
    fn sum(
        &self,
        py: Python<'_>,
        axis: Option<&Bound<'_, PyAny>>,
        keepdims: bool,
    ) -> PyResult<Self> {
        fm::reduce_impl(py, &self.0, axis, keepdims, false)
    }
    /// Mean over ``axis`` (``None``: all; an int or a tuple of ints), as ``functional.mean``.
    #[pyo3(signature = (axis = None, keepdims = false))]
    fn mean(
        &self,
        py: Python<'_>,
        axis: Option<&Bound<'_, PyAny>>,
        keepdims: bool,
    ) -> PyResult<Self> {
        fm::reduce_impl(py, &self.0, axis, keepdims, true)
    }
    /// ``exp(self)``, as ``functional.exp``.
    fn exp(&self, py: Python<'_>) -> PyResult<Self> {
        fm::map_impl(py, &self.0, riftco_autograd::ops::exp)
    }
    /// Natural logarithm, as ``functional.log``.
    fn log(&self, py: Python<'_>) -> PyResult<Self> {
        fm::map_impl(py, &self.0, riftco_autograd::ops::log)
    }
    /// ``tanh(self)``, as ``functional.tanh``.
    fn tanh(&self, py: Python<'_>) -> PyResult<Self> {
        fm::map_impl(py, &self.0, riftco_autograd::ops::tanh)
    }
    /// Logistic sigmoid, as ``functional.sigmoid``.
    fn sigmoid(&self, py: Python<'_>) -> PyResult<Self> {
        fm::map_impl(py, &self.0, riftco_autograd::ops::sigmoid)
    }
    /// ``max(self, 0)``, as ``functional.relu``.
    fn relu(&self, py: Python<'_>) -> PyResult<Self> {
        fm::map_impl(py, &self.0, riftco_autograd::ops::relu)
    }
}

/// A gradient from an array-like: a float32 copy in a pooled buffer, on `device`.
fn gradient_tensor(value: &Bound<'_, PyAny>, device: riftco_tensor::Device) -> PyResult<Tensor> {
    let (data, shape) = float32_data(value)?;
    let mut t = Tensor::from_slice(&data, Shape::new(shape), MemoryCategory::Gradient)
        .map_err(tensor_err)?;
    if t.device() != device {
        t.transfer_to(device).map_err(tensor_err)?;
    }
    Ok(t)
}

/// Calls a Python ``gradient_hook(leaf, grad)`` (see ``Variable.backward``) with the GIL held:
/// the gradient as a NumPy copy (the native buffer released first), and the hook's result
/// (``None``, or an array of the leaf's shape to commit). A Python exception travels as
/// `AutogradError::External(PythonError)` and is re-raised unchanged at the boundary.
fn call_gradient_hook(
    f: &Py<PyAny>,
    leaf: &Variable,
    g: Tensor,
) -> Result<Option<Tensor>, riftco_autograd::AutogradError> {
    Python::attach(|py| {
        let out = (|| -> PyResult<Option<Tensor>> {
            let device = g.device();
            let arr = tensor_to_numpy(py, &g)?;
            drop(g);
            let r = f.bind(py).call1((PyVariable(leaf.clone()), arr))?;
            if r.is_none() {
                return Ok(None);
            }
            let t = gradient_tensor(&r, device)?;
            if t.dims() != leaf.dims() {
                return Err(Exc::Shape.err(format!(
                    "gradient_hook returned shape {:?} for {}, of shape {:?}",
                    t.dims(),
                    leaf.describe(),
                    leaf.dims()
                )));
            }
            Ok(Some(t))
        })();
        out.map_err(|e| {
            riftco_autograd::AutogradError::external(crate::errors::PythonError::new(py, e))
        })
    })
}

fn make_leaf(t: Tensor, requires_grad: bool, name: Option<String>) -> Variable {
    match name {
        Some(n) => Variable::named_leaf(t, requires_grad, n),
        None => Variable::leaf(t, requires_grad),
    }
}

/// A leaf ``Variable`` from an array-like (alias of the ``Variable`` constructor).
///
/// Args:
///     array: any array-like of numbers (converted to a C-contiguous float32 copy).
///     requires_grad: whether gradients flow into this leaf.
///     name: optional name used in error messages.
///
/// Returns:
///     Variable: a new leaf.
///
/// Example:
///     >>> import riftco
///     >>> riftco.tensor([[1.0, 2.0]]).shape
///     (1, 2)
#[pyfunction]
#[pyo3(signature = (array, requires_grad = false, name = None))]
fn tensor(
    array: &Bound<'_, PyAny>,
    requires_grad: bool,
    name: Option<String>,
) -> PyResult<PyVariable> {
    PyVariable::new(array, requires_grad, name)
}

/// Reads a list of Variables.
pub(crate) fn variables(list: &[Bound<'_, PyVariable>]) -> Vec<Variable> {
    list.iter().map(|v| v.get().0.clone()).collect()
}
