//! String arguments and string results of the exports: NUL-terminated UTF-8 in, and the
//! caller-buffer convention of `rt_last_error_message` out.

use crate::error::{err, in_ptr, rt_status, Result};
use std::ffi::{c_char, CStr};

/// A NUL-terminated UTF-8 string argument.
pub(crate) unsafe fn str_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    let p = in_ptr(p, what)?;
    // SAFETY: non-NULL and NUL-terminated (caller contract).
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map_err(|e| {
        err(
            rt_status::RT_ERROR_INVALID_STRING,
            format!("{what} {:?} is not UTF-8: {e}", s.to_string_lossy()),
        )
    })
}

/// Copies `text` NUL-terminated into the caller buffer `buf` of `cap` bytes, the convention of
/// `rt_last_error_message`: `*needed` (when `needed` is not NULL) receives the bytes `text`
/// needs, NUL included; a too-small buffer (`cap` > 0) receives a truncated NUL-terminated
/// prefix (cut at a UTF-8 character boundary) and RT_ERROR_BUFFER_TOO_SMALL is returned, as it
/// is for `cap` = 0 (`buf` may be NULL then: a size query).
pub(crate) unsafe fn write_string(
    text: &str,
    what: &str,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
) -> Result<()> {
    let bytes = text.as_bytes();
    let need = bytes.len() + 1;
    // SAFETY: NULL or a valid `size_t` out-pointer.
    if let Some(n) = unsafe { needed.as_mut() } {
        *n = need;
    }
    let too_small = || {
        err(
            rt_status::RT_ERROR_BUFFER_TOO_SMALL,
            format!("cap {cap} is too small: the {what} needs {need} bytes (NUL included)"),
        )
    };
    if cap == 0 {
        return Err(too_small());
    }
    if buf.is_null() {
        return Err(err(
            rt_status::RT_ERROR_NULL_POINTER,
            format!("buf is NULL but cap is {cap}"),
        ));
    }
    // SAFETY: non-NULL, valid for `cap` bytes by contract.
    let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), cap) };
    // A truncated prefix ends on a character boundary: it stays valid UTF-8.
    let copy = crate::error::char_prefix(text, cap - 1);
    out[..copy].copy_from_slice(&bytes[..copy]);
    out[copy] = 0;
    if copy < bytes.len() {
        return Err(too_small());
    }
    Ok(())
}
