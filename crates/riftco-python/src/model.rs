//! `DecoderOnlyTransformer` (its `DecodeSession` is in `decode_session`).

use std::path::PathBuf;
use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use riftco_autograd::DeterminismCheck;
use riftco_transformer::device::resolve_device;
use riftco_transformer::{
    DecoderOnlyTransformer, FullSequenceAttentionKind, LossChunking, OptionTable, TransformerError,
    ATTENTION_KINDS,
};

use crate::config::{f32_as_python_float, set_model_dropout, PyTransformerConfig};
use crate::decode_session::PyDecodeSession;
use crate::errors::{autograd_err, compute, transformer_err, Exc};
use crate::policy::{byte_size_of, count_arg, plan_dict, policy_from};
use crate::tokens::{label_ids, token_ids};
use crate::variable::PyVariable;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTransformerConfig>()?;
    m.add_class::<PyModel>()?;
    m.add_class::<PyDecodeSession>()?;
    m.add_function(wrap_pyfunction!(write_file_atomic, m)?)?;
    // The valid attention kinds, from the Rust option table (default first); the policy
    // tables are registered by `policy`.
    m.add("ATTENTION_KINDS", names(m.py(), &ATTENTION_KINDS)?)?;
    m.add("IGNORE_INDEX", riftco_transformer::IGNORE_INDEX)?;
    Ok(())
}

/// Writes ``data`` to the file ``path`` atomically, as the model files are written: into a
/// fresh temporary ``.{name}.tmp.{pid}.{n}`` in the same folder (mode ``0644``), fsynced,
/// renamed over ``path``, then the folder fsynced. A process killed at any moment leaves
/// ``path`` entirely old or entirely new; temporaries of ``path`` left by killed processes are
/// removed first. The GIL is released meanwhile.
///
/// Args:
///     path: the destination file (its folder must exist).
///     data: the complete new content.
///
/// Raises:
///     OSError: when the folder is missing or not writable (``path`` is left intact).
///     ModelStateError: when ``path`` has no file name or is a FIFO, device or socket.
#[pyfunction]
fn write_file_atomic(py: Python<'_>, path: PathBuf, data: &[u8]) -> PyResult<()> {
    compute(py, || {
        riftco_transformer::state::write_file_atomic(&path, data)
    })
}

/// The names of an option table as a Python `tuple[str, ...]`.
fn names<'py, T>(py: Python<'py>, table: &OptionTable<T>) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(py, table.rows.iter().map(|r| r.name))
}

pub(crate) fn attention_kind(s: &str) -> PyResult<FullSequenceAttentionKind> {
    s.parse().map_err(transformer_err)
}

pub(crate) fn parse_determinism_check(s: &str) -> PyResult<DeterminismCheck> {
    s.parse().map_err(autograd_err)
}

