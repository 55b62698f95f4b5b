//! RMSNorm and its VJP (`shaders/rms_norm.wgsl`), the GPU twins of
//! `riftco_kernels::norm::{rms_norm, rms_norm_backward}` (Zhang & Sennrich 2019, "Root Mean
//! Square Layer Normalization", eq. 4): `y = x / sqrt(mean(x²) + eps) ⊙ weight` over the last
//! axis of `[rows, cols]`.
//!
//! The row sums (`Σ x²` forward, `Σ x·w·dy` backward) use a fixed tree of 256 strided partials,
//! not the CPU order; the weight gradient sums rows in blocks of
//! [`riftco_kernels::norm::DWEIGHT_BLOCK_ROWS`] added in block order, as the CPU kernel does.

use riftco_kernels::norm::DWEIGHT_BLOCK_ROWS;

use super::shape::{grid_rows, positive, product, within_loop_limit};
use super::{dispatch_at, expect_len, grid_1d, to_u32, words};
use crate::error::Result;
use crate::pipelines::{Family, Kernel};
use crate::pool::GpuBuffer;
use crate::GpuContext;

fn params(op: &'static str, rows: usize, cols: usize, eps: f32) -> Result<Vec<u8>> {
    Ok(words(&[
        to_u32(op, "rows", rows)?,
        to_u32(op, "cols", cols)?,
        eps.to_bits(),
        DWEIGHT_BLOCK_ROWS as u32,
    ]))
}

/// Forward; `x`: `[rows, cols]` f32 row-major with `cols = weight.len()`. Returns `(y, rstd)`:
/// `y` `[rows, cols]` and the per-row reciprocal RMS `rstd[r] = 1/sqrt(mean(x²) + eps)`
/// (`[rows]`), which [`rms_norm_backward`] reuses.
///
/// # Errors
/// [`crate::GpuError::Shape`] when `weight` is empty or `x.len()` is not a multiple of
/// `weight.len()`; device errors.
pub fn rms_norm(
    ctx: &GpuContext,
    x: &GpuBuffer,
    weight: &GpuBuffer,
    eps: f32,
) -> Result<(GpuBuffer, GpuBuffer)> {
    let op = "rms_norm";
    let cols = weight.len();
    positive(op, "cols (weight length)", cols)?;
    let rows = x.len() / cols;
    expect_len(op, "x", x, product(op, "rows · cols", rows, cols)?)?;
    let y = ctx.alloc(x.len())?;
    let rstd = ctx.alloc(rows)?;
    if rows == 0 {
        return Ok((y, rstd));
    }
    let kernel = Kernel::new(Family::RmsNorm, op);
    let storage = [(0, x), (1, weight), (4, &y), (5, &rstd)];
    let p = params(op, rows, cols, eps)?;
    dispatch_at(ctx, kernel, &storage, 8, &p, grid_rows(op, rows)?)?;
    Ok((y, rstd))
}

/// Backward, given `x` (`[rows, cols]`), `weight` (`[cols]`), the forward's `rstd` (`[rows]`)
/// and upstream `dy` (`[rows, cols]`). Returns `(dx, dweight)`:
/// `dx = rstd ⊙ (w ⊙ dy) − x · rstd³ · mean(x ⊙ w ⊙ dy)` and `dweight = Σ_rows dy ⊙ x ⊙ rstd`
/// (`[cols]`, a fresh sum; the CPU kernel adds the same sum into its argument).
///
/// # Errors
/// [`crate::GpuError::Shape`] when the lengths disagree with `rows = x.len() / cols`; device
/// errors.
pub fn rms_norm_backward(
    ctx: &GpuContext,
    x: &GpuBuffer,
    weight: &GpuBuffer,
    rstd: &GpuBuffer,
    dy: &GpuBuffer,
) -> Result<(GpuBuffer, GpuBuffer)> {
    let op = "rms_norm_backward";
    let cols = weight.len();
    positive(op, "cols (weight length)", cols)?;
    let rows = x.len() / cols;
    expect_len(op, "x", x, product(op, "rows · cols", rows, cols)?)?;
    expect_len(op, "rstd", rstd, rows)?;
    expect_len(op, "dy", dy, x.len())?;
    let dx = ctx.alloc(x.len())?;
    let dweight = ctx.alloc(cols)?;
    // rms_norm_dweight walks every row of its column. llvmpipe counts every loop-header
    // execution: per block of DWEIGHT_BLOCK_ROWS rows its rows, the inner loop's exit test and
    // one outer iteration, then the outer loop's exit test (measured: 61681 rows were summed).
    within_loop_limit(ctx, op, || {
        let loops = rows + 2 * rows.div_ceil(DWEIGHT_BLOCK_ROWS) + 1;
        (loops, format!("the weight gradient over {rows} rows"))
    })?;
    let p = params(op, rows, cols, 0.0)?;
    if rows == 0 {
        ctx.write(&dweight, &vec![0.0; cols])?;
        return Ok((dx, dweight));
    }
    let kernel = Kernel::new(Family::RmsNorm, "rms_norm_backward");
    let storage = [(0, x), (1, weight), (2, rstd), (3, dy), (6, &dx)];
    dispatch_at(ctx, kernel, &storage, 8, &p, grid_rows(op, rows)?)?;
    let kernel = Kernel::new(Family::RmsNorm, "rms_norm_dweight");
    let storage = [(0, x), (2, rstd), (3, dy), (7, &dweight)];
    dispatch_at(ctx, kernel, &storage, 8, &p, grid_1d(op, cols)?)?;
    Ok((dx, dweight))
}
