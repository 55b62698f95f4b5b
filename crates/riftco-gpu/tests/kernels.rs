//! GPU kernels vs the CPU kernels of riftco-kernels on edge sizes (1, odd, non-multiples of the
//! 16-wide matmul tile and of the 256-wide workgroups). Tolerances (relative):
//! - add, mul, scale, the scalar maps: bitwise (one IEEE operation on both sides);
//! - transcendental maps: 1e-5 relative; where the result crosses 0 (log near 1, tanh near 0,
//!   both GELUs, whose CPU form `1 + erf`/`1 + tanh` cancels in the negative tail) 1e-5 of
//!   `max(|y|, 1)`, i.e. 1e-5 absolute below |y| = 1;
//! - softmax: 1e-5 relative (the row sum is a tree of strided partials, not the CPU order);
//! - sums: 1e-4 relative (reduction order differs: 512-value blocks in a fixed tree vs the CPU
//!   kernel's order), inputs in [0, 1) so that no cancellation hides the order;
//! - matmul: 1e-4 of `Σ_k |a_ik · b_kj|` (k summed in increasing order per output vs gemm's
//!   blocked order; the bound is the standard one for a dot product, so cancellation in the
//!   inputs does not make a correct result fail).

mod common;

use common::{assert_close, gpu_or_skip, values, SIZES};
use riftco_gpu::kernels;
use riftco_kernels::map::UnaryOp;
use riftco_kernels::matmul::MatmulSpec;
use riftco_kernels::reduce::{reduce, ReduceOp};

#[test]
fn add_mul_scale_match_the_cpu_bitwise() {
    let Some(ctx) = gpu_or_skip("add_mul_scale_match_the_cpu_bitwise") else {
        return;
    };
    for n in SIZES.into_iter().chain([0, 1000]) {
        let a = values(n, 1, -3.0, 3.0);
        let b = values(n, 2, -3.0, 3.0);
        let (ga, gb) = (ctx.upload(&a).unwrap(), ctx.upload(&b).unwrap());
        let mut want = vec![0.0; n];
        riftco_kernels::elementwise::add(&a, &b, &mut want);
        assert_eq!(
            ctx.download(&kernels::add(&ctx, &ga, &gb).unwrap())
                .unwrap(),
            want,
            "add n={n}"
        );
        riftco_kernels::elementwise::mul(&a, &b, &mut want);
        assert_eq!(
            ctx.download(&kernels::mul(&ctx, &ga, &gb).unwrap())
                .unwrap(),
            want,
            "mul n={n}"
        );
        riftco_kernels::elementwise::scale(&a, -0.37, &mut want);
        let got = ctx
            .download(&kernels::scale(&ctx, &ga, -0.37).unwrap())
            .unwrap();
        assert_eq!(got, want, "scale n={n}");
    }
}

#[test]
fn a_length_past_65535_workgroups_wraps_into_the_second_grid_dimension() {
    let Some(ctx) =
        gpu_or_skip("a_length_past_65535_workgroups_wraps_into_the_second_grid_dimension")
    else {
        return;
    };
    // 65535 · 256 + 3 values: the last 3 live in grid row y = 1.
    let n = 65_535 * 256 + 3;
    let a: Vec<f32> = (0..n).map(|i| (i % 1009) as f32).collect();
    let got = ctx
        .download(&kernels::scale(&ctx, &ctx.upload(&a).unwrap(), 2.0).unwrap())
        .unwrap();
    for i in [0, 1, n / 2, n - 4, n - 3, n - 2, n - 1] {
        assert_eq!(got[i], 2.0 * a[i], "index {i}");
    }
    assert!(got.iter().zip(&a).all(|(g, x)| *g == 2.0 * x));
}

/// (op, input range, floor of the relative tolerance's scale).
fn unary_cases() -> Vec<(UnaryOp, f32, f32, f32)> {
    vec![
        (UnaryOp::Neg, -5.0, 5.0, 0.0),
        (UnaryOp::Exp, -10.0, 10.0, 0.0),
        (UnaryOp::Log, 1e-3, 20.0, 1.0),
        (UnaryOp::Tanh, -12.0, 12.0, 1.0),
        (UnaryOp::Sigmoid, -15.0, 15.0, 0.0),
        (UnaryOp::Relu, -2.0, 2.0, 0.0),
        (UnaryOp::Gelu, -6.0, 6.0, 1.0),
        (UnaryOp::GeluTanh, -6.0, 6.0, 1.0),
        (UnaryOp::PowScalar(2.0), -4.0, 4.0, 0.0),
        (UnaryOp::PowScalar(3.0), -4.0, 4.0, 0.0),
        (UnaryOp::PowScalar(0.5), 0.0, 9.0, 0.0),
        (UnaryOp::PowScalar(-1.5), 0.1, 9.0, 0.0),
        (UnaryOp::PowScalar(1.7), 0.0, 9.0, 0.0),
        (UnaryOp::PowScalar(0.0), -4.0, 4.0, 0.0),
        (UnaryOp::AddScalar(0.25), -2.0, 2.0, 0.0),
        (UnaryOp::MulScalar(-1.5), -2.0, 2.0, 0.0),
        (UnaryOp::DivScalar(3.0), -2.0, 2.0, 0.0),
        (UnaryOp::RSubScalar(1.0), -2.0, 2.0, 0.0),
        (UnaryOp::RDivScalar(2.0), 0.5, 4.0, 0.0),
    ]
}

