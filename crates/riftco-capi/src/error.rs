//! Status codes, the thread-local last-error message, the panic guard and pointer checks.

use riftco_autograd::{AutogradError, CheckpointError};
use riftco_tensor::{ErrorKind, TensorError};
use riftco_transformer::TransformerError;
use std::cell::RefCell;
use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Status of every fallible function. Values are stable: a code is never renumbered or reused.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum rt_status {
    /// Success.
    RT_OK = 0,
    /// A required pointer argument is NULL.
    RT_ERROR_NULL_POINTER = 1,
    /// An argument value is out of range (config field, learning rate, token id, LoRA rank...).
    RT_ERROR_INVALID_ARGUMENT = 2,
    /// An enum argument (attention kind, checkpointing policy, LoRA targets) is unknown.
    RT_ERROR_INVALID_ENUM = 3,
    /// Lengths or shapes disagree (token buffer length vs `batch * (seq + 1)`, ...).
    RT_ERROR_SHAPE = 4,
    /// A file could not be read or written.
    RT_ERROR_IO = 5,
    /// A model-state file is malformed (names, shapes, dtypes, truncation, config).
    RT_ERROR_FORMAT = 6,
    /// A graph read a value that changed since its forward pass (e.g. an Adam step); run the
    /// forward again.
    RT_ERROR_STALE_GRAPH = 7,
    /// The requested device is not available.
    RT_ERROR_DEVICE_UNAVAILABLE = 8,
    /// A Rust panic was caught at the boundary (a bug; please report the message).
    RT_ERROR_PANIC = 9,
    /// A caller buffer is too small (the needed size is reported where the function says so).
    RT_ERROR_BUFFER_TOO_SMALL = 10,
    /// The object is not in a state that allows the call (no loss recorded yet, LoRA already
    /// enabled, decode cache full, ...).
    RT_ERROR_INVALID_STATE = 11,
    /// A path or string argument is not valid (interior encoding problems).
    RT_ERROR_INVALID_STRING = 12,
    /// Any other internal failure (an error of no known class; please report the message).
    RT_ERROR_INTERNAL = 13,
    /// An allocation was refused (memory or an address-space limit ran out); the message names
    /// the operation and the bytes.
    RT_ERROR_OUT_OF_MEMORY = 14,
    /// A `checkpoint()` contract violation (undeclared dependency, captured node, replay that
    /// changed shape or device, backward inside a replay); the message names the checkpoint.
    RT_ERROR_CHECKPOINT = 15,
    /// The operands of one operation live on different devices; the message names both.
    RT_ERROR_DEVICE_MISMATCH = 16,
}

impl rt_status {
    fn name(self) -> &'static CStr {
        use rt_status::*;
        match self {
            RT_OK => c"RT_OK",
            RT_ERROR_NULL_POINTER => c"RT_ERROR_NULL_POINTER",
            RT_ERROR_INVALID_ARGUMENT => c"RT_ERROR_INVALID_ARGUMENT",
            RT_ERROR_INVALID_ENUM => c"RT_ERROR_INVALID_ENUM",
            RT_ERROR_SHAPE => c"RT_ERROR_SHAPE",
            RT_ERROR_IO => c"RT_ERROR_IO",
            RT_ERROR_FORMAT => c"RT_ERROR_FORMAT",
            RT_ERROR_STALE_GRAPH => c"RT_ERROR_STALE_GRAPH",
            RT_ERROR_DEVICE_UNAVAILABLE => c"RT_ERROR_DEVICE_UNAVAILABLE",
            RT_ERROR_PANIC => c"RT_ERROR_PANIC",
            RT_ERROR_BUFFER_TOO_SMALL => c"RT_ERROR_BUFFER_TOO_SMALL",
            RT_ERROR_INVALID_STATE => c"RT_ERROR_INVALID_STATE",
            RT_ERROR_INVALID_STRING => c"RT_ERROR_INVALID_STRING",
            RT_ERROR_INTERNAL => c"RT_ERROR_INTERNAL",
            RT_ERROR_OUT_OF_MEMORY => c"RT_ERROR_OUT_OF_MEMORY",
            RT_ERROR_CHECKPOINT => c"RT_ERROR_CHECKPOINT",
            RT_ERROR_DEVICE_MISMATCH => c"RT_ERROR_DEVICE_MISMATCH",
        }
    }

    const ALL: [rt_status; 17] = {
        use rt_status::*;
        [
            RT_OK,
            RT_ERROR_NULL_POINTER,
            RT_ERROR_INVALID_ARGUMENT,
            RT_ERROR_INVALID_ENUM,
            RT_ERROR_SHAPE,
            RT_ERROR_IO,
            RT_ERROR_FORMAT,
            RT_ERROR_STALE_GRAPH,
            RT_ERROR_DEVICE_UNAVAILABLE,
            RT_ERROR_PANIC,
            RT_ERROR_BUFFER_TOO_SMALL,
            RT_ERROR_INVALID_STATE,
            RT_ERROR_INVALID_STRING,
            RT_ERROR_INTERNAL,
            RT_ERROR_OUT_OF_MEMORY,
            RT_ERROR_CHECKPOINT,
            RT_ERROR_DEVICE_MISMATCH,
        ]
    };

    /// The status of an error kind: the one place the C layer classifies core errors.
    /// `None` for a kind added after this match was written (reported as RT_ERROR_INTERNAL).
    fn of_kind(kind: ErrorKind) -> Option<rt_status> {
        use rt_status::*;
        Some(match kind {
            ErrorKind::Shape => RT_ERROR_SHAPE,
            ErrorKind::IndexOutOfRange
            | ErrorKind::InvalidArgument
            | ErrorKind::Config
            | ErrorKind::Tokens
            | ErrorKind::Lora => RT_ERROR_INVALID_ARGUMENT,
            ErrorKind::UnknownOption => RT_ERROR_INVALID_ENUM,
            ErrorKind::OutOfMemory => RT_ERROR_OUT_OF_MEMORY,
            ErrorKind::DeviceUnavailable => RT_ERROR_DEVICE_UNAVAILABLE,
            ErrorKind::DeviceMismatch => RT_ERROR_DEVICE_MISMATCH,
            ErrorKind::StaleGraph => RT_ERROR_STALE_GRAPH,
            ErrorKind::Checkpoint => RT_ERROR_CHECKPOINT,
            ErrorKind::Backward | ErrorKind::Decode => RT_ERROR_INVALID_STATE,
            ErrorKind::State => RT_ERROR_FORMAT,
            ErrorKind::Io => RT_ERROR_IO,
            ErrorKind::Panic => RT_ERROR_PANIC,
            ErrorKind::External => RT_ERROR_INTERNAL,
            _ => return None,
        })
    }
}

