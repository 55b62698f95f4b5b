//! Deterministic sums (`shaders/reduce.wgsl`): the row sums of `[rows, cols]` and the sum of a
//! whole buffer, in a fixed tree order (no float atomics): the same input gives bitwise the
//! same result on every run.
//!
//! Order: each pass sums blocks of [`SUM_BLOCK`] consecutive values of a row (thread `t` adds
//! values `t` and `t + 256`, then a pairwise halving tree over the 256 partials), giving
//! `[rows, ceil(cols / 512)]`; passes repeat until one value per row is left. This is not
//! the CPU kernel's order, so GPU and CPU sums agree to rounding (tests use 1e-4 relative).

use super::{dispatch, expect_len, to_u32, words, MAX_GROUPS};
use crate::error::{GpuError, Result};
use crate::pipelines::{Family, Kernel};
use crate::pool::GpuBuffer;
use crate::GpuContext;

/// Values one workgroup sums per pass.
pub const SUM_BLOCK: usize = 512;

/// `out[r] = Σ_c x[r, c]`; `x`: `[rows, cols]` f32 row-major, `out`: `[rows]` (0 where
/// `cols == 0`).
///
/// # Errors
/// [`GpuError::Shape`] when `x.len() != rows · cols` or `rows` exceeds 65535 (one grid
/// dimension); device errors.
pub fn sum_rows(ctx: &GpuContext, x: &GpuBuffer, rows: usize, cols: usize) -> Result<GpuBuffer> {
    let total = rows.checked_mul(cols).ok_or_else(|| GpuError::Shape {
        op: "sum_rows",
        message: format!("rows · cols overflows ({rows} · {cols})"),
    })?;
    expect_len("sum_rows", "x", x, total)?;
    if rows > MAX_GROUPS as usize {
        return Err(GpuError::Shape {
            op: "sum_rows",
            message: format!("rows = {rows} exceeds {MAX_GROUPS}"),
        });
    }
    if rows == 0 {
        return ctx.alloc(0);
    }
    if cols == 0 {
        return ctx.upload(&vec![0.0; rows]);
    }
    let mut cur = sum_pass(ctx, x, rows, cols)?;
    let mut width = cols.div_ceil(SUM_BLOCK);
    while width > 1 {
        cur = sum_pass(ctx, &cur, rows, width)?;
        width = width.div_ceil(SUM_BLOCK);
    }
    Ok(cur)
}

/// One pass: `[rows, width]` → `[rows, ceil(width / 512)]` block sums.
fn sum_pass(ctx: &GpuContext, input: &GpuBuffer, rows: usize, width: usize) -> Result<GpuBuffer> {
    let blocks = width.div_ceil(SUM_BLOCK);
    if blocks > MAX_GROUPS as usize {
        return Err(GpuError::Shape {
            op: "sum_rows",
            message: format!("cols = {width} needs {blocks} blocks, over {MAX_GROUPS}"),
        });
    }
    let out = ctx.alloc(rows * blocks)?;
    let params = words(&[
        to_u32("sum_rows", "rows", rows)?,
        to_u32("sum_rows", "cols", width)?,
        to_u32("sum_rows", "blocks", blocks)?,
        0,
    ]);
    let grid = [blocks as u32, rows as u32, 1];
    let kernel = Kernel::new(Family::Reduce, "sum_rows");
    dispatch(ctx, kernel, &[input, &out], &params, grid)?;
    Ok(out)
}

/// `Σ_i x[i]` as a one-value buffer; `x`: `[n]` f32.
///
/// # Errors
/// As [`sum_rows`] with one row.
pub fn sum(ctx: &GpuContext, x: &GpuBuffer) -> Result<GpuBuffer> {
    sum_rows(ctx, x, 1, x.len())
}