#[test]
fn every_unary_map_matches_the_cpu() {
    let Some(ctx) = gpu_or_skip("every_unary_map_matches_the_cpu") else {
        return;
    };
    for (op, lo, hi, floor) in unary_cases() {
        for n in SIZES.into_iter().chain([1000]) {
            let x = values(n, 3, lo, hi);
            let mut want = vec![0.0; n];
            riftco_kernels::map::unary(op, &x, &mut want);
            let got = ctx
                .download(&kernels::unary(&ctx, op, &ctx.upload(&x).unwrap()).unwrap())
                .unwrap();
            assert_close(
                &format!("{op:?} n={n}"),
                &got,
                &want,
                1e-5,
                floor.max(1e-30),
            );
        }
    }
}

#[test]
fn unary_special_values_follow_the_cpu() {
    let Some(ctx) = gpu_or_skip("unary_special_values_follow_the_cpu") else {
        return;
    };
    let x = [0.0f32, -0.0, -1.0, -2.0, 30.0, -30.0];
    let cases = [
        UnaryOp::Log,
        UnaryOp::Relu,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::PowScalar(3.0),
        UnaryOp::PowScalar(-1.0),
        UnaryOp::PowScalar(0.0),
    ];
    for op in cases {
        let mut want = vec![0.0; x.len()];
        riftco_kernels::map::unary(op, &x, &mut want);
        let got = ctx
            .download(&kernels::unary(&ctx, op, &ctx.upload(&x).unwrap()).unwrap())
            .unwrap();
        for i in 0..x.len() {
            let (g, w) = (got[i], want[i]);
            let same = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= 1e-5 * w.abs();
            assert!(same, "{op:?}({}) gpu {g} cpu {w}", x[i]);
        }
    }
}

fn cpu_row_sums(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; rows];
    reduce(ReduceOp::Sum, x, &[rows, cols], &[rows, 1], &mut out);
    out
}

#[test]
fn sums_match_the_cpu_within_1e_4() {
    let Some(ctx) = gpu_or_skip("sums_match_the_cpu_within_1e_4") else {
        return;
    };
    // 1000 and 5000 take two passes, 300_000 three.
    for n in SIZES.into_iter().chain([512, 513, 1000, 5000, 300_000]) {
        let x = values(n, 4, 0.0, 1.0);
        let got = ctx
            .download(&kernels::sum(&ctx, &ctx.upload(&x).unwrap()).unwrap())
            .unwrap();
        assert_close(
            &format!("sum n={n}"),
            &got,
            &cpu_row_sums(&x, 1, n),
            1e-4,
            0.0,
        );
    }
    for cols in SIZES.into_iter().chain([0, 1300]) {
        let rows = 3;
        let x = values(rows * cols, 5, 0.0, 1.0);
        let got = kernels::sum_rows(&ctx, &ctx.upload(&x).unwrap(), rows, cols).unwrap();
        let got = ctx.download(&got).unwrap();
        assert_close(
            &format!("sum_rows cols={cols}"),
            &got,
            &cpu_row_sums(&x, rows, cols),
            1e-4,
            1e-30,
        );
    }
}

#[test]
fn sums_are_bitwise_reproducible() {
    let Some(ctx) = gpu_or_skip("sums_are_bitwise_reproducible") else {
        return;
    };
    let x = values(70_001, 6, -1.0, 1.0);
    let gx = ctx.upload(&x).unwrap();
    let first = ctx.download(&kernels::sum(&ctx, &gx).unwrap()).unwrap();
    for _ in 0..3 {
        let again = ctx.download(&kernels::sum(&ctx, &gx).unwrap()).unwrap();
        assert_eq!(first[0].to_bits(), again[0].to_bits());
    }
}

#[test]
fn softmax_rows_matches_the_cpu() {
    let Some(ctx) = gpu_or_skip("softmax_rows_matches_the_cpu") else {
        return;
    };
    for cols in SIZES.into_iter().chain([1000]) {
        for rows in [1, 3] {
            let x = values(rows * cols, 7, -8.0, 8.0);
            let mut want = vec![0.0; x.len()];
            riftco_kernels::softmax::softmax_rows(&x, cols, &mut want);
            let got = kernels::softmax_rows(&ctx, &ctx.upload(&x).unwrap(), rows, cols).unwrap();
            let got = ctx.download(&got).unwrap();
            assert_close(&format!("softmax {rows}x{cols}"), &got, &want, 1e-5, 1e-30);
        }
    }
}

