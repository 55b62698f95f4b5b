//! The model-state file: save, load, and the config it declares.

use super::atomic::{
    check_destination, remove_stale_temporaries, write_safetensors_as, AtomicGroup,
};
use super::dtype::StateDtype;
use super::folder::{save_folder_atomic, Exchange, WriteFile};
use super::gguf::{config_from_gguf, is_gguf, load_llama, load_llama_values, GgufFile};
use super::hf_config::{attention_dropout, check_dtype, config_from_hf, hf_config_json_as};
use super::read::{
    check_tensors, copy_into, read_header, read_json, read_json_bytes, read_values, unchanged,
};
use super::shards::{is_shard_index, load_sharded};
use super::values::ParamValues;
use super::{
    fnv1a64_hex, io_err, parent_dir, state_err, CONFIG_METADATA_KEY, HF_CONFIG_FILE,
    HF_CONFIG_HASH_KEY,
};
use crate::checkpointing::ActivationCheckpointing;
use crate::config::{display_f32, TransformerConfig};
use crate::error::Result;
use crate::frozen_dtype::WeightDtype;
use crate::layout;
use crate::model::DecoderOnlyTransformer;
use crate::policy::FullSequenceAttentionKind;
use riftco_tensor::Tensor;
use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::Path;

/// Writes the model state to `path` (safetensors) and a Hugging Face `config.json` into the same
/// folder, as one consistent pair.
///
/// The file holds every base parameter under its Hugging Face Llama name, f32, little endian,
/// Linear weights `[out, in]` (a tied model writes `model.embed_tokens.weight` once and no
/// `lm_head.weight`, as Hugging Face does), and the metadata `{"format": "pt", "riftco_config": <config>,
/// "riftco_config_json_fnv1a64": <hash>}`. `config.json` is a `LlamaConfig` (`architectures
/// ["LlamaForCausalLM"]`, `model_type "llama"`, `num_key_value_heads = n_kv_heads`,
/// `tie_word_embeddings`, `torch_dtype "float32"`, ...) plus the key `"riftco"` holding the
/// [`TransformerConfig`](crate::TransformerConfig); the hash is [`fnv1a64_hex`] of its exact bytes.
///
/// When LoRA adapters exist only the base weights are saved (unmerged, whether or not the
/// adapters are active): save adapters with [`crate::state::save_lora_adapter`], or call
/// [`DecoderOnlyTransformer::merge_lora`](crate::DecoderOnlyTransformer::merge_lora) first to save the merged model. The
/// activation-checkpointing policy is not saved.
///
/// The save is atomic as a whole, for any reader (Hugging Face transformers included): the
/// complete new folder (both files, plus every other entry of the current folder reproduced by
/// hard links, so `tokenizer.json`, `README.md` or `checkpoints/` survive) is built under a
/// temporary sibling `.<folder name>.tmp.<pid>.<n>`, fsynced, and exchanged with the live folder
/// in one system call (Linux `renameat2(RENAME_EXCHANGE)`, macOS `renamex_np(RENAME_SWAP)`);
/// the old tree is then removed. A process killed at any moment leaves the folder entirely the
/// old one or entirely the new one; its temporary sibling is removed by the next save of the
/// folder. A folder given through a symlink is replaced at its target (the link is kept).
///
/// Where the exchange cannot be used (another system, a filesystem refusing the exchange or the
/// hard links, a parent folder that is not writable, the folder holding the process's working
/// folder — as for a bare file name — or a filesystem root), the save falls back to the per-file
/// protocol: both files are written in full into temporaries in the folder and fsynced, then
/// renamed, `config.json` first, the state last. Then a kill leaves a state file that is
/// entirely the old one or entirely the new one, and [`load_model`] (which reads the state's own
/// config, never `config.json`, for such a file) loads it; only a kill between the two renames
/// leaves a `config.json` of the newer save beside the older state, which the state's hash
/// tells apart (see [`config_json_pairing`]) but other readers do not; the next save replaces
/// it (a `config.json` already equal to the new one is not rewritten, so saves of one config
/// have no such window). Temporaries left by killed saves are removed at the start of the next
/// save. The folder must exist.
///
/// # Errors
/// [`TransformerError::Io`](crate::TransformerError::Io) naming the destination path when the folder is missing or not
/// writable or a file of the new folder cannot be written (the existing files are left intact);
/// [`TransformerError::State`](crate::TransformerError::State) when `path` has no file name, is
/// named `config.json`, or it or `config.json` beside it is a folder, FIFO, device or socket.
pub fn save_model(model: &DecoderOnlyTransformer, path: &Path) -> Result<()> {
    save_model_as(model, path, StateDtype::F32)
}

