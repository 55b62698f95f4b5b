//! How the training loss computes the LM head and cross-entropy (2.6):
//! `rt_model_set_loss_chunk_bytes`, `rt_model_set_loss_unfused` and `rt_model_loss_chunk_bytes`.

use crate::error::{guard, in_ptr, out_ptr, rt_status};
use crate::model::rt_model;
use riftco_transformer::LossChunking;

/// Makes rt_model_loss and rt_model_train_step compute the LM head and cross-entropy a chunk of
/// tokens at a time, with at most `bytes` of logits workspace (`bytes / (4 · (vocab_size + 1))`
/// tokens a chunk, at least one; the default, with 64 MiB), never the whole
/// `[tokens, vocab_size]` logits nor their gradient. The loss and the gradients equal the unfused
/// ones within f32 rounding (a chunk's products may sum a row in another order). Since 2.6.
///
/// Errors: RT_ERROR_NULL_POINTER, RT_ERROR_INVALID_ARGUMENT for `bytes` = 0 (the setting is
/// unchanged then).
#[no_mangle]
pub unsafe extern "C" fn rt_model_set_loss_chunk_bytes(
    model: *mut rt_model,
    bytes: u64,
) -> rt_status {
    guard("rt_model_set_loss_chunk_bytes", || {
        let model = in_ptr(model, "model")?;
        let chunking = LossChunking::chunked(bytes)?;
        model.lock().model.set_loss_chunking(chunking)?;
        Ok(())
    })
}

/// Makes rt_model_loss and rt_model_train_step compute the whole logits, then the
/// cross-entropy (the graph keeps the logits until the backward pass). Since 2.6.
///
/// Errors: RT_ERROR_NULL_POINTER.
#[no_mangle]
pub unsafe extern "C" fn rt_model_set_loss_unfused(model: *mut rt_model) -> rt_status {
    guard("rt_model_set_loss_unfused", || {
        let model = in_ptr(model, "model")?;
        model
            .lock()
            .model
            .set_loss_chunking(LossChunking::Unfused)?;
        Ok(())
    })
}

/// Writes the chunked loss's workspace budget in bytes to `*out`, or 0 when the loss is unfused
/// (rt_model_set_loss_unfused). Since 2.6.
///
/// Errors: RT_ERROR_NULL_POINTER.
#[no_mangle]
pub unsafe extern "C" fn rt_model_loss_chunk_bytes(
    model: *const rt_model,
    out: *mut u64,
) -> rt_status {
    guard("rt_model_loss_chunk_bytes", || {
        let out = out_ptr(out, "out")?;
        let model = in_ptr(model, "model")?;
        *out = model.lock().model.loss_chunking().bytes().unwrap_or(0);
        Ok(())
    })
}
