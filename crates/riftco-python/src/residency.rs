//! Parameter residency from Python: a Variable's stored bytes (released and restored in place)
//! and a Python owner of a model's parameters between uses (what `riftco.distributed`'s ZeRO-3
//! implements with mpi4py).

use crate::errors::{tensor_err, transformer_err, PythonError};
use crate::model::PyModel;
use crate::variable::PyVariable;
use numpy::{PyArray1, PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use riftco_autograd::AutogradError;
use riftco_tensor::{MemoryCategory, StorageEncoding, Tensor};
use riftco_transformer::{AcquireReason, ParameterResidency, ResidencyUnit, TransformerError};
use std::sync::{Arc, Mutex};

#[pymethods]
impl PyVariable {
    /// How the value is stored: ``"float32"``, ``"bfloat16"``, ``"float16"`` or a quantized
    /// format's name (``"nf4"``, ``"q4_k"``, ...); ``None`` while released
    /// (:meth:`release_storage`).
    ///
    /// Raises:
    ///     DeviceMismatchError: the value lives on a GPU (only host values are encoded).
    #[getter]
    fn storage_encoding(&self) -> PyResult<Option<&'static str>> {
        Ok(self
            .0
            .value()
            .storage_encoding()
            .map_err(tensor_err)?
            .map(StorageEncoding::name))
    }

    /// Whether the value's elements were released (:meth:`release_storage`) and not restored.
    #[getter]
    fn is_released(&self) -> bool {
        self.0.value().is_placeholder()
    }

    /// The value's elements as stored (:attr:`storage_encoding`), little-endian: a copy with no
    /// conversion, bitwise what the storage holds; with ``start``/``stop``, only those bytes
    /// of it (clipped to its length, as a slice would be; a part of a parameter without a copy
    /// of the whole).
    ///
    /// Args:
    ///     start: the first byte (default 0); stop: one past the last (default the end). Both
    ///         non-negative.
    ///
    /// Returns:
    ///     numpy.ndarray: uint8, 1-D (4 bytes per float32 element, 2 per 16-bit element, the
    ///     blocks of a quantized format).
    ///
    /// Raises:
    ///     RiftcoError: the value was released; DeviceMismatchError: it lives on a GPU;
    ///     OverflowError: a negative bound.
    #[pyo3(signature = (start=None, stop=None))]
    fn encoded_bytes<'py>(
        &self,
        py: Python<'py>,
        start: Option<usize>,
        stop: Option<usize>,
    ) -> PyResult<Bound<'py, PyArray1<u8>>> {
        let range = start.unwrap_or(0)..stop.unwrap_or(usize::MAX);
        let bytes = self
            .0
            .value()
            .encoded_byte_range(range)
            .map_err(tensor_err)?;
        Ok(PyArray1::from_vec(py, bytes))
    }

    /// How many bytes :meth:`encoded_bytes` gives, without copying them.
    ///
    /// Raises:
    ///     RiftcoError: the value was released; DeviceMismatchError: it lives on a GPU.
    #[getter]
    fn encoded_nbytes(&self) -> PyResult<usize> {
        self.0.value().encoded_len().map_err(tensor_err)
    }

    /// Frees the value's elements, keeping the shape, the encoding's element count and the
    /// version: reads fail until :meth:`restore_storage` puts the same bytes back. Every
    /// handle sharing the storage (views, the graph's saved values) loses the elements too: for
    /// an owner of the parameters between uses (sharded data parallelism), not for values a
    /// graph still needs.
    fn release_storage(&self) {
        self.0.value().release_shared();
    }

    /// Puts the elements back into a released value, from ``data`` in ``encoding`` (as
    /// :meth:`encoded_bytes` gave them), without bumping the version: the caller states that
    /// they are the value the variable had when it was released, so graphs recorded before
    /// stay valid (a value that changed meanwhile needs :meth:`bump_version`).
    ///
    /// Args:
    ///     encoding: ``"float32"``, ``"bfloat16"``, ``"float16"`` or a quantized format's name.
    ///     data: ``bytes`` or a contiguous 1-D uint8 NumPy array of exactly the size that
    ///         ``encoding`` takes for the variable's element count.
    ///
    /// Raises:
    ///     ValueError: an unknown encoding; InvalidArgumentError: the value was not released,
    ///         or ``data`` has another size (both sizes named); TypeError: ``data`` is neither.
    fn restore_storage(&self, encoding: &str, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let encoding = StorageEncoding::from_name(encoding).ok_or_else(|| {
            PyValueError::new_err(format!(
                "unknown storage encoding {encoding:?}; expected float32, bfloat16, float16 or \
                 a quantized format's name (nf4, q8_0, q4_k, ...)"
            ))
        })?;
        let value = self.0.value();
        if let Ok(b) = data.cast::<PyBytes>() {
            return value
                .restore_encoded(encoding, b.as_bytes())
                .map_err(tensor_err);
        }
        let array: PyReadonlyArray1<'_, u8> = data.extract().map_err(|_| {
            PyTypeError::new_err(format!(
                "restore_storage takes bytes or a 1-D uint8 NumPy array; got {}",
                data.get_type()
                    .name()
                    .map_or_else(|_| "?".into(), |n| n.to_string())
            ))
        })?;
        let slice = match array.as_slice() {
            Ok(s) => s,
            Err(_) => {
                return Err(PyValueError::new_err(format!(
                    "restore_storage needs a contiguous array; got strides {:?}",
                    array.strides()
                )))
            }
        };
        value.restore_encoded(encoding, slice).map_err(tensor_err)
    }

    /// Bumps the version without touching the data: for an owner whose released value changed
    /// (its shards were updated), so that graphs recorded before fail with ``StaleGraphError``
    /// instead of mixing two values.
    fn bump_version(&self) {
        self.0.value().bump_version();
    }
}