/// An error on its way to the boundary: a status and a message naming the bad value.
#[derive(Debug)]
pub(crate) struct Error {
    pub(crate) status: rt_status,
    pub(crate) message: String,
}

pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn err(status: rt_status, message: impl Into<String>) -> Error {
    Error {
        status,
        message: message.into(),
    }
}

/// A core error as a status (by its [`ErrorKind`]) and its message.
fn classified(kind: ErrorKind, message: String) -> Error {
    err(
        rt_status::of_kind(kind).unwrap_or(rt_status::RT_ERROR_INTERNAL),
        message,
    )
}

impl From<TransformerError> for Error {
    fn from(e: TransformerError) -> Self {
        classified(e.kind(), e.to_string())
    }
}

impl From<AutogradError> for Error {
    fn from(e: AutogradError) -> Self {
        classified(e.kind(), e.to_string())
    }
}

impl From<CheckpointError> for Error {
    fn from(e: CheckpointError) -> Self {
        classified(e.kind(), e.to_string())
    }
}

impl From<TensorError> for Error {
    fn from(e: TensorError) -> Self {
        classified(e.kind(), e.to_string())
    }
}

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn set_last_error(message: String) {
    // `try_with`: during thread teardown the slot may be gone; the status still reports.
    let _ = LAST_ERROR.try_with(|slot| {
        if let Ok(mut slot) = slot.try_borrow_mut() {
            *slot = message;
        }
    });
}

/// Runs an export body: errors become their status and the last-error message (prefixed with
/// the function name); a panic becomes `RT_ERROR_PANIC`.
pub(crate) fn guard(function: &'static str, body: impl FnOnce() -> Result<()>) -> rt_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => rt_status::RT_OK,
        Ok(Err(e)) => {
            set_last_error(format!("{function}: {}", e.message));
            e.status
        }
        Err(payload) => {
            let message = riftco_autograd::panic_message(payload.as_ref());
            // Dropping the payload can itself panic; keep that inside the boundary too.
            let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
            set_last_error(format!("{function}: panic: {message}"));
            rt_status::RT_ERROR_PANIC
        }
    }
}

/// Runs a body that cannot report a status (the `*_free` functions); a panic is swallowed.
pub(crate) fn guard_void(body: impl FnOnce()) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(body)) {
        let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
    }
}

/// A shared reference from a non-NULL pointer.
pub(crate) unsafe fn in_ptr<'a, T>(p: *const T, what: &str) -> Result<&'a T> {
    // SAFETY: the caller passes NULL or a valid pointer (crate-level contract).
    unsafe { p.as_ref() }
        .ok_or_else(|| err(rt_status::RT_ERROR_NULL_POINTER, format!("{what} is NULL")))
}

/// An exclusive reference from a non-NULL out-pointer.
pub(crate) unsafe fn out_ptr<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T> {
    // SAFETY: as `in_ptr`.
    unsafe { p.as_mut() }
        .ok_or_else(|| err(rt_status::RT_ERROR_NULL_POINTER, format!("{what} is NULL")))
}

/// A slice from a pointer and a length; NULL is allowed only for length 0.
pub(crate) unsafe fn in_slice<'a, T>(p: *const T, len: usize, what: &str) -> Result<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(err(
            rt_status::RT_ERROR_NULL_POINTER,
            format!("{what} is NULL but its length is {len}"),
        ));
    }
    // SAFETY: non-NULL and, by contract, valid for `len` elements.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// A mutable slice from a pointer and a length; NULL is allowed only for length 0.
