//! Dropout probabilities, training mode and the dropout step of a model (since 2.3). They are
//! set through functions rather than new fields of `rt_transformer_config` / `rt_lora_config`,
//! whose sizes and layouts are fixed by ABI 2.x.

use crate::error::{err, guard, in_ptr, out_ptr, rt_status};
use crate::model::rt_model;
use riftco_transformer::config::{display_f32, validate_dropout};

/// Sets the dropout probabilities of later training forwards: `attention` on the attention
/// probabilities (`attention_dropout`), `residual` on the outputs of the attention and MLP output
/// projections before the residual adds (`residual_dropout`), `lora` on every LoRA adapter's
/// input (`lora_dropout`, PEFT's). Each is in [0, 1); 0 disables it. A model created from an
/// `rt_transformer_config` has no dropout; a loaded model has the probabilities of its files
/// (those of the `config.json` beside it, when edited there, over those saved in the state).
/// Dropout is active only while the model is training (rt_model_set_training) and a loss graph
/// is recorded; evaluation and decoding never drop.
///
/// Errors: RT_ERROR_NULL_POINTER, RT_ERROR_INVALID_ARGUMENT (a probability outside [0, 1),
/// NaN or infinite, named in the message), RT_ERROR_INVALID_STATE (`lora` above 0 on a model
/// without LoRA adapters: call rt_model_enable_lora first). On error nothing changes.
#[no_mangle]
pub unsafe extern "C" fn rt_model_set_dropout(
    model: *mut rt_model,
    attention: f32,
    residual: f32,
    lora: f32,
) -> rt_status {
    guard("rt_model_set_dropout", || {
        let model = in_ptr(model, "model")?;
        validate_dropout("attention_dropout", attention)?;
        validate_dropout("residual_dropout", residual)?;
        validate_dropout("lora_dropout", lora)?;
        let mut state = model.lock();
        let has_lora = state.model.has_lora();
        if lora != 0.0 && !has_lora {
            return Err(err(
                rt_status::RT_ERROR_INVALID_STATE,
                format!(
                    "lora_dropout = {}: the model has no LoRA adapters",
                    display_f32(lora)
                ),
            ));
        }
        state.model.set_dropout(attention, residual)?;
        if has_lora {
            state.model.set_lora_dropout(lora)?;
        }
        Ok(())
    })
}

/// Writes the dropout probabilities (see rt_model_set_dropout); `*lora` is 0 without active
/// LoRA adapters.
///
/// Errors: RT_ERROR_NULL_POINTER.
#[no_mangle]
pub unsafe extern "C" fn rt_model_dropout(
    model: *const rt_model,
    attention: *mut f32,
    residual: *mut f32,
    lora: *mut f32,
) -> rt_status {
    guard("rt_model_dropout", || {
        let model = in_ptr(model, "model")?;
        let attention = out_ptr(attention, "attention")?;
        let residual = out_ptr(residual, "residual")?;
        let lora = out_ptr(lora, "lora")?;
        [*attention, *residual, *lora] = model.lock().model.dropout_probabilities();
        Ok(())
    })
}

/// Sets training mode (a new model is training). A model that is not training never drops,
/// even while recording a graph.
///
/// Errors: RT_ERROR_NULL_POINTER.
#[no_mangle]
pub unsafe extern "C" fn rt_model_set_training(model: *mut rt_model, training: bool) -> rt_status {
    guard("rt_model_set_training", || {
        in_ptr(model, "model")?.lock().model.set_training(training);
        Ok(())
    })
}

/// Writes whether the model is in training mode.
///
/// Errors: RT_ERROR_NULL_POINTER.
#[no_mangle]
pub unsafe extern "C" fn rt_model_training(model: *const rt_model, out: *mut bool) -> rt_status {
    guard("rt_model_training", || {
        let out = out_ptr(out, "out")?;
        *out = in_ptr(model, "model")?.lock().model.is_training();
        Ok(())
    })
}

/// Writes the dropout step: how many training forwards with a dropout probability above 0 have
/// recorded a graph. Forward n draws its masks from a key derived from the config's seed and n;
/// the step is not saved with the model, so a resumed run restores it with
/// rt_model_set_dropout_step to continue the same masks.
///
/// Errors: RT_ERROR_NULL_POINTER.
#[no_mangle]
pub unsafe extern "C" fn rt_model_dropout_step(model: *const rt_model, out: *mut u64) -> rt_status {
    guard("rt_model_dropout_step", || {
        let out = out_ptr(out, "out")?;
        *out = in_ptr(model, "model")?.lock().model.dropout_step();
        Ok(())
    })
}

/// Sets the dropout step of the next training forward (see rt_model_dropout_step).
///
/// Errors: RT_ERROR_NULL_POINTER.
#[no_mangle]
pub unsafe extern "C" fn rt_model_set_dropout_step(model: *mut rt_model, step: u64) -> rt_status {
    guard("rt_model_set_dropout_step", || {
        in_ptr(model, "model")?.lock().model.set_dropout_step(step);
        Ok(())
    })
}
