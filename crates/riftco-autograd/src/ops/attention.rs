//! Causal self-attention, materialized or as FlashAttention-2, dispatched in one place
//! ([`causal_attention`]).
//!
//! FlashAttention-2 is one differentiable primitive (Dao 2023, "FlashAttention-2", Algorithms 1
//! and 2). The forward keeps only the output and the per-row logsumexp (`[batch, heads, seq_q]`),
//! so retained memory is O(seq) per head instead of the O(seq²) probabilities of materialized
//! attention; the backward rematerializes scores and probabilities tile by tile from Q, K and the
//! logsumexp.
//!
//! Attention dropout (the `_with_dropout` variants) drops attention probabilities after the
//! softmax and before the product with V: `out = (P ⊙ M / (1 − p)) V`, with the counter-based
//! mask `M` of a [`DropoutMask`] over the index space `[batch, heads, seq_q, seq_k]` (row-major,
//! element `((b·H + h)·Sq + i)·Sk + j`) in both layouts and both kinds, so flash and materialized
//! attention drop exactly the same entries. Flash generates the mask per tile and regenerates it
//! in the backward; nothing of it is stored.

use super::dropout::DropoutMask;
use super::{backend, ACT, GRAD};
use crate::error::Result;
use crate::variable::{Saves, Variable};
pub use riftco_tensor::backend::AttentionLayout;
use riftco_tensor::backend::{check_dropout, AttentionDims};
use riftco_tensor::TensorError;

/// How attention over a full sequence is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionKind {
    /// Scores and probabilities `[batch, heads, seq_q, seq_k]` are materialized (and kept for
    /// the backward).
    Materialized,
    /// FlashAttention-2: tiled online softmax keeping only the per-row logsumexp.
    Flash,
}

/// `softmax(scale · Q·Kᵀ [+ causal mask]) · V` for `q [batch, heads, seq_q, d_head]` and
/// `k, v [batch, kv_heads, seq_k, d_head]`. With `causal`, query `i` sees keys
/// `j <= i + (seq_k − seq_q)`. Grouped-query attention (Ainslie et al. 2023) when
/// `kv_heads < heads`: query head `h` reads key/value head `h / (heads / kv_heads)` (Hugging
/// Face's `repeat_kv`), by index; the VJP sums the gradients of K and V over the query heads of
/// each group in a fixed order.
///
/// # Errors
/// Shape mismatch between `q`, `k`, `v`; `kv_heads` 0 or not dividing `heads`; `causal` with
/// `seq_q > seq_k`; operands on different devices.
pub fn flash_attention(
    q: &Variable,
    k: &Variable,
    v: &Variable,
    scale: f32,
    causal: bool,
) -> Result<Variable> {
    flash_attention_with_layout(q, k, v, AttentionLayout::BatchHeadSeq, scale, causal)
}

/// The attention dimensions of `q`, `k`, `v` in `layout`, validated.
fn attention_dims(
    q: &Variable,
    k: &Variable,
    v: &Variable,
    layout: AttentionLayout,
    causal: bool,
) -> Result<AttentionDims> {
    let (qd, kd) = (q.dims().to_vec(), k.dims().to_vec());
    // Axis indices of (batch, heads, seq, d_head) in this layout.
    let (h_ax, s_ax) = match layout {
        AttentionLayout::BatchHeadSeq => (1, 2),
        AttentionLayout::BatchSeqHead => (2, 1),
    };
    if qd.len() != 4
        || kd.len() != 4
        || qd[0] != kd[0]
        || qd[3] != kd[3]
        || v.dims() != kd.as_slice()
    {
        return Err(TensorError::ShapeMismatch {
            op: match layout {
                AttentionLayout::BatchHeadSeq => {
                    "flash_attention (q [b,h,sq,d], k and v [b,h_kv,sk,d])"
                }
                AttentionLayout::BatchSeqHead => {
                    "flash_attention (q [b,sq,h,d], k and v [b,sk,h_kv,d])"
                }
            },
            expected: qd,
            got: if v.dims() != kd.as_slice() {
                v.dims().to_vec()
            } else {
                kd
            },
        }
        .into());
    }
    let (n_heads, n_kv_heads) = (qd[h_ax], kd[h_ax]);
    if n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
        return Err(TensorError::InvalidArgument {
            op: "flash_attention",
            message: format!(
                "k and v have {n_kv_heads} heads (shape {kd:?}), which must be at least 1 and \
                 divide the {n_heads} query heads of q (shape {qd:?}) for grouped-query attention"
            ),
        }
        .into());
    }
    let dims = AttentionDims {
        batch: qd[0],
        n_heads,
        n_kv_heads,
        seq_q: qd[s_ax],
        seq_k: kd[s_ax],
        d_head: qd[3],
    };
    if dims.d_head == 0 {
        return Err(TensorError::InvalidArgument {
            op: "flash_attention",
            message: format!("d_head is 0 (q shape {qd:?}); attention needs d_head >= 1"),
        }
        .into());
    }
    if causal && dims.seq_q > dims.seq_k {
        return Err(TensorError::InvalidArgument {
            op: "flash_attention",
            message: format!(
                "causal attention with seq_q {} > seq_k {}",
                dims.seq_q, dims.seq_k
            ),
        }
        .into());
    }
    Ok(dims)
}

