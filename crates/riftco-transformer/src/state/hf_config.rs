//! The Hugging Face `config.json` (`LlamaConfig`) written beside a model state and read when
//! a state file carries no riftco config.

use crate::config::{probability_from_json, TransformerConfig};
use serde_json::json;

/// The Hugging Face `LlamaConfig` JSON of `config`, with the riftco config under `"riftco"`.
/// `attention_dropout` is Hugging Face's key of the same name (dropout on the attention
/// probabilities); `residual_dropout` has no `LlamaConfig` counterpart and is carried only in
/// the riftco-specific `"riftco"` object (`transformers` keeps unknown keys as attributes and
/// ignores them).
pub fn hf_config_json(config: &TransformerConfig) -> serde_json::Value {
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
        "rope_scaling": null,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "hidden_act": "silu",
        "attention_bias": false,
        "mlp_bias": false,
        "attention_dropout": json_f32(config.attention_dropout),
        "initializer_range": 0.02,
        "tie_word_embeddings": config.tie_word_embeddings,
        "torch_dtype": "float32",
        "use_cache": true,
        "riftco": config,
    })
}

/// A [`TransformerConfig`](crate::TransformerConfig) from Hugging Face `LlamaConfig` fields (defaults as in
/// `transformers`: `rms_norm_eps` 1e-6, `rope_theta` 10000, `num_key_value_heads` =
/// `num_attention_heads`, `tie_word_embeddings` false as in `LlamaConfig`). Rejects what riftco's
/// model cannot represent: RoPE scaling, biases, another activation.
///
/// RoPE θ is read from the top-level `rope_theta` (transformers 4), from `rope_parameters`
/// (transformers 5: `{"rope_type": "default", "rope_theta": ...}`, no top-level key) or from
/// `rope_scaling` (older files); two of them giving different θ is an error. Any `rope_type`
/// other than `"default"` (`"linear"`, `"dynamic"`, `"yarn"`, `"llama3"`, ...) is refused by
/// name, as is a `partial_rotary_factor` other than 1: riftco implements unscaled, full-width
/// RoPE only.
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
    config.rope_theta = rope_theta(v)?;
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
fn number_field(v: &serde_json::Value, key: &str) -> std::result::Result<Option<f64>, String> {
    match v.get(key) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(x) => x
            .as_f64()
            .map(Some)
            .ok_or_else(|| format!("{key} = {x} is not a number")),
    }
}

/// RoPE θ of a Hugging Face config (see [`config_from_hf`]), default 10000.
fn rope_theta(v: &serde_json::Value) -> std::result::Result<f64, String> {
    let mut theta = number_field(v, "rope_theta")?.map(|t| ("rope_theta", t));
    if let Some(f) = number_field(v, "partial_rotary_factor")? {
        if f != 1.0 {
            return Err(format!(
                "partial_rotary_factor {f} is not supported (riftco rotates the whole head)"
            ));
        }
    }
    for (key, theta_label) in [
        ("rope_parameters", "rope_parameters.rope_theta"),
        ("rope_scaling", "rope_scaling.rope_theta"),
    ] {
        let params = match v.get(key) {
            None | Some(serde_json::Value::Null) => continue,
            Some(p @ serde_json::Value::Object(_)) => p,
            Some(other) => return Err(format!("{key} = {other} is not an object")),
        };
        let per_layer_type = params
            .as_object()
            .is_some_and(|m| m.values().any(serde_json::Value::is_object));
        let rope_type = match params.get("rope_type").or_else(|| params.get("type")) {
            Some(serde_json::Value::String(t)) => t.as_str(),
            // transformers 5 may key parameters by layer type ({"full_attention": {...}}).
            None if per_layer_type => {
                return Err(format!(
                    "{key} = {params} gives RoPE parameters per layer type, which is not supported"
                ))
            }
            None if key == "rope_parameters" => "default",
            _ => {
                return Err(format!(
                    "{key} = {params} has no rope_type string; expected \"default\""
                ))
            }
        };
        if rope_type != "default" {
            return Err(format!(
                "{key}.rope_type {rope_type:?} is not supported: riftco implements only \"default\" \
                 (unscaled) RoPE ({key} = {params})"
            ));
        }
        if let Some(f) = number_field(params, "partial_rotary_factor")? {
            if f != 1.0 {
                return Err(format!(
                    "{key}.partial_rotary_factor {f} is not supported (riftco rotates the whole \
                     head)"
                ));
            }
        }
        if let Some(t) = number_field(params, "rope_theta")? {
            match theta {
                Some((from, earlier)) if earlier != t => {
                    return Err(format!("{theta_label} {t} disagrees with {from} {earlier}"))
                }
                _ => theta = Some((theta_label, t)),
            }
        }
    }
    Ok(theta.map_or(10000.0, |(_, t)| t))
}
