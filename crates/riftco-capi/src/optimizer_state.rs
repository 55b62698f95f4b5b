//! The optimizer's state in a file (since 2.8): `rt_adam_save` / `rt_adam_load`.

use crate::error::{guard, in_ptr, rt_status};
use crate::state::path_arg;
use crate::train::rt_adam;
use riftco_transformer::{load_optimizer_state, save_optimizer_state};
use std::ffi::c_char;
use std::sync::PoisonError;

/// Writes the optimizer's state (hyper-parameters, step counts, both moments of every trainable
/// parameter, named by parameter) to the safetensors file `path`, atomically: a kill leaves the
/// old file or the new one. Since 2.8.
///
/// Errors: RT_ERROR_NULL_POINTER, RT_ERROR_INVALID_STRING (an empty `path`), RT_ERROR_IO
/// (the folder is missing or not writable).
#[no_mangle]
pub unsafe extern "C" fn rt_adam_save(adam: *const rt_adam, path: *const c_char) -> rt_status {
    guard("rt_adam_save", || {
        let adam = in_ptr(adam, "adam")?;
        let path = path_arg(path, "path")?;
        let adam = adam.inner.lock().unwrap_or_else(PoisonError::into_inner);
        save_optimizer_state(&adam, &path)?;
        Ok(())
    })
}

/// Loads a state written by rt_adam_save into `adam`, whose parameters must be those the state
/// was saved for (same names, order and shapes). The file is read and checked whole first: on
/// error `adam` is unchanged. Since 2.8.
///
/// Errors: RT_ERROR_NULL_POINTER, RT_ERROR_INVALID_STRING, RT_ERROR_IO (unreadable file),
/// RT_ERROR_FORMAT (not an optimizer state, or a corrupt one), RT_ERROR_INVALID_ARGUMENT (a
/// state for other parameters, the message naming the first mismatch).
#[no_mangle]
pub unsafe extern "C" fn rt_adam_load(adam: *mut rt_adam, path: *const c_char) -> rt_status {
    guard("rt_adam_load", || {
        let adam = in_ptr(adam, "adam")?;
        let path = path_arg(path, "path")?;
        let mut adam = adam.inner.lock().unwrap_or_else(PoisonError::into_inner);
        load_optimizer_state(&mut adam, &path)?;
        Ok(())
    })
}
