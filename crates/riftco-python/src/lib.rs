//! `riftco._native`: the PyO3 extension module behind the `riftco` Python package.
//!
//! One file per API area; this file only registers them. The pure-Python layer in
//! `python/riftco/` re-exports what is public, and `python/riftco/_native.pyi` types it.

use pyo3::prelude::*;

mod kernels;

/// The native half of `riftco`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    kernels::register(m)?;
    Ok(())
}
