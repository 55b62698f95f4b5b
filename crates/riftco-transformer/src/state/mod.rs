//! Model state and LoRA adapters as safetensors.
//!
//! - [`save_model`] / [`load_model`] / [`load_weights_into`]: every base parameter under its
//!   Hugging Face Llama name (`model.layers.{i}.self_attn.q_proj.weight`, ...), f32, Linear
//!   weights `[out, in]`, metadata `{"format": "pt", "riftco_config": <TransformerConfig JSON>}`,
//!   plus a `config.json` beside the file that Hugging Face `LlamaConfig` reads. The file loads
//!   into `LlamaForCausalLM` unchanged. [`save_model_as`] saves bf16 instead (rounded to nearest
//!   even, for exchange).
//! - Loads read F32, BF16 and F16 tensors (converted to f32 exactly), one file or a sharded
//!   folder through its [`SHARD_INDEX_FILE`], with the config from the state's metadata or a
//!   plain Hugging Face `config.json` (RoPE `default`/`linear`/`llama3`, `bos_token_id`,
//!   `eos_token_id`, `torch_dtype` as information).
//! - [`save_lora_adapter`] / [`load_lora_adapter`]: PEFT layout, `adapter_model.safetensors` +
//!   `adapter_config.json`.
//! - GGUF files (llama.cpp): [`GgufFile`] reads any GGUF file's metadata and tensors with every
//!   size bounds-checked; [`load_model`] loads one of the `llama` architecture (config from its
//!   metadata, tensors dequantized to f32 bitwise as llama.cpp's reference, Q and K rows put
//!   back in Hugging Face order).
//!
//! Saves are atomic as a whole: the new folder (the new files plus every other entry of the
//! current folder, hard-linked) is built under a temporary sibling and exchanged with the live
//! folder in one system call, so any reader sees the old folder or the new one, whole. Where the
//! exchange is unavailable the files are written into temporaries and renamed, the weights file
//! last, and the weights file carries (or names) the config saved with it, so a killed save
//! leaves a folder that riftco loads as the old or the new state. Loads read only regular files,
//! with bounded memory (at most the file's own size plus the model it declares), and validate
//! everything (header, names, dtypes, shapes, config) before building or changing any model, so
//! an error never leaves a partial model behind. The activation-checkpointing policy is not
//! model state and is not saved.

mod atomic;
mod dtype;
mod folder;
mod gguf;
mod hf_config;
mod hf_rope;
mod lora;
mod model_file;
mod optimizer;
mod read;
mod shards;
mod values;

use crate::error::TransformerError;
use std::path::{Path, PathBuf};

pub use atomic::write_file_atomic;
pub use dtype::StateDtype;
pub use gguf::{
    is_gguf, GgufArray, GgufFile, GgufTensorInfo, GgufValue,
    DEFAULT_ALIGNMENT as GGUF_DEFAULT_ALIGNMENT, MAX_GGUF_HEADER_BYTES,
};
pub use hf_config::hf_config_json;
pub use lora::{load_lora_adapter, save_lora_adapter};
pub use model_file::{
    config_json_pairing, expected_base_shapes, load_model, load_model_as, load_model_as_stored,
    load_weights_into, save_model, save_model_as, ConfigJsonPairing,
};
pub use optimizer::{load_optimizer_state, save_optimizer_state, OPTIMIZER_METADATA_KEY};
pub use read::{MAX_HEADER_BYTES, MAX_JSON_BYTES};
pub use shards::SHARD_INDEX_FILE;

/// Metadata key holding the [`TransformerConfig`](crate::TransformerConfig) JSON in a model-state file.
pub const CONFIG_METADATA_KEY: &str = "riftco_config";
/// File name of the Hugging Face config written beside the model state.
pub const HF_CONFIG_FILE: &str = "config.json";
/// Metadata key of a model-state file naming the `config.json` saved with it:
/// [`fnv1a64_hex`] of that file's exact bytes.
pub const HF_CONFIG_HASH_KEY: &str = "riftco_config_json_fnv1a64";
/// Metadata key of an adapter file holding the exact `adapter_config.json` text saved with it.
pub const ADAPTER_CONFIG_METADATA_KEY: &str = "riftco_adapter_config";
/// PEFT adapter weights file name.
pub const ADAPTER_MODEL_FILE: &str = "adapter_model.safetensors";
/// PEFT adapter config file name.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";

/// The 64-bit FNV-1a hash of `bytes` as 16 lowercase hex digits (offset basis
/// `0xcbf29ce484222325`, prime `0x100000001b3`). It identifies a file's content; it is not a
/// cryptographic hash.
pub fn fnv1a64_hex(bytes: &[u8]) -> String {
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{hash:016x}")
}

pub(super) fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

pub(super) fn state_err(path: &Path, reason: impl std::fmt::Display) -> TransformerError {
    TransformerError::State {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

pub(super) fn io_err(path: &Path, source: std::io::Error) -> TransformerError {
    TransformerError::Io {
        path: path.display().to_string(),
        source,
    }
}
