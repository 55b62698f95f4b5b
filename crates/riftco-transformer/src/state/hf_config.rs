//! The Hugging Face `config.json` (`LlamaConfig`) written beside a model state and read when
//! a state file carries no riftco config.

use crate::config::TransformerConfig;
use serde_json::json;

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

/// A [`TransformerConfig`] from Hugging Face `LlamaConfig` fields (defaults as in
/// `transformers`: `rms_norm_eps` 1e-6, `rope_theta` 10000). Rejects what riftco's model cannot
/// represent: grouped-query attention, tied embeddings, RoPE scaling, biases, another activation.
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