/// [`save_model`] with the tensors saved in `dtype`: [`StateDtype::BF16`] rounds each f32 to
/// the nearest bfloat16 (ties to even) and `config.json` then says `"torch_dtype": "bfloat16"`
/// (half the bytes, for exchange: a model loaded from it holds the rounded values).
///
/// # Errors
/// As [`save_model`].
pub fn save_model_as(model: &DecoderOnlyTransformer, path: &Path, dtype: StateDtype) -> Result<()> {
    let name = match path.file_name() {
        None => return Err(state_err(path, "the path has no file name")),
        Some(n) if n == HF_CONFIG_FILE => {
            return Err(state_err(
                path,
                "the model state cannot be named config.json: that name is used by the \
                 Hugging Face config written beside it",
            ))
        }
        Some(n) => n.to_string_lossy().into_owned(),
    };
    let config = model.config();
    let config_json = serde_json::to_string(config).map_err(|e| state_err(path, e))?;
    let hf = serde_json::to_vec_pretty(&hf_config_json_as(config, dtype))
        .map_err(|e| state_err(path, e))?;
    let tensors: Vec<(String, Tensor)> = model
        .weights()
        .named_base_parameters()
        .into_iter()
        .map(|(name, p)| (name, p.value().clone()))
        .collect();
    let metadata = HashMap::from([
        ("format".to_string(), "pt".to_string()),
        (CONFIG_METADATA_KEY.to_string(), config_json),
        (HF_CONFIG_HASH_KEY.to_string(), fnv1a64_hex(&hf)),
    ]);
    let dir = parent_dir(path);
    let hf_path = dir.join(HF_CONFIG_FILE);
    check_destination(&hf_path)?;
    check_destination(path)?;
    // The folder must exist (a missing one is reported naming the state's path).
    fs::metadata(&dir).map_err(|source| io_err(path, source))?;
    let write_hf = |out: &mut dyn Write| {
        out.write_all(&hf)
            .map_err(|source| io_err(&hf_path, source))
    };
    let write_state = |mut out: &mut dyn Write| {
        write_safetensors_as(
            path,
            &mut out,
            &tensors,
            metadata.clone(),
            dtype,
            model.parameter_residency(),
        )
    };
    // An identical config.json (every save of a training run) is hard-linked into the new
    // folder like the other files kept, not rewritten.
    let mut files: Vec<(&str, WriteFile<'_>)> = Vec::with_capacity(2);
    if !unchanged(&hf_path, &hf) {
        files.push((HF_CONFIG_FILE, &write_hf));
    }
    files.push((&name, &write_state));
    if save_folder_atomic(&dir, &files)? != Exchange::Unsupported {
        return Ok(());
    }
    // The per-file protocol (see the docs above).
    remove_stale_temporaries(&dir, &[&name, HF_CONFIG_FILE]);
    let mut group = AtomicGroup::new();
    // An identical config.json (every save of a training run) is left alone: then the state's
    // rename alone commits the pair and there is no window at all.
    if !unchanged(&hf_path, &hf) {
        group.stage(&hf_path, |out| write_hf(out))?;
    }
    group.stage(path, |out| write_state(out))?;
    group.commit()
}

/// Loads a model saved by [`save_model`], or any safetensors file with exactly the Hugging Face
/// Llama names of the config found in its metadata (`riftco_config`) or, when the metadata lacks
/// it, in the `config.json` beside it (its `"riftco"` key, else the `LlamaConfig` fields), or a
/// GGUF file of the `llama` architecture (a `.gguf` name or the magic `"GGUF"`: config from its
/// metadata, every tensor dequantized to f32 bitwise as llama.cpp's reference, the rows of Q and
/// K put back in Hugging Face order; see [`GgufFile`](super::GgufFile)).
///
/// The dropout probabilities are training settings that the user-facing `config.json` decides:
/// beside a state with `riftco_config`, a `config.json` of the same architecture whose
/// `attention_dropout` (top level or `"riftco"`) or `"riftco"` `residual_dropout` differs from
/// the state's replaces it (an edit by hand or by Hugging Face tooling); the architecture always
/// comes from the state. Every probability present in either file must be a number in `[0, 1)`
/// and is reported as written; two copies in `config.json` that disagree with each other (both
/// edited, or, for a state without `riftco_config`, the top-level key against the `"riftco"`
/// object) are an error naming both values.
///
/// Validates before building anything: a readable file, a sane header (length within the file,
/// UTF-8 JSON, tensor offsets covering the data exactly), a valid config, every expected tensor
/// present, no unknown tensor, dtype F32, each shape equal to the config's.
///
/// # Errors
/// [`TransformerError::Io`](crate::TransformerError::Io) when the file cannot be read; [`TransformerError::State`](crate::TransformerError::State) with the
/// reason otherwise (truncated file, header length beyond the file, garbage, missing or unknown
/// tensor names, wrong dtype, a shape that disagrees with the config — naming the tensor and
/// both shapes — or an invalid or missing config, including an invalid or conflicting dropout
/// probability in `config.json`, naming that file and the field). No model is built on error.
pub fn load_model(
    path: &Path,
    attention: FullSequenceAttentionKind,
    checkpointing: impl Into<ActivationCheckpointing>,
) -> Result<DecoderOnlyTransformer> {
    load_model_as(path, attention, checkpointing, WeightDtype::Float32)
}

/// [`load_model`] with the base weights stored in `dtype`: float32 (trainable, as
/// [`load_model`]); bfloat16 / float16 — every base weight frozen (`requires_grad = false`;
/// enable LoRA to train adapters on it) and read into 16-bit storage straight from the file,
/// tensor by tensor (a file of that format keeps its own bits; others are rounded to nearest,
/// ties to even); or a quantized format ([`WeightDtype::Quantized`]: NF4, Q8_0, Q4_K, ...) —
/// the base frozen and every matrix quantized as it is read (a GGUF tensor already in that
/// format keeps its bytes; the RMSNorm gains stay float32). Loading never holds an f32 copy of
/// the model then. See [`DecoderOnlyTransformer::set_frozen_weights_dtype`].
///
/// # Errors
/// As [`load_model`]; [`crate::TransformerError::Config`] naming a matrix whose rows are not
/// whole blocks of the quantized format.
pub fn load_model_as(
    path: &Path,
    attention: FullSequenceAttentionKind,
    checkpointing: impl Into<ActivationCheckpointing>,
    dtype: WeightDtype,
) -> Result<DecoderOnlyTransformer> {
    // A quantized base is quantized tensor by tensor as it is read (one tensor in f32 at a
    // time; a GGUF tensor already in that format keeps its bytes).
    let quantize = dtype.quant_format();
    let half = dtype.half();
    if is_gguf(path) {
        return load_llama(path, attention, checkpointing, half, false, quantize);
    }
    if is_shard_index(path) {
        return load_sharded(path, attention, checkpointing, half, quantize);
    }
    let header = read_header(path)?;
    let config = resolve_config(path, &header.metadata)?;
    let expected = expected_file_shapes(&config, header.tensors.tensors().contains_key(LM_HEAD));
    check_tensors(path, &header, &expected, &config_summary(&config))?;
    let values = untie_values(
        path,
        &config,
        read_values(path, header, &expected, half, quantize)?,
    )?;
    // The parameters take the values read (no initialised model to copy them into).
    DecoderOnlyTransformer::from_parameter_values(config, attention, checkpointing, values)
}

/// [`load_model`] keeping the file's storage formats: a GGUF file's block-quantized matrices
/// stay in their blocks (Q4_0 ... Q6_K; ops dequantize a block at a time) and its F16 / BF16
/// tensors in 16 bits, and then the whole base is frozen (train LoRA adapters on it); a file of
/// only F32 tensors, and any safetensors state, loads as [`load_model`] does (float32,
/// trainable).
///
/// # Errors
/// As [`load_model`].
pub fn load_model_as_stored(
    path: &Path,
    attention: FullSequenceAttentionKind,
    checkpointing: impl Into<ActivationCheckpointing>,
) -> Result<DecoderOnlyTransformer> {
    if is_gguf(path) {
        return load_llama(path, attention, checkpointing, None, true, None);
    }
    load_model_as(path, attention, checkpointing, WeightDtype::Float32)
}

/// Whether the `config.json` beside a model-state file is the one saved with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigJsonPairing {
    /// `config.json` has exactly the bytes whose hash the state names.
    Paired,
    /// `config.json` differs from the one saved with the state: a save was killed between its
    /// two renames (or the file was edited). The state's own architecture is what loads (its
    /// dropout probabilities, when edited in `config.json`, apply); the next
    /// save rewrites `config.json`.
    Mismatched,
    /// There is no `config.json`, or it cannot be read as a bounded regular file.
    Missing,
    /// The state names no `config.json` hash (a file from another writer or an older riftco).
    Unrecorded,
}

