//! FlashAttention-2 (Dao 2023, Algorithms 1 and 2) of the GPU backend
//! (`kernels::flash_attention_*_with_dropout`). The kernels read `[batch, heads, seq, d_head]`;
//! for [`AttentionLayout::BatchSeqHead`] the operands are transposed (axes 1 and 2) before and
//! the results after, bitwise copies. `lse` is `[batch, n_heads, seq_q]` in either layout, and
//! the dropout mask is over the `[batch, n_heads, seq_q, seq_k]` index space, as on the CPU.
//! Keys and values have `dims.n_kv_heads` heads (grouped-query attention: query head `h` reads
//! key/value head `h / (n_heads / n_kv_heads)`; the kernels map the index, nothing is repeated).

use riftco_tensor::backend::{AttentionDims, AttentionLayout, DropoutMask, Pair};
use riftco_tensor::{MemoryCategory, Result, Shape, Tensor};

use super::{linalg, GpuBackend};
use crate::kernels;

/// `x` (with `heads` heads) in `[batch, heads, seq, d_head]`: itself, or its transpose from
/// `[batch, seq, heads, d_head]`.
#[allow(clippy::too_many_arguments)]
fn to_bhsd(
    g: &GpuBackend,
    op: &'static str,
    x: &Tensor,
    layout: AttentionLayout,
    dims: AttentionDims,
    heads: usize,
    seq: usize,
) -> Result<Tensor> {
    match layout {
        AttentionLayout::BatchHeadSeq => Ok(x.clone()),
        AttentionLayout::BatchSeqHead => linalg::transpose_0213(
            g,
            op,
            x,
            [dims.batch, seq, heads, dims.d_head],
            MemoryCategory::Workspace,
        ),
    }
}

#[allow(clippy::too_many_arguments)]
/// A kernel result in `[batch, heads, seq, d_head]` as a tensor of `like`'s shape in `layout`.
fn from_bhsd(
    g: &GpuBackend,
    op: &'static str,
    buf: crate::GpuBuffer,
    like: &Tensor,
    layout: AttentionLayout,
    dims: AttentionDims,
    heads: usize,
    seq: usize,
    c: MemoryCategory,
) -> Result<Tensor> {
    let heads_first = [dims.batch, heads, seq, dims.d_head];
    match layout {
        AttentionLayout::BatchHeadSeq => g.tensor(buf, like.shape().clone(), c),
        AttentionLayout::BatchSeqHead => {
            let t = g.tensor(buf, Shape::from(heads_first), MemoryCategory::Workspace)?;
            let back = linalg::transpose_0213(g, op, &t, heads_first, c)?;
            back.reshape(like.dims().to_vec())
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn forward(
    g: &GpuBackend,
    op: &'static str,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    dims: AttentionDims,
    layout: AttentionLayout,
    scale: f32,
    causal: bool,
    dropout: Option<&DropoutMask>,
    c: MemoryCategory,
) -> Result<Pair> {
    riftco_tensor::backend::check_dropout(op, dropout)?;
    let (h, kvh) = (dims.n_heads, dims.n_kv_heads);
    let qh = to_bhsd(g, op, q, layout, dims, h, dims.seq_q)?;
    let kh = to_bhsd(g, op, k, layout, dims, kvh, dims.seq_k)?;
    let vh = to_bhsd(g, op, v, layout, dims, kvh, dims.seq_k)?;
    let r = g.read(op, &[&qh, &kh, &vh])?;
    let (out, lse) = kernels::flash_attention_forward_with_dropout(
        &g.ctx,
        r.get(0),
        r.get(1),
        r.get(2),
        dims,
        scale,
        causal,
        dropout,
    )
    .map_err(g.err(op))?;
    drop(r);
    let out = from_bhsd(g, op, out, q, layout, dims, h, dims.seq_q, c)?;
    let lse = g.tensor(lse, Shape::from([dims.batch, dims.n_heads, dims.seq_q]), c)?;
    Ok((out, lse))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn backward(
    g: &GpuBackend,
    op: &'static str,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    lse: &Tensor,
    dout: &Tensor,
    dims: AttentionDims,
    layout: AttentionLayout,
    scale: f32,
    causal: bool,
    dropout: Option<&DropoutMask>,
    c: MemoryCategory,
) -> Result<(Tensor, Tensor, Tensor)> {
    riftco_tensor::backend::check_dropout(op, dropout)?;
    let (sq, sk) = (dims.seq_q, dims.seq_k);
    let (h, kvh) = (dims.n_heads, dims.n_kv_heads);
    let qh = to_bhsd(g, op, q, layout, dims, h, sq)?;
    let kh = to_bhsd(g, op, k, layout, dims, kvh, sk)?;
    let vh = to_bhsd(g, op, v, layout, dims, kvh, sk)?;
    let oh = to_bhsd(g, op, out, layout, dims, h, sq)?;
    let dh = to_bhsd(g, op, dout, layout, dims, h, sq)?;
    let r = g.read(op, &[&qh, &kh, &vh, &oh, lse, &dh])?;
    let (dq, dk, dv) = kernels::flash_attention_backward_with_dropout(
        &g.ctx,
        r.get(0),
        r.get(1),
        r.get(2),
        r.get(3),
        r.get(4),
        r.get(5),
        dims,
        scale,
        causal,
        dropout,
    )
    .map_err(g.err(op))?;
    drop(r);
    Ok((
        from_bhsd(g, op, dq, q, layout, dims, h, sq, c)?,
        from_bhsd(g, op, dk, k, layout, dims, kvh, sk, c)?,
        from_bhsd(g, op, dv, v, layout, dims, kvh, sk, c)?,
    ))
}
