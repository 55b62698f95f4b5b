//! LoRA adapters in PEFT layout.

use super::atomic::{check_destination, remove_stale_temporaries, write_safetensors, AtomicGroup};
use super::folder::{save_folder_atomic, Exchange, WriteFile};
use super::read::{check_tensors, copy_into, read_header, read_json_bytes, read_values, unchanged};
use super::{
    io_err, parent_dir, state_err, ADAPTER_CONFIG_FILE, ADAPTER_CONFIG_METADATA_KEY,
    ADAPTER_MODEL_FILE,
};
use crate::config::probability_from_json;
use crate::error::{Result, TransformerError};
use crate::layout;
use crate::linear::LoraConfig;
use crate::model::DecoderOnlyTransformer;
use riftco_tensor::Tensor;
use serde::Deserialize;
use serde_json::json;
use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io::Write;
use std::path::Path;

/// Writes the model's LoRA adapters in PEFT layout into `dir` (created if missing):
/// `adapter_model.safetensors` with the names of [`crate::Weights::named_lora_parameters`]
/// (`base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight [r, in]`,
/// `...lora_B.weight [out, r]`, f32, metadata `{"format": "pt", "riftco_adapter_config":
/// <the adapter_config.json text>}`) and `adapter_config.json` (`peft_type "LORA"`, `r`,
/// `lora_alpha`, `target_modules`, `task_type "CAUSAL_LM"`, `bias "none"`, `lora_dropout`: the
/// adapters' input dropout probability). `lora_alpha` is recovered as `scale · r`.
///
/// The save is atomic as a whole, for any reader (PEFT included), as in
/// [`crate::state::save_model`]: the new folder (both files plus every other entry of the
/// current one, hard-linked) is built under a temporary sibling `.<folder name>.tmp.<pid>.<n>`
/// and exchanged with the live folder in one system call, or renamed into place when `dir` does
/// not exist yet; a killed save leaves `dir` entirely old or entirely new, and the next save
/// removes its temporary. Where the exchange cannot be used (see `save_model`) the per-file
/// protocol applies: both files are written in full into temporaries and fsynced, then
/// `adapter_config.json` is renamed first and `adapter_model.safetensors` last. The weights file
/// carries the config saved with it, which [`load_lora_adapter`] reads in preference to
/// `adapter_config.json` (for all but `lora_dropout`), so even then a folder left by a killed
/// save loads in riftco as the old or the new adapter (PEFT, which reads `adapter_config.json`,
/// may not, after a kill between the two renames).
///
/// # Errors
/// [`TransformerError::Lora`](crate::TransformerError::Lora) when the model has no adapters; [`TransformerError::Io`](crate::TransformerError::Io) naming
/// the path on filesystem failures; [`TransformerError::State`](crate::TransformerError::State)
/// when `dir` or one of the two files is not what it should be (a file, a folder, a FIFO).
pub fn save_lora_adapter(model: &DecoderOnlyTransformer, dir: &Path) -> Result<()> {
    let weights = model.weights();
    let params = weights.named_lora_parameters();
    let Some(first) = weights.linears().find_map(|(_, lin)| lin.lora.clone()) else {
        return Err(TransformerError::Lora {
            message: "the model has no adapters".into(),
        });
    };
    let rank = first.a.dims()[0];
    let alpha = alpha_from_scale(first.scale, rank);
    let targets = layout::lora_targets(|role| {
        weights
            .linears()
            .any(|(e, lin)| e.parameter.role == role && lin.lora.is_some())
    });
    let target_modules = layout::target_modules(&targets);
    let adapter_config = json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": alpha,
        "target_modules": target_modules,
        "bias": "none",
        "lora_dropout": super::hf_config::json_f32(first.dropout),
        "fan_in_fan_out": false,
        "use_rslora": false,
        "inference_mode": true,
        "base_model_name_or_path": null,
    });
    let bytes = serde_json::to_vec_pretty(&adapter_config).map_err(|e| state_err(dir, e))?;
    let text = String::from_utf8(bytes).map_err(|e| state_err(dir, e))?;
    let tensors: Vec<(String, Tensor)> = params
        .into_iter()
        .map(|(name, p)| (name, p.value().clone()))
        .collect();
    let metadata = HashMap::from([
        ("format".to_string(), "pt".to_string()),
        (ADAPTER_CONFIG_METADATA_KEY.to_string(), text.clone()),
    ]);
    let (config_path, model_path) = (dir.join(ADAPTER_CONFIG_FILE), dir.join(ADAPTER_MODEL_FILE));
    check_destination(&config_path)?;
    check_destination(&model_path)?;
    // The folder's parents are created; the folder itself is created by the save.
    let parent = parent_dir(dir);
    fs::create_dir_all(&parent).map_err(|source| io_err(&parent, source))?;
    let write_config = |out: &mut dyn Write| {
        out.write_all(text.as_bytes())
            .map_err(|source| io_err(&config_path, source))
    };
    let write_model = |mut out: &mut dyn Write| {
        write_safetensors(
            &model_path,
            &mut out,
            &tensors,
            metadata.clone(),
            model.parameter_residency(),
        )
    };
    // An identical adapter_config.json is hard-linked into the new folder, not rewritten.
    let mut files: Vec<(&str, WriteFile<'_>)> = Vec::with_capacity(2);
    if !unchanged(&config_path, text.as_bytes()) {
        files.push((ADAPTER_CONFIG_FILE, &write_config));
    }
    files.push((ADAPTER_MODEL_FILE, &write_model));
    if save_folder_atomic(dir, &files)? != Exchange::Unsupported {
        return Ok(());
    }
    // The per-file protocol (see the docs above).
    fs::create_dir_all(dir).map_err(|source| io_err(dir, source))?;
    remove_stale_temporaries(dir, &[ADAPTER_CONFIG_FILE, ADAPTER_MODEL_FILE]);
    let mut group = AtomicGroup::new();
    if !unchanged(&config_path, text.as_bytes()) {
        group.stage(&config_path, |out| write_config(out))?;
    }
    group.stage(&model_path, |out| write_model(out))?;
    group.commit()
}

