//! Activation-checkpointing policies through the C ABI (2.2): the integer forms accepted by
//! `rt_model_create` / `rt_model_load` / `rt_model_set_activation_checkpointing`, the setters of
//! the forms with parameters, and the policy and plan strings.

use crate::error::{err, guard, in_ptr, rt_status, Result};
use crate::model::rt_model;
use crate::rt_activation_checkpointing::{self, *};
use crate::strings::{str_arg, write_string};
use riftco_transformer::{ActivationCheckpointing, SaveSet, TransformerConfig, MAX_MODEL_BYTES};
use std::ffi::c_char;

/// Every `rt_activation_checkpointing` constant in value order with, for a form that needs
/// parameters, the setter that takes them.
pub(crate) const FORMS: [(rt_activation_checkpointing, Option<&str>); 7] = [
    (RT_ACTIVATION_CHECKPOINTING_DISABLED, None),
    (RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK, None),
    (
        RT_ACTIVATION_CHECKPOINTING_SEGMENTS,
        Some("rt_model_set_activation_checkpointing_segments"),
    ),
    (RT_ACTIVATION_CHECKPOINTING_AUTO, None),
    (
        RT_ACTIVATION_CHECKPOINTING_SELECTIVE,
        Some("rt_model_set_activation_checkpointing_selective"),
    ),
    (
        RT_ACTIVATION_CHECKPOINTING_PER_BLOCK,
        Some("rt_model_set_activation_checkpointing_policy"),
    ),
    (
        RT_ACTIVATION_CHECKPOINTING_BUDGET,
        Some("rt_model_set_activation_memory_budget"),
    ),
];

/// The constants an integer argument accepts, as error messages list them.
fn accepted_integers() -> String {
    let accepted: Vec<String> = FORMS
        .iter()
        .filter(|(_, setter)| setter.is_none())
        .map(|(c, _)| format!("{c:?} ({})", *c as u32))
        .collect();
    match accepted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => accepted.join(""),
    }
}

/// The policy of integer argument `v` (an `rt_activation_checkpointing`): DISABLED,
/// TRANSFORMER_BLOCK or AUTO. A form that needs parameters is RT_ERROR_INVALID_ENUM naming its
/// setter; an unknown value RT_ERROR_INVALID_ENUM listing the accepted constants.
pub(crate) fn checkpointing_arg(v: u32) -> Result<ActivationCheckpointing> {
    let Some((form, setter)) = FORMS.iter().find(|(c, _)| *c as u32 == v) else {
        return Err(err(
            rt_status::RT_ERROR_INVALID_ENUM,
            format!(
                "activation checkpointing policy {v} is unknown; expected {}",
                accepted_integers()
            ),
        ));
    };
    match (form, setter) {
        (RT_ACTIVATION_CHECKPOINTING_DISABLED, _) => Ok(ActivationCheckpointing::Disabled),
        (RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK, _) => Ok(ActivationCheckpointing::Block),
        (RT_ACTIVATION_CHECKPOINTING_AUTO, _) => Ok(ActivationCheckpointing::Auto),
        (_, setter) => Err(err(
            rt_status::RT_ERROR_INVALID_ENUM,
            format!(
                "activation checkpointing policy {v} ({form:?}) needs parameters: set it with \
                 {} (or rt_model_set_activation_checkpointing_policy with its spelling); this \
                 argument accepts {}",
                setter.unwrap_or("rt_model_set_activation_checkpointing_policy"),
                accepted_integers()
            ),
        )),
    }
}

/// Validates and installs `policy`; on error the model's policy is unchanged.
unsafe fn set_policy(model: *mut rt_model, policy: ActivationCheckpointing) -> Result<()> {
    let model = in_ptr(model, "model")?;
    model.lock().model.set_activation_checkpointing(policy)?;
    Ok(())
}