/// `Σ_k |op(a)_ik · op(b)_kj|` per output: the scale of a dot product's rounding error.
fn abs_product(spec: MatmulSpec, a: &[f32], b: &[f32]) -> Vec<f32> {
    let abs = |v: &[f32]| v.iter().map(|x| x.abs()).collect::<Vec<_>>();
    let mut c = vec![0.0; spec.m * spec.n];
    riftco_kernels::matmul::matmul(spec.accumulate(false), &abs(a), &abs(b), &mut c);
    c
}

fn check_matmul(ctx: &riftco_gpu::GpuContext, spec: MatmulSpec, seed: u32) {
    let (m, k, n) = (spec.m, spec.k, spec.n);
    let a = values(m * k, seed, -1.0, 1.0);
    let b = values(k * n, seed + 1, -1.0, 1.0);
    let c0 = values(m * n, seed + 2, -1.0, 1.0);
    let mut want = c0.clone();
    riftco_kernels::matmul::matmul(spec, &a, &b, &mut want);
    let gc = ctx.upload(&c0).unwrap();
    let (ga, gb) = (ctx.upload(&a).unwrap(), ctx.upload(&b).unwrap());
    kernels::matmul_into(ctx, 1, spec, &ga, &gb, &gc).unwrap();
    let got = ctx.download(&gc).unwrap();
    let mut scale = abs_product(spec, &a, &b);
    if spec.accumulate {
        scale.iter_mut().zip(&c0).for_each(|(s, c)| *s += c.abs());
    }
    for i in 0..got.len() {
        let tol = 1e-4 * scale[i].max(1e-30);
        assert!(
            (got[i] - want[i]).abs() <= tol,
            "{spec:?}[{i}]: gpu {} cpu {} tol {tol}",
            got[i],
            want[i]
        );
    }
}

#[test]
fn matmul_matches_the_cpu_for_every_transpose_and_edge_size() {
    let Some(ctx) = gpu_or_skip("matmul_matches_the_cpu_for_every_transpose_and_edge_size") else {
        return;
    };
    let shapes = [
        (1, 1, 1),
        (7, 63, 65),
        (65, 7, 1),
        (1, 257, 7),
        (63, 65, 257),
        (16, 16, 16),
    ];
    let mut seed = 10;
    for (m, k, n) in shapes {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            for acc in [false, true] {
                let spec = MatmulSpec::new(m, k, n)
                    .trans_a(ta)
                    .trans_b(tb)
                    .accumulate(acc);
                check_matmul(&ctx, spec, seed);
                seed += 3;
            }
        }
    }
}

#[test]
fn matmul_with_k_zero_writes_zeros_or_keeps_c() {
    let Some(ctx) = gpu_or_skip("matmul_with_k_zero_writes_zeros_or_keeps_c") else {
        return;
    };
    let spec = MatmulSpec::new(3, 0, 5);
    let (ga, gb) = (ctx.upload(&[]).unwrap(), ctx.upload(&[]).unwrap());
    let got = ctx
        .download(&kernels::matmul(&ctx, spec, &ga, &gb).unwrap())
        .unwrap();
    assert_eq!(got, vec![0.0; 15]);
    let c = ctx.upload(&[2.5; 15]).unwrap();
    kernels::matmul_into(&ctx, 1, spec.accumulate(true), &ga, &gb, &c).unwrap();
    assert_eq!(ctx.download(&c).unwrap(), vec![2.5; 15]);
}

#[test]
fn batched_matmul_matches_the_cpu() {
    let Some(ctx) = gpu_or_skip("batched_matmul_matches_the_cpu") else {
        return;
    };
    let batch = 3;
    for (ta, tb) in [(false, false), (true, true)] {
        let spec = MatmulSpec::new(7, 17, 5).trans_a(ta).trans_b(tb);
        let a = values(batch * 7 * 17, 40, -1.0, 1.0);
        let b = values(batch * 17 * 5, 41, -1.0, 1.0);
        let mut want = vec![0.0; batch * 35];
        riftco_kernels::matmul::batched_matmul(batch, spec, &a, &b, &mut want);
        let got = kernels::batched_matmul(
            &ctx,
            batch,
            spec,
            &ctx.upload(&a).unwrap(),
            &ctx.upload(&b).unwrap(),
        );
        let got = ctx.download(&got.unwrap()).unwrap();
        // 1e-4 relative, 1e-4 absolute below |c| = 1 (a 17-term dot product of values in
        // [-1, 1] cancels; the Σ|a·b| bound is checked per output in the unbatched test).
        assert_close(&format!("batched {spec:?}"), &got, &want, 1e-4, 1.0);
    }
}
