//! The model handle: creation from a config, policy and attention kind, LoRA.

use crate::error::{err, guard, guard_void, in_ptr, out_ptr, rt_status, Result};
use crate::policy::checkpointing_arg;
use riftco_autograd::GraphStatistics;
use riftco_transformer::{
    layout, DecoderOnlyTransformer, FullSequenceAttentionKind, LoraConfig, OptionTable,
    TransformerConfig, WeightDtype, ATTENTION_KINDS,
};
use std::ffi::c_char;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Sizes and numerics of a model. It does not carry the activation-checkpointing policy (seed
/// 000): pass that to `rt_model_create` and change it with
/// `rt_model_set_activation_checkpointing`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct rt_transformer_config {
    /// Vocabulary size (byte-level: 256).
    pub vocab_size: usize,
    /// Residual stream width; divisible by `n_heads`, with `d_model / n_heads` even.
    pub d_model: usize,
    /// Attention heads.
    pub n_heads: usize,
    /// Transformer blocks.
    pub n_layers: usize,
    /// Hidden width of the SwiGLU MLP.
    pub d_ff: usize,
    /// Longest sequence (RoPE table size, decode K/V cache capacity).
    pub max_seq_len: usize,
    /// RMSNorm epsilon (> 0, default 1e-5).
    pub rms_norm_eps: f32,
    /// RoPE base theta (> 0, default 10000).
    pub rope_theta: f64,
    /// Seed of the weight initialisation.
    pub seed: u64,
}

impl From<&TransformerConfig> for rt_transformer_config {
    fn from(c: &TransformerConfig) -> Self {
        Self {
            vocab_size: c.vocab_size,
            d_model: c.d_model,
            n_heads: c.n_heads,
            n_layers: c.n_layers,
            d_ff: c.d_ff,
            max_seq_len: c.max_seq_len,
            rms_norm_eps: c.rms_norm_eps,
            rope_theta: c.rope_theta,
            seed: c.seed,
        }
    }
}

impl From<&rt_transformer_config> for TransformerConfig {
    fn from(c: &rt_transformer_config) -> Self {
        TransformerConfig {
            vocab_size: c.vocab_size,
            d_model: c.d_model,
            n_heads: c.n_heads,
            n_layers: c.n_layers,
            d_ff: c.d_ff,
            max_seq_len: c.max_seq_len,
            rms_norm_eps: c.rms_norm_eps,
            rope_theta: c.rope_theta,
            seed: c.seed,
            // Not in the struct (ABI 2.x): set with rt_model_set_dropout.
            attention_dropout: 0.0,
            residual_dropout: 0.0,
            // Not in the C ABI: unscaled RoPE, no token ids (a loaded model keeps its own).
            rope_scaling: riftco_transformer::RopeScaling::Default,
            bos_token_id: None,
            eos_token_ids: Vec::new(),
            n_kv_heads: c.n_heads,
            tie_word_embeddings: false,
        }
    }
}

/// LoRA hyper-parameters for `rt_model_enable_lora`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct rt_lora_config {
    /// Rank r, in 1..=d_model.
    pub rank: usize,
    /// Scaling numerator (scale = alpha / rank), positive and finite.
    pub alpha: f32,
    /// OR of rt_lora_target bits (RT_LORA_TARGET_ATTENTION, RT_LORA_TARGET_MLP), not 0.
    pub targets: u32,
    /// Seed of the A initialisation.
    pub seed: u64,
}

pub(crate) struct ModelState {
    pub(crate) model: DecoderOnlyTransformer,
    /// Graph statistics of the last loss computed through this handle family.
    pub(crate) last_graph: Option<GraphStatistics>,
}

/// An opaque, reference-counted model. Created by `rt_model_create`, `rt_model_load` or
/// `rt_model_retain`; released with `rt_model_free`. Graphs, optimizers and decode sessions
/// created from it share its weights and stay valid after it is freed.
pub struct rt_model {
    pub(crate) inner: Arc<Mutex<ModelState>>,
}

