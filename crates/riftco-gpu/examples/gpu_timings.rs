//! Wall-clock timings of the GPU kernels on whatever adapter `"gpu"` opens (in CI: Mesa's
//! software Vulkan, llvmpipe). NOT a performance claim: llvmpipe runs the shaders on the CPU,
//! and each timing includes recording, submission and the wait of one read-back.
//!
//! `cargo run -p riftco-gpu --example gpu_timings --release`

use std::time::Instant;

use riftco_gpu::{kernels, GpuBuffer, GpuContext, GpuKind, Result};
use riftco_kernels::map::UnaryOp;
use riftco_kernels::matmul::MatmulSpec;

const REPS: usize = 10;

fn time(ctx: &GpuContext, label: &str, f: impl Fn() -> Result<GpuBuffer>) -> Result<()> {
    ctx.download(&f()?)?; // compile the pipeline, warm the pool
    let t = Instant::now();
    let mut last = None;
    for _ in 0..REPS {
        last = Some(f()?);
    }
    if let Some(b) = &last {
        ctx.download(b)?;
    }
    let per = t.elapsed().as_secs_f64() / REPS as f64;
    println!("{label:<36} {:>10.3} ms / call", per * 1e3);
    Ok(())
}

fn main() -> Result<()> {
    let ctx = GpuContext::open(GpuKind::Any)?;
    println!("adapter: {}", ctx.adapter());
    println!("NOT a performance claim: software Vulkan (llvmpipe) runs on the CPU.");
    let n = 1 << 20;
    let x = ctx.upload(&vec![0.5; n])?;
    let y = ctx.upload(&vec![0.25; n])?;
    time(&ctx, "add [1M]", || kernels::add(&ctx, &x, &y))?;
    time(&ctx, "unary gelu [1M]", || {
        kernels::unary(&ctx, UnaryOp::Gelu, &x)
    })?;
    time(&ctx, "sum [1M]", || kernels::sum(&ctx, &x))?;
    time(&ctx, "softmax_rows [1024 x 1024]", || {
        kernels::softmax_rows(&ctx, &x, 1024, 1024)
    })?;
    let a = ctx.upload(&vec![0.01; 256 * 256])?;
    let spec = MatmulSpec::new(256, 256, 256);
    time(&ctx, "matmul 256 x 256 x 256", || {
        kernels::matmul(&ctx, spec, &a, &a)
    })?;
    time(&ctx, "matmul 256^3 trans_a trans_b", || {
        kernels::matmul(&ctx, spec.trans_a(true).trans_b(true), &a, &a)
    })?;
    let t = Instant::now();
    let h = ctx.download(&x)?;
    println!(
        "{:<36} {:>10.3} ms ({} values)",
        "download [1M]",
        t.elapsed().as_secs_f64() * 1e3,
        h.len()
    );
    println!("memory: {:?}", ctx.memory());
    println!("batch: {:?}", ctx.batch_stats());
    Ok(())
}