/// [`flash_attention`] with the tensors in `layout`: for
/// [`AttentionLayout::BatchSeqHead`], `q [batch, seq_q, heads, d_head]` and
/// `k, v [batch, seq_k, heads, d_head]`, and the output is `[batch, seq_q, heads, d_head]` — the
/// layout of a reshaped projection, so no transposition is needed before or after.
///
/// # Errors
/// As [`flash_attention`].
pub fn flash_attention_with_layout(
    q: &Variable,
    k: &Variable,
    v: &Variable,
    layout: AttentionLayout,
    scale: f32,
    causal: bool,
) -> Result<Variable> {
    flash_attention_with_dropout(q, k, v, layout, scale, causal, None)
}

/// [`flash_attention_with_layout`] with dropout on the attention probabilities:
/// `(P ⊙ M / (1 − p)) V` for the mask of `dropout` over `[batch, heads, seq_q, seq_k]` (see the
/// [module documentation](self)). The VJP regenerates the same mask. `None` or `p == 0` is
/// [`flash_attention_with_layout`].
///
/// # Errors
/// As [`flash_attention`]; [`TensorError::InvalidArgument`] naming `p` when it is not finite or
/// not in `[0, 1)`.
pub fn flash_attention_with_dropout(
    q: &Variable,
    k: &Variable,
    v: &Variable,
    layout: AttentionLayout,
    scale: f32,
    causal: bool,
    dropout: Option<DropoutMask>,
) -> Result<Variable> {
    check_dropout("flash_attention", dropout.as_ref())?;
    let dropout = dropout.filter(|m| !m.is_identity());
    let dims = attention_dims(q, k, v, layout, causal)?;
    let scores = [dims.batch, dims.n_heads, dims.seq_q, dims.seq_k];
    if dropout.is_some()
        && scores
            .iter()
            .try_fold(1usize, |a, &n| a.checked_mul(n))
            .is_none()
    {
        // The mask's element index would wrap: masks would repeat silently.
        return Err(TensorError::InvalidArgument {
            op: "flash_attention",
            message: format!(
                "attention dropout over [batch, heads, seq_q, seq_k] = {scores:?}: the number \
                 of attention probabilities overflows usize, so the mask cannot index them"
            ),
        }
        .into());
    }
    let be = backend("flash_attention", &[q, k, v])?;
    let (value, lse) = be.flash_attention_forward(
        "flash_attention",
        q.value(),
        k.value(),
        v.value(),
        dims,
        layout,
        scale,
        causal,
        dropout.as_ref(),
        ACT,
    )?;
    Ok(Variable::from_op_saving(
        "flash_attention",
        value,
        vec![q.clone(), k.clone(), v.clone()],
        Saves::parents(&[0, 1, 2]).and_output(),
        move |p, out, g| {
            let (dq, dk, dv) = be.flash_attention_backward(
                "flash_attention (vjp)",
                p[0].value(),
                p[1].value(),
                p[2].value(),
                out,
                &lse,
                g,
                dims,
                layout,
                scale,
                causal,
                dropout.as_ref(),
                GRAD,
            )?;
            Ok(vec![
                p[0].requires_grad().then_some(dq),
                p[1].requires_grad().then_some(dk),
                p[2].requires_grad().then_some(dv),
            ])
        },
    ))
}

