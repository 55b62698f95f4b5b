//! Model state and LoRA adapters as safetensors.
//!
//! - [`save_model`] / [`load_model`] / [`load_weights_into`]: every base parameter under its
//!   Hugging Face Llama name (`model.layers.{i}.self_attn.q_proj.weight`, ...), f32, Linear
//!   weights `[out, in]`, metadata `{"format": "pt", "riftco_config": <TransformerConfig JSON>}`,
//!   plus a `config.json` beside the file that Hugging Face `LlamaConfig` reads. The file loads
//!   into `LlamaForCausalLM` unchanged.
//! - [`save_lora_adapter`] / [`load_lora_adapter`]: PEFT layout, `adapter_model.safetensors` +
//!   `adapter_config.json`.
//!
//! Writes are atomic: a temporary file in the destination folder, fsync, rename, fsync of the
//! folder. Loads validate everything (header, names, dtypes, shapes, config) before building or
//! changing any model, so an error never leaves a partial model behind. The
//! activation-checkpointing policy is not model state and is not saved.

use crate::config::TransformerConfig;
use crate::error::{Result, TransformerError};
use crate::linear::{LoraConfig, LoraTargets};
use crate::model::DecoderOnlyTransformer;
use crate::policy::{ActivationCheckpointingKind, FullSequenceAttentionKind};
use riftco_tensor::Tensor;
use safetensors::tensor::{SafeTensorError, TensorView};
use safetensors::{Dtype, SafeTensors, View};
use serde::Deserialize;
use serde_json::json;
use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Metadata key holding the [`TransformerConfig`] JSON in a model-state file.
pub const CONFIG_METADATA_KEY: &str = "riftco_config";
/// File name of the Hugging Face config written beside the model state.
pub const HF_CONFIG_FILE: &str = "config.json";
/// PEFT adapter weights file name.
pub const ADAPTER_MODEL_FILE: &str = "adapter_model.safetensors";
/// PEFT adapter config file name.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";

const ATTENTION_MODULES: [&str; 4] = ["q_proj", "k_proj", "v_proj", "o_proj"];
const MLP_MODULES: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

/// Writes the model state to `path` (safetensors) and a Hugging Face `config.json` into the same
/// folder.
///
/// The file holds every base parameter under its Hugging Face Llama name, f32, little endian,
/// Linear weights `[out, in]`, and the metadata `{"format": "pt", "riftco_config": <config>}`.
/// `config.json` is a `LlamaConfig` (`architectures ["LlamaForCausalLM"]`, `model_type "llama"`,
/// `num_key_value_heads = n_heads`, `tie_word_embeddings false`, `torch_dtype "float32"`, ...)
/// plus the key `"riftco"` holding the [`TransformerConfig`].
///
/// When LoRA adapters exist only the base weights are saved (unmerged, whether or not the
/// adapters are active): save adapters with [`save_lora_adapter`], or call
/// [`DecoderOnlyTransformer::merge_lora`] first to save the merged model. The
/// activation-checkpointing policy is not saved.
///
/// Each file is written atomically (temporary file in the same folder, fsync, rename, fsync of the
/// folder); the folder must exist.
///
/// # Errors
/// [`TransformerError::Io`] naming the destination path when the folder is missing or not
/// writable (an existing file is left intact); [`TransformerError::State`] when `path` has no file
/// name or is named `config.json`.
pub fn save_model(model: &DecoderOnlyTransformer, path: &Path) -> Result<()> {
    match path.file_name() {
        None => return Err(state_err(path, "the path has no file name")),
        Some(n) if n == HF_CONFIG_FILE => {
            return Err(state_err(
                path,
                "the model state cannot be named config.json: that name is used by the \
                 Hugging Face config written beside it",
            ))
        }
        Some(_) => {}
    }
    let config = model.config();
    let config_json = serde_json::to_string(config).map_err(|e| state_err(path, e))?;
    let tensors = model
        .weights()
        .named_base_parameters()
        .into_iter()
        .map(|(name, p)| (name, F32View::new(p.value())))
        .collect::<Vec<_>>();
    let metadata = HashMap::from([
        ("format".to_string(), "pt".to_string()),
        (CONFIG_METADATA_KEY.to_string(), config_json),
    ]);
    write_safetensors_atomic(path, tensors, metadata)?;
    let hf = serde_json::to_vec_pretty(&hf_config_json(config)).map_err(|e| state_err(path, e))?;
    let hf_path = parent_dir(path).join(HF_CONFIG_FILE);
    write_atomic(&hf_path, |tmp| {
        fs::write(tmp, &hf).map_err(|source| io_err(&hf_path, source))
    })
}