pub(crate) unsafe fn out_slice<'a, T>(p: *mut T, len: usize, what: &str) -> Result<&'a mut [T]> {
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(err(
            rt_status::RT_ERROR_NULL_POINTER,
            format!("{what} is NULL but its length is {len}"),
        ));
    }
    // SAFETY: as `in_slice`.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
}

/// The length of the longest prefix of `s` of at most `max` bytes that ends on a character
/// boundary (so a truncated copy stays valid UTF-8).
pub(crate) fn char_prefix(s: &str, max: usize) -> usize {
    let mut i = max.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Copies the calling thread's last error message into `buf` as a NUL-terminated string.
///
/// `*needed` (when `needed` is not NULL) receives the size the message needs, terminating NUL
/// included (1 when no error has occurred on this thread). With `len >= *needed` the message is
/// copied and RT_OK returned; otherwise, when `buf` is not NULL and `len > 0`, a truncated
/// NUL-terminated prefix is written and RT_ERROR_BUFFER_TOO_SMALL returned (so
/// `rt_last_error_message(NULL, 0, &needed)` queries the size). This function never changes the
/// stored message.
///
/// Errors: RT_ERROR_NULL_POINTER when `buf` is NULL and `len > 0`; RT_ERROR_BUFFER_TOO_SMALL.
#[no_mangle]
pub unsafe extern "C" fn rt_last_error_message(
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> rt_status {
    let body = || -> rt_status {
        let message = LAST_ERROR
            .try_with(|slot| slot.try_borrow().map(|s| s.clone()).unwrap_or_default())
            .unwrap_or_default();
        let bytes = message.as_bytes();
        let need = bytes.len() + 1;
        // SAFETY: NULL or a valid `size_t` out-pointer.
        if let Some(n) = unsafe { needed.as_mut() } {
            *n = need;
        }
        if len == 0 {
            return rt_status::RT_ERROR_BUFFER_TOO_SMALL;
        }
        if buf.is_null() {
            return rt_status::RT_ERROR_NULL_POINTER;
        }
        // SAFETY: non-NULL, valid for `len` bytes by contract.
        let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
        // A truncated prefix ends on a character boundary: it stays valid UTF-8.
        let copy = char_prefix(&message, len - 1);
        out[..copy].copy_from_slice(&bytes[..copy]);
        out[copy] = 0;
        if copy < bytes.len() {
            rt_status::RT_ERROR_BUFFER_TOO_SMALL
        } else {
            rt_status::RT_OK
        }
    };
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(rt_status::RT_ERROR_PANIC)
}

/// The name of a status code as a static NUL-terminated string (`"RT_OK"`,
/// `"RT_ERROR_SHAPE"`, ...), or `"RT_UNKNOWN_STATUS"` for a value this library does not define.
/// Never NULL; the caller does not free it.
#[no_mangle]
pub extern "C" fn rt_status_name(status: u32) -> *const c_char {
    let body = || {
        rt_status::ALL
            .iter()
            .find(|s| **s as u32 == status)
            .map_or(c"RT_UNKNOWN_STATUS", |s| s.name())
            .as_ptr()
    };
    catch_unwind(body).unwrap_or(c"RT_UNKNOWN_STATUS".as_ptr())
}

#[cfg(test)]
mod kind_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_a_status_and_a_message() {
        let status = guard("test_fn", || panic!("boom {}", 7));
        assert_eq!(status, rt_status::RT_ERROR_PANIC);
        let mut buf = [0 as c_char; 64];
        let mut needed = 0usize;
        let s = unsafe { rt_last_error_message(buf.as_mut_ptr(), buf.len(), &mut needed) };
        assert_eq!(s, rt_status::RT_OK);
        let msg = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
        assert_eq!(msg, "test_fn: panic: boom 7");
        assert_eq!(needed, msg.len() + 1);
    }

    #[test]
    fn status_values_are_stable() {
        for (i, s) in rt_status::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i, "{s:?}");
        }
        let name = unsafe { CStr::from_ptr(rt_status_name(7)) };
        assert_eq!(name.to_str().unwrap(), "RT_ERROR_STALE_GRAPH");
        let name = unsafe { CStr::from_ptr(rt_status_name(9999)) };
        assert_eq!(name.to_str().unwrap(), "RT_UNKNOWN_STATUS");
    }

    #[test]
    fn small_buffers_get_a_truncated_message() {
        let _ = guard("f", || Err(err(rt_status::RT_ERROR_SHAPE, "0123456789")));
        let mut needed = 0usize;
        let s = unsafe { rt_last_error_message(std::ptr::null_mut(), 0, &mut needed) };
        assert_eq!(s, rt_status::RT_ERROR_BUFFER_TOO_SMALL);
        assert_eq!(needed, "f: 0123456789".len() + 1);
        let mut buf = [1 as c_char; 4];
        let s = unsafe { rt_last_error_message(buf.as_mut_ptr(), 4, std::ptr::null_mut()) };
        assert_eq!(s, rt_status::RT_ERROR_BUFFER_TOO_SMALL);
        assert_eq!(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_bytes(), b"f: ");
    }
}
