//! GGUF files from Python: metadata as a dict, tensor infos, one tensor dequantized to NumPy.
//! Loading a GGUF model goes through `DecoderOnlyTransformer.load` (`model_state`).

use std::path::PathBuf;

use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{IntoPyArray, PyArrayDyn};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use pyo3::IntoPyObjectExt;
use riftco_transformer::state::{GgufArray, GgufFile, GgufValue};

use crate::errors::compute;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(read_gguf_metadata, m)?)?;
    m.add_function(wrap_pyfunction!(gguf_tensor_infos, m)?)?;
    m.add_function(wrap_pyfunction!(read_gguf_tensor, m)?)?;
    Ok(())
}

fn value<'py>(py: Python<'py>, v: &GgufValue) -> PyResult<Bound<'py, PyAny>> {
    match v {
        GgufValue::U8(x) => x.into_bound_py_any(py),
        GgufValue::I8(x) => x.into_bound_py_any(py),
        GgufValue::U16(x) => x.into_bound_py_any(py),
        GgufValue::I16(x) => x.into_bound_py_any(py),
        GgufValue::U32(x) => x.into_bound_py_any(py),
        GgufValue::I32(x) => x.into_bound_py_any(py),
        GgufValue::U64(x) => x.into_bound_py_any(py),
        GgufValue::I64(x) => x.into_bound_py_any(py),
        GgufValue::F32(x) => f64::from(*x).into_bound_py_any(py),
        GgufValue::F64(x) => x.into_bound_py_any(py),
        GgufValue::Bool(x) => x.into_bound_py_any(py),
        GgufValue::String(s) => s.into_bound_py_any(py),
        GgufValue::Array(a) => array(py, a),
    }
}

fn array<'py>(py: Python<'py>, a: &GgufArray) -> PyResult<Bound<'py, PyAny>> {
    let list = match a {
        GgufArray::U8(v) => PyList::new(py, v)?,
        GgufArray::I8(v) => PyList::new(py, v)?,
        GgufArray::U16(v) => PyList::new(py, v)?,
        GgufArray::I16(v) => PyList::new(py, v)?,
        GgufArray::U32(v) => PyList::new(py, v)?,
        GgufArray::I32(v) => PyList::new(py, v)?,
        GgufArray::U64(v) => PyList::new(py, v)?,
        GgufArray::I64(v) => PyList::new(py, v)?,
        GgufArray::F32(v) => PyList::new(py, v.iter().map(|&x| f64::from(x)))?,
        GgufArray::F64(v) => PyList::new(py, v)?,
        GgufArray::Bool(v) => PyList::new(py, v)?,
        GgufArray::String(v) => PyList::new(py, v)?,
        GgufArray::Array(v) => PyList::new(
            py,
            v.iter()
                .map(|a| array(py, a))
                .collect::<PyResult<Vec<_>>>()?,
        )?,
    };
    Ok(list.into_any())
}

/// Every metadata key and value of a GGUF file (llama.cpp's format), in file order.
///
/// The header is read with every count, length and offset checked against the file's size (at
/// most the first 64 MiB are read as header); no tensor data is read.
///
/// Args:
///     path: the ``.gguf`` file.
///
/// Returns:
///     dict[str, Any]: each key's value as Python: the eight integer types as ``int``,
///     ``FLOAT32`` / ``FLOAT64`` as ``float`` (a FLOAT32 widened exactly), ``BOOL`` as ``bool``,
///     ``STRING`` as ``str``, ``ARRAY`` as a ``list`` of its elements (nested lists for arrays of
///     arrays) — the values ``gguf.GGUFReader(path).fields[key].contents()`` gives for the
///     metadata keys (the reader's ``GGUF.*`` entries are the header, not metadata).
///
/// Raises:
///     ModelStateError: for a file that is not GGUF or whose header is malformed (the message
///         names the file and the field: a truncated file, a count larger than the file, an
///         unknown value or tensor type, non-UTF-8 text, a key given twice, a bad alignment).
///     OSError: when the file cannot be opened.
#[pyfunction]
fn read_gguf_metadata(py: Python<'_>, path: PathBuf) -> PyResult<Py<PyDict>> {
    let file = compute(py, || GgufFile::open(&path))?;
    let d = PyDict::new(py);
    for (key, v) in file.metadata() {
        d.set_item(key, value(py, v)?)?;
    }
    Ok(d.unbind())
}

/// The tensor infos of a GGUF file, in file order.
///
/// Args:
///     path: the ``.gguf`` file.
///
/// Returns:
///     list[dict[str, Any]]: one dict per tensor: ``name`` (str), ``type`` (the GGML type name,
///     ``"Q4_K"``), ``shape`` (tuple of int, NumPy order: GGML's ``ne`` reversed, so a Linear
///     weight is ``(out, in)``), ``n_bytes`` (int, its stored size) and ``data_offset`` (int, its
///     offset in the file, in bytes).
///
/// Raises:
///     ModelStateError: as ``read_gguf_metadata``.
///     OSError: when the file cannot be opened.
#[pyfunction]
fn gguf_tensor_infos(py: Python<'_>, path: PathBuf) -> PyResult<Py<PyList>> {
    let file = compute(py, || GgufFile::open(&path))?;
    let list = PyList::empty(py);
    for t in file.tensors() {
        let d = PyDict::new(py);
        d.set_item("name", &t.name)?;
        d.set_item("type", t.ggml_type.name())?;
        d.set_item("shape", pyo3::types::PyTuple::new(py, t.shape())?)?;
        d.set_item("n_bytes", t.n_bytes)?;
        d.set_item("data_offset", file.data_offset() + t.offset)?;
        list.append(d)?;
    }
    Ok(list.unbind())
}

/// One tensor of a GGUF file, dequantized to float32.
///
/// The values are bitwise those of the ``gguf`` package's reference dequantization
/// (``gguf.quants.dequantize(tensor.data, tensor.tensor_type)``), for the types F32, F16, BF16,
/// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K. The tensor is returned as
/// stored: the Q and K projections of a ``llama`` file keep llama.cpp's row order (loading the
/// model puts them back in Hugging Face order).
///
/// Args:
///     path: the ``.gguf`` file.
///     name: the tensor's name (``"blk.0.attn_q.weight"``).
///
/// Returns:
///     numpy.ndarray: float32, shape in NumPy order (GGML's ``ne`` reversed).
///
/// Raises:
///     ModelStateError: for a malformed header (as ``read_gguf_metadata``), no tensor of that
///         name, or a type riftco does not dequantize (the tensor and the type are named).
///     OSError: when the file cannot be read.
#[pyfunction]
fn read_gguf_tensor<'py>(
    py: Python<'py>,
    path: PathBuf,
    name: &str,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let (shape, values) = compute(py, || {
        GgufFile::open(&path).and_then(|f| f.read_tensor_f32(name))
    })?;
    let array = ArrayD::from_shape_vec(IxDyn(&shape), values).map_err(|e| {
        crate::errors::Exc::ModelState.err(format!("tensor {name:?} of {}: {e}", path.display()))
    })?;
    Ok(array.into_pyarray(py))
}
