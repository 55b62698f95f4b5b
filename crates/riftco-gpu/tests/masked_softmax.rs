//! Causal softmax (forward, VJP) and the plain softmax VJP on the GPU vs the CPU kernels
//! (`riftco_kernels::attention::causal_softmax_rows`, `riftco_kernels::softmax::
//! softmax_rows_backward`; the CPU has no causal VJP, so the reference is its softmax VJP times
//! `scale`) on edge shapes (1 key, `seq_q` < / = / > `seq_k`, rows with no allowed key, more
//! keys than the 256-wide workgroup, several heads and batches), the VJP vs central finite
//! differences in f64, and bad input.
//!
//! Tolerances: forward 1e-5 relative (the row sum is a tree of 256 strided partials, not the
//! CPU order; masked entries must be exactly 0). VJPs 1e-4 of `max(|cpu|, 1e-3)`: the reduction
//! order of `Σ dy·y` differs (same tree vs the CPU's SIMD lanes), it has terms of both signs,
//! and `dy − Σ dy·y` cancels.

mod common;

use common::checks::{assert_grad, assert_shape_error, f64s, finite_differences};
use common::{assert_close, gpu_or_skip, values};
use riftco_gpu::kernels;
use riftco_kernels::attention::{causal_softmax_rows as cpu_causal, AttentionDims};
use riftco_kernels::softmax::softmax_rows_backward as cpu_backward;

fn dims(batch: usize, n_heads: usize, seq_q: usize, seq_k: usize) -> AttentionDims {
    AttentionDims {
        batch,
        n_heads,
        n_kv_heads: n_heads,
        seq_q,
        seq_k,
        d_head: 4,
    }
}

#[test]
fn causal_softmax_and_its_vjp_match_the_cpu() {
    let Some(ctx) = gpu_or_skip("causal_softmax_and_its_vjp_match_the_cpu") else {
        return;
    };
    for (b, h, sq, sk) in [
        (1, 1, 1, 1),
        (1, 1, 7, 7),
        (2, 3, 5, 9),
        (1, 2, 9, 4),
        (1, 1, 3, 300),
        (2, 1, 17, 65),
    ] {
        let dm = dims(b, h, sq, sk);
        let n = b * h * sq * sk;
        let scores = values(n, 71, -4.0, 4.0);
        let dprobs = values(n, 72, -1.0, 1.0);
        let (gs, gd) = (ctx.upload(&scores).unwrap(), ctx.upload(&dprobs).unwrap());
        for causal in [false, true] {
            let scale = 0.37;
            let what = format!("b={b} h={h} sq={sq} sk={sk} causal={causal}");
            let mut probs = vec![0.0; n];
            cpu_causal(&scores, dm, scale, causal, &mut probs);
            let gp = kernels::causal_softmax_rows(&ctx, &gs, dm, scale, causal).unwrap();
            let got = ctx.download(&gp).unwrap();
            assert_close(&format!("probs {what}"), &got, &probs, 1e-5, 1e-30);
            for (i, (&g, &c)) in got.iter().zip(&probs).enumerate() {
                assert!(
                    c != 0.0 || g == 0.0,
                    "{what}: masked entry {i} is {g}, expected 0"
                );
            }

            let mut want = vec![0.0; n];
            cpu_backward(&probs, &dprobs, sk, &mut want);
            want.iter_mut().for_each(|v| *v *= scale);
            let gds = kernels::causal_softmax_rows_backward(&ctx, &gp, &gd, dm, scale).unwrap();
            assert_close(
                &format!("dscores {what}"),
                &ctx.download(&gds).unwrap(),
                &want,
                1e-4,
                1e-3,
            );
        }
        // The plain softmax VJP on the same rows.
        let mut probs = vec![0.0; n];
        riftco_kernels::softmax::softmax_rows(&scores, sk, &mut probs);
        let mut want = vec![0.0; n];
        cpu_backward(&probs, &dprobs, sk, &mut want);
        let gp = ctx.upload(&probs).unwrap();
        let got = kernels::softmax_rows_backward(&ctx, &gp, &gd, sk).unwrap();
        assert_close(
            &format!("softmax_rows_backward sk={sk}"),
            &ctx.download(&got).unwrap(),
            &want,
            1e-4,
            1e-3,
        );
    }
}

/// The causal softmax of `scale · x` in f64 (same mask as the CPU kernel).
fn causal_softmax64(x: &[f64], sq: usize, sk: usize, scale: f64) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for (r, (xr, yr)) in x.chunks(sk).zip(y.chunks_mut(sk)).enumerate() {
        let i = r % sq;
        let n = (i + 1 + sk).saturating_sub(sq).min(sk);
        if n == 0 {
            continue;
        }
        let m = xr[..n]
            .iter()
            .map(|v| v * scale)
            .fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = xr[..n].iter().map(|v| (v * scale - m).exp()).sum();
        for c in 0..n {
            yr[c] = (xr[c] * scale - m).exp() / s;
        }
    }
    y
}

#[test]
fn the_vjp_matches_finite_differences() {
    let Some(ctx) = gpu_or_skip("the_vjp_matches_finite_differences") else {
        return;
    };
    let (sq, sk, scale) = (3, 5, 0.7);
    let dm = dims(1, 2, sq, sk);
    let n = 2 * sq * sk;
    let x = values(n, 81, -2.0, 2.0);
    let r = values(n, 82, -1.0, 1.0);
    let r64 = f64s(&r);
    // L = Σ probs ⊙ r, so the VJP with dprobs = r is dL/dscores.
    let fd = finite_differences(
        |x| {
            causal_softmax64(x, sq, sk, scale)
                .iter()
                .zip(&r64)
                .map(|(a, b)| a * b)
                .sum()
        },
        &f64s(&x),
        1e-5,
    );
    let gp = kernels::causal_softmax_rows(&ctx, &ctx.upload(&x).unwrap(), dm, scale as f32, true)
        .unwrap();
    let gds = kernels::causal_softmax_rows_backward(
        &ctx,
        &gp,
        &ctx.upload(&r).unwrap(),
        dm,
        scale as f32,
    )
    .unwrap();
    assert_grad("dscores", &ctx.download(&gds).unwrap(), &fd, 1e-5);
}

#[test]
fn bad_shapes_are_shape_errors() {
    let Some(ctx) = gpu_or_skip("bad_shapes_are_shape_errors") else {
        return;
    };
    let x = ctx.upload(&[0.5; 12]).unwrap();
    let x11 = ctx.upload(&[0.5; 11]).unwrap();
    assert_shape_error(
        "scores length",
        kernels::causal_softmax_rows(&ctx, &x, dims(1, 2, 2, 4), 1.0, true),
        &["12", "16"],
    );
    assert_shape_error(
        "overflowing dims",
        kernels::causal_softmax_rows(&ctx, &x, dims(usize::MAX, 2, 2, 4), 1.0, true),
        &["overflows", "2"],
    );
    assert_shape_error(
        "dprobs length",
        kernels::causal_softmax_rows_backward(&ctx, &x, &x11, dims(1, 1, 3, 4), 1.0),
        &["dprobs", "11", "12"],
    );
    assert_shape_error(
        "cols 0",
        kernels::softmax_rows_backward(&ctx, &x, &x, 0),
        &["cols", "0"],
    );
    assert_shape_error(
        "not a multiple",
        kernels::softmax_rows_backward(&ctx, &x11, &x11, 4),
        &["11", "8"],
    );
}
