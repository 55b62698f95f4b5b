//! The decoder-only transformer (LLaMA layout): token embedding →
//! L × block → RMSNorm → LM head, with a selectable attention kind and activation-checkpointing
//! policy.

use crate::block::{block_forward, block_forward_for, BlockContext, Layer};
use crate::config::TransformerConfig;
use crate::error::{Result, TransformerError};
use crate::linear::{Linear, LoraAdapter, LoraConfig};
use crate::policy::{ActivationCheckpointingKind, FullSequenceAttentionKind};
use riftco_autograd::{checkpoint_with_pass, ops, Variable};
use riftco_tensor::backend::RopeTable;
use riftco_tensor::{MemoryCategory, Rng, Tensor, TensorError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// All parameters of a model, shared (`Arc`) by the model, its training graphs and its decode
/// sessions, so each stays valid when the others are dropped.
#[derive(Clone, Debug)]
pub struct Weights {
    /// The configuration these weights were built for.
    pub config: TransformerConfig,
    /// `model.embed_tokens.weight [vocab, d_model]`
    pub embed: Variable,
    /// The blocks.
    pub layers: Vec<Arc<Layer>>,
    /// `model.norm.weight [d_model]`
    pub final_norm: Variable,
    /// `lm_head.weight [vocab, d_model]` (untied)
    pub lm_head: Variable,
    /// RoPE table for `max_seq_len` positions.
    pub rope: Arc<RopeTable>,
}

impl Weights {
    /// Every base parameter with its Hugging Face name, in state-dict order.
    pub fn named_base_parameters(&self) -> Vec<(String, Variable)> {
        let mut out = vec![("model.embed_tokens.weight".to_string(), self.embed.clone())];
        for (i, layer) in self.layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            out.push((
                format!("{p}.input_layernorm.weight"),
                layer.attn_norm.clone(),
            ));
            for (suffix, lin) in layer.linears().into_iter().take(4) {
                out.push((format!("{p}.{suffix}.weight"), lin.weight.clone()));
            }
            out.push((
                format!("{p}.post_attention_layernorm.weight"),
                layer.mlp_norm.clone(),
            ));
            for (suffix, lin) in layer.linears().into_iter().skip(4) {
                out.push((format!("{p}.{suffix}.weight"), lin.weight.clone()));
            }
        }
        out.push(("model.norm.weight".to_string(), self.final_norm.clone()));
        out.push(("lm_head.weight".to_string(), self.lm_head.clone()));
        out
    }

    /// Every LoRA parameter with its PEFT name (`base_model.model.<layer>.lora_A.weight`).
    pub fn named_lora_parameters(&self) -> Vec<(String, Variable)> {
        let mut out = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            for (suffix, lin) in layer.linears() {
                if let Some(l) = &lin.lora {
                    let base = format!("base_model.model.model.layers.{i}.{suffix}");
                    out.push((format!("{base}.lora_A.weight"), l.a.clone()));
                    out.push((format!("{base}.lora_B.weight"), l.b.clone()));
                }
            }
        }
        out
    }
}

