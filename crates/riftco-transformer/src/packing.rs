//! Packed sequences: several examples in one row of a batch, their boundaries respected.
//!
//! The layout comes from `position_ids [batch, seq]` as in Hugging Face's padding-free
//! convention (`DataCollatorWithFlattening`, TRL's `padding_free`): each row's positions count
//! `0, 1, 2, ..` and restart at 0 where the next example starts. A packed forward gives every
//! example exactly what it would get alone: RoPE positions restart at 0 per example and
//! attention is causal within the example only (a block-diagonal causal mask).
//!
//! Attention runs per example: q, k and v are sliced to the example's tokens, rotated from
//! position 0 and attended with the model's attention kind (flash or materialized, on the
//! model's device), and the outputs are joined back into the row. Nothing is computed across
//! a boundary (the masked blocks are never visited), and the per-example computation is the
//! one of the example alone. Attention dropout in a packed forward draws each example's mask
//! over its own `[1, heads, len, len]` probabilities at a Philox offset unique to its row and
//! start; residual and LoRA dropout masks stay per row position, as unpacked.

use crate::block::BlockContext;
use crate::error::{Result, TransformerError};
use riftco_autograd::ops::{self, AttentionLayout, DropoutMask, IndexItem};
use riftco_autograd::Variable;
use std::sync::Arc;

impl crate::model::DecoderOnlyTransformer {
    /// Logits `[batch·seq, vocab]` of a packed batch `tokens [batch, seq]`: the examples of
    /// each row, delimited by `position_ids [batch, seq]` (0 where an example starts; see the
    /// [module documentation](self)), each computed as if alone. Never dropped, as
    /// [`crate::DecoderOnlyTransformer::logits`].
    ///
    /// # Errors
    /// As [`crate::DecoderOnlyTransformer::logits`] and [`SequenceLayout::from_position_ids`].
    pub fn logits_packed(
        &self,
        tokens: &[u32],
        position_ids: &[i64],
        batch: usize,
        seq: usize,
    ) -> Result<Variable> {
        let layout = Arc::new(SequenceLayout::from_position_ids(position_ids, batch, seq)?);
        let h = self.forward_hidden(tokens, batch, seq, false, Some(&layout))?;
        Ok(ops::linear(&h, &self.weights.lm_head)?)
    }
}

/// Where the examples of each row of a packed batch start and end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SequenceLayout {
    seq: usize,
    /// Per row, the `(start, len)` of each example, in order, covering the row.
    rows: Vec<Vec<(usize, usize)>>,
}

impl SequenceLayout {
    /// The layout of `position_ids [batch, seq]` (row-major): an example starts at every 0.
    ///
    /// # Errors
    /// [`TransformerError::Tokens`] naming the value and its `[row, column]` when the buffer
    /// does not hold `batch · seq` values, a row does not start at 0, or a value is neither 0
    /// (a new example) nor the previous value plus 1.
    pub fn from_position_ids(position_ids: &[i64], batch: usize, seq: usize) -> Result<Self> {
        if batch.checked_mul(seq) != Some(position_ids.len()) {
            return Err(TransformerError::Tokens {
                message: format!(
                    "position_ids hold {} values; [batch {batch}, seq {seq}] needs {}",
                    position_ids.len(),
                    batch.saturating_mul(seq)
                ),
            });
        }
        let mut rows = Vec::with_capacity(batch);
        for (b, row) in position_ids
            .chunks_exact(seq.max(1))
            .enumerate()
            .take(batch)
        {
            let mut segments: Vec<(usize, usize)> = Vec::new();
            for (t, &p) in row.iter().enumerate() {
                let expected = if t == 0 { 0 } else { row[t - 1] + 1 };
                if p == 0 {
                    segments.push((t, 1));
                } else if p == expected {
                    if let Some(last) = segments.last_mut() {
                        last.1 += 1;
                    }
                } else {
                    let what = if t == 0 {
                        "0 (each row starts an example)".to_string()
                    } else {
                        format!("0 (a new example) or {expected} (the previous position + 1)")
                    };
                    return Err(TransformerError::Tokens {
                        message: format!(
                            "position_ids[{b}, {t}] is {p}; expected {what}: positions count \
                             0, 1, 2, .. within each example and restart at 0 only"
                        ),
                    });
                }
            }
            rows.push(segments);
        }
        Ok(Self { seq, rows })
    }

    /// The `(start, len)` of each example in row `row`.
    pub fn examples(&self, row: usize) -> &[(usize, usize)] {
        &self.rows[row]
    }

    /// Whether every row holds one example (then the packed forward is the ordinary one).
    pub fn is_unpacked(&self) -> bool {
        self.rows.iter().all(|r| r.len() <= 1)
    }

