//! The training losses of [`DecoderOnlyTransformer`]: next-token cross-entropy of a token
//! block, with targets from the block itself or from `labels` (ignore index -100).

use crate::error::{Result, TransformerError};
use crate::head::head_loss;
use crate::model::{DecoderOnlyTransformer, IGNORE_INDEX};
use crate::packing::SequenceLayout;
use crate::residency;
use riftco_autograd::{ops, Variable};
use std::sync::Arc;

impl DecoderOnlyTransformer {
    /// Mean next-token cross-entropy of a token block `[batch, seq + 1]`: inputs are
    /// `block[:, :-1]`, targets `block[:, 1:]`. A scalar Variable.
    ///
    /// This is the training forward: while the model is training
    /// ([`DecoderOnlyTransformer::set_training`]) and a graph is being recorded, it applies the
    /// config's `attention_dropout` and `residual_dropout` and the adapters' `lora_dropout`, with
    /// masks of the next dropout step ([`DecoderOnlyTransformer::dropout_step`]). Under
    /// `no_grad` or in evaluation mode it is the deterministic model's loss.
    ///
    /// # Errors
    /// [`TransformerError::Tokens`] for a bad block (`seq_plus_one < 2`, length),
    /// [`TransformerError::TokenOutOfVocabulary`] for an id `>= vocab_size` (named with its index
    /// in the block).
    pub fn loss(&self, block: &[u32], batch: usize, seq_plus_one: usize) -> Result<Variable> {
        let (inputs, targets, seq) = self.split_block(block, batch, seq_plus_one)?;
        let h = self.forward_hidden(&inputs, batch, seq, true, None)?;
        self.resident_head_loss(&h, &targets)
    }

    /// [`DecoderOnlyTransformer::loss`] with targets taken from `labels` (Hugging Face's
    /// convention: `labels [batch, seq + 1]` aligned with `block`, shifted inside the loss, so
    /// the prediction after `block[b, t]` is scored against `labels[b, t + 1]`), where
    /// [`IGNORE_INDEX`] (-100, PyTorch's `ignore_index`) marks a position that is not a target
    /// (a prompt token in instruction tuning, padding). The mean is over the targeted positions
    /// only; ignored positions contribute nothing to the loss or the gradients: only the final
    /// hidden states of the targeted positions go through the LM head (gathered by row, the
    /// gather's VJP scattering their gradients back). With no position ignored it is
    /// [`DecoderOnlyTransformer::loss`] of `labels` as targets (bitwise when `labels` equals
    /// `block`). Column 0 of `labels` is never a target.
    ///
    /// # Errors
    /// As [`DecoderOnlyTransformer::loss`]; [`TransformerError::Tokens`] when `labels` has
    /// another length than `block`, holds a value that is neither -100 nor an id in
    /// `[0, vocab_size)` (named with its index), or ignores every target position (a loss over
    /// no token is undefined: PyTorch returns NaN, riftco refuses).
    pub fn loss_with_labels(
        &self,
        block: &[u32],
        labels: &[i64],
        batch: usize,
        seq_plus_one: usize,
    ) -> Result<Variable> {
        self.labels_loss(block, labels, None, batch, seq_plus_one)
    }

    /// The loss of a packed batch: several examples per row of `block [batch, seq + 1]`, with
    /// `position_ids [batch, seq + 1]` (Hugging Face's padding-free convention, as
    /// `DataCollatorWithFlattening` and TRL's `padding_free` produce them) counting `0, 1, 2, ..`
    /// within each example and restarting at 0 where the next one starts. Each example is
    /// computed as if it were alone ([`crate::packing`]: RoPE restarts at 0, attention stays
    /// within the example), and a target at an example's first token is never scored (nothing
    /// of its example precedes it; as column 0). Targets come from `labels` as in
    /// [`DecoderOnlyTransformer::loss_with_labels`], or from `block` when `None`. The mean is
    /// over every scored target of the batch: with one example per row and no position 0
    /// inside a row, it is [`DecoderOnlyTransformer::loss_with_labels`].
    ///
    /// # Errors
    /// As [`DecoderOnlyTransformer::loss_with_labels`]; [`TransformerError::Tokens`] naming the
    /// value and its `[row, column]` when `position_ids` has another length than `block` or a
    /// row does not count `0, 1, 2, ..` restarting at 0 only
    /// ([`SequenceLayout::from_position_ids`]).
    pub fn loss_packed(
        &self,
        block: &[u32],
        labels: Option<&[i64]>,
        position_ids: &[i64],
        batch: usize,
        seq_plus_one: usize,
    ) -> Result<Variable> {
        let full = SequenceLayout::from_position_ids(position_ids, batch, seq_plus_one)?;
        let owned: Vec<i64>;
        let labels = match labels {
            Some(l) => l,
            None => {
                owned = block.iter().map(|&t| i64::from(t)).collect();
                &owned
            }
        };
        self.labels_loss(block, labels, Some(&full), batch, seq_plus_one)
    }