/// A LLaMA-style decoder-only transformer: token embedding, ``n_layers`` pre-norm blocks
/// (RMSNorm, causal multi-head attention with RoPE, RMSNorm, SwiGLU MLP), final RMSNorm and an
/// untied LM head. Weights are initialised like Hugging Face Llama from ``config.seed``.
///
/// Thread-safe: forwards from several Python threads run concurrently (the GIL is released
/// during every compute call); policy and LoRA changes wait for running forwards.
///
/// Args:
///     config: the TransformerConfig.
///     attention: ``"flash"`` (FlashAttention-2, O(seq) retained memory per head) or
///         ``"materialized"`` (scores and probabilities kept for backward).
///     activation_checkpointing: which activations a training forward retains (it never changes
///         the loss or the gradients, only memory and time; not part of the saved state):
///
///         - ``"disabled"`` (default): every activation retained;
///         - ``"block"``: every block a checkpoint (only block inputs retained; each block runs
///           again during backward), the same as ``"segments:1"``;
///         - ``"segments:K"``: K consecutive blocks form one checkpoint (the last may be
///           shorter), ``1 <= K <= n_layers`` (a larger K is an error, not clamped);
///         - ``"auto"``: K from this model's measured per-layer bytes,
///           ``k* = sqrt(n_layers * M_ckpt / M_layer)`` (Chen et al. 2016), measured at the
///           first training forward of each input shape;
///         - ``"selective"`` / ``"selective:NAME"``: every block a selective checkpoint that
///           keeps some named values from the forward (a name of ``SELECTIVE_POLICIES``, default
///           ``"attention_ffn"``, or ``BLOCK_VALUE_NAMES`` joined by ``+``, e.g.
///           ``"selective:q+k+v"``) and recomputes the rest;
///         - a list or tuple of per-block strings, one per layer (``"disabled"``, ``"block"``,
///           ``"selective[:NAME]"``), or the same comma-separated in one string;
///         - ``"budget:SIZE"``: as ``activation_memory_budget``.
///     activation_memory_budget: bytes (int) or a size string (``"64MiB"``, ``"1.5GB"``, see
///         ``parse_byte_size``): a planner measures one block under each candidate policy at the
///         first training forward of each input shape and picks the per-block policies with the
///         least predicted recompute time whose predicted peak activation bytes fit the budget
///         (``activation_checkpointing_plan`` shows the plan). Only with
///         ``activation_checkpointing="disabled"``.
///     determinism_check: what each checkpoint compares at replay, ``"off"``, ``"metadata"``
///         (default) or ``"values"`` (see the ``determinism_check`` property).
///
/// Raises:
///     ConfigError: naming the value and what is accepted, for an unknown ``attention``,
///         ``determinism_check`` or
///         policy spelling, ``segments:K`` outside ``1..=n_layers``, an unknown selective name,
///         a per-block list of another length than ``n_layers``, a malformed budget, or a budget
///         together with a policy other than ``"disabled"``. A budget below the smallest
///         achievable peak raises ``ConfigError`` (naming that peak) at the first training
///         forward or ``activation_checkpointing_plan`` call.
///
/// Example:
///     >>> import riftco
///     >>> config = riftco.TransformerConfig(256, 32, 4, 2, 64, 16)
///     >>> model = riftco.DecoderOnlyTransformer(config, activation_checkpointing="block").to("cpu")
///     >>> model.activation_checkpointing
///     'block'
///     >>> model.set_activation_checkpointing(["selective:dots", "block"])
///     >>> model.activation_checkpointing
///     'selective:dots,block'
#[pyclass(name = "DecoderOnlyTransformer", module = "riftco._native", frozen)]
pub struct PyModel {
    inner: RwLock<DecoderOnlyTransformer>,
}

impl PyModel {
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, DecoderOnlyTransformer> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, DecoderOnlyTransformer> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }
    pub(crate) fn wrap(model: DecoderOnlyTransformer) -> Self {
        Self {
            inner: RwLock::new(model),
        }
    }
}

