//! SiLU and SwiGLU with their VJPs (`shaders/activation.wgsl`): the GPU twins of
//! `riftco_kernels::elementwise::{silu, silu_backward, swiglu, swiglu_backward,
//! swiglu_backward_in_place}`.
//!
//! SiLU (Elfwing et al. 2018, "Sigmoid-Weighted Linear Units", eq. 4): `x · σ(x)`;
//! SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer", eq. 6): `SiLU(gate) · up`, with
//! `σ(x) = 1 / (1 + exp(−x))` and `SiLU'(x) = σ(x)(1 + x(1 − σ(x)))`. All buffers are `[n]` f32.

use super::{dispatch_at, expect_len, grid_1d, to_u32, words};
use crate::error::Result;
use crate::pipelines::{Family, Kernel};
use crate::pool::GpuBuffer;
use crate::GpuContext;

/// One element-wise dispatch: `inputs` at bindings 0.., `outputs` at bindings 3, 4.
fn run(
    ctx: &GpuContext,
    entry: &'static str,
    inputs: &[&GpuBuffer],
    outputs: &[&GpuBuffer],
    n: usize,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let mut storage: Vec<(u32, &GpuBuffer)> = Vec::new();
    for (i, b) in inputs.iter().enumerate() {
        storage.push((i as u32, *b));
    }
    for (i, b) in outputs.iter().enumerate() {
        storage.push((3 + i as u32, *b));
    }
    let params = words(&[to_u32(entry, "n", n)?, 0, 0, 0]);
    let kernel = Kernel::new(Family::Activation, entry);
    dispatch_at(ctx, kernel, &storage, 5, &params, grid_1d(entry, n)?)
}

/// `out = x · σ(x)`; `x`: `[n]` f32, `out` the same.
///
/// # Errors
/// Device errors.
pub fn silu(ctx: &GpuContext, x: &GpuBuffer) -> Result<GpuBuffer> {
    let out = ctx.alloc(x.len())?;
    run(ctx, "silu", &[x], &[&out], x.len())?;
    Ok(out)
}

/// VJP of SiLU: `dx = dy · σ(x)(1 + x(1 − σ(x)))`; `x`, `dy`: `[n]` f32.
///
/// # Errors
/// [`crate::GpuError::Shape`] when `dy.len() != x.len()`; device errors.
pub fn silu_backward(ctx: &GpuContext, x: &GpuBuffer, dy: &GpuBuffer) -> Result<GpuBuffer> {
    expect_len("silu_backward", "dy", dy, x.len())?;
    let dx = ctx.alloc(x.len())?;
    run(ctx, "silu_backward", &[x, dy], &[&dx], x.len())?;
    Ok(dx)
}

/// `out = SiLU(gate) · up`; `gate`, `up`: `[n]` f32.
///
/// # Errors
/// [`crate::GpuError::Shape`] when `up.len() != gate.len()`; device errors.
pub fn swiglu(ctx: &GpuContext, gate: &GpuBuffer, up: &GpuBuffer) -> Result<GpuBuffer> {
    expect_len("swiglu", "up", up, gate.len())?;
    let out = ctx.alloc(gate.len())?;
    run(ctx, "swiglu", &[gate, up], &[&out], gate.len())?;
    Ok(out)
}

/// VJP of SwiGLU: returns `(dgate, dup)` with `dgate = dy · up · SiLU'(gate)` and
/// `dup = dy · SiLU(gate)`; `gate`, `up`, `dy`: `[n]` f32.
///
/// # Errors
/// [`crate::GpuError::Shape`] when `up` or `dy` is not as long as `gate`; device errors.
pub fn swiglu_backward(
    ctx: &GpuContext,
    gate: &GpuBuffer,
    up: &GpuBuffer,
    dy: &GpuBuffer,
) -> Result<(GpuBuffer, GpuBuffer)> {
    let n = gate.len();
    expect_len("swiglu_backward", "up", up, n)?;
    expect_len("swiglu_backward", "dy", dy, n)?;
    let dgate = ctx.alloc(n)?;
    let dup = ctx.alloc(n)?;
    run(ctx, "swiglu_backward", &[gate, up, dy], &[&dgate, &dup], n)?;
    Ok((dgate, dup))
}

/// [`swiglu_backward`] writing `dgate` over `dy_dgate` (which holds `dy` on entry) and
/// returning `dup`; `gate`, `up`, `dy_dgate`: `[n]` f32, `dy_dgate` a buffer of its own.
///
/// # Errors
/// [`crate::GpuError::Shape`] when `up` or `dy_dgate` is not as long as `gate`; device errors.
pub fn swiglu_backward_in_place(
    ctx: &GpuContext,
    gate: &GpuBuffer,
    up: &GpuBuffer,
    dy_dgate: &GpuBuffer,
) -> Result<GpuBuffer> {
    let n = gate.len();
    expect_len("swiglu_backward_in_place", "up", up, n)?;
    expect_len("swiglu_backward_in_place", "dy", dy_dgate, n)?;
    let dup = ctx.alloc(n)?;
    run(
        ctx,
        "swiglu_backward_in_place",
        &[gate, up],
        &[dy_dgate, &dup],
        n,
    )?;
    Ok(dup)
}
