//! The error type of tensor operations.

use crate::error_kind::ErrorKind;
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
    /// Two operands of a broadcasting op whose shapes do not broadcast (NumPy rules: aligned
    /// from the right, each axis pair equal or one of them 1).
    #[error("{op}: shapes {lhs:?} and {rhs:?} cannot be broadcast together (aligned from the right, each pair of axes must be equal or one of them 1)")]
    BroadcastMismatch {
        op: &'static str,
        lhs: Vec<usize>,
        rhs: Vec<usize>,
    },
    /// An axis argument outside `-rank..rank`, or repeated (`problem` says which).
    #[error("{op}: axis {axis} {problem} for a tensor of rank {rank} (valid axes: -{rank}..{rank}, each at most once)")]
    BadAxis {
        op: &'static str,
        axis: i64,
        rank: usize,
        problem: &'static str,
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
    /// An index other than a token id (a position, an axis) is outside its range.
    #[error("{op}: {what} {index} is out of range (must be < {bound})")]
    IndexOutOfRange {
        op: &'static str,
        what: &'static str,
        index: usize,
        bound: usize,
    },
    /// An index expression does not fit the tensor: more than one `...`, or more indexed axes
    /// than the tensor has (NumPy's `IndexError`).
    #[error("{op}: {message}")]
    InvalidIndex { op: &'static str, message: String },
    /// An integer index along an axis is outside `-size..size` (NumPy's `IndexError`).
    #[error("{op}: index {index} is out of range for axis {axis} of size {size} (must be in {lo}..{size})", lo = -(*size as i128))]
    IndexOutOfBounds {
        op: &'static str,
        index: isize,
        axis: usize,
        size: usize,
    },
    /// An axis is outside `-rank..rank` (NumPy's `AxisError`).
    #[error("{op}: axis {axis} is out of range for a tensor of rank {rank} (must be in {lo}..{rank})", lo = -(*rank as i128))]
    AxisOutOfRange {
        op: &'static str,
        axis: isize,
        rank: usize,
    },
    /// Inputs of a concatenation or stack disagree on an axis other than the joined one.
    #[error("{op}: input {index} has shape {got:?} but input 0 has shape {first:?}; {rule} (axis {axis})")]
    JoinShapeMismatch {
        op: &'static str,
        axis: usize,
        index: usize,
        first: Vec<usize>,
        got: Vec<usize>,
        rule: &'static str,
    },
    /// A token id (an embedding row, a cross-entropy target) is outside the vocabulary;
    /// `what` names the role (`"token id"`, `"target"`).
    #[error("{op}: {what} {token} is out of range (must be < {vocab_size})")]
    TokenOutOfRange {
        op: &'static str,
        what: &'static str,
        token: u32,
        vocab_size: usize,
    },
    /// The requested device is not available in this build or on this machine.
    #[error("device {device} is unavailable: {reason}")]
    DeviceUnavailable { device: Device, reason: String },
    /// `"gpu"` (the best adapter of any GPU backend) was asked for and none could be opened or
    /// none is registered; named as the user asked, not as the backend that was tried.
    #[error("device gpu is unavailable: {reason}")]
    GpuUnavailable { reason: String },
    /// Operands live on different devices.
    #[error("{op}: operands on different devices ({lhs} and {rhs})")]
    DeviceMismatch {
        op: &'static str,
        lhs: Device,
        rhs: Device,
    },
    /// Host access ([`crate::Tensor::read`], [`crate::Tensor::write`]) to a tensor that lives on
    /// another device; copy it with [`crate::Tensor::to_host`] or move it with
    /// [`crate::Tensor::transfer_to`] first.
    #[error("{op}: the tensor lives on device {device}, not on the host; copy it to the host first (to_host / numpy)")]
    NotOnHost { op: &'static str, device: Device },
    /// The tensor is a placeholder holding no elements: the value of a graph-only node, recorded
    /// for its VJP only (see `riftco_autograd::ops`, "Graph-only variants"), or a graph value
    /// released because no VJP reads it; nothing may read it.
    #[error("{op}: the tensor holds no data (the value of a graph-only node, recorded for its VJP only; a graph value released because no backward rule reads it: keep a handle to a value you want to read; or a parameter released between uses by the owner of a sharded model, ZeRO-3: gather the model back first); it cannot be read")]
    NoData { op: &'static str },
    /// A shape's element count does not fit in memory arithmetic: the product of its non-zero
    /// dimensions exceeds [`crate::shape::MAX_ELEMENTS`] (`4 · numel` bytes would exceed
    /// `isize::MAX`).
    #[error("{op}: shape {shape:?} has too many elements (the product of its non-zero dimensions must be at most {max}, so that its bytes fit in isize::MAX)", max = crate::shape::MAX_ELEMENTS)]
    ShapeOverflow { op: &'static str, shape: Vec<usize> },
    /// The allocator refused a buffer (the size passed every check but memory ran out, or an
    /// address-space limit was hit).
    #[error("{op}: out of memory: could not allocate {bytes} bytes")]
    OutOfMemory { op: &'static str, bytes: usize },
    /// One buffer larger than the device allows: a per-buffer limit of the adapter (for a GPU,
    /// wgpu's `max_storage_buffer_binding_size` / `max_buffer_size`), not its free memory.
    #[error("{op}: out of memory: a buffer of {bytes} bytes exceeds the device's per-buffer limit of {limit} bytes (a limit of the adapter on one buffer, not its free memory: split the tensor or keep it on the cpu)")]
    BufferTooLarge {
        /// The operation.
        op: &'static str,
        /// The bytes asked for.
        bytes: u64,
        /// The device's largest buffer, in bytes.
        limit: u64,
    },
    /// Any other invalid argument, described.
    /// The device's backend has no kernel for this operation yet (an honest intermediate
    /// state of a new backend, never a silent fallback): run the op on another device.
    #[error("{op}: not implemented on device {device} yet (its kernel is still to be written); move the tensors to \"cpu\" for this operation")]
    Unsupported {
        /// The operation.
        op: &'static str,
        /// The device without the kernel.
        device: Device,
    },
    /// The device failed while running an operation (a rejected command, a lost device, a
    /// failed read-back); the message is the device layer's.
    #[error("{op}: device {device} failed: {message}")]
    DeviceFailure {
        /// The operation.
        op: &'static str,
        /// The device.
        device: Device,
        /// What failed, from the device layer.
        message: String,
    },
    #[error("{op}: {message}")]
    InvalidArgument { op: &'static str, message: String },
}

impl TensorError {
    /// The class of this error (what the Python and C layers map to an exception or a status).
    pub fn kind(&self) -> ErrorKind {
        match self {
            TensorError::ShapeMismatch { .. }
            | TensorError::BroadcastMismatch { .. }
            | TensorError::BadAxis { .. }
            | TensorError::LengthMismatch { .. }
            | TensorError::ZeroSized { .. }
            | TensorError::RankMismatch { .. }
            | TensorError::ShapeOverflow { .. }
            | TensorError::AxisOutOfRange { .. }
            | TensorError::JoinShapeMismatch { .. } => ErrorKind::Shape,
            TensorError::IndexOutOfRange { .. }
            | TensorError::IndexOutOfBounds { .. }
            | TensorError::InvalidIndex { .. } => ErrorKind::IndexOutOfRange,
            TensorError::TokenOutOfRange { .. } => ErrorKind::Tokens,
            TensorError::DeviceUnavailable { .. }
            | TensorError::GpuUnavailable { .. }
            | TensorError::Unsupported { .. }
            | TensorError::DeviceFailure { .. } => ErrorKind::DeviceUnavailable,
            // Host access to a device tensor: the tensor is on another device than the host.
            TensorError::DeviceMismatch { .. } | TensorError::NotOnHost { .. } => {
                ErrorKind::DeviceMismatch
            }
            TensorError::OutOfMemory { .. } | TensorError::BufferTooLarge { .. } => {
                ErrorKind::OutOfMemory
            }
            TensorError::InvalidArgument { .. } | TensorError::NoData { .. } => {
                ErrorKind::InvalidArgument
            }
        }
    }
}

/// Result alias for tensor operations.
pub type Result<T, E = TensorError> = std::result::Result<T, E>;
