//! [`GpuError`]: every failure of the GPU layer, returned (never a panic).

use thiserror::Error;

/// One adapter seen while looking for a device: what [`GpuError::DeviceUnavailable`] lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterSummary {
    /// The adapter's name as the driver reports it (e.g. `"llvmpipe (LLVM 15.0.6, 256 bits)"`).
    pub name: String,
    /// The wgpu backend that exposes it (`"vulkan"`, `"metal"`, ...).
    pub backend: String,
    /// The device type (`"DiscreteGpu"`, `"IntegratedGpu"`, `"Cpu"`, ...).
    pub device_type: String,
    /// The driver name and version string (may be empty where the backend does not say).
    pub driver: String,
}

impl std::fmt::Display for AdapterSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}, {}, driver {:?})",
            self.name, self.backend, self.device_type, self.driver
        )
    }
}

fn list(found: &[AdapterSummary]) -> String {
    if found.is_empty() {
        "no adapter on any backend".to_owned()
    } else {
        found
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Errors of the GPU layer.
#[derive(Debug, Error)]
pub enum GpuError {
    /// A device name that is not one of `"gpu"`, `"vulkan"`, `"metal"`.
    #[error("unknown GPU device name {name:?}: expected \"gpu\", \"vulkan\" or \"metal\"")]
    UnknownDevice {
        /// The name given.
        name: String,
    },
    /// No adapter of the requested kind exists on this machine.
    #[error("no {wanted} adapter found (looked on backends {backends}); found: {}", list(.found))]
    DeviceUnavailable {
        /// What was looked for (`"gpu"`, `"vulkan"`, `"metal"`).
        wanted: String,
        /// The wgpu backends searched.
        backends: String,
        /// Every adapter found on any backend (empty when none).
        found: Vec<AdapterSummary>,
    },
    /// The adapter exists but refused to create a device.
    #[error("adapter {adapter} refused to open a device: {message}")]
    DeviceRequest {
        /// The adapter.
        adapter: AdapterSummary,
        /// wgpu's reason.
        message: String,
    },
    /// The device was lost (driver reset, device destroyed); nothing on it can be used.
    #[error("the GPU device was lost: {message}")]
    DeviceLost {
        /// The driver's reason.
        message: String,
    },
    /// A buffer larger than the device allows: a per-buffer limit of the adapter
    /// ([`crate::GpuContext::max_buffer_bytes`]), not its free memory.
    #[error("a {what} of {bytes} bytes exceeds the device's per-buffer limit of {limit} bytes (the adapter's max_storage_buffer_binding_size / max_buffer_size: a limit on one buffer, not the free memory)")]
    BufferTooLarge {
        /// What was being allocated.
        what: &'static str,
        /// The requested size.
        bytes: u64,
        /// The device's largest buffer, in bytes.
        limit: u64,
    },
    /// The device ran out of memory.
    #[error("the GPU ran out of memory during {during}: {message}")]
    OutOfMemory {
        /// The operation.
        during: String,
        /// wgpu's message.
        message: String,
    },
    /// wgpu rejected an operation (validation error, internal error).
    #[error("wgpu rejected {during}: {message}")]
    Wgpu {
        /// The operation.
        during: String,
        /// wgpu's message.
        message: String,
    },
    /// Mapping a buffer for reading failed or the wait for the GPU failed.
    #[error("reading a GPU buffer back failed: {message}")]
    Readback {
        /// The cause.
        message: String,
    },
    /// A buffer created by another [`crate::GpuContext`] (another device, or another opening
    /// of the same one) passed to this one: wgpu does not reliably reject it, so it is checked
    /// before anything is recorded.
    #[error(
        "{op}: {what} belongs to another GPU context (opened on {owner}), not to this one ({this})"
    )]
    ForeignBuffer {
        /// The operation.
        op: &'static str,
        /// Which operand.
        what: String,
        /// The adapter of the buffer's context.
        owner: String,
        /// The adapter of the context used.
        this: String,
    },
    /// Sizes that disagree with each other or with a buffer.
    #[error("{op}: {message}")]
    Shape {
        /// The kernel.
        op: &'static str,
        /// What disagreed, with the values.
        message: String,
    },
}

/// Results of the GPU layer.
pub type Result<T> = std::result::Result<T, GpuError>;
