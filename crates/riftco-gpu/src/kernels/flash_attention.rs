//! Attention without the `[seq_q, seq_k]` score matrix (`shaders/flash_attention.wgsl`), in the
//! algorithm of FlashAttention-2 (Dao 2023, "FlashAttention-2: Faster Attention with Better
//! Parallelism and Work Partitioning", Algorithm 1 forward, Algorithm 2 backward): online
//! softmax, only the per-row logsumexp saved, `P = exp(scale·QKᵀ − L)` rematerialised in the
//! backward with `D = rowsum(dO ⊙ O)`. The GPU twin of
//! `riftco_kernels::attention::flash_attention_{forward,backward}` (layout `[batch, heads, seq,
//! d_head]`, the same causal mask), extended with grouped-query attention (Ainslie et al. 2023,
//! "GQA"): `q`, `out` have `n_heads` heads, `k`, `v` have `n_kv_heads`, and query head `h` reads
//! KV head `h / (n_heads / n_kv_heads)`.
//!
//! Work split: one invocation per query row (forward, `D`, `dQ`) and one per KV row (`dK`,
//! `dV`, summed over the group's query heads and their queries in increasing order), so every
//! result is deterministic and no float atomics are used. Key tiles are one key wide: the
//! online-softmax rescaling runs per key and nothing is staged in workgroup memory (a tiled
//! version is future work; llvmpipe does not reward it).
//!
//! Dropout on the attention probabilities (Dao et al. 2022, "FlashAttention", Appendix B), as
//! `riftco_kernels::attention::flash_attention_{forward,backward}_with_dropout`: `out = (P ⊙ Z)
//! V`, `Z = M / (1 − p)` with `M` the keep mask of a [`DropoutMask`] over the index space
//! `[batch, n_heads, seq_q, seq_k]` (element `((b·n_heads + h)·seq_q + i)·seq_k + j`), which
//! the shaders regenerate with Philox4x32-10 in every pass (never stored); `lse` is that of
//! `P` without dropout, and `D = rowsum(dO ⊙ O)` holds with the dropped output.

use riftco_kernels::attention::AttentionDims;
use riftco_kernels::philox::DropoutMask;

use super::shape::{positive, product, within_loop_limit};
use super::{dispatch_at, expect_len, grid_1d, to_u32, words, WG_1D};
use crate::error::{GpuError, Result};
use crate::pipelines::{Family, Kernel};
use crate::pool::GpuBuffer;
use crate::GpuContext;

/// The largest `d_head` the shaders hold in registers.
pub const FLASH_MAX_D_HEAD: usize = 128;

/// Invocations per workgroup of the attention kernels (`shaders/flash_attention.wgsl`).
const WG: usize = 64;

/// Element counts of one call: `(q_len, kv_len, q_rows, kv_rows)`.
struct Sizes {
    q_len: usize,
    kv_len: usize,
    q_rows: usize,
    kv_rows: usize,
}

fn sizes(op: &'static str, dims: AttentionDims) -> Result<Sizes> {
    let n_kv_heads = dims.n_kv_heads;
    positive(op, "n_heads", dims.n_heads)?;
    positive(op, "n_kv_heads", n_kv_heads)?;
    positive(op, "d_head", dims.d_head)?;
    if dims.n_heads % n_kv_heads != 0 {
        return Err(GpuError::Shape {
            op,
            message: format!(
                "n_heads = {} is not a multiple of n_kv_heads = {n_kv_heads}",
                dims.n_heads
            ),
        });
    }
    if dims.d_head > FLASH_MAX_D_HEAD {
        return Err(GpuError::Shape {
            op,
            message: format!("d_head = {} exceeds {FLASH_MAX_D_HEAD}", dims.d_head),
        });
    }
    let bh = product(op, "batch · n_heads", dims.batch, dims.n_heads)?;
    let bkv = product(op, "batch · n_kv_heads", dims.batch, n_kv_heads)?;
    let q_rows = product(op, "batch · n_heads · seq_q", bh, dims.seq_q)?;
    let kv_rows = product(op, "batch · n_kv_heads · seq_k", bkv, dims.seq_k)?;
    let q_len = product(op, "q elements", q_rows, dims.d_head)?;
    let kv_len = product(op, "k elements", kv_rows, dims.d_head)?;
    to_u32(op, "q elements", q_len)?;
    to_u32(op, "k elements", kv_len)?;
    Ok(Sizes {
        q_len,
        kv_len,
        q_rows,
        kv_rows,
    })
}

