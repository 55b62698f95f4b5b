//! `riftco.quantize` and `riftco.dequantize`: a whole tensor to and from the block formats a
//! frozen weight may be kept in (`riftco_kernels::quant::QuantFormat`).

use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{AllowTypeChange, IntoPyArray, PyArrayDyn, PyArrayLikeDyn, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use riftco_kernels::quant::{self, QuantError, QuantFormat};

use crate::errors::Exc;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(quantize, m)?)?;
    m.add_function(wrap_pyfunction!(dequantize, m)?)?;
    Ok(())
}

/// The format named `dtype`, or a `ConfigError` listing the accepted names.
fn format_named(dtype: &str) -> PyResult<QuantFormat> {
    QuantFormat::from_name(dtype).ok_or_else(|| {
        Exc::Config.err(format!(
            "unknown quantized dtype {dtype:?}; expected one of {}",
            QuantFormat::ALL.map(QuantFormat::name).join(", ")
        ))
    })
}

/// A `ShapeError` unless `shape`'s last axis is a whole number of `format`'s blocks.
fn check_rows(format: QuantFormat, shape: &[usize], what: &str) -> PyResult<usize> {
    let block = format.block_elements();
    let numel = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    match (shape.last(), numel) {
        (Some(&cols), Some(numel)) if cols % block == 0 => Ok(numel),
        _ => Err(Exc::Shape.err(format!(
            "{what} of shape {shape:?} cannot be kept in {format}: {format} stores each row \
             (the last axis) as whole blocks of {block} elements, so the last axis must be a \
             multiple of {block}"
        ))),
    }
}

/// The Python error of a quantization error.
fn quant_err(e: QuantError) -> PyErr {
    match e {
        QuantError::NonFinite { .. } | QuantError::OutOfRange { .. } => {
            PyValueError::new_err(e.to_string())
        }
        other => Exc::Shape.err(other.to_string()),
    }
}

/// Quantizes a tensor to a block format, returning its bytes.
///
/// The bytes are those of the format's reference quantizer, bit for bit, at every SIMD level:
/// ``gguf.quants.quantize`` (gguf 0.19) for ``"q4_0"``, ``"q4_1"``, ``"q5_0"``, ``"q5_1"`` and
/// ``"q8_0"``; llama.cpp's ``quantize_row_q*_K_ref`` (``ggml-quants.c``, ``llama-quantize``
/// without an importance matrix) for ``"q2_k"`` ... ``"q6_k"``, laid out as in GGUF files; and
/// bitsandbytes' ``quantize_4bit(values, blocksize=64, quant_type="nf4",
/// compress_statistics=True)`` on the CPU for ``"nf4"`` (QLoRA's NormalFloat, Dettmers et al.
/// 2023), stored as the ``n / 2`` packed codes (element ``2i`` in the high nibble), one
/// quantized absmax byte per 64-element block, one float32 scale per group of 256 blocks and
/// the float32 offset (the mean of the absmaxes, summed in PyTorch's single-thread order),
/// little endian.
///
/// Args:
///     values: array-like of any shape whose last axis is a multiple of the format's block
///         (32 for ``q4_0`` ... ``q8_0``, 64 for ``nf4``, 256 for the ``q*_k`` formats);
///         converted to float32 as ``numpy.asarray(values, dtype=numpy.float32)`` would, and
///         read in C (row-major) order.
///     dtype: the format's name (case-insensitive): ``"nf4"``, ``"q4_0"``, ``"q4_1"``,
///         ``"q5_0"``, ``"q5_1"``, ``"q8_0"``, ``"q2_k"``, ``"q3_k"``, ``"q4_k"``, ``"q5_k"``,
///         ``"q6_k"``.
///
/// Returns:
///     bytes: the tensor's storage, e.g. ``18 * n / 32`` bytes for ``q4_0`` and
///     ``n / 2 + n / 64 + 4 * ceil(n / 16384) + 4`` for ``nf4`` (``n`` elements).
///
/// Raises:
///     ConfigError: ``dtype`` names no format (the message lists the accepted names).
///     ShapeError: the last axis is not a multiple of the block (or the array is 0-d).
///     ValueError: a value is NaN or infinite, or (the GGML formats, whose block scales are
///         float16) of magnitude beyond 65504; the message gives the first one's flat index.
///
/// Examples:
///     >>> import numpy as np, riftco
///     >>> len(riftco.quantize(np.ones((2, 64), np.float32), "q8_0"))
///     136
#[pyfunction]
fn quantize<'py>(
    py: Python<'py>,
    values: PyArrayLikeDyn<'py, f32, AllowTypeChange>,
    dtype: &str,
) -> PyResult<Bound<'py, PyBytes>> {
    let format = format_named(dtype)?;
    check_rows(format, values.shape(), "an array")?;
    let array = values.as_array();
    let flat: Vec<f32> = match array.as_slice() {
        Some(s) => s.to_vec(),
        None => array.iter().copied().collect(),
    };
    let bytes = py
        .detach(|| quant::quantize(format, &flat))
        .map_err(quant_err)?;
    Ok(PyBytes::new(py, &bytes))
}

/// Dequantizes a tensor stored in a block format to float32.
///
/// The values are those of the format's reference dequantization, bit for bit, at every SIMD
/// level: ``gguf.quants.dequantize`` for the GGML formats (``"q4_0"`` ... ``"q6_k"``) and
/// bitsandbytes' ``dequantize_4bit`` (its absmax first dequantized by ``dequantize_blockwise``
/// and the offset added, in float32) for ``"nf4"``. The layout is the one ``quantize`` writes.
///
/// Args:
///     data: the tensor's bytes (``bytes``), exactly the storage of ``prod(shape)`` elements.
///     dtype: the format's name, as for ``quantize``.
///     shape: the tensor's shape; its last axis a multiple of the format's block.
///
/// Returns:
///     numpy.ndarray: float32 of shape ``shape``.
///
/// Raises:
///     ConfigError: ``dtype`` names no format (the message lists the accepted names).
///     ShapeError: the last axis is not a multiple of the block, or ``len(data)`` is not the
///         storage of ``prod(shape)`` elements in that format (both numbers are named).
///
/// Examples:
///     >>> import numpy as np, riftco
///     >>> x = np.linspace(-1, 1, 64, dtype=np.float32)
///     >>> riftco.dequantize(riftco.quantize(x, "q8_0"), "q8_0", (64,)).shape
///     (64,)
#[pyfunction]
fn dequantize<'py>(
    py: Python<'py>,
    data: &[u8],
    dtype: &str,
    shape: Vec<usize>,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let format = format_named(dtype)?;
    let numel = check_rows(format, &shape, "a tensor")?;
    if format.storage_bytes(numel) != Some(data.len()) {
        return Err(Exc::Shape.err(format!(
            "{} bytes of {format} for shape {shape:?}: {numel} elements of {format} take {:?} \
             bytes",
            data.len(),
            format.storage_bytes(numel).unwrap_or(0),
        )));
    }
    let mut out = vec![0.0f32; numel];
    py.detach(|| quant::dequantize_range(format, data, numel, 0, &mut out))
        .map_err(quant_err)?;
    let array = ArrayD::from_shape_vec(IxDyn(&shape), out)
        .map_err(|e| Exc::Shape.err(format!("shape {shape:?}: {e}")))?;
    Ok(array.into_pyarray(py))
}