/// Loads a model saved by [`save_model`], or any safetensors file with exactly the Hugging Face
/// Llama names of the config found in its metadata (`riftco_config`) or, when the metadata lacks
/// it, in the `config.json` beside it (its `"riftco"` key, else the `LlamaConfig` fields).
///
/// Validates before building anything: a readable file, a sane header (length within the file,
/// UTF-8 JSON, tensor offsets covering the data exactly), a valid config, every expected tensor
/// present, no unknown tensor, dtype F32, each shape equal to the config's.
///
/// # Errors
/// [`TransformerError::Io`] when the file cannot be read; [`TransformerError::State`] with the
/// reason otherwise (truncated file, header length beyond the file, garbage, missing or unknown
/// tensor names, wrong dtype, a shape that disagrees with the config — naming the tensor and
/// both shapes — or an invalid or missing config). No model is built on error.
pub fn load_model(
    path: &Path,
    attention: FullSequenceAttentionKind,
    checkpointing: ActivationCheckpointingKind,
) -> Result<DecoderOnlyTransformer> {
    let bytes = read_file(path)?;
    let st = parse_safetensors(path, &bytes)?;
    let config = resolve_config(path, &st)?;
    let expected = expected_base_shapes(&config);
    let values = validated_f32(path, &st, &expected, &config_summary(&config))?;
    let model = DecoderOnlyTransformer::new(config, attention, checkpointing)?;
    copy_into(path, &model.weights().named_base_parameters(), values)?;
    Ok(model)
}

/// Loads the base weights in `path` into `model` in place: each parameter's existing tensor is
/// overwritten (so its version is bumped and graphs recorded before become stale; optimizers
/// holding the parameters keep working on the new values).
///
/// # Errors
/// As [`load_model`]; also [`TransformerError::State`] when the file's `riftco_config` metadata
/// describes a different architecture than the model's config (the seed is ignored). Nothing is
/// copied unless every tensor validates.
pub fn load_weights_into(model: &DecoderOnlyTransformer, path: &Path) -> Result<()> {
    let bytes = read_file(path)?;
    let st = parse_safetensors(path, &bytes)?;
    let config = model.config();
    if let Some(raw) = st.metadata.get(CONFIG_METADATA_KEY) {
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
    let expected = expected_base_shapes(config);
    let values = validated_f32(path, &st, &expected, &config_summary(config))?;
    copy_into(path, &model.weights().named_base_parameters(), values)
}

/// Hugging Face name and shape of every base parameter of `config`, in state-dict order (equal
/// to [`crate::Weights::named_base_parameters`] of a model built from `config`).
pub fn expected_base_shapes(config: &TransformerConfig) -> Vec<(String, Vec<usize>)> {
    let (v, d, ff) = (config.vocab_size, config.d_model, config.d_ff);
    let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, d])];
    for i in 0..config.n_layers {
        let p = format!("model.layers.{i}");
        out.push((format!("{p}.input_layernorm.weight"), vec![d]));
        for m in ATTENTION_MODULES {
            out.push((format!("{p}.self_attn.{m}.weight"), vec![d, d]));
        }
        out.push((format!("{p}.post_attention_layernorm.weight"), vec![d]));
        out.push((format!("{p}.mlp.gate_proj.weight"), vec![ff, d]));
        out.push((format!("{p}.mlp.up_proj.weight"), vec![ff, d]));
        out.push((format!("{p}.mlp.down_proj.weight"), vec![d, ff]));
    }
    out.push(("model.norm.weight".to_string(), vec![d]));
    out.push(("lm_head.weight".to_string(), vec![v, d]));
    out
}

