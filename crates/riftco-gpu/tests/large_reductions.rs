//! Reductions over many elements vs the CPU kernel: sizes around the old per-invocation loop
//! of `reduce_axes` (one invocation summed all reduced elements, and llvmpipe cuts an
//! invocation's loops after 65535 back edges, so sums of ones stopped at 21845 / 16383) and the
//! 65535-workgroup limit of one grid dimension. Sums: 1e-4 relative (block tree order vs the
//! CPU's f64), inputs in [0, 1); max: exact.

mod common;

use common::{assert_close, gpu_or_skip, values};
use riftco_gpu::kernels;
use riftco_kernels::reduce::{reduce, ReduceOp};

/// `x` of `dims` reduced to `out_dims` on the GPU and on the CPU.
fn both(
    ctx: &riftco_gpu::GpuContext,
    kind: ReduceOp,
    x: &[f32],
    dims: &[usize],
    out_dims: &[usize],
) -> (Vec<f32>, Vec<f32>) {
    let n: usize = out_dims.iter().product();
    let mut want = vec![0.0; n];
    reduce(kind, x, dims, out_dims, &mut want);
    let gx = ctx.upload(x).unwrap();
    let got = kernels::reduce_axes(ctx, kind, &gx, dims, out_dims).unwrap();
    (ctx.download(&got).unwrap(), want)
}

#[test]
fn full_sums_of_long_vectors_match_the_cpu() {
    let Some(ctx) = gpu_or_skip("full_sums_of_long_vectors_match_the_cpu") else {
        return;
    };
    for n in [21_845, 21_846, 65_536, (1 << 20) + 3] {
        let ones = vec![1.0; n];
        let (got, want) = both(&ctx, ReduceOp::Sum, &ones, &[n], &[1]);
        assert_eq!(got, want, "sum of {n} ones");
        let x = values(n, 7, 0.0, 1.0);
        let (got, want) = both(&ctx, ReduceOp::Sum, &x, &[n], &[1]);
        assert_close(&format!("sum n={n}"), &got, &want, 1e-4, 1.0);
        let (got, want) = both(&ctx, ReduceOp::Max, &x, &[n], &[1]);
        assert_eq!(got, want, "max n={n}");
        let g = ctx.download(&kernels::sum(&ctx, &ctx.upload(&ones).unwrap()).unwrap());
        assert_eq!(g.unwrap(), vec![n as f32], "kernels::sum of {n} ones");
    }
}

#[test]
fn axis_sums_of_wide_and_tall_matrices_match_the_cpu() {
    let Some(ctx) = gpu_or_skip("axis_sums_of_wide_and_tall_matrices_match_the_cpu") else {
        return;
    };
    let cases: [(&[usize], &[usize]); 6] = [
        (&[200, 200], &[1, 1]),
        (&[2, 16_385], &[2, 1]),
        (&[16_385, 2], &[1, 2]),
        (&[20_000, 4], &[1, 4]),
        (&[16_385, 2], &[16_385, 1]),
        (&[3, 70_000, 2], &[3, 1, 2]),
    ];
    for (dims, out_dims) in cases {
        let n: usize = dims.iter().product();
        let ones = vec![1.0; n];
        let (got, want) = both(&ctx, ReduceOp::Sum, &ones, dims, out_dims);
        assert_eq!(got, want, "ones {dims:?} → {out_dims:?}");
        let x = values(n, 3, 0.0, 1.0);
        let (got, want) = both(&ctx, ReduceOp::Sum, &x, dims, out_dims);
        assert_close(
            &format!("sum {dims:?} → {out_dims:?}"),
            &got,
            &want,
            1e-4,
            1.0,
        );
        let (got, want) = both(&ctx, ReduceOp::Max, &x, dims, out_dims);
        assert_eq!(got, want, "max {dims:?} → {out_dims:?}");
    }
}

#[test]
fn row_sums_beyond_65535_rows_match_the_cpu() {
    let Some(ctx) = gpu_or_skip("row_sums_beyond_65535_rows_match_the_cpu") else {
        return;
    };
    let (rows, cols) = (70_001, 3);
    let x = values(rows * cols, 5, 0.0, 1.0);
    let (got, want) = both(&ctx, ReduceOp::Sum, &x, &[rows, cols], &[rows, 1]);
    assert_close("sum_rows 70001 rows", &got, &want, 1e-4, 1.0);
    let g = kernels::sum_rows(&ctx, &ctx.upload(&x).unwrap(), rows, cols).unwrap();
    assert_close(
        "kernels::sum_rows",
        &ctx.download(&g).unwrap(),
        &want,
        1e-4,
        1.0,
    );
}

#[test]
fn max_propagates_nan_and_is_minus_infinity_over_nothing() {
    let Some(ctx) = gpu_or_skip("max_propagates_nan_and_is_minus_infinity_over_nothing") else {
        return;
    };
    let mut x = values(30_000, 9, -1.0, 1.0);
    x[29_000] = f32::NAN;
    let (got, _) = both(&ctx, ReduceOp::Max, &x, &[30_000], &[1]);
    assert!(got[0].is_nan(), "max with a NaN: {got:?}");
    let (got, _) = both(&ctx, ReduceOp::Max, &[], &[2, 0], &[2, 1]);
    assert_eq!(got, vec![f32::NEG_INFINITY; 2]);
    let (got, _) = both(&ctx, ReduceOp::Sum, &[], &[2, 0], &[2, 1]);
    assert_eq!(got, vec![0.0; 2]);
}
