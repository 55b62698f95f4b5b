//! Token arrays from Python: any integer NumPy array or nested list.

use numpy::{PyArrayDyn, PyArrayMethods};
use pyo3::prelude::*;

use crate::errors::Exc;

/// Row-major `u32` token ids of an integer array-like with `ndim` dimensions, and its shape.
///
/// Every id is checked against `0 <= id < vocab` here (before narrowing to `u32`), so the error
/// names the exact value and its position.
///
/// # Errors
/// `TokenError` for a wrong rank, a non-integer dtype, or an id outside the vocabulary.
pub(crate) fn token_ids(
    obj: &Bound<'_, PyAny>,
    ndim: usize,
    vocab: usize,
    what: &str,
) -> PyResult<(Vec<u32>, Vec<usize>)> {
    let py = obj.py();
    let np = py.import("numpy")?;
    let arr = np.getattr("asarray")?.call1((obj,))?;
    let shape: Vec<usize> = arr.getattr("shape")?.extract()?;
    let kind: String = arr.getattr("dtype")?.getattr("kind")?.extract()?;
    if shape.len() != ndim {
        return Err(Exc::Token.err(format!(
            "{what} must be a {ndim}-D integer array, got shape {shape:?}"
        )));
    }
    // An empty nested list has dtype float64; its emptiness is reported by the model.
    let empty = shape.contains(&0);
    let ids: Vec<i128> = match kind.as_str() {
        "i" | "b" => {
            let a = np
                .getattr("ascontiguousarray")?
                .call1((arr, np.getattr("int64")?))?
                .cast_into::<PyArrayDyn<i64>>()?;
            let ro = a.readonly();
            ro.as_array().iter().map(|&x| x as i128).collect()
        }
        "u" => {
            let a = np
                .getattr("ascontiguousarray")?
                .call1((arr, np.getattr("uint64")?))?
                .cast_into::<PyArrayDyn<u64>>()?;
            let ro = a.readonly();
            ro.as_array().iter().map(|&x| x as i128).collect()
        }
        _ if empty => Vec::new(),
        _ => {
            let dtype = arr.getattr("dtype")?.str()?.to_string();
            return Err(Exc::Token.err(format!(
                "{what} must hold integer token ids, got dtype {dtype}"
            )));
        }
    };
    let mut out = Vec::with_capacity(ids.len());
    for (i, &t) in ids.iter().enumerate() {
        if t < 0 || t >= vocab as i128 {
            let pos = unravel(i, &shape);
            return Err(Exc::Token.err(format!(
                "token id {t} at index {pos:?} of {what} is outside the vocabulary \
                 [0, {vocab}) (vocab_size {vocab})"
            )));
        }
        out.push(t as u32);
    }
    Ok((out, shape))
}

/// Row-major `i64` labels of an integer array-like of exactly `shape` (values are checked by the
/// model: -100 or a token id).
///
/// # Errors
/// `TokenError` for another shape or a non-integer dtype.
pub(crate) fn label_ids(obj: &Bound<'_, PyAny>, shape: &[usize]) -> PyResult<Vec<i64>> {
    int_array(obj, shape, "labels", "integer token ids or -100")
}

/// `position_ids` of the shape of the tokens as i64 (their values are checked by the core:
/// `SequenceLayout::from_position_ids` names a bad value with its index).
pub(crate) fn position_ids(obj: &Bound<'_, PyAny>, shape: &[usize]) -> PyResult<Vec<i64>> {
    int_array(obj, shape, "position_ids", "integer positions")
}

fn int_array(
    obj: &Bound<'_, PyAny>,
    shape: &[usize],
    what: &str,
    holds: &str,
) -> PyResult<Vec<i64>> {
    let py = obj.py();
    let np = py.import("numpy")?;
    let arr = np.getattr("asarray")?.call1((obj,))?;
    let got: Vec<usize> = arr.getattr("shape")?.extract()?;
    if got != shape {
        return Err(Exc::Token.err(format!(
            "{what} must have the shape of tokens {shape:?}, got shape {got:?}"
        )));
    }
    let kind: String = arr.getattr("dtype")?.getattr("kind")?.extract()?;
    if !matches!(kind.as_str(), "i" | "u" | "b") {
        let dtype = arr.getattr("dtype")?.str()?.to_string();
        return Err(Exc::Token.err(format!("{what} must hold {holds}, got dtype {dtype}")));
    }
    if kind == "u" {
        // Above i64::MAX would wrap: such a value is out of every vocabulary anyway.
        let a = np
            .getattr("ascontiguousarray")?
            .call1((arr, np.getattr("uint64")?))?
            .cast_into::<PyArrayDyn<u64>>()?;
        let ro = a.readonly();
        return Ok(ro
            .as_array()
            .iter()
            .map(|&x| i64::try_from(x).unwrap_or(i64::MAX))
            .collect());
    }
    let a = np
        .getattr("ascontiguousarray")?
        .call1((arr, np.getattr("int64")?))?
        .cast_into::<PyArrayDyn<i64>>()?;
    let ro = a.readonly();
    Ok(ro.as_array().iter().copied().collect())
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut pos = vec![0; shape.len()];
    for (p, &d) in pos.iter_mut().zip(shape).rev() {
        if d > 0 {
            *p = i % d;
            i /= d;
        }
    }
    pos
}
