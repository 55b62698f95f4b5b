//! CPU kernels on contiguous, row-major `f32` slices.
//!
//! This crate knows nothing about tensors: every kernel takes slices and sizes. Kernels are
//! deterministic (the same inputs give bitwise the same outputs for any thread count), and
//! every kernel, matrix products included, dispatches at run time to AVX-512, AVX2+FMA, NEON or
//! a scalar fallback. `RIFTCO_SIMD=scalar|avx2|avx512|neon` forces one level the CPU supports
//! (see [`simd`]), so every level's results can be tested on one machine.
//!
//! [`quant`] reads llama.cpp's block formats (GGUF tensor types) into `f32`, bitwise as the
//! reference dequantization does, at every level.

pub mod adam;
pub mod attention;
mod attention_dims;
pub mod broadcast;
pub mod dropout;
pub mod elementwise;
pub mod embedding;
pub mod gather;
mod gemm_level;
pub mod layout;
pub mod linear_loss;
pub mod loss;
pub mod map;
pub mod matmul;
mod matvec;
pub mod norm;
mod par;
pub mod philox;
pub mod quant;
pub mod reduce;
pub mod rope;
pub mod simd;
pub mod softmax;
mod strided;
pub mod threading;

pub use adam::{adam_update, AdamHyper};
pub use broadcast::BinaryOp;
pub use dropout::dropout;
pub use gather::StridedView;
pub use map::UnaryOp;
pub use matmul::{batched_matmul, matmul, MatmulSpec};
pub use philox::{philox4x32_10, DropoutMask};
pub use reduce::ReduceOp;
pub use threading::{num_threads, thread_pool};