fn params(
    op: &'static str,
    dims: AttentionDims,
    scale: f32,
    causal: bool,
    dropout: Option<&DropoutMask>,
) -> Result<Vec<u8>> {
    let dropout = dropout.filter(|m| !m.is_identity());
    let mut w = vec![
        to_u32(op, "batch", dims.batch)?,
        to_u32(op, "n_heads", dims.n_heads)?,
        to_u32(op, "n_kv_heads", dims.n_kv_heads)?,
        to_u32(op, "seq_q", dims.seq_q)?,
        to_u32(op, "seq_k", dims.seq_k)?,
        to_u32(op, "d_head", dims.d_head)?,
        u32::from(causal),
        scale.to_bits(),
    ];
    match dropout {
        None => w.extend([0; 12]),
        Some(m) => {
            if !DropoutMask::is_valid_p(m.p) {
                return Err(GpuError::Shape {
                    op,
                    message: format!(
                        "dropout p = {}, expected a finite probability in [0, 1)",
                        m.p
                    ),
                });
            }
            // The shaders index the mask with a 32-bit element number.
            let bh = dims.batch * dims.n_heads;
            let mask_len = product(op, "batch · n_heads · seq_q", bh, dims.seq_q)
                .and_then(|r| product(op, "batch · n_heads · seq_q · seq_k", r, dims.seq_k))?;
            to_u32(
                op,
                "dropout elements (batch · n_heads · seq_q · seq_k)",
                mask_len,
            )?;
            w.extend([
                1,
                m.p.to_bits(),
                m.scale().to_bits(),
                m.offset as u32,
                (m.offset >> 32) as u32,
                m.stream[0],
                m.stream[1],
                m.key[0],
                m.key[1],
                0,
                0,
                0,
            ]);
        }
    }
    Ok(words(&w))
}

/// The grid for `n` invocations of the 64-wide attention kernels (the shaders flatten
/// `gid.x + gid.y · nwg.x · 64`).
fn grid(op: &'static str, n: usize) -> Result<[u32; 3]> {
    // grid_1d counts workgroups of WG_1D = 256; ask for 4n so that its groups number ⌈n / 64⌉.
    grid_1d(op, n.saturating_mul(WG_1D as usize / WG))
}

/// Forward: `out = softmax(scale · Q Kᵀ + mask) V` and the per-row logsumexp
/// `lse = log Σ_j exp(scale · q·k_j)` over the allowed keys. `q`: `[batch, n_heads, seq_q,
/// d_head]`, `k`, `v`: `[batch, n_kv_heads, seq_k, d_head]` f32, the sizes those of `dims`
/// (`dims.n_kv_heads` divides `dims.n_heads`); returns `(out, lse)` with
/// `out` shaped like `q` and `lse` `[batch, n_heads, seq_q]`. With `causal`, query `i` attends
/// key `j` iff `j <= i + (seq_k − seq_q)`; a query with no allowed key gets 0 and `lse = −inf`.
///
/// # Errors
/// [`GpuError::Shape`] when `n_heads`, `n_kv_heads` or `d_head` is 0, `n_heads` is not a
/// multiple of `n_kv_heads`, `d_head > 128`, a length disagrees with `dims`, or the element
/// counts overflow the shaders' 32-bit indices; device errors.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_forward(
    ctx: &GpuContext,
    q: &GpuBuffer,
    k: &GpuBuffer,
    v: &GpuBuffer,
    dims: AttentionDims,
    scale: f32,
    causal: bool,
) -> Result<(GpuBuffer, GpuBuffer)> {
    flash_attention_forward_with_dropout(ctx, q, k, v, dims, scale, causal, None)
}

/// [`flash_attention_forward`] with dropout on the attention probabilities (module docs):
/// `out = (P ⊙ M / (1 − p)) V`, `lse` the logsumexp of `P` without dropout. `None` or
/// `p == 0` is exactly [`flash_attention_forward`].
///
/// # Errors
/// As [`flash_attention_forward`], and [`GpuError::Shape`] when the mask's `p` is not a finite
/// probability in `[0, 1)` or `batch · n_heads · seq_q · seq_k` exceeds 32 bits.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_forward_with_dropout(
    ctx: &GpuContext,
    q: &GpuBuffer,
    k: &GpuBuffer,
    v: &GpuBuffer,
    dims: AttentionDims,
    scale: f32,
    causal: bool,
    dropout: Option<&DropoutMask>,
) -> Result<(GpuBuffer, GpuBuffer)> {
    let op = "flash_attention_forward";
    let s = sizes(op, dims)?;
    // One invocation per query row walks the keys, each with two loops over d_head (the score
    // and the output update), plus three loops over d_head outside (loop-header executions).
    within_loop_limit(ctx, op, || {
        let d = dims.d_head;
        let loops = dims
            .seq_k
            .saturating_mul(2 * d + 3)
            .saturating_add(3 * (d + 1) + 1);
        (
            loops,
            format!("{} keys of d_head {d} per query", dims.seq_k),
        )
    })?;
    expect_len(op, "q", q, s.q_len)?;
    expect_len(op, "k", k, s.kv_len)?;
    expect_len(op, "v", v, s.kv_len)?;
    let p = params(op, dims, scale, causal, dropout)?;
    let out = ctx.alloc(s.q_len)?;
    let lse = ctx.alloc(s.q_rows)?;
    if s.q_rows == 0 {
        return Ok((out, lse));
    }
    let kernel = Kernel::new(Family::FlashAttention, "flash_forward");
    let storage = [(0, q), (1, k), (2, v), (7, &out), (8, &lse)];
    dispatch_at(ctx, kernel, &storage, 13, &p, grid(op, s.q_rows)?)?;
    Ok((out, lse))
}