/// The Hugging Face `LlamaConfig` JSON of `config`, with the riftco config under `"riftco"`.
pub fn hf_config_json(config: &TransformerConfig) -> serde_json::Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_heads,
        "head_dim": config.d_head(),
        "num_hidden_layers": config.n_layers,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_seq_len,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": null,
        "hidden_act": "silu",
        "attention_bias": false,
        "mlp_bias": false,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": false,
        "torch_dtype": "float32",
        "use_cache": true,
        "riftco": config,
    })
}

/// Writes the model's LoRA adapters in PEFT layout into `dir` (created if missing):
/// `adapter_model.safetensors` with the names of [`crate::Weights::named_lora_parameters`]
/// (`base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight [r, in]`,
/// `...lora_B.weight [out, r]`, f32, metadata `{"format": "pt"}`) and `adapter_config.json`
/// (`peft_type "LORA"`, `r`, `lora_alpha`, `target_modules`, `task_type "CAUSAL_LM"`,
/// `bias "none"`). `lora_alpha` is recovered as `scale · r`. Both files are written atomically.
///
/// # Errors
/// [`TransformerError::Lora`] when the model has no adapters; [`TransformerError::Io`] naming
/// the path on filesystem failures.
pub fn save_lora_adapter(model: &DecoderOnlyTransformer, dir: &Path) -> Result<()> {
    let weights = model.weights();
    let params = weights.named_lora_parameters();
    let Some(first) = weights
        .layers
        .iter()
        .flat_map(|l| l.linears())
        .find_map(|(_, lin)| lin.lora.clone())
    else {
        return Err(TransformerError::Lora("the model has no adapters".into()));
    };
    let rank = first.a.dims()[0];
    let alpha = alpha_from_scale(first.scale, rank);
    let has = |suffix: &str| {
        let mut linears = weights.layers.iter().flat_map(|l| l.linears());
        linears.any(|(s, lin)| s == suffix && lin.lora.is_some())
    };
    let target_modules = target_module_names(has("self_attn.q_proj"), has("mlp.gate_proj"));
    let adapter_config = json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": alpha,
        "target_modules": target_modules,
        "bias": "none",
        "lora_dropout": 0.0,
        "fan_in_fan_out": false,
        "use_rslora": false,
        "inference_mode": true,
        "base_model_name_or_path": null,
    });
    fs::create_dir_all(dir).map_err(|source| io_err(dir, source))?;
    let tensors = params
        .into_iter()
        .map(|(name, p)| (name, F32View::new(p.value())))
        .collect::<Vec<_>>();
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    write_safetensors_atomic(&dir.join(ADAPTER_MODEL_FILE), tensors, metadata)?;
    let config_path = dir.join(ADAPTER_CONFIG_FILE);
    let bytes =
        serde_json::to_vec_pretty(&adapter_config).map_err(|e| state_err(&config_path, e))?;
    write_atomic(&config_path, |tmp| {
        fs::write(tmp, &bytes).map_err(|source| io_err(&config_path, source))
    })
}

