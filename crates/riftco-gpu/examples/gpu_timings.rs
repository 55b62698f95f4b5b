//! Wall-clock timings of the GPU kernels on whatever adapter `"gpu"` opens (in CI: Mesa's
//! software Vulkan, llvmpipe), each beside the CPU kernel computing the same result, timed in
//! the same run in alternating rounds, with the ratio GPU / CPU. NOT a performance claim on
//! llvmpipe: it runs the shaders on the CPU, and each GPU timing includes recording, submission
//! and the wait of one read-back. On a real GPU (Metal on a Mac, a Vulkan driver) the same
//! command gives the first honest figures.
//!
//! `cargo run -p riftco-gpu --example gpu_timings --release`

use std::time::Instant;

use riftco_gpu::{kernels, GpuBuffer, GpuContext, GpuKind, Result};
use riftco_kernels::map::UnaryOp;
use riftco_kernels::matmul::MatmulSpec;
use riftco_kernels::reduce::ReduceOp;

/// Calls per timing.
const REPS: usize = 10;
/// Alternating GPU/CPU rounds per kernel; the median round is printed.
const ROUNDS: usize = 5;

/// Seconds per call of `REPS` GPU calls ending in one read-back.
fn gpu_seconds(ctx: &GpuContext, f: &dyn Fn() -> Result<GpuBuffer>) -> Result<f64> {
    let t = Instant::now();
    let mut last = None;
    for _ in 0..REPS {
        last = Some(f()?);
    }
    if let Some(b) = &last {
        ctx.download(b)?;
    }
    Ok(t.elapsed().as_secs_f64() / REPS as f64)
}

/// Seconds per call of `REPS` CPU calls.
fn cpu_seconds(f: &mut dyn FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..REPS {
        f();
    }
    t.elapsed().as_secs_f64() / REPS as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times `gpu` and `cpu` in `ROUNDS` alternating rounds (after one warm-up call each: pipeline
/// compilation, pool) and prints the medians and their ratio.
fn compare(
    ctx: &GpuContext,
    label: &str,
    gpu: impl Fn() -> Result<GpuBuffer>,
    mut cpu: impl FnMut(),
) -> Result<()> {
    ctx.download(&gpu()?)?;
    cpu();
    let (mut g, mut c) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        if round % 2 == 0 {
            g.push(gpu_seconds(ctx, &gpu)?);
            c.push(cpu_seconds(&mut cpu));
        } else {
            c.push(cpu_seconds(&mut cpu));
            g.push(gpu_seconds(ctx, &gpu)?);
        }
    }
    let (g, c) = (median(g), median(c));
    println!(
        "{label:<32} {:>10.3} ms {:>10.3} ms {:>9.1}x",
        g * 1e3,
        c * 1e3,
        g / c
    );
    Ok(())
}

fn main() -> Result<()> {
    let ctx = GpuContext::open(GpuKind::Any)?;
    println!("adapter: {}", ctx.adapter());
    println!(
        "NOT a performance claim on a software adapter (llvmpipe runs the shaders on the CPU)."
    );
    println!(
        "{:<32} {:>13} {:>13} {:>10}",
        "kernel (median of 5 rounds)", "GPU", "CPU", "GPU/CPU"
    );
    let n = 1 << 20;
    let (xh, yh) = (vec![0.5f32; n], vec![0.25f32; n]);
    let x = ctx.upload(&xh)?;
    let y = ctx.upload(&yh)?;
    let mut out = vec![0.0f32; n];
    compare(
        &ctx,
        "add [1M]",
        || kernels::add(&ctx, &x, &y),
        || riftco_kernels::elementwise::add(&xh, &yh, &mut out),
    )?;
    compare(
        &ctx,
        "unary gelu [1M]",
        || kernels::unary(&ctx, UnaryOp::Gelu, &x),
        || riftco_kernels::map::unary(UnaryOp::Gelu, &xh, &mut out),
    )?;
    let mut total = [0.0f32];
    compare(
        &ctx,
        "sum [1M]",
        || kernels::sum(&ctx, &x),
        || riftco_kernels::reduce::reduce(ReduceOp::Sum, &xh, &[n], &[1], &mut total),
    )?;
    compare(
        &ctx,
        "softmax_rows [1024 x 1024]",
        || kernels::softmax_rows(&ctx, &x, 1024, 1024),
        || riftco_kernels::softmax::softmax_rows(&xh, 1024, &mut out),
    )?;
    let ah = vec![0.01f32; 256 * 256];
    let a = ctx.upload(&ah)?;
    let mut c = vec![0.0f32; 256 * 256];
    for (label, spec) in [
        ("matmul 256 x 256 x 256", MatmulSpec::new(256, 256, 256)),
        (
            "matmul 256^3 trans_a trans_b",
            MatmulSpec::new(256, 256, 256).trans_a(true).trans_b(true),
        ),
    ] {
        compare(
            &ctx,
            label,
            || kernels::matmul(&ctx, spec, &a, &a),
            || riftco_kernels::matmul::matmul(spec, &ah, &ah, &mut c),
        )?;
    }
    let t = Instant::now();
    let h = ctx.download(&x)?;
    println!(
        "{:<32} {:>10.3} ms ({} values)",
        "download [1M]",
        t.elapsed().as_secs_f64() * 1e3,
        h.len()
    );
    println!("memory: {:?}", ctx.memory());
    println!("batch: {:?}", ctx.batch_stats());
    Ok(())
}
