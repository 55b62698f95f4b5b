//! One LLaMA-style transformer block:
//! `x + Wo·Attn(RoPE(Wq·n1(x)), RoPE(Wk·n1(x)), Wv·n1(x))`, then `x + W2·(SiLU(W1·n2(x)) ⊙ W3·n2(x))`.

use crate::attention::{causal_attention, flash_attention_with_layout, AttentionLayout};
use crate::error::Result;
use crate::layout::{self, Entry, LayerParam, Parameter, Slot};
use crate::linear::Linear;
use crate::policy::FullSequenceAttentionKind;
use riftco_autograd::{ops, CheckpointPass, Variable};
use riftco_kernels::rope::RopeTable;
use std::sync::Arc;

/// The parameters of one block (Hugging Face `LlamaDecoderLayer` names in comments; names,
/// shapes and order come from [`layout::PARAMETERS`]).
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
    /// Block `layer`, whose parameters `make` returns, called once per per-block row of
    /// [`layout::PARAMETERS`], in table order (so random draws follow the state-dict order).
    /// Linear layers start without adapters.
    ///
    /// # Errors
    /// The first error of `make`.
    pub fn try_from_rows(
        layer: usize,
        mut make: impl FnMut(Entry) -> Result<Variable>,
    ) -> Result<Self> {
        let mut values = Vec::with_capacity(layout::LAYER_ROWS);
        for row in layout::layer_rows() {
            values.push(make(row.at(layer))?);
        }
        // Index `i` holds the row of the `LayerParam` with index `i` (checked at compile time
        // in `layout`).
        let value = |p: LayerParam| values[p.index()].clone();
        let linear = |p: LayerParam| Linear::new(value(p));
        Ok(Self {
            attn_norm: value(LayerParam::AttnNorm),
            q: linear(LayerParam::Q),
            k: linear(LayerParam::K),
            v: linear(LayerParam::V),
            o: linear(LayerParam::O),
            mlp_norm: value(LayerParam::MlpNorm),
            gate: linear(LayerParam::Gate),
            up: linear(LayerParam::Up),
            down: linear(LayerParam::Down),
        })
    }

    /// The field holding a row's tensor.
    pub fn field(&self, p: LayerParam) -> Field<&Variable, &Linear> {
        match p {
            LayerParam::AttnNorm => Field::Norm(&self.attn_norm),
            LayerParam::Q => Field::Linear(&self.q),
            LayerParam::K => Field::Linear(&self.k),
            LayerParam::V => Field::Linear(&self.v),
            LayerParam::O => Field::Linear(&self.o),
            LayerParam::MlpNorm => Field::Norm(&self.mlp_norm),
            LayerParam::Gate => Field::Linear(&self.gate),
            LayerParam::Up => Field::Linear(&self.up),
            LayerParam::Down => Field::Linear(&self.down),
        }
    }

    /// Mutable [`Layer::field`].
    pub fn field_mut(&mut self, p: LayerParam) -> Field<&mut Variable, &mut Linear> {
        match p {
            LayerParam::AttnNorm => Field::Norm(&mut self.attn_norm),
            LayerParam::Q => Field::Linear(&mut self.q),
            LayerParam::K => Field::Linear(&mut self.k),
            LayerParam::V => Field::Linear(&mut self.v),
            LayerParam::O => Field::Linear(&mut self.o),
            LayerParam::MlpNorm => Field::Norm(&mut self.mlp_norm),
            LayerParam::Gate => Field::Linear(&mut self.gate),
            LayerParam::Up => Field::Linear(&mut self.up),
            LayerParam::Down => Field::Linear(&mut self.down),
        }
    }

    /// The base tensor of a row: the norm weight, or the linear layer's base weight.
    pub fn parameter(&self, p: LayerParam) -> &Variable {
        match self.field(p) {
            Field::Norm(v) => v,
            Field::Linear(l) => &l.weight,
        }
    }

    /// Mutable [`Layer::parameter`].
    pub fn parameter_mut(&mut self, p: LayerParam) -> &mut Variable {
        match self.field_mut(p) {
            Field::Norm(v) => v,
            Field::Linear(l) => &mut l.weight,
        }
    }

    /// The linear layers with their table rows, in table order.
    pub fn linears(&self) -> impl Iterator<Item = (&'static Parameter, &Linear)> {
        layout::layer_rows().filter_map(move |row| match row.slot {
            Slot::Layer(p) => match self.field(p) {
                Field::Linear(l) => Some((row, l)),
                Field::Norm(_) => None,
            },
            Slot::Model(_) => None,
        })
    }

    /// Calls `f` on every linear layer with its table row, in table order.
    ///
    /// # Errors
    /// The first error of `f`.
    pub fn try_for_each_linear_mut(
        &mut self,
        mut f: impl FnMut(&'static Parameter, &mut Linear) -> Result<()>,
    ) -> Result<()> {
        for row in layout::layer_rows() {
            if let Slot::Layer(p) = row.slot {
                if let Field::Linear(l) = self.field_mut(p) {
                    f(row, l)?;
                }
            }
        }
        Ok(())
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

/// The field of a [`Layer`] that holds one row's tensor.
#[derive(Debug)]
pub enum Field<N, L> {
    /// An RMSNorm weight.
    Norm(N),
    /// A linear layer (base weight and optional adapter).
    Linear(L),
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
