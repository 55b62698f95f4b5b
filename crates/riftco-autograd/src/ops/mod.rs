//! Differentiable ops. Each file holds a family of primitives with its VJP right beside the
//! forward computation; composite ops (attention, the transformer block) are built from these.
//!
//! # Graph-only variants
//! [`linear_graph_only`], [`add_graph_only`] and [`scale_graph_only`] record the same node and
//! VJP as their plain op but skip the forward kernel: the node's value has the right shape but
//! unspecified contents (a pooled buffer left unfilled; NaN in debug builds). They exist for the
//! tail of a checkpoint replay ([`crate::checkpoint::CheckpointPass::Replay`]): there only the recorded graph is
//! differentiated and the callable's returned value is never read, so ops whose value feeds
//! nothing but that output, and whose VJPs read only their inputs, need not be evaluated (in a
//! transformer block, the MLP down projection and the residual add: about a fifth of the
//! block's forward FLOPs). Use them only where no forward op and no VJP reads the value. When
//! no gradient can flow through the node (grad mode off, or no input requires grad), they
//! compute the value like the plain op.

pub mod elementwise;
pub mod embedding;
pub mod linalg;
pub mod loss;
pub mod norm;
pub mod rope;
pub mod shape;
pub mod softmax;

pub use elementwise::{add, add_graph_only, mul, scale, scale_graph_only, silu, sum, swiglu};
pub use embedding::embedding;
pub use linalg::{bmm, linear, linear_graph_only, matmul};
pub use loss::cross_entropy;
pub use norm::rms_norm;
pub use rope::rope;
pub use shape::{reshape, swap_axes_1_2};
pub use softmax::{causal_softmax, softmax};

use crate::error::Result;
use crate::variable::Variable;
use riftco_tensor::{MemoryCategory, Shape, Tensor};

/// A forward result (activation category). Public, with [`gradient`] and [`buf`], for ops
/// defined in other crates (the transformer's flash attention).
pub fn activation(data: Vec<f32>, shape: impl Into<Shape>) -> Tensor {
    Tensor::from_vec_unchecked(data, shape.into(), MemoryCategory::Activation)
}

/// A gradient produced by a VJP (gradient category).
pub fn gradient(data: Vec<f32>, shape: impl Into<Shape>) -> Tensor {
    Tensor::from_vec_unchecked(data, shape.into(), MemoryCategory::Gradient)
}

/// A buffer of `n` elements for a kernel that overwrites every element (contents unspecified
/// until then; reused from [`riftco_tensor::pool`] when possible).
///
/// # Errors
/// [`riftco_tensor::TensorError::OutOfMemory`] naming `op` when the allocation fails.
pub fn buf(op: &'static str, n: usize) -> Result<Vec<f32>> {
    Ok(riftco_tensor::pool::try_take(op, n)?)
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

/// A zero-filled buffer of `n` elements, for kernels that accumulate into their output.
pub(crate) fn zeroed(op: &'static str, n: usize) -> Result<Vec<f32>> {
    Ok(riftco_tensor::pool::try_take_zeroed(op, n)?)
}
