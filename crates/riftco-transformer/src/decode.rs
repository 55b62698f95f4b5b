//! Incremental decoding with a per-layer K/V cache.
//!
//! A session computes one token at a time with the block's own forward definition
//! ([`crate::block::block_forward_cached`]) against a per-layer K/V-cache tensor: it builds no
//! graph and is never checkpointed (it mutates its cache, so it is not replay-safe). It shares the
//! model's weights, so it stays valid when the model handle is dropped, and it reads their values
//! at each step, so training (and `load_weights`) between decode steps is visible to later tokens
//! while the cache of earlier positions is left untouched.
//!
//! A structural change of the model after the session was opened (`enable_lora`,
//! `set_lora_active`, `merge_lora`, loading adapters or replacing the weights) gives the model a
//! weight set the session does not hold: the session's next `decode_token` fails with
//! [`TransformerError::Decode`] instead of decoding with the old set; open a new session.

use crate::block::{block_forward_cached, BlockContext, LayerKvCache};
use crate::error::{Result, TransformerError};
use crate::model::{Revision, Weights};
use crate::policy::FullSequenceAttentionKind;
use riftco_autograd::{no_grad, ops};
use riftco_tensor::alloc::try_vec_with_capacity;
use std::sync::Arc;

/// Incremental decoder state for one sequence (batch 1).
#[derive(Debug)]
pub struct DecodeSession {
    weights: Arc<Weights>,
    // The model's structural revision and its value when the session was opened (none for a
    // session built from a weight set alone).
    revision: Option<(Arc<Revision>, u64)>,
    // One per layer, on the weights' device.
    cache: Vec<LayerKvCache>,
    attention: FullSequenceAttentionKind,
    len: usize,
}

impl DecodeSession {
    /// A session with an empty cache (`2 · n_layers · max_seq_len · d_model` f32 on the
    /// weights' device, allocated now and accounted as activations) over a fixed weight set
    /// (structural changes of a model are not tracked: use
    /// [`crate::DecoderOnlyTransformer::decode_session`] for that).
    ///
    /// # Errors
    /// `TensorError::OutOfMemory` when the cache cannot be allocated (its size is bounded by
    /// the config's validation; this machine may still not hold it).
    pub fn new(weights: Arc<Weights>) -> Result<Self> {
        let c = &weights.config;
        let device = weights.embed.value().device();
        let mut cache = try_vec_with_capacity("decode K/V cache", c.n_layers)?;
        for _ in 0..c.n_layers {
            cache.push(LayerKvCache::new(
                c.max_seq_len,
                c.n_kv_heads,
                c.d_head(),
                device,
            )?);
        }
        Ok(Self {
            cache,
            len: 0,
            weights,
            revision: None,
            attention: FullSequenceAttentionKind::default(),
        })
    }

    /// The vocabulary size of the session's weights (valid token ids are `0..vocab_size`).
    pub fn vocab_size(&self) -> usize {
        self.weights.config.vocab_size
    }

    /// Tokens decoded so far (the position of the next token).
    pub fn position(&self) -> usize {
        self.len
    }

    /// Empties the cache.
    pub fn reset(&mut self) {
        self.len = 0;
    }

    /// Feeds `token` at the next position and returns the next-token logits `[vocab]`.
    ///
    /// # Errors
    /// [`TransformerError::TokenOutOfVocabulary`] for an id outside the vocabulary,
    /// [`TransformerError::DecodeCacheFull`] when the cache holds `max_seq_len` positions
    /// already, [`TransformerError::Decode`] when the model changed structurally since the
    /// session was opened (see the module
    /// documentation; [`DecodeSession::reset`] does not lift it).
    pub fn decode_token(&mut self, token: u32) -> Result<Vec<f32>> {
        if let Some((revision, opened)) = &self.revision {
            let (now, change) = revision.get();
            if now != *opened {
                return Err(TransformerError::Decode {
                    message: format!(
                        "the model changed ({change}) after this session was opened, so the \
                         session's weights and K/V cache no longer match it; open a new \
                         session with decode_session()"
                    ),
                });
            }
        }
        let w = self.weights.clone();
        let c = &w.config;
        if token as usize >= c.vocab_size {
            return Err(TransformerError::TokenOutOfVocabulary {
                token,
                index: None,
                vocab_size: c.vocab_size,
            });
        }
        let pos = self.len;
        if pos >= c.max_seq_len {
            return Err(TransformerError::DecodeCacheFull {
                max_seq_len: c.max_seq_len,
            });
        }
        let ctx = BlockContext::new(c, &w.rope, 1, 1, self.attention);
        let logits = no_grad(|| -> Result<Vec<f32>> {
            let x = ops::embedding(&w.embed, &[token])?;
            let mut x = ops::reshape(&x, [1, 1, c.d_model])?;
            for (layer, cache) in w.layers.iter().zip(&self.cache) {
                x = block_forward_cached(&x, layer, &ctx, cache, pos)?;
            }
            let x = ops::rms_norm(&x, &w.final_norm, c.rms_norm_eps)?;
            let x = ops::reshape(&x, [1, c.d_model])?;
            Ok(ops::linear(&x, &w.lm_head)?.value().to_host()?)
        })?;
        self.len += 1;
        Ok(logits)
    }
}

impl crate::model::DecoderOnlyTransformer {
    /// A decode session sharing this model's weights. It follows their values (training between
    /// tokens is visible) but not structural changes: after [`Self::enable_lora`],
    /// [`Self::set_lora_active`], [`Self::merge_lora`] or [`Self::replace_weights`] its
    /// `decode_token` fails with [`TransformerError::Decode`].
    ///
    /// # Errors
    /// As [`DecodeSession::new`].
    pub fn decode_session(&self) -> Result<DecodeSession> {
        let mut session = DecodeSession::new(self.weights().clone())?;
        let revision = self.revision().clone();
        let opened = revision.get().0;
        session.revision = Some((revision, opened));
        session.attention = self.attention_kind();
        Ok(session)
    }
}
