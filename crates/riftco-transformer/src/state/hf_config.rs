//! The Hugging Face `config.json` (`LlamaConfig`) written beside a model state and read when
//! a state file carries no riftco config.

use super::dtype::StateDtype;
use super::hf_rope::{rope_from_hf, rope_parameters_json};
use crate::config::{probability_from_json, TransformerConfig};
use serde_json::json;

/// The Hugging Face `LlamaConfig` JSON of `config`, with the riftco config under `"riftco"`.
/// `attention_dropout` is Hugging Face's key of the same name (dropout on the attention
/// probabilities); `residual_dropout` has no `LlamaConfig` counterpart and is carried only in
/// the riftco-specific `"riftco"` object (`transformers` keeps unknown keys as attributes and
/// ignores them).
///
/// RoPE is written in the transformers-5 form, `rope_parameters = {"rope_type", "rope_theta",
/// ...}`; a scaled RoPE is also written as `rope_scaling` (the same object) for older
/// `transformers`. `bos_token_id` / `eos_token_id` (an integer, or a list for several) are
/// written when set, `torch_dtype` and `dtype` say `"float32"`.
pub fn hf_config_json(config: &TransformerConfig) -> serde_json::Value {
    hf_config_json_as(config, StateDtype::F32)
}

/// [`hf_config_json`] for a state file whose tensors are saved in `dtype` (`torch_dtype` and
/// `dtype` name it).
pub(super) fn hf_config_json_as(
    config: &TransformerConfig,
    dtype: StateDtype,
) -> serde_json::Value {
    let rope_parameters = rope_parameters_json(config);
    let rope_scaling = match config.rope_scaling {
        crate::RopeScaling::Default => serde_json::Value::Null,
        _ => rope_parameters.clone(),
    };
    let eos = match config.eos_token_ids[..] {
        [] => serde_json::Value::Null,
        [one] => json!(one),
        ref many => json!(many),
    };
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.d_head(),
        "num_hidden_layers": config.n_layers,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_seq_len,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": rope_scaling,
        "rope_parameters": rope_parameters,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": eos,
        "hidden_act": "silu",
        "attention_bias": false,
        "mlp_bias": false,
        "attention_dropout": json_f32(config.attention_dropout),
        "initializer_range": 0.02,
        "tie_word_embeddings": config.tie_word_embeddings,
        "torch_dtype": dtype.hf_name(),
        "dtype": dtype.hf_name(),
        "use_cache": true,
        "riftco": config,
    })
}

