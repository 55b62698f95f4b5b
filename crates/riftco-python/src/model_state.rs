//! Saving and loading `DecoderOnlyTransformer` state from Python: model files (safetensors +
//! `config.json`, sharded Hugging Face folders) and PEFT LoRA adapters.

use std::path::PathBuf;

use pyo3::prelude::*;
use riftco_transformer::state::{
    config_json_pairing, save_model_as, ConfigJsonPairing, StateDtype,
};
use riftco_transformer::{
    load_lora_adapter, load_model_as, load_model_as_stored, load_weights_into, save_lora_adapter,
    WeightDtype,
};

use crate::errors::{compute, transformer_err, Exc};
use crate::model::{attention_kind, parse_determinism_check, PyModel};
use crate::policy::policy_from;
#[pymethods]
impl PyModel {
    /// Saves the base weights as a safetensors file (Hugging Face Llama names, ``[out, in]``
    /// linear weights, the config in the metadata) and a Hugging Face ``config.json`` beside it.
    /// The folder is replaced atomically as a whole: the new folder (the two files plus every
    /// other entry of the current one, such as ``tokenizer.json`` or ``README.md``, hard-linked)
    /// is built under a temporary sibling ``.<folder>.tmp.<pid>.<n>`` and exchanged with the live
    /// one in one system call (Linux ``renameat2(RENAME_EXCHANGE)``, macOS
    /// ``renamex_np(RENAME_SWAP)``), so a process killed at any moment leaves a folder that
    /// every reader (Hugging Face transformers included) loads as the old or the new model; the
    /// next save removes the temporary it left. Where the exchange is unavailable (another
    /// system, a filesystem without it, a parent folder that is not writable, the folder holding
    /// the working folder) the files are renamed one by one, the state last: riftco still loads
    /// the old or the new model, but a kill between the two renames can leave a ``config.json``
    /// of the other save for other readers. The checkpointing policy is not saved.
    ///
    /// Args:
    ///     path: the ``.safetensors`` file to write (not named ``config.json``).
    ///     dtype: ``"float32"`` (default, exact) or ``"bfloat16"`` (each value rounded to the
    ///         nearest bfloat16, ties to even; half the bytes, for exchange; ``config.json``
    ///         then says ``"torch_dtype": "bfloat16"``).
    ///
    /// Raises:
    ///     ConfigError: for another ``dtype`` (named).
    ///     ModelStateError: for an unusable path name.
    ///     OSError: when the file cannot be written (the path is in the message).
    #[pyo3(signature = (path, dtype = "float32"))]
    fn save(&self, py: Python<'_>, path: PathBuf, dtype: &str) -> PyResult<()> {
        let dtype = match dtype {
            "float32" => StateDtype::F32,
            "bfloat16" => StateDtype::BF16,
            other => {
                return Err(Exc::Config.err(format!(
                    "dtype = {other:?}: expected \"float32\" or \"bfloat16\""
                )))
            }
        };
        compute(py, || save_model_as(&self.read(), &path, dtype))
    }

