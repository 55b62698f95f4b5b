//! Finite differences in f64 and the bad-input assertion shared by the transformer-kernel tests.

use riftco_gpu::GpuError;

/// Central differences `∂f/∂x_i ≈ (f(x + h e_i) − f(x − h e_i)) / 2h` of a scalar f64 function.
pub fn finite_differences(f: impl Fn(&[f64]) -> f64, x: &[f64], h: f64) -> Vec<f64> {
    (0..x.len())
        .map(|i| {
            let (mut plus, mut minus) = (x.to_vec(), x.to_vec());
            plus[i] += h;
            minus[i] -= h;
            (f(&plus) - f(&minus)) / (2.0 * h)
        })
        .collect()
}

/// `got` (a GPU gradient, f32) against `want` (finite differences, f64): within `tol` of
/// `max(|want|, 1)` element-wise (f32 rounding of the GPU kernel dominates the difference).
pub fn assert_grad(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let bound = tol * w.abs().max(1.0);
        assert!(
            (g as f64 - w).abs() <= bound,
            "{what}[{i}]: gpu {g} vs finite differences {w} (bound {bound})"
        );
    }
}

/// `r` is a [`GpuError::Shape`] whose message contains every string of `needles` (the
/// offending values), never a panic and never another error.
pub fn assert_shape_error<T>(what: &str, r: Result<T, GpuError>, needles: &[&str]) {
    match r {
        Ok(_) => panic!("{what}: accepted bad input"),
        Err(GpuError::Shape { message, .. }) => {
            for n in needles {
                assert!(
                    message.contains(n),
                    "{what}: {message:?} does not name {n:?}"
                );
            }
        }
        Err(e) => panic!("{what}: expected GpuError::Shape, got {e}"),
    }
}

/// `v` as f64.
pub fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}
