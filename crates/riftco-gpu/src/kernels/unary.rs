//! Element-wise maps of `riftco_kernels::map::UnaryOp` (`shaders/unary.wgsl`), same math as
//! `UnaryOp::apply`.

use riftco_kernels::map::UnaryOp;

use super::{dispatch, grid_1d, to_u32, words};
use crate::error::Result;
use crate::pipelines::{Family, Kernel};
use crate::pool::GpuBuffer;
use crate::GpuContext;

/// The shader's op code of `op` and its scalar (0 for the maps without one). The codes are the
/// `case` labels of `apply` in `shaders/unary.wgsl`.
pub fn unary_code(op: UnaryOp) -> (u32, f32) {
    match op {
        UnaryOp::Neg => (0, 0.0),
        UnaryOp::Exp => (1, 0.0),
        UnaryOp::Log => (2, 0.0),
        UnaryOp::Tanh => (3, 0.0),
        UnaryOp::Sigmoid => (4, 0.0),
        UnaryOp::Relu => (5, 0.0),
        UnaryOp::Gelu => (6, 0.0),
        UnaryOp::GeluTanh => (7, 0.0),
        UnaryOp::PowScalar(p) => (8, p),
        UnaryOp::AddScalar(c) => (9, c),
        UnaryOp::MulScalar(c) => (10, c),
        UnaryOp::DivScalar(c) => (11, c),
        UnaryOp::RSubScalar(c) => (12, c),
        UnaryOp::RDivScalar(c) => (13, c),
    }
}

/// `y[i] = op(x[i])`; `x`: `[n]` f32, `y` the same length.
///
/// # Errors
/// Device errors.
pub fn unary(ctx: &GpuContext, op: UnaryOp, x: &GpuBuffer) -> Result<GpuBuffer> {
    let n = x.len();
    let y = ctx.alloc(n)?;
    if n == 0 {
        return Ok(y);
    }
    let (code, c) = unary_code(op);
    let params = words(&[to_u32("unary", "n", n)?, code, c.to_bits(), 0]);
    let kernel = Kernel::new(Family::Unary, "unary");
    dispatch(ctx, kernel, &[x, &y], &params, grid_1d("unary", n)?)?;
    Ok(y)
}