/// Checks the `config.json` beside the model-state file `path` against the hash of the one
/// saved with it (metadata `riftco_config_json_fnv1a64`). Reads only the state's header and at
/// most [`MAX_JSON_BYTES`](super::MAX_JSON_BYTES) of `config.json`. A shard index
/// (`*.index.json`) is [`ConfigJsonPairing::Unrecorded`].
///
/// # Errors
/// As [`load_model`] for the state file's header.
pub fn config_json_pairing(path: &Path) -> Result<ConfigJsonPairing> {
    // A shard index or a GGUF file records no config.json hash.
    if is_shard_index(path) || is_gguf(path) {
        return Ok(ConfigJsonPairing::Unrecorded);
    }
    let header = read_header(path)?;
    let Some(recorded) = header.metadata.get(HF_CONFIG_HASH_KEY) else {
        return Ok(ConfigJsonPairing::Unrecorded);
    };
    let Ok(bytes) = read_json_bytes(&parent_dir(path).join(HF_CONFIG_FILE)) else {
        return Ok(ConfigJsonPairing::Missing);
    };
    Ok(if fnv1a64_hex(&bytes) == *recorded {
        ConfigJsonPairing::Paired
    } else {
        ConfigJsonPairing::Mismatched
    })
}

/// Loads the base weights in `path` into `model` in place: each parameter's existing tensor is
/// overwritten (so its version is bumped and graphs recorded before become stale; optimizers
/// holding the parameters keep working on the new values).
///
/// A GGUF file (see [`load_model`]) loads too, when the config its metadata declares is the
/// model's.
///
/// # Errors
/// [`TransformerError::Config`](crate::TransformerError::Config) while an owner holds the
/// parameters between uses ([`crate::residency`]).
/// As [`load_model`]; also [`TransformerError::State`](crate::TransformerError::State) when the file's `riftco_config` metadata
/// (or a GGUF file's metadata)
/// describes a different architecture than the model's config (the seed is ignored), or `path`
/// is a shard index (`*.index.json`). Nothing is copied unless every tensor validates.
pub fn load_weights_into(model: &DecoderOnlyTransformer, path: &Path) -> Result<()> {
    model.refuse_while_sharded("load_weights")?;
    if model.has_half_weights() {
        return Err(state_err(
            path,
            format!(
                "the model's frozen weights are stored in {} (read-only): loading weights in \
                 place needs float32 ones (set_frozen_weights_dtype(float32) first, or load \
                 the file as a new model)",
                model.frozen_weights_dtype()
            ),
        ));
    }
    if is_shard_index(path) {
        return Err(state_err(
            path,
            "a shard index: weights are loaded in place from one safetensors file; load a \
             sharded checkpoint with load_model",
        ));
    }
    let config = model.config();
    if is_gguf(path) {
        let file = GgufFile::open(path)?;
        let file_config = config_from_gguf(&file)?;
        if !same_architecture(&file_config, config) {
            return Err(state_err(
                path,
                format!(
                    "the GGUF file's config ({}) differs from the model's config ({})",
                    config_summary(&file_config),
                    config_summary(config)
                ),
            ));
        }
        let values = load_llama_values(&file, config, None, false, None)?;
        return copy_into(path, &model.weights().named_base_parameters(), values);
    }
    let header = read_header(path)?;
    if let Some(raw) = header.metadata.get(CONFIG_METADATA_KEY) {
        let file_config = parse_riftco_config(path, raw)?;
        if !same_architecture(&file_config, config) {
            return Err(state_err(
                path,
                format!(
                    "the file's config {file_config:?} differs from the model's config {config:?}"
                ),
            ));
        }
    }
    let expected = expected_file_shapes(config, header.tensors.tensors().contains_key(LM_HEAD));
    check_tensors(path, &header, &expected, &config_summary(config))?;
    let values = untie_values(
        path,
        config,
        read_values(path, header, &expected, None, None)?,
    )?;
    copy_into(path, &model.weights().named_base_parameters(), values)
}

