//! Run-time SIMD dispatch and the scalar override.
//!
//! Kernels call [`arch`] to get a `pulp::Arch`, which picks AVX-512, AVX2+FMA, NEON or scalar at
//! run time. When `RIFTCO_FORCE_SCALAR` is set to `1`/`true`, or [`set_force_scalar`] was called
//! with `true`, kernels take their scalar path instead; tests use this to compare every SIMD path
//! with the scalar one.

use std::sync::atomic::{AtomicU8, Ordering};

// 0 = not yet read from the environment, 1 = SIMD allowed, 2 = scalar forced.
static MODE: AtomicU8 = AtomicU8::new(0);

/// Whether kernels must take their scalar path.
pub fn force_scalar() -> bool {
    match MODE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let forced = std::env::var("RIFTCO_FORCE_SCALAR")
                .map(|v| matches!(v.trim(), "1" | "true" | "TRUE" | "yes"))
                .unwrap_or(false);
            MODE.store(if forced { 2 } else { 1 }, Ordering::Relaxed);
            forced
        }
    }
}

/// Force (or stop forcing) the scalar path for the whole process.
pub fn set_force_scalar(forced: bool) {
    MODE.store(if forced { 2 } else { 1 }, Ordering::Relaxed);
}

/// The SIMD architecture kernels should use: `pulp::Arch::Scalar` when scalar is forced.
pub fn arch() -> pulp::Arch {
    if force_scalar() {
        pulp::Arch::Scalar
    } else {
        pulp::Arch::new()
    }
}
