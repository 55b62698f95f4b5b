//! The training loss's head: final hidden states → LM head → mean cross-entropy, by default
//! fused and computed in chunks of tokens ([`riftco_autograd::ops::linear_cross_entropy`]) so
//! that the `[tokens, vocab]` logits and their gradient never exist whole.

use crate::error::{Result, TransformerError};
use crate::model::DecoderOnlyTransformer;
use riftco_autograd::{ops, Variable};

/// The default byte budget of the chunked loss's logits workspace (64 MiB: at most 341 tokens
/// per chunk at a vocabulary of 49152, 130 at 128256, 65281 at 256; 1024 tokens at 49152 run
/// as 4 chunks of 256, see [`LossChunking::chunk_tokens_for`]).
pub const DEFAULT_LOSS_CHUNK_BYTES: u64 = 64 << 20;

/// How the training loss computes the LM head and cross-entropy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossChunking {
    /// Fused and chunked: on the CPU each chunk's logits (and then, in place, their gradient)
    /// plus one logsumexp per token take at most this many bytes of workspace (at least one
    /// token per chunk, whatever the budget). A GPU composes the chunk from its existing
    /// kernels: there a chunk's logits and their gradient exist at once (twice the budget),
    /// plus a `[vocab, d_model]` partial head gradient per chunk when the head is trainable.
    Chunked {
        /// The workspace budget in bytes (`>= 1`).
        bytes: u64,
    },
    /// The whole `[tokens, vocab]` logits, then the cross-entropy (the graph keeps the logits
    /// until the backward pass, and the backward pass makes their gradient whole).
    Unfused,
}

impl Default for LossChunking {
    fn default() -> Self {
        Self::Chunked {
            bytes: DEFAULT_LOSS_CHUNK_BYTES,
        }
    }
}

impl LossChunking {
    /// A chunked loss with a workspace budget of `bytes`.
    ///
    /// # Errors
    /// [`TransformerError::Config`] (field `loss_chunk_bytes`) for 0 bytes.
    pub fn chunked(bytes: u64) -> Result<Self> {
        if bytes == 0 {
            return Err(TransformerError::Config {
                field: "loss_chunk_bytes",
                value: "0".into(),
                reason: "the chunked loss needs a workspace of at least 1 byte (it computes at \
                         least one token per chunk); use None/unfused for whole logits"
                    .into(),
            });
        }
        Ok(Self::Chunked { bytes })
    }

    /// The budget in bytes; `None` when unfused.
    pub fn bytes(self) -> Option<u64> {
        match self {
            Self::Chunked { bytes } => Some(bytes),
            Self::Unfused => None,
        }
    }

    /// Tokens per chunk for a vocabulary of `vocab`: as many as the budget holds at
    /// `4 · (vocab + 1)` bytes each (the token's logits and its logsumexp), at least 1.
    pub fn chunk_tokens(bytes: u64, vocab: usize) -> usize {
        let per_token = (vocab as u64).saturating_add(1).saturating_mul(4);
        usize::try_from(bytes / per_token.max(1))
            .unwrap_or(usize::MAX)
            .max(1)
    }

    /// Tokens per chunk for `tokens` targets: the fewest chunks the budget allows
    /// (`⌈tokens / chunk_tokens(bytes, vocab)⌉`), with the tokens spread evenly over them
    /// (`⌈tokens / chunks⌉` each, the last one fewer). The same number of chunks, hence of passes
    /// over the head's weight, as chunks of the budget's maximum, but the workspace holds only
    /// as many tokens' logits as a chunk needs: 1024 tokens at a vocabulary of 49152 under
    /// 64 MiB run as 4 chunks of 256 (48 MiB of logits), not 341 + 341 + 341 + 1 (64 MiB).
    /// The loss and the hidden states' gradient depend on the chunk size only through the
    /// rounding of the head's products (a product of fewer rows may sum a row in another
    /// order); a trainable head's gradient also sums the chunks in order.
    pub fn chunk_tokens_for(bytes: u64, vocab: usize, tokens: usize) -> usize {
        let most = Self::chunk_tokens(bytes, vocab);
        if tokens == 0 {
            return most;
        }
        let chunks = tokens.div_ceil(most);
        tokens.div_ceil(chunks)
    }
}

/// The mean next-token cross-entropy of hidden states `h [tokens, d_model]` (the final
/// RMSNorm's output) under the LM head `lm_head [vocab, d_model]` against `targets [tokens]`: a
/// scalar Variable, computed as `chunking` says.
///
/// # Errors
/// Shape errors and out-of-vocabulary targets of the ops.
pub fn head_loss(
    h: &Variable,
    lm_head: &Variable,
    targets: &[u32],
    chunking: LossChunking,
) -> Result<Variable> {
    Ok(match chunking {
        LossChunking::Chunked { bytes } => {
            let vocab = lm_head.dims().first().copied().unwrap_or(0);
            let rows = LossChunking::chunk_tokens_for(bytes, vocab, targets.len());
            ops::linear_cross_entropy(h, lm_head, targets, rows)?
        }
        LossChunking::Unfused => ops::cross_entropy(&ops::linear(h, lm_head)?, targets)?,
    })
}

impl DecoderOnlyTransformer {
    /// How the training loss computes the LM head and cross-entropy (default: chunked with a
    /// [`DEFAULT_LOSS_CHUNK_BYTES`] workspace). Not part
    /// of model state.
    pub fn loss_chunking(&self) -> LossChunking {
        self.loss_chunking
    }

    /// Sets how later [`DecoderOnlyTransformer::loss`] calls compute the LM head and
    /// cross-entropy: [`LossChunking::Chunked`] never materialises the `[tokens, vocab]` logits
    /// nor their gradient; [`LossChunking::Unfused`] does (the loss and gradients agree within
    /// f32 rounding). [`DecoderOnlyTransformer::logits`] always returns full logits.
    ///
    /// # Errors
    /// [`TransformerError::Config`] for a chunked budget of 0 bytes; the setting is unchanged
    /// then.
    pub fn set_loss_chunking(&mut self, chunking: LossChunking) -> Result<()> {
        if let LossChunking::Chunked { bytes } = chunking {
            LossChunking::chunked(bytes)?;
        }
        self.loss_chunking = chunking;
        Ok(())
    }
}