impl rt_model {
    pub(crate) fn new(model: DecoderOnlyTransformer) -> *mut rt_model {
        Box::into_raw(Box::new(rt_model {
            inner: Arc::new(Mutex::new(ModelState {
                model,
                last_graph: None,
            })),
        }))
    }

    /// Locks the model; a previous panic while locked does not make it unusable (every export
    /// leaves the model consistent before it can panic).
    pub(crate) fn lock(&self) -> MutexGuard<'_, ModelState> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub(crate) fn attention_kind(v: u32) -> Result<FullSequenceAttentionKind> {
    enum_arg(&ATTENTION_KINDS, v)
}

/// The value of enum argument `v`, validated against the option's table; an unknown value is
/// RT_ERROR_INVALID_ENUM naming it and every valid constant.
fn enum_arg<T: Copy + PartialEq + std::fmt::Debug>(
    table: &'static OptionTable<T>,
    v: u32,
) -> Result<T> {
    table.from_c(v).map_err(|_| {
        let constants: Vec<String> = table
            .by_c_value()
            .map(|r| format!("{} ({})", r.c_name, r.c_value))
            .collect();
        err(
            rt_status::RT_ERROR_INVALID_ENUM,
            format!(
                "{} {v} is unknown; expected {}",
                table.c_what,
                constants.join(" or ")
            ),
        )
    })
}

/// Writes the default configuration (vocab 256, d_model 256, 8 heads, 8 layers, d_ff 688,
/// max_seq_len 256, rms_norm_eps 1e-5, rope_theta 10000, seed 0) into `*out`.
///
/// Errors: RT_ERROR_NULL_POINTER.
#[no_mangle]
pub unsafe extern "C" fn rt_transformer_config_default(
    out: *mut rt_transformer_config,
) -> rt_status {
    guard("rt_transformer_config_default", || {
        *out_ptr(out, "out")? = (&TransformerConfig::reference()).into();
        Ok(())
    })
}

/// Creates a model with freshly initialised weights (seeded by `config->seed`).
///
/// `attention` is an rt_attention_kind, `activation_checkpointing` an
/// rt_activation_checkpointing without parameters (DISABLED, TRANSFORMER_BLOCK or AUTO; set
/// the others afterwards with their setters). On success `*out` receives a new handle owned by the caller
/// (release it with rt_model_free); on failure `*out` is set to NULL.
///
/// Errors: RT_ERROR_NULL_POINTER, RT_ERROR_INVALID_ENUM (an unknown value, or a policy form
/// that needs parameters: the message names its setter), RT_ERROR_INVALID_ARGUMENT (a config
/// field, named in the message; also sizes whose parameters, gradients, Adam state, RoPE table
/// and decode K/V cache together exceed 2^47 bytes, with the byte count), RT_ERROR_OUT_OF_MEMORY
/// (the weights passed that check but could not be allocated).
#[no_mangle]
pub unsafe extern "C" fn rt_model_create(
    config: *const rt_transformer_config,
    attention: u32,
    activation_checkpointing: u32,
    out: *mut *mut rt_model,
) -> rt_status {
    guard("rt_model_create", || {
        let out = out_ptr(out, "out")?;
        *out = std::ptr::null_mut();
        let config = in_ptr(config, "config")?;
        let attention = attention_kind(attention)?;
        let policy = checkpointing_arg(activation_checkpointing)?;
        let model = DecoderOnlyTransformer::new(config.into(), attention, policy)?;
        *out = rt_model::new(model);
        Ok(())
    })
}

