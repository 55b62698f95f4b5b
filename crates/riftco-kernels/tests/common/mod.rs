//! Helpers shared by the kernel tests: deterministic inputs, size strategies and bounds.
#![allow(dead_code)]

use proptest::prelude::*;

/// f32 unit roundoff, `2^-24`.
pub const U: f64 = 5.960_464_477_539_063e-8;

/// Row/vector lengths: 1, small odd sizes, non-multiples of 16, and a large 4099.
pub fn len_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(1usize),
        2usize..70,
        Just(15),
        Just(17),
        Just(255),
        Just(4099)
    ]
}

/// A reproducible vector of `n` values in `[-scale, scale]` from `seed` (xorshift).
pub fn vec_from_seed(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            (2.0 * u - 1.0) * scale
        })
        .collect()
}

/// Asserts `|got[i] − want[i]| <= tol(i)` for every `i`, naming the kernel and index.
pub fn assert_close(name: &str, got: &[f32], want: &[f64], tol: impl Fn(usize) -> f64) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let t = tol(i);
        let err = (g as f64 - w).abs();
        assert!(
            err <= t || (g.is_nan() && w.is_nan()) || (g as f64 == w),
            "{name}[{i}]: got {g}, want {w}, |err| {err:e} > tol {t:e}"
        );
    }
}

/// Reference logistic sigmoid in f64.
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}
