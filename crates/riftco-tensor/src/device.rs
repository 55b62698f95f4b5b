//! Devices a tensor can live on.

use std::fmt;

/// Where a tensor's storage lives.
///
/// `Cpu` is always available. `Metal` exists in the enum on every platform so that code and
/// configuration are portable, but a build without the Metal backend (every non-macOS build)
/// answers [`Device::check_available`] with [`crate::TensorError::DeviceUnavailable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// Host memory, CPU kernels.
    #[default]
    Cpu,
    /// Apple GPU through Metal (macOS builds with the `metal` feature only).
    Metal,
    /// The device of a backend registered at run time with [`crate::backend::register`]
    /// (PyTorch's `privateuseone`): today the test backend [`crate::backend::mirror`], which
    /// proves that every op reaches its kernels through the backend trait.
    PrivateUse1,
}

impl Device {
    /// Every device, in [`Device::index`] order.
    pub const ALL: [Device; 3] = [Device::Cpu, Device::Metal, Device::PrivateUse1];

    /// The lowercase name used by the Python and C APIs (`"cpu"`, `"metal"`, `"privateuseone"`).
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Metal => "metal",
            Device::PrivateUse1 => "privateuseone",
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

    /// Parses `"cpu"` or `"metal"` (case-insensitive).
    ///
    /// # Errors
    /// [`crate::TensorError::InvalidArgument`] naming the string and the valid names.
    pub fn parse(name: &str) -> crate::Result<Self> {
        match name.to_ascii_lowercase().as_str() {
            "cpu" => Ok(Device::Cpu),
            "metal" => Ok(Device::Metal),
            "privateuseone" => Ok(Device::PrivateUse1),
            _ => Err(crate::TensorError::InvalidArgument {
                op: "Device::parse",
                message: format!(
                    "unknown device {name:?}; expected one of \"cpu\", \"metal\", \"privateuseone\""
                ),
            }),
        }
    }

    /// `Ok(())` when tensors can be placed on this device in this build.
    ///
    /// # Errors
    /// [`crate::TensorError::DeviceUnavailable`] for `Metal` on builds without the Metal backend,
    /// and for `PrivateUse1` while no backend is registered for it.
    pub fn check_available(self) -> crate::Result<()> {
        match self {
            Device::Cpu => Ok(()),
            Device::PrivateUse1 => crate::backend::for_device(self).map(|_| ()),
            Device::Metal => Err(crate::TensorError::DeviceUnavailable {
                device: self,
                reason: if cfg!(target_os = "macos") {
                    "riftco's Metal backend is not implemented yet; use \"cpu\"".into()
                } else {
                    "Metal exists only on macOS (and riftco's Metal backend is not implemented \
                     yet); use \"cpu\""
                        .into()
                },
            }),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
