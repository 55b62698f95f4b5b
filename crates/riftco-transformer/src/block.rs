//! One LLaMA-style transformer block:
//! `x + Wo·Attn(RoPE(Wq·n1(x)), RoPE(Wk·n1(x)), Wv·n1(x))`, then `x + W2·(SiLU(W1·n2(x)) ⊙ W3·n2(x))`.

use crate::dropout::DropoutSite;
use crate::error::Result;
use crate::layout::{self, Entry, LayerParam, Parameter, Slot};
use crate::linear::Linear;
use crate::policy::FullSequenceAttentionKind;
use riftco_autograd::ops::{AttentionKind, AttentionLayout, DropoutMask};
use riftco_autograd::{named, ops, CheckpointPass, Variable};
use riftco_tensor::backend::RopeTable;
use riftco_tensor::{MemoryCategory, Shape, Tensor, TensorError};
use std::sync::Arc;

impl From<FullSequenceAttentionKind> for AttentionKind {
    fn from(kind: FullSequenceAttentionKind) -> Self {
        match kind {
            FullSequenceAttentionKind::Materialized => AttentionKind::Materialized,
            FullSequenceAttentionKind::Flash => AttentionKind::Flash,
        }
    }
}

/// The parameters of one block (Hugging Face `LlamaDecoderLayer` names in comments; names,
/// shapes and order come from [`layout::PARAMETERS`]).
#[derive(Clone, Debug)]
pub struct Layer {
    /// `input_layernorm.weight [d_model]`
    pub attn_norm: Variable,
    /// `self_attn.q_proj.weight [d_model, d_model]`
    pub q: Linear,
    /// `self_attn.k_proj.weight [n_kv_heads · d_head, d_model]`
    pub k: Linear,
    /// `self_attn.v_proj.weight [n_kv_heads · d_head, d_model]`
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
    /// Attention (query) heads.
    pub n_heads: usize,
    /// Key/value heads (grouped-query attention; `n_heads` for multi-head attention).
    pub n_kv_heads: usize,
    /// Head width.
    pub d_head: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// RoPE table.
    pub rope: Arc<RopeTable>,
    /// Attention implementation.
    pub attention: FullSequenceAttentionKind,
    /// The dropout of a training forward that records a graph (its key, and the probabilities;
    /// `layer` is set per block); `None` for forwards that never drop (evaluation, decoding,
    /// no probability above 0).
    pub dropout: Option<crate::dropout::BlockDropout>,
    /// The examples of each row of a packed batch ([`crate::packing`]); `None` when every row
    /// is one sequence.
    pub layout: Option<Arc<crate::packing::SequenceLayout>>,
}

/// The keys and values of one block for incremental decoding: `[max_seq_len, n_kv_heads,
/// d_head]` each (batch 1; grouped-query attention stores only the `n_kv_heads` key/value
/// heads, `n_heads / n_kv_heads` times less than multi-head attention), accounted as
/// activations on the device of the model.
#[derive(Debug)]
pub struct LayerKvCache {
    /// Keys after RoPE, position-major.
    pub k: Tensor,
    /// Values, position-major.
    pub v: Tensor,
}

impl LayerKvCache {
    /// A zeroed cache of `max_seq_len` positions of `n_kv_heads · d_head` elements on `device`.
    ///
    /// # Errors
    /// `ShapeOverflow` / `OutOfMemory` when it cannot be allocated.
    pub fn new(
        max_seq_len: usize,
        n_kv_heads: usize,
        d_head: usize,
        device: riftco_tensor::Device,
    ) -> Result<Self> {
        let op = "decode K/V cache";
        let shape = Shape::try_new(op, [max_seq_len, n_kv_heads, d_head])?;
        let be = riftco_tensor::backend::for_device(device)?;
        let zeros = || -> Result<Tensor> {
            let buffer = be.alloc(op, shape.numel(), Some(0.0))?;
            Ok(Tensor::from_buffer(
                buffer,
                shape.clone(),
                device,
                MemoryCategory::Activation,
            )?)
        };
        Ok(Self {
            k: zeros()?,
            v: zeros()?,
        })
    }