    /// Loads a model saved by ``save()``, a Hugging Face Llama checkpoint (``config.json``
    /// beside the weights), or a GGUF file (llama.cpp) of the ``llama`` architecture.
    ///
    /// Args:
    ///     path: the ``.safetensors`` file, or the ``model.safetensors.index.json`` of a sharded
    ///         folder (every shard it names is read). F32, BF16 and F16 tensors are read,
    ///         converted to f32 exactly. Or a ``.gguf`` file (or any file starting with the
    ///         magic ``GGUF``): the config comes from its metadata (``llama.*`` keys; the LM
    ///         head is tied when the file has no ``output.weight``), every tensor is
    ///         dequantized to float32 bitwise as llama.cpp's reference (F32, F16, BF16, Q8_0,
    ///         Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), one tensor at a time, and
    ///         the rows of the Q and K projections that llama.cpp's converter permutes are put
    ///         back in Hugging Face order.
    ///     attention: ``"flash"`` or ``"materialized"``.
    ///     activation_checkpointing: any policy form the constructor accepts (the file records
    ///         none).
    ///     activation_memory_budget: bytes (int) or a size string, as for the constructor.
    ///     determinism_check: ``"off"``, ``"metadata"`` (default) or ``"values"`` (not saved).
    ///     dtype: ``None`` (default): as stored — a GGUF file's quantized matrices stay in
    ///         their blocks (Q4_0 ... Q6_K) and its F16/BF16 tensors in 16 bits, the base then
    ///         frozen (train LoRA adapters on it; ``"float32"`` dequantizes for full
    ///         fine-tuning); a safetensors state loads as float32. ``"float32"``;
    ///         ``"bfloat16"`` / ``"float16"``: every base weight is read straight into 16-bit
    ///         storage, tensor by tensor (a file of that format keeps its bits, others are
    ///         rounded to nearest even), and frozen (see ``set_frozen_weights_dtype``); loading
    ///         never holds an f32 copy then. ``"nf4"`` (QLoRA's NF4, blocks of 64, double
    ///         quantized absmax), ``"q8_0"``, ``"q4_0"``, ``"q4_1"``, ``"q5_0"``, ``"q5_1"``,
    ///         ``"q4_k"``, ...: the base is read as float32, frozen, and every matrix quantized
    ///         (the RMSNorm gains stay float32); a matrix whose rows are not whole blocks of the
    ///         format is a ``ConfigError`` naming it.
    ///
    /// Returns:
    ///     DecoderOnlyTransformer: a new model with the saved config and weights.
    ///
    /// Raises:
    ///     ModelStateError: for a truncated, corrupt or mismatching file (names, shapes, a dtype
    ///         other than F32/BF16/F16; for GGUF: another architecture, a tensor type not
    ///         listed above, a missing metadata key, each named), a bad shard index (a missing shard, a tensor mapped
    ///         twice or not where the index says, a shard path leaving the folder),
    ///         an invalid declared config, or a path that is not a regular file (a FIFO, a
    ///         device such as ``/dev/zero``, a socket).
    ///     OSError: when the file cannot be read (``IsADirectoryError`` for a directory).
    ///     ConfigError: for an unknown option string (``dtype`` included) or a policy that does
    ///         not fit the saved config (as the constructor).
    ///
    /// Warns:
    ///     RuntimeWarning: the ``config.json`` beside the file is not the one saved with it (a
    ///         killed save or an edit): the state's architecture and weights load, edited dropout
    ///         probabilities apply; a Hugging Face loader reads the other file until a save.
    #[staticmethod]
    #[pyo3(
        signature = (path, attention = "flash", activation_checkpointing = None,
                     activation_memory_budget = None, *, determinism_check = "metadata",
                     dtype = None),
        text_signature = "(path, attention='flash', activation_checkpointing='disabled', \
                          activation_memory_budget=None, *, determinism_check='metadata', \
                          dtype=None)"
    )]
    fn load(
        py: Python<'_>,
        path: PathBuf,
        attention: &str,
        activation_checkpointing: Option<Bound<'_, PyAny>>,
        activation_memory_budget: Option<Bound<'_, PyAny>>,
        determinism_check: &str,
        dtype: Option<&str>,
    ) -> PyResult<Self> {
        let attention = attention_kind(attention)?;
        let check = parse_determinism_check(determinism_check)?;
        let dtype: Option<WeightDtype> = dtype
            .map(|d| d.parse())
            .transpose()
            .map_err(transformer_err)?;
        let checkpointing = policy_from(
            activation_checkpointing.as_ref(),
            activation_memory_budget.as_ref(),
        )?;
        let (model, pairing) = compute(py, move || {
            let mut model = match dtype {
                Some(dtype) => load_model_as(&path, attention, checkpointing, dtype)?,
                None => load_model_as_stored(&path, attention, checkpointing)?,
            };
            model.set_determinism_check(check);
            Ok::<_, riftco_transformer::TransformerError>((model, config_json_pairing(&path)?))
        })?;
        if pairing == ConfigJsonPairing::Mismatched {
            let message = c"config.json beside this model state is not the one saved with it (a \
                            save interrupted between its two renames, or an edit?): the state's \
                            own architecture and weights were loaded, with any dropout \
                            probabilities edited in config.json; save again to rewrite it";
            PyErr::warn(
                py,
                &py.get_type::<pyo3::exceptions::PyRuntimeWarning>(),
                message,
                1,
            )?;
        }
        Ok(Self::wrap(model))
    }

    /// Overwrites the base weights in place from a file saved by ``save()`` (or a GGUF file,
    /// as ``load``) with the same architecture. Graphs recorded before become stale.
    ///
    /// Raises:
    ///     ModelStateError: for a bad file or another architecture.
    ///     OSError: when the file cannot be read.
    fn load_weights(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        compute(py, || load_weights_into(&self.read(), &path))
    }

    /// Saves the LoRA adapters in PEFT layout (``adapter_model.safetensors`` and
    /// ``adapter_config.json``) into a directory (created if missing), replacing the folder
    /// atomically as a whole (as ``save()``: other files in it survive; a killed save leaves the
    /// old or the new adapter for PEFT too, except on the per-file fallback).
    ///
    /// Raises:
    ///     LoraError: when the model has no adapters.
    ///     OSError: when the directory cannot be written.
    fn save_lora(&self, py: Python<'_>, dir: PathBuf) -> PyResult<()> {
        compute(py, || save_lora_adapter(&self.read(), &dir))
    }

    /// Loads PEFT LoRA adapters saved by ``save_lora()`` (replacing any present) and activates
    /// them; the base weights are frozen.
    ///
    /// Raises:
    ///     ModelStateError: for a malformed or mismatching adapter, or a file that is not a
    ///         regular file.
    ///     OSError: when the files cannot be read.
    fn load_lora(&self, py: Python<'_>, dir: PathBuf) -> PyResult<()> {
        compute(py, || load_lora_adapter(&mut self.write(), &dir))
    }
}
