//! The sizes ([`AttentionDims`]) and memory layouts ([`AttentionLayout`]) of an attention call.

/// Sizes of one attention call. Layout `[batch, n_heads, seq, d_head]` for queries and outputs,
/// `[batch, n_kv_heads, seq, d_head]` for keys and values, contiguous.
///
/// Grouped-query attention (Ainslie et al. 2023, "GQA: Training Generalized Multi-Query
/// Transformer Models from Multi-Head Checkpoints"): query head `h` reads key/value head
/// `h / (n_heads / n_kv_heads)`, the mapping of Hugging Face's `repeat_kv`, by indexing (K and V
/// are never repeated in memory). `n_kv_heads == n_heads` is multi-head attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionDims {
    /// Batch size.
    pub batch: usize,
    /// Number of query heads.
    pub n_heads: usize,
    /// Number of key/value heads: at least 1 and a divisor of `n_heads`.
    pub n_kv_heads: usize,
    /// Query sequence length.
    pub seq_q: usize,
    /// Key/value sequence length.
    pub seq_k: usize,
    /// Head dimension.
    pub d_head: usize,
}

impl AttentionDims {
    /// Multi-head attention dims: `n_kv_heads = n_heads`.
    pub fn mha(batch: usize, n_heads: usize, seq_q: usize, seq_k: usize, d_head: usize) -> Self {
        Self {
            batch,
            n_heads,
            n_kv_heads: n_heads,
            seq_q,
            seq_k,
            d_head,
        }
    }

    /// Query (batch, head) pairs.
    pub(crate) fn pairs(&self) -> usize {
        self.batch * self.n_heads
    }

    /// Key/value (batch, head) pairs.
    pub(crate) fn kv_pairs(&self) -> usize {
        self.batch * self.n_kv_heads
    }

    /// Query heads per key/value head (`n_heads / n_kv_heads`).
    pub(crate) fn group(&self) -> usize {
        self.n_heads / self.n_kv_heads.max(1)
    }

    /// The key/value pair query pair `pair = b·n_heads + h` reads: `b·n_kv_heads + h / group`.
    pub(crate) fn kv_pair_of(&self, pair: usize) -> usize {
        let (b, h) = (pair / self.n_heads, pair % self.n_heads);
        b * self.n_kv_heads + h / self.group()
    }

    /// Number of keys query `i` may attend under the mask.
    pub(crate) fn allowed(&self, i: usize, causal: bool) -> usize {
        if !causal {
            return self.seq_k;
        }
        // j <= i + seq_k − seq_q  ⇔  j < i + 1 + seq_k − seq_q.
        (i + 1 + self.seq_k)
            .saturating_sub(self.seq_q)
            .min(self.seq_k)
    }
}

/// Memory layout of `q`, `k`, `v`, `out` and their gradients. `lse` is always
/// `[batch, n_heads, seq_q]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttentionLayout {
    /// `[batch, n_heads, seq, d_head]`: each head's rows are contiguous.
    #[default]
    BatchHeadSeq,
    /// `[batch, seq, n_heads, d_head]`: the layout of a `[batch, seq, d_model]` projection after
    /// a free reshape, so attention needs no transposition before or after.
    BatchSeqHead,
}

impl AttentionLayout {
    /// Offset of row 0 of pair `pair = b·heads + h` in a tensor with `heads` heads of `seq`
    /// rows of `d` elements, and the distance between consecutive rows of that head.
    pub(crate) fn head_rows(
        self,
        d: usize,
        heads: usize,
        pair: usize,
        seq: usize,
    ) -> (usize, usize) {
        match self {
            AttentionLayout::BatchHeadSeq => (pair * seq * d, d),
            AttentionLayout::BatchSeqHead => {
                let (b, h) = (pair / heads, pair % heads);
                ((b * seq * heads + h) * d, heads * d)
            }
        }
    }
}
