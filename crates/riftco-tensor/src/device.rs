//! Devices a tensor can live on.

use std::fmt;

/// Where a tensor's storage lives.
///
/// `Cpu` is always available. The GPU devices (`Metal`, `Vulkan`) exist in the enum on every
/// platform so that code and configuration are portable; they are available once the GPU
/// backend (`riftco_gpu::install`) has registered a backend for them, which needs an adapter of
/// that kind (Metal: macOS only). Until then [`Device::check_available`] answers
/// [`crate::TensorError::DeviceUnavailable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// Host memory, CPU kernels.
    #[default]
    Cpu,
    /// Apple GPU through Metal (wgpu's Metal backend; macOS only).
    Metal,
    /// The device of a backend registered at run time with [`crate::backend::register`]
    /// (PyTorch's `privateuseone`): today the test backend [`crate::backend::mirror`], which
    /// proves that every op reaches its kernels through the backend trait.
    PrivateUse1,
    /// A GPU through Vulkan (wgpu's Vulkan backend; Mesa's software Vulkan, llvmpipe, in CI).
    Vulkan,
}

impl Device {
    /// Every device, in [`Device::index`] order.
    pub const ALL: [Device; 4] = [
        Device::Cpu,
        Device::Metal,
        Device::PrivateUse1,
        Device::Vulkan,
    ];

    /// The GPU devices, in the order `"gpu"` prefers them when both have a backend.
    pub const GPUS: [Device; 2] = [Device::Metal, Device::Vulkan];

    /// The lowercase name used by the Python and C APIs (`"cpu"`, `"metal"`, `"privateuseone"`,
    /// `"vulkan"`).
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Metal => "metal",
            Device::PrivateUse1 => "privateuseone",
            Device::Vulkan => "vulkan",
        }
    }

    /// The position in [`Device::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The device at `index` in [`Device::ALL`] (`Cpu` for an index past the end).
    pub fn from_index(index: usize) -> Self {
        Self::ALL.get(index).copied().unwrap_or(Device::Cpu)
    }

    /// Parses `"cpu"`, `"metal"`, `"privateuseone"`, `"vulkan"` or `"gpu"` (case-insensitive).
    /// `"gpu"` names the device of the GPU backend that is registered (Metal before Vulkan
    /// when both are; see [`Device::GPUS`]).
    ///
    /// # Errors
    /// [`crate::TensorError::InvalidArgument`] naming the string and the valid names;
    /// [`crate::TensorError::GpuUnavailable`] for `"gpu"` while no GPU backend is registered
    /// (naming what was looked for and the devices that have a backend).
    pub fn parse(name: &str) -> crate::Result<Self> {
        match name.to_ascii_lowercase().as_str() {
            "cpu" => Ok(Device::Cpu),
            "metal" => Ok(Device::Metal),
            "privateuseone" => Ok(Device::PrivateUse1),
            "vulkan" => Ok(Device::Vulkan),
            "gpu" => Self::best_gpu(),
            _ => Err(crate::TensorError::InvalidArgument {
                op: "device",
                message: format!(
                    "unknown device {name:?}; expected one of \"cpu\", \"vulkan\", \"metal\", \
                     \"gpu\" (any case), or the test backend's \"privateuseone\""
                ),
            }),
        }
    }

    /// The GPU device `"gpu"` names: the first of [`Device::GPUS`] with a registered backend.
    ///
    /// # Errors
    /// [`crate::TensorError::GpuUnavailable`] naming the devices that were looked for and those
    /// found.
    pub fn best_gpu() -> crate::Result<Self> {
        let found = crate::backend::registered_devices();
        if let Some(d) = Self::GPUS.into_iter().find(|d| found.contains(d)) {
            return Ok(d);
        }
        let names: Vec<&str> = std::iter::once("cpu")
            .chain(found.iter().map(|d| d.name()))
            .collect();
        Err(crate::TensorError::GpuUnavailable {
            reason: format!(
                "\"gpu\" looked for a GPU backend (\"metal\" or \"vulkan\") and found none \
                 registered (devices with a backend: {}); open one with \
                 riftco_gpu::install (it needs a GPU adapter; Mesa's software Vulkan works)",
                names.join(", ")
            ),
        })
    }

    /// `Ok(())` when tensors can be placed on this device in this build.
    ///
    /// # Errors
    /// [`crate::TensorError::DeviceUnavailable`] for every device but `Cpu` while no backend is
    /// registered for it (the message says how to register one).
    pub fn check_available(self) -> crate::Result<()> {
        crate::backend::for_device(self).map(|_| ())
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
