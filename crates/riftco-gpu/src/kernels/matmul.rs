//! Tiled matrix products (`shaders/matmul.wgsl`), the GPU twins of
//! `riftco_kernels::matmul::{matmul, batched_matmul}` with the same [`MatmulSpec`]:
//! `C[m, n] (+)= op(A)[m, k] · op(B)[k, n]`, `op(A) = Aᵀ` when `trans_a` (A stored `[k, m]`),
//! `op(B) = Bᵀ` when `trans_b` (B stored `[n, k]`). 16×16 output tiles, `k` summed in
//! increasing order per output (another order than `gemm`'s blocking, deterministic).

use riftco_kernels::matmul::MatmulSpec;

use super::shape::within_loop_limit;
use super::{dispatch, expect_len, to_u32, words, MAX_GROUPS};
use crate::error::{GpuError, Result};
use crate::pipelines::{Family, Kernel};
use crate::pool::GpuBuffer;
use crate::GpuContext;

const TILE: usize = 16;

fn prod(op: &'static str, parts: &[usize]) -> Result<usize> {
    parts
        .iter()
        .try_fold(1usize, |acc, &p| acc.checked_mul(p))
        .ok_or_else(|| GpuError::Shape {
            op,
            message: format!("the size {parts:?} overflows"),
        })
}

/// `c (+)= op(a) · op(b)` for `batch` products laid end to end: `a`: `[batch, m, k]` (or
/// `[batch, k, m]` transposed), `b`: `[batch, k, n]` (or `[batch, n, k]`), `c`: `[batch, m, n]`,
/// all f32. `spec.accumulate` adds into `c`; otherwise `c` is overwritten.
///
/// # Errors
/// [`GpuError::Shape`] when a length disagrees with the spec (naming both), when `c` is also
/// `a` or `b`, or when the grid exceeds 65535 tiles per dimension; device errors.
pub fn matmul_into(
    ctx: &GpuContext,
    batch: usize,
    spec: MatmulSpec,
    a: &GpuBuffer,
    b: &GpuBuffer,
    c: &GpuBuffer,
) -> Result<()> {
    const OP: &str = "matmul";
    let MatmulSpec { m, k, n, .. } = spec;
    expect_len(OP, "a", a, prod(OP, &[batch, m, k])?)?;
    expect_len(OP, "b", b, prod(OP, &[batch, k, n])?)?;
    expect_len(OP, "c", c, prod(OP, &[batch, m, n])?)?;
    // Each invocation walks k in tiles of TILE (TILE products, the inner exit test and one
    // outer iteration per tile; loop-header executions).
    within_loop_limit(ctx, OP, || {
        let loops = k.saturating_add(2 * k.div_ceil(TILE)).saturating_add(1);
        (loops, format!("an inner dimension k = {k}"))
    })?;
    if batch == 0 || m == 0 || n == 0 {
        return Ok(());
    }
    let gx = n.div_ceil(TILE);
    let gy = m.div_ceil(TILE);
    if gx.max(gy).max(batch) > MAX_GROUPS as usize {
        return Err(GpuError::Shape {
            op: OP,
            message: format!("{batch} × {gy} × {gx} tiles exceed {MAX_GROUPS} per grid dimension"),
        });
    }
    let params = words(&[
        to_u32(OP, "m", m)?,
        to_u32(OP, "k", k)?,
        to_u32(OP, "n", n)?,
        u32::from(spec.trans_a),
        u32::from(spec.trans_b),
        u32::from(spec.accumulate),
        to_u32(OP, "batch", batch)?,
        0,
    ]);
    let kernel = Kernel::new(Family::Matmul, "matmul");
    if c.raw() == a.raw() || c.raw() == b.raw() {
        return Err(GpuError::Shape {
            op: OP,
            message: "the output c is also an input".to_owned(),
        });
    }
    dispatch(
        ctx,
        kernel,
        &[a, b, c],
        &params,
        [gx as u32, gy as u32, batch as u32],
    )
}

/// `op(a) · op(b)` as a new `[m, n]` buffer (`spec.accumulate` is ignored: nothing to add to).
///
/// # Errors
/// As [`matmul_into`].
pub fn matmul(
    ctx: &GpuContext,
    spec: MatmulSpec,
    a: &GpuBuffer,
    b: &GpuBuffer,
) -> Result<GpuBuffer> {
    batched_matmul(ctx, 1, spec, a, b)
}

/// `batch` products `op(a_z) · op(b_z)` as a new `[batch, m, n]` buffer.
///
/// # Errors
/// As [`matmul_into`].
pub fn batched_matmul(
    ctx: &GpuContext,
    batch: usize,
    spec: MatmulSpec,
    a: &GpuBuffer,
    b: &GpuBuffer,
) -> Result<GpuBuffer> {
    let c = ctx.alloc(prod("matmul", &[batch, spec.m, spec.n])?)?;
    matmul_into(ctx, batch, spec.accumulate(false), a, b, &c)?;
    Ok(c)
}