/// Backward: given the forward's inputs, its `out` and `lse`, and the upstream gradient `dout`
/// (shaped like `out`), returns `(dq, dk, dv)` shaped like `q`, `k`, `v`. `dk`/`dv` of a KV
/// head sum the contributions of its `n_heads / n_kv_heads` query heads in increasing head
/// order. Shapes, mask and errors as in [`flash_attention_forward`].
///
/// # Errors
/// As [`flash_attention_forward`], and when `out`, `lse` or `dout` disagree with `dims`.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_backward(
    ctx: &GpuContext,
    q: &GpuBuffer,
    k: &GpuBuffer,
    v: &GpuBuffer,
    out: &GpuBuffer,
    lse: &GpuBuffer,
    dout: &GpuBuffer,
    dims: AttentionDims,
    scale: f32,
    causal: bool,
) -> Result<(GpuBuffer, GpuBuffer, GpuBuffer)> {
    flash_attention_backward_with_dropout(ctx, q, k, v, out, lse, dout, dims, scale, causal, None)
}

/// [`flash_attention_backward`] with the dropout mask of the forward (module docs; `out` is
/// the dropped output): `dV = (P ⊙ Z)ᵀ dO`, `dP = (dO Vᵀ) ⊙ Z`, `dS = P ⊙ (dP − D)`. `None` or
/// `p == 0` is exactly [`flash_attention_backward`].
///
/// # Errors
/// As [`flash_attention_forward_with_dropout`] and [`flash_attention_backward`].
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_backward_with_dropout(
    ctx: &GpuContext,
    q: &GpuBuffer,
    k: &GpuBuffer,
    v: &GpuBuffer,
    out: &GpuBuffer,
    lse: &GpuBuffer,
    dout: &GpuBuffer,
    dims: AttentionDims,
    scale: f32,
    causal: bool,
    dropout: Option<&DropoutMask>,
) -> Result<(GpuBuffer, GpuBuffer, GpuBuffer)> {
    let op = "flash_attention_backward";
    let s = sizes(op, dims)?;
    // dQ: one invocation per query row walks the keys (three loops over d_head each); dK/dV:
    // one per key row walks the group's queries (the same). Loop-header executions, the larger.
    within_loop_limit(ctx, op, || {
        let (d, group) = (dims.d_head, dims.n_heads / dims.n_kv_heads);
        let steps = dims.seq_k.max(group.saturating_mul(dims.seq_q));
        let loops = steps
            .saturating_mul(3 * d + 4)
            .saturating_add(group + 2 * (d + 1) + 1);
        let what = format!(
            "{} keys, {} queries in groups of {group}, d_head {d}",
            dims.seq_k, dims.seq_q
        );
        (loops, what)
    })?;
    expect_len(op, "q", q, s.q_len)?;
    expect_len(op, "k", k, s.kv_len)?;
    expect_len(op, "v", v, s.kv_len)?;
    expect_len(op, "out", out, s.q_len)?;
    expect_len(op, "lse", lse, s.q_rows)?;
    expect_len(op, "dout", dout, s.q_len)?;
    let dq = ctx.alloc(s.q_len)?;
    let dk = ctx.alloc(s.kv_len)?;
    let dv = ctx.alloc(s.kv_len)?;
    let p = params(op, dims, scale, causal, dropout)?;
    let delta = ctx.alloc(s.q_rows)?;
    if s.q_rows > 0 {
        let kernel = Kernel::new(Family::FlashAttention, "flash_delta");
        dispatch_at(
            ctx,
            kernel,
            &[(3, out), (5, dout), (9, &delta)],
            13,
            &p,
            grid(op, s.q_rows)?,
        )?;
        let kernel = Kernel::new(Family::FlashAttention, "flash_dq");
        let storage = [
            (0, q),
            (1, k),
            (2, v),
            (4, lse),
            (5, dout),
            (6, &delta),
            (10, &dq),
        ];
        dispatch_at(ctx, kernel, &storage, 13, &p, grid(op, s.q_rows)?)?;
    }
    if s.kv_rows > 0 {
        if s.q_rows == 0 {
            // No query attends anything: the KV gradients are zero.
            ctx.write(&dk, &vec![0.0; s.kv_len])?;
            ctx.write(&dv, &vec![0.0; s.kv_len])?;
            return Ok((dq, dk, dv));
        }
        let kernel = Kernel::new(Family::FlashAttention, "flash_dkv");
        let storage = [
            (0, q),
            (1, k),
            (2, v),
            (4, lse),
            (5, dout),
            (6, &delta),
            (11, &dk),
            (12, &dv),
        ];
        dispatch_at(ctx, kernel, &storage, 13, &p, grid(op, s.kv_rows)?)?;
    }
    Ok((dq, dk, dv))
}
