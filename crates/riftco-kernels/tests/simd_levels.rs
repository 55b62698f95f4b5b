//! The SIMD level override: `RIFTCO_SIMD` is honoured or refused with a clear error, and matrix
//! products follow the selected level, bitwise the `gemm` crate's own dispatch at the CPU's best
//! level and within the dot-product rounding bound of the scalar product at every other level.

use riftco_kernels::matmul::{matmul, MatmulSpec};
use riftco_kernels::simd::{self, SimdLevel};

/// f32 unit roundoff.
const U: f64 = 1.0 / (1u64 << 24) as f64;

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Shapes that reach each path of the gemm driver: gemv (m = 1 or n = 1), the tiny-k path
/// (k <= 2), the horizontal kernels (m·n <= 256), the small-product blocking (m, n <= 64) and
/// the cache-derived blocking with k split into several blocks (k > 512).
const SHAPES: [(usize, usize, usize); 8] = [
    (1, 37, 64),
    (33, 1, 64),
    (9, 7, 2),
    (8, 16, 40),
    (33, 300, 32),
    (64, 64, 700),
    (70, 129, 1100),
    (5, 300, 576),
];

fn product(m: usize, k: usize, n: usize, trans_b: bool, acc: bool) -> Vec<f32> {
    let a = values(m * k, 1);
    let b = values(k * n, 2);
    let mut c = values(m * n, 3);
    matmul(
        MatmulSpec::new(m, k, n).trans_b(trans_b).accumulate(acc),
        &a,
        &b,
        &mut c,
    );
    c
}

/// The same product through `gemm::gemm`, which dispatches to the CPU's best level itself.
fn gemm_crate(m: usize, k: usize, n: usize, trans_b: bool, acc: bool) -> Vec<f32> {
    let a = values(m * k, 1);
    let b = values(k * n, 2);
    let mut c = values(m * n, 3);
    let (b_cs, b_rs) = if trans_b {
        (k as isize, 1)
    } else {
        (1, n as isize)
    };
    // SAFETY: row-major a [m, k], b [k, n] (or [n, k] transposed) and c [m, n], all in bounds.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            acc,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            b_cs,
            b_rs,
            if acc { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
    c
}

#[test]
fn products_at_the_best_level_are_the_gemm_crates() {
    if std::env::var_os(simd::SIMD_ENV).is_some()
        || std::env::var_os("RIFTCO_FORCE_SCALAR").is_some()
    {
        simd::set_force_scalar(false);
    }
    simd::set_simd_level(None);
    let best = *simd::available_levels().last().unwrap();
    assert_eq!(simd::current_level(), best);
    for &(m, n, k) in &SHAPES {
        for trans_b in [false, true] {
            if m == 1 && trans_b {
                // One row against a weight stored [n, k] takes riftco's matrix-vector path
                // (matvec.rs, tested there), not gemm's.
                continue;
            }
            for acc in [false, true] {
                assert_eq!(
                    product(m, k, n, trans_b, acc),
                    gemm_crate(m, k, n, trans_b, acc),
                    "m {m}, n {n}, k {k}, trans_b {trans_b}, accumulate {acc} at {best:?}"
                );
            }
        }
    }
}

#[test]
fn every_level_runs_its_own_products() {
    let levels = simd::available_levels();
    simd::set_force_scalar(true);
    let scalar: Vec<Vec<f32>> = SHAPES
        .iter()
        .map(|&(m, n, k)| product(m, k, n, true, false))
        .collect();
    simd::set_force_scalar(false);
    for &level in &levels[1..] {
        simd::set_simd_level(Some(level));
        assert_eq!(simd::current_level(), level);
        for (&(m, n, k), s) in SHAPES.iter().zip(&scalar) {
            let got = product(m, k, n, true, false);
            // Any summation order of k products of values in [-1, 1], with or without fused
            // multiply-adds, is within γ_k·Σ|a·b| <= γ_k·k of the exact sum (Higham 2002, §3.1),
            // so two orders are within 2·γ_k·k.
            let gamma = k as f64 * U / (1.0 - k as f64 * U);
            for (i, (&x, &y)) in s.iter().zip(&got).enumerate() {
                let err = (x as f64 - y as f64).abs();
                assert!(
                    err <= 2.0 * gamma * k as f64,
                    "{level:?} m {m} n {n} k {k} at {i}: {x} vs {y}"
                );
            }
        }
    }
    simd::set_simd_level(None);
}

/// Under `RIFTCO_SIMD=<level>` (the test command runs the numerics tests once per level the
/// machine has) the level is in force, for element-wise kernels and products alike; a level
/// this CPU lacks or an unknown name makes this test fail with the refusal.
#[test]
fn the_environments_level_is_in_force() {
    if let Err(e) = simd::check_env() {
        panic!("{e}");
    }
    match std::env::var(simd::SIMD_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        Some(v) if v.trim() != "auto" => {
            let want = SimdLevel::from_name(v.trim()).expect("checked by check_env");
            assert_eq!(simd::current_level(), want);
        }
        _ => {
            let best = *simd::available_levels().last().unwrap();
            let forced = std::env::var("RIFTCO_FORCE_SCALAR").is_ok_and(|v| v.trim() == "1");
            assert_eq!(
                simd::current_level(),
                if forced { SimdLevel::Scalar } else { best }
            );
        }
    }
}

#[test]
fn level_names_round_trip() {
    for level in [
        SimdLevel::Scalar,
        SimdLevel::Avx2,
        SimdLevel::Avx512,
        SimdLevel::Neon,
    ] {
        assert_eq!(SimdLevel::from_name(level.name()), Some(level));
    }
    assert_eq!(SimdLevel::from_name("sse2"), None);
    assert_eq!(
        SimdLevel::from_name("AVX2"),
        None,
        "names are lower case; the env is lowered first"
    );
}