    /// Whether an example starts at `[row, t]`.
    pub fn is_example_start(&self, row: usize, t: usize) -> bool {
        self.rows[row].binary_search_by_key(&t, |s| s.0).is_ok()
    }

    /// This layout without the last column of each row (the inputs of a `[batch, seq + 1]`
    /// token block).
    pub fn without_last_column(&self) -> Self {
        let seq = self.seq.saturating_sub(1);
        let rows = self
            .rows
            .iter()
            .map(|r| {
                r.iter()
                    .filter(|s| s.0 < seq)
                    .map(|&(s, l)| (s, l.min(seq - s)))
                    .collect()
            })
            .collect();
        Self { seq, rows }
    }

    /// The sequence length of a row.
    pub fn seq(&self) -> usize {
        self.seq
    }
}

/// Causal attention of `q [batch, seq, heads, d_head]` and unrotated `k, v [batch, seq,
/// kv_heads, d_head]` (q and k before RoPE) within each example of `layout`, with RoPE from
/// position 0 per example. The output has `q`'s shape.
pub(crate) fn packed_attention(
    q: &Variable,
    k: &Variable,
    v: &Variable,
    ctx: &BlockContext,
    layout: &SequenceLayout,
    dropout: Option<DropoutMask>,
) -> riftco_autograd::Result<Variable> {
    let slice = |x: &Variable, row: usize, start: usize, len: usize| {
        ops::index(
            x,
            &[
                IndexItem::Slice {
                    start: Some(row as isize),
                    stop: Some(row as isize + 1),
                    step: None,
                },
                IndexItem::Slice {
                    start: Some(start as isize),
                    stop: Some((start + len) as isize),
                    step: None,
                },
            ],
        )
    };
    let (t, h) = (ctx.seq, ctx.n_heads as u64);
    let mut rows = Vec::with_capacity(ctx.batch);
    for row in 0..ctx.batch {
        let examples = layout.examples(row);
        let mut outs = Vec::with_capacity(examples.len());
        // The row first, then its examples: each slice's VJP scatters into zeros of its
        // input's shape, so an example sliced from its row costs a row of zeros at backward,
        // not a whole batch.
        let (qr, kr, vr) = if ctx.batch > 1 && examples.len() > 1 {
            (
                slice(q, row, 0, t)?,
                slice(k, row, 0, t)?,
                slice(v, row, 0, t)?,
            )
        } else {
            (q.clone(), k.clone(), v.clone())
        };
        let r = if ctx.batch > 1 && examples.len() > 1 {
            0
        } else {
            row
        };
        for &(start, len) in examples {
            let qs = ops::rope(&slice(&qr, r, start, len)?, &ctx.rope, 0)?;
            let ks = ops::rope(&slice(&kr, r, start, len)?, &ctx.rope, 0)?;
            let vs = slice(&vr, r, start, len)?;
            // Philox blocks of 4 elements: an example needs at most h·len² / 4 + 1 blocks, and
            // the next example of the row starts h·t·len blocks later.
            let mask = dropout.map(|m| DropoutMask {
                offset: ((row * t + start) as u64) * h * t as u64,
                ..m
            });
            outs.push(ops::causal_attention_with_dropout(
                &qs,
                &ks,
                &vs,
                AttentionLayout::BatchSeqHead,
                ctx.attention.into(),
                mask,
            )?);
        }
        rows.push(if outs.len() == 1 {
            outs.pop().expect("one example")
        } else {
            ops::concat(&outs, 1)?
        });
    }
    Ok(if rows.len() == 1 {
        rows.pop().expect("one row")
    } else {
        ops::concat(&rows, 0)?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_from_position_ids() {
        let l =
            SequenceLayout::from_position_ids(&[0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 4, 5], 2, 6).unwrap();
        assert_eq!(l.examples(0), &[(0, 3), (3, 2), (5, 1)]);
        assert_eq!(l.examples(1), &[(0, 6)]);
        assert!(l.is_example_start(0, 3) && !l.is_example_start(0, 4));
        assert!(!l.is_unpacked());
    }

    #[test]
    fn bad_position_ids_name_the_value() {
        let e = |p: &[i64], b, s| {
            SequenceLayout::from_position_ids(p, b, s)
                .unwrap_err()
                .to_string()
        };
        assert!(e(&[1, 2], 1, 2).contains("position_ids[0, 0] is 1"));
        assert!(e(&[0, 2], 1, 2).contains("position_ids[0, 1] is 2"));
        assert!(e(&[0, -1], 1, 2).contains("is -1"));
        assert!(e(&[0, 1, 2], 1, 2).contains("hold 3 values"));
    }
}
