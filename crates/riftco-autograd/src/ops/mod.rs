//! Differentiable ops. Each file holds a family of primitives with its VJP right beside the
//! forward computation; composite ops (attention, the transformer block) are built from these.

pub mod elementwise;
pub mod embedding;
pub mod linalg;
pub mod loss;
pub mod norm;
pub mod rope;
pub mod shape;
pub mod softmax;

pub use elementwise::{add, mul, scale, silu, sum, swiglu};
pub use embedding::embedding;
pub use linalg::{bmm, linear, matmul};
pub use loss::cross_entropy;
pub use norm::rms_norm;
pub use rope::rope;
pub use shape::{reshape, swap_axes_1_2};
pub use softmax::{causal_softmax, softmax};

use riftco_tensor::{MemoryCategory, Shape, Tensor};

/// A forward result (activation category).
pub(crate) fn activation(data: Vec<f32>, shape: impl Into<Shape>) -> Tensor {
    Tensor::from_vec_unchecked(data, shape.into(), MemoryCategory::Activation)
}

/// A gradient produced by a VJP (gradient category).
pub(crate) fn gradient(data: Vec<f32>, shape: impl Into<Shape>) -> Tensor {
    Tensor::from_vec_unchecked(data, shape.into(), MemoryCategory::Gradient)
}

/// Zero-filled buffer of `n` elements.
pub(crate) fn buf(n: usize) -> Vec<f32> {
    vec![0.0; n]
}
