//! The error type of the transformer crate.

use riftco_autograd::AutogradError;
use riftco_tensor::TensorError;

/// Errors of model construction, training and persistence. Messages name the bad value and what
/// was expected.
#[derive(Debug, thiserror::Error)]
pub enum TransformerError {
    /// A configuration field is invalid.
    #[error("invalid config: {field} = {value}: {reason}")]
    Config {
        field: &'static str,
        value: String,
        reason: String,
    },
    /// Token input is invalid (length, batch layout, ids, sequence length).
    #[error("invalid tokens: {0}")]
    Tokens(String),
    /// An unknown name for an enum-like option (attention kind, policy, ...).
    #[error("unknown {what} {got:?}; expected one of {expected}")]
    UnknownOption {
        what: &'static str,
        got: String,
        expected: &'static str,
    },
    /// LoRA misuse (no adapters, adapters already present, bad rank/alpha).
    #[error("LoRA: {0}")]
    Lora(String),
    /// Decode session misuse (cache full).
    #[error("decode: {0}")]
    Decode(String),
    /// Model-state file problems (format, names, shapes, dtypes, truncation).
    #[error("model state {path}: {reason}")]
    State { path: String, reason: String },
    /// Filesystem errors, with the path.
    #[error("I/O error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// Autograd errors (stale graphs, checkpoint contract, shapes).
    #[error(transparent)]
    Autograd(#[from] AutogradError),
}

impl From<TensorError> for TransformerError {
    fn from(e: TensorError) -> Self {
        TransformerError::Autograd(AutogradError::Tensor(e))
    }
}

/// Result alias for this crate.
pub type Result<T, E = TransformerError> = std::result::Result<T, E>;