/// Checks training inputs `[batch, seq]` for a plan: `batch >= 1`, `1 <= seq <= max_seq_len`,
/// and the step's largest activation (`batch · seq · max(d_model, d_ff, vocab_size)` f32) within
/// the 2^47-byte bound of model sizes.
fn check_plan_shape(cfg: &TransformerConfig, batch: usize, seq: usize) -> Result<()> {
    let shape = format!("[batch {batch}, seq {seq}]");
    if batch == 0 || seq == 0 || seq > cfg.max_seq_len {
        return Err(err(
            rt_status::RT_ERROR_SHAPE,
            format!(
                "training inputs {shape} need batch >= 1 and 1 <= seq <= max_seq_len {}",
                cfg.max_seq_len
            ),
        ));
    }
    let widest = cfg.d_model.max(cfg.d_ff).max(cfg.vocab_size) as u128;
    let bytes = batch as u128 * seq as u128 * widest * 4;
    if bytes > MAX_MODEL_BYTES {
        return Err(err(
            rt_status::RT_ERROR_SHAPE,
            format!(
                "training inputs {shape} need {bytes} bytes for one activation of width \
                 {widest}, above the bound of {MAX_MODEL_BYTES} bytes"
            ),
        ));
    }
    Ok(())
}

/// Sets `segments:K`: K consecutive blocks form one checkpoint (the last one shorter when K does
/// not divide n_layers); `k` = 1 is TRANSFORMER_BLOCK's plan. K is not clamped.
///
/// Errors: RT_ERROR_NULL_POINTER, RT_ERROR_INVALID_ARGUMENT (`k` = 0 or `k` > n_layers; the
/// message names `segments:K` and n_layers). On error the policy is unchanged.
#[no_mangle]
pub unsafe extern "C" fn rt_model_set_activation_checkpointing_segments(
    model: *mut rt_model,
    k: u32,
) -> rt_status {
    guard("rt_model_set_activation_checkpointing_segments", || {
        set_policy(model, ActivationCheckpointing::Segments(k as usize))
    })
}

/// Sets `selective:NAME`: every block is a selective checkpoint whose forward saves the values
/// of policy `name` and whose replay recomputes the others. `name` (NUL-terminated UTF-8) is a
/// named policy (`"attention_ffn"`, the default; `"dots"`, the matrix products; `"attention"`,
/// the attention output with its logsumexp) or block value names joined by `'+'`
/// (`"q+k+v"`); NULL means the default named policy.
///
/// Errors: RT_ERROR_NULL_POINTER (model), RT_ERROR_INVALID_STRING (not UTF-8),
/// RT_ERROR_INVALID_ARGUMENT (an unknown name; the message names it and lists the policies and
/// the value names). On error the policy is unchanged.
#[no_mangle]
pub unsafe extern "C" fn rt_model_set_activation_checkpointing_selective(
    model: *mut rt_model,
    name: *const c_char,
) -> rt_status {
    guard("rt_model_set_activation_checkpointing_selective", || {
        in_ptr(model, "model")?;
        let save = if name.is_null() {
            SaveSet::default_policy()
        } else {
            SaveSet::parse(str_arg(name, "name")?)?
        };
        set_policy(model, ActivationCheckpointing::Selective(save))
    })
}

/// Sets `budget:BYTES`: at the first training forward of a shape (or
/// rt_model_activation_checkpointing_plan) a planner measures this model's per-block bytes and
/// times and picks per-block policies with the least predicted recompute time whose predicted
/// peak activation bytes are at most `bytes`.
///
/// Errors: RT_ERROR_NULL_POINTER. Any value is accepted here; a budget below the smallest
/// achievable peak fails at plan time (rt_model_train_step, rt_model_loss,
/// rt_model_activation_checkpointing_plan) with RT_ERROR_INVALID_ARGUMENT naming the budget and
/// the smallest achievable peak in bytes.
#[no_mangle]
pub unsafe extern "C" fn rt_model_set_activation_memory_budget(
    model: *mut rt_model,
    bytes: u64,
) -> rt_status {
    guard("rt_model_set_activation_memory_budget", || {
        set_policy(model, ActivationCheckpointing::Budget(bytes))
    })
}

