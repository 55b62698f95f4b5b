//! Moving a model between devices.

use crate::error::Result;
use crate::model::DecoderOnlyTransformer;
use riftco_autograd::Variable;
use riftco_tensor::Device;

impl DecoderOnlyTransformer {
    /// The device the weights live on (the token embedding's; [`Self::to_device`] keeps every
    /// parameter on one device).
    pub fn device(&self) -> Device {
        self.weights().embed.value().device()
    }

    /// Every parameter (base and LoRA) and its gradient, moved to `device` in place, like
    /// PyTorch's `module.to(device)`. Each transfer bumps the tensor's version, so graphs
    /// recorded before are stale, and decode sessions opened before refuse to decode (their
    /// K/V cache lives on the old device). Optimizers hold their moments on the device the
    /// parameters had when they were built: build them after moving the model. Moving to the
    /// current device is a no-op apart from the version bumps.
    ///
    /// A GPU device (`Vulkan`, `Metal`) is opened on first use through the GPU backend
    /// (`riftco_gpu::install_device`; the `gpu` feature, on by default). Ops without a GPU
    /// kernel yet fail on it with `TensorError::Unsupported` naming the op.
    ///
    /// Quantized frozen weights move as their quantized bytes, bit for bit (the GPU reads
    /// them dequantized a block at a time, as the CPU does; `memory_stats` counts the
    /// quantized bytes on the device); 16-bit frozen weights live on the CPU only.
    ///
    /// # Errors
    /// [`TransformerError::Config`](crate::TransformerError::Config) while an owner holds the
    /// parameters between uses ([`crate::residency`]).
    /// `TransformerError::Config` (field `device`) for a model whose frozen weights are
    /// stored in bfloat16 or float16 moving off the CPU; `TensorError::InvalidArgument` for
    /// quantized ones moving to a device whose backend keeps no quantized buffers (the mirror
    /// test backend; the parameters already moved are moved back);
    /// `TensorError::DeviceUnavailable` for a device without backend (for a GPU device, naming
    /// what was looked for and the adapters found); `OutOfMemory` when a copy cannot be
    /// allocated — then every parameter already moved is moved back, so the model is never
    /// split across devices.
    pub fn to_device(&mut self, device: Device) -> Result<()> {
        self.refuse_while_sharded("to_device")?;
        if device != Device::Cpu {
            let half = self
                .weights()
                .base_parameters()
                .find_map(|(_, v)| v.value().half_dtype());
            if let Some(h) = half {
                return Err(crate::TransformerError::Config {
                    field: "device",
                    value: format!("{:?}", device.name()),
                    reason: format!(
                        "the frozen weights are stored in {}, which lives on the CPU only \
                         (16-bit storage has no GPU path; quantized and float32 weights move): \
                         call set_frozen_weights_dtype(float32), or a quantized format, before \
                         moving the model to {device}",
                        h.name()
                    ),
                });
            }
        }
        let mut params: Vec<Variable> = self
            .weights()
            .named_base_parameters()
            .into_iter()
            .map(|(_, p)| p)
            .collect();
        params.extend(
            self.weights()
                .named_lora_parameters()
                .into_iter()
                .map(|(_, p)| p),
        );
        move_parameters(&params, device)?;
        self.revision().bump("to_device");
        Ok(())
    }
}

/// The backend of `device`, opening the GPU backend for a GPU device on first use.
fn open_backend(device: Device) -> Result<()> {
    #[cfg(feature = "gpu")]
    if Device::GPUS.contains(&device) && riftco_tensor::backend::for_device(device).is_err() {
        riftco_gpu::install_device(device)?;
    }
    riftco_tensor::backend::for_device(device)?;
    Ok(())
}

/// [`Device::parse`] that also opens the GPU backend for `"gpu"`, `"vulkan"` and `"metal"`
/// (the `gpu` feature): `"gpu"` names the best adapter's device (Metal on macOS, Vulkan
/// elsewhere).
///
/// # Errors
/// `TensorError::InvalidArgument` for an unknown name (listing the valid ones);
/// `TensorError::DeviceUnavailable` when the GPU asked for has no adapter (naming what was
/// looked for and what was found).
pub fn resolve_device(name: &str) -> Result<Device> {
    #[cfg(feature = "gpu")]
    if name.eq_ignore_ascii_case("gpu") {
        let (device, _) = riftco_gpu::install(riftco_gpu::GpuKind::Any)?;
        return Ok(device);
    }
    let device = Device::parse(name)?;
    if Device::GPUS.contains(&device) {
        open_backend(device)?;
    }
    Ok(device)
}

/// Moves every parameter of `params` (and its gradient) to `device` in place (the tensors keep
/// their identity: every `Variable` and optimizer holding them sees the move; each transfer
/// bumps the tensor's version, so graphs recorded before are stale); on a failure moves back,
/// each to the device it came from, those already moved, so they are never split across
/// devices. What `module.to(device)` does in PyTorch.
///
/// # Errors
/// `DeviceUnavailable` for a device without backend; `OutOfMemory` when a copy cannot be
/// allocated.
pub fn move_parameters(params: &[Variable], device: Device) -> Result<()> {
    open_backend(device)?;
    let mut moved = Vec::with_capacity(2 * params.len());
    let mut result = Ok(());
    'outer: for p in params {
        let mut tensors = vec![p.value().clone()];
        tensors.extend(p.grad());
        for mut t in tensors {
            let (back, from) = (t.clone(), t.device());
            if let Err(e) = t.transfer_to(device) {
                result = Err(e);
                break 'outer;
            }
            moved.push((back, from));
        }
    }
    if let Err(e) = result {
        for (mut t, from) in moved {
            // Moving back into memory just released: a failure here leaves that tensor on
            // `device`, which later ops report as a DeviceMismatch.
            let _ = t.transfer_to(from);
        }
        return Err(e.into());
    }
    Ok(())
}
