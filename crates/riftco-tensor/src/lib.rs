//! f32 tensors for riftco.
//!
//! A [`Tensor`] is a contiguous, row-major `f32` array with a [`Shape`] and a [`Device`]. Its
//! storage is shared through `Arc` and carries a version counter bumped by every in-place write
//! and every device transfer, which the autograd layer uses to reject stale graphs. Every storage
//! allocation is counted by [`MemoryCategory`] (see [`memory`]), exactly: a tensor of `N`
//! elements moves its category's counter by `4·N` bytes while it lives.

pub mod alloc;
pub mod backend;
pub mod device;
pub mod error;
pub mod error_kind;
pub mod memory;
pub mod pool;
pub mod random;
pub mod residency;
pub mod shape;
pub mod sliced_head;
pub mod storage;
pub mod tensor;

pub use backend::{backend_of, Backend};
pub use device::Device;
pub use error::{Result, TensorError};
pub use error_kind::{ClassifiedError, ErrorKind};
pub use memory::{
    memory_at_total_peak_for, memory_stats, memory_stats_for, reset_peak_memory_stats,
    CategoryStats, MemoryCategory, MemoryStats, ThreadMemoryScope,
};
pub use random::Rng;
pub use residency::StorageEncoding;
pub use riftco_kernels::quant::QuantFormat;
pub use shape::{Shape, MAX_ELEMENTS};
pub use storage::{Buffer, DeviceBuffer, HalfDtype, QuantizedBytes};
pub use tensor::Tensor;
