//! Command batching: kernels are recorded, not submitted; one download submits once and waits
//! once. Also the pipeline cache (one compile per kernel per context).

mod common;

use common::gpu_or_skip;
use riftco_gpu::{kernels, FLUSH_EVERY};

#[test]
fn a_hundred_chained_kernels_then_one_read_submit_once() {
    let Some(ctx) = gpu_or_skip("a_hundred_chained_kernels_then_one_read_submit_once") else {
        return;
    };
    let x: Vec<f32> = (0..257).map(|i| i as f32 * 0.5 - 40.0).collect();
    let gx = ctx.upload(&x).unwrap();
    let before = ctx.batch_stats();
    let mut y = kernels::scale(&ctx, &gx, 1.0).unwrap();
    let mut want = x.clone();
    for i in 0..99 {
        y = if i % 2 == 0 {
            kernels::add(&ctx, &y, &gx).unwrap()
        } else {
            kernels::scale(&ctx, &y, 0.75).unwrap()
        };
        for (w, xv) in want.iter_mut().zip(&x) {
            *w = if i % 2 == 0 { *w + xv } else { 0.75 * *w };
        }
    }
    let mid = ctx.batch_stats();
    assert_eq!(mid.dispatches - before.dispatches, 100);
    assert_eq!(mid.submits, before.submits, "a kernel submitted on its own");
    assert_eq!(mid.waits, before.waits, "a kernel waited for the GPU");
    let got = ctx.download(&y).unwrap();
    let after = ctx.batch_stats();
    assert_eq!(after.submits - mid.submits, 1);
    assert_eq!(after.waits - mid.waits, 1);
    // Each step is one IEEE operation on both sides: bitwise equal.
    assert_eq!(got, want);
}

#[test]
fn each_pipeline_is_compiled_once_per_context() {
    let Some(ctx) = gpu_or_skip("each_pipeline_is_compiled_once_per_context") else {
        return;
    };
    assert_eq!(ctx.pipelines_compiled(), 0);
    let x = ctx.upload(&[1.0, 2.0, 3.0]).unwrap();
    let mut y = kernels::scale(&ctx, &x, 2.0).unwrap();
    for i in 0..20 {
        // Halve and double in turn: y stays 2x.
        let factor = if i % 2 == 0 { 0.5 } else { 2.0 };
        y = kernels::scale(&ctx, &y, factor).unwrap();
    }
    assert_eq!(ctx.pipelines_compiled(), 1);
    let z = kernels::add(&ctx, &y, &x).unwrap();
    assert_eq!(ctx.pipelines_compiled(), 2);
    assert_eq!(ctx.download(&z).unwrap(), vec![3.0, 6.0, 9.0]);
}

#[test]
fn uploads_are_ordered_with_the_kernels_around_them() {
    let Some(ctx) = gpu_or_skip("uploads_are_ordered_with_the_kernels_around_them") else {
        return;
    };
    // Read x, then overwrite x, then read it again, all in one pending batch.
    let x = ctx.upload(&[1.0, 2.0]).unwrap();
    let first = kernels::scale(&ctx, &x, 10.0).unwrap();
    ctx.write(&x, &[5.0, 6.0]).unwrap();
    let second = kernels::scale(&ctx, &x, 10.0).unwrap();
    assert_eq!(ctx.batch_stats().submits, 0);
    assert_eq!(ctx.download(&first).unwrap(), vec![10.0, 20.0]);
    assert_eq!(ctx.download(&second).unwrap(), vec![50.0, 60.0]);
}

#[test]
fn a_long_batch_is_submitted_in_chunks_without_waiting() {
    let Some(ctx) = gpu_or_skip("a_long_batch_is_submitted_in_chunks_without_waiting") else {
        return;
    };
    let x = ctx.upload(&[3.0]).unwrap();
    let mut y = kernels::scale(&ctx, &x, 1.0).unwrap();
    let total = 2 * FLUSH_EVERY + 52;
    for i in 1..total {
        // Doubling then halving: exact in f32, y stays 3.
        y = kernels::scale(&ctx, &y, if i % 2 == 0 { 0.5 } else { 2.0 }).unwrap();
    }
    let s = ctx.batch_stats();
    assert_eq!(s.dispatches, total);
    assert_eq!(s.submits, 2, "one submit per {FLUSH_EVERY} dispatches");
    assert_eq!(s.waits, 0);
    let want = if (total - 1) % 2 == 1 { 6.0 } else { 3.0 };
    assert_eq!(ctx.download(&y).unwrap(), vec![want]);
    assert_eq!((ctx.batch_stats().submits, ctx.batch_stats().waits), (3, 1));
}