/// Reads `adapter_config.json` and `adapter_model.safetensors` from `dir`, validates them
/// against the model, then enables LoRA ([`DecoderOnlyTransformer::enable_lora`] with the
/// file's `r`, `lora_alpha` and targets) and copies the loaded A and B into the new adapters.
///
/// Supported: `peft_type "LORA"`, `bias "none"`, no rsLoRA, no rank/alpha patterns,
/// `target_modules` equal (in any order) to the four attention projections, the three MLP
/// projections, or both.
///
/// # Errors
/// [`TransformerError::Lora`] when the model already has adapters; [`TransformerError::Io`]
/// when a file cannot be read; [`TransformerError::State`] for an unsupported or invalid config,
/// a corrupt file, a missing or unknown tensor, a wrong dtype or shape. The model is unchanged
/// on every error.
pub fn load_lora_adapter(model: &mut DecoderOnlyTransformer, dir: &Path) -> Result<()> {
    if model.has_lora() {
        return Err(TransformerError::Lora(
            "the model already has adapters; merge or remove them before loading others".into(),
        ));
    }
    let config_path = dir.join(ADAPTER_CONFIG_FILE);
    let peft: PeftLoraConfig = serde_json::from_slice(&read_file(&config_path)?)
        .map_err(|e| state_err(&config_path, format!("not a PEFT LoRA config: {e}")))?;
    let lora = peft.to_lora_config(&config_path, model.config().d_model)?;

    let model_path = dir.join(ADAPTER_MODEL_FILE);
    let bytes = read_file(&model_path)?;
    let st = parse_safetensors(&model_path, &bytes)?;
    let mut expected = Vec::new();
    for (i, layer) in model.weights().layers.iter().enumerate() {
        for (j, (suffix, lin)) in layer.linears().into_iter().enumerate() {
            if (j < 4 && lora.targets.attention) || (j >= 4 && lora.targets.mlp) {
                let (out_f, in_f) = lin.dims();
                let base = format!("base_model.model.model.layers.{i}.{suffix}");
                expected.push((format!("{base}.lora_A.weight"), vec![lora.rank, in_f]));
                expected.push((format!("{base}.lora_B.weight"), vec![out_f, lora.rank]));
            }
        }
    }
    let context = format!("r {}, target_modules {:?}", lora.rank, peft.target_modules);
    let values = validated_f32(&model_path, &st, &expected, &context)?;

    let before = (**model.weights()).clone();
    let result = model.enable_lora(&lora).and_then(|()| {
        let params = model.weights().named_lora_parameters();
        copy_into(&model_path, &params, values)
    });
    if result.is_err() {
        model.replace_weights(before);
    }
    result
}

/// The subset of PEFT's `LoraConfig` that riftco reads.
#[derive(Debug, Deserialize)]
struct PeftLoraConfig {
    peft_type: String,
    r: usize,
    lora_alpha: f32,
    target_modules: Vec<String>,
    #[serde(default)]
    bias: Option<String>,
    #[serde(default)]
    use_rslora: bool,
    #[serde(default)]
    fan_in_fan_out: bool,
    #[serde(default)]
    rank_pattern: HashMap<String, serde_json::Value>,
    #[serde(default)]
    alpha_pattern: HashMap<String, serde_json::Value>,
}

impl PeftLoraConfig {
    fn to_lora_config(&self, path: &Path, d_model: usize) -> Result<LoraConfig> {
        let unsupported = |what: String| Err(state_err(path, what));
        if self.peft_type != "LORA" {
            return unsupported(format!("peft_type {:?}, expected \"LORA\"", self.peft_type));
        }
        if self.bias.as_deref().is_some_and(|b| b != "none") {
            return unsupported(format!(
                "bias {:?}, expected \"none\"",
                self.bias.as_deref().unwrap_or_default()
            ));
        }
        if self.use_rslora {
            return unsupported("use_rslora true is not supported (scale = alpha / r)".into());
        }
        if self.fan_in_fan_out {
            return unsupported("fan_in_fan_out true is not supported (Llama Linear)".into());
        }
        if !self.rank_pattern.is_empty() || !self.alpha_pattern.is_empty() {
            return unsupported("per-module rank_pattern / alpha_pattern is not supported".into());
        }
        let got: BTreeSet<&str> = self.target_modules.iter().map(String::as_str).collect();
        let has_all = |modules: &[&str]| modules.iter().all(|m| got.contains(m));
        let (attention, mlp) = (has_all(&ATTENTION_MODULES), has_all(&MLP_MODULES));
        if got != target_module_names(attention, mlp).into_iter().collect() || got.is_empty() {
            return unsupported(format!(
                "target_modules {:?}: expected all of {ATTENTION_MODULES:?}, all of \
                 {MLP_MODULES:?}, or both",
                self.target_modules
            ));
        }
        let targets = LoraTargets { attention, mlp };
        let lora = LoraConfig {
            rank: self.r,
            alpha: self.lora_alpha,
            targets,
            seed: 0,
        };
        lora.validate(d_model).map_err(|e| state_err(path, e))?;
        Ok(lora)
    }
}

/// PEFT `target_modules` of adapters on the attention and/or MLP projections.
fn target_module_names(attention: bool, mlp: bool) -> Vec<&'static str> {
    let mut names = Vec::new();
    if attention {
        names.extend(ATTENTION_MODULES);
    }
    if mlp {
        names.extend(MLP_MODULES);
    }
    names
}

