//! The decoder-only transformer (LLaMA layout): token embedding →
//! L × block → RMSNorm → LM head, with a selectable attention kind and activation-checkpointing
//! policy.

use crate::block::{BlockContext, Layer};
use crate::checkpointing::{planner, ActivationCheckpointing, CheckpointPlan};
use crate::config::TransformerConfig;
use crate::error::{Result, TransformerError};
use crate::frozen_dtype::WeightDtype;
use crate::head::LossChunking;
use crate::layout::{self, Entry, Init, ModelParam, Place, Slot};
use crate::linear::{Linear, LoraAdapter, LoraConfig};
use crate::policy::{ActivationCheckpointingKind, FullSequenceAttentionKind};
use crate::residency::{self, AcquireReason, ResidencyUnit, SharedResidency};
use riftco_autograd::{ops, DeterminismCheck, Variable};
use riftco_tensor::backend::RopeTable;
use riftco_tensor::{MemoryCategory, Rng, Tensor, TensorError};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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
    /// `lm_head.weight [vocab, d_model]`; with `config.tie_word_embeddings` this is the same
    /// leaf as [`Weights::embed`] (one parameter, one gradient: the sum of the embedding gather's
    /// and the LM head's VJPs), and no separate tensor exists.
    pub lm_head: Variable,
    /// RoPE table for `max_seq_len` positions.
    pub rope: Arc<RopeTable>,
}

impl Weights {
    /// Weights for `config` whose tensors `make` returns, called once per entry of
    /// [`layout::entries_for`], in that (Hugging Face state-dict) order (so a tied config's
    /// `make` is never asked for `lm_head.weight`).
    ///
    /// # Errors
    /// The first error of `make`; `TensorError::OutOfMemory` when the layer list cannot be
    /// allocated.
    pub fn try_from_entries(
        config: &TransformerConfig,
        rope: Arc<RopeTable>,
        mut make: impl FnMut(Entry) -> Result<Variable>,
    ) -> Result<Self> {
        let mut model: Vec<Variable> = Vec::with_capacity(layout::MODEL_ROWS);
        let mut layers =
            riftco_tensor::alloc::try_vec_with_capacity("model layers", config.n_layers)?;
        let mut layers_built = false;
        let tied = config.tie_word_embeddings;
        for row in layout::PARAMETERS.iter() {
            match row.slot {
                // Filled below with the embedding's leaf.
                Slot::Model(ModelParam::LmHead) if tied => {
                    model.push(model[ModelParam::Embedding.index()].clone())
                }
                Slot::Model(_) => model.push(make(row.at(0))?),
                // The per-block rows are contiguous: every block is built at the first of them.
                Slot::Layer(_) if !layers_built => {
                    layers_built = true;
                    for i in 0..config.n_layers {
                        layers.push(Arc::new(Layer::try_from_rows(i, &mut make)?));
                    }
                }
                Slot::Layer(_) => {}
            }
        }
        // Index `i` holds the row of the `ModelParam` with index `i` (checked at compile time in
        // `layout`).
        let value = |p: ModelParam| model[p.index()].clone();
        let mut w = Self {
            config: config.clone(),
            embed: value(ModelParam::Embedding),
            layers,
            final_norm: value(ModelParam::FinalNorm),
            lm_head: value(ModelParam::LmHead),
            rope,
        };
        w.retie();
        Ok(w)
    }

    /// With a tied config, points the LM head at the embedding's leaf (after the embedding
    /// leaf was replaced).
    pub(crate) fn retie(&mut self) {
        if self.config.tie_word_embeddings {
            self.lm_head = self.embed.clone();
        }
    }

    /// The tensor of a model-level row.
    pub fn model_parameter(&self, p: ModelParam) -> &Variable {
        match p {
            ModelParam::Embedding => &self.embed,
            ModelParam::FinalNorm => &self.final_norm,
            ModelParam::LmHead => &self.lm_head,
        }
    }

