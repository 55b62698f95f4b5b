//! The architecture fields beyond `rt_transformer_config` (since 2.4): grouped-query
//! attention (`n_kv_heads`) and tied embeddings (`tie_word_embeddings`). They change the
//! parameter shapes, so they are part of the config a model is created with, not setters.

use crate::error::{err, guard, in_ptr, out_ptr, rt_status, Result};
use crate::model::{attention_kind, rt_model, rt_transformer_config};
use crate::policy::checkpointing_arg;
use riftco_transformer::{DecoderOnlyTransformer, TransformerConfig};

/// `rt_transformer_config` plus the fields added in ABI 2.4. Fill it with
/// `rt_transformer_config_v2_default` (or from `rt_model_config_v2`) and change fields.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct rt_transformer_config_v2 {
    /// The 2.0 fields (sizes, RMSNorm epsilon, RoPE theta, seed).
    pub base: rt_transformer_config,
    /// Key/value heads of grouped-query attention (Ainslie et al. 2023; Hugging Face's
    /// `num_key_value_heads`): at least 1 and a divisor of `base.n_heads`; query head `h` reads
    /// key/value head `h / (n_heads / n_kv_heads)`, `k_proj` and `v_proj` are
    /// `[n_kv_heads * d_head, d_model]` and the decode K/V cache holds `n_kv_heads` heads.
    /// `n_heads` is multi-head attention (the default).
    pub n_kv_heads: usize,
    /// 1: the LM head reads the token embedding matrix (one parameter,
    /// `model.embed_tokens.weight`; no `lm_head.weight` is saved); 0: untied (the default).
    /// Any other value is RT_ERROR_INVALID_ARGUMENT.
    pub tie_word_embeddings: u32,
}

impl From<&TransformerConfig> for rt_transformer_config_v2 {
    fn from(c: &TransformerConfig) -> Self {
        Self {
            base: c.into(),
            n_kv_heads: c.n_kv_heads,
            tie_word_embeddings: u32::from(c.tie_word_embeddings),
        }
    }
}

/// The core config of `c`; its validation happens at model creation.
fn core_config(c: &rt_transformer_config_v2) -> Result<TransformerConfig> {
    {
        let tie = match c.tie_word_embeddings {
            0 => false,
            1 => true,
            v => {
                return Err(err(
                    rt_status::RT_ERROR_INVALID_ARGUMENT,
                    format!("tie_word_embeddings = {v}: expected 0 (untied) or 1 (tied)"),
                ))
            }
        };
        Ok(TransformerConfig::from(&c.base)
            .with_n_kv_heads(c.n_kv_heads)
            .with_tie_word_embeddings(tie))
    }
}

/// Writes the default configuration (that of `rt_transformer_config_default`, with
/// `n_kv_heads = n_heads` = 8 and `tie_word_embeddings = 0`) into `*out`.
///
/// Errors: RT_ERROR_NULL_POINTER.
#[no_mangle]
pub unsafe extern "C" fn rt_transformer_config_v2_default(
    out: *mut rt_transformer_config_v2,
) -> rt_status {
    guard("rt_transformer_config_v2_default", || {
        *out_ptr(out, "out")? = (&TransformerConfig::reference()).into();
        Ok(())
    })
}

/// `rt_model_create` with an `rt_transformer_config_v2` (grouped-query attention, tied
/// embeddings). On success `*out` receives a new handle owned by the caller (release it with
/// rt_model_free); on failure `*out` is set to NULL.
///
/// Errors: as rt_model_create; RT_ERROR_INVALID_ARGUMENT also for `n_kv_heads` 0 or not
/// dividing `n_heads` (the message names both values) and a `tie_word_embeddings` other than
/// 0 or 1.
#[no_mangle]
pub unsafe extern "C" fn rt_model_create_v2(
    config: *const rt_transformer_config_v2,
    attention: u32,
    activation_checkpointing: u32,
    out: *mut *mut rt_model,
) -> rt_status {
    guard("rt_model_create_v2", || {
        let out = out_ptr(out, "out")?;
        *out = std::ptr::null_mut();
        let config = core_config(in_ptr(config, "config")?)?;
        let attention = attention_kind(attention)?;
        let policy = checkpointing_arg(activation_checkpointing)?;
        let model = DecoderOnlyTransformer::new(config, attention, policy)?;
        *out = rt_model::new(model);
        Ok(())
    })
}

/// Writes the model's configuration, with `n_kv_heads` and `tie_word_embeddings`, into `*out`
/// (`rt_model_config` writes only the 2.0 fields).
///
/// Errors: RT_ERROR_NULL_POINTER.
#[no_mangle]
pub unsafe extern "C" fn rt_model_config_v2(
    model: *const rt_model,
    out: *mut rt_transformer_config_v2,
) -> rt_status {
    guard("rt_model_config_v2", || {
        let out = out_ptr(out, "out")?;
        let model = in_ptr(model, "model")?;
        *out = model.lock().model.config().into();
        Ok(())
    })
}
