//! Philox4x32-10 and dropout (`shaders/dropout.wgsl`), bit for bit the contract of
//! `riftco_kernels::philox::DropoutMask` (Salmon et al. 2011, "Parallel Random Numbers: As Easy
//! as 1, 2, 3", section 4.3; dropout: Srivastava et al. 2014, eq. 2 with inverted scaling):
//! element `e` reads word `e % 4` of Philox block `offset + e / 4` with counter
//! `[n lo, n hi, stream0, stream1]`, is kept iff `(x >> 8) · 2⁻²⁴ >= p`, kept elements are
//! multiplied by `1 / (1 − p)` and dropped ones are exactly 0. The mask is never stored: the
//! same `DropoutMask` gives the same mask on the CPU and the GPU, in any pass.
//!
//! WGSL has no 64-bit integers: the shader forms the rounds' 32 × 32 → 64-bit products from
//! 16-bit halves.

use riftco_kernels::philox::DropoutMask;

use super::shape::id_bits;
use super::{dispatch_at, grid_1d, to_u32, words};
use crate::error::{GpuError, Result};
use crate::pipelines::{Family, Kernel};
use crate::pool::GpuBuffer;
use crate::GpuContext;

/// The Philox4x32-10 blocks of `(counters[b], keys[b])` computed on the GPU: a buffer of
/// `4 · counters.len()` values holding the output words as **u32 bit patterns** (read them with
/// `f32::to_bits`), word `w` of block `b` at `4b + w`. For known-answer tests and mask checks.
///
/// # Errors
/// [`GpuError::Shape`] when `keys.len() != counters.len()`; device errors.
pub fn philox4x32_10_blocks(
    ctx: &GpuContext,
    counters: &[[u32; 4]],
    keys: &[[u32; 2]],
) -> Result<GpuBuffer> {
    let op = "philox4x32_10_blocks";
    if keys.len() != counters.len() {
        return Err(GpuError::Shape {
            op,
            message: format!(
                "{} keys for {} counters, expected one key per counter",
                keys.len(),
                counters.len()
            ),
        });
    }
    let n = counters.len();
    to_u32(op, "4 · blocks", n.saturating_mul(4))?;
    let out = ctx.alloc(4 * n)?;
    if n == 0 {
        return Ok(out);
    }
    let c: Vec<u32> = counters.iter().flatten().copied().collect();
    let k: Vec<u32> = keys.iter().flatten().copied().collect();
    let (c, k) = (ctx.upload(&id_bits(&c))?, ctx.upload(&id_bits(&k))?);
    let mut p = vec![0u32; 12];
    p[0] = to_u32(op, "blocks", n)?;
    let kernel = Kernel::new(Family::Dropout, "philox_blocks");
    let storage = [(1, &c), (2, &k), (4, &out)];
    dispatch_at(ctx, kernel, &storage, 5, &words(&p), grid_1d(op, n)?)?;
    Ok(out)
}

/// `out[e] = x[e] / (1 − p)` where `mask` keeps element `e` (0-based index into `x`), exactly
/// 0 where it drops it; `x`: `[n]` f32. Forward and VJP are the same map. With `p == 0` every
/// element is kept and multiplied by 1.
///
/// # Errors
/// [`GpuError::Shape`] when `mask.p` is not finite in `[0, 1)` or `x` is longer than `2³²`
/// values; device errors.
pub fn dropout(ctx: &GpuContext, x: &GpuBuffer, mask: &DropoutMask) -> Result<GpuBuffer> {
    let op = "dropout";
    if !DropoutMask::is_valid_p(mask.p) {
        return Err(GpuError::Shape {
            op,
            message: format!(
                "p = {}, expected a finite drop probability in [0, 1)",
                mask.p
            ),
        });
    }
    let n = x.len();
    let out = ctx.alloc(n)?;
    if n == 0 {
        return Ok(out);
    }
    let p = words(&[
        to_u32(op, "n", n)?,
        mask.p.to_bits(),
        mask.scale().to_bits(),
        mask.offset as u32,
        (mask.offset >> 32) as u32,
        mask.stream[0],
        mask.stream[1],
        mask.key[0],
        mask.key[1],
        0,
        0,
        0,
    ]);
    let kernel = Kernel::new(Family::Dropout, op);
    dispatch_at(ctx, kernel, &[(0, x), (3, &out)], 5, &p, grid_1d(op, n)?)?;
    Ok(out)
}