    fn model_parameter_mut(&mut self, p: ModelParam) -> &mut Variable {
        match p {
            ModelParam::Embedding => &mut self.embed,
            ModelParam::FinalNorm => &mut self.final_norm,
            ModelParam::LmHead => &mut self.lm_head,
        }
    }

    /// The base tensor at `place`; `None` for a block index past the last block.
    pub fn parameter(&self, place: Place) -> Option<&Variable> {
        match place {
            Place::Model(p) => Some(self.model_parameter(p)),
            Place::Layer(i, p) => self.layers.get(i).map(|l| l.parameter(p)),
        }
    }

    /// Mutable [`Weights::parameter`]; a block shared with other weight sets is copied first.
    pub(crate) fn parameter_mut(&mut self, place: Place) -> Option<&mut Variable> {
        match place {
            Place::Model(p) => Some(self.model_parameter_mut(p)),
            Place::Layer(i, p) => self
                .layers
                .get_mut(i)
                .map(|l| Arc::make_mut(l).parameter_mut(p)),
        }
    }

    /// Every base parameter with its layout entry, in state-dict order (a tied LM head is the
    /// embedding and is listed once, as `model.embed_tokens.weight`).
    pub fn base_parameters(&self) -> impl Iterator<Item = (Entry, &Variable)> {
        layout::entries_for(&self.config)
            .filter_map(move |e| self.parameter(e.place).map(|v| (e, v)))
    }

    /// Every linear layer with its layout entry, in state-dict order.
    pub fn linears(&self) -> impl Iterator<Item = (Entry, &Linear)> {
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(i, l)| l.linears().map(move |(row, lin)| (row.at(i), lin)))
    }

    /// Every base parameter with its Hugging Face name, in state-dict order.
    pub fn named_base_parameters(&self) -> Vec<(String, Variable)> {
        self.base_parameters()
            .map(|(e, v)| (e.hf_name(), v.clone()))
            .collect()
    }

    /// Every LoRA parameter with its PEFT name (`base_model.model.<layer>.lora_A.weight`).
    pub fn named_lora_parameters(&self) -> Vec<(String, Variable)> {
        let mut out = Vec::new();
        for (e, lin) in self.linears() {
            if let Some(l) = &lin.lora {
                let [a, b] = e.peft_lora_names();
                out.push((a, l.a.clone()));
                out.push((b, l.b.clone()));
            }
        }
        out
    }
}

/// The weights of a validated config. Every allocation is fallible, so a model that passes
/// [`TransformerConfig::validate`] but does not fit this machine is an out-of-memory error.
fn init_weights(config: &TransformerConfig) -> Result<Weights> {
    // The RoPE table first: it is not drawn from the generator, and a failure here costs nothing.
    let rope = rope_table(config)?;
    // Each parameter by its layout row's rule, drawn in state-dict order from one seeded
    // generator.
    let mut rng = Rng::new(config.seed);
    Weights::try_from_entries(config, rope, |e| {
        let shape = e.shape(config);
        let tensor = match e.parameter.init {
            Init::Normal { std } => {
                Tensor::try_randn_with(shape, 0.0, std, &mut rng, MemoryCategory::Parameter)?
            }
            Init::Ones => Tensor::try_ones(shape, MemoryCategory::Parameter)?,
        };
        Ok(Variable::named_leaf(tensor, true, e.hf_name()))
    })
}