/// Hugging Face name and shape of every base parameter of `config`, in state-dict order (equal
/// to [`crate::Weights::named_base_parameters`] of a model built from `config`; a tied config
/// has no `lm_head.weight`).
pub fn expected_base_shapes(config: &TransformerConfig) -> Vec<(String, Vec<usize>)> {
    layout::entries_for(config)
        .map(|e| (e.hf_name(), e.shape(config)))
        .collect()
}

pub(super) const LM_HEAD: &str = "lm_head.weight";
const EMBEDDING: &str = "model.embed_tokens.weight";

/// The tensors a file (or the shards of a folder) of `config` must hold:
/// [`expected_base_shapes`], plus `lm_head.weight` when the config is tied and the file has one
/// anyway (`has_lm_head`: some writers store the tied matrix twice; [`untie_values`] then
/// requires the copies to be equal).
pub(super) fn expected_file_shapes(
    config: &TransformerConfig,
    has_lm_head: bool,
) -> Vec<(String, Vec<usize>)> {
    let mut expected = expected_base_shapes(config);
    if config.tie_word_embeddings && has_lm_head {
        expected.push((LM_HEAD.into(), vec![config.vocab_size, config.d_model]));
    }
    expected
}

/// For a tied config, removes a stored `lm_head.weight` after checking that it equals
/// `model.embed_tokens.weight` bit for bit.
///
/// # Errors
/// [`TransformerError::State`](crate::TransformerError::State) naming both tensors and the
/// first differing element when they differ: such a file is not a tied model.
pub(super) fn untie_values(
    path: &Path,
    config: &TransformerConfig,
    mut values: Vec<(String, ParamValues)>,
) -> Result<Vec<(String, ParamValues)>> {
    if !config.tie_word_embeddings {
        return Ok(values);
    }
    let Some(i) = values.iter().position(|(n, _)| n == LM_HEAD) else {
        return Ok(values);
    };
    let (_, head) = values.remove(i);
    let embed = values.iter().find(|(n, _)| n == EMBEDDING).map(|(_, v)| v);
    if let (ParamValues::Quantized(_, h, _), Some(ParamValues::Quantized(_, e, _))) = (&head, embed)
    {
        // Quantized on load: equal values give equal bytes.
        if h != e {
            return Err(state_err(
                path,
                format!(
                    "the config ties the LM head to the embedding (tie_word_embeddings = true) \
                     but {LM_HEAD} differs from {EMBEDDING}: not a tied model"
                ),
            ));
        }
        return Ok(values);
    }
    let differs = |e: usize| head.bits_at(e) != embed.and_then(|v| v.bits_at(e)).or(Some(0));
    if let Some(e) = (0..head.len()).find(|&e| differs(e)) {
        return Err(state_err(
            path,
            format!(
                "the config ties the LM head to the embedding (tie_word_embeddings = true) but \
                 {LM_HEAD} differs from {EMBEDDING} at element {e} ({} vs {}): not a tied model",
                head.value_at(e),
                embed.map_or(f32::NAN, |v| v.value_at(e))
            ),
        ));
    }
    Ok(values)
}

