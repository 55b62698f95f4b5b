//! RMSNorm forward and VJP on the GPU vs `riftco_kernels::norm` on edge sizes (one row and
//! several; `cols` 1, odd, and past the 256-wide workgroup; rows past the 32-row weight-gradient
//! block), plus the VJP vs central finite differences in f64 on a tiny case, and bad input.
//!
//! Tolerances: `y`, `rstd`: 1e-5 relative (`Σ x²` is a fixed tree of 256 strided partials on
//! the GPU, not the CPU's SIMD order, but all its terms are positive, so the order changes it
//! by a few ulps). `dx`: 1e-4 of `max(|cpu|, 1)`: the reduction order of `Σ x·w·dy` differs
//! (same tree vs the CPU's SIMD lanes) and that sum has terms of both signs, and `dx` is a
//! difference of two terms that can cancel. `dweight`: 1e-4 of `max(|cpu|, 1)`: the same
//! 32-row blocks in the same order as the CPU, but the CPU adds with fused multiply-adds.

mod common;

use common::checks::{assert_grad, assert_shape_error, f64s, finite_differences};
use common::{assert_close, gpu_or_skip, values};
use riftco_gpu::kernels;
use riftco_kernels::norm as cpu;

const EPS: f32 = 1e-5;

#[test]
fn rms_norm_and_its_vjp_match_the_cpu() {
    let Some(ctx) = gpu_or_skip("rms_norm_and_its_vjp_match_the_cpu") else {
        return;
    };
    for (rows, cols) in [(1, 1), (1, 7), (3, 65), (5, 257), (33, 16), (70, 9), (0, 5)] {
        let x = values(rows * cols, 31, -3.0, 3.0);
        let w = values(cols, 32, 0.5, 1.5);
        let dy = values(rows * cols, 33, -1.0, 1.0);
        let (mut y, mut rstd) = (vec![0.0; rows * cols], vec![0.0; rows]);
        cpu::rms_norm(&x, &w, EPS, &mut y, &mut rstd);
        let (gx, gw, gd) = (
            ctx.upload(&x).unwrap(),
            ctx.upload(&w).unwrap(),
            ctx.upload(&dy).unwrap(),
        );
        let (gy, grstd) = kernels::rms_norm(&ctx, &gx, &gw, EPS).unwrap();
        let what = format!("rows={rows} cols={cols}");
        assert_close(
            &format!("y {what}"),
            &ctx.download(&gy).unwrap(),
            &y,
            1e-5,
            1e-6,
        );
        assert_close(
            &format!("rstd {what}"),
            &ctx.download(&grstd).unwrap(),
            &rstd,
            1e-5,
            1e-6,
        );

        let mut dx = vec![0.0; rows * cols];
        let mut dw = vec![0.0; cols];
        cpu::rms_norm_backward(&x, &w, &rstd, &dy, &mut dx, Some(&mut dw));
        let (gdx, gdw) = kernels::rms_norm_backward(&ctx, &gx, &gw, &grstd, &gd).unwrap();
        assert_close(
            &format!("dx {what}"),
            &ctx.download(&gdx).unwrap(),
            &dx,
            1e-4,
            1.0,
        );
        assert_close(
            &format!("dweight {what}"),
            &ctx.download(&gdw).unwrap(),
            &dw,
            1e-4,
            1.0,
        );
    }
}

fn rms_norm64(x: &[f64], w: &[f64], cols: usize) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for (xr, yr) in x.chunks(cols).zip(y.chunks_mut(cols)) {
        let ms = xr.iter().map(|v| v * v).sum::<f64>() / cols as f64;
        let inv = 1.0 / (ms + EPS as f64).sqrt();
        for ((o, v), wc) in yr.iter_mut().zip(xr).zip(w) {
            *o = v * inv * wc;
        }
    }
    y
}

#[test]
fn the_vjp_matches_finite_differences() {
    let Some(ctx) = gpu_or_skip("the_vjp_matches_finite_differences") else {
        return;
    };
    let (rows, cols) = (3, 5);
    let x = values(rows * cols, 41, -2.0, 2.0);
    let w = values(cols, 42, 0.5, 1.5);
    let r = values(rows * cols, 43, -1.0, 1.0);
    let (x64, w64, r64) = (f64s(&x), f64s(&w), f64s(&r));
    // L = Σ y ⊙ r, so the VJP with dy = r is dL/dx and dL/dweight.
    let loss = |x: &[f64], w: &[f64]| -> f64 {
        rms_norm64(x, w, cols)
            .iter()
            .zip(&r64)
            .map(|(a, b)| a * b)
            .sum()
    };
    let fd_x = finite_differences(|x| loss(x, &w64), &x64, 1e-5);
    let fd_w = finite_differences(|w| loss(&x64, w), &w64, 1e-5);
    let (gx, gw, gr) = (
        ctx.upload(&x).unwrap(),
        ctx.upload(&w).unwrap(),
        ctx.upload(&r).unwrap(),
    );
    let (_, rstd) = kernels::rms_norm(&ctx, &gx, &gw, EPS).unwrap();
    let (dx, dw) = kernels::rms_norm_backward(&ctx, &gx, &gw, &rstd, &gr).unwrap();
    assert_grad("dx", &ctx.download(&dx).unwrap(), &fd_x, 1e-4);
    assert_grad("dweight", &ctx.download(&dw).unwrap(), &fd_w, 1e-4);
}

#[test]
fn bad_shapes_are_shape_errors() {
    let Some(ctx) = gpu_or_skip("bad_shapes_are_shape_errors") else {
        return;
    };
    let x = ctx.upload(&[1.0; 10]).unwrap();
    let w4 = ctx.upload(&[1.0; 4]).unwrap();
    let w5 = ctx.upload(&[1.0; 5]).unwrap();
    let empty = ctx.alloc(0).unwrap();
    assert_shape_error(
        "cols 0",
        kernels::rms_norm(&ctx, &x, &empty, EPS),
        &["cols", "0"],
    );
    assert_shape_error(
        "10 % 4",
        kernels::rms_norm(&ctx, &x, &w4, EPS),
        &["10", "8"],
    );
    let rstd3 = ctx.upload(&[1.0; 3]).unwrap();
    assert_shape_error(
        "rstd length",
        kernels::rms_norm_backward(&ctx, &x, &w5, &rstd3, &x),
        &["rstd", "3", "2"],
    );
    let rstd2 = ctx.upload(&[1.0; 2]).unwrap();
    let dy = ctx.upload(&[1.0; 9]).unwrap();
    assert_shape_error(
        "dy length",
        kernels::rms_norm_backward(&ctx, &x, &w5, &rstd2, &dy),
        &["dy", "9", "10"],
    );
}
