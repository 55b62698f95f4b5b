//! `riftco._native.functional.embedding(table, ids)`: the token-embedding lookup
//! (`riftco_autograd::ops::embedding`) on an integer id array of any rank, for `riftco.nn`.

use pyo3::prelude::*;
use riftco_autograd::ops;

use crate::errors::compute;
use crate::tokens::token_ids;
use crate::variable::PyVariable;

/// Adds `embedding` to the `functional` submodule (registered before this).
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let functional = m.getattr("functional")?.cast_into::<PyModule>()?;
    functional.add_function(wrap_pyfunction!(embedding, &functional)?)?;
    Ok(())
}

/// Rows of ``table`` selected by integer ``ids``: ``out[i..., :] = table[ids[i...], :]``
/// (``torch.nn.functional.embedding``).
///
/// Args:
///     table: Variable ``[num_embeddings, dim]``.
///     ids: integer array-like of any shape ``S`` (a NumPy array or nested list), each id in
///         ``[0, num_embeddings)``.
///
/// Returns:
///     Variable: ``S + (dim,)``. VJP: the gradient rows scatter-added into ``dtable``
///     (``ids`` get none).
///
/// Raises:
///     ShapeError: ``table`` is not 2-D.
///     TokenError: a non-integer ``ids`` dtype, or an id outside ``[0, num_embeddings)`` (the
///         message names it and its index).
#[pyfunction]
fn embedding(
    py: Python<'_>,
    table: PyRef<'_, PyVariable>,
    ids: &Bound<'_, PyAny>,
) -> PyResult<PyVariable> {
    let table = table.inner().clone();
    let dims = table.dims().to_vec();
    let ndim: usize = py
        .import("numpy")?
        .getattr("ndim")?
        .call1((ids,))?
        .extract()?;
    let vocab = if dims.len() == 2 { dims[0] } else { usize::MAX };
    let (ids, mut shape) = token_ids(ids, ndim, vocab, "embedding: ids")?;
    compute(py, move || {
        let rows = ops::embedding(&table, &ids)?;
        shape.push(rows.dims()[1]);
        ops::reshape(&rows, shape)
    })
    .map(PyVariable)
}
