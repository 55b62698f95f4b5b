//! The error type of tensor operations.

use crate::Device;

/// Errors raised by tensor construction and operations. Each names the operation and the values
/// that were wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TensorError {
    /// Two shapes that must agree do not.
    #[error("{op}: shape mismatch, expected {expected:?}, got {got:?}")]
    ShapeMismatch {
        op: &'static str,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    /// A data buffer's length disagrees with the shape it is given.
    #[error("{op}: data of {got} elements does not fill shape {shape:?} ({expected} elements)")]
    LengthMismatch {
        op: &'static str,
        shape: Vec<usize>,
        expected: usize,
        got: usize,
    },
    /// A dimension is zero where it is not allowed.
    #[error("{op}: zero-sized dimension in shape {shape:?} is not allowed")]
    ZeroSized { op: &'static str, shape: Vec<usize> },
    /// A tensor has the wrong number of dimensions.
    #[error("{op}: expected a {expected}-D tensor, got shape {got:?}")]
    RankMismatch {
        op: &'static str,
        expected: usize,
        got: Vec<usize>,
    },
    /// An index (token id, position, axis) is outside its range.
    #[error("{op}: {what} {index} is out of range (must be < {bound})")]
    IndexOutOfRange {
        op: &'static str,
        what: &'static str,
        index: usize,
        bound: usize,
    },
    /// The requested device is not available in this build or on this machine.
    #[error("device {device} is unavailable: {reason}")]
    DeviceUnavailable { device: Device, reason: String },
    /// Operands live on different devices.
    #[error("{op}: operands on different devices ({lhs} and {rhs})")]
    DeviceMismatch {
        op: &'static str,
        lhs: Device,
        rhs: Device,
    },
    /// Any other invalid argument, described.
    #[error("{op}: {message}")]
    InvalidArgument { op: &'static str, message: String },
}

/// Result alias for tensor operations.
pub type Result<T, E = TensorError> = std::result::Result<T, E>;