/// Reads `adapter_model.safetensors` and its config from `dir`, validates them against the
/// model, then enables LoRA ([`DecoderOnlyTransformer::enable_lora`](crate::DecoderOnlyTransformer::enable_lora) with the
/// file's `r`, `lora_alpha`, targets and `lora_dropout`, absent or null meaning 0 as in PEFT)
/// and copies the loaded A and B into the new adapters.
///
/// Supported: `peft_type "LORA"`, `bias "none"`, no rsLoRA, no rank/alpha patterns,
/// `target_modules` equal (in any order) to the four attention projections, the three MLP
/// projections, or both.
///
/// The config is the `riftco_adapter_config` metadata of the weights file when present (written
/// by [`save_lora_adapter`]: it decides `r`, `lora_alpha` and the targets, so a kill between the
/// renames of a save, which can leave a newer `adapter_config.json` beside the older weights,
/// still loads the older adapter whole), else `adapter_config.json` (adapters written by PEFT).
/// `lora_dropout` is a training setting that the user-facing `adapter_config.json` decides: when
/// that file differs from the saved text it is validated in full, and if it describes the same
/// adapter its `lora_dropout` replaces the saved one. A probability is checked as written
/// (`0.99999999`, which rounds to `1.0f32`, is refused as `0.99999999`). Files are read as by
/// [`crate::state::load_model`]: regular files only, with bounded memory.
///
/// # Errors
/// [`TransformerError::Lora`](crate::TransformerError::Lora) when the model already has adapters; [`TransformerError::Io`](crate::TransformerError::Io)
/// when a file cannot be read; [`TransformerError::State`](crate::TransformerError::State) for an unsupported or invalid config,
/// a corrupt file, a missing or unknown tensor, a wrong dtype or shape. The model is unchanged
/// on every error.
pub fn load_lora_adapter(model: &mut DecoderOnlyTransformer, dir: &Path) -> Result<()> {
    if model.has_lora() {
        return Err(TransformerError::Lora {
            message: "the model already has adapters; merge or remove them before loading others"
                .into(),
        });
    }
    if dir.is_file() {
        let gguf = super::gguf::is_gguf(dir);
        return Err(super::state_err(
            dir,
            format!(
                "a file{}: load_lora reads a PEFT adapter folder ({ADAPTER_CONFIG_FILE} and \
                 {ADAPTER_MODEL_FILE}, as save_lora and riftco post-train write it){}",
                if gguf { " (a GGUF file)" } else { "" },
                if gguf {
                    "; a GGUF LoRA adapter is llama.cpp's format (riftco export --adapter writes \
                     it from such a folder), not one riftco reads back"
                } else {
                    ""
                }
            ),
        ));
    }
    let model_path = dir.join(ADAPTER_MODEL_FILE);
    let header = read_header(&model_path)?;
    let d_model = model.config().d_model;
    let config_path = dir.join(ADAPTER_CONFIG_FILE);
    let (peft, lora) = match header.metadata.get(ADAPTER_CONFIG_METADATA_KEY) {
        Some(text) => {
            let what = format!("metadata {ADAPTER_CONFIG_METADATA_KEY}");
            let peft = parse_peft(&model_path, &what, text.as_bytes())?;
            let mut lora = peft.to_lora_config(&model_path, d_model)?;
            apply_adapter_config_dropout(&config_path, text, d_model, &mut lora)?;
            (peft, lora)
        }
        None => {
            let bytes = read_json_bytes(&config_path)?;
            let peft = parse_peft(&config_path, ADAPTER_CONFIG_FILE, &bytes)?;
            let lora = peft.to_lora_config(&config_path, d_model)?;
            (peft, lora)
        }
    };
    let mut expected = Vec::new();
    for (e, lin) in model.weights().linears() {
        if e.parameter.role.targeted_by(&lora.targets) {
            let (out_f, in_f) = lin.dims();
            let [a, b] = e.peft_lora_names();
            expected.push((a, vec![lora.rank, in_f]));
            expected.push((b, vec![out_f, lora.rank]));
        }
    }
    let context = format!("r {}, target_modules {:?}", lora.rank, peft.target_modules);
    check_tensors(&model_path, &header, &expected, &context)?;
    let values = read_values(&model_path, header, &expected, None, None)?;

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

/// The `lora_dropout` of `adapter_config.json` beside a weights file whose metadata holds its
/// config (`saved`, the exact text saved with it).
///
/// The metadata decides what the adapter is (`r`, `lora_alpha`, targets: the weights must match
/// them); `lora_dropout` is a training setting, and the user-facing `adapter_config.json`
/// decides it: a value there that differs from the saved one replaces it. The whole file is
/// validated as on a PEFT load (an error names the file and the field). A file with the saved
/// text, or none, changes nothing; one describing another adapter (a newer save's, left by a
/// kill between the two renames of a save) is checked but does not apply.
fn apply_adapter_config_dropout(
    config_path: &Path,
    saved: &str,
    d_model: usize,
    lora: &mut LoraConfig,
) -> Result<()> {
    if !config_path.exists() {
        return Ok(());
    }
    let bytes = read_json_bytes(config_path)?;
    if bytes == saved.as_bytes() {
        return Ok(());
    }
    let file = parse_peft(config_path, ADAPTER_CONFIG_FILE, &bytes)?
        .to_lora_config(config_path, d_model)?;
    let same_adapter = LoraConfig {
        dropout: lora.dropout,
        ..file.clone()
    } == *lora;
    if same_adapter {
        lora.dropout = file.dropout;
    }
    Ok(())
}

fn parse_peft(path: &Path, what: &str, bytes: &[u8]) -> Result<PeftLoraConfig> {
    serde_json::from_slice(bytes)
        .map_err(|e| state_err(path, format!("{what} is not a PEFT LoRA config: {e}")))
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
    lora_dropout: Option<serde_json::Value>,
    #[serde(default)]
    use_rslora: bool,
    #[serde(default)]
    fan_in_fan_out: bool,
    #[serde(default)]
    rank_pattern: HashMap<String, serde_json::Value>,
    #[serde(default)]
    alpha_pattern: HashMap<String, serde_json::Value>,
    #[serde(default)]
    use_dora: Option<bool>,
    #[serde(default)]
    lora_bias: Option<bool>,
    #[serde(default)]
    layers_to_transform: Option<serde_json::Value>,
    #[serde(default)]
    layers_pattern: Option<serde_json::Value>,
    #[serde(default)]
    exclude_modules: Option<serde_json::Value>,
    #[serde(default)]
    modules_to_save: Option<serde_json::Value>,
}

/// Whether an optional PEFT field is unset: absent, null, false, or an empty list or string.
fn unset(v: &Option<serde_json::Value>) -> bool {
    match v {
        None | Some(serde_json::Value::Null) | Some(serde_json::Value::Bool(false)) => true,
        Some(serde_json::Value::Array(a)) => a.is_empty(),
        Some(serde_json::Value::String(s)) => s.is_empty(),
        Some(_) => false,
    }
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
        // Each of these changes what the adapter computes or where it applies; loading it as a
        // plain LoRA would be silently wrong.
        if self.use_dora == Some(true) {
            return unsupported("use_dora true (DoRA) is not supported".into());
        }
        if self.lora_bias == Some(true) {
            return unsupported("lora_bias true is not supported".into());
        }
        for (key, value) in [
            ("layers_to_transform", &self.layers_to_transform),
            ("layers_pattern", &self.layers_pattern),
            ("exclude_modules", &self.exclude_modules),
            ("modules_to_save", &self.modules_to_save),
        ] {
            if !unset(value) {
                return unsupported(format!(
                    "{key} = {} is not supported (adapters apply to every layer's target \
                     modules; no other module is trained)",
                    value.as_ref().map(ToString::to_string).unwrap_or_default()
                ));
            }
        }
        let got: BTreeSet<&str> = self.target_modules.iter().map(String::as_str).collect();
        if got.len() != self.target_modules.len() {
            return unsupported(format!(
                "target_modules {:?} names a module twice",
                self.target_modules
            ));
        }
        let targets =
            layout::lora_targets(|role| layout::peft_modules(role).iter().all(|m| got.contains(m)));
        if got != layout::target_modules(&targets).into_iter().collect() || got.is_empty() {
            let groups: Vec<String> = layout::LORA_TARGET_GROUPS
                .iter()
                .map(|g| format!("all of {:?}", layout::peft_modules(g.value)))
                .collect();
            return unsupported(format!(
                "target_modules {:?}: expected {}, or both",
                self.target_modules,
                groups.join(", ")
            ));
        }
        let dropout = match &self.lora_dropout {
            None | Some(serde_json::Value::Null) => 0.0,
            Some(v) => match probability_from_json("lora_dropout", v) {
                Ok(p) => p,
                Err(reason) => return unsupported(reason),
            },
        };
        let lora = LoraConfig {
            rank: self.r,
            alpha: self.lora_alpha,
            targets,
            seed: 0,
            dropout,
        };
        lora.validate(d_model).map_err(|e| state_err(path, e))?;
        Ok(lora)
    }
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