/// The RoPE table of `config` for `max_seq_len` positions.
pub(crate) fn rope_table(config: &TransformerConfig) -> Result<Arc<RopeTable>> {
    let inv_freq = config
        .rope_scaling
        .inverse_frequencies(config.d_head(), config.rope_theta);
    let rope =
        RopeTable::try_from_inverse_frequencies(config.max_seq_len, &inv_freq).map_err(|_| {
            TensorError::OutOfMemory {
                op: "RoPE table",
                bytes: config
                    .max_seq_len
                    .saturating_mul(config.d_head())
                    .saturating_mul(4),
            }
        })?;
    Ok(Arc::new(rope))
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
pub struct DecoderOnlyTransformer {
    pub(crate) weights: Arc<Weights>,
    attention: FullSequenceAttentionKind,
    checkpointing: ActivationCheckpointing,
    /// What every checkpoint of the policy compares at replay (not part of model state).
    determinism_check: DeterminismCheck,
    /// The last resolved plans (most recent first, at most [`PLAN_CACHE_SIZE`]) and what each
    /// was resolved for.
    plans: Mutex<Vec<(PlanKey, Arc<CheckpointPlan>)>>,
    block_calls: Arc<AtomicUsize>,
    revision: Arc<Revision>,
    /// Training mode (default true; see [`DecoderOnlyTransformer::set_training`]).
    pub(crate) training: bool,
    /// Training forwards that dropped so far (see [`DecoderOnlyTransformer::dropout_step`]).
    pub(crate) dropout_step: AtomicU64,
    /// How the training loss computes the LM head and cross-entropy (not part of model state).
    pub(crate) loss_chunking: LossChunking,
    /// The owner of the parameters between uses ([`crate::residency`]); `None`: always resident.
    pub(crate) residency: Option<SharedResidency>,
}

impl std::fmt::Debug for DecoderOnlyTransformer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecoderOnlyTransformer")
            .field("config", &self.weights.config)
            .field("attention", &self.attention)
            .field("checkpointing", &self.checkpointing)
            .field("training", &self.training)
            .field("loss_chunking", &self.loss_chunking)
            .field("residency", &self.residency.is_some())
            .finish_non_exhaustive()
    }
}

/// How many resolved plans a model keeps: training that alternates a few shapes (a smaller last
/// batch, several sequence lengths) plans each shape once.
const PLAN_CACHE_SIZE: usize = 8;

/// What a resolved plan depends on: the policy, the input shape, the attention kind and the
/// weight set's revision (LoRA changes what a block retains).
#[derive(Clone, Debug, PartialEq)]
struct PlanKey {
    policy: ActivationCheckpointing,
    batch: usize,
    seq: usize,
    attention: FullSequenceAttentionKind,
    revision: u64,
    device: riftco_tensor::Device,
    /// Attention, residual and LoRA dropout probabilities (dropout changes what a block keeps).
    dropout: [u32; 3],
    /// The loss's head (the planner measures it).
    loss_chunking: LossChunking,
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

/// The label that marks a position as no target in
/// [`DecoderOnlyTransformer::loss_with_labels`]: PyTorch's `cross_entropy(ignore_index=-100)`
/// default and Hugging Face's label convention.
pub const IGNORE_INDEX: i64 = -100;

impl DecoderOnlyTransformer {
    /// A model with freshly initialised weights (seeded by `config.seed`).
    ///
    /// # Errors
    /// [`TransformerError::Config`] for an invalid config (including one too large for
    /// addressable memory) or a policy that does not fit it
    /// ([`ActivationCheckpointing::validate`]), `TensorError::OutOfMemory` when a weight cannot
    /// be allocated.
    pub fn new(
        config: TransformerConfig,
        attention: FullSequenceAttentionKind,
        checkpointing: impl Into<ActivationCheckpointing>,
    ) -> Result<Self> {
        config.validate()?;
        let checkpointing = checkpointing.into();
        checkpointing.validate(config.n_layers)?;
        Ok(Self::from_weights(
            init_weights(&config)?,
            attention,
            checkpointing,
        ))
    }