/// `alpha` with `alpha / rank == scale` bitwise, preferring a whole number (PEFT configs usually
/// hold integers).
fn alpha_from_scale(scale: f32, rank: usize) -> f32 {
    let alpha = scale * rank as f32;
    let rounded = alpha.round();
    if rounded / rank as f32 == scale {
        rounded
    } else {
        alpha
    }
}

/// A parameter as an f32 little-endian safetensors view (bytes produced on demand while
/// writing, one tensor at a time).
struct F32View {
    tensor: Tensor,
    shape: Vec<usize>,
}

impl F32View {
    fn new(tensor: &Tensor) -> Self {
        Self {
            tensor: tensor.clone(),
            shape: tensor.dims().to_vec(),
        }
    }
}

impl View for F32View {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned(
            self.tensor
                .read()
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
        )
    }
    fn data_len(&self) -> usize {
        self.tensor.numel() * 4
    }
}

fn write_safetensors_atomic(
    path: &Path,
    tensors: Vec<(String, F32View)>,
    metadata: HashMap<String, String>,
) -> Result<()> {
    write_atomic(path, |tmp| {
        safetensors::serialize_to_file(tensors, Some(metadata), tmp).map_err(|e| match e {
            SafeTensorError::IoError(source) => io_err(path, source),
            other => state_err(path, other),
        })
    })
}

/// Writes through `write` into a fresh temporary file beside `path`, fsyncs it, renames it over
/// `path` and fsyncs the folder. The temporary file is removed on failure.
fn write_atomic(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = parent_dir(path);
    let name = path
        .file_name()
        .ok_or_else(|| state_err(path, "the path has no file name"))?;
    let tmp = dir.join(format!(
        ".{}.tmp.{}.{}",
        name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    // Create it exclusively first, so a missing or read-only folder fails before any work.
    let result = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(|source| io_err(path, source))
        .and_then(|_| write(&tmp))
        .and_then(|()| set_readable(&tmp).map_err(|source| io_err(path, source)))
        .and_then(|()| {
            let file = fs::OpenOptions::new()
                .write(true)
                .open(&tmp)
                .map_err(|source| io_err(path, source))?;
            file.sync_all().map_err(|source| io_err(path, source))?;
            fs::rename(&tmp, path).map_err(|source| io_err(path, source))
        });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
        return result;
    }
    sync_dir(&dir).map_err(|source| io_err(&dir, source))
}

/// Model files are ordinary user files (`rw-r--r--`), whatever mode the writer created the
/// temporary file with (the safetensors crate writes through a private 0600 temporary).
#[cfg(unix)]
fn set_readable(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o644))
}

#[cfg(not(unix))]
fn set_readable(_path: &Path) -> std::io::Result<()> {
    Ok(())
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> std::io::Result<()> {
    Ok(())
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).map_err(|source| io_err(path, source))
}

/// Parses a safetensors buffer with reasons that say what is wrong with the file.
/// Returns the tensors and the header's `__metadata__` map (empty when absent).
fn parse_safetensors<'a>(path: &Path, bytes: &'a [u8]) -> Result<Parsed<'a>> {
    const N_LEN: usize = 8;
    let Some(prefix) = bytes.get(..N_LEN) else {
        return Err(state_err(
            path,
            format!(
                "truncated: the file has {} bytes, fewer than the 8-byte header length that \
                 starts a safetensors file",
                bytes.len()
            ),
        ));
    };
    let mut n = [0u8; N_LEN];
    n.copy_from_slice(prefix);
    let header_len = u64::from_le_bytes(n);
    let available = (bytes.len() - N_LEN) as u64;
    if header_len > available {
        return Err(state_err(
            path,
            format!(
                "header length {header_len} bytes exceeds the {available} bytes after the length \
                 prefix: the file is truncated or not a safetensors file"
            ),
        ));
    }
    let to_state = |e: SafeTensorError| {
        let reason = match e {
            SafeTensorError::InvalidHeader(_) => {
                "the header is not UTF-8: not a safetensors file (garbage bytes)".to_string()
            }
            SafeTensorError::InvalidHeaderDeserialization(e) => {
                format!("the header is not valid safetensors JSON: {e}")
            }
            SafeTensorError::MetadataIncompleteBuffer => format!(
                "the data section ({} bytes) does not match the tensor offsets in the header: \
                 the file is truncated or has trailing bytes",
                available - header_len
            ),
            other => format!("invalid safetensors file: {other}"),
        };
        state_err(path, reason)
    };
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(to_state)?;
    let metadata = meta.metadata().clone().unwrap_or_default();
    let tensors = SafeTensors::deserialize(bytes).map_err(to_state)?;
    Ok(Parsed { tensors, metadata })
}

