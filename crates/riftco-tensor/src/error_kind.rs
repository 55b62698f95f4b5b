//! One classification of every riftco error, shared by the bindings.
//!
//! Each core error enum (`TensorError`, `CheckpointError`, `AutogradError`, `TransformerError`)
//! has a `kind()` that classifies every variant by an exhaustive match, and the Python and C
//! layers map an [`ErrorKind`] (never a message) to an exception class or a status code. A new
//! error variant therefore has to be classified where it is declared, and a new kind has to be
//! mapped by each binding (each has a test over [`ErrorKind::ALL`]).

use std::fmt;

/// The class of an error: what a caller can act on.
///
/// `#[non_exhaustive]`: kinds are added as the library grows (a new device, a new policy); a
/// binding maps a kind it does not know to its most general error.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Shapes, ranks or element counts do not fit the operation (including a shape whose byte
    /// size would overflow, and a non-scalar output given to a seedless `backward()`).
    Shape,
    /// An index other than a token id (a position, an axis) is outside its range.
    IndexOutOfRange,
    /// An argument value an operation refuses (an `eps`, a scale, a device name).
    InvalidArgument,
    /// A configuration field is invalid (the message names the field and the value).
    Config,
    /// A name for an enum-like option is unknown (attention kind, policy, ...).
    UnknownOption,
    /// Token input is invalid: an id outside the vocabulary, a bad block layout, a sequence
    /// longer than `max_seq_len`.
    Tokens,
    /// The allocator refused a buffer (memory or an address-space limit ran out).
    OutOfMemory,
    /// The requested device is not available in this build or on this machine.
    DeviceUnavailable,
    /// The operands of one operation live on different devices.
    DeviceMismatch,
    /// A value read by a recorded graph changed (modified, transferred, stepped) before backward.
    StaleGraph,
    /// A `checkpoint()` contract violation (boundary, dependencies, replay).
    Checkpoint,
    /// `backward()` cannot run as asked (the output reaches no trainable leaf).
    Backward,
    /// LoRA misuse: no adapters, adapters already present, a bad rank or alpha.
    Lora,
    /// Decode-session misuse: a full K/V cache, or a model changed after the session opened.
    Decode,
    /// A model-state or adapter file is malformed or does not match the model.
    State,
    /// A filesystem operation failed.
    Io,
    /// A Rust panic caught at a boundary (a bug).
    Panic,
    /// An error raised by user code (a Python exception inside a checkpoint callable) that is
    /// not itself a riftco error.
    External,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 18] = [
        ErrorKind::Shape,
        ErrorKind::IndexOutOfRange,
        ErrorKind::InvalidArgument,
        ErrorKind::Config,
        ErrorKind::UnknownOption,
        ErrorKind::Tokens,
        ErrorKind::OutOfMemory,
        ErrorKind::DeviceUnavailable,
        ErrorKind::DeviceMismatch,
        ErrorKind::StaleGraph,
        ErrorKind::Checkpoint,
        ErrorKind::Backward,
        ErrorKind::Lora,
        ErrorKind::Decode,
        ErrorKind::State,
        ErrorKind::Io,
        ErrorKind::Panic,
        ErrorKind::External,
    ];

    /// A stable snake_case name (`"shape"`, `"stale_graph"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            ErrorKind::Shape => "shape",
            ErrorKind::IndexOutOfRange => "index_out_of_range",
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::Config => "config",
            ErrorKind::UnknownOption => "unknown_option",
            ErrorKind::Tokens => "tokens",
            ErrorKind::OutOfMemory => "out_of_memory",
            ErrorKind::DeviceUnavailable => "device_unavailable",
            ErrorKind::DeviceMismatch => "device_mismatch",
            ErrorKind::StaleGraph => "stale_graph",
            ErrorKind::Checkpoint => "checkpoint",
            ErrorKind::Backward => "backward",
            ErrorKind::Lora => "lora",
            ErrorKind::Decode => "decode",
            ErrorKind::State => "state",
            ErrorKind::Io => "io",
            ErrorKind::Panic => "panic",
            ErrorKind::External => "external",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An error that knows its [`ErrorKind`]: what an error carried through another crate's error
/// (`AutogradError::External`) must be, so that the kind survives the nesting.
pub trait ClassifiedError: std::error::Error + Send + Sync + 'static {
    /// The class of this error.
    fn kind(&self) -> ErrorKind;
}

impl ClassifiedError for crate::TensorError {
    fn kind(&self) -> ErrorKind {
        crate::TensorError::kind(self)
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorKind;

    #[test]
    fn all_lists_every_kind_once_in_declaration_order() {
        for (i, kind) in ErrorKind::ALL.iter().enumerate() {
            assert_eq!(*kind as usize, i, "{kind:?}");
        }
        let mut names: Vec<_> = ErrorKind::ALL.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ErrorKind::ALL.len(), "names are unique");
    }
}
