//! Saving and loading model state (safetensors with Hugging Face Llama names).

use crate::error::{err, guard, in_ptr, out_ptr, rt_status, Result};
use crate::model::{attention_kind, rt_model};
use crate::policy::checkpointing_arg;
use riftco_transformer::state::{load_model, save_model};
use std::ffi::{c_char, CStr};
use std::path::PathBuf;

/// A path from a NUL-terminated string (bytes as-is on Unix, UTF-8 elsewhere).
pub(crate) unsafe fn path_arg(p: *const c_char, what: &str) -> Result<PathBuf> {
    let p = in_ptr(p, what)?;
    // SAFETY: non-NULL and NUL-terminated (caller contract).
    let s = unsafe { CStr::from_ptr(p) };
    if s.is_empty() {
        return Err(err(
            rt_status::RT_ERROR_INVALID_STRING,
            format!("{what} is empty"),
        ));
    }
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        Ok(PathBuf::from(std::ffi::OsStr::from_bytes(s.to_bytes())))
    }
    #[cfg(not(unix))]
    {
        s.to_str().map(PathBuf::from).map_err(|e| {
            err(
                rt_status::RT_ERROR_INVALID_STRING,
                format!("{what} is not UTF-8: {e}"),
            )
        })
    }
}

/// Saves the model's base weights to `path` (a safetensors file; a `config.json` is written
/// beside it, so the folder must exist and be writable). The folder is replaced atomically as a
/// whole: the new folder (both files plus every other entry of the current one, hard-linked) is
/// built beside it and exchanged with it in one system call (Linux renameat2 RENAME_EXCHANGE,
/// macOS renamex_np RENAME_SWAP), so a process killed at any moment leaves a folder that every
/// reader loads as the old or the new model. Where the exchange is unavailable the two files are
/// renamed one by one, the state last (riftco still loads one model whole; other readers may see
/// a config.json of the other save after a kill between the renames).
/// The activation-checkpointing policy is not saved; LoRA adapters are not saved (their base
/// weights are, unmerged).
///
/// Errors: RT_ERROR_NULL_POINTER, RT_ERROR_INVALID_STRING (empty path), RT_ERROR_IO (folder
/// missing or not writable; an existing file is left intact), RT_ERROR_FORMAT (a path named
/// config.json or without a file name).
#[no_mangle]
pub unsafe extern "C" fn rt_model_save(model: *const rt_model, path: *const c_char) -> rt_status {
    guard("rt_model_save", || {
        let model = in_ptr(model, "model")?;
        let path = path_arg(path, "path")?;
        save_model(&model.lock().model, &path)?;
        Ok(())
    })
}

/// Loads a model saved by rt_model_save, a Hugging Face Llama safetensors file with its
/// config, or a GGUF file (llama.cpp) of the llama architecture (a .gguf name or the magic
/// "GGUF": config from its metadata, tensors dequantized to f32 bitwise as llama.cpp's
/// reference). `attention` (an rt_attention_kind) and `activation_checkpointing` (an
/// rt_activation_checkpointing without parameters: DISABLED, TRANSFORMER_BLOCK or AUTO) are
/// chosen by the caller: they are not part of the state.
/// `*out` receives a new handle owned by the caller (NULL on failure).
///
/// Errors: RT_ERROR_NULL_POINTER, RT_ERROR_INVALID_STRING, RT_ERROR_INVALID_ENUM, RT_ERROR_IO
/// (unreadable file, a directory), RT_ERROR_FORMAT (truncated or malformed file, a path that is
/// not a regular file such as a FIFO or /dev/zero, missing or unknown tensors, wrong dtypes or
/// shapes, invalid config; for GGUF also another architecture, a tensor type riftco does not
/// dequantize, a missing metadata key; the message names the tensor, the key or the field).
#[no_mangle]
pub unsafe extern "C" fn rt_model_load(
    path: *const c_char,
    attention: u32,
    activation_checkpointing: u32,
    out: *mut *mut rt_model,
) -> rt_status {
    guard("rt_model_load", || {
        let out = out_ptr(out, "out")?;
        *out = std::ptr::null_mut();
        let path = path_arg(path, "path")?;
        let attention = attention_kind(attention)?;
        let policy = checkpointing_arg(activation_checkpointing)?;
        *out = rt_model::new(load_model(&path, attention, policy)?);
        Ok(())
    })
}