/// A [`TransformerConfig`](crate::TransformerConfig) from Hugging Face `LlamaConfig` fields (defaults as in
/// `transformers`: `rms_norm_eps` 1e-6, `rope_theta` 10000, `num_key_value_heads` =
/// `num_attention_heads`, `tie_word_embeddings` false as in `LlamaConfig`). Rejects what riftco's
/// model cannot represent: biases, another activation.
///
/// RoPE θ and scaling are read as [`rope_from_hf`] says (`default`, `linear` and `llama3`; any
/// other `rope_type` is refused by name). `bos_token_id` (an integer) and `eos_token_id` (an
/// integer or a list of them) are read when present and not null. `torch_dtype` / `dtype` is
/// information only (each tensor carries its own dtype) and must be `"float32"`, `"bfloat16"` or
/// `"float16"` when present.
pub(super) fn config_from_hf(
    v: &serde_json::Value,
) -> std::result::Result<TransformerConfig, String> {
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
    config.rms_norm_eps = number_field(v, "rms_norm_eps")?.unwrap_or(1e-6) as f32;
    (config.rope_theta, config.rope_scaling) = rope_from_hf(v)?;
    check_dtype(v)?;
    config.bos_token_id = match token_ids(v, "bos_token_id")? {
        Some(ids) if ids.len() == 1 && !v["bos_token_id"].is_array() => Some(ids[0]),
        Some(_) => {
            return Err(format!(
                "bos_token_id = {} is not a token id (a non-negative integer)",
                v["bos_token_id"]
            ))
        }
        None => None,
    };
    config.eos_token_ids = token_ids(v, "eos_token_id")?.unwrap_or_default();
    config.attention_dropout = attention_dropout(v)?.unwrap_or(0.0);
    if let Some(kv) = v.get("num_key_value_heads").filter(|x| !x.is_null()) {
        // Whether it divides num_attention_heads is checked by TransformerConfig::validate.
        config.n_kv_heads = kv
            .as_u64()
            .and_then(|x| usize::try_from(x).ok())
            .ok_or_else(|| format!("num_key_value_heads {kv} is not a non-negative integer"))?;
    } else {
        config.n_kv_heads = n_heads;
    }
    if let Some(t) = v.get("tie_word_embeddings").filter(|x| !x.is_null()) {
        config.tie_word_embeddings = t
            .as_bool()
            .ok_or_else(|| format!("tie_word_embeddings = {t} is not a boolean"))?;
    }
    let is = |key: &str, want: serde_json::Value| match v.get(key) {
        None | Some(serde_json::Value::Null) => true,
        Some(got) => *got == want,
    };
    for (key, want) in [
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
    // Another architecture read as Llama would load without error and compute something else.
    if let Some(t) = v.get("model_type").filter(|x| !x.is_null()) {
        if t != "llama" {
            return Err(format!(
                "model_type {t} is not supported (expected \"llama\": LlamaForCausalLM)"
            ));
        }
    }
    if let Some(w) = v.get("sliding_window").filter(|x| !x.is_null()) {
        return Err(format!(
            "sliding_window = {w} is not supported (every position attends to all earlier ones)"
        ));
    }
    if let Some(h) = v.get("head_dim").filter(|x| !x.is_null()) {
        let h = h
            .as_u64()
            .ok_or_else(|| format!("head_dim {h} is not an integer"))?;
        if h as usize != config.d_head() {
            return Err(format!(
                "head_dim {h} != hidden_size / num_attention_heads = {}",
                config.d_head()
            ));
        }
    }
    Ok(config)
}

/// `x` as the JSON number with `x`'s shortest decimal spelling (`0.1`, not the f64 value of the
/// f32, `0.10000000149011612`), so Python and `transformers` read back the value that was set.
pub(super) fn json_f32(x: f32) -> serde_json::Value {
    x.to_string()
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(serde_json::Value::Null, serde_json::Value::Number)
}

/// The top-level `attention_dropout` of a Hugging Face config: `None` when absent or null, else
/// a probability checked as written (an error names the key and the JSON value).
pub(super) fn attention_dropout(v: &serde_json::Value) -> std::result::Result<Option<f32>, String> {
    const KEY: &str = "attention_dropout";
    number_field(v, KEY)?
        .map(|_| probability_from_json(KEY, &v[KEY]))
        .transpose()
}

/// `v[key]` as a number: `None` when absent or null, an error naming the key for another type.
pub(super) fn number_field(
    v: &serde_json::Value,
    key: &str,
) -> std::result::Result<Option<f64>, String> {
    match v.get(key) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(x) => x
            .as_f64()
            .map(Some)
            .ok_or_else(|| format!("{key} = {x} is not a number")),
    }
}

/// Checks `torch_dtype` and `dtype` of a Hugging Face config: absent, null or one of
/// `"float32"`, `"bfloat16"`, `"float16"` (information only: the tensors carry their own
/// dtype).
pub(super) fn check_dtype(v: &serde_json::Value) -> std::result::Result<(), String> {
    for key in ["torch_dtype", "dtype"] {
        match v.get(key) {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::String(s)) if StateDtype::from_hf_name(s).is_some() => {}
            Some(other) => {
                return Err(format!(
                    "{key} = {other} is not a dtype riftco reads: expected \"float32\", \
                     \"bfloat16\" or \"float16\""
                ))
            }
        }
    }
    Ok(())
}

/// `v[key]` as token ids: `None` when absent or null; an integer or a list of integers (each at
/// most `u32::MAX`), else an error naming the key and the value.
fn token_ids(v: &serde_json::Value, key: &str) -> std::result::Result<Option<Vec<u32>>, String> {
    let one = |x: &serde_json::Value| x.as_u64().and_then(|n| u32::try_from(n).ok());
    let bad = || {
        format!(
            "{key} = {} is not a token id (a non-negative integer) or a list of them",
            v[key]
        )
    };
    match v.get(key) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .map(|x| one(x).ok_or_else(bad))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map(Some),
        Some(x) => one(x).map(|id| Some(vec![id])).ok_or_else(bad),
    }
}
