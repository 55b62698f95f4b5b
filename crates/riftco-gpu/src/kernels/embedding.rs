//! Embedding gather and its deterministic VJP (`shaders/embedding.wgsl`), the GPU twins of
//! `riftco_kernels::embedding::{embedding, embedding_backward}`.
//!
//! The token ids are host values (`&[u32]`): they are validated against `vocab` on the host
//! (an out-of-range id is an error, never an out-of-bounds read) and uploaded with the call.
//! The VJP uses no float atomics: the host groups the positions by id (a stable counting sort,
//! `O(n_ids + vocab)`), and each `(vocab row, column)` invocation adds its own positions in
//! increasing order, the CPU kernel's order, so the gradient is bitwise the CPU's and the same
//! on every run.

use super::shape::{id_bits, ids_below, positive, product, within_loop_limit};
use super::{dispatch_at, expect_len, grid_1d, to_u32, words};
use crate::error::Result;
use crate::pipelines::{Family, Kernel};
use crate::pool::GpuBuffer;
use crate::GpuContext;

/// `out[i, :] = table[ids[i], :]`; `table`: `[vocab, d]` f32 (`vocab = table.len() / d`),
/// returns `[ids.len(), d]`.
///
/// # Errors
/// [`crate::GpuError::Shape`] when `d` is 0, `table.len()` is not a multiple of `d`, or an id is
/// `>= vocab` (naming the first such id and its index); device errors.
pub fn embedding(ctx: &GpuContext, table: &GpuBuffer, d: usize, ids: &[u32]) -> Result<GpuBuffer> {
    let op = "embedding";
    positive(op, "d", d)?;
    let vocab = table.len() / d;
    expect_len(op, "table", table, product(op, "vocab · d", vocab, d)?)?;
    ids_below(op, "ids", ids, vocab)?;
    let n = product(op, "ids · d", ids.len(), d)?;
    to_u32(op, "ids · d", n)?;
    let out = ctx.alloc(n)?;
    if n == 0 {
        return Ok(out);
    }
    let ids = ctx.upload(&id_bits(ids))?;
    let params = words(&[to_u32(op, "ids · d", n)?, to_u32(op, "d", d)?, 0, 0]);
    let kernel = Kernel::new(Family::Embedding, op);
    dispatch_at(
        ctx,
        kernel,
        &[(0, table), (1, &ids), (5, &out)],
        6,
        &params,
        grid_1d(op, n)?,
    )?;
    Ok(out)
}

/// The positions of `ids` grouped by id: `(offsets, positions)` with
/// `positions[offsets[v]..offsets[v + 1]]` the `i` where `ids[i] = v`, in increasing order.
fn group_by_id(ids: &[u32], vocab: usize) -> (Vec<u32>, Vec<u32>) {
    let mut offsets = vec![0u32; vocab + 1];
    for &id in ids {
        offsets[id as usize + 1] += 1;
    }
    for v in 0..vocab {
        offsets[v + 1] += offsets[v];
    }
    let mut next = offsets.clone();
    let mut positions = vec![0u32; ids.len()];
    for (i, &id) in ids.iter().enumerate() {
        let slot = &mut next[id as usize];
        positions[*slot as usize] = i as u32;
        *slot += 1;
    }
    (offsets, positions)
}

/// VJP of [`embedding`]: `dtable[v, :] = Σ_{i: ids[i] = v} dy[i, :]` in increasing `i`;
/// `dy`: `[ids.len(), d]` f32, returns a fresh `[vocab, d]` (the CPU kernel adds the same sums
/// into its argument).
///
/// # Errors
/// [`crate::GpuError::Shape`] when `d` or `vocab` is 0, `dy.len() != ids.len() · d`, an id is
/// `>= vocab`, or `vocab · d` / `ids.len()` exceed the shaders' 32-bit indices; device errors.
pub fn embedding_backward(
    ctx: &GpuContext,
    ids: &[u32],
    dy: &GpuBuffer,
    d: usize,
    vocab: usize,
) -> Result<GpuBuffer> {
    let op = "embedding_backward";
    positive(op, "d", d)?;
    positive(op, "vocab", vocab)?;
    expect_len(op, "dy", dy, product(op, "ids · d", ids.len(), d)?)?;
    to_u32(op, "ids · d", dy.len())?;
    ids_below(op, "ids", ids, vocab)?;
    let n = product(op, "vocab · d", vocab, d)?;
    to_u32(op, "vocab · d", n)?;
    // `vocab + 1` offsets: vocab < 2^32 by the check above (n ≥ vocab).
    let dtable = ctx.alloc(n)?;
    if ids.is_empty() {
        ctx.write(&dtable, &vec![0.0; n])?;
        return Ok(dtable);
    }
    let (offsets, positions) = group_by_id(ids, vocab);
    // One invocation per table entry sums the positions of its id in a loop (its iterations
    // and the exit test).
    within_loop_limit(ctx, op, || {
        let (most_id, most) = offsets
            .windows(2)
            .enumerate()
            .map(|(v, w)| (v, (w[1] - w[0]) as usize))
            .max_by_key(|&(v, n)| (n, std::cmp::Reverse(v)))
            .unwrap_or_default();
        (most + 1, format!("token id {most_id} occurs {most} times"))
    })?;
    let offsets = ctx.upload(&id_bits(&offsets))?;
    let positions = ctx.upload(&id_bits(&positions))?;
    let params = words(&[to_u32(op, "vocab · d", n)?, to_u32(op, "d", d)?, 0, 0]);
    let kernel = Kernel::new(Family::Embedding, op);
    dispatch_at(
        ctx,
        kernel,
        &[(2, dy), (3, &offsets), (4, &positions), (5, &dtable)],
        6,
        &params,
        grid_1d(op, n)?,
    )?;
    Ok(dtable)
}