#[pymethods]
impl PyModel {
    #[new]
    #[pyo3(
        signature = (config, attention = "flash", activation_checkpointing = None,
                     activation_memory_budget = None, *, determinism_check = "metadata"),
        text_signature = "(config, attention='flash', activation_checkpointing='disabled', \
                          activation_memory_budget=None, *, determinism_check='metadata')"
    )]
    fn new(
        py: Python<'_>,
        config: PyRef<'_, PyTransformerConfig>,
        attention: &str,
        activation_checkpointing: Option<Bound<'_, PyAny>>,
        activation_memory_budget: Option<Bound<'_, PyAny>>,
        determinism_check: &str,
    ) -> PyResult<Self> {
        let attention = attention_kind(attention)?;
        let check = parse_determinism_check(determinism_check)?;
        let checkpointing = policy_from(
            activation_checkpointing.as_ref(),
            activation_memory_budget.as_ref(),
        )?;
        let config = config.0.clone();
        compute(py, move || {
            let mut model = DecoderOnlyTransformer::new(config, attention, checkpointing)?;
            model.set_determinism_check(check);
            Ok::<_, riftco_transformer::TransformerError>(model)
        })
        .map(Self::wrap)
    }

    /// What every checkpoint of the policy compares between a block's forward run and its
    /// replay: ``"off"``, ``"metadata"`` (default; shape and device) or ``"values"`` (also a
    /// hash of the block output and the generator counter: a mismatch raises
    /// ``CheckpointError`` from ``backward()`` naming the block, ``block N (model.layers.N)``,
    /// and the first differing element, committing nothing). Not part of the saved state.
    /// Setting it to an unknown spelling raises ``ConfigError`` naming it (unchanged then).
    #[getter]
    fn determinism_check(&self) -> &'static str {
        self.read().determinism_check().as_str()
    }

    #[setter]
    fn set_determinism_check(&self, py: Python<'_>, check: &str) -> PyResult<()> {
        let check = parse_determinism_check(check)?;
        py.detach(|| self.write().set_determinism_check(check));
        Ok(())
    }

    /// How ``loss()`` computes the LM head and cross-entropy: the byte budget (int) of the
    /// chunked loss's logits workspace (default 64 MiB), or ``None`` for whole logits.
    ///
    /// Chunked (the default), the final hidden states go through the LM head and the
    /// cross-entropy a chunk of tokens at a time (``budget // (4 * (vocab_size + 1))`` tokens,
    /// at least one), and the loss's gradients are computed in the same pass (Liger Kernel's
    /// fused linear cross-entropy, Hsu et al. 2024): the ``[tokens, vocab_size]`` logits and
    /// their gradient are never whole in memory. ``None`` computes whole logits, then the
    /// cross-entropy (the graph keeps the logits until ``backward()``). Both give the same loss
    /// and gradients within f32 rounding (a chunk's products may sum a row in another order
    /// than the whole product; the bound is derived in docs/memory.md). ``logits()``
    /// always returns whole logits. Not model state.
    ///
    /// Setting it accepts an int of bytes, a size string (``"64MiB"``) or ``None``; ``0``, a
    /// negative or fractional size, a float or a bool raises ``ConfigError`` naming
    /// ``loss_chunk_bytes`` and the value (the setting is unchanged then).
    #[getter]
    fn loss_chunk_bytes(&self) -> Option<u64> {
        self.read().loss_chunking().bytes()
    }

    #[setter]
    fn set_loss_chunk_bytes(
        &self,
        py: Python<'_>,
        bytes: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let chunking = match bytes.filter(|b| !b.is_none()) {
            None => LossChunking::Unfused,
            Some(b) => LossChunking::chunked(byte_size_of("loss_chunk_bytes", &b)?)
                .map_err(transformer_err)?,
        };
        compute(py, || self.write().set_loss_chunking(chunking))
    }

    /// Places the model on a device and returns it (for chaining).
    ///
    /// Args:
    ///     device: ``"cpu"``, ``"vulkan"`` (wgpu's Vulkan backend), ``"metal"`` (wgpu's Metal
    ///         backend, macOS), ``"gpu"`` (the best adapter of either: discrete, then integrated,
    ///         then virtual, then software) or ``"privateuseone"`` (case-insensitive). A GPU is
    ///         opened on first use.
    ///
    /// Returns:
    ///     DecoderOnlyTransformer: this model; ``device`` then names the device it resolved to
    ///     (``"gpu"`` is ``"vulkan"`` or ``"metal"``).
    ///
    /// Every parameter and its gradient move to the device (in place, like PyTorch's
    /// ``module.to``): graphs recorded before are stale, decode sessions opened before refuse to
    /// decode, and optimizers should be built after the move (their moments live on the
    /// parameters' device). Values read on the host (``numpy()``, ``item()``, decode logits)
    /// wait for the GPU's pending work. A quantized frozen base moves as its quantized bytes
    /// (bit for bit; ``memory_stats`` counts those bytes on the GPU) and the GPU reads it
    /// dequantized a block at a time, as the CPU does.
    ///
    /// Raises:
    ///     DeviceUnavailableError: no adapter of the GPU asked for (the message names what was
    ///         looked for and every adapter found), ``"privateuseone"`` with no backend
    ///         registered; the model stays where it was.
    ///     ConfigError: for any other name (the message lists the valid ones); for a frozen
    ///         base stored in bfloat16 or float16 moving off the CPU (16-bit storage lives on
    ///         the CPU only: ``set_frozen_weights_dtype("float32")`` or a quantized format
    ///         first).
    ///     OutOfMemoryError: a copy could not be allocated (every parameter is moved back).
    fn to(slf: Py<Self>, py: Python<'_>, device: &str) -> PyResult<Py<Self>> {
        let model = slf.get();
        compute(py, || {
            let d = resolve_device(device)?;
            model.write().to_device(d)
        })?;
        Ok(slf)
    }

    /// The device the weights live on: ``"cpu"`` unless moved with ``to``, then the resolved
    /// name (``"vulkan"``, ``"metal"`` or ``"privateuseone"``).
    #[getter]
    fn device(&self) -> &'static str {
        self.read().device().name()
    }

    /// The activation-checkpointing policy of later training forwards, in its canonical
    /// spelling: ``"disabled"``, ``"block"``, ``"segments:K"``, ``"auto"``,
    /// ``"selective:NAME"``, a comma-separated per-block list, or ``"budget:BYTES"``.
    #[getter]
    fn activation_checkpointing(&self) -> String {
        self.read().activation_checkpointing().to_string()
    }

    /// Changes the activation-checkpointing policy of later training forwards (graphs recorded
    /// before keep their structure; decoding never checkpoints). The policy is not model state:
    /// ``save()`` does not record it.
    ///
    /// Args:
    ///     policy: any form the constructor's ``activation_checkpointing`` accepts (a spelling
    ///         or a list of per-block strings); ``None`` means ``"disabled"``.
    ///     activation_memory_budget: bytes (int) or a size string: the budget policy (with
    ///         ``policy`` ``None`` or ``"disabled"`` only).
    ///
    /// Raises:
    ///     ConfigError: as the constructor (naming the value); the policy is unchanged then.
    #[pyo3(
        signature = (policy = None, *, activation_memory_budget = None),
        text_signature = "($self, policy=None, *, activation_memory_budget=None)"
    )]
    fn set_activation_checkpointing(
        &self,
        py: Python<'_>,
        policy: Option<Bound<'_, PyAny>>,
        activation_memory_budget: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let policy = policy_from(policy.as_ref(), activation_memory_budget.as_ref())?;
        compute(py, || self.write().set_activation_checkpointing(policy))
    }

    /// The per-block plan the policy resolves to for training inputs ``[batch, seq]`` (what
    /// ``loss()`` on a ``[batch, seq + 1]`` block runs). ``"auto"`` and budgets are planned
    /// from measurements of this model at that shape: one block and the head run forward and
    /// backward under each candidate policy, on the model's device (this takes a moment the first
    /// time, with the GIL released; it does not reset the peak counters of ``memory_stats()``:
    /// its probe allocations, one block at a time, count in the process-wide peak like any
    /// allocation); the plan is kept until the policy, the shape, the attention kind, the device or LoRA changes,
    /// so the next ``loss()`` of that shape runs exactly this plan.
    ///
    /// Args:
    ///     batch: sequences per step, ``>= 1``.
    ///     seq: tokens per sequence, ``1 <= seq <= max_seq_len``.
    ///
    /// Returns:
    ///     dict: ``policy`` (str, canonical spelling); ``summary`` (str, one line, e.g.
    ///     ``"segments:2 → block[0-1] block[2-3]"``); ``per_block`` (list of str, one per
    ///     layer: ``"disabled"``, ``"block"`` or ``"selective:NAME"``); ``segments`` (list of
    ///     ``{"layers": [start, stop], "policy": str}``, consecutive blocks forming one
    ///     checkpoint, ``stop`` exclusive); ``segment_length`` (int K of ``block``,
    ///     ``segments:K`` and ``auto``, else ``None``); ``predicted_peak_bytes`` (int) and
    ///     ``predicted_step_seconds`` (float, forward + backward of the blocks and the head) for
    ///     ``auto`` and budgets, else ``None``; ``measurement``: ``None``, or for ``auto`` and
    ///     budgets what the planner measured: ``batch``, ``seq``, ``n_layers``,
    ///     ``boundary_bytes`` (``M_ckpt``, bytes a checkpointed block retains),
    ///     ``layer_bytes`` (``M_layer``, bytes a block retains without checkpointing),
    ///     ``head_retained_bytes``, ``head_transient_bytes``, ``head_forward_peak_bytes``,
    ///     ``embedding_bytes`` (the part of ``head_retained_bytes`` alive before the first
    ///     block), ``head_kept_bytes`` (what the head's backward leaves), ``head_seconds``, ``optimal_segment_length`` (float
    ///     ``k* = sqrt(n_layers * M_ckpt / M_layer)``) and ``costs`` (one ``{"policy",
    ///     "retained_bytes", "transient_bytes", "forward_peak_bytes", "seconds"}`` per candidate
    ///     per-block policy; transient bytes are the backward's peak and forward peak bytes the
    ///     forward's, each above what was alive before it).
    ///
    /// Raises:
    ///     ConfigError: for ``batch`` or ``seq`` out of range or not an int (a bool is not
    ///         one), a shape whose largest activation (``batch * seq * max(d_model, d_ff,
    ///         vocab_size)`` float32) exceeds 2**47 bytes, a policy that does not fit the
    ///         model, or a budget below the smallest achievable peak (the message names that
    ///         peak and the per-block plan reaching it).
    ///     OutOfMemoryError: when a measured pass cannot allocate.
    fn activation_checkpointing_plan<'py>(
        &self,
        py: Python<'py>,
        batch: &Bound<'py, PyAny>,
        seq: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let cfg = self.read().config().clone();
        let max_seq = cfg.max_seq_len;
        let batch = count_arg(batch, "batch", "a plan needs batch >= 1", |b| b >= 1)?;
        let seq = count_arg(
            seq,
            "seq",
            &format!("a plan needs 1 <= seq <= max_seq_len = {max_seq}"),
            |s| (1..=max_seq).contains(&s),
        )?;
        let widest = cfg.d_model.max(cfg.d_ff).max(cfg.vocab_size) as u128;
        let bytes = batch as u128 * seq as u128 * widest * 4;
        if bytes > MAX_PLAN_ACTIVATION_BYTES {
            return Err(Exc::Config.err(format!(
                "invalid config: training inputs [batch {batch}, seq {seq}] need {bytes} bytes \
                 for one activation of width {widest}, above the bound of \
                 {MAX_PLAN_ACTIVATION_BYTES} bytes"
            )));
        }
        let plan = compute(py, || self.read().activation_checkpointing_plan(batch, seq))?;
        plan_dict(py, &plan)
    }

    /// The full-sequence attention kind: ``"flash"`` or ``"materialized"``.
    #[getter]
    fn attention(&self) -> &'static str {
        self.read().attention_kind().name()
    }

    /// Changes the attention kind of later forwards.
    ///
    /// Args:
    ///     kind: ``"flash"`` or ``"materialized"``.
    ///
    /// Raises:
    ///     ConfigError: for another string (the message lists the valid ones).
    fn set_attention(&self, py: Python<'_>, kind: &str) -> PyResult<()> {
        let kind = attention_kind(kind)?;
        compute(py, || {
            self.write().set_attention_kind(kind);
            Ok::<_, TransformerError>(())
        })
    }

    /// The model's TransformerConfig.
    #[getter]
    fn config(&self) -> PyTransformerConfig {
        PyTransformerConfig(self.read().config().clone())
    }

    /// The parameters an optimizer should update: every base parameter, or only the LoRA
    /// ``A``/``B`` matrices while adapters exist (base weights are frozen then).
    ///
    /// Returns:
    ///     list[Variable]: leaves with ``requires_grad=True``.
    fn parameters(&self) -> Vec<PyVariable> {
        self.read()
            .trainable_parameters()
            .into_iter()
            .map(PyVariable)
            .collect()
    }

    /// Every base parameter with its Hugging Face Llama name (``model.embed_tokens.weight``,
    /// ``model.layers.0.self_attn.q_proj.weight``, ..., ``lm_head.weight``), in state-dict order.
    ///
    /// Returns:
    ///     list[tuple[str, Variable]]: linear weights are ``[out, in]``.
    fn named_parameters(&self) -> Vec<(String, PyVariable)> {
        self.read()
            .named_parameters()
            .into_iter()
            .map(|(n, v)| (n, PyVariable(v)))
            .collect()
    }

    /// Every LoRA parameter with its PEFT name
    /// (``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``); empty without
    /// adapters.
    ///
    /// Returns:
    ///     list[tuple[str, Variable]]: ``A`` is ``[rank, in]``, ``B`` is ``[out, rank]``.
    fn named_lora_parameters(&self) -> Vec<(String, PyVariable)> {
        self.read()
            .weights()
            .named_lora_parameters()
            .into_iter()
            .map(|(n, v)| (n, PyVariable(v)))
            .collect()
    }

    /// Mean next-token cross-entropy of a token block, recording a training graph under the
    /// current attention kind and checkpointing policy. The GIL is released meanwhile.
    ///
    /// Inputs are ``tokens[:, :-1]``, targets ``tokens[:, 1:]``, or ``labels[:, 1:]`` when
    /// ``labels`` is given (Hugging Face's convention: labels aligned with the tokens and
    /// shifted inside the loss), where ``-100`` (``riftco.IGNORE_INDEX``, PyTorch's
    /// ``ignore_index``) marks a position that is not a target, e.g. a prompt token in
    /// instruction tuning. The mean is then over the targeted positions only, and ignored ones
    /// contribute nothing to the loss or the gradients (only the targeted positions' hidden
    /// states go through the LM head).
    ///
    /// Args:
    ///     tokens: integer array-like ``[batch, seq + 1]`` (any integer dtype or nested lists),
    ///         ids in ``[0, vocab_size)``, ``seq <= max_seq_len``.
    ///     labels: ``None``, or an integer array-like of the same shape holding ids in
    ///         ``[0, vocab_size)`` or ``-100``; column 0 is never a target.
    ///     position_ids: ``None``, or an integer array-like of the same shape for a packed
    ///         batch (several examples per row; Hugging Face's padding-free convention, as
    ///         ``DataCollatorWithFlattening`` and TRL's ``padding_free`` produce it): each row
    ///         counts ``0, 1, 2, ..`` within an example and restarts at 0 where the next one
    ///         starts. Every example is then computed as if alone (RoPE restarts at 0,
    ///         attention stays within the example), the target at an example's first token is
    ///         never scored, and the mean is over every scored target of the batch.
    ///
    /// Returns:
    ///     Variable: a one-element scalar; call ``.backward()`` on it.
    ///
    /// Raises:
    ///     TokenError: for a non-2-D or non-integer array, an id outside the vocabulary (the
    ///         message names the value and its index), ``seq + 1 < 2``, or
    ///         ``seq > max_seq_len``; labels of another shape or dtype, a label that is
    ///         neither -100 nor an id (named with its index), or labels that ignore every
    ///         target position; position_ids of another shape, not integer, or a value that
    ///         is neither 0 nor the previous position + 1 (named with its ``[row, column]``).
    #[pyo3(signature = (tokens, labels = None, position_ids = None))]
    fn loss(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        labels: Option<&Bound<'_, PyAny>>,
        position_ids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyVariable> {
        let vocab = self.read().config().vocab_size;
        let (ids, shape) = token_ids(tokens, 2, vocab, "tokens")?;
        if let Some(p) = position_ids.filter(|p| !p.is_none()) {
            let positions = crate::tokens::position_ids(p, &shape)?;
            let labels = match labels.filter(|l| !l.is_none()) {
                Some(l) => Some(label_ids(l, &shape)?),
                None => None,
            };
            return compute(py, || {
                self.read()
                    .loss_packed(&ids, labels.as_deref(), &positions, shape[0], shape[1])
            })
            .map(PyVariable);
        }
        match labels.filter(|l| !l.is_none()) {
            None => compute(py, || self.read().loss(&ids, shape[0], shape[1])).map(PyVariable),
            Some(labels) => {
                let labels = label_ids(labels, &shape)?;
                compute(py, || {
                    self.read()
                        .loss_with_labels(&ids, &labels, shape[0], shape[1])
                })
                .map(PyVariable)
            }
        }
    }

    /// Logits of a token batch, recording a training graph under the current policy. The GIL
    /// is released meanwhile.
    ///
    /// Args:
    ///     tokens: integer array-like ``[batch, seq]``, ``seq <= max_seq_len``.
    ///     position_ids: ``None``, or integer ``[batch, seq]`` for a packed batch (as in
    ///         ``loss()``): each example's logits are those of the example alone.
    ///
    /// Returns:
    ///     Variable: ``[batch * seq, vocab_size]`` (row ``b * seq + s`` predicts the token after
    ///     ``tokens[b, s]``).
    ///
    /// Raises:
    ///     TokenError: as ``loss()``.
    #[pyo3(signature = (tokens, position_ids = None))]
    fn logits(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        position_ids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyVariable> {
        let vocab = self.read().config().vocab_size;
        let (ids, shape) = token_ids(tokens, 2, vocab, "tokens")?;
        match position_ids.filter(|p| !p.is_none()) {
            Some(p) => {
                let positions = crate::tokens::position_ids(p, &shape)?;
                compute(py, || {
                    self.read()
                        .logits_packed(&ids, &positions, shape[0], shape[1])
                })
                .map(PyVariable)
            }
            None => compute(py, || self.read().logits(&ids, shape[0], shape[1])).map(PyVariable),
        }
    }

    /// Token id that starts a sequence (``config.bos_token_id``), or None.
    #[getter]
    fn bos_token_id(&self) -> Option<u32> {
        self.read().config().bos_token_id
    }

    /// Token ids that end a sequence (``config.eos_token_ids``; empty when none).
    #[getter]
    fn eos_token_ids(&self) -> Vec<u32> {
        self.read().config().eos_token_ids.clone()
    }

    /// A new incremental decoding session sharing this model's current weights (with a per-layer
    /// K/V cache of ``max_seq_len`` positions). It builds no graph and never checkpoints.
    ///
    /// The session reads the weights' values at each token, so training or ``load_weights``
    /// between tokens is visible to later ones. A structural change of the model after the
    /// session was opened (``enable_lora``, ``set_lora_active``, ``merge_lora``, ``load_lora``)
    /// makes its next ``decode_token`` raise ``DecodeError``: open a new session.
    ///
    /// Raises:
    ///     OutOfMemoryError: when the K/V cache cannot be allocated.
    fn decode_session(&self, py: Python<'_>) -> PyResult<PyDecodeSession> {
        let session = compute(py, || self.read().decode_session())?;
        Ok(PyDecodeSession {
            inner: Mutex::new(session),
        })
    }

    /// Puts the model in training mode (the default) and returns it, as PyTorch's
    /// ``module.train()``. Dropout is active only in training mode while a graph is recorded.
    ///
    /// Args:
    ///     mode: ``False`` is the same as ``eval()``.
    ///
    /// Returns:
    ///     DecoderOnlyTransformer: this model.
    #[pyo3(signature = (mode = true))]
    fn train(slf: Py<Self>, mode: bool) -> Py<Self> {
        slf.get().write().set_training(mode);
        slf
    }

    /// Puts the model in evaluation mode (no dropout, even while recording a graph) and returns
    /// it, as PyTorch's ``module.eval()``.
    ///
    /// Returns:
    ///     DecoderOnlyTransformer: this model.
    fn eval(slf: Py<Self>) -> Py<Self> {
        slf.get().write().set_training(false);
        slf
    }

    /// Whether the model is in training mode (``train()``, the default) or not (``eval()``).
    #[getter]
    fn training(&self) -> bool {
        self.read().is_training()
    }

    /// The dropout step: how many training forwards with a dropout probability above 0 recorded
    /// a graph (starts at 0). Forward ``n`` draws its masks from a key of ``config.seed`` and
    /// ``n``. Not saved with the model: a resumed run sets it back to continue the same masks.
    ///
    /// Raises:
    ///     ConfigError: when set to anything but an int in ``[0, 2**64)`` (a bool too), named.
    #[getter]
    fn dropout_step(&self) -> u64 {
        self.read().dropout_step()
    }

    #[setter]
    fn set_dropout_step(&self, step: Bound<'_, PyAny>) -> PyResult<()> {
        let step = crate::rng::u64_arg(&step, "dropout_step")?;
        self.write().set_dropout_step(step);
        Ok(())
    }

    /// The dropout probability on the active adapters' inputs (0 without active adapters).
    #[getter]
    fn lora_dropout(&self) -> f64 {
        f32_as_python_float(self.read().lora_dropout())
    }

    /// Changes dropout probabilities of later training forwards; an argument left ``None``
    /// keeps its value. ``attention_dropout`` and ``residual_dropout`` are config fields (saved
    /// with the model); ``lora_dropout`` applies to every adapter (saved with the adapter).
    ///
    /// Raises:
    ///     ConfigError: naming the field for a value that is not a number in ``[0, 1)``.
    ///     LoraError: for ``lora_dropout`` on a model without adapters. Nothing changes on error.
    #[pyo3(signature = (attention_dropout = None, residual_dropout = None, lora_dropout = None))]
    fn set_dropout(
        &self,
        attention_dropout: Option<Bound<'_, PyAny>>,
        residual_dropout: Option<Bound<'_, PyAny>>,
        lora_dropout: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let mut m = self.write();
        set_model_dropout(&mut m, attention_dropout, residual_dropout, lora_dropout)
    }

    /// How many block forwards ran so far (original forwards plus checkpoint replays).
    #[getter]
    fn block_forward_count(&self) -> usize {
        self.read().block_forward_count()
    }

    fn __repr__(&self) -> String {
        let m = self.read();
        format!(
            "DecoderOnlyTransformer({}, attention={:?}, activation_checkpointing={:?}, \
             device={:?}, has_lora={})",
            PyTransformerConfig(m.config().clone()).__repr__(),
            m.attention_kind().name(),
            m.activation_checkpointing().to_string(),
            m.device().name(),
            if m.has_lora() { "True" } else { "False" },
        )
    }
}

/// The bound on one activation of a planned training step, in bytes: 2^47, the bound of model
/// sizes (the C ABI's `rt_model_activation_checkpointing_plan` applies the same one).
const MAX_PLAN_ACTIVATION_BYTES: u128 = 1 << 47;
