//! Model configuration and its validation.

use crate::error::{Result, TransformerError};
use serde::{Deserialize, Serialize};

/// Sizes and numerics of a LLaMA-style decoder-only transformer.
///
/// Persisted as JSON beside the model state. The activation-checkpointing policy is deliberately
/// not part of it: it changes how a training graph retains activations, not
/// the architecture.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TransformerConfig {
    /// Vocabulary size (byte-level: 256).
    pub vocab_size: usize,
    /// Residual stream width.
    pub d_model: usize,
    /// Attention heads; `d_model` must be divisible by it and `d_head = d_model / n_heads` even.
    pub n_heads: usize,
    /// Transformer blocks.
    pub n_layers: usize,
    /// Hidden width of the SwiGLU MLP.
    pub d_ff: usize,
    /// Longest sequence (RoPE table size, K/V cache capacity).
    pub max_seq_len: usize,
    /// RMSNorm epsilon (default 1e-5).
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f32,
    /// RoPE base θ (default 10000).
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    /// Seed of the weight initialisation.
    #[serde(default)]
    pub seed: u64,
}

fn default_eps() -> f32 {
    1e-5
}

fn default_theta() -> f64 {
    10000.0
}

impl TransformerConfig {
    /// A config with the default `rms_norm_eps`, `rope_theta` and seed 0.
    pub fn new(
        vocab_size: usize,
        d_model: usize,
        n_heads: usize,
        n_layers: usize,
        d_ff: usize,
        max_seq_len: usize,
    ) -> Self {
        Self {
            vocab_size,
            d_model,
            n_heads,
            n_layers,
            d_ff,
            max_seq_len,
            rms_norm_eps: default_eps(),
            rope_theta: default_theta(),
            seed: 0,
        }
    }

    /// The reference configuration of the benchmarks (vocab 256, d_model 256, 8 heads, 8 layers,
    /// d_ff 688, max_seq_len 256).
    pub fn reference() -> Self {
        Self::new(256, 256, 8, 8, 688, 256)
    }

    /// Head width, `d_model / n_heads`.
    pub fn d_head(&self) -> usize {
        self.d_model / self.n_heads.max(1)
    }

    /// Checks every field.
    ///
    /// # Errors
    /// [`TransformerError::Config`] naming the first invalid field and its value: zero sizes,
    /// `d_model` not divisible by `n_heads`, odd `d_head` (RoPE pairs dimensions), non-positive
    /// or non-finite `rms_norm_eps` / `rope_theta`.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &'static str, value: String, reason: &str| {
            Err(TransformerError::Config {
                field,
                value,
                reason: reason.to_string(),
            })
        };
        for (field, v) in [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("n_heads", self.n_heads),
            ("n_layers", self.n_layers),
            ("d_ff", self.d_ff),
            ("max_seq_len", self.max_seq_len),
        ] {
            if v == 0 {
                return bad(field, v.to_string(), "must be positive");
            }
        }
        if self.vocab_size > u32::MAX as usize {
            return bad(
                "vocab_size",
                self.vocab_size.to_string(),
                "token ids are u32",
            );
        }
        if self.d_model % self.n_heads != 0 {
            return bad(
                "n_heads",
                self.n_heads.to_string(),
                &format!("d_model {} is not divisible by n_heads", self.d_model),
            );
        }
        if self.d_head() % 2 != 0 {
            return bad(
                "d_model",
                self.d_model.to_string(),
                &format!(
                    "d_head = d_model / n_heads = {} must be even for RoPE's rotate-half pairing",
                    self.d_head()
                ),
            );
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return bad(
                "rms_norm_eps",
                self.rms_norm_eps.to_string(),
                "must be a positive finite number",
            );
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return bad(
                "rope_theta",
                self.rope_theta.to_string(),
                "must be a positive finite number",
            );
        }
        Ok(())
    }

    /// Checks a `[batch, seq]` token buffer against this config.
    ///
    /// # Errors
    /// [`TransformerError::Tokens`] for an empty batch or sequence, a length that is not
    /// `batch·seq`, a sequence longer than `max_seq_len`, or an id `>= vocab_size` (named with its
    /// position).
    pub fn validate_tokens(&self, tokens: &[u32], batch: usize, seq: usize) -> Result<()> {
        if batch == 0 || seq == 0 {
            return Err(TransformerError::Tokens(format!(
                "batch {batch} and seq {seq} must both be positive"
            )));
        }
        if tokens.len() != batch * seq {
            return Err(TransformerError::Tokens(format!(
                "{} tokens do not form [batch {batch}, seq {seq}] ({} expected)",
                tokens.len(),
                batch * seq
            )));
        }
        if seq > self.max_seq_len {
            return Err(TransformerError::Tokens(format!(
                "sequence length {seq} exceeds max_seq_len {}",
                self.max_seq_len
            )));
        }
        if let Some((i, &t)) = tokens
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize >= self.vocab_size)
        {
            return Err(TransformerError::Tokens(format!(
                "token id {t} at index {i} is outside the vocabulary (vocab_size {})",
                self.vocab_size
            )));
        }
        Ok(())
    }
}