/// The weights of a validated config. Every allocation is fallible, so a model that passes
/// [`TransformerConfig::validate`] but does not fit this machine is an out-of-memory error.
fn init_weights(config: &TransformerConfig) -> Result<Weights> {
    // The RoPE table first: it is not drawn from the generator, and a failure here costs nothing.
    let rope = RopeTable::try_new(config.max_seq_len, config.d_head(), config.rope_theta).map_err(
        |_| TensorError::OutOfMemory {
            op: "RoPE table",
            bytes: config
                .max_seq_len
                .saturating_mul(config.d_head())
                .saturating_mul(4),
        },
    )?;
    // Hugging Face Llama initialisation: N(0, 0.02) for embeddings and linear weights, ones for
    // RMSNorm weights. Drawn in state-dict order from one seeded generator.
    let mut rng = Rng::new(config.seed);
    let (d, ff, v) = (config.d_model, config.d_ff, config.vocab_size);
    let mut normal = |shape: [usize; 2], name: String| -> Result<Variable> {
        Ok(Variable::named_leaf(
            Tensor::try_randn_with(shape, 0.0, 0.02, &mut rng, MemoryCategory::Parameter)?,
            true,
            name,
        ))
    };
    let embed = normal([v, d], "model.embed_tokens.weight".into())?;
    let ones = |name: String| -> Result<Variable> {
        Ok(Variable::named_leaf(
            Tensor::try_ones([d], MemoryCategory::Parameter)?,
            true,
            name,
        ))
    };
    let mut layers = riftco_tensor::alloc::try_vec_with_capacity("model layers", config.n_layers)?;
    for i in 0..config.n_layers {
        let p = format!("model.layers.{i}");
        let attn_norm = ones(format!("{p}.input_layernorm.weight"))?;
        let q = Linear::new(normal([d, d], format!("{p}.self_attn.q_proj.weight"))?);
        let k = Linear::new(normal([d, d], format!("{p}.self_attn.k_proj.weight"))?);
        let v_ = Linear::new(normal([d, d], format!("{p}.self_attn.v_proj.weight"))?);
        let o = Linear::new(normal([d, d], format!("{p}.self_attn.o_proj.weight"))?);
        let mlp_norm = ones(format!("{p}.post_attention_layernorm.weight"))?;
        let gate = Linear::new(normal([ff, d], format!("{p}.mlp.gate_proj.weight"))?);
        let up = Linear::new(normal([ff, d], format!("{p}.mlp.up_proj.weight"))?);
        let down = Linear::new(normal([d, ff], format!("{p}.mlp.down_proj.weight"))?);
        layers.push(Arc::new(Layer {
            attn_norm,
            q,
            k,
            v: v_,
            o,
            mlp_norm,
            gate,
            up,
            down,
        }));
    }
    let final_norm = ones("model.norm.weight".into())?;
    let lm_head = normal([v, d], "lm_head.weight".into())?;
    Ok(Weights {
        rope: Arc::new(rope),
        config: config.clone(),
        embed,
        layers,
        final_norm,
        lm_head,
    })
}

/// A LLaMA-style decoder-only transformer.
///
/// ```
/// use riftco_transformer::{
///     ActivationCheckpointingKind, DecoderOnlyTransformer, FullSequenceAttentionKind,
///     TransformerConfig,
/// };
/// let config = TransformerConfig::new(256, 32, 4, 2, 64, 16);
/// let mut model = DecoderOnlyTransformer::new(
///     config,
///     FullSequenceAttentionKind::Flash,
///     ActivationCheckpointingKind::TransformerBlock,
/// )?;
/// let tokens: Vec<u32> = (0..2 * 9).map(|i| (i * 7 % 256) as u32).collect();
/// let loss = model.loss(&tokens, 2, 9)?; // [batch 2, seq + 1 = 9]
/// loss.backward()?;
/// model.set_activation_checkpointing_kind(ActivationCheckpointingKind::Disabled);
/// # Ok::<(), riftco_transformer::TransformerError>(())
/// ```
#[derive(Debug)]
pub struct DecoderOnlyTransformer {
    weights: Arc<Weights>,
    attention: FullSequenceAttentionKind,
    checkpointing: ActivationCheckpointingKind,
    block_calls: Arc<AtomicUsize>,
    revision: Arc<Revision>,
}

