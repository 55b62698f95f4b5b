//! Devices: the test backend switch.

use pyo3::prelude::*;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_install_mirror_backend, m)?)?;
    Ok(())
}

/// Registers the mirror test backend for the device ``"privateuseone"`` (idempotent).
///
/// The mirror backend keeps its buffers in a type no CPU kernel can read and runs the CPU
/// kernels on copies, so a model moved there with ``model.to("privateuseone")`` computes bitwise
/// what it computes on ``"cpu"`` while every op must go through the device seam. For tests.
#[pyfunction]
fn _install_mirror_backend() {
    riftco_tensor::backend::mirror::install();
}