/// Sets a policy from its spelling (NUL-terminated UTF-8): `"disabled"`, `"block"`,
/// `"segments:K"` (1 <= K <= n_layers), `"auto"`, `"selective"`, `"selective:NAME"`, a
/// comma-separated per-block list of `"disabled"` / `"block"` / `"selective[:NAME]"` with one
/// entry per layer (`"disabled,block,selective:dots"`), or `"budget:SIZE"` with SIZE a byte
/// count and an optional unit B, kB, MB, GB, TB, KiB, MiB, GiB or TiB (`"budget:64MiB"`).
///
/// Errors: RT_ERROR_NULL_POINTER (model or spec), RT_ERROR_INVALID_STRING (not UTF-8),
/// RT_ERROR_INVALID_ARGUMENT (an unknown spelling, K out of range, a per-block list of another
/// length than n_layers, an unknown selective name or size unit; the message names the value and
/// what is accepted). On error the policy is unchanged.
#[no_mangle]
pub unsafe extern "C" fn rt_model_set_activation_checkpointing_policy(
    model: *mut rt_model,
    spec: *const c_char,
) -> rt_status {
    guard("rt_model_set_activation_checkpointing_policy", || {
        in_ptr(model, "model")?;
        let policy: ActivationCheckpointing = str_arg(spec, "spec")?.parse()?;
        set_policy(model, policy)
    })
}

/// Writes the current policy's spelling (as rt_model_set_activation_checkpointing_policy
/// accepts it; `"selective"` reads back as `"selective:attention_ffn"`, a budget as
/// `"budget:BYTES"`) into `buf` (`cap` bytes), NUL-terminated.
///
/// `*needed` (when `needed` is not NULL) receives the bytes the spelling needs, NUL included.
/// As for rt_last_error_message: `cap` = 0 (`buf` may then be NULL) queries the size and
/// returns RT_ERROR_BUFFER_TOO_SMALL; a smaller `cap` receives a truncated NUL-terminated
/// prefix and RT_ERROR_BUFFER_TOO_SMALL.
///
/// Errors: RT_ERROR_NULL_POINTER (model; buf with `cap` > 0), RT_ERROR_BUFFER_TOO_SMALL.
#[no_mangle]
pub unsafe extern "C" fn rt_model_activation_checkpointing_policy(
    model: *const rt_model,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
) -> rt_status {
    guard("rt_model_activation_checkpointing_policy", || {
        let model = in_ptr(model, "model")?;
        let text = model.lock().model.activation_checkpointing().to_string();
        write_string(&text, "policy", buf, cap, needed)
    })
}

/// Resolves the current policy for training inputs `[batch, seq]` (the token block of
/// rt_model_train_step is `[batch, seq + 1]`) and writes the plan into `buf` (`cap` bytes),
/// NUL-terminated: the policy, then each segment's per-block policy and blocks, and for `auto`
/// and budgets the predicted peak activation and step time, e.g.
/// `"segments:2 → block[0-1] block[2-3]"` (UTF-8).
///
/// `auto` and budgets measure this model at that shape the first time (a few block forwards
/// and backwards); the plan is kept for later calls and training steps until the policy, the
/// shape, the attention kind or LoRA changes, so a size query followed by the call measures
/// once. `*needed` and small buffers as in rt_model_activation_checkpointing_policy.
///
/// Errors: RT_ERROR_NULL_POINTER, RT_ERROR_SHAPE (batch = 0, seq = 0, seq > max_seq_len, or
/// one activation of `batch * seq * max(d_model, d_ff, vocab_size)` floats above 2^47 bytes),
/// RT_ERROR_INVALID_ARGUMENT (a budget below the smallest achievable peak, named in bytes),
/// RT_ERROR_OUT_OF_MEMORY (the measurement), RT_ERROR_BUFFER_TOO_SMALL.
#[no_mangle]
pub unsafe extern "C" fn rt_model_activation_checkpointing_plan(
    model: *const rt_model,
    batch: usize,
    seq: usize,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
) -> rt_status {
    guard("rt_model_activation_checkpointing_plan", || {
        let model = in_ptr(model, "model")?;
        let text = {
            let state = model.lock();
            check_plan_shape(state.model.config(), batch, seq)?;
            state
                .model
                .activation_checkpointing_plan(batch, seq)?
                .to_string()
        };
        write_string(&text, "plan", buf, cap, needed)
    })
}