    /// A model around existing weights (used by loading). A policy that does not fit the
    /// weights is reported by the first training forward.
    pub fn from_weights(
        weights: Weights,
        attention: FullSequenceAttentionKind,
        checkpointing: impl Into<ActivationCheckpointing>,
    ) -> Self {
        Self {
            weights: Arc::new(weights),
            attention,
            checkpointing: checkpointing.into(),
            determinism_check: DeterminismCheck::default(),
            plans: Mutex::new(Vec::new()),
            block_calls: Arc::new(AtomicUsize::new(0)),
            revision: Arc::default(),
            training: true,
            dropout_step: AtomicU64::new(0),
            loss_chunking: LossChunking::default(),
            residency: None,
        }
    }

    /// Sets (or with `None` removes) the owner of the parameters between uses: the model then
    /// acquires each unit before reading it and releases it after, as [`crate::residency`]
    /// describes (sharded data parallelism, ZeRO-3). Plans chosen by measuring the blocks
    /// (`auto`, memory budgets) are refused while an owner is set.
    pub fn set_parameter_residency(&mut self, owner: Option<SharedResidency>) {
        self.residency = owner;
    }

    /// The owner of the parameters between uses, if one is set.
    pub fn parameter_residency(&self) -> Option<&SharedResidency> {
        self.residency.as_ref()
    }

    /// Refuses `what` (a change of the weight set or of every value) while an owner holds the
    /// parameters between uses: their elements are not present.
    ///
    /// # Errors
    /// [`TransformerError::Config`] naming `what` and what to do.
    pub(crate) fn refuse_while_sharded(&self, what: &str) -> Result<()> {
        if self.residency.is_none() {
            return Ok(());
        }
        Err(TransformerError::Config {
            field: "parameter_residency",
            value: what.to_string(),
            reason: "the model's parameters are held by an owner between uses (sharded over \
                     data-parallel ranks by ZeRO-3): gather them back first (in Python \
                     optimizer.sharded.detach(); in Rust restore every unit, then \
                     set_parameter_residency(None))"
                .into(),
        })
    }

    /// The unit the LM head belongs to: [`ResidencyUnit::Embedding`] when tied.
    pub(crate) fn head_unit(&self) -> ResidencyUnit {
        if self.weights.config.tie_word_embeddings {
            ResidencyUnit::Embedding
        } else {
            ResidencyUnit::Head
        }
    }

    /// Acquires the LM head's unit before the head reads it; when a graph is recorded, returns
    /// the head's input `h` again through an identity node that keeps the hold until the head's
    /// VJP ran (else `None`: the caller releases the unit after the head,
    /// [`DecoderOnlyTransformer::release_head_without_graph`]).
    pub(crate) fn acquire_head(&self, h: &Variable) -> Result<Option<Variable>> {
        let reason = if riftco_autograd::is_grad_enabled() {
            AcquireReason::KeptForBackward
        } else {
            AcquireReason::Forward
        };
        let owner = self.residency.as_ref();
        residency::acquire(owner, self.head_unit(), reason, None)?;
        Ok(residency::hold_until_backward(h, owner, self.head_unit()))
    }

    /// Releases the LM head's unit after a head computation whose hold no graph node took
    /// ([`DecoderOnlyTransformer::acquire_head`] returned `None`).
    pub(crate) fn release_head_without_graph(&self, held: &Option<Variable>) {
        if held.is_none() {
            residency::release(self.residency.as_ref(), self.head_unit());
        }
    }

    /// Replaces the weight set; decode sessions opened before refuse to decode afterwards.
    pub(crate) fn set_weights(&mut self, weights: Weights, change: &'static str) {
        self.weights = Arc::new(weights);
        self.revision.bump(change);
    }

