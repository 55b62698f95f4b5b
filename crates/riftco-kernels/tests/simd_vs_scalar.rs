//! Every SIMD level this CPU supports against the forced scalar path, kernel by kernel.
//!
//! The SIMD level is process-global state, so the whole comparison is ONE test function (this
//! file is its own test binary, hence its own process under both `cargo test` and nextest).
//! SIMD and scalar run the same algorithms; they differ by fused multiply-adds and by the order
//! of lane-wise sums, so each comparison allows a few units of roundoff relative to the
//! magnitudes involved (stated per kernel below).

mod common;

use common::{vec_from_seed, U};
use riftco_kernels::simd::{self, SimdLevel};
use riftco_kernels::{adam, elementwise as ew, loss, map, norm, rope, softmax, UnaryOp};

/// All kernel outputs for one input set, as named vectors.
fn run_all(n: usize, cols: usize, seed: u64) -> Vec<(&'static str, Vec<f32>)> {
    let a = vec_from_seed(n, seed, 8.0);
    let b = vec_from_seed(n, seed ^ 1, 8.0);
    let g = vec_from_seed(n, seed ^ 2, 1.0);
    let mut res = Vec::new();
    let mut out = vec![0.0; n];
    let mut out2 = vec![0.0; n];
    ew::add(&a, &b, &mut out);
    res.push(("add", out.clone()));
    ew::mul(&a, &b, &mut out);
    res.push(("mul", out.clone()));
    ew::scale(&a, 0.3, &mut out);
    res.push(("scale", out.clone()));
    let mut d = b.clone();
    ew::axpy(0.3, &a, &mut d);
    res.push(("axpy", d));
    let mut d = b.clone();
    ew::add_assign(&mut d, &a);
    res.push(("add_assign", d));
    simd::exp(&a, &mut out);
    res.push(("exp", out.clone()));
    for (name, kind) in [
        ("unary.add_scalar", UnaryOp::AddScalar(0.7)),
        ("unary.mul_scalar", UnaryOp::MulScalar(-1.3)),
        ("unary.div_scalar", UnaryOp::DivScalar(3.0)),
        ("unary.rsub_scalar", UnaryOp::RSubScalar(2.0)),
        ("unary.rdiv_scalar", UnaryOp::RDivScalar(2.0)),
        ("unary.exp", UnaryOp::Exp),
        ("unary.sigmoid", UnaryOp::Sigmoid),
    ] {
        map::unary(kind, &a, &mut out);
        res.push((name, out.clone()));
    }
    ew::silu(&a, &mut out);
    res.push(("silu", out.clone()));
    ew::silu_backward(&a, &g, &mut out);
    res.push(("silu_backward", out.clone()));
    ew::swiglu(&a, &b, &mut out);
    res.push(("swiglu", out.clone()));
    ew::swiglu_backward(&a, &b, &g, &mut out, &mut out2);
    res.push(("swiglu_backward.dgate", out.clone()));
    res.push(("swiglu_backward.dup", out2.clone()));
    softmax::softmax_rows(&a, cols, &mut out);
    res.push(("softmax_rows", out.clone()));
    softmax::softmax_rows_backward(&out.clone(), &g, cols, &mut out2);
    res.push(("softmax_rows_backward", out2.clone()));
    let rows = n / cols;
    let mut lse = vec![0.0; rows];
    softmax::logsumexp_rows(&a, cols, &mut lse);
    res.push(("logsumexp_rows", lse.clone()));
    let w = vec_from_seed(cols, seed ^ 3, 2.0);
    let mut rstd = vec![0.0; rows];
    norm::rms_norm(&a, &w, 1e-5, &mut out, &mut rstd);
    res.push(("rms_norm.y", out.clone()));
    res.push(("rms_norm.rstd", rstd.clone()));
    let mut dw = vec![0.0; cols];
    norm::rms_norm_backward(&a, &w, &rstd, &g, &mut out, Some(&mut dw));
    res.push(("rms_norm_backward.dx", out.clone()));
    res.push(("rms_norm_backward.dweight", dw));
    if cols % 2 == 0 {
        let table = rope::RopeTable::new(rows, cols, 10000.0);
        rope::rope(&table, &a, rows, 1, 0, false, &mut out);
        res.push(("rope", out.clone()));
    }
    let targets: Vec<u32> = (0..rows).map(|r| ((r * 31 + 7) % cols) as u32).collect();
    let l = loss::cross_entropy(&a, &targets, cols, &mut lse);
    res.push(("cross_entropy", vec![l]));
    loss::cross_entropy_backward(&a, &targets, &lse, 1.0, &mut out);
    res.push(("cross_entropy_backward", out.clone()));
    let (mut p, mut m, mut v) = (b.clone(), vec![0.0; n], vec![0.0; n]);
    for (step, decoupled) in [(1, false), (2, true), (3, true)] {
        let h = adam::AdamHyper {
            weight_decay: 0.1,
            decoupled,
            ..Default::default()
        };
        adam::adam_update(&mut p, &g, &mut m, &mut v, step, h);
    }
    res.push(("adam.param", p));
    res
}

