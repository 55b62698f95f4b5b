//! `_node_id(v)`: a Variable's graph identity, for `riftco.checkpoint`'s dependency discovery
//! and `riftco.nn.Module`, which deduplicate leaves by identity (two Python wrappers of one
//! leaf are one dependency, one parameter).

use pyo3::prelude::*;

use crate::variable::PyVariable;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_node_id, m)?)?;
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