    /// Replaces the weight set by one of the same structure and values (a changed dropout
    /// probability): decode sessions and graphs keep the old set, which computes the same, so the
    /// revision is not bumped (the plan cache keys on the probabilities).
    pub(crate) fn swap_weights_keeping_revision(&mut self, weights: Weights) {
        self.weights = Arc::new(weights);
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
    pub fn activation_checkpointing(&self) -> &ActivationCheckpointing {
        &self.checkpointing
    }

    /// Changes the policy of later training forwards. Safe while decode sessions exist (decoding
    /// never checkpoints) and while older graphs are alive (they keep their own structure).
    ///
    /// # Errors
    /// [`TransformerError::Config`] for a policy that does not fit this model
    /// ([`ActivationCheckpointing::validate`]); the policy is unchanged then.
    pub fn set_activation_checkpointing(&mut self, policy: ActivationCheckpointing) -> Result<()> {
        policy.validate(self.config().n_layers)?;
        self.checkpointing = policy;
        Ok(())
    }

    /// What the checkpoints of the policy compare between a block's forward run and its replay
    /// (default [`DeterminismCheck::Metadata`]: shape and device). Not part of model state.
    pub fn determinism_check(&self) -> DeterminismCheck {
        self.determinism_check
    }

    /// Sets the replay check of later training forwards' checkpoints: with
    /// [`DeterminismCheck::Values`] a block whose replay computes other values than its forward
    /// run (or draws other random numbers) fails the backward pass with a `CheckpointError`
    /// naming the block (`block N (model.layers.N)`) and the first differing element, and
    /// nothing is committed. `Values` replays compute the block's full forward (the graph-only
    /// MLP tail is evaluated so its output can be compared) and hash the output twice.
    pub fn set_determinism_check(&mut self, check: DeterminismCheck) {
        self.determinism_check = check;
    }

    /// [`DecoderOnlyTransformer::set_activation_checkpointing`] with `disabled` or `block`
    /// (which fit every model).
    pub fn set_activation_checkpointing_kind(&mut self, kind: ActivationCheckpointingKind) {
        self.checkpointing = kind.into();
    }

    /// The per-block plan the policy resolves to for training inputs `[batch, seq]`. `auto` and
    /// budgets are planned from measurements of this model at that shape
    /// ([`planner`]), which takes a few block forwards and backwards the first time; the model
    /// keeps the plans of its last 8 combinations of policy, shape, attention kind, device and
    /// weight set (LoRA), so alternating shapes plan each once.
    ///
    /// # Errors
    /// [`TransformerError::Config`] for a policy that does not fit the model or a budget below
    /// the smallest achievable peak (named in the message); [`TransformerError::Tokens`] for
    /// a batch or sequence length of 0 and [`TransformerError::SequenceTooLong`] beyond
    /// `max_seq_len` (for every policy); errors of the measured passes.
    pub fn activation_checkpointing_plan(
        &self,
        batch: usize,
        seq: usize,
    ) -> Result<Arc<CheckpointPlan>> {
        planner::check_shape(self.config(), batch, seq)?;
        let key = PlanKey {
            policy: self.checkpointing.clone(),
            batch,
            seq,
            attention: self.attention,
            revision: self.revision.get().0,
            device: self.device(),
            dropout: self.planning_dropout().map_or([0; 3], |d| {
                [d.attention, d.residual, d.lora].map(f32::to_bits)
            }),
            loss_chunking: self.loss_chunking,
        };
        let mut cached = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = cached.iter().position(|(k, _)| *k == key) {
            let hit = cached.remove(i);
            let plan = hit.1.clone();
            cached.insert(0, hit);
            return Ok(plan);
        }
        let n_layers = self.config().n_layers;
        let plan = match CheckpointPlan::fixed(&self.checkpointing, n_layers)? {
            Some(plan) => plan,
            None if self.residency.is_some() => {
                return Err(TransformerError::Config {
                    field: "activation_checkpointing",
                    value: self.checkpointing.to_string(),
                    reason: "this policy chooses its plan by running every block, which \
                             needs every parameter resident; with sharded parameters use \
                             disabled, block, segments:K, a selective policy or a per-block \
                             list"
                        .into(),
                });
            }
            None => {
                let m = Arc::new(planner::measure(
                    &self.weights,
                    self.attention,
                    batch,
                    seq,
                    self.planning_dropout(),
                    self.loss_chunking,
                )?);
                match self.checkpointing {
                    ActivationCheckpointing::Budget(bytes) => planner::budget_plan(m, bytes)?,
                    _ => planner::auto_plan(m),
                }
            }
        };
        let plan = Arc::new(plan);
        cached.insert(0, (key, plan.clone()));
        cached.truncate(PLAN_CACHE_SIZE);
        Ok(plan)
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

    /// Logits `[batch·seq, vocab]` for tokens `[batch, seq]` (row-major), recording a graph
    /// under the current policy when gradients are enabled. Never dropped: dropout belongs to
    /// the training forward of [`DecoderOnlyTransformer::loss`] (the logits of the deterministic
    /// model, as in evaluation and decoding).
    ///
    /// # Errors
    /// [`TransformerError::Tokens`] for bad token buffers (length, ids, `seq > max_seq_len`).
    pub fn logits(&self, tokens: &[u32], batch: usize, seq: usize) -> Result<Variable> {
        self.forward_logits(tokens, batch, seq, false)
    }

    /// [`DecoderOnlyTransformer::logits`], dropping when `training_forward` and the model is
    /// training ([`DecoderOnlyTransformer::set_training`]) while a graph is being recorded
    /// (`riftco_autograd::is_grad_enabled`); such a forward with a probability above 0 takes the
    /// next dropout step.
    fn forward_logits(
        &self,
        tokens: &[u32],
        batch: usize,
        seq: usize,
        training_forward: bool,
    ) -> Result<Variable> {
        let h = self.forward_hidden(tokens, batch, seq, training_forward, None)?;
        let held = self.acquire_head(&h)?;
        let logits = ops::linear(held.as_ref().unwrap_or(&h), &self.weights.lm_head);
        self.release_head_without_graph(&held);
        Ok(logits?)
    }

    /// The final RMSNorm's output `[batch·seq, d_model]` for tokens `[batch, seq]` (what the LM
    /// head reads), with the dropout rule of [`DecoderOnlyTransformer::forward_logits`]; with a
    /// packed `layout`, each example of a row attends only within itself ([`crate::packing`]).
    pub(crate) fn forward_hidden(
        &self,
        tokens: &[u32],
        batch: usize,
        seq: usize,
        training_forward: bool,
        layout: Option<&Arc<crate::packing::SequenceLayout>>,
    ) -> Result<Variable> {
        let w = &self.weights;
        let cfg = &w.config;
        cfg.validate_tokens(tokens, batch, seq)?;
        let owner = self.residency.as_ref();
        let graph = riftco_autograd::is_grad_enabled();
        // The lookup's VJP reads no value of the table (a tied head acquires it again).
        let first = (cfg.n_layers > 0).then_some(ResidencyUnit::Block(0));
        let x = match (
            owner,
            residency::row_slices(owner, ResidencyUnit::Embedding, &w.embed),
        ) {
            (Some(o), Some(rows)) => {
                let vocab = cfg.vocab_size;
                let mut fetch = residency::fetcher(o, ResidencyUnit::Embedding, vocab, first);
                ops::sliced_embedding(tokens, vocab, cfg.d_model, rows, &mut fetch)?
            }
            _ => {
                residency::acquire(
                    owner,
                    ResidencyUnit::Embedding,
                    AcquireReason::Forward,
                    first,
                )?;
                let x = ops::embedding(&w.embed, tokens);
                residency::release(owner, ResidencyUnit::Embedding);
                x?
            }
        };
        let mut x = ops::reshape(&x, [batch, seq, cfg.d_model])?;
        let mut ctx = BlockContext::new(cfg, &w.rope, batch, seq, self.attention);
        ctx.layout = layout.filter(|l| !l.is_unpacked()).cloned();
        // Without a graph (evaluation) no block retains anything: no plan is needed.
        let plan = if riftco_autograd::is_grad_enabled() {
            self.activation_checkpointing_plan(batch, seq)?
        } else {
            Arc::new(
                CheckpointPlan::fixed(&ActivationCheckpointing::Disabled, cfg.n_layers)?
                    .expect("disabled needs no measurement"),
            )
        };
        if training_forward {
            ctx.dropout = self.next_training_dropout()?;
        }
        x = plan.forward(
            x,
            &w.layers,
            &ctx,
            &self.block_calls,
            self.determinism_check,
            owner,
        )?;
        let norm_reason = if graph {
            AcquireReason::KeptForBackward
        } else {
            AcquireReason::Forward
        };
        let head = Some(self.head_unit());
        residency::acquire(owner, ResidencyUnit::FinalNorm, norm_reason, head)?;
        let held = residency::hold_until_backward(&x, owner, ResidencyUnit::FinalNorm);
        let x = held.as_ref().unwrap_or(&x);
        // The norm's own handle goes first: when the loss reads no value of it (the chunked
        // loss), the graph releases it once the caller drops the reshaped handle.
        let h = ops::rms_norm(x, &w.final_norm, cfg.rms_norm_eps);
        if held.is_none() {
            residency::release(owner, ResidencyUnit::FinalNorm);
        }
        Ok(ops::reshape(&h?, [batch * seq, cfg.d_model])?)
    }

    /// Adds LoRA adapters to the target layers, activates them and freezes every base
    /// parameter (no weight gradient is computed for frozen weights). Graphs recorded before
    /// keep their own structure; decode sessions opened before refuse to decode afterwards
    /// ([`TransformerError::Decode`]: open a new one).
    ///
    /// # Errors
    /// [`TransformerError::Config`] while an owner holds the
    /// parameters between uses ([`crate::residency`]).
    /// [`TransformerError::Lora`] for invalid hyper-parameters or when adapters already exist.
    pub fn enable_lora(&mut self, lora: &LoraConfig) -> Result<()> {
        self.refuse_while_sharded("enable_lora")?;
        lora.validate(self.config().d_model)?;
        if self.has_lora() {
            return Err(TransformerError::Lora {
                message: "adapters already exist; merge or remove them first".into(),
            });
        }
        let mut rng = Rng::new(lora.seed);
        let mut w = freeze(&self.weights, true);
        // A in state-dict order of the targeted weights, from one seeded generator.
        for (i, layer) in w.layers.iter_mut().enumerate() {
            Arc::make_mut(layer).try_for_each_linear_mut(|row, lin| {
                if row.role.targeted_by(&lora.targets) {
                    let (o, inp) = lin.dims();
                    let name = row.at(i).hf_name();
                    let mut adapter =
                        LoraAdapter::new(&name, o, inp, lora.rank, lora.alpha, &mut rng)?;
                    adapter.dropout = lora.dropout;
                    lin.lora = Some(adapter);
                    lin.lora_active = true;
                }
                Ok(())
            })?;
        }
        // New adapters live on the model's device, like its weights.
        let device = self.device();
        if device != riftco_tensor::Device::Cpu {
            let adapters: Vec<Variable> = w
                .named_lora_parameters()
                .into_iter()
                .map(|(_, p)| p)
                .collect();
            crate::device::move_parameters(&adapters, device)?;
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
        self.weights
            .linears()
            .any(|(_, lin)| lin.lora.is_some() && lin.lora_active)
    }

    /// Activates or deactivates existing adapters (base weights stay frozen while adapters
    /// exist). A change makes decode sessions opened before refuse to decode
    /// ([`TransformerError::Decode`]); setting the state the adapters already have changes
    /// nothing.
    ///
    /// # Errors
    /// [`TransformerError::Config`] while an owner holds the
    /// parameters between uses ([`crate::residency`]).
    /// [`TransformerError::Lora`] when there are no adapters.
    pub fn set_lora_active(&mut self, active: bool) -> Result<()> {
        self.refuse_while_sharded("set_lora_active")?;
        if !self.has_lora() {
            return Err(TransformerError::Lora {
                message: "the model has no adapters".into(),
            });
        }
        let unchanged = self
            .weights
            .linears()
            .all(|(_, lin)| lin.lora.is_none() || lin.lora_active == active);
        if unchanged {
            return Ok(());
        }
        let mut w = (*self.weights).clone();
        for layer in w.layers.iter_mut() {
            Arc::make_mut(layer).try_for_each_linear_mut(|_, lin| {
                if lin.lora.is_some() {
                    lin.lora_active = active;
                }
                Ok(())
            })?;
        }
        self.set_weights(w, "set_lora_active");
        Ok(())
    }

    /// Freezes every base weight (`requires_grad = false`), as enabling LoRA does, so a
    /// compressed storage format can be set for them. Decode sessions opened before refuse to
    /// decode afterwards.
    pub fn freeze_base(&mut self) {
        let w = freeze(&self.weights, true);
        self.set_weights(w, "freeze_base");
    }

    /// Merges active adapters into the base weights (`W ← W + (alpha/r)·B·A`), removes them and
    /// makes every base parameter trainable again. Decode sessions opened before refuse to
    /// decode afterwards ([`TransformerError::Decode`]).
    ///
    /// # Errors
    /// [`TransformerError::Config`] while an owner holds the
    /// parameters between uses ([`crate::residency`]).
    /// [`TransformerError::Lora`] when there are no adapters, when they are inactive
    /// ([`DecoderOnlyTransformer::set_lora_active`]`(false)`: merging would drop them unmerged),
    /// or when the frozen base is stored in 16 bits
    /// ([`DecoderOnlyTransformer::set_frozen_weights_dtype`]); the model is unchanged.
    pub fn merge_lora(&mut self) -> Result<()> {
        self.refuse_while_sharded("merge_lora")?;
        if !self.has_lora() {
            return Err(TransformerError::Lora {
                message: "the model has no adapters".into(),
            });
        }
        if let WeightDtype::Quantized(f) = self.frozen_weights_dtype() {
            return Err(TransformerError::Lora {
                message: format!(
                    "the frozen base weights are quantized ({f}): merging writes them and makes \
                     them trainable, which needs float32. Dequantize first \
                     (set_frozen_weights_dtype(\"float32\"), or load the model with \
                     dtype=\"float32\"), then merge; or keep the adapter apart and export the \
                     merged model as GGUF (riftco export)"
                ),
            });
        }
        if self.has_half_weights() {
            return Err(TransformerError::Lora {
                message: format!(
                    "the frozen base weights are stored in {}: merging writes them and makes \
                     them trainable, which needs float32 (set_frozen_weights_dtype(float32) \
                     first, then merge; save with dtype bfloat16 to round the merged weights)",
                    self.frozen_weights_dtype()
                ),
            });
        }
        if !self.lora_active() {
            // Merging inactive adapters would either change the model's output (merge them)
            // or drop the trained adapters unmerged (lost work): neither is what a call means.
            return Err(TransformerError::Lora {
                message: "the adapters are inactive (set_lora_active(false)): merging now would \
                          drop them unmerged; call set_lora_active(true) first to merge them into \
                          the base weights"
                    .into(),
            });
        }
        let mut w = freeze(&self.weights, false);
        for layer in w.layers.iter_mut() {
            Arc::make_mut(layer).try_for_each_linear_mut(|_, lin| {
                if lin.lora.is_some() {
                    if lin.lora_active {
                        let merged = lin.effective_weight()?;
                        let (w, n) = (lin.weight.value(), merged.numel());
                        w.backend()?.copy_range("merge_lora", w, 0, &merged, 0, n)?;
                    }
                    lin.lora = None;
                    lin.lora_active = false;
                }
                Ok(())
            })?;
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
    for e in layout::entries_for(&w.config) {
        if let Some(v) = out.parameter_mut(e.place) {
            *v = re(v);
        }
    }
    out.retie();
    out
}
