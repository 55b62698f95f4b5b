//! Helpers shared by the C ABI's Rust tests.

use riftco::rt_last_error_message;
use std::ffi::{c_char, CStr};
use std::ptr::null_mut;

/// This thread's last error message (`rt_last_error_message`), as text.
pub fn last_error() -> String {
    let mut buf = [0 as c_char; 1024];
    unsafe { rt_last_error_message(buf.as_mut_ptr(), buf.len(), null_mut()) };
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}
