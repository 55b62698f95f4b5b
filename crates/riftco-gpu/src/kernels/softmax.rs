//! Row softmax (`shaders/softmax.wgsl`), the GPU twin of
//! `riftco_kernels::softmax::softmax_rows`: `y[r, c] = exp(x[r, c] − max_r) / Σ_c' exp(x[r, c'] − max_r)`.
//! The row max is exact; the row sum uses a fixed tree of 256 strided partials (another order
//! than the CPU kernel's, deterministic).

use super::{dispatch, expect_len, to_u32, words, MAX_GROUPS};
use crate::error::{GpuError, Result};
use crate::pipelines::{Family, Kernel};
use crate::pool::GpuBuffer;
use crate::GpuContext;

/// Softmax of each row; `x`: `[rows, cols]` f32 row-major, `y` the same shape.
///
/// # Errors
/// [`GpuError::Shape`] when `x.len() != rows · cols`; device errors.
pub fn softmax_rows(
    ctx: &GpuContext,
    x: &GpuBuffer,
    rows: usize,
    cols: usize,
) -> Result<GpuBuffer> {
    let total = rows.checked_mul(cols).ok_or_else(|| GpuError::Shape {
        op: "softmax_rows",
        message: format!("rows · cols overflows ({rows} · {cols})"),
    })?;
    expect_len("softmax_rows", "x", x, total)?;
    let y = ctx.alloc(total)?;
    if total == 0 {
        return Ok(y);
    }
    let gx = rows.min(MAX_GROUPS as usize);
    let gy = rows.div_ceil(gx);
    if gy > MAX_GROUPS as usize {
        return Err(GpuError::Shape {
            op: "softmax_rows",
            message: format!("rows = {rows} exceed one dispatch"),
        });
    }
    let params = words(&[
        to_u32("softmax_rows", "rows", rows)?,
        to_u32("softmax_rows", "cols", cols)?,
        0,
        0,
    ]);
    let kernel = Kernel::new(Family::Softmax, "softmax_rows");
    dispatch(ctx, kernel, &[x, &y], &params, [gx as u32, gy as u32, 1])?;
    Ok(y)
}
