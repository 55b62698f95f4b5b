//! Devices: what `riftco.devices()` reports, and the test backend switch.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use riftco_tensor::Device;

/// The device names of the Python API, in the order `riftco.devices()` lists them.
pub(crate) const DEVICE_NAMES: [&str; 4] = ["cpu", "vulkan", "metal", "gpu"];

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("DEVICES", pyo3::types::PyTuple::new(m.py(), DEVICE_NAMES)?)?;
    m.add_function(wrap_pyfunction!(devices, m)?)?;
    m.add_function(wrap_pyfunction!(synchronize, m)?)?;
    m.add_function(wrap_pyfunction!(_install_mirror_backend, m)?)?;
    m.add_function(wrap_pyfunction!(crate::transfer::_move_leaves_, m)?)?;
    Ok(())
}

/// The device `name` resolves to and, for a GPU, its adapter (`"name (backend, type, driver
/// ...)"`); or why it is not available.
fn probe(name: &str) -> Result<(Device, Option<String>), String> {
    let device = riftco_transformer::device::resolve_device(name).map_err(|e| e.to_string())?;
    if !Device::GPUS.contains(&device) {
        return Ok((device, None));
    }
    let ctx = riftco_gpu::install_device(device).map_err(|e| e.to_string())?;
    Ok((device, Some(ctx.adapter().to_string())))
}

/// Every device name a model or a Variable can be moved to, probed: ``"cpu"``, ``"vulkan"``,
/// ``"metal"`` and ``"gpu"`` (the best adapter of either GPU backend).
///
/// Probing a GPU name opens its adapter once (as the first ``model.to`` would; later calls
/// return the same adapter).
///
/// Returns:
///     list[dict]: one dict per name, in that order: ``device`` (the name asked for),
///     ``available`` (bool); when available ``resolved`` (the device it names: ``"gpu"`` is
///     ``"vulkan"`` or ``"metal"``) and ``adapter`` (the GPU adapter's name, backend, type
///     and driver; ``None`` for ``"cpu"``); otherwise ``reason`` (what was looked for and
///     what was found).
///
/// Example:
///     >>> import riftco
///     >>> riftco.devices()[0]
///     {'device': 'cpu', 'available': True, 'resolved': 'cpu', 'adapter': None}
#[pyfunction]
fn devices(py: Python<'_>) -> PyResult<Vec<Py<PyDict>>> {
    let mut out = Vec::with_capacity(DEVICE_NAMES.len());
    for name in DEVICE_NAMES {
        let d = PyDict::new(py);
        d.set_item("device", name)?;
        match py.detach(|| probe(name)) {
            Ok((device, adapter)) => {
                d.set_item("available", true)?;
                d.set_item("resolved", device.name())?;
                d.set_item("adapter", adapter)?;
            }
            Err(reason) => {
                d.set_item("available", false)?;
                d.set_item("reason", reason)?;
            }
        }
        out.push(d.unbind());
    }
    Ok(out)
}

/// Waits until every operation issued on ``device`` so far has finished (like
/// ``torch.cuda.synchronize()`` or ``mx.synchronize()``).
///
/// A GPU backend records kernels and submits them in batches; values are waited for only when
/// read on the host (``item()``, ``numpy()``). Time device work with a ``synchronize()`` before
/// reading the clock. The CPU computes when called: there it returns at once.
///
/// Args:
///     device: a name of ``DEVICES`` (any case) or ``"privateuseone"``; ``None`` (the default):
///         every device opened so far. A device not opened yet has nothing to wait for.
///
/// Raises:
///     ConfigError: an unknown device name (the message lists the valid ones).
///     DeviceUnavailableError: the device reported a failure of queued work.
///
/// Example:
///     >>> import riftco
///     >>> riftco.synchronize()
#[pyfunction]
#[pyo3(signature = (device = None))]
fn synchronize(py: Python<'_>, device: Option<&str>) -> PyResult<()> {
    let opened = riftco_tensor::backend::registered_devices();
    let devices = match device.map(|name| (name, Device::parse(name))) {
        None => opened,
        Some((_, Ok(d))) if d == Device::Cpu || opened.contains(&d) => vec![d],
        // A device not opened yet has nothing queued; nor has "gpu" while no GPU is open.
        Some((_, Ok(_))) => Vec::new(),
        Some((name, Err(_))) if name.eq_ignore_ascii_case("gpu") => Vec::new(),
        Some((_, Err(e))) => return Err(crate::errors::tensor_err(e)),
    };
    py.detach(|| {
        devices
            .into_iter()
            .try_for_each(riftco_tensor::backend::synchronize)
    })
    .map_err(crate::errors::tensor_err)
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