/// The config of a model-state file: its `riftco_config` metadata (with the dropout
/// probabilities of `config.json`, see [`apply_config_json_dropout`]), else `config.json` beside
/// it (the `"riftco"` key, else the Hugging Face `LlamaConfig` fields). Validated.
pub(super) fn resolve_config(
    path: &Path,
    metadata: &HashMap<String, String>,
) -> Result<TransformerConfig> {
    if let Some(raw) = metadata.get(CONFIG_METADATA_KEY) {
        let mut config = parse_riftco_config(path, raw)?;
        config
            .validate()
            .map_err(|e| state_err(path, format!("the file's config is invalid: {e}")))?;
        apply_config_json_dropout(path, metadata, &mut config)?;
        return Ok(config);
    }
    let hf_path = parent_dir(path).join(HF_CONFIG_FILE);
    if !hf_path.exists() {
        return Err(state_err(
            path,
            format!(
                "no {CONFIG_METADATA_KEY} metadata in the file and no {} beside it",
                hf_path.display()
            ),
        ));
    }
    let value = read_json(&hf_path)?;
    check_dtype(&value).map_err(|reason| state_err(&hf_path, reason))?;
    let (config, fields) = match value.get("riftco") {
        Some(r) => {
            let config: TransformerConfig = serde_json::from_value(r.clone()).map_err(|e| {
                state_err(
                    &hf_path,
                    format!("\"riftco\" is not a TransformerConfig: {e}"),
                )
            })?;
            // No saved value to tell which copy was edited: two copies must agree.
            let top = attention_dropout(&value).map_err(|reason| state_err(&hf_path, reason))?;
            if top.is_some_and(|t| t != config.attention_dropout) {
                return Err(state_err(
                    &hf_path,
                    format!(
                        "attention_dropout = {} disagrees with riftco.attention_dropout = {}: \
                         set both to the probability wanted",
                        value["attention_dropout"],
                        r.get("attention_dropout")
                            .map_or_else(|| "absent (0)".to_string(), ToString::to_string)
                    ),
                ));
            }
            (config, "its \"riftco\" key")
        }
        None => (
            config_from_hf(&value).map_err(|reason| state_err(&hf_path, reason))?,
            "its Hugging Face fields: vocab_size, d_model = hidden_size, n_heads = \
             num_attention_heads, n_layers = num_hidden_layers, d_ff = intermediate_size, \
             max_seq_len = max_position_embeddings",
        ),
    };
    config.validate().map_err(|e| {
        state_err(
            &hf_path,
            format!(
                "the config of {} ({fields}) is invalid: {e}",
                path.display()
            ),
        )
    })?;
    Ok(config)
}

