//! Rotary position embedding (`shaders/rope.wgsl`), the GPU twin of
//! `riftco_kernels::rope::rope` (Su et al. 2021, "RoFormer", eq. 34, rotate-half pairing:
//! dimension `i` pairs with `i + d_head/2`, frequency `θ_i = theta^(−2i/d_head)`).
//!
//! The angles come from the CPU's [`RopeTable`] (computed in f64, rounded once to f32),
//! uploaded once as a [`GpuRopeTable`], so GPU and CPU rotate by the same f32 `cos`/`sin`.

use riftco_kernels::rope::RopeTable;

use super::shape::{positive, product};
use super::{dispatch, grid_1d, to_u32, words};
use crate::error::{GpuError, Result};
use crate::pipelines::{Family, Kernel};
use crate::pool::GpuBuffer;
use crate::GpuContext;

/// The `cos`/`sin` of `p·θ_i` on the device, `[max_positions, d_head/2]` each.
pub struct GpuRopeTable {
    /// Head dimension (even).
    pub d_head: usize,
    /// Positions covered.
    pub max_positions: usize,
    cos: GpuBuffer,
    sin: GpuBuffer,
}

impl GpuRopeTable {
    /// Uploads `table` (`2 · max_positions · d_head/2` f32 values).
    ///
    /// # Errors
    /// As [`GpuContext::upload`].
    pub fn upload(ctx: &GpuContext, table: &RopeTable) -> Result<Self> {
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for p in 0..table.max_positions {
            cos.extend_from_slice(table.cos_row(p));
            sin.extend_from_slice(table.sin_row(p));
        }
        Ok(Self {
            d_head: table.d_head,
            max_positions: table.max_positions,
            cos: ctx.upload(&cos)?,
            sin: ctx.upload(&sin)?,
        })
    }
}

/// RoPE of `x` laid out `[batch, seq_len, n_heads, d_head]` (any batch; `d_head` is the
/// table's), the token at sequence index `s` getting position `start_pos + s`. With `inverse`,
/// rotates by `−p·θ_i`, which is the VJP (the rotation is orthogonal). Returns `out`, shaped
/// like `x`.
///
/// # Errors
/// [`GpuError::Shape`] when `seq_len` or `n_heads` is 0, `x.len()` is not a multiple of
/// `seq_len · n_heads · d_head`, or `start_pos + seq_len` exceeds the table's positions;
/// device errors.
pub fn rope(
    ctx: &GpuContext,
    table: &GpuRopeTable,
    x: &GpuBuffer,
    seq_len: usize,
    n_heads: usize,
    start_pos: usize,
    inverse: bool,
) -> Result<GpuBuffer> {
    let op = "rope";
    positive(op, "seq_len", seq_len)?;
    positive(op, "n_heads", n_heads)?;
    let d = table.d_head;
    let token = product(op, "n_heads · d_head", n_heads, d)?;
    let sequence = product(op, "seq_len · n_heads · d_head", seq_len, token)?;
    if x.len() % sequence != 0 {
        return Err(GpuError::Shape {
            op,
            message: format!(
                "x has {} values, not a multiple of seq_len · n_heads · d_head = {seq_len} · {n_heads} · {d}",
                x.len()
            ),
        });
    }
    let end = start_pos.checked_add(seq_len);
    if end.is_none_or(|e| e > table.max_positions) {
        return Err(GpuError::Shape {
            op,
            message: format!(
                "positions start_pos + seq_len = {start_pos} + {seq_len} exceed the table's {}",
                table.max_positions
            ),
        });
    }
    to_u32(op, "x length", x.len())?;
    let out = ctx.alloc(x.len())?;
    let pairs = x.len() / 2;
    if pairs == 0 {
        return Ok(out);
    }
    let sign: f32 = if inverse { -1.0 } else { 1.0 };
    let params = words(&[
        to_u32(op, "pairs", pairs)?,
        to_u32(op, "d_head / 2", d / 2)?,
        to_u32(op, "n_heads", n_heads)?,
        to_u32(op, "seq_len", seq_len)?,
        to_u32(op, "start_pos", start_pos)?,
        sign.to_bits(),
        0,
        0,
    ]);
    // Highest index the shader forms: (start_pos + seq_len) · d_head/2 into the tables.
    to_u32(
        op,
        "max_positions · d_head/2",
        table.max_positions * (d / 2),
    )?;
    let kernel = Kernel::new(Family::Rope, op);
    dispatch(
        ctx,
        kernel,
        &[x, &table.cos, &table.sin, &out],
        &params,
        grid_1d(op, pairs)?,
    )?;
    Ok(out)
}