    /// Writes `k, v [1, t, kv_heads, d_head]` at positions `pos..pos + t` and returns the cached
    /// keys and values of positions `0..pos + t` as `[1, pos + t, heads, d_head]` constants.
    fn append(&self, k: &Variable, v: &Variable, pos: usize) -> Result<(Variable, Variable)> {
        let op = "decode K/V cache";
        let (t, row) = (k.dims()[1], k.dims()[2] * k.dims()[3]);
        let end = pos + t;
        let max = self.k.dims()[0];
        if end > max {
            return Err(TensorError::IndexOutOfRange {
                op,
                what: "position",
                index: end - 1,
                bound: max,
            }
            .into());
        }
        let be = riftco_tensor::backend_of(op, &[&self.k, k.value(), v.value()])?;
        let prefix = |cache: &Tensor, new: &Tensor| -> Result<Variable> {
            be.copy_range(op, cache, pos * row, new, 0, t * row)?;
            let shape = Shape::try_new(op, [1, end, k.dims()[2], k.dims()[3]])?;
            let buffer = be.alloc(op, shape.numel(), None)?;
            let out = Tensor::from_buffer(buffer, shape, be.device(), MemoryCategory::Activation)?;
            be.copy_range(op, &out, 0, cache, 0, end * row)?;
            Ok(Variable::constant(out))
        };
        Ok((prefix(&self.k, k.value())?, prefix(&self.v, v.value())?))
    }
}

impl BlockContext {
    /// The context of `config`'s blocks for inputs `[batch, seq, d_model]`.
    pub fn new(
        config: &crate::TransformerConfig,
        rope: &Arc<RopeTable>,
        batch: usize,
        seq: usize,
        attention: FullSequenceAttentionKind,
    ) -> Self {
        Self {
            batch,
            seq,
            n_heads: config.n_heads,
            n_kv_heads: config.n_kv_heads,
            d_head: config.d_head(),
            eps: config.rms_norm_eps,
            rope: rope.clone(),
            attention,
            dropout: None,
            layout: None,
        }
    }

    /// This context for block `layer` (the index that goes into its dropout streams).
    pub fn at_layer(&self, layer: usize) -> Self {
        Self {
            dropout: self.dropout.map(|d| d.for_layer(layer)),
            ..self.clone()
        }
    }
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
    block_forward_impl(x, layer, ctx, pass, None)
}

/// [`block_forward`] of `x [1, t, d_model]` at positions `pos..pos + t` against a K/V cache:
/// the new keys and values are written into `cache`, and the queries attend over every cached
/// position up to their own (incremental decoding; run without a graph). The same forward
/// definition as training, so decoding and the full-sequence forward cannot drift apart.
///
/// # Errors
/// Shape errors from the ops; `IndexOutOfRange` when `pos + t` exceeds the cache.
pub fn block_forward_cached(
    x: &Variable,
    layer: &Layer,
    ctx: &BlockContext,
    cache: &LayerKvCache,
    pos: usize,
) -> Result<Variable> {
    block_forward_impl(x, layer, ctx, CheckpointPass::Forward, Some((cache, pos)))
}

