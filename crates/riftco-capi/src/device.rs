//! Moving a model between devices (2.5): `rt_model_to_device` and `rt_model_device`.

use crate::error::{guard, in_ptr, rt_status, Result};
use crate::model::rt_model;
use crate::strings::{str_arg, write_string};
use riftco_transformer::device::resolve_device;
use std::ffi::c_char;

/// Moves every parameter of the model (base and LoRA) and its gradient to the device named by
/// `device` (NUL-terminated UTF-8, case-insensitive): `"cpu"`, `"vulkan"` (wgpu's Vulkan
/// backend), `"metal"` (wgpu's Metal backend, macOS), `"gpu"` (the best GPU adapter: Metal on
/// macOS, Vulkan elsewhere) or `"privateuseone"`. A GPU backend is opened on first use. Since
/// 2.5.
///
/// Like PyTorch's `module.to(device)` the move is in place and shared by every handle of the
/// model (rt_model_retain). Graphs recorded before are stale (RT_ERROR_STALE_GRAPH), decode
/// sessions created before refuse to decode (their K/V cache is on the old device: create a new
/// one), and an rt_adam created before keeps its moments on the old device (its next step is
/// RT_ERROR_DEVICE_MISMATCH): create the optimizer after the move. Every other export works on
/// a GPU model: training steps, losses and backward run there, rt_adam_step updates on the
/// device, decode keeps its K/V cache there, rt_model_save reads the weights back to the host
/// (the file is the same as from the CPU). rt_model_load always loads onto the CPU: move the
/// loaded model with this function. Moving to the current device only bumps versions.
///
/// Errors: RT_ERROR_NULL_POINTER (model or device), RT_ERROR_INVALID_STRING (device not UTF-8),
/// RT_ERROR_INVALID_ARGUMENT (an unknown name; the message names it and lists the accepted
/// names), RT_ERROR_DEVICE_UNAVAILABLE (no backend or no adapter for the device; the message
/// names what was looked for and the adapters found), RT_ERROR_OUT_OF_MEMORY (a copy could not
/// be allocated: the parameters already moved are moved back, the model is never split). On
/// error the model stays on its device.
#[no_mangle]
pub unsafe extern "C" fn rt_model_to_device(
    model: *mut rt_model,
    device: *const c_char,
) -> rt_status {
    guard("rt_model_to_device", || {
        let model = in_ptr(model, "model")?;
        let name = str_arg(device, "device")?;
        let device = resolve_device(name)?;
        model.lock().model.to_device(device)?;
        Ok(())
    })
}

/// Writes the name of the device the model's weights live on (`"cpu"` unless moved with
/// rt_model_to_device; `"vulkan"`, `"metal"` or `"privateuseone"`; never `"gpu"`, which names
/// one of the first two) into `buf` (`cap` bytes), NUL-terminated. Since 2.5.
///
/// `*needed` (when `needed` is not NULL) receives the bytes the name needs, NUL included. As
/// for rt_last_error_message: `cap` = 0 (`buf` may then be NULL) queries the size and returns
/// RT_ERROR_BUFFER_TOO_SMALL; a smaller `cap` receives a truncated NUL-terminated prefix and
/// RT_ERROR_BUFFER_TOO_SMALL.
///
/// Errors: RT_ERROR_NULL_POINTER (model; buf with `cap` > 0), RT_ERROR_BUFFER_TOO_SMALL.
#[no_mangle]
pub unsafe extern "C" fn rt_model_device(
    model: *const rt_model,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
) -> rt_status {
    guard("rt_model_device", || -> Result<()> {
        let model = in_ptr(model, "model")?;
        let name = model.lock().model.device().name();
        write_string(name, "device name", buf, cap, needed)
    })
}
