//! Incremental decoding sessions.

use crate::error::{err, guard, guard_void, in_ptr, out_ptr, out_slice, rt_status};
use crate::model::rt_model;
use riftco_transformer::DecodeSession;
use std::sync::{Arc, Mutex, PoisonError};

struct SessionState {
    session: DecodeSession,
    vocab_size: usize,
}

/// An opaque, reference-counted decode session (batch 1, per-layer K/V cache of `max_seq_len`
/// positions). It shares the model's weights: it stays valid after rt_model_free, and training
/// between decode steps is visible to later tokens. After rt_model_enable_lora on its model it
/// refuses to decode (RT_ERROR_INVALID_STATE): create a new session. It builds no graph and
/// ignores the activation-checkpointing policy. Created by rt_decode_session_create, released with
/// rt_decode_session_free.
pub struct rt_decode_session {
    inner: Arc<Mutex<SessionState>>,
}

/// Creates a decode session with an empty cache. `*out` receives a new handle owned by the
/// caller (NULL on failure).
///
/// Errors: RT_ERROR_NULL_POINTER, RT_ERROR_OUT_OF_MEMORY (the K/V cache cannot be allocated).
#[no_mangle]
pub unsafe extern "C" fn rt_decode_session_create(
    model: *const rt_model,
    out: *mut *mut rt_decode_session,
) -> rt_status {
    guard("rt_decode_session_create", || {
        let out = out_ptr(out, "out")?;
        *out = std::ptr::null_mut();
        let model = in_ptr(model, "model")?;
        let state = model.lock();
        let session = SessionState {
            session: state.model.decode_session()?,
            vocab_size: state.model.config().vocab_size,
        };
        *out = Box::into_raw(Box::new(rt_decode_session {
            inner: Arc::new(Mutex::new(session)),
        }));
        Ok(())
    })
}

/// Feeds `token` at the next position and writes the next-token logits `[vocab_size]` into
/// `logits` (`logits_len` floats; at least vocab_size). On error the session is unchanged.
///
/// Errors: RT_ERROR_NULL_POINTER, RT_ERROR_BUFFER_TOO_SMALL (`logits_len < vocab_size`),
/// RT_ERROR_INVALID_ARGUMENT (token >= vocab_size), RT_ERROR_INVALID_STATE (the cache holds
/// max_seq_len positions: rt_decode_session_reset it; or the model's adapters were enabled after
/// the session was created: create a new session).
#[no_mangle]
pub unsafe extern "C" fn rt_decode_session_decode_token(
    session: *mut rt_decode_session,
    token: u32,
    logits: *mut f32,
    logits_len: usize,
) -> rt_status {
    guard("rt_decode_session_decode_token", || {
        let session = in_ptr(session, "session")?;
        let mut state = session.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if logits.is_null() {
            return Err(err(rt_status::RT_ERROR_NULL_POINTER, "logits is NULL"));
        }
        if logits_len < state.vocab_size {
            return Err(err(
                rt_status::RT_ERROR_BUFFER_TOO_SMALL,
                format!(
                    "logits_len {logits_len} is smaller than vocab_size {}",
                    state.vocab_size
                ),
            ));
        }
        let out = out_slice(logits, state.vocab_size, "logits")?;
        let row = state.session.decode_token(token)?;
        out.copy_from_slice(&row);
        Ok(())
    })
}

/// Writes the number of tokens decoded so far (the position of the next token).
///
/// Errors: RT_ERROR_NULL_POINTER.
#[no_mangle]
pub unsafe extern "C" fn rt_decode_session_position(
    session: *const rt_decode_session,
    out: *mut usize,
) -> rt_status {
    guard("rt_decode_session_position", || {
        let out = out_ptr(out, "out")?;
        let session = in_ptr(session, "session")?;
        *out = session
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .session
            .position();
        Ok(())
    })
}

/// Empties the session's cache (the next token is at position 0).
///
/// Errors: RT_ERROR_NULL_POINTER.
#[no_mangle]
pub unsafe extern "C" fn rt_decode_session_reset(session: *mut rt_decode_session) -> rt_status {
    guard("rt_decode_session_reset", || {
        let session = in_ptr(session, "session")?;
        session
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .session
            .reset();
        Ok(())
    })
}

/// Releases a decode session. NULL is accepted and ignored.
#[no_mangle]
pub unsafe extern "C" fn rt_decode_session_free(session: *mut rt_decode_session) {
    guard_void(|| {
        if !session.is_null() {
            // SAFETY: a handle from this library, freed once (caller contract).
            drop(unsafe { Box::from_raw(session) });
        }
    })
}
