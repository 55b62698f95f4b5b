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
        self.decode_tokens(&[token])
    }

    /// Feeds `tokens` at the next positions and returns the next-token logits `[vocab]` after
    /// the last of them. Into an empty cache (a prompt) the tokens run as one sequence: every
    /// product is a matrix product over all of them and causal attention runs over the block,
    /// as the full forward does (a prompt of `T` tokens costs about one forward of `T` tokens,
    /// not `T` one-token steps); only the last row goes through the final norm and the LM head.
    /// Into a cache that holds positions already they are fed one at a time.
    ///
    /// # Errors
    /// As [`Self::decode_token`], checked for every token before any is fed (an error leaves
    /// the session unchanged); [`TransformerError::Decode`] for an empty `tokens`.
    pub fn decode_tokens(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
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
        if tokens.is_empty() {
            return Err(TransformerError::Decode {
                message: "no tokens to decode: pass at least one token id".into(),
            });
        }
        released_parameter_error(&w)?;
        for (i, &token) in tokens.iter().enumerate() {
            if token as usize >= c.vocab_size {
                return Err(TransformerError::TokenOutOfVocabulary {
                    token,
                    index: (tokens.len() > 1).then_some(i),
                    vocab_size: c.vocab_size,
                });
            }
        }
        if self.len + tokens.len() > c.max_seq_len {
            return Err(TransformerError::DecodeCacheFull {
                max_seq_len: c.max_seq_len,
            });
        }
        if self.len > 0 && tokens.len() > 1 {
            let mut logits = Vec::new();
            for &token in tokens {
                logits = self.feed(&w, &[token])?;
            }
            return Ok(logits);
        }
        self.feed(&w, tokens)
    }

    /// Runs `tokens` (checked) at positions `self.len..` as one sequence; the last row's logits.
    fn feed(&mut self, w: &Arc<Weights>, tokens: &[u32]) -> Result<Vec<f32>> {
        let c = &w.config;
        let (pos, t) = (self.len, tokens.len());
        let ctx = BlockContext::new(c, &w.rope, 1, t, self.attention);
        let logits = no_grad(|| -> Result<Vec<f32>> {
            let x = ops::embedding(&w.embed, tokens)?;
            let mut x = ops::reshape(&x, [1, t, c.d_model])?;
            for (layer, cache) in w.layers.iter().zip(&self.cache) {
                x = block_forward_cached(&x, layer, &ctx, cache, pos)?;
            }
            let last = if t == 1 {
                ops::reshape(&x, [1, c.d_model])?
            } else {
                let x = ops::reshape(&x, [t, c.d_model])?;
                let row = ops::index(
                    &x,
                    &[ops::IndexItem::Slice {
                        start: Some(t as isize - 1),
                        stop: None,
                        step: None,
                    }],
                )?;
                ops::reshape(&row, [1, c.d_model])?
            };
            let x = ops::rms_norm(&last, &w.final_norm, c.rms_norm_eps)?;
            Ok(ops::linear(&x, &w.lm_head)?.value().to_host()?)
        })?;
        self.len += t;
        Ok(logits)
    }
}

/// [`TransformerError::Decode`] naming the first parameter whose elements are released (a
/// model sharded by ZeRO-3 between uses): decoding reads every weight outside the owner's
/// acquire and release.
fn released_parameter_error(w: &Weights) -> Result<()> {
    let released = w
        .base_parameters()
        .find(|(_, p)| p.value().is_placeholder())
        .map(|(e, _)| e.hf_name());
    match released {
        None => Ok(()),
        Some(name) => Err(TransformerError::Decode {
            message: format!(
                "{name} holds no elements: the model's parameters are sharded between uses \
                 (ZeRO-3); decode inside `with optimizer.sharded.whole_model():` or after \
                 optimizer.sharded.detach()"
            ),
        }),
    }
}

impl crate::model::DecoderOnlyTransformer {
    /// A decode session sharing this model's weights. It follows their values (training between
    /// tokens is visible) but not structural changes: after [`Self::enable_lora`],
    /// [`Self::set_lora_active`], [`Self::merge_lora`] or [`Self::replace_weights`] its
    /// `decode_token` fails with [`TransformerError::Decode`].
    ///
    /// # Errors
    /// As [`DecodeSession::new`]; [`TransformerError::Decode`] while parameters are released
    /// between uses (a sharded model, [`crate::residency`]).
    pub fn decode_session(&self) -> Result<DecodeSession> {
        released_parameter_error(self.weights())?;
        let mut session = DecodeSession::new(self.weights().clone())?;
        let revision = self.revision().clone();
        let opened = revision.get().0;
        session.revision = Some((revision, opened));
        session.attention = self.attention_kind();
        Ok(session)
    }
}