fn block_forward_impl(
    x: &Variable,
    layer: &Layer,
    ctx: &BlockContext,
    pass: CheckpointPass,
    cache: Option<(&LayerKvCache, usize)>,
) -> Result<Variable> {
    let (b, t, h, dh) = (ctx.batch, ctx.seq, ctx.n_heads, ctx.d_head);
    let kvh = ctx.n_kv_heads;
    let d_model = h * dh;
    let start_pos = cache.map_or(0, |(_, pos)| pos);
    // Dropout masks of this training forward: a pure function of (key, [site, layer]), so a
    // checkpoint replay draws exactly the forward's masks. Decoding never drops.
    let drop = ctx.dropout.filter(|_| cache.is_none());
    // A packed batch rotates and attends per example (RoPE then runs inside the attention).
    let packed = ctx.layout.as_deref().filter(|_| cache.is_none());
    let mask = |site: DropoutSite, p: f32| {
        drop.map(|d| DropoutMask {
            p,
            key: d.key,
            stream: d.stream(site),
            offset: 0,
        })
    };
    let lora_mask = |site: DropoutSite| drop.and_then(|d| mask(site, d.lora));
    // Every value a selective checkpoint may save is named (`checkpointing::BLOCK_VALUE_NAMES`).
    let n1 = named("attn_norm", &[x], || {
        ops::rms_norm(x, &layer.attn_norm, ctx.eps)
    })?;
    // Projections reshaped to [batch, seq, heads, d_head] (free; k and v have n_kv_heads
    // heads), RoPE on q and k.
    let heads = |lin: &Linear, name: &str, site, rope: Option<&str>| -> Result<Variable> {
        let n = if name == "q" { h } else { kvh };
        // The projection's own handle goes at once: when RoPE follows, nothing reads the
        // unrotated value at backward and the graph releases it.
        let y = ops::reshape(
            &lin.forward_with_lora_dropout(Some(name), &n1, lora_mask(site))?,
            [b, t, n, dh],
        )?;
        Ok(match rope.filter(|_| packed.is_none()) {
            Some(rope_name) => named(rope_name, &[&y], || ops::rope(&y, &ctx.rope, start_pos))?,
            None => y,
        })
    };
    let (q, k, v) = (
        heads(&layer.q, "q", DropoutSite::LoraQ, Some("q_rope"))?,
        heads(&layer.k, "k", DropoutSite::LoraK, Some("k_rope"))?,
        heads(&layer.v, "v", DropoutSite::LoraV, None)?,
    );
    let (k, v) = match cache {
        Some((cache, pos)) => cache.append(&k, &v, pos)?,
        None => (k, v),
    };
    // [batch, seq, heads, d_head] in and out (k, v with n_kv_heads heads, read by index for
    // grouped-query attention): flash attention reads this layout directly.
    let attn_mask = drop.and_then(|d| mask(DropoutSite::AttentionProbabilities, d.attention));
    let attn = named("attention", &[&q, &k, &v], || match packed {
        Some(layout) => crate::packing::packed_attention(&q, &k, &v, ctx, layout, attn_mask),
        None => ops::causal_attention_with_dropout(
            &q,
            &k,
            &v,
            AttentionLayout::BatchSeqHead,
            ctx.attention.into(),
            attn_mask,
        ),
    })?;
    let attn = ops::reshape(&attn, [b, t, d_model])?;
    let residual = |site| drop.and_then(|d| mask(site, d.residual));
    let o = layer
        .o
        .forward_with_lora_dropout(Some("o"), &attn, lora_mask(DropoutSite::LoraO))?;
    let o = match residual(DropoutSite::AttentionResidual) {
        Some(m) => ops::dropout(&o, m)?,
        None => o,
    };
    let x1 = ops::add(x, &o)?;
    let n2 = named("mlp_norm", &[&x1], || {
        ops::rms_norm(&x1, &layer.mlp_norm, ctx.eps)
    })?;
    let (gate, up) = (
        layer.gate.forward_with_lora_dropout(
            Some("gate"),
            &n2,
            lora_mask(DropoutSite::LoraGate),
        )?,
        layer
            .up
            .forward_with_lora_dropout(Some("up"), &n2, lora_mask(DropoutSite::LoraUp))?,
    );
    let act = named("swiglu", &[&gate, &up], || ops::swiglu(&gate, &up))?;
    let (down_mask, mlp_mask) = (
        lora_mask(DropoutSite::LoraDown),
        residual(DropoutSite::MlpResidual),
    );
    Ok(match pass {
        CheckpointPass::Forward => {
            let down = layer
                .down
                .forward_with_lora_dropout(None, &act, down_mask)?;
            let down = match mlp_mask {
                Some(m) => ops::dropout(&down, m)?,
                None => down,
            };
            ops::add(&x1, &down)?
        }
        CheckpointPass::Replay => {
            let down = layer
                .down
                .forward_graph_only_with_lora_dropout(&act, down_mask)?;
            let down = match mlp_mask {
                Some(m) => ops::dropout_graph_only(&down, m)?,
                None => down,
            };
            ops::add_graph_only(&x1, &down)?
        }
    })
}