/// The dropout probabilities of `config.json` beside a state whose metadata holds its config.
///
/// The state's metadata decides the architecture (the weights must match it); the dropout
/// probabilities are training settings, and the user-facing `config.json` decides them: a
/// value there that differs from the state's own replaces it, whether edited by hand or by
/// Hugging Face tooling (`AutoConfig.from_pretrained(d); c.attention_dropout = 0.25;
/// c.save_pretrained(d)` rewrites the top-level key and keeps the `"riftco"` object with the
/// old value). `attention_dropout` is read from the top-level key and from `"riftco"`;
/// `residual_dropout` from `"riftco"` only. Every value present is checked (a number in
/// `[0, 1)`, as written); an absent key changes nothing; two copies both changed from the
/// state's value but to different values are an error naming both. A `config.json` with
/// exactly the bytes the state's hash
/// names is the one saved with it and is not read again; one describing another architecture
/// (a newer save's, left by a kill between the two renames of a save) is checked but does not
/// apply. Without `config.json` the state's own probabilities load.
fn apply_config_json_dropout(
    path: &Path,
    metadata: &HashMap<String, String>,
    config: &mut TransformerConfig,
) -> Result<()> {
    let hf_path = parent_dir(path).join(HF_CONFIG_FILE);
    if !hf_path.exists() {
        return Ok(());
    }
    let bytes = read_json_bytes(&hf_path)?;
    if metadata.get(HF_CONFIG_HASH_KEY) == Some(&fnv1a64_hex(&bytes)) {
        return Ok(());
    }
    let value: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| state_err(&hf_path, format!("not valid JSON: {e}")))?;
    let top = attention_dropout(&value).map_err(|reason| state_err(&hf_path, reason))?;
    let (described, riftco) = match value.get("riftco") {
        Some(r) => {
            let c: TransformerConfig = serde_json::from_value(r.clone()).map_err(|e| {
                state_err(
                    &hf_path,
                    format!("\"riftco\" is not a TransformerConfig: {e}"),
                )
            })?;
            (c.clone(), Some(c))
        }
        None => (
            config_from_hf(&value).map_err(|reason| state_err(&hf_path, reason))?,
            None,
        ),
    };
    if !same_architecture(&described, config) {
        return Ok(());
    }
    let saved = config.attention_dropout;
    // A key absent from the "riftco" object (which would parse as 0) changes nothing.
    let has_riftco_key = |key: &str| value["riftco"].get(key).is_some();
    // Shown as written in the file.
    let written = |key: &str| match key {
        "attention_dropout" => value[key].to_string(),
        _ => value["riftco"]
            .get("attention_dropout")
            .map_or_else(|| "absent (0)".to_string(), ToString::to_string),
    };
    let changed: Vec<(&str, f32)> = [
        ("attention_dropout", top),
        (
            "riftco.attention_dropout",
            riftco
                .as_ref()
                .filter(|_| has_riftco_key("attention_dropout"))
                .map(|c| c.attention_dropout),
        ),
    ]
    .into_iter()
    .filter_map(|(key, p)| p.filter(|&p| p != saved).map(|p| (key, p)))
    .collect();
    if let [(k1, p1), (k2, p2)] = changed[..] {
        if p1 != p2 {
            return Err(state_err(
                &hf_path,
                format!(
                    "{k1} = {} disagrees with {k2} = {} (the state {} was saved with {}): set \
                     both to the probability wanted",
                    written(k1),
                    written(k2),
                    path.display(),
                    display_f32(saved)
                ),
            ));
        }
    }
    if let Some(&(_, p)) = changed.first() {
        config.attention_dropout = p;
    }
    if let Some(r) = riftco.filter(|_| has_riftco_key("residual_dropout")) {
        config.residual_dropout = r.residual_dropout;
    }
    Ok(())
}

pub(super) fn parse_riftco_config(path: &Path, raw: &str) -> Result<TransformerConfig> {
    serde_json::from_str(raw).map_err(|e| {
        state_err(
            path,
            format!("metadata {CONFIG_METADATA_KEY} is not a TransformerConfig JSON: {e}"),
        )
    })
}

/// Equal configs apart from the initialisation seed and the dropout probabilities (training
/// settings, not architecture).
pub(super) fn same_architecture(a: &TransformerConfig, b: &TransformerConfig) -> bool {
    let mut a = a.clone();
    a.seed = b.seed;
    a.attention_dropout = b.attention_dropout;
    a.residual_dropout = b.residual_dropout;
    a == *b
}

pub(super) fn config_summary(c: &TransformerConfig) -> String {
    format!(
        "vocab_size {}, d_model {}, n_heads {}, n_kv_heads {}, n_layers {}, d_ff {}, \
         tie_word_embeddings {}",
        c.vocab_size, c.d_model, c.n_heads, c.n_kv_heads, c.n_layers, c.d_ff, c.tie_word_embeddings
    )
}
