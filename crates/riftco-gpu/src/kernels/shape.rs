//! Host-side checks and grids shared by the transformer kernels: sizes are validated here,
//! before anything is recorded, so that bad input is a [`GpuError::Shape`] naming the values.

use super::MAX_GROUPS;
use crate::context::GpuContext;
use crate::error::{GpuError, Result};

/// `a · b`, or a [`GpuError::Shape`] naming both factors when it overflows.
pub(crate) fn product(op: &'static str, what: &str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b).ok_or_else(|| GpuError::Shape {
        op,
        message: format!("{what} overflows ({a} · {b})"),
    })
}

/// One invocation of `op` loops as often as `count` says (loop-header executions of all its
/// loops, and what causes them, for the message): an error naming them on an adapter that
/// would cut the invocation short ([`GpuContext::loop_iteration_limit`]), instead of a silently
/// wrong result. `count` runs only on such an adapter, so the check costs nothing elsewhere.
pub(crate) fn within_loop_limit(
    ctx: &GpuContext,
    op: &'static str,
    count: impl FnOnce() -> (usize, String),
) -> Result<()> {
    let Some(limit) = ctx.loop_iteration_limit() else {
        return Ok(());
    };
    let (iterations, what) = count();
    if iterations <= limit {
        return Ok(());
    }
    Err(GpuError::Shape {
        op,
        message: format!(
            "{what}: one shader invocation would loop {iterations} times, and this adapter ({}) \
             ends an invocation after {limit} loop iterations without an error (Mesa's \
             llvmpipe), so the result would be silently wrong; run it on a hardware GPU or on \
             the CPU, or split the input",
            ctx.adapter()
        ),
    })
}

/// A size that must be positive.
pub(crate) fn positive(op: &'static str, what: &str, v: usize) -> Result<()> {
    if v == 0 {
        return Err(GpuError::Shape {
            op,
            message: format!("{what} = 0, expected at least 1"),
        });
    }
    Ok(())
}

/// Every id of `ids` below `bound` (`what` names them: token ids, targets).
pub(crate) fn ids_below(op: &'static str, what: &str, ids: &[u32], bound: usize) -> Result<()> {
    if let Some((i, &id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= bound) {
        return Err(GpuError::Shape {
            op,
            message: format!("{what}[{i}] = {id} is out of range, expected < {bound}"),
        });
    }
    Ok(())
}

/// The grid of a kernel that runs one workgroup per row: `x · y ≥ rows` workgroups, `x` at
/// most [`MAX_GROUPS`] (the shader reads the row as `wid.x + wid.y · nwg.x`).
pub(crate) fn grid_rows(op: &'static str, rows: usize) -> Result<[u32; 3]> {
    let gx = rows.clamp(1, MAX_GROUPS as usize);
    let gy = rows.div_ceil(gx).max(1);
    if gy > MAX_GROUPS as usize {
        return Err(GpuError::Shape {
            op,
            message: format!("rows = {rows} exceed one dispatch ({MAX_GROUPS}² workgroups)"),
        });
    }
    Ok([gx as u32, gy as u32, 1])
}

/// `ids` as the bits of f32 values, so that they travel in a [`crate::GpuBuffer`] (the
/// shaders bind them as `array<u32>`).
pub(crate) fn id_bits(ids: &[u32]) -> Vec<f32> {
    ids.iter().map(|&id| f32::from_bits(id)).collect()
}
