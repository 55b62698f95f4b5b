//! SiLU / SwiGLU and their VJPs on the GPU vs `riftco_kernels::elementwise` on edge sizes (1,
//! odd, non-multiples of the 256-wide workgroup), plus the VJPs vs central finite differences
//! in f64 on a tiny case, and bad input.
//!
//! Tolerance: 1e-5 relative to `max(|cpu|, 1)` (1e-5 absolute below 1): both sides compute
//! `σ(x) = 1/(1 + exp(−x))` with different `exp` approximations (WGSL's built-in vs the CPU's
//! vector exp), and `SiLU'(x) = σ(1 + x(1 − σ))` crosses 0 near x ≈ −1.28, where only an
//! absolute bound is meaningful. No reduction is involved.

mod common;

use common::checks::{assert_grad, assert_shape_error, f64s, finite_differences};
use common::{assert_close, gpu_or_skip, values, SIZES};
use riftco_gpu::kernels;
use riftco_kernels::elementwise as cpu;

fn silu64(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

#[test]
fn silu_and_swiglu_match_the_cpu() {
    let Some(ctx) = gpu_or_skip("silu_and_swiglu_match_the_cpu") else {
        return;
    };
    for n in SIZES.into_iter().chain([0, 1000]) {
        let x = values(n, 11, -12.0, 12.0);
        let up = values(n, 12, -3.0, 3.0);
        let dy = values(n, 13, -2.0, 2.0);
        let (gx, gu, gd) = (
            ctx.upload(&x).unwrap(),
            ctx.upload(&up).unwrap(),
            ctx.upload(&dy).unwrap(),
        );
        let mut want = vec![0.0; n];
        cpu::silu(&x, &mut want);
        let got = ctx.download(&kernels::silu(&ctx, &gx).unwrap()).unwrap();
        assert_close(&format!("silu n={n}"), &got, &want, 1e-5, 1.0);

        cpu::silu_backward(&x, &dy, &mut want);
        let got = ctx
            .download(&kernels::silu_backward(&ctx, &gx, &gd).unwrap())
            .unwrap();
        assert_close(&format!("silu_backward n={n}"), &got, &want, 1e-5, 1.0);

        cpu::swiglu(&x, &up, &mut want);
        let got = ctx
            .download(&kernels::swiglu(&ctx, &gx, &gu).unwrap())
            .unwrap();
        assert_close(&format!("swiglu n={n}"), &got, &want, 1e-5, 1.0);

        let (mut dgate, mut dup) = (vec![0.0; n], vec![0.0; n]);
        cpu::swiglu_backward(&x, &up, &dy, &mut dgate, &mut dup);
        let (gg, gup) = kernels::swiglu_backward(&ctx, &gx, &gu, &gd).unwrap();
        let (gg, gup) = (ctx.download(&gg).unwrap(), ctx.download(&gup).unwrap());
        assert_close(&format!("swiglu dgate n={n}"), &gg, &dgate, 1e-5, 1.0);
        assert_close(&format!("swiglu dup n={n}"), &gup, &dup, 1e-5, 1.0);

        // In place over dy: bitwise the out-of-place kernel's values.
        let dy_dgate = ctx.upload(&dy).unwrap();
        let gup2 = kernels::swiglu_backward_in_place(&ctx, &gx, &gu, &dy_dgate).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let in_place = ctx.download(&dy_dgate).unwrap();
        assert_eq!(bits(&in_place), bits(&gg), "in-place dgate n={n}");
        assert_eq!(
            bits(&ctx.download(&gup2).unwrap()),
            bits(&gup),
            "in-place dup n={n}"
        );
    }
}

#[test]
fn the_vjps_match_finite_differences() {
    let Some(ctx) = gpu_or_skip("the_vjps_match_finite_differences") else {
        return;
    };
    let n = 7;
    let x = values(n, 21, -4.0, 4.0);
    let up = values(n, 22, -2.0, 2.0);
    let w = values(n, 23, -1.0, 1.0);
    let (gx, gu, gw) = (
        ctx.upload(&x).unwrap(),
        ctx.upload(&up).unwrap(),
        ctx.upload(&w).unwrap(),
    );
    let (x64, up64, w64) = (f64s(&x), f64s(&up), f64s(&w));
    // L = Σ SiLU(x) ⊙ w, so dL/dx is the VJP with dy = w.
    let fd = finite_differences(
        |x| x.iter().zip(&w64).map(|(a, b)| silu64(*a) * b).sum(),
        &x64,
        1e-5,
    );
    let got = ctx
        .download(&kernels::silu_backward(&ctx, &gx, &gw).unwrap())
        .unwrap();
    assert_grad("silu dx", &got, &fd, 1e-4);

    // L = Σ SiLU(gate) ⊙ up ⊙ w.
    let loss = |g: &[f64], u: &[f64]| -> f64 { (0..n).map(|i| silu64(g[i]) * u[i] * w64[i]).sum() };
    let fd_gate = finite_differences(|g| loss(g, &up64), &x64, 1e-5);
    let fd_up = finite_differences(|u| loss(&x64, u), &up64, 1e-5);
    let (dg, du) = kernels::swiglu_backward(&ctx, &gx, &gu, &gw).unwrap();
    assert_grad("swiglu dgate", &ctx.download(&dg).unwrap(), &fd_gate, 1e-4);
    assert_grad("swiglu dup", &ctx.download(&du).unwrap(), &fd_up, 1e-4);
}

#[test]
fn mismatched_lengths_are_shape_errors() {
    let Some(ctx) = gpu_or_skip("mismatched_lengths_are_shape_errors") else {
        return;
    };
    let a = ctx.upload(&[1.0; 7]).unwrap();
    let b = ctx.upload(&[1.0; 6]).unwrap();
    assert_shape_error(
        "silu_backward",
        kernels::silu_backward(&ctx, &a, &b),
        &["6", "7"],
    );
    assert_shape_error("swiglu", kernels::swiglu(&ctx, &a, &b), &["6", "7"]);
    assert_shape_error(
        "swiglu_backward up",
        kernels::swiglu_backward(&ctx, &a, &b, &a),
        &["up", "6", "7"],
    );
    assert_shape_error(
        "swiglu_backward dy",
        kernels::swiglu_backward(&ctx, &a, &a, &b),
        &["dy", "6", "7"],
    );
    assert_shape_error(
        "swiglu_backward_in_place dy",
        kernels::swiglu_backward_in_place(&ctx, &a, &a, &b),
        &["dy", "6", "7"],
    );
}