/// Causal self-attention with softmax scale `1/√d_head` (Vaswani et al. 2017, eq. 1), computed
/// as `kind` says, for `q [.., seq_q, ..]` and `k, v [.., seq_k, ..]` in `layout` (query `i`
/// sees keys `j <= i + (seq_k − seq_q)`, so `seq_q < seq_k` attends over a cache of earlier
/// positions). The output has `q`'s shape.
///
/// Materialized attention multiplies per-head `[seq, d_head]` matrices (in
/// [`AttentionLayout::BatchSeqHead`] it swaps axes 1 and 2 before and after); flash attention
/// reads either layout directly.
///
/// # Errors
/// As [`flash_attention`].
pub fn causal_attention(
    q: &Variable,
    k: &Variable,
    v: &Variable,
    layout: AttentionLayout,
    kind: AttentionKind,
) -> Result<Variable> {
    causal_attention_with_dropout(q, k, v, layout, kind, None)
}

/// [`causal_attention`] with dropout on the attention probabilities (after the softmax, before
/// the product with V): `(P ⊙ M / (1 − p)) V`, where the mask of `dropout` covers
/// `[batch, heads, seq_q, seq_k]` row-major in both layouts, and both kinds drop the same
/// entries (materialized attention applies [`super::dropout()`] to its `[b, h, sq, sk]`
/// probabilities). `None` or `p == 0` is [`causal_attention`].
///
/// # Errors
/// As [`flash_attention`]; [`TensorError::InvalidArgument`] naming `p` when it is not finite or
/// not in `[0, 1)`.
pub fn causal_attention_with_dropout(
    q: &Variable,
    k: &Variable,
    v: &Variable,
    layout: AttentionLayout,
    kind: AttentionKind,
    dropout: Option<DropoutMask>,
) -> Result<Variable> {
    check_dropout("causal_attention", dropout.as_ref())?;
    let dims = attention_dims(q, k, v, layout, true)?;
    let scale = 1.0 / (dims.d_head as f32).sqrt();
    match (kind, layout) {
        (AttentionKind::Flash, _) => {
            flash_attention_with_dropout(q, k, v, layout, scale, true, dropout)
        }
        (AttentionKind::Materialized, AttentionLayout::BatchHeadSeq) => {
            materialized(q, k, v, scale, dropout)
        }
        (AttentionKind::Materialized, AttentionLayout::BatchSeqHead) => {
            let (q, k, v) = (
                super::swap_axes_1_2(q)?,
                super::swap_axes_1_2(k)?,
                super::swap_axes_1_2(v)?,
            );
            super::swap_axes_1_2(&materialized(&q, &k, &v, scale, dropout)?)
        }
    }
}

/// `softmax(scale · Q·Kᵀ + causal mask) · V` for `q [batch, heads, seq, d_head]` and
/// `k, v [batch, kv_heads, seq, d_head]`, from `bmm` and `causal_softmax`, with `dropout` (if
/// any) on the `[batch, heads, seq_q, seq_k]` probabilities.
///
/// Grouped-query attention without repeating K and V: the query heads of a group are
/// consecutive (`h = g·group + j`), so `q` viewed as `[batch, kv_heads, group·seq_q, d_head]`
/// (a free reshape) multiplies each key/value head once, and the scores viewed back as
/// `[batch, heads, seq_q, seq_k]` are exactly those of `repeat_kv`. The VJP of that `bmm` sums
/// `dK` and `dV` over the group's rows. With `kv_heads == heads` no reshape is recorded.
fn materialized(
    q: &Variable,
    k: &Variable,
    v: &Variable,
    scale: f32,
    dropout: Option<DropoutMask>,
) -> Result<Variable> {
    let (qd, kd) = (q.dims().to_vec(), k.dims().to_vec());
    let (b, h, sq, d, kvh, sk) = (qd[0], qd[1], qd[2], qd[3], kd[1], kd[2]);
    let grouped = kvh != h;
    let q = if grouped {
        super::reshape(q, [b, kvh, (h / kvh) * sq, d])?
    } else {
        q.clone()
    };
    let mut scores = super::bmm(&q, k, true)?;
    if grouped {
        scores = super::reshape(&scores, [b, h, sq, sk])?;
    }
    let mut probs = super::causal_softmax(&scores, scale, true)?;
    if let Some(mask) = dropout {
        probs = super::dropout(&probs, mask)?;
    }
    if !grouped {
        return super::bmm(&probs, v, false);
    }
    let probs = super::reshape(&probs, [b, kvh, (h / kvh) * sq, sk])?;
    super::reshape(&super::bmm(&probs, v, false)?, [b, h, sq, d])
}