/// Creates a second handle to the same model (reference count + 1). Both must be freed.
///
/// Errors: RT_ERROR_NULL_POINTER.
#[no_mangle]
pub unsafe extern "C" fn rt_model_retain(
    model: *const rt_model,
    out: *mut *mut rt_model,
) -> rt_status {
    guard("rt_model_retain", || {
        let out = out_ptr(out, "out")?;
        *out = std::ptr::null_mut();
        let model = in_ptr(model, "model")?;
        *out = Box::into_raw(Box::new(rt_model {
            inner: model.inner.clone(),
        }));
        Ok(())
    })
}

/// Releases a model handle. NULL is accepted and ignored. Graphs, optimizers and decode
/// sessions created from the model stay valid.
#[no_mangle]
pub unsafe extern "C" fn rt_model_free(model: *mut rt_model) {
    guard_void(|| {
        if !model.is_null() {
            // SAFETY: a handle from this library, freed once (caller contract).
            drop(unsafe { Box::from_raw(model) });
        }
    })
}

/// Writes the model's configuration into `*out` (the 2.0 fields; `rt_model_config_v2` adds
/// `n_kv_heads` and `tie_word_embeddings`).
///
/// Errors: RT_ERROR_NULL_POINTER.
#[no_mangle]
pub unsafe extern "C" fn rt_model_config(
    model: *const rt_model,
    out: *mut rt_transformer_config,
) -> rt_status {
    guard("rt_model_config", || {
        let out = out_ptr(out, "out")?;
        let model = in_ptr(model, "model")?;
        *out = model.lock().model.config().into();
        Ok(())
    })
}

/// Sets the activation-checkpointing policy of later training forwards to a form without
/// parameters: RT_ACTIVATION_CHECKPOINTING_DISABLED, _TRANSFORMER_BLOCK or _AUTO. The forms
/// with parameters have their own setters (rt_model_set_activation_checkpointing_segments,
/// _selective, _policy, rt_model_set_activation_memory_budget). Graphs recorded before and live
/// decode sessions are unaffected.
///
/// Errors: RT_ERROR_NULL_POINTER, RT_ERROR_INVALID_ENUM (an unknown value, or SEGMENTS,
/// SELECTIVE, PER_BLOCK or BUDGET: the message names the setter to call). On error the policy is
/// unchanged.
#[no_mangle]
pub unsafe extern "C" fn rt_model_set_activation_checkpointing(
    model: *mut rt_model,
    activation_checkpointing: u32,
) -> rt_status {
    guard("rt_model_set_activation_checkpointing", || {
        let model = in_ptr(model, "model")?;
        let policy = checkpointing_arg(activation_checkpointing)?;
        model.lock().model.set_activation_checkpointing(policy)?;
        Ok(())
    })
}

/// Writes the form of the current activation-checkpointing policy (an
/// rt_activation_checkpointing value, 0 to 6; the parameters are in the spelling that
/// rt_model_activation_checkpointing_policy writes).
///
/// Errors: RT_ERROR_NULL_POINTER.
#[no_mangle]
pub unsafe extern "C" fn rt_model_activation_checkpointing(
    model: *const rt_model,
    out: *mut u32,
) -> rt_status {
    guard("rt_model_activation_checkpointing", || {
        let out = out_ptr(out, "out")?;
        let model = in_ptr(model, "model")?;
        *out = model.lock().model.activation_checkpointing().c_kind();
        Ok(())
    })
}

/// Sets the attention kind (an rt_attention_kind) of later training forwards.
///
/// Errors: RT_ERROR_NULL_POINTER, RT_ERROR_INVALID_ENUM.
#[no_mangle]
pub unsafe extern "C" fn rt_model_set_attention(model: *mut rt_model, attention: u32) -> rt_status {
    guard("rt_model_set_attention", || {
        let model = in_ptr(model, "model")?;
        let kind = attention_kind(attention)?;
        model.lock().model.set_attention_kind(kind);
        Ok(())
    })
}

