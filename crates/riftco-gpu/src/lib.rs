//! GPU compute for riftco through [wgpu](https://wgpu.rs) (pinned to the 30.0.x series):
//! Metal on macOS, Vulkan elsewhere (Mesa's software Vulkan, llvmpipe, in CI).
//!
//! - [`GpuContext::open`] picks an adapter of a [`GpuKind`] (`"gpu"`, `"vulkan"`, `"metal"`)
//!   headless and opens its device; none found is [`GpuError::DeviceUnavailable`], naming what
//!   was looked for and every adapter that was found.
//! - [`GpuBuffer`]: f32 storage buffers from a pool reused by power-of-two size bucket, with
//!   byte accounting ([`GpuContext::memory`]).
//! - [`kernels`]: WGSL compute kernels from the top-level `shaders/` folder (one file per
//!   family), compiled once per context. Kernels record into one pending command encoder;
//!   nothing waits for the GPU until [`GpuContext::download`] reads a value back.
//!
//! - [`backend`]: the GPU as a riftco device ([`install`] registers [`GpuBackend`], the
//!   `riftco_tensor::backend::Backend` of [`riftco_tensor::Device::Vulkan`] /
//!   [`riftco_tensor::Device::Metal`]).
//!
//! Every failure is a [`GpuError`]: validation and out-of-memory errors are caught in wgpu
//! error scopes, a lost device is reported by the next operation; nothing here panics on bad
//! input or a failing device.

pub mod backend;
mod context;
mod device;
mod error;
pub mod kernels;
pub mod pipelines;
mod pool;

pub use backend::{install, install_device, install_error, GpuBackend, ROPE_CACHE_ENTRIES};
pub use context::{BatchStats, GpuContext, FLUSH_EVERY, LLVMPIPE_LOOP_LIMIT, MIN_EXACT_BYTES};
pub use device::{list_adapters, GpuKind};
pub use error::{AdapterSummary, GpuError, Result};
pub use pool::{bucket_bytes, GpuBuffer, MemoryStats, MIN_BUCKET_BYTES};