    /// [`DecoderOnlyTransformer::loss_with_labels`] over the examples of `full` (a layout of
    /// the whole `[batch, seq + 1]` block) when given.
    fn labels_loss(
        &self,
        block: &[u32],
        labels: &[i64],
        full: Option<&SequenceLayout>,
        batch: usize,
        seq_plus_one: usize,
    ) -> Result<Variable> {
        let (inputs, _, seq) = self.split_block(block, batch, seq_plus_one)?;
        if labels.len() != block.len() {
            return Err(TransformerError::Tokens {
                message: format!(
                    "labels hold {} values; the block [batch {batch}, seq + 1 = {seq_plus_one}] \
                     needs {}",
                    labels.len(),
                    block.len()
                ),
            });
        }
        let vocab = self.weights.config.vocab_size;
        if let Some((i, &l)) = labels
            .iter()
            .enumerate()
            .find(|(_, &l)| l != IGNORE_INDEX && !(0..vocab as i64).contains(&l))
        {
            return Err(TransformerError::Tokens {
                message: format!(
                    "label {l} at index [{}, {}] is neither {IGNORE_INDEX} (ignored) nor a token \
                     id in [0, {vocab})",
                    i / seq_plus_one,
                    i % seq_plus_one
                ),
            });
        }
        let mut rows = Vec::new();
        let mut targets = Vec::new();
        for (b, row) in labels.chunks_exact(seq_plus_one).enumerate() {
            for (t, &l) in row[1..].iter().enumerate() {
                let starts = full.is_some_and(|f| f.is_example_start(b, t + 1));
                if l != IGNORE_INDEX && !starts {
                    rows.push((b * seq + t) as u32);
                    targets.push(l as u32);
                }
            }
        }
        if targets.is_empty() {
            return Err(TransformerError::Tokens {
                message: format!(
                    "every target position of the labels [batch {batch}, seq + 1 = \
                     {seq_plus_one}] is {IGNORE_INDEX} (ignored; column 0 and the first token \
                     of a packed example are never targets): there is no token to take the loss \
                     over"
                ),
            });
        }
        let layout = full.map(|f| Arc::new(f.without_last_column()));
        let h = self.forward_hidden(&inputs, batch, seq, true, layout.as_ref())?;
        let h = if targets.len() == batch * seq {
            h
        } else {
            ops::embedding(&h, &rows)?
        };
        self.resident_head_loss(&h, &targets)
    }

    /// [`head_loss`] of the final hidden states `h`, with the head's unit acquired.
    fn resident_head_loss(&self, h: &Variable, targets: &[u32]) -> Result<Variable> {
        let owner = self.residency.as_ref();
        let unit = self.head_unit();
        let sliced = residency::row_slices(owner, unit, &self.weights.lm_head);
        if let (Some(o), Some(rows), Some(bytes)) = (owner, sliced, self.loss_chunking.bytes()) {
            // The head by slices: one pass, nothing held for the backward pass.
            let vocab = self.weights.config.vocab_size;
            let mut fetch = residency::fetcher(o, unit, vocab, None);
            return Ok(ops::sliced_linear_cross_entropy(
                h, vocab, targets, rows, bytes, &mut fetch,
            )?);
        }
        let held = self.acquire_head(h)?;
        let loss = head_loss(
            held.as_ref().unwrap_or(h),
            &self.weights.lm_head,
            targets,
            self.loss_chunking,
        );
        self.release_head_without_graph(&held);
        loss
    }

    /// The inputs `block[:, :-1]`, targets `block[:, 1:]` and `seq` of a checked token block.
    fn split_block(
        &self,
        block: &[u32],
        batch: usize,
        seq_plus_one: usize,
    ) -> Result<(Vec<u32>, Vec<u32>, usize)> {
        if seq_plus_one < 2 {
            return Err(TransformerError::Tokens {
                message: format!("a token block needs seq + 1 >= 2 columns, got {seq_plus_one}"),
            });
        }
        if batch.checked_mul(seq_plus_one) != Some(block.len()) || batch == 0 {
            return Err(TransformerError::Tokens {
                message: format!(
                    "{} tokens do not form a block [batch {batch}, seq + 1 = {seq_plus_one}]",
                    block.len()
                ),
            });
        }
        let vocab = self.weights.config.vocab_size;
        if let Some((i, &t)) = block.iter().enumerate().find(|(_, &t)| t as usize >= vocab) {
            return Err(TransformerError::TokenOutOfVocabulary {
                token: t,
                index: Some(i),
                vocab_size: vocab,
            });
        }
        let seq = seq_plus_one - 1;
        let mut inputs = Vec::with_capacity(batch * seq);
        let mut targets = Vec::with_capacity(batch * seq);
        for row in block.chunks_exact(seq_plus_one) {
            inputs.extend_from_slice(&row[..seq]);
            targets.extend_from_slice(&row[1..]);
        }
        self.weights.config.validate_tokens(&targets, batch, seq)?;
        Ok((inputs, targets, seq))
    }
}