struct Parsed<'a> {
    tensors: SafeTensors<'a>,
    metadata: HashMap<String, String>,
}

/// The config of a model-state file: its `riftco_config` metadata, else `config.json` beside it
/// (the `"riftco"` key, else the Hugging Face `LlamaConfig` fields). Validated.
fn resolve_config(path: &Path, parsed: &Parsed<'_>) -> Result<TransformerConfig> {
    let config = if let Some(raw) = parsed.metadata.get(CONFIG_METADATA_KEY) {
        parse_riftco_config(path, raw)?
    } else {
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
        let value: serde_json::Value = serde_json::from_slice(&read_file(&hf_path)?)
            .map_err(|e| state_err(&hf_path, format!("not valid JSON: {e}")))?;
        match value.get("riftco") {
            Some(r) => serde_json::from_value(r.clone()).map_err(|e| {
                state_err(
                    &hf_path,
                    format!("\"riftco\" is not a TransformerConfig: {e}"),
                )
            })?,
            None => config_from_hf(&value).map_err(|reason| state_err(&hf_path, reason))?,
        }
    };
    config
        .validate()
        .map_err(|e| state_err(path, format!("the file's config is invalid: {e}")))?;
    Ok(config)
}

fn parse_riftco_config(path: &Path, raw: &str) -> Result<TransformerConfig> {
    serde_json::from_str(raw).map_err(|e| {
        state_err(
            path,
            format!("metadata {CONFIG_METADATA_KEY} is not a TransformerConfig JSON: {e}"),
        )
    })
}

/// A [`TransformerConfig`] from Hugging Face `LlamaConfig` fields (defaults as in
/// `transformers`: `rms_norm_eps` 1e-6, `rope_theta` 10000). Rejects what riftco's model cannot
/// represent: grouped-query attention, tied embeddings, RoPE scaling, biases, another activation.
fn config_from_hf(v: &serde_json::Value) -> std::result::Result<TransformerConfig, String> {
    let usize_field = |key: &str| {
        v.get(key)
            .and_then(serde_json::Value::as_u64)
            .map(|x| x as usize)
            .ok_or_else(|| format!("missing or non-integer field {key:?}"))
    };
    let n_heads = usize_field("num_attention_heads")?;
    let mut config = TransformerConfig::new(
        usize_field("vocab_size")?,
        usize_field("hidden_size")?,
        n_heads,
        usize_field("num_hidden_layers")?,
        usize_field("intermediate_size")?,
        usize_field("max_position_embeddings")?,
    );
    config.rms_norm_eps = v
        .get("rms_norm_eps")
        .and_then(|x| x.as_f64())
        .unwrap_or(1e-6) as f32;
    config.rope_theta = v
        .get("rope_theta")
        .and_then(|x| x.as_f64())
        .unwrap_or(10000.0);
    if let Some(kv) = v.get("num_key_value_heads").and_then(|x| x.as_u64()) {
        if kv as usize != n_heads {
            return Err(format!(
                "num_key_value_heads {kv} != num_attention_heads {n_heads}: grouped-query \
                 attention is not supported"
            ));
        }
    }
    let is = |key: &str, want: serde_json::Value| match v.get(key) {
        None | Some(serde_json::Value::Null) => true,
        Some(got) => *got == want,
    };
    for (key, want) in [
        ("tie_word_embeddings", json!(false)),
        ("attention_bias", json!(false)),
        ("mlp_bias", json!(false)),
        ("hidden_act", json!("silu")),
    ] {
        if !is(key, want.clone()) {
            return Err(format!(
                "{key} = {} is not supported (expected {want})",
                v[key]
            ));
        }
    }
    if !matches!(v.get("rope_scaling"), None | Some(serde_json::Value::Null)) {
        return Err(format!(
            "rope_scaling {} is not supported",
            v["rope_scaling"]
        ));
    }
    if let Some(h) = v.get("head_dim").and_then(|x| x.as_u64()) {
        if h as usize != config.d_head() {
            return Err(format!(
                "head_dim {h} != hidden_size / num_attention_heads = {}",
                config.d_head()
            ));
        }
    }
    Ok(config)
}

