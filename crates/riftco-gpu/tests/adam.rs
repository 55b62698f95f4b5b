//! Adam / AdamW updates on the GPU vs `riftco_kernels::adam::adam_update`: several steps (the
//! bias corrections change per step), without weight decay, with L2 (Adam) and decoupled
//! (AdamW) decay, on edge sizes, and bad input.
//!
//! Tolerance: 1e-5 of `max(|cpu|, floor)` on parameters and both moments after 3 steps: the
//! same host-computed constants and the same operations, the multiply-adds fused on the GPU
//! (`fma`) and fused or not on the CPU depending on its SIMD path, and WGSL's `sqrt` and
//! division may differ by an ulp. No reduction. The floor is the size of the terms that can
//! cancel: `m` sums `(1 − β1)·g` of both signs (|g| < 0.5, floor 1e-2), parameters in
//! [−1, 1) can pass near 0 (floor 1e-3); `v` sums positive terms (floor 1e-9, relative).

mod common;

use common::checks::assert_shape_error;
use common::{assert_close, gpu_or_skip, values, SIZES};
use riftco_gpu::kernels;
use riftco_kernels::adam::{adam_update, AdamHyper};

#[test]
fn adam_and_adamw_match_the_cpu() {
    let Some(ctx) = gpu_or_skip("adam_and_adamw_match_the_cpu") else {
        return;
    };
    let hypers = [
        AdamHyper::default(),
        AdamHyper {
            lr: 1e-2,
            weight_decay: 0.1,
            ..AdamHyper::default()
        },
        AdamHyper {
            lr: 3e-3,
            weight_decay: 0.05,
            decoupled: true,
            ..AdamHyper::default()
        },
    ];
    for h in hypers {
        for n in SIZES.into_iter().chain([0, 1000]) {
            let mut p = values(n, 121, -1.0, 1.0);
            let (mut m, mut v) = (vec![0.0; n], vec![0.0; n]);
            let (gp, gm, gv) = (
                ctx.upload(&p).unwrap(),
                ctx.upload(&m).unwrap(),
                ctx.upload(&v).unwrap(),
            );
            for step in 1..=3u64 {
                let g = values(n, 122 + step as u32, -0.5, 0.5);
                adam_update(&mut p, &g, &mut m, &mut v, step, h);
                let gg = ctx.upload(&g).unwrap();
                kernels::adam_update(&ctx, &gp, &gg, &gm, &gv, step, h).unwrap();
            }
            let what = format!("{h:?} n={n}");
            assert_close(
                &format!("param {what}"),
                &ctx.download(&gp).unwrap(),
                &p,
                1e-5,
                1e-3,
            );
            assert_close(
                &format!("m {what}"),
                &ctx.download(&gm).unwrap(),
                &m,
                1e-5,
                1e-2,
            );
            assert_close(
                &format!("v {what}"),
                &ctx.download(&gv).unwrap(),
                &v,
                1e-5,
                1e-9,
            );
        }
    }
}

#[test]
fn bad_input_is_a_shape_error() {
    let Some(ctx) = gpu_or_skip("bad_input_is_a_shape_error") else {
        return;
    };
    let a = ctx.upload(&[0.0; 4]).unwrap();
    let b = ctx.upload(&[0.0; 4]).unwrap();
    let c = ctx.upload(&[0.0; 4]).unwrap();
    let short = ctx.upload(&[0.0; 3]).unwrap();
    let h = AdamHyper::default();
    assert_shape_error(
        "step 0",
        kernels::adam_update(&ctx, &a, &b, &c, &short, 0, h),
        &["step = 0"],
    );
    assert_shape_error(
        "grad",
        kernels::adam_update(&ctx, &a, &short, &b, &c, 1, h),
        &["grad", "3", "4"],
    );
    assert_shape_error(
        "v",
        kernels::adam_update(&ctx, &a, &b, &c, &short, 1, h),
        &["v", "3", "4"],
    );
    assert_shape_error(
        "aliased",
        kernels::adam_update(&ctx, &a, &b, &c, &a, 1, h),
        &["distinct"],
    );
}
