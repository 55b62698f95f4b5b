//! Incremental decoding with a per-layer K/V cache.
//!
//! A session computes one token at a time with plain kernels: it builds no graph and is never
//! checkpointed (it mutates its cache, so it is not replay-safe). It shares the
//! model's weights, so it stays valid when the model handle is dropped, and it reads their values
//! at each step, so training (and `load_weights`) between decode steps is visible to later tokens
//! while the cache of earlier positions is left untouched.
//!
//! A structural change of the model after the session was opened (`enable_lora`,
//! `set_lora_active`, `merge_lora`, loading adapters or replacing the weights) gives the model a
//! weight set the session does not hold: the session's next `decode_token` fails with
//! [`TransformerError::Decode`] instead of decoding with the old set; open a new session.

use crate::error::{Result, TransformerError};
use crate::linear::Linear;
use crate::model::{Revision, Weights};
use riftco_kernels::{elementwise, matmul, norm, rope, softmax, MatmulSpec};
use riftco_tensor::alloc::{try_vec_with_capacity, try_zeroed_vec};
use riftco_tensor::TensorError;
use std::sync::Arc;

/// Incremental decoder state for one sequence (batch 1).
#[derive(Debug)]
pub struct DecodeSession {
    weights: Arc<Weights>,
    // The model's structural revision and its value when the session was opened (none for a
    // session built from a weight set alone).
    revision: Option<(Arc<Revision>, u64)>,
    // Per layer: [n_heads, max_seq_len, d_head]
    k_cache: Vec<Vec<f32>>,
    v_cache: Vec<Vec<f32>>,
    len: usize,
}

fn lin(l: &Linear, x: &[f32]) -> Vec<f32> {
    let (out_f, in_f) = l.dims();
    let mut y = vec![0.0f32; out_f];
    matmul(
        MatmulSpec::new(1, in_f, out_f).trans_b(true),
        x,
        &l.weight.value().read(),
        &mut y,
    );
    if let (Some(a), true) = (&l.lora, l.lora_active) {
        let r = a.a.dims()[0];
        let mut down = vec![0.0f32; r];
        matmul(
            MatmulSpec::new(1, in_f, r).trans_b(true),
            x,
            &a.a.value().read(),
            &mut down,
        );
        let mut up = vec![0.0f32; out_f];
        matmul(
            MatmulSpec::new(1, r, out_f).trans_b(true),
            &down,
            &a.b.value().read(),
            &mut up,
        );
        elementwise::axpy(a.scale, &up, &mut y);
    }
    y
}

fn rms(x: &[f32], w: &riftco_autograd::Variable, eps: f32) -> Vec<f32> {
    let mut y = vec![0.0f32; x.len()];
    let mut r = [0.0f32];
    norm::rms_norm(x, &w.value().read(), eps, &mut y, &mut r);
    y
}

impl DecodeSession {
    /// A session with an empty cache (`2 · n_layers · max_seq_len · d_model` f32, allocated
    /// now) over a fixed weight set (structural changes of a model are not tracked: use
    /// [`crate::DecoderOnlyTransformer::decode_session`] for that).
    ///
    /// # Errors
    /// `TensorError::OutOfMemory` when the cache cannot be allocated (its size is bounded by
    /// the config's validation; this machine may still not hold it).
    pub fn new(weights: Arc<Weights>) -> Result<Self> {
        let c = &weights.config;
        let op = "decode K/V cache";
        let per_layer = c
            .n_heads
            .checked_mul(c.max_seq_len)
            .and_then(|n| n.checked_mul(c.d_head()))
            .ok_or(TensorError::OutOfMemory {
                op,
                bytes: usize::MAX,
            })?;
        let mut k_cache = try_vec_with_capacity(op, c.n_layers)?;
        let mut v_cache = try_vec_with_capacity(op, c.n_layers)?;
        for _ in 0..c.n_layers {
            k_cache.push(try_zeroed_vec(op, per_layer)?);
            v_cache.push(try_zeroed_vec(op, per_layer)?);
        }
        Ok(Self {
            k_cache,
            v_cache,
            len: 0,
            weights,
            revision: None,
        })
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
        let (d, h, dh, max) = (c.d_model, c.n_heads, c.d_head(), c.max_seq_len);
        let scale = 1.0 / (dh as f32).sqrt();
        let t = token as usize;
        let mut x = w.embed.value().read()[t * d..(t + 1) * d].to_vec();
        let mut scores = vec![0.0f32; pos + 1];
        let mut probs = vec![0.0f32; pos + 1];
        for (li, layer) in w.layers.iter().enumerate() {
            let n1 = rms(&x, &layer.attn_norm, c.rms_norm_eps);
            let (q0, k0, v) = (lin(&layer.q, &n1), lin(&layer.k, &n1), lin(&layer.v, &n1));
            let (mut q, mut k) = (vec![0.0f32; d], vec![0.0f32; d]);
            rope::rope(&w.rope, &q0, 1, h, pos, false, &mut q);
            rope::rope(&w.rope, &k0, 1, h, pos, false, &mut k);
            let (kc, vc) = (&mut self.k_cache[li], &mut self.v_cache[li]);
            for hd in 0..h {
                let at = (hd * max + pos) * dh;
                kc[at..at + dh].copy_from_slice(&k[hd * dh..(hd + 1) * dh]);
                vc[at..at + dh].copy_from_slice(&v[hd * dh..(hd + 1) * dh]);
            }
            let mut attn = vec![0.0f32; d];
            for hd in 0..h {
                let qh = &q[hd * dh..(hd + 1) * dh];
                for (j, s) in scores.iter_mut().enumerate() {
                    let at = (hd * max + j) * dh;
                    let dot: f32 = qh.iter().zip(&kc[at..at + dh]).map(|(a, b)| a * b).sum();
                    *s = dot * scale;
                }
                softmax::softmax_rows(&scores, pos + 1, &mut probs);
                let o = &mut attn[hd * dh..(hd + 1) * dh];
                for (j, &p) in probs.iter().enumerate() {
                    let at = (hd * max + j) * dh;
                    elementwise::axpy(p, &vc[at..at + dh], o);
                }
            }
            let proj = lin(&layer.o, &attn);
            elementwise::add_assign(&mut x, &proj);
            let n2 = rms(&x, &layer.mlp_norm, c.rms_norm_eps);
            let (g, u) = (lin(&layer.gate, &n2), lin(&layer.up, &n2));
            let mut act = vec![0.0f32; g.len()];
            elementwise::swiglu(&g, &u, &mut act);
            let down = lin(&layer.down, &act);
            elementwise::add_assign(&mut x, &down);
        }
        let xf = rms(&x, &w.final_norm, c.rms_norm_eps);
        let v = c.vocab_size;
        let mut logits = vec![0.0f32; v];
        matmul(
            MatmulSpec::new(1, d, v).trans_b(true),
            &xf,
            &w.lm_head.value().read(),
            &mut logits,
        );
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
        Ok(session)
    }
}