#[test]
fn every_simd_level_matches_scalar() {
    let levels = simd::available_levels();
    eprintln!("SIMD levels on this CPU: {levels:?}");
    for &(rows, cols) in &[
        (1usize, 1usize),
        (3, 17),
        (5, 64),
        (2, 4099),
        (40, 1000),
        (9, 2),
    ] {
        let n = rows * cols;
        for seed in 0..3u64 {
            simd::set_force_scalar(true);
            let scalar = run_all(n, cols, seed);
            simd::set_force_scalar(false);
            for &level in &levels {
                if level == SimdLevel::Scalar {
                    continue;
                }
                simd::set_simd_level(Some(level));
                assert_eq!(simd::current_level(), level);
                let fast = run_all(n, cols, seed);
                for ((name, s), (_, f)) in scalar.iter().zip(&fast) {
                    // Element-wise kernels differ by at most a few roundings (FMA contraction,
                    // exp's reduction rounding n differently): 16U relative plus a 1e-30 floor.
                    // Row reductions re-associate a sum of `cols` terms: (cols/4 + 16)U relative
                    // to the largest magnitude in the output vector.
                    let scale = s.iter().fold(0.0f64, |m, &x| m.max(x.abs() as f64));
                    for (i, (&x, &y)) in s.iter().zip(f).enumerate() {
                        let rel = 16.0 * U * (x.abs() as f64);
                        let row = (cols / 4 + 16) as f64 * U * scale;
                        let err = (x as f64 - y as f64).abs();
                        assert!(
                            err <= rel.max(row) + 1e-30 || x == y,
                            "{name} [{level:?}, rows {rows}, cols {cols}, seed {seed}] at {i}: \
                             scalar {x} vs simd {y}"
                        );
                    }
                }
            }
            simd::set_simd_level(None);
        }
    }
    // RoPE and the plain arithmetic kernels (the scalar-operand maps too) use no FMA and no
    // reduction: bitwise equal.
    for &level in &levels {
        simd::set_force_scalar(level == SimdLevel::Scalar);
        simd::set_simd_level(Some(level));
        let r = run_all(2000 * 34, 34, 7);
        simd::set_force_scalar(true);
        let s = run_all(2000 * 34, 34, 7);
        for ((name, x), (_, y)) in r.iter().zip(&s) {
            if matches!(*name, "add" | "mul" | "scale" | "add_assign" | "rope")
                || (name.starts_with("unary.") && name.ends_with("_scalar"))
            {
                assert_eq!(x, y, "{name} [{level:?}] not bitwise equal to scalar");
            }
        }
    }
    simd::set_force_scalar(false);
    simd::set_simd_level(None);
}
