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
use riftco_kernels::reduce::ReduceOp;

/// Values one workgroup sums per pass.
pub const SUM_BLOCK: usize = 512;

/// `out[r] = Σ_c x[r, c]`; `x`: `[rows, cols]` f32 row-major, `out`: `[rows]` (0 where
/// `cols == 0`).
///
/// # Errors
/// As [`reduce_rows`].
pub fn sum_rows(ctx: &GpuContext, x: &GpuBuffer, rows: usize, cols: usize) -> Result<GpuBuffer> {
    reduce_rows(ctx, ReduceOp::Sum, x, rows, cols)
}

/// `out[r]` = the sum or the max of `x[r, ..]`; `x`: `[rows, cols]` f32 row-major, `out`:
/// `[rows]`. Over no values (`cols == 0`) the sum is 0 and the max `-inf`; the max is NaN
/// where the row holds a NaN. Any `rows`, `cols` whose product fits the shaders' 32-bit index
/// (rows beyond 65535 spread over the grid's z dimension).
///
/// # Errors
/// [`GpuError::Shape`] when `x.len() != rows · cols` or `rows · cols` exceeds the 32-bit
/// index range; device errors.
pub fn reduce_rows(
    ctx: &GpuContext,
    kind: ReduceOp,
    x: &GpuBuffer,
    rows: usize,
    cols: usize,
) -> Result<GpuBuffer> {
    let total = rows.checked_mul(cols).ok_or_else(|| GpuError::Shape {
        op: "sum_rows",
        message: format!("rows · cols overflows ({rows} · {cols})"),
    })?;
    expect_len("sum_rows", "x", x, total)?;
    to_u32("sum_rows", "rows · cols", total)?;
    if rows == 0 {
        return ctx.alloc(0);
    }
    if cols == 0 {
        let empty = match kind {
            ReduceOp::Sum => 0.0,
            ReduceOp::Max => f32::NEG_INFINITY,
        };
        return ctx.upload(&vec![empty; rows]);
    }
    let mut cur = reduce_pass(ctx, kind, x, rows, cols)?;
    let mut width = cols.div_ceil(SUM_BLOCK);
    while width > 1 {
        cur = reduce_pass(ctx, kind, &cur, rows, width)?;
        width = width.div_ceil(SUM_BLOCK);
    }
    Ok(cur)
}

/// The grid of one pass: `blocks` along x, `rows` spread over y (at most [`MAX_GROUPS`]) and z.
fn row_grid(blocks: usize, rows: usize) -> [u32; 3] {
    let y = rows.min(MAX_GROUPS as usize);
    [blocks as u32, y as u32, rows.div_ceil(y) as u32]
}

/// One pass: `[rows, width]` → `[rows, ceil(width / 512)]` block sums or maxima.
fn reduce_pass(
    ctx: &GpuContext,
    kind: ReduceOp,
    input: &GpuBuffer,
    rows: usize,
    width: usize,
) -> Result<GpuBuffer> {
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
        match kind {
            ReduceOp::Sum => 0,
            ReduceOp::Max => 1,
        },
    ]);
    let kernel = Kernel::new(Family::Reduce, "sum_rows");
    dispatch(ctx, kernel, &[input, &out], &params, row_grid(blocks, rows))?;
    Ok(out)
}

/// `Σ_i x[i]` as a one-value buffer; `x`: `[n]` f32.
///
/// # Errors
/// As [`sum_rows`] with one row.
pub fn sum(ctx: &GpuContext, x: &GpuBuffer) -> Result<GpuBuffer> {
    sum_rows(ctx, x, 1, x.len())
}
