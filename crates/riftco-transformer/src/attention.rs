//! Causal self-attention, materialized or as FlashAttention-2.
//!
//! FlashAttention-2 is one differentiable primitive (Dao 2023, "FlashAttention-2", Algorithms 1
//! and 2). The forward keeps only the output and the per-row logsumexp (`[batch, heads, seq_q]`),
//! so retained memory is O(seq) per head instead of the O(seq²) probabilities of materialized
//! attention; the backward rematerializes scores and probabilities tile by tile from Q, K and the
//! logsumexp.

use crate::error::Result;
use crate::policy::FullSequenceAttentionKind;
use riftco_autograd::ops::{activation, buf, gradient};
use riftco_autograd::{ops, Variable};
pub use riftco_kernels::attention::AttentionLayout;
use riftco_kernels::attention::{
    flash_attention_backward_with_layout, flash_attention_forward_with_layout, AttentionDims,
};
use riftco_tensor::{MemoryCategory, Tensor, TensorError};

/// `softmax(scale · Q·Kᵀ [+ causal mask]) · V` for `q [batch, heads, seq_q, d_head]` and
/// `k, v [batch, heads, seq_k, d_head]`. With `causal`, query `i` sees keys
/// `j <= i + (seq_k − seq_q)`.
///
/// # Errors
/// Shape mismatch between `q`, `k`, `v`; `causal` with `seq_q > seq_k`.
pub fn flash_attention(
    q: &Variable,
    k: &Variable,
    v: &Variable,
    scale: f32,
    causal: bool,
) -> Result<Variable> {
    flash_attention_with_layout(q, k, v, AttentionLayout::BatchHeadSeq, scale, causal)
}

/// [`flash_attention`] with the tensors in `layout`: for
/// [`AttentionLayout::BatchSeqHead`], `q [batch, seq_q, heads, d_head]` and
/// `k, v [batch, seq_k, heads, d_head]`, and the output is `[batch, seq_q, heads, d_head]` — the
/// layout of a reshaped projection, so no transposition is needed before or after.
///
/// # Errors
/// Shape mismatch between `q`, `k`, `v`; `causal` with `seq_q > seq_k`.
pub fn flash_attention_with_layout(
    q: &Variable,
    k: &Variable,
    v: &Variable,
    layout: AttentionLayout,
    scale: f32,
    causal: bool,
) -> Result<Variable> {
    let (qd, kd) = (q.dims().to_vec(), k.dims().to_vec());
    // Axis indices of (batch, heads, seq, d_head) in this layout.
    let (h_ax, s_ax) = match layout {
        AttentionLayout::BatchHeadSeq => (1, 2),
        AttentionLayout::BatchSeqHead => (2, 1),
    };
    if qd.len() != 4
        || kd.len() != 4
        || qd[0] != kd[0]
        || qd[h_ax] != kd[h_ax]
        || qd[3] != kd[3]
        || v.dims() != kd.as_slice()
    {
        return Err(TensorError::ShapeMismatch {
            op: match layout {
                AttentionLayout::BatchHeadSeq => {
                    "flash_attention (q [b,h,sq,d], k and v [b,h,sk,d])"
                }
                AttentionLayout::BatchSeqHead => {
                    "flash_attention (q [b,sq,h,d], k and v [b,sk,h,d])"
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
    let dims = AttentionDims {
        batch: qd[0],
        n_heads: qd[h_ax],
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
    // Both are q's shape or a part of it (valid shapes: no product can wrap).
    let mut out = buf("flash_attention", q.value().numel())?;
    let mut lse = buf("flash_attention", dims.batch * dims.n_heads * dims.seq_q)?;
    flash_attention_forward_with_layout(
        &q.value().read(),
        &k.value().read(),
        &v.value().read(),
        dims,
        layout,
        scale,
        causal,
        &mut out,
        &mut lse,
    );
    let lse = Tensor::from_vec_unchecked(
        lse,
        [dims.batch, dims.n_heads, dims.seq_q].into(),
        MemoryCategory::Activation,
    );
    let value = activation(out, qd);
    Ok(Variable::from_op(
        "flash_attention",
        value,
        vec![q.clone(), k.clone(), v.clone()],
        move |p, out, g| {
            let (mut dq, mut dk, mut dv) = (
                buf("flash_attention (vjp)", p[0].value().numel())?,
                buf("flash_attention (vjp)", p[1].value().numel())?,
                buf("flash_attention (vjp)", p[2].value().numel())?,
            );
            flash_attention_backward_with_layout(
                &p[0].value().read(),
                &p[1].value().read(),
                &p[2].value().read(),
                &out.read(),
                &lse.read(),
                &g.read(),
                dims,
                layout,
                scale,
                causal,
                &mut dq,
                &mut dk,
                &mut dv,
            );
            Ok(vec![
                p[0].requires_grad()
                    .then(|| gradient(dq, p[0].value().shape().clone())),
                p[1].requires_grad()
                    .then(|| gradient(dk, p[1].value().shape().clone())),
                p[2].requires_grad()
                    .then(|| gradient(dv, p[2].value().shape().clone())),
            ])
        },
    ))
}

/// Causal self-attention of `q, k, v [batch, heads, seq, d_head]` with softmax scale
/// `1/√d_head` (Vaswani et al. 2017, eq. 1).
///
/// # Errors
/// Shape errors from the ops.
pub fn causal_attention(
    q: &Variable,
    k: &Variable,
    v: &Variable,
    kind: FullSequenceAttentionKind,
) -> Result<Variable> {
    let d_head = q.dims()[3];
    let scale = 1.0 / (d_head as f32).sqrt();
    match kind {
        FullSequenceAttentionKind::Materialized => {
            let scores = ops::bmm(q, k, true)?;
            let probs = ops::causal_softmax(&scores, scale, true)?;
            Ok(ops::bmm(&probs, v, false)?)
        }
        FullSequenceAttentionKind::Flash => flash_attention(q, k, v, scale, true),
    }
}