/// The structural revision of a model's weight set, shared with its decode sessions. Bumped by
/// every change that replaces the set ([`DecoderOnlyTransformer::enable_lora`],
/// [`DecoderOnlyTransformer::set_lora_active`], [`DecoderOnlyTransformer::merge_lora`],
/// [`DecoderOnlyTransformer::replace_weights`]): a session opened before holds the old set and
/// must not decode with it.
#[derive(Debug, Default)]
pub(crate) struct Revision(Mutex<(u64, &'static str)>);

impl Revision {
    /// The revision number and the change that last bumped it.
    pub(crate) fn get(&self) -> (u64, &'static str) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn bump(&self, change: &'static str) {
        let mut r = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *r = (r.0 + 1, change);
    }
}

impl DecoderOnlyTransformer {
    /// A model with freshly initialised weights (seeded by `config.seed`).
    ///
    /// # Errors
    /// [`TransformerError::Config`] for an invalid config (including one too large for
    /// addressable memory), `TensorError::OutOfMemory` when a weight cannot be allocated.
    pub fn new(
        config: TransformerConfig,
        attention: FullSequenceAttentionKind,
        checkpointing: ActivationCheckpointingKind,
    ) -> Result<Self> {
        config.validate()?;
        Ok(Self::from_weights(
            init_weights(&config)?,
            attention,
            checkpointing,
        ))
    }

    /// A model around existing weights (used by loading).
    pub fn from_weights(
        weights: Weights,
        attention: FullSequenceAttentionKind,
        checkpointing: ActivationCheckpointingKind,
    ) -> Self {
        Self {
            weights: Arc::new(weights),
            attention,
            checkpointing,
            block_calls: Arc::new(AtomicUsize::new(0)),
            revision: Arc::default(),
        }
    }

    /// Replaces the weight set; decode sessions opened before refuse to decode afterwards.
    fn set_weights(&mut self, weights: Weights, change: &'static str) {
        self.weights = Arc::new(weights);
        self.revision.bump(change);
    }

    /// The structural revision shared with decode sessions.
    pub(crate) fn revision(&self) -> &Arc<Revision> {
        &self.revision
    }

    /// The configuration.
    pub fn config(&self) -> &TransformerConfig {
        &self.weights.config
    }

    /// The shared weights.
    pub fn weights(&self) -> &Arc<Weights> {
        &self.weights
    }

    /// The attention kind of full-sequence (training) forwards.
    pub fn attention_kind(&self) -> FullSequenceAttentionKind {
        self.attention
    }

    /// Changes the attention kind of later forwards.
    pub fn set_attention_kind(&mut self, kind: FullSequenceAttentionKind) {
        self.attention = kind;
    }

    /// The activation-checkpointing policy.
    pub fn activation_checkpointing_kind(&self) -> ActivationCheckpointingKind {
        self.checkpointing
    }

    /// Changes the policy of later training forwards. Safe while decode sessions exist (decoding
    /// never checkpoints) and while older graphs are alive (they keep their own structure).
    pub fn set_activation_checkpointing_kind(&mut self, kind: ActivationCheckpointingKind) {
        self.checkpointing = kind;
    }

    /// How many times a block forward has run (original forwards plus checkpoint replays).
    /// Diagnostic for recompute accounting.
    pub fn block_forward_count(&self) -> usize {
        self.block_calls.load(Ordering::Relaxed)
    }

    /// Every base parameter with its Hugging Face name.
    pub fn named_parameters(&self) -> Vec<(String, Variable)> {
        self.weights.named_base_parameters()
    }

    /// The parameters an optimizer should update: LoRA A and B when adapters are active (base
    /// weights are frozen then), otherwise every base parameter.
    pub fn trainable_parameters(&self) -> Vec<Variable> {
        let mut v: Vec<Variable> = self
            .weights
            .named_base_parameters()
            .into_iter()
            .map(|(_, p)| p)
            .filter(|p| p.requires_grad())
            .collect();
        v.extend(
            self.weights
                .named_lora_parameters()
                .into_iter()
                .map(|(_, p)| p)
                .filter(|p| p.requires_grad()),
        );
        v
    }

    /// Logits `[batch·seq, vocab]` for tokens `[batch, seq]` (row-major), recording a training
    /// graph under the current policy.
    ///
    /// # Errors
    /// [`TransformerError::Tokens`] for bad token buffers (length, ids, `seq > max_seq_len`).
    pub fn logits(&self, tokens: &[u32], batch: usize, seq: usize) -> Result<Variable> {
        let w = &self.weights;
        let cfg = &w.config;
        cfg.validate_tokens(tokens, batch, seq)?;
        let x = ops::embedding(&w.embed, tokens)?;
        let mut x = ops::reshape(&x, [batch, seq, cfg.d_model])?;
        let ctx = BlockContext::new(cfg, &w.rope, batch, seq, self.attention);
        for (i, layer) in w.layers.iter().enumerate() {
            x = match self.checkpointing {
                ActivationCheckpointingKind::Disabled => {
                    self.block_calls.fetch_add(1, Ordering::Relaxed);
                    block_forward(&x, layer, &ctx)?
                }
                ActivationCheckpointingKind::TransformerBlock => {
                    let deps = layer.forward_leaves();
                    let (layer, ctx, calls) =
                        (layer.clone(), ctx.clone(), self.block_calls.clone());
                    checkpoint_with_pass(
                        &format!("model.layers.{i}"),
                        &x,
                        &deps,
                        move |x, pass| {
                            calls.fetch_add(1, Ordering::Relaxed);
                            block_forward_for(x, &layer, &ctx, pass).map_err(into_autograd)
                        },
                    )?
                }
            };
        }
        let x = ops::rms_norm(&x, &w.final_norm, cfg.rms_norm_eps)?;
        let x = ops::reshape(&x, [batch * seq, cfg.d_model])?;
        Ok(ops::linear(&x, &w.lm_head)?)
    }

    /// Mean next-token cross-entropy of a token block `[batch, seq + 1]`: inputs are
    /// `block[:, :-1]`, targets `block[:, 1:]`. A scalar Variable.
    ///
    /// # Errors
    /// [`TransformerError::Tokens`] for a bad block (`seq_plus_one < 2`, length),
    /// [`TransformerError::TokenOutOfVocabulary`] for an id `>= vocab_size` (named with its index
    /// in the block).
    pub fn loss(&self, block: &[u32], batch: usize, seq_plus_one: usize) -> Result<Variable> {
        if seq_plus_one < 2 {
            return Err(TransformerError::Tokens {
                message: format!("a token block needs seq + 1 >= 2 columns, got {seq_plus_one}"),
            });
        }
        if batch.checked_mul(seq_plus_one) != Some(block.len()) || batch == 0 {
            return Err(TransformerError::Tokens {
                message: format!(
                    "{} tokens do not form a block [batch {batch}, seq + 1 = {seq_plus_one}]",
                    block.len()
                ),
            });
        }
        let vocab = self.weights.config.vocab_size;
        if let Some((i, &t)) = block.iter().enumerate().find(|(_, &t)| t as usize >= vocab) {
            return Err(TransformerError::TokenOutOfVocabulary {
                token: t,
                index: Some(i),
                vocab_size: vocab,
            });
        }
        let seq = seq_plus_one - 1;
        let mut inputs = Vec::with_capacity(batch * seq);
        let mut targets = Vec::with_capacity(batch * seq);
        for row in block.chunks_exact(seq_plus_one) {
            inputs.extend_from_slice(&row[..seq]);
            targets.extend_from_slice(&row[1..]);
        }
        self.weights.config.validate_tokens(&targets, batch, seq)?;
        let logits = self.logits(&inputs, batch, seq)?;
        Ok(ops::cross_entropy(&logits, &targets)?)
    }

    /// Adds LoRA adapters to the target layers, activates them and freezes every base
    /// parameter (no weight gradient is computed for frozen weights). Graphs recorded before
    /// keep their own structure; decode sessions opened before refuse to decode afterwards
    /// ([`TransformerError::Decode`]: open a new one).
    ///
    /// # Errors
    /// [`TransformerError::Lora`] for invalid hyper-parameters or when adapters already exist.
    pub fn enable_lora(&mut self, lora: &LoraConfig) -> Result<()> {
        lora.validate(self.config().d_model)?;
        if self.has_lora() {
            return Err(TransformerError::Lora {
                message: "adapters already exist; merge or remove them first".into(),
            });
        }
        let mut rng = Rng::new(lora.seed);
        let mut w = freeze(&self.weights, true);
        for (i, layer) in w.layers.iter_mut().enumerate() {
            let layer = Arc::make_mut(layer);
            for (j, (suffix, lin)) in layer.linears_mut().into_iter().enumerate() {
                let wanted = if j < 4 {
                    lora.targets.attention
                } else {
                    lora.targets.mlp
                };
                if wanted {
                    let (o, inp) = lin.dims();
                    let name = format!("model.layers.{i}.{suffix}.weight");
                    lin.lora = Some(LoraAdapter::new(
                        &name, o, inp, lora.rank, lora.alpha, &mut rng,
                    )?);
                    lin.lora_active = true;
                }
            }
        }
        self.set_weights(w, "enable_lora");
        Ok(())
    }

    /// Whether adapters exist.
    pub fn has_lora(&self) -> bool {
        !self.weights.named_lora_parameters().is_empty()
    }

    /// Whether adapters exist and are active.
    pub fn lora_active(&self) -> bool {
        self.weights.layers.iter().any(|l| {
            l.linears()
                .iter()
                .any(|(_, lin)| lin.lora.is_some() && lin.lora_active)
        })
    }

    /// Activates or deactivates existing adapters (base weights stay frozen while adapters
    /// exist). A change makes decode sessions opened before refuse to decode
    /// ([`TransformerError::Decode`]); setting the state the adapters already have changes
    /// nothing.
    ///
    /// # Errors
    /// [`TransformerError::Lora`] when there are no adapters.
    pub fn set_lora_active(&mut self, active: bool) -> Result<()> {
        if !self.has_lora() {
            return Err(TransformerError::Lora {
                message: "the model has no adapters".into(),
            });
        }
        let unchanged = self.weights.layers.iter().all(|l| {
            l.linears()
                .iter()
                .all(|(_, lin)| lin.lora.is_none() || lin.lora_active == active)
        });
        if unchanged {
            return Ok(());
        }
        let mut w = (*self.weights).clone();
        for layer in w.layers.iter_mut() {
            for (_, lin) in Arc::make_mut(layer).linears_mut() {
                if lin.lora.is_some() {
                    lin.lora_active = active;
                }
            }
        }
        self.set_weights(w, "set_lora_active");
        Ok(())
    }

    /// Merges active adapters into the base weights (`W ← W + (alpha/r)·B·A`), removes them and
    /// makes every base parameter trainable again. Decode sessions opened before refuse to
    /// decode afterwards ([`TransformerError::Decode`]).
    ///
    /// # Errors
    /// [`TransformerError::Lora`] when there are no adapters.
    pub fn merge_lora(&mut self) -> Result<()> {
        if !self.has_lora() {
            return Err(TransformerError::Lora {
                message: "the model has no adapters".into(),
            });
        }
        let mut w = freeze(&self.weights, false);
        for layer in w.layers.iter_mut() {
            for (_, lin) in Arc::make_mut(layer).linears_mut() {
                if lin.lora.is_some() {
                    if lin.lora_active {
                        let merged = lin.effective_weight()?;
                        let (w, n) = (lin.weight.value(), merged.numel());
                        w.backend()?.copy_range("merge_lora", w, 0, &merged, 0, n)?;
                    }
                    lin.lora = None;
                    lin.lora_active = false;
                }
            }
        }
        self.set_weights(w, "merge_lora");
        Ok(())
    }

    /// Replaces the weights (used by loading state and adapters). Decode sessions opened before
    /// refuse to decode afterwards ([`TransformerError::Decode`]).
    pub fn replace_weights(&mut self, weights: Weights) {
        self.set_weights(weights, "replace_weights");
    }
}

/// New leaves for every base parameter, sharing storage, with `requires_grad = !frozen`.
fn freeze(w: &Weights, frozen: bool) -> Weights {
    let re = |v: &Variable| {
        let name = v.name().unwrap_or_default();
        Variable::named_leaf(v.value().clone(), !frozen, name)
    };
    let mut out = w.clone();
    out.embed = re(&w.embed);
    out.final_norm = re(&w.final_norm);
    out.lm_head = re(&w.lm_head);
    out.layers = w
        .layers
        .iter()
        .map(|l| {
            let mut l = (**l).clone();
            l.attn_norm = re(&l.attn_norm);
            l.mlp_norm = re(&l.mlp_norm);
            for (_, lin) in l.linears_mut() {
                lin.weight = re(&lin.weight);
            }
            Arc::new(l)
        })
        .collect();
    out
}

fn into_autograd(e: TransformerError) -> riftco_autograd::AutogradError {
    match e {
        TransformerError::Autograd(a) => a,
        other => riftco_autograd::AutogradError::external(other),
    }
}
