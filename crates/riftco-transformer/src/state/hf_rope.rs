//! RoPE θ and scaling in a Hugging Face `config.json`: read from `rope_parameters`
//! (transformers 5), `rope_scaling` (older) and the top-level `rope_theta`; written in the
//! transformers-5 form.

use super::hf_config::number_field;
use crate::config::TransformerConfig;
use crate::rope_scaling::RopeScaling;
use serde_json::{json, Value};

/// The `rope_parameters` object of `config`: `{"rope_type", "rope_theta"}` plus the scaling's
/// parameters (`factor`; for `llama3` also `low_freq_factor`, `high_freq_factor`,
/// `original_max_position_embeddings`).
pub(super) fn rope_parameters_json(config: &TransformerConfig) -> Value {
    let mut v = serde_json::to_value(&config.rope_scaling).unwrap_or_else(|_| json!({}));
    if let Some(m) = v.as_object_mut() {
        m.insert("rope_theta".into(), json!(config.rope_theta));
    }
    v
}

/// RoPE θ (default 10000) and scaling of a Hugging Face config.
///
/// θ is read from the top-level `rope_theta` (transformers 4), from `rope_parameters`
/// (transformers 5) and from `rope_scaling` (older files); two of them giving different θ is an
/// error. The scaling is `rope_type` (or the older `type`) of `rope_parameters` or
/// `rope_scaling`: `"default"`, `"linear"` (`factor`) or `"llama3"` (`factor`,
/// `low_freq_factor`, `high_freq_factor`, `original_max_position_embeddings`); both keys giving
/// different scalings is an error. Any other `rope_type` (`"dynamic"`, `"yarn"`, `"longrope"`,
/// ...) is refused by name, as are parameters per layer type and a `partial_rotary_factor`
/// other than 1 (riftco rotates the whole head). The parameters are validated by
/// [`RopeScaling::validate`] with the rest of the config.
pub(super) fn rope_from_hf(v: &Value) -> Result<(f64, RopeScaling), String> {
    let mut theta = number_field(v, "rope_theta")?.map(|t| ("rope_theta", t));
    check_partial("", v)?;
    let mut scaling: Option<(&str, RopeScaling)> = None;
    for (key, theta_label) in [
        ("rope_parameters", "rope_parameters.rope_theta"),
        ("rope_scaling", "rope_scaling.rope_theta"),
    ] {
        let params = match v.get(key) {
            None | Some(Value::Null) => continue,
            Some(p @ Value::Object(_)) => p,
            Some(other) => return Err(format!("{key} = {other} is not an object")),
        };
        let per_layer_type = params
            .as_object()
            .is_some_and(|m| m.values().any(Value::is_object));
        let rope_type = match params.get("rope_type").or_else(|| params.get("type")) {
            Some(Value::String(t)) => t.as_str(),
            // transformers 5 may key parameters by layer type ({"full_attention": {...}}).
            None if per_layer_type => {
                return Err(format!(
                    "{key} = {params} gives RoPE parameters per layer type, which is not supported"
                ))
            }
            None if key == "rope_parameters" => "default",
            _ => {
                return Err(format!(
                    "{key} = {params} has no rope_type string; expected \"default\", \"linear\" \
                     or \"llama3\""
                ))
            }
        };
        let this = parse_scaling(key, rope_type, params)?;
        check_partial(&format!("{key}."), params)?;
        if let Some(t) = number_field(params, "rope_theta")? {
            match theta {
                Some((from, earlier)) if earlier != t => {
                    return Err(format!("{theta_label} {t} disagrees with {from} {earlier}"))
                }
                _ => theta = Some((theta_label, t)),
            }
        }
        match &scaling {
            Some((from, earlier)) if *earlier != this => {
                return Err(format!(
                    "{key} ({this:?}) disagrees with {from} ({earlier:?}): give one RoPE scaling"
                ))
            }
            _ => scaling = Some((key, this)),
        }
    }
    Ok((
        theta.map_or(10000.0, |(_, t)| t),
        scaling.map_or(RopeScaling::Default, |(_, s)| s),
    ))
}

fn check_partial(prefix: &str, v: &Value) -> Result<(), String> {
    match number_field(v, "partial_rotary_factor")? {
        Some(f) if f != 1.0 => Err(format!(
            "{prefix}partial_rotary_factor {f} is not supported (riftco rotates the whole head)"
        )),
        _ => Ok(()),
    }
}

fn parse_scaling(key: &str, rope_type: &str, params: &Value) -> Result<RopeScaling, String> {
    let num = |name: &str| {
        number_field(params, name)?.ok_or_else(|| {
            format!("{key}.{name} is missing: rope_type {rope_type:?} needs it ({key} = {params})")
        })
    };
    Ok(match rope_type {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear {
            factor: num("factor")?,
        },
        "llama3" => {
            let name = "original_max_position_embeddings";
            let context = params
                .get(name)
                .and_then(Value::as_u64)
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| {
                    format!(
                        "{key}.{name} = {} is not a non-negative integer: rope_type \"llama3\" \
                         needs it",
                        params.get(name).unwrap_or(&Value::Null)
                    )
                })?;
            RopeScaling::Llama3 {
                factor: num("factor")?,
                low_freq_factor: num("low_freq_factor")?,
                high_freq_factor: num("high_freq_factor")?,
                original_max_position_embeddings: context,
            }
        }
        other => {
            return Err(format!(
                "{key}.rope_type {other:?} is not supported: riftco implements \"default\", \
                 \"linear\" and \"llama3\" RoPE ({key} = {params})"
            ))
        }
    })
}
