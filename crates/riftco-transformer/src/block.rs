//! One LLaMA-style transformer block:
//! `x + Wo·Attn(RoPE(Wq·n1(x)), RoPE(Wk·n1(x)), Wv·n1(x))`, then `x + W2·(SiLU(W1·n2(x)) ⊙ W3·n2(x))`.

use crate::attention::{causal_attention, flash_attention_with_layout, AttentionLayout};
use crate::error::Result;
use crate::linear::Linear;
use crate::policy::FullSequenceAttentionKind;
use riftco_autograd::{ops, CheckpointPass, Variable};
use riftco_kernels::rope::RopeTable;
use std::sync::Arc;

/// The parameters of one block (Hugging Face `LlamaDecoderLayer` names in comments).
#[derive(Clone, Debug)]
pub struct Layer {
    /// `input_layernorm.weight [d_model]`
    pub attn_norm: Variable,
    /// `self_attn.q_proj.weight [d_model, d_model]`
    pub q: Linear,
    /// `self_attn.k_proj.weight`
    pub k: Linear,
    /// `self_attn.v_proj.weight`
    pub v: Linear,
    /// `self_attn.o_proj.weight`
    pub o: Linear,
    /// `post_attention_layernorm.weight [d_model]`
    pub mlp_norm: Variable,
    /// `mlp.gate_proj.weight [d_ff, d_model]` (W1)
    pub gate: Linear,
    /// `mlp.up_proj.weight [d_ff, d_model]` (W3)
    pub up: Linear,
    /// `mlp.down_proj.weight [d_model, d_ff]` (W2)
    pub down: Linear,
}

impl Layer {
    /// The linear layers with their Hugging Face suffixes.
    pub fn linears(&self) -> [(&'static str, &Linear); 7] {
        [
            ("self_attn.q_proj", &self.q),
            ("self_attn.k_proj", &self.k),
            ("self_attn.v_proj", &self.v),
            ("self_attn.o_proj", &self.o),
            ("mlp.gate_proj", &self.gate),
            ("mlp.up_proj", &self.up),
            ("mlp.down_proj", &self.down),
        ]
    }

    /// Mutable access to the linear layers, same order as [`Layer::linears`].
    pub fn linears_mut(&mut self) -> [(&'static str, &mut Linear); 7] {
        [
            ("self_attn.q_proj", &mut self.q),
            ("self_attn.k_proj", &mut self.k),
            ("self_attn.v_proj", &mut self.v),
            ("self_attn.o_proj", &mut self.o),
            ("mlp.gate_proj", &mut self.gate),
            ("mlp.up_proj", &mut self.up),
            ("mlp.down_proj", &mut self.down),
        ]
    }

    /// Every leaf the block's forward reads: all base parameters plus every active LoRA
    /// parameter. These are the checkpoint dependencies: a replay
    /// reads all base parameters of the block and every active adapter parameter.
    pub fn forward_leaves(&self) -> Vec<Variable> {
        let mut v = vec![self.attn_norm.clone(), self.mlp_norm.clone()];
        for (_, l) in self.linears() {
            v.extend(l.forward_leaves());
        }
        v
    }
}

/// What a block needs besides its parameters.
#[derive(Clone, Debug)]
pub struct BlockContext {
    /// Batch size.
    pub batch: usize,
    /// Sequence length.
    pub seq: usize,
    /// Attention heads.
    pub n_heads: usize,
    /// Head width.
    pub d_head: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// RoPE table.
    pub rope: Arc<RopeTable>,
    /// Attention implementation.
    pub attention: FullSequenceAttentionKind,
}

/// The block's forward pass on `x [batch, seq, d_model]`.
///
/// # Errors
/// Shape errors from the ops.
pub fn block_forward(x: &Variable, layer: &Layer, ctx: &BlockContext) -> Result<Variable> {
    block_forward_for(x, layer, ctx, CheckpointPass::Forward)
}

/// [`block_forward`] as a checkpoint callable. On [`CheckpointPass::Replay`] the output value is
/// never read, so the MLP down projection and the residual add that only feed it are recorded
/// graph-only (their VJPs read only their inputs): the replay skips about a fifth of the block's
/// forward FLOPs and its gradients are the same bit for bit.
///
/// # Errors
/// Shape errors from the ops.
pub fn block_forward_for(
    x: &Variable,
    layer: &Layer,
    ctx: &BlockContext,
    pass: CheckpointPass,
) -> Result<Variable> {
    let (b, t, h, dh) = (ctx.batch, ctx.seq, ctx.n_heads, ctx.d_head);
    let d_model = h * dh;
    let n1 = ops::rms_norm(x, &layer.attn_norm, ctx.eps)?;
    // Projections reshaped to [batch, seq, heads, d_head] (free), RoPE on q and k.
    let heads = |lin: &Linear, rope: bool| -> Result<Variable> {
        let y = ops::reshape(&lin.forward(&n1)?, [b, t, h, dh])?;
        Ok(if rope {
            ops::rope(&y, &ctx.rope, 0)?
        } else {
            y
        })
    };
    let (q, k, v) = (
        heads(&layer.q, true)?,
        heads(&layer.k, true)?,
        heads(&layer.v, false)?,
    );
    let attn = match ctx.attention {
        // Flash attention reads and writes [batch, seq, heads, d_head] directly.
        FullSequenceAttentionKind::Flash => {
            let scale = 1.0 / (dh as f32).sqrt();
            flash_attention_with_layout(&q, &k, &v, AttentionLayout::BatchSeqHead, scale, true)?
        }
        // Materialized attention multiplies per-head [seq, d_head] matrices.
        FullSequenceAttentionKind::Materialized => {
            let (q, k, v) = (
                ops::swap_axes_1_2(&q)?,
                ops::swap_axes_1_2(&k)?,
                ops::swap_axes_1_2(&v)?,
            );
            ops::swap_axes_1_2(&causal_attention(&q, &k, &v, ctx.attention)?)?
        }
    };
    let attn = ops::reshape(&attn, [b, t, d_model])?;
    let x1 = ops::add(x, &layer.o.forward(&attn)?)?;
    let n2 = ops::rms_norm(&x1, &layer.mlp_norm, ctx.eps)?;
    let act = ops::swiglu(&layer.gate.forward(&n2)?, &layer.up.forward(&n2)?)?;
    Ok(match pass {
        CheckpointPass::Forward => ops::add(&x1, &layer.down.forward(&act)?)?,
        CheckpointPass::Replay => ops::add_graph_only(&x1, &layer.down.forward_graph_only(&act)?)?,
    })
}