/// Stores every frozen base weight (the base under LoRA: call rt_model_enable_lora first) in
/// `dtype` while every op keeps computing in float32: "float32", "bfloat16", "float16", or a
/// block-quantized format — "nf4" (QLoRA's NormalFloat4, blocks of 64 with double-quantized
/// absmax), "q8_0", "q4_0", "q4_1", "q5_0", "q5_1" (blocks of 32), "q2_k" ... "q6_k" (blocks of
/// 256) — case-insensitive. Quantized weights are matrices whose rows are whole blocks (the
/// RMSNorm gains stay float32); products dequantize a block of the weight at a time. Replaces
/// the parameter set as rt_model_enable_lora does: create the rt_adam after this call.
///
/// Errors: RT_ERROR_NULL_POINTER, RT_ERROR_INVALID_STRING (not UTF-8), RT_ERROR_INVALID_ARGUMENT
/// (an unknown dtype, listing the accepted ones; no frozen weight; a 16-bit dtype on a model
/// not on the CPU, where 16-bit storage does not live (quantized formats do); a
/// matrix whose rows are not whole blocks, named). The model is unchanged on error.
#[no_mangle]
pub unsafe extern "C" fn rt_model_set_frozen_weights_dtype(
    model: *mut rt_model,
    dtype: *const c_char,
) -> rt_status {
    guard("rt_model_set_frozen_weights_dtype", || {
        let model = in_ptr(model, "model")?;
        let dtype: WeightDtype = crate::strings::str_arg(dtype, "dtype")?.parse()?;
        model.lock().model.set_frozen_weights_dtype(dtype)?;
        Ok(())
    })
}

/// Writes the attention kind (an rt_attention_kind value).
///
/// Errors: RT_ERROR_NULL_POINTER.
#[no_mangle]
pub unsafe extern "C" fn rt_model_attention(model: *const rt_model, out: *mut u32) -> rt_status {
    guard("rt_model_attention", || {
        let out = out_ptr(out, "out")?;
        let model = in_ptr(model, "model")?;
        *out = model.lock().model.attention_kind().to_int();
        Ok(())
    })
}

/// Adds LoRA adapters to the target layers, activates them and freezes the base weights.
/// Optimizers created before keep updating the old (now frozen) parameter set: create the
/// rt_adam after this call.
///
/// Errors: RT_ERROR_NULL_POINTER, RT_ERROR_INVALID_ENUM (unknown target bits),
/// RT_ERROR_INVALID_ARGUMENT (rank, alpha, no targets), RT_ERROR_INVALID_STATE (adapters
/// already exist).
#[no_mangle]
pub unsafe extern "C" fn rt_model_enable_lora(
    model: *mut rt_model,
    config: *const rt_lora_config,
) -> rt_status {
    guard("rt_model_enable_lora", || {
        let model = in_ptr(model, "model")?;
        let config = in_ptr(config, "config")?;
        let groups = &layout::LORA_TARGET_GROUPS;
        let known = groups.iter().fold(0, |mask, g| mask | g.c_value);
        if config.targets & !known != 0 {
            let bits: Vec<String> = groups
                .iter()
                .map(|g| format!("{} ({})", g.c_name, g.c_value))
                .collect();
            return Err(err(
                rt_status::RT_ERROR_INVALID_ENUM,
                format!(
                    "LoRA targets {:#x} has unknown bits; expected an OR of {}",
                    config.targets,
                    bits.join(" and ")
                ),
            ));
        }
        let lora = LoraConfig {
            rank: config.rank,
            alpha: config.alpha,
            targets: layout::lora_targets(|role| {
                groups
                    .iter()
                    .any(|g| g.value == role && config.targets & g.c_value != 0)
            }),
            seed: config.seed,
            // rt_lora_config has no dropout field (ABI 2.x); set it with rt_model_set_dropout.
            dropout: 0.0,
        };
        let mut state = model.lock();
        if state.model.has_lora() {
            return Err(err(
                rt_status::RT_ERROR_INVALID_STATE,
                "the model already has LoRA adapters",
            ));
        }
        state.model.enable_lora(&lora)?;
        Ok(())
    })
}
