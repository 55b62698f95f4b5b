//! Differentiable ops. Each file holds a family of primitives with its VJP right beside the
//! forward computation; composite ops (the transformer block) are built from these. Every op
//! computes through the [`riftco_tensor::Backend`] of its operands' device (mixing devices is a
//! [`riftco_tensor::TensorError::DeviceMismatch`]), so a new device needs no change here.
//!
//! # Graph-only variants
//! [`linear_graph_only`], [`add_graph_only`], [`scale_graph_only`] and [`dropout_graph_only`] record the same node and
//! VJP as their plain op but skip the forward kernel: the node's value has the right shape and
//! device but holds no data ([`riftco_tensor::Tensor::placeholder`]: no memory, and reading it
//! is a [`riftco_tensor::TensorError::NoData`] error rather than garbage). They exist for the
//! tail of a checkpoint replay ([`crate::checkpoint::CheckpointPass::Replay`]): there only the recorded graph is
//! differentiated and the callable's returned value is never read, so ops whose value feeds
//! nothing but that output, and whose VJPs read only their inputs, need not be evaluated (in a
//! transformer block, the MLP down projection and the residual add: about a fifth of the
//! block's forward FLOPs). Use them only where no forward op and no VJP reads the value. When
//! no gradient can flow through the node (grad mode off, or no input requires grad), they
//! compute the value like the plain op.

pub mod attention;
pub mod broadcast;
pub mod concat;
pub mod device;
pub mod dropout;
pub mod elementwise;
pub mod embedding;
pub mod index;
pub mod linalg;
pub mod loss;
pub mod norm;
pub mod reduce;
pub mod rope;
pub mod shape;
pub mod sliced;
pub mod softmax;
pub mod unary;

pub use attention::{
    causal_attention, causal_attention_with_dropout, flash_attention, flash_attention_with_dropout,
    flash_attention_with_layout, AttentionKind, AttentionLayout,
};
pub use broadcast::{
    broadcast_add, broadcast_div, broadcast_mul, broadcast_shapes, broadcast_sub, compare,
    scalar_like,
};
pub use concat::{concat, stack};
pub use device::to_device;
pub use dropout::{
    dropout, dropout_graph_only, dropout_random, dropout_seeded, philox_key, DropoutMask,
};
pub use elementwise::{add, add_graph_only, mul, scale, scale_graph_only, silu, sum, swiglu};
pub use embedding::embedding;
pub use index::{index, index_view, IndexItem};
pub use linalg::{bmm, linear, linear_bias, linear_graph_only, matmul};
pub use loss::{cross_entropy, linear_cross_entropy};
pub use norm::rms_norm;
pub use reduce::{log_softmax, mean_axes, sum_axes};
pub use rope::rope;
pub use shape::{normalize_axis, permute, reshape, reshape_infer, swap_axes_1_2, transpose};
pub use sliced::{sliced_embedding, sliced_linear_cross_entropy, FetchRows};
pub use softmax::{causal_softmax, softmax};
pub use unary::{
    add_scalar, div_scalar, exp, gelu, log, mul_scalar, neg, pow_scalar, rdiv_scalar, relu,
    rsub_scalar, sigmoid, sub_scalar, tanh, unary, GeluApproximation,
};

use crate::error::Result;
use crate::variable::Variable;
use riftco_tensor::backend::backend_of_devices;
use riftco_tensor::{backend_of, Backend, MemoryCategory, Shape, Tensor};

/// Forward values are activations.
pub(crate) const ACT: MemoryCategory = MemoryCategory::Activation;
/// VJP outputs are gradients.
pub(crate) const GRAD: MemoryCategory = MemoryCategory::Gradient;

/// The backend of the device the values of `vars` live on.
///
/// # Errors
/// [`riftco_tensor::TensorError::DeviceMismatch`] naming `op` when they live on different
/// devices.
pub(crate) fn backend(op: &'static str, vars: &[&Variable]) -> Result<&'static dyn Backend> {
    Ok(backend_of_devices(
        op,
        vars.iter().map(|v| v.value().device()),
    )?)
}

/// The backend of the device `tensors` live on (see [`backend`]).
pub(crate) fn backend_t(op: &'static str, tensors: &[&Tensor]) -> Result<&'static dyn Backend> {
    Ok(backend_of(op, tensors)?)
}

/// The value of a graph-only node: a [`Tensor::placeholder`] of `shape` on the backend's
/// device, which owns no memory and whose every read is a `TensorError::NoData`.
pub(crate) fn placeholder(be: &dyn Backend, shape: Shape) -> Result<Tensor> {
    Ok(Tensor::placeholder(shape, be.device(), ACT)?)
}

/// The shape `dims` of an op's output, checked so that its element count cannot wrap.
///
/// # Errors
/// [`riftco_tensor::TensorError::ShapeOverflow`] naming `op`.
pub fn output_shape(op: &'static str, dims: impl Into<Vec<usize>>) -> Result<Shape> {
    Ok(Shape::try_new(op, dims)?)
}

/// Whether an op asked to skip its forward kernel (`evaluate == false`) must still compute its
/// value: it must when no gradient will flow through the node — grad mode off (no graph is
/// recorded) or no input requiring grad — because then the value is all the caller gets.
pub(crate) fn evaluate_value(evaluate: bool, inputs: &[&Variable]) -> bool {
    evaluate || !crate::grad_mode::is_grad_enabled() || !inputs.iter().any(|v| v.requires_grad())
}
