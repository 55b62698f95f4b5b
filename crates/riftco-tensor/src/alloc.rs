//! Fallible buffer allocation: a request the allocator refuses (memory exhausted, an
//! address-space limit such as `ulimit -v`, a size no allocator can serve) is
//! [`TensorError::OutOfMemory`] naming the op and the bytes, instead of the process abort of
//! `vec![0.0; n]`.

use crate::{Result, TensorError};
use std::alloc::Layout;

fn out_of_memory(op: &'static str, len: usize) -> TensorError {
    TensorError::OutOfMemory {
        op,
        bytes: len.saturating_mul(std::mem::size_of::<f32>()),
    }
}

/// `len` zeros, allocated like `vec![0.0f32; len]` (one zeroed allocation: fresh pages from the
/// OS are not written) but fallibly.
///
/// # Errors
/// [`TensorError::OutOfMemory`] when the allocation fails or `4 · len` exceeds `isize::MAX`.
pub fn try_zeroed_vec(op: &'static str, len: usize) -> Result<Vec<f32>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let layout = Layout::array::<f32>(len).map_err(|_| out_of_memory(op, len))?;
    // SAFETY: `layout` has a non-zero size (len > 0, f32 is 4 bytes).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<f32>();
    if ptr.is_null() {
        return Err(out_of_memory(op, len));
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `[f32; len]` (so
    // alignment and capacity agree with `Vec<f32>`'s), and all-zero bytes are the valid f32
    // value 0.0, so all `len` elements are initialised.
    Ok(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

/// `len` copies of `value`, fallibly (zeroed allocation when `value` is `+0.0`).
///
/// # Errors
/// As [`try_zeroed_vec`].
pub fn try_filled_vec(op: &'static str, len: usize, value: f32) -> Result<Vec<f32>> {
    if value.to_bits() == 0 {
        return try_zeroed_vec(op, len);
    }
    let mut v = try_vec_with_capacity(op, len)?;
    v.resize(len, value);
    Ok(v)
}

/// An empty vector with room for exactly `len` elements, fallibly.
///
/// # Errors
/// As [`try_zeroed_vec`].
pub fn try_vec_with_capacity<T>(op: &'static str, len: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| TensorError::OutOfMemory {
            op,
            bytes: len.saturating_mul(std::mem::size_of::<T>()),
        })?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impossible_sizes_are_errors_not_aborts() {
        for len in [usize::MAX, isize::MAX as usize / 4 + 1, 1 << 60] {
            assert!(matches!(
                try_zeroed_vec("test", len),
                Err(TensorError::OutOfMemory { op: "test", .. })
            ));
            assert!(matches!(
                try_filled_vec("test", len, 1.0),
                Err(TensorError::OutOfMemory { op: "test", .. })
            ));
        }
    }

    #[test]
    fn buffers_have_the_requested_contents() {
        assert_eq!(try_zeroed_vec("test", 0).unwrap(), Vec::<f32>::new());
        let z = try_zeroed_vec("test", 100_000).unwrap();
        assert_eq!((z.len(), z.capacity()), (100_000, 100_000));
        assert!(z.iter().all(|&x| x.to_bits() == 0));
        assert_eq!(try_filled_vec("test", 3, 2.5).unwrap(), vec![2.5; 3]);
        assert!(try_filled_vec("test", 2, -0.0)
            .unwrap()
            .iter()
            .all(|x| x.to_bits() == (-0.0f32).to_bits()));
    }
}
