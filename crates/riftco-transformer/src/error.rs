//! The error type of the transformer crate.

use riftco_autograd::AutogradError;
use riftco_tensor::{ClassifiedError, ErrorKind, TensorError};

/// Errors of model construction, training and persistence. Messages name the bad value and what
/// was expected.
#[derive(Debug, thiserror::Error)]
pub enum TransformerError {
    /// An optimizer step found a parameter, its gradient or its moments on different devices
    /// (an optimizer built before `to_device` holds its moments on the old device).
    #[error(
        "optimizer step: parameter {parameter} is on device {parameter_device} but {what} is on \
         {other_device}; build the optimizer after moving the model (model.to(device))"
    )]
    OptimizerDevice {
        parameter: String,
        parameter_device: riftco_tensor::Device,
        what: &'static str,
        other_device: riftco_tensor::Device,
    },
    /// A configuration field is invalid.
    #[error("invalid config: {field} = {value}: {reason}")]
    Config {
        field: &'static str,
        value: String,
        reason: String,
    },
    /// Token input is invalid (length, batch layout).
    #[error("invalid tokens: {message}")]
    Tokens { message: String },
    /// A token id is outside the vocabulary; `index` is its position in the flat token buffer
    /// when there is one.
    #[error(
        "invalid tokens: token id {token}{} is outside the vocabulary (vocab_size {vocab_size})",
        at_index(*index)
    )]
    TokenOutOfVocabulary {
        token: u32,
        index: Option<usize>,
        vocab_size: usize,
    },
    /// A token sequence is longer than the model's `max_seq_len`.
    #[error("invalid tokens: sequence length {seq} exceeds max_seq_len {max_seq_len}")]
    SequenceTooLong { seq: usize, max_seq_len: usize },
    /// An unknown name for an enum-like option (attention kind, policy, ...).
    #[error("unknown {what} {got:?}; expected one of {expected}")]
    UnknownOption {
        what: &'static str,
        got: String,
        expected: &'static str,
    },
    /// LoRA misuse (no adapters, adapters already present, bad rank/alpha).
    #[error("LoRA: {message}")]
    Lora { message: String },
    /// Decode session misuse (the model changed after the session was opened).
    #[error("decode: {message}")]
    Decode { message: String },
    /// The decode session's K/V cache already holds `max_seq_len` positions.
    #[error(
        "decode: the K/V cache is full ({max_seq_len} positions = max_seq_len); reset the session"
    )]
    DecodeCacheFull { max_seq_len: usize },
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

fn at_index(index: Option<usize>) -> String {
    index.map_or_else(String::new, |i| format!(" at index {i}"))
}

impl TransformerError {
    /// The class of this error (what the Python and C layers map to an exception or a status).
    /// An `Autograd` error has the kind of the error it carries.
    pub fn kind(&self) -> ErrorKind {
        match self {
            TransformerError::Config { .. } => ErrorKind::Config,
            TransformerError::OptimizerDevice { .. } => ErrorKind::DeviceMismatch,
            TransformerError::Tokens { .. }
            | TransformerError::TokenOutOfVocabulary { .. }
            | TransformerError::SequenceTooLong { .. } => ErrorKind::Tokens,
            TransformerError::UnknownOption { .. } => ErrorKind::UnknownOption,
            TransformerError::Lora { .. } => ErrorKind::Lora,
            TransformerError::Decode { .. } | TransformerError::DecodeCacheFull { .. } => {
                ErrorKind::Decode
            }
            TransformerError::State { .. } => ErrorKind::State,
            TransformerError::Io { .. } => ErrorKind::Io,
            TransformerError::Autograd(e) => e.kind(),
        }
    }
}

impl ClassifiedError for TransformerError {
    fn kind(&self) -> ErrorKind {
        TransformerError::kind(self)
    }
}

impl From<TensorError> for TransformerError {
    fn from(e: TensorError) -> Self {
        TransformerError::Autograd(AutogradError::Tensor(e))
    }
}

/// Result alias for this crate.
pub type Result<T, E = TransformerError> = std::result::Result<T, E>;
