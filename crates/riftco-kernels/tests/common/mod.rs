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

/// FNV-1a over the bit patterns of `v` (a fingerprint for comparing runs, not a quality hash).
pub fn hash(v: &[f32]) -> u64 {
    v.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ x.to_bits() as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Runs the test `child` of this test binary in a child process with `env` set and
/// `RIFTCO_NUM_THREADS=threads`, and returns the `HASH name value` lines it printed (the kernel
/// pool's size is fixed per process, so thread counts are compared across processes).
pub fn child_hashes(child: &str, env: &str, threads: usize) -> Vec<String> {
    let exe = std::env::current_exe().expect("test binary path");
    let out = std::process::Command::new(exe)
        .args(["--exact", child, "--nocapture", "--test-threads", "1"])
        .env(env, "1")
        .env("RIFTCO_NUM_THREADS", threads.to_string())
        .output()
        .expect("run child test binary");
    assert!(
        out.status.success(),
        "child failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.find("HASH ").map(|at| l[at..].to_owned()))
        .collect()
}
