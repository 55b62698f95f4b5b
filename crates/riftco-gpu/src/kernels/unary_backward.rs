//! The VJP of the element-wise maps (`unary_backward` in `shaders/unary.wgsl`): the GPU twin of
//! `riftco_kernels::map::unary_backward`, same formulas as `UnaryOp::backward`.

use riftco_kernels::map::UnaryOp;

use super::{dispatch_at, expect_len, grid_1d, to_u32, unary_code, words};
use crate::error::Result;
use crate::pipelines::{Family, Kernel};
use crate::pool::GpuBuffer;
use crate::GpuContext;

/// `dx[i] = dy[i] · f'(x[i])` for the map `op`, given its input `x` and output `y = f(x)`;
/// all `[n]` f32.
///
/// # Errors
/// [`crate::GpuError::Shape`] when the lengths differ; device errors.
pub fn unary_backward(
    ctx: &GpuContext,
    op: UnaryOp,
    x: &GpuBuffer,
    y: &GpuBuffer,
    dy: &GpuBuffer,
) -> Result<GpuBuffer> {
    const OP: &str = "unary_backward";
    let n = dy.len();
    expect_len(OP, "x", x, n)?;
    expect_len(OP, "y", y, n)?;
    let dx = ctx.alloc(n)?;
    if n == 0 {
        return Ok(dx);
    }
    let (code, c) = unary_code(op);
    let params = words(&[to_u32(OP, "n", n)?, code, c.to_bits(), 0]);
    let kernel = Kernel::new(Family::Unary, OP);
    dispatch_at(
        ctx,
        kernel,
        &[(0, x), (3, y), (4, dy), (5, &dx)],
        2,
        &params,
        grid_1d(OP, n)?,
    )?;
    Ok(dx)
}