/// A Python object with ``acquire(unit, reason, next)`` and ``release(unit)`` methods, as the
/// model's owner of its parameters between uses.
struct PyResidency {
    owner: Py<PyAny>,
    /// The width of the embedding and the head (a fetched slice is `[rows, d_model]`).
    d_model: usize,
    /// An exception of ``release`` (which cannot fail the model's pass), raised by the next
    /// ``acquire``.
    pending: Mutex<Option<PyErr>>,
}

impl PyResidency {
    /// The exception an earlier call kept for the next acquire or fetch, if any (taken).
    fn take_pending(&self) -> Option<PyErr> {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

impl ParameterResidency for PyResidency {
    fn acquire(
        &self,
        unit: ResidencyUnit,
        reason: AcquireReason,
        next: Option<ResidencyUnit>,
    ) -> riftco_autograd::Result<()> {
        Python::attach(|py| {
            let out = match self.take_pending() {
                Some(e) => Err(e),
                None => self
                    .owner
                    .bind(py)
                    .call_method1(
                        "acquire",
                        (
                            unit.prefix(),
                            reason.name(),
                            next.map(ResidencyUnit::prefix),
                        ),
                    )
                    .map(drop),
            };
            out.map_err(|e| AutogradError::external(PythonError::new(py, e)))
        })
    }

    fn row_slice(&self, unit: ResidencyUnit) -> Option<usize> {
        Python::attach(|py| {
            let owner = self.owner.bind(py);
            if !owner.hasattr("row_slice").unwrap_or(false) {
                return None;
            }
            let got = owner
                .call_method1("row_slice", (unit.prefix(),))
                .and_then(|v| {
                    v.extract::<Option<usize>>()
                        .ok()
                        .filter(|n| *n != Some(0))
                        .ok_or_else(|| {
                            PyTypeError::new_err(format!(
                                "row_slice({}) must return None or a number of rows >= 1; got {}",
                                unit.prefix(),
                                v.repr().map_or_else(|_| "?".into(), |r| r.to_string())
                            ))
                        })
                });
            match got {
                Ok(v) => v,
                Err(e) => {
                    // Raised by the next acquire or fetch; the unit is acquired whole meanwhile.
                    let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
                    pending.get_or_insert(e);
                    None
                }
            }
        })
    }

    fn fetch_rows(
        &self,
        unit: ResidencyUnit,
        rows: std::ops::Range<usize>,
        next: Option<ResidencyUnit>,
    ) -> riftco_autograd::Result<Tensor> {
        Python::attach(|py| {
            if let Some(e) = self.take_pending() {
                return Err(AutogradError::external(PythonError::new(py, e)));
            }
            let got = self
                .owner
                .bind(py)
                .call_method1(
                    "fetch_rows",
                    (
                        unit.prefix(),
                        rows.start,
                        rows.end,
                        next.map(ResidencyUnit::prefix),
                    ),
                )
                .map_err(|e| AutogradError::external(PythonError::new(py, e)))?;
            let bad = |what: String| {
                AutogradError::external(PythonError::new(
                    py,
                    PyTypeError::new_err(format!(
                        "fetch_rows({}, {}, {}) must return (encoding, data) with data bytes or \
                         a contiguous 1-D uint8 array; {what}",
                        unit.prefix(),
                        rows.start,
                        rows.end
                    )),
                ))
            };
            let (encoding, data): (String, Bound<'_, PyAny>) = got
                .extract()
                .map_err(|_| bad(format!("got {}", type_name(&got))))?;
            let encoding = StorageEncoding::from_name(&encoding)
                .ok_or_else(|| bad(format!("the encoding {encoding:?} is unknown")))?;
            let shape = [rows.len(), self.d_model];
            let make = |bytes: &[u8]| {
                Tensor::from_encoded(encoding, bytes, shape, MemoryCategory::Parameter)
                    .map_err(AutogradError::from)
            };
            if let Ok(b) = data.cast::<PyBytes>() {
                return make(b.as_bytes());
            }
            let array: PyReadonlyArray1<'_, u8> = data
                .extract()
                .map_err(|_| bad(format!("data is {}", type_name(&data))))?;
            let slice = array
                .as_slice()
                .map_err(|_| bad("data is not contiguous".into()))?;
            make(slice)
        })
    }

    fn release(&self, unit: ResidencyUnit) {
        Python::attach(|py| {
            if let Err(e) = self
                .owner
                .bind(py)
                .call_method1("release", (unit.prefix(),))
            {
                let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
                pending.get_or_insert(e);
            }
        });
    }
}

/// The name of `v`'s type, for messages.
fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type()
        .name()
        .map_or_else(|_| "?".into(), |n| n.to_string())
}

#[pymethods]
impl PyModel {
    /// Sets the owner of the parameters between uses (``None`` removes it): before reading a
    /// unit's parameters the model calls ``owner.acquire(unit, reason, next)`` and, when done,
    /// ``owner.release(unit)``. Between the two the unit's parameters must hold their values;
    /// outside, the owner may release them (:meth:`Variable.release_storage`) and restore the
    /// same bytes later (:meth:`Variable.restore_storage`). This is the seam of sharded data
    /// parallelism (``riftco.distributed``'s ZeRO-3).
    ///
    /// ``unit`` is ``"model.embed_tokens"``, ``"model.layers.{i}"``, ``"model.norm"`` or
    /// ``"lm_head"`` (untied); ``reason`` is ``"forward"`` (released after the forward use),
    /// ``"replay"`` (a checkpoint's replay in the backward pass; released after its VJP),
    /// ``"backward"`` (the backward pass of a block outside any checkpoint; released after its
    /// VJPs) or ``"kept_for_backward"`` (the final norm and the head: kept from the forward
    /// until their VJP); ``next`` is the unit the model will acquire next (prefetch), or
    /// ``None``. Without a graph every unit is released after its use. A graph dropped without
    /// a backward pass leaves the norm and the head acquired: the owner releases them. An
    /// exception of ``acquire`` stops the forward or backward pass and is raised unchanged;
    /// one of ``release`` is raised by the next ``acquire``.
    ///
    /// An owner may also give the frozen embedding and LM head tables by slices of vocabulary
    /// rows, so that neither is ever whole in memory: ``owner.row_slice(unit)`` returns the rows
    /// per slice (``None``: acquire the unit whole), and ``owner.fetch_rows(unit, start, stop,
    /// next)`` returns rows ``start:stop`` as stored, ``(encoding, data)`` (``data`` bytes or a
    /// uint8 array, ``[stop - start, d_model]`` elements). The lookup and the training loss then
    /// fetch every slice in order (whatever the tokens) and hold nothing for the backward pass;
    /// the loss combines its logsumexp slice by slice (within float32 rounding of the whole
    /// table's, not bitwise). Full logits still acquire the table whole.
    ///
    /// Policies that choose their plan by running the blocks (``auto``, ``budget:SIZE``) are
    /// refused (``ConfigError``) while an owner is set.
    ///
    /// Args:
    ///     owner: an object with ``acquire`` and ``release`` methods, or ``None``.
    ///
    /// Raises:
    ///     TypeError: ``owner`` lacks one of the two methods.
    ///     ConfigError: ``None`` while a parameter is released (the owner must restore every
    ///         unit first).
    fn set_parameter_residency(&self, owner: &Bound<'_, PyAny>) -> PyResult<()> {
        if owner.is_none() {
            let mut model = self.write();
            let released = model
                .weights()
                .base_parameters()
                .find(|(_, p)| p.value().is_placeholder())
                .map(|(e, _)| e.hf_name());
            if let Some(name) = released {
                return Err(transformer_err(TransformerError::Config {
                    field: "parameter_residency",
                    value: "None".into(),
                    reason: format!(
                        "{name} holds no elements (the owner released it between uses): the \
                         owner must gather every unit back first (optimizer.sharded.detach() \
                         does, and removes the owner itself)"
                    ),
                }));
            }
            model.set_parameter_residency(None);
            return Ok(());
        }
        for method in ["acquire", "release"] {
            if !owner.getattr(method).is_ok_and(|m| m.is_callable()) {
                return Err(PyTypeError::new_err(format!(
                    "the parameter owner needs callable acquire(unit, reason, next) and \
                     release(unit) methods; {} has no callable {method}",
                    owner
                        .get_type()
                        .name()
                        .map_or_else(|_| "it".into(), |n| n.to_string())
                )));
            }
        }
        let d_model = self.read().config().d_model;
        let owner = Arc::new(PyResidency {
            owner: owner.clone().unbind(),
            d_model,
            pending: Mutex::new(None),
        });
        self.write().set_parameter_residency(Some(owner));
        Ok(())
    }

    /// Whether an owner of the parameters between uses is set
    /// (:meth:`set_parameter_residency`).
    #[getter]
    fn has_parameter_residency(&self) -> bool {
        self.read().parameter_residency().is_some()
    }
}
