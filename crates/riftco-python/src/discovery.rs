//! `_node_id(v)` and `_describe(v)`: a Variable's graph identity and the text error messages
//! name it by, for `riftco.checkpoint`'s dependency discovery (which deduplicates leaves by
//! identity — two Python wrappers of one leaf are one dependency — and matches the leaf a
//! `CheckpointError` names).

use pyo3::prelude::*;

use crate::variable::PyVariable;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_node_id, m)?)?;
    m.add_function(wrap_pyfunction!(_describe, m)?)?;
    Ok(())
}

/// The graph node's identity: equal for two wrappers of the same node, distinct for distinct
/// nodes of this process.
///
/// Returns:
///     int: in ``[0, 2**64)``.
#[pyfunction]
fn _node_id(v: PyRef<'_, PyVariable>) -> u64 {
    v.inner().id()
}

/// How checkpoint error messages name this node: ``"name" [dims]`` for a named one, else
/// ``op #id [dims]``.
///
/// Returns:
///     str: the description.
#[pyfunction]
fn _describe(v: PyRef<'_, PyVariable>) -> String {
    v.inner().describe()
}
