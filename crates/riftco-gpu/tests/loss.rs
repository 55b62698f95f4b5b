//! Softmax cross-entropy (mean loss, per-row logsumexp) and its VJP on the GPU vs
//! `riftco_kernels::loss` on edge sizes (vocab 1, odd, past the 256-wide workgroup; one row and
//! several), the VJP (its upstream scalar from the host or on the device) vs central finite
//! differences in f64, and bad input.
//!
//! Tolerances: `lse` 1e-5 relative (the row sum is a tree of 256 strided partials, not the CPU
//! order; its terms are positive). Mean loss 1e-5 relative: the GPU sums the row losses in a
//! block tree in f32, the CPU in f64 (1e-4 for 70 000 rows, past what one invocation may loop
//! over on llvmpipe).
//! `dlogits` 1e-5 of `max(|cpu|, scale)`: `exp(z − lse)` differs by the exp approximations and
//! by `lse`, and the target entry `p − 1` crosses 0.

mod common;

use common::checks::{assert_grad, assert_shape_error, f64s, finite_differences};
use common::{assert_close, gpu_or_skip, values};
use riftco_gpu::kernels;
use riftco_kernels::loss as cpu;

fn targets(rows: usize, vocab: usize, seed: u32) -> Vec<u32> {
    values(rows, seed, 0.0, vocab as f32)
        .into_iter()
        .map(|v| (v as u32).min(vocab as u32 - 1))
        .collect()
}

#[test]
fn the_mean_loss_over_many_rows_matches_the_cpu() {
    let Some(ctx) = gpu_or_skip("the_mean_loss_over_many_rows_matches_the_cpu") else {
        return;
    };
    let (rows, vocab) = (70_000, 3);
    let logits = values(rows * vocab, 11, -5.0, 5.0);
    let t = targets(rows, vocab, 12);
    let mut lse = vec![0.0; rows];
    let loss = cpu::cross_entropy(&logits, &t, vocab, &mut lse);
    let gl = ctx.upload(&logits).unwrap();
    let (gloss, _) = kernels::cross_entropy(&ctx, &gl, &t, vocab).unwrap();
    assert_close(
        "loss 70000 rows",
        &ctx.download(&gloss).unwrap(),
        &[loss],
        1e-4,
        1e-6,
    );
}

#[test]
fn cross_entropy_and_its_vjp_match_the_cpu() {
    let Some(ctx) = gpu_or_skip("cross_entropy_and_its_vjp_match_the_cpu") else {
        return;
    };
    for (rows, vocab) in [(1, 1), (1, 7), (3, 65), (5, 257), (9, 300), (40, 3)] {
        let logits = values(rows * vocab, 101, -5.0, 5.0);
        let t = targets(rows, vocab, 102);
        let mut lse = vec![0.0; rows];
        let loss = cpu::cross_entropy(&logits, &t, vocab, &mut lse);
        let gl = ctx.upload(&logits).unwrap();
        let (gloss, glse) = kernels::cross_entropy(&ctx, &gl, &t, vocab).unwrap();
        let what = format!("rows={rows} vocab={vocab}");
        assert_close(
            &format!("loss {what}"),
            &ctx.download(&gloss).unwrap(),
            &[loss],
            1e-5,
            1e-6,
        );
        assert_close(
            &format!("lse {what}"),
            &ctx.download(&glse).unwrap(),
            &lse,
            1e-5,
            1e-6,
        );

        let grad = 1.7;
        let mut want = vec![0.0; rows * vocab];
        cpu::cross_entropy_backward(&logits, &t, &lse, grad, &mut want);
        let got = kernels::cross_entropy_backward(&ctx, &gl, &t, &glse, vocab, grad).unwrap();
        let scale = grad / rows as f32;
        assert_close(
            &format!("dlogits {what}"),
            &ctx.download(&got).unwrap(),
            &want,
            1e-5,
            scale,
        );
        // The upstream scalar read on the device (the backend's path): the same tolerance.
        let by = kernels::cross_entropy_backward_by(
            &ctx,
            &gl,
            &t,
            &glse,
            vocab,
            &ctx.upload(&[grad]).unwrap(),
        )
        .unwrap();
        assert_close(
            &format!("dlogits (device grad) {what}"),
            &ctx.download(&by).unwrap(),
            &want,
            1e-5,
            scale,
        );
    }
}

#[test]
fn zero_rows_give_a_zero_loss() {
    let Some(ctx) = gpu_or_skip("zero_rows_give_a_zero_loss") else {
        return;
    };
    let (loss, lse) = kernels::cross_entropy(&ctx, &ctx.alloc(0).unwrap(), &[], 5).unwrap();
    assert_eq!(ctx.download(&loss).unwrap(), vec![0.0]);
    assert!(lse.is_empty());
}

#[test]
fn the_vjp_matches_finite_differences() {
    let Some(ctx) = gpu_or_skip("the_vjp_matches_finite_differences") else {
        return;
    };
    let (rows, vocab) = (3, 4);
    let logits = values(rows * vocab, 111, -2.0, 2.0);
    let t = targets(rows, vocab, 112);
    let mean_loss = |z: &[f64]| -> f64 {
        z.chunks(vocab)
            .zip(&t)
            .map(|(zr, &ti)| {
                let m = zr.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                m + zr.iter().map(|v| (v - m).exp()).sum::<f64>().ln() - zr[ti as usize]
            })
            .sum::<f64>()
            / rows as f64
    };
    let grad = 0.8;
    let fd: Vec<f64> = finite_differences(mean_loss, &f64s(&logits), 1e-5)
        .into_iter()
        .map(|g| g * grad as f64)
        .collect();
    let gl = ctx.upload(&logits).unwrap();
    let (_, lse) = kernels::cross_entropy(&ctx, &gl, &t, vocab).unwrap();
    let got = kernels::cross_entropy_backward(&ctx, &gl, &t, &lse, vocab, grad).unwrap();
    assert_grad("dlogits", &ctx.download(&got).unwrap(), &fd, 1e-5);
}

#[test]
fn bad_input_is_a_shape_error() {
    let Some(ctx) = gpu_or_skip("bad_input_is_a_shape_error") else {
        return;
    };
    let z = ctx.upload(&[0.0; 12]).unwrap();
    assert_shape_error(
        "vocab 0",
        kernels::cross_entropy(&ctx, &z, &[0], 0),
        &["vocab = 0"],
    );
    assert_shape_error(
        "logits length",
        kernels::cross_entropy(&ctx, &z, &[0, 1], 5),
        &["12", "10"],
    );
    assert_shape_error(
        "target out of range",
        kernels::cross_entropy(&ctx, &z, &[0, 4, 1], 4),
        &["targets[1] = 4", "< 4"],
    );
    let lse = ctx.upload(&[0.0; 2]).unwrap();
    assert_shape_error(
        "lse length",
        kernels::cross_entropy_backward(&ctx, &z, &[0, 1, 2], &lse, 4, 1.0),
        &["lse", "2", "3"],
    );
    assert_shape_error(
        "no rows",
        kernels::cross_entropy_backward(&ctx, &ctx.alloc(0).unwrap(), &[], &lse, 4, 1.0),
        &["rows", "0"],
    );
    let lse = ctx.upload(&[0.0; 3]).unwrap();
    assert_shape_error(
        "device grad length",
        kernels::cross_entropy_backward_by(&ctx, &z, &[0, 1, 2], &lse, 4, &lse),
        &["grad", "3", "1"],
    );
}
