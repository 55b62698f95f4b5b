//! Direct access to the CPU kernels of `riftco-kernels` on NumPy arrays.

use std::borrow::Cow;

use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray2, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use riftco_kernels::MatmulSpec;
use riftco_tensor::{Shape, TensorError};

use crate::errors::{compute, tensor_err, Exc};

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(simd_level, m)?)?;
    m.add_function(wrap_pyfunction!(matmul, m)?)?;
    Ok(())
}

/// Number of worker threads the CPU kernels run on.
///
/// Set by the environment variable `RIFTCO_NUM_THREADS` (a positive integer) before the first
/// kernel call, honoured also above the core count up to 4 threads per logical CPU (at least
/// 64; more is capped there with a warning line on stderr); otherwise, and for a value that is
/// not a positive integer (a warning line too), the number of physical cores.
///
/// Returns:
///     int: the thread count, at least 1.
///
/// Example:
///     >>> import riftco
///     >>> riftco.num_threads() >= 1
///     True
#[pyfunction]
fn num_threads() -> usize {
    riftco_kernels::num_threads()
}

/// The instruction-set level the CPU kernels (matrix products included) run at, chosen at run
/// time from what this CPU supports: `"avx512"` (x86-64 AVX-512 F/BW/CD/DQ/VL, 16 f32 lanes),
/// `"avx2"` (AVX2 + FMA, 8 lanes), `"neon"` (AArch64, 4 lanes) or `"scalar"`. The environment
/// variable `RIFTCO_SIMD=scalar|avx2|avx512|neon` forces a level this CPU supports
/// (`RIFTCO_FORCE_SCALAR=1` is another name for `scalar`); `import riftco` calls this function,
/// so a level the CPU lacks or an unknown name is refused at import.
///
/// Losses are bitwise reproducible for one level, not across levels: the levels differ in
/// summation order and fused multiply-adds.
///
/// Returns:
///     str: one of `"avx512"`, `"avx2"`, `"neon"`, `"scalar"`.
///
/// Raises:
///     ConfigError: `RIFTCO_SIMD` names a level this CPU lacks or no level at all (the message
///         names the value and the levels this CPU supports).
///
/// Example:
///     >>> import riftco
///     >>> riftco.simd_level() in ("avx512", "avx2", "neon", "scalar")
///     True
#[pyfunction]
fn simd_level() -> PyResult<&'static str> {
    riftco_kernels::simd::check_env().map_err(|e| Exc::Config.err(e))?;
    Ok(riftco_kernels::simd::current_level().name())
}

/// Matrix product `a @ b` of two 2-D float32 arrays, computed by the riftco GEMM kernel.
///
/// The GIL is released while the product is computed. C- and Fortran-contiguous inputs are read
/// in place (so they must not be written to from another Python thread during the call); other
/// layouts are copied first. Accumulation is in float32; results do not depend on the thread
/// count.
///
/// Args:
///     a: float32 array of shape `[m, k]`.
///     b: float32 array of shape `[k, n]`.
///
/// Returns:
///     numpy.ndarray: float32 array of shape `[m, n]`.
///
/// Raises:
///     ValueError: when the inner dimensions differ (the message names both shapes).
///     ShapeError: when the output's element count `m·n` overflows (its bytes would exceed
///         `isize::MAX`).
///     OutOfMemoryError: when the output cannot be allocated.
///     TypeError: when an argument is not a 2-D float32 array.
///
/// Example:
///     >>> import numpy as np, riftco
///     >>> riftco.matmul(np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)).shape
///     (2, 4)
#[pyfunction]
fn matmul<'py>(
    py: Python<'py>,
    a: PyReadonlyArray2<'py, f32>,
    b: PyReadonlyArray2<'py, f32>,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let (m, k) = (a.shape()[0], a.shape()[1]);
    let (k_b, n) = (b.shape()[0], b.shape()[1]);
    if k != k_b {
        return Err(PyValueError::new_err(format!(
            "matmul: shapes [{m}, {k}] and [{k_b}, {n}] are not aligned: \
             a has {k} columns but b has {k_b} rows"
        )));
    }
    let len = Shape::try_new("matmul", [m, n])
        .map_err(tensor_err)?
        .numel();
    let (a, trans_a) = row_major(&a).map_err(tensor_err)?;
    let (b, trans_b) = row_major(&b).map_err(tensor_err)?;
    let spec = MatmulSpec::new(m, k, n).trans_a(trans_a).trans_b(trans_b);
    let c = compute(py, || -> Result<Vec<f32>, TensorError> {
        let mut c = riftco_tensor::alloc::try_zeroed_vec("matmul", len)?;
        riftco_kernels::matmul(spec, &a, &b, &mut c);
        Ok(c)
    })?;
    let c = Array2::from_shape_vec((m, n), c)
        .map_err(|e| PyValueError::new_err(format!("matmul: output shape [{m}, {n}]: {e}")))?;
    Ok(c.into_pyarray(py))
}

/// The elements of `x[r, c]` as one slice, and whether that slice holds `xᵀ` row-major.
///
/// A C-contiguous array is borrowed as is; a Fortran-contiguous one (a transposed view) is
/// borrowed as its transpose, which the GEMM kernel reads through its `trans_*` flag; any other
/// layout (strided views, misaligned buffers) is copied to row-major order.
fn row_major<'a>(x: &'a PyReadonlyArray2<'_, f32>) -> Result<(Cow<'a, [f32]>, bool), TensorError> {
    if x.is_c_contiguous() {
        if let Ok(s) = x.as_slice() {
            return Ok((Cow::Borrowed(s), false));
        }
    } else if x.is_fortran_contiguous() {
        if let Ok(s) = x.as_slice() {
            return Ok((Cow::Borrowed(s), true));
        }
    }
    let view = x.as_array();
    // The copy's length is that of an existing array, but a broadcast view (stride 0) can
    // describe far more elements than it holds: allocate fallibly.
    let mut copy =
        riftco_tensor::alloc::try_vec_with_capacity("matmul (row-major copy)", view.len())?;
    copy.extend(view.iter().copied());
    Ok((Cow::Owned(copy), false))
}
