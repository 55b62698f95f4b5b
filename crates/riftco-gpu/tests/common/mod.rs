//! Shared helpers of the GPU tests: the device-selection rule and tolerance checks.
#![allow(dead_code)]

use riftco_gpu::{GpuContext, GpuError};

/// The environment variable that names the device the GPU tests open (`"gpu"` when unset;
/// `"vulkan"` or `"metal"` to insist on one backend), like MLX's `MLX_TEST_DEVICE`.
pub const DEVICE_VAR: &str = "RIFTCO_TEST_GPU";

/// What a GPU test does when opening its device failed with `err`: `Ok(())` to skip (the
/// reason printed), `Err(message)` to fail. The single rule of every GPU test: skip when no
/// adapter exists, EXCEPT under `CI=true`, where a missing GPU is a failure (CI installs
/// Mesa's software Vulkan, so a missing adapter there is a broken setup, never a silent skip).
/// An unknown device name always fails.
pub fn skip_or_fail(err: &GpuError, ci: bool) -> Result<(), String> {
    match err {
        GpuError::UnknownDevice { .. } => Err(format!("{DEVICE_VAR}: {err}")),
        _ if ci => Err(format!(
            "CI=true and no GPU could be opened (install mesa-vulkan-drivers: scripts/gpu_setup.sh): {err}"
        )),
        _ => Ok(()),
    }
}

/// Whether `CI` is `true` (as CI sets it).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// The context for a GPU test, or `None` (with the reason on stderr) when the test must skip;
/// panics (fails the test) when [`skip_or_fail`] says so.
pub fn gpu_or_skip(test: &str) -> Option<GpuContext> {
    let name = std::env::var(DEVICE_VAR).unwrap_or_else(|_| "gpu".to_owned());
    match GpuContext::open_named(&name) {
        Ok(ctx) => Some(ctx),
        Err(err) => match skip_or_fail(&err, in_ci()) {
            Ok(()) => {
                eprintln!("SKIPPED {test}: no GPU ({err}); set CI=true to make this a failure");
                None
            }
            Err(message) => panic!("{test}: {message}"),
        },
    }
}

/// Assert `|got − want| ≤ rel · max(|want|, 1e-6 scale floor)` element-wise, naming the index.
/// The floor keeps values that should be 0 from demanding exact zeros: `floor` is the absolute
/// tolerance below which relative error is not meaningful.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], rel: f32, floor: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = rel * w.abs().max(floor);
        assert!(
            (g - w).abs() <= tol || (g.is_nan() && w.is_nan()) || g == w,
            "{what}[{i}]: gpu {g} vs cpu {w} (|diff| {} > tol {tol})",
            (g - w).abs()
        );
    }
}

/// Deterministic pseudo-random values in `[lo, hi)` (a 32-bit LCG; no external crate).
pub fn values(n: usize, seed: u32, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            lo + (hi - lo) * ((s >> 8) as f32 / (1u32 << 24) as f32)
        })
        .collect()
}

/// The edge sizes every kernel is tested on: 1, odd, and non-multiples of 16 and 256.
pub const SIZES: [usize; 5] = [1, 7, 63, 65, 257];

/// The GPU device for a backend test, the GPU backend installed (opened once per process), or
/// `None` (with the reason on stderr) when the test must skip; the same rule as
/// [`gpu_or_skip`]: no adapter fails under `CI=true`, an unknown device name always fails.
pub fn backend_or_skip(test: &str) -> Option<riftco_tensor::Device> {
    let name = std::env::var(DEVICE_VAR).unwrap_or_else(|_| "gpu".to_owned());
    let kind: riftco_gpu::GpuKind = match name.parse() {
        Ok(k) => k,
        Err(e) => panic!("{test}: {DEVICE_VAR}: {e}"),
    };
    match riftco_gpu::install(kind) {
        Ok((device, _)) => Some(device),
        Err(err) if in_ci() => panic!(
            "{test}: CI=true and no GPU could be opened (install mesa-vulkan-drivers: scripts/gpu_setup.sh): {err}"
        ),
        Err(err) => {
            eprintln!("SKIPPED {test}: no GPU ({err}); set CI=true to make this a failure");
            None
        }
    }
}

pub mod checks;
