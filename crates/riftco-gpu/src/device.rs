//! Device selection: [`GpuKind`] (the names `"gpu"`, `"vulkan"`, `"metal"`), adapter
//! enumeration and the headless adapter/device request.

use std::str::FromStr;

use crate::error::{AdapterSummary, GpuError, Result};

/// Which GPU to open.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuKind {
    /// `"gpu"`: the best adapter on any native backend (discrete before integrated before
    /// virtual before software).
    Any,
    /// `"vulkan"`: wgpu's Vulkan backend only (Linux, Windows; Mesa's llvmpipe counts).
    Vulkan,
    /// `"metal"`: wgpu's Metal backend only (macOS).
    Metal,
}

impl GpuKind {
    /// The device name that parses into this kind.
    pub fn name(self) -> &'static str {
        match self {
            GpuKind::Any => "gpu",
            GpuKind::Vulkan => "vulkan",
            GpuKind::Metal => "metal",
        }
    }

    /// The wgpu backends searched for this kind.
    pub fn backends(self) -> wgpu::Backends {
        match self {
            GpuKind::Any => wgpu::Backends::VULKAN | wgpu::Backends::METAL,
            GpuKind::Vulkan => wgpu::Backends::VULKAN,
            GpuKind::Metal => wgpu::Backends::METAL,
        }
    }
}

impl FromStr for GpuKind {
    type Err = GpuError;

    /// `"gpu"`, `"vulkan"` or `"metal"` (exact, lower case).
    ///
    /// # Errors
    /// [`GpuError::UnknownDevice`] naming the string for anything else.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "gpu" => Ok(GpuKind::Any),
            "vulkan" => Ok(GpuKind::Vulkan),
            "metal" => Ok(GpuKind::Metal),
            other => Err(GpuError::UnknownDevice {
                name: other.to_owned(),
            }),
        }
    }
}

impl std::fmt::Display for GpuKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The summary of one wgpu adapter.
pub(crate) fn summarize(info: &wgpu::AdapterInfo) -> AdapterSummary {
    let driver = match (info.driver.is_empty(), info.driver_info.is_empty()) {
        (false, false) => format!("{} {}", info.driver, info.driver_info),
        (false, true) => info.driver.clone(),
        (true, _) => info.driver_info.clone(),
    };
    AdapterSummary {
        name: info.name.clone(),
        backend: info.backend.to_str().to_owned(),
        device_type: format!("{:?}", info.device_type),
        driver,
    }
}

/// Preference order of device types: lower is better.
fn rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    }
}

/// Every adapter on every native backend this build knows (Vulkan, Metal), as summaries.
pub fn list_adapters() -> Vec<AdapterSummary> {
    let instance = new_instance(wgpu::Backends::VULKAN | wgpu::Backends::METAL);
    pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()))
        .iter()
        .map(|a| summarize(&a.get_info()))
        .collect()
}

pub(crate) fn new_instance(backends: wgpu::Backends) -> wgpu::Instance {
    ensure_xdg_runtime_dir();
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends;
    wgpu::Instance::new(desc)
}

/// Mesa's Vulkan drivers (llvmpipe among them) print `error: XDG_RUNTIME_DIR is invalid or not
/// set in the environment.` on stderr for every instance created without a desktop session's
/// runtime folder (headless servers, containers, CI): an `error:` a user cannot act on and that
/// is not riftco's. When the variable is unset, or does not name a directory by an absolute path
/// (libwayland, which Mesa's window-system code loads, rejects a relative one as it rejects none),
/// the process gets a private one once, before its first instance:
/// `$TMPDIR/riftco-xdg-runtime-<uid>` (or under `/tmp` when `$TMPDIR` is relative or unwritable),
/// created with mode 0700 and used only when it is a real directory (not a symlink) owned by this
/// user with exactly that mode, as the XDG Base Directory specification requires of the runtime
/// folder. Otherwise the environment is left as it was. The variable is set under a `Once`
/// before any wgpu call of this process, so no driver thread reads the environment while it
/// changes.
fn ensure_xdg_runtime_dir() {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
        use std::path::{Path, PathBuf};
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            let current = std::env::var_os("XDG_RUNTIME_DIR");
            if current.as_ref().is_some_and(|d| {
                let d = Path::new(d);
                d.is_absolute() && d.is_dir()
            }) {
                return;
            }
            // The owner of /proc/self is this process's user: no libc call needed for the uid.
            let Ok(uid) = std::fs::metadata("/proc/self").map(|m| m.uid()) else {
                return;
            };
            let name = format!("riftco-xdg-runtime-{uid}");
            let usable = |dir: &PathBuf| {
                let _ = std::fs::DirBuilder::new().mode(0o700).create(dir);
                std::fs::symlink_metadata(dir).is_ok_and(|m| {
                    m.is_dir() && m.uid() == uid && m.permissions().mode() & 0o777 == 0o700
                })
            };
            let found = [std::env::temp_dir(), PathBuf::from("/tmp")]
                .into_iter()
                .filter(|base| base.is_absolute())
                .map(|base| base.join(&name))
                .find(usable);
            if let Some(dir) = found {
                std::env::set_var("XDG_RUNTIME_DIR", &dir);
            }
        });
    }
}

/// The best adapter of `kind` (headless: no surface), or [`GpuError::DeviceUnavailable`] naming
/// `kind` and every adapter found on any backend.
pub(crate) fn pick_adapter(kind: GpuKind) -> Result<(wgpu::Instance, wgpu::Adapter)> {
    let backends = kind.backends();
    let instance = new_instance(backends);
    let mut adapters = pollster::block_on(instance.enumerate_adapters(backends));
    adapters.sort_by_key(|a| rank(a.get_info().device_type));
    match adapters.into_iter().next() {
        Some(adapter) => Ok((instance, adapter)),
        None => Err(GpuError::DeviceUnavailable {
            wanted: kind.name().to_owned(),
            backends: format!("{backends:?}"),
            found: list_adapters(),
        }),
    }
}
