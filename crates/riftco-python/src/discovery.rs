//! `_node_id(v)`, `_describe(v)` and `_reached(out, candidates)`: a Variable's graph identity,
//! the text error messages name it by, and which leaves a graph reads, for `riftco.checkpoint`'s
//! dependency discovery (which deduplicates leaves by identity — two Python wrappers of one
//! leaf are one dependency —, matches the leaf a `CheckpointError` names, and drops the leaves
//! it found that the callable does not read).

use std::collections::HashSet;

use pyo3::prelude::*;

use crate::variable::PyVariable;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_node_id, m)?)?;
    m.add_function(wrap_pyfunction!(_describe, m)?)?;
    m.add_function(wrap_pyfunction!(_reached, m)?)?;
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

/// For each candidate, whether the graph of ``out`` reaches it (``out`` itself included),
/// following every parent (also those that need no gradient) but not through ``stop``
/// (a checkpoint's inputs: what lies behind them is outside the callable).
///
/// Args:
///     out: the graph's output.
///     candidates: the Variables to look for.
///     stop: nodes reached but not walked through.
///
/// Returns:
///     list[bool]: one flag per candidate, in order.
#[pyfunction]
fn _reached(
    out: PyRef<'_, PyVariable>,
    candidates: Vec<PyRef<'_, PyVariable>>,
    stop: Vec<PyRef<'_, PyVariable>>,
) -> Vec<bool> {
    let stop: HashSet<u64> = stop.iter().map(|s| s.inner().id()).collect();
    let mut seen: HashSet<u64> = HashSet::new();
    let mut stack = vec![out.inner().clone()];
    seen.insert(out.inner().id());
    while let Some(v) = stack.pop() {
        if stop.contains(&v.id()) {
            continue;
        }
        for p in v.parents() {
            if seen.insert(p.id()) {
                stack.push(p.clone());
            }
        }
    }
    candidates
        .iter()
        .map(|c| seen.contains(&c.inner().id()))
        .collect()
}
