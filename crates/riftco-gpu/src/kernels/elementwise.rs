//! Same-shape element-wise kernels (`shaders/elementwise.wgsl`): the GPU twins of
//! `riftco_kernels::elementwise::{add, mul, scale}`.

use super::{dispatch, dispatch_at, expect_len, grid_1d, to_u32, words};
use crate::error::Result;
use crate::pipelines::{Family, Kernel};
use crate::pool::GpuBuffer;
use crate::GpuContext;

fn binary(
    ctx: &GpuContext,
    entry: &'static str,
    a: &GpuBuffer,
    b: &GpuBuffer,
) -> Result<GpuBuffer> {
    expect_len(entry, "b", b, a.len())?;
    let n = a.len();
    let out = ctx.alloc(n)?;
    if n == 0 {
        return Ok(out);
    }
    let params = words(&[to_u32(entry, "n", n)?, 0, 0, 0]);
    let kernel = Kernel::new(Family::Elementwise, entry);
    dispatch(ctx, kernel, &[a, b, &out], &params, grid_1d(entry, n)?)?;
    Ok(out)
}

/// `out[i] = a[i] + b[i]`; `a`, `b`: `[n]` f32, same length.
///
/// # Errors
/// [`crate::GpuError::Shape`] when the lengths differ; device errors.
pub fn add(ctx: &GpuContext, a: &GpuBuffer, b: &GpuBuffer) -> Result<GpuBuffer> {
    binary(ctx, "add", a, b)
}

/// `out[i] = a[i] · b[i]`; `a`, `b`: `[n]` f32, same length.
///
/// # Errors
/// [`crate::GpuError::Shape`] when the lengths differ; device errors.
pub fn mul(ctx: &GpuContext, a: &GpuBuffer, b: &GpuBuffer) -> Result<GpuBuffer> {
    binary(ctx, "mul", a, b)
}

/// `out[i] = alpha · a[i]`; `a`: `[n]` f32.
///
/// # Errors
/// Device errors.
pub fn scale(ctx: &GpuContext, a: &GpuBuffer, alpha: f32) -> Result<GpuBuffer> {
    let n = a.len();
    let out = ctx.alloc(n)?;
    if n == 0 {
        return Ok(out);
    }
    let params = words(&[to_u32("scale", "n", n)?, alpha.to_bits(), 0, 0]);
    let kernel = Kernel::new(Family::Elementwise, "scale");
    // `scale` reads only `a` (binding 0); `b` (binding 1) is not part of its layout.
    dispatch_at(
        ctx,
        kernel,
        &[(0, a), (2, &out)],
        3,
        &params,
        grid_1d("scale", n)?,
    )?;
    Ok(out)
}
