//! Full-sequence attention kinds and activation-checkpointing policies.

use crate::error::{Result, TransformerError};
use std::fmt;
use std::str::FromStr;

/// How full-sequence (training) attention is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum FullSequenceAttentionKind {
    /// Scores and probabilities `[batch, heads, seq, seq]` are materialized and kept for backward.
    Materialized,
    /// FlashAttention-2 (Dao 2023): tiled online softmax keeping only the per-row logsumexp;
    /// backward rematerializes probabilities. Retained memory O(seq) per head.
    #[default]
    Flash,
}

impl FullSequenceAttentionKind {
    /// `"materialized"` or `"flash"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Materialized => "materialized",
            Self::Flash => "flash",
        }
    }

    /// The integer used by the C ABI (0 materialized, 1 flash).
    pub fn to_int(self) -> u32 {
        match self {
            Self::Materialized => 0,
            Self::Flash => 1,
        }
    }

    /// Parses the C ABI integer.
    ///
    /// # Errors
    /// [`TransformerError::UnknownOption`] for other values.
    pub fn from_int(v: u32) -> Result<Self> {
        match v {
            0 => Ok(Self::Materialized),
            1 => Ok(Self::Flash),
            _ => Err(TransformerError::UnknownOption {
                what: "attention kind",
                got: v.to_string(),
                expected: "0 (materialized), 1 (flash)",
            }),
        }
    }
}

impl FromStr for FullSequenceAttentionKind {
    type Err = TransformerError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "materialized" => Ok(Self::Materialized),
            "flash" => Ok(Self::Flash),
            _ => Err(TransformerError::UnknownOption {
                what: "attention",
                got: s.to_string(),
                expected: "\"flash\", \"materialized\"",
            }),
        }
    }
}

impl fmt::Display for FullSequenceAttentionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which activations a training forward pass retains.
///
/// Not part of the model state: it changes how a future training graph retains activations,
/// not the architecture or weights. Built to grow (multi-block segments come later).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ActivationCheckpointingKind {
    /// Ordinary graph: every op inside every block is retained (compatibility default).
    #[default]
    Disabled,
    /// Every transformer block is wrapped in `checkpoint()`: only block boundaries and parameter
    /// leaves are retained; each block's forward runs again during backward.
    TransformerBlock,
}

impl ActivationCheckpointingKind {
    /// `"disabled"` or `"block"` (the Python and CLI spelling).
    pub fn name(self) -> &'static str {
        match self {
            Self::Disabled => "disabled",
            Self::TransformerBlock => "block",
        }
    }

    /// The integer used by the C ABI (`RT_ACTIVATION_CHECKPOINTING_DISABLED = 0`,
    /// `RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK = 1`).
    pub fn to_int(self) -> u32 {
        match self {
            Self::Disabled => 0,
            Self::TransformerBlock => 1,
        }
    }

    /// Parses the C ABI integer.
    ///
    /// # Errors
    /// [`TransformerError::UnknownOption`] for other values.
    pub fn from_int(v: u32) -> Result<Self> {
        match v {
            0 => Ok(Self::Disabled),
            1 => Ok(Self::TransformerBlock),
            _ => Err(TransformerError::UnknownOption {
                what: "activation checkpointing kind",
                got: v.to_string(),
                expected: "0 (disabled), 1 (transformer block)",
            }),
        }
    }
}

impl FromStr for ActivationCheckpointingKind {
    type Err = TransformerError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "disabled" => Ok(Self::Disabled),
            "block" => Ok(Self::TransformerBlock),
            _ => Err(TransformerError::UnknownOption {
                what: "activation_checkpointing",
                got: s.to_string(),
                expected: "\"disabled\", \"block\"",
            }),
        }
    }
}

impl fmt::Display for ActivationCheckpointingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
