//! The LoRA and frozen-storage methods of the Python ``DecoderOnlyTransformer``: adapters,
//! their activation and merge, and the storage of the frozen base.

use pyo3::prelude::*;

use riftco_transformer::{LoraConfig, LoraTargets, WeightDtype};

use crate::config::probability;
use crate::errors::{compute, transformer_err, Exc};
use crate::model::PyModel;

#[pymethods]
impl PyModel {
    /// Adds LoRA adapters (Hu et al. 2021) to the attention projections (and the MLP with
    /// ``mlp=True``), activates them and freezes every base parameter. ``parameters()`` then
    /// returns the adapter matrices only; earlier Variables from ``parameters()`` are stale.
    ///
    /// Args:
    ///     rank: adapter rank ``r`` in ``1..=d_model``.
    ///     alpha: scale numerator (the update is ``alpha / r * B @ A``).
    ///     mlp: also adapt ``gate_proj``, ``up_proj``, ``down_proj``.
    ///     seed: seed of the ``A`` initialisation (``B`` starts at zero).
    ///     attention: adapt ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``.
    ///     dropout: dropout probability on each adapter's input, in ``[0, 1)`` (PEFT's
    ///         ``lora_dropout``, saved in ``adapter_config.json``; ``None`` means 0).
    ///
    /// Raises:
    ///     LoraError: for a bad rank or alpha, no target, or when adapters already exist.
    ///     ConfigError: naming ``lora_dropout`` for a dropout that is not a number in ``[0, 1)``.
    #[pyo3(signature = (rank = 8, alpha = 16.0, mlp = false, seed = 0, attention = true,
                        dropout = None))]
    #[allow(clippy::too_many_arguments)]
    fn enable_lora(
        &self,
        py: Python<'_>,
        rank: i64,
        alpha: f32,
        mlp: bool,
        seed: u64,
        attention: bool,
        dropout: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let dropout = dropout.map_or(Ok(0.0), |p| probability("lora_dropout", &p))?;
        let rank = usize::try_from(rank)
            .map_err(|_| Exc::Lora.err(format!("LoRA: rank {rank} must be positive")))?;
        let lora = LoraConfig {
            rank,
            alpha,
            targets: LoraTargets { attention, mlp },
            seed,
            dropout,
        };
        compute(py, || self.write().enable_lora(&lora))
    }

    /// Activates or deactivates existing adapters (base weights stay frozen while adapters
    /// exist).
    ///
    /// Raises:
    ///     LoraError: when the model has no adapters.
    fn set_lora_active(&self, py: Python<'_>, active: bool) -> PyResult<()> {
        compute(py, || self.write().set_lora_active(active))
    }

    /// Stores every frozen base weight (the base under LoRA) in ``dtype`` while every op keeps
    /// computing in float32.
    ///
    /// 16 bits: each op reads such a weight upcast to float32 (exactly) in a transient copy of
    /// that one weight, counted as ``workspace`` while it lives, and
    /// ``memory_stats()["parameter"]`` shows the frozen bytes halved. Logits, losses and adapter
    /// gradients are bitwise those of a float32 model holding the same rounded weights.
    ///
    /// Quantized (QLoRA, Dettmers et al. 2023; llama.cpp's block formats): every frozen matrix
    /// is quantized (the RMSNorm gains stay float32) and the products against it dequantize a
    /// block of rows (or, for ``dY · W``, of columns) at a time into a workspace of at most
    /// 4 MiB, reading the quantized blocks directly when decoding one token, on the CPU and on
    /// a GPU alike (on a GPU model the weights are quantized on the CPU and their bytes
    /// uploaded; ``"float32"`` dequantizes them on the device). ``memory_stats()["parameter"]``
    /// shows the quantized bytes. A product whose weight fits
    /// one block is bitwise that of a float32 model holding the dequantized weights (all of
    /// SmolLM2-135M's projections); larger ones are split along output columns only.
    ///
    /// Trainable weights (adapters; fully trained weights) and their Adam state stay float32.
    /// Saving writes the stored values (as float32, or exactly with ``dtype="bfloat16"``).
    ///
    /// Args:
    ///     dtype: ``"bfloat16"``, ``"float16"`` (finite up to 65504), ``"float32"`` (back to
    ///         4 bytes, exact), or a quantized format: ``"nf4"`` (blocks of 64, double-quantized
    ///         absmax), ``"q8_0"``, ``"q4_0"``, ``"q4_1"``, ``"q5_0"``, ``"q5_1"`` (blocks of
    ///         32), ``"q2_k"`` ... ``"q6_k"`` (blocks of 256); case-insensitive.
    ///
    /// Raises:
    ///     ConfigError: naming ``dtype`` for another name (listing the accepted ones), for a
    ///         compressed dtype when no weight is frozen (enable LoRA first), for a 16-bit one
    ///         when the model is not on the CPU (16-bit storage lives on the CPU only), and
    ///         naming the tensor whose rows are not whole blocks of the format; the model is
    ///         unchanged then.
    ///
    /// Example:
    ///     >>> import riftco
    ///     >>> config = riftco.TransformerConfig(vocab_size=64, d_model=32, n_heads=4,
    ///     ...                                   n_layers=2, d_ff=48, max_seq_len=16)
    ///     >>> model = riftco.DecoderOnlyTransformer(config)
    ///     >>> model.enable_lora(rank=4, alpha=8.0)
    ///     >>> model.set_frozen_weights_dtype("bfloat16")
    ///     >>> model.frozen_weights_dtype
    ///     'bfloat16'
    fn set_frozen_weights_dtype(&self, py: Python<'_>, dtype: &str) -> PyResult<()> {
        let dtype: WeightDtype = dtype.parse().map_err(transformer_err)?;
        compute(py, || self.write().set_frozen_weights_dtype(dtype))
    }

    /// How the frozen base weights are stored: ``"float32"`` (default, and when none is
    /// frozen), ``"bfloat16"``, ``"float16"`` or a quantized format such as ``"nf4"`` or
    /// ``"q4_1"`` (the first quantized one, for a GGUF of mixed types; see
    /// ``set_frozen_weights_dtype``).
    #[getter]
    fn frozen_weights_dtype(&self) -> &'static str {
        self.read().frozen_weights_dtype().name()
    }

    /// Merges active adapters into the base weights (``W += alpha / r * B @ A``), removes them
    /// and makes every base parameter trainable again.
    ///
    /// Raises:
    ///     LoraError: when the model has no adapters, when they are inactive
    ///         (``set_lora_active(False)``: merging would drop them unmerged;
    ///         ``set_lora_active(True)`` first), or when the frozen base is stored in 16 bits or
    ///         quantized (``set_frozen_weights_dtype("float32")`` first, or export the merged
    ///         model with ``riftco export``); the model is unchanged.
    fn merge_lora(&self, py: Python<'_>) -> PyResult<()> {
        compute(py, || self.write().merge_lora())
    }

    /// Whether LoRA adapters exist.
    #[getter]
    fn has_lora(&self) -> bool {
        self.read().has_lora()
    }

    /// Whether LoRA adapters exist and are active.
    #[getter]
    fn lora_active(&self) -> bool {
        self.read().lora_active()
    }
}