/// Equal configs apart from the initialisation seed.
fn same_architecture(a: &TransformerConfig, b: &TransformerConfig) -> bool {
    let mut a = a.clone();
    a.seed = b.seed;
    a == *b
}

fn config_summary(c: &TransformerConfig) -> String {
    format!(
        "vocab_size {}, d_model {}, n_layers {}, d_ff {}",
        c.vocab_size, c.d_model, c.n_layers, c.d_ff
    )
}

/// Checks that the file holds exactly the `expected` names, each F32 with the expected shape,
/// and returns their values in `expected` order. `context` describes where the expectation comes
/// from (the config), for the error message.
fn validated_f32(
    path: &Path,
    parsed: &Parsed<'_>,
    expected: &[(String, Vec<usize>)],
    context: &str,
) -> Result<Vec<(String, Vec<f32>)>> {
    let st = &parsed.tensors;
    let names: BTreeSet<&str> = st.names().into_iter().collect();
    let wanted: BTreeSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    let list = |v: Vec<&str>| {
        let shown: Vec<&str> = v.iter().take(5).copied().collect();
        let more = if v.len() > 5 {
            format!(" and {} more", v.len() - 5)
        } else {
            String::new()
        };
        format!("{shown:?}{more}")
    };
    let missing: Vec<&str> = wanted.difference(&names).copied().collect();
    if !missing.is_empty() {
        return Err(state_err(
            path,
            format!(
                "{} expected tensor(s) missing for the config ({context}): {}",
                missing.len(),
                list(missing)
            ),
        ));
    }
    let unknown: Vec<&str> = names.difference(&wanted).copied().collect();
    if !unknown.is_empty() {
        return Err(state_err(
            path,
            format!(
                "{} unknown tensor(s) for the config ({context}): {}",
                unknown.len(),
                list(unknown)
            ),
        ));
    }
    let mut views = Vec::with_capacity(expected.len());
    for (name, shape) in expected {
        let view = st.tensor(name).map_err(|e| state_err(path, e))?;
        if view.dtype() != Dtype::F32 {
            return Err(state_err(
                path,
                format!("tensor {name} has dtype {:?}, expected F32", view.dtype()),
            ));
        }
        if view.shape() != shape.as_slice() {
            return Err(state_err(
                path,
                format!(
                    "tensor {name} has shape {:?} but the config ({context}) expects {shape:?}",
                    view.shape()
                ),
            ));
        }
        views.push(view);
    }
    Ok(expected
        .iter()
        .zip(&views)
        .map(|((name, _), view)| (name.clone(), decode_f32(view)))
        .collect())
}

fn decode_f32(view: &TensorView<'_>) -> Vec<f32> {
    view.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Copies validated values into the parameters of the same names; checks that every parameter
/// has a value before writing any. Bumps each written tensor's version.
fn copy_into(
    path: &Path,
    params: &[(String, riftco_autograd::Variable)],
    values: Vec<(String, Vec<f32>)>,
) -> Result<()> {
    let mut by_name: HashMap<String, Vec<f32>> = values.into_iter().collect();
    let mut plan = Vec::with_capacity(params.len());
    for (name, p) in params {
        match by_name.remove(name) {
            Some(v) if v.len() == p.value().numel() => plan.push((p, v)),
            _ => {
                return Err(state_err(
                    path,
                    format!("internal: no value of the right size for parameter {name}"),
                ))
            }
        }
    }
    for (p, v) in plan {
        p.value().copy_from_slice(&v)?;
    }
    Ok(())
}

fn state_err(path: &Path, reason: impl std::fmt::Display) -> TransformerError {
    TransformerError::State {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

fn io_err(path: &Path, source: std::io::Error) -> TransformerError {
    TransformerError::Io {
        path: path.display().to_string(),
        source,
    }
}
