//! `DecodeSession`: incremental decoding with a K/V cache.

use std::sync::{Mutex, MutexGuard};

use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;
use riftco_transformer::DecodeSession;

use crate::errors::{compute, Exc};

/// Incremental decoding with a per-layer K/V cache (no graph, GIL released per token).
///
/// Example:
///     >>> import riftco
///     >>> model = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(256, 32, 4, 2, 64, 16))
///     >>> session = model.decode_session()
///     >>> session.decode_token(65).shape
///     (256,)
#[pyclass(name = "DecodeSession", module = "riftco._native", frozen)]
pub struct PyDecodeSession {
    pub(crate) inner: Mutex<DecodeSession>,
}

impl PyDecodeSession {
    fn lock(&self) -> MutexGuard<'_, DecodeSession> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[pymethods]
impl PyDecodeSession {
    /// Feeds ``token`` at the next position and returns the next-token logits.
    ///
    /// Args:
    ///     token: id in ``[0, vocab_size)``.
    ///
    /// Returns:
    ///     numpy.ndarray: float32 ``[vocab_size]``.
    ///
    /// Raises:
    ///     TokenError: for an id outside the vocabulary.
    ///     DecodeError: when the cache already holds ``max_seq_len`` positions, or when the
    ///         model changed structurally (``enable_lora``, ``set_lora_active``,
    ///         ``merge_lora``, ``load_lora``) after this session was opened (``reset()`` does
    ///         not lift it: open a new session).
    fn decode_token<'py>(
        &self,
        py: Python<'py>,
        token: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<f32>>> {
        // Any Python int (however large) is a token id to check, not an OverflowError.
        let value: i128 = token.extract().map_err(|_| {
            Exc::Token.err(format!(
                "invalid tokens: a token id must be an int in [0, vocab_size); got {}",
                token.repr().map_or_else(|_| "?".into(), |r| r.to_string())
            ))
        })?;
        let vocab = self.lock().vocab_size();
        let token = u32::try_from(value)
            .ok()
            .filter(|&t| (t as usize) < vocab)
            .ok_or_else(|| {
                Exc::Token.err(format!(
                "invalid tokens: token id {value} is outside the vocabulary (vocab_size {vocab})"
            ))
            })?;
        let logits = compute(py, || self.lock().decode_token(token))?;
        Ok(logits.into_pyarray(py))
    }

    /// Feeds ``tokens`` at the next positions and returns the next-token logits after the last.
    ///
    /// Into an empty session (a prompt) the tokens run as one sequence, as the full forward
    /// runs them: a prompt of ``T`` tokens costs about one forward of ``T`` tokens instead of
    /// ``T`` one-token steps (the logits agree with feeding them one by one within f32
    /// rounding, not bitwise: the products sum in another order). Into a session holding
    /// positions already they are fed one at a time.
    ///
    /// Args:
    ///     tokens: a non-empty sequence of ids in ``[0, vocab_size)``.
    ///
    /// Returns:
    ///     numpy.ndarray: float32 ``[vocab_size]``.
    ///
    /// Raises:
    ///     TokenError: an id outside the vocabulary or not an int (naming its index), or no
    ///         tokens; nothing is fed then.
    ///     DecodeError: as :meth:`decode_token` (the cache would hold more than
    ///         ``max_seq_len`` positions; the model changed structurally).
    fn decode_tokens<'py>(
        &self,
        py: Python<'py>,
        tokens: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let vocab = self.lock().vocab_size();
        let mut ids = Vec::new();
        for (i, item) in tokens.try_iter()?.enumerate() {
            let item = item?;
            let value: i128 = item.extract().map_err(|_| {
                Exc::Token.err(format!(
                    "invalid tokens: token {i} must be an int in [0, vocab_size); got {}",
                    item.repr().map_or_else(|_| "?".into(), |r| r.to_string())
                ))
            })?;
            let id = u32::try_from(value)
                .ok()
                .filter(|&t| (t as usize) < vocab)
                .ok_or_else(|| {
                    Exc::Token.err(format!(
                        "invalid tokens: token id {value} is outside the vocabulary \
                         (vocab_size {vocab}), at index {i}"
                    ))
                })?;
            ids.push(id);
        }
        if ids.is_empty() {
            return Err(Exc::Token.err("invalid tokens: no tokens to decode"));
        }
        let logits = compute(py, || self.lock().decode_tokens(&ids))?;
        Ok(logits.into_pyarray(py))
    }

    /// Tokens decoded so far (the position of the next token).
    #[getter]
    fn position(&self) -> usize {
        self.lock().position()
    }

    /// Empties the cache (position 0).
    fn reset(&self) {
        self.lock().reset();
    }
}
