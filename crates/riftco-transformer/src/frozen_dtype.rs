//! Frozen weights in 16-bit storage: a model's frozen base weights (the base under LoRA) can be
//! kept in bfloat16 or float16 while every op still computes in float32. Each op that reads such
//! a weight gets it upcast to f32 (exactly) in a transient copy of that one weight, counted as
//! workspace while it lives, so the model holds no f32 copy of itself and a block's upcasts live
//! only for that block's op. Trainable weights (LoRA adapters; fully trained weights) and their
//! Adam state stay float32.
//!
//! Frozen matrices can also be kept block-quantized ([`WeightDtype::Quantized`]: QLoRA's NF4,
//! GGML's Q8_0, Q4_0, Q4_K, ...), dequantized a block of rows at a time by the ops that read
//! them, on the CPU and on a GPU device alike; 16-bit storage lives on the CPU only.

use crate::error::{Result, TransformerError};
use crate::layout;
use crate::model::DecoderOnlyTransformer;
use riftco_autograd::Variable;
use riftco_tensor::{Device, HalfDtype, QuantFormat};
use std::fmt;
use std::str::FromStr;

/// The storage format of a model's frozen weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WeightDtype {
    /// 4 bytes per element (the default).
    #[default]
    Float32,
    /// bfloat16: 2 bytes, float32's exponent range, 8 significant bits.
    BFloat16,
    /// IEEE float16: 2 bytes, 11 significant bits, finite up to 65504 (larger weights become
    /// infinite).
    Float16,
    /// A block-quantized format (QLoRA's NF4, GGML's Q8_0, Q4_0, Q4_K, ...): the frozen
    /// matrices are kept in it and dequantized a block at a time by the ops that read them;
    /// 1-D weights (the RMSNorm gains) stay float32.
    Quantized(QuantFormat),
}

impl WeightDtype {
    /// Every dtype's name: PyTorch's for the floating-point ones, then the quantized formats'.
    pub const NAMES: [&'static str; 14] = [
        "float32", "bfloat16", "float16", "nf4", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k",
        "q3_k", "q4_k", "q5_k", "q6_k",
    ];

    /// The name: `"float32"`, `"bfloat16"`, `"float16"`, or the quantized format's (`"nf4"`,
    /// `"q4_0"`, `"q4_k"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            WeightDtype::Float32 => "float32",
            WeightDtype::BFloat16 => "bfloat16",
            WeightDtype::Float16 => "float16",
            WeightDtype::Quantized(f) => f.name(),
        }
    }

    pub(crate) fn half(self) -> Option<HalfDtype> {
        match self {
            WeightDtype::Float32 | WeightDtype::Quantized(_) => None,
            WeightDtype::BFloat16 => Some(HalfDtype::BFloat16),
            WeightDtype::Float16 => Some(HalfDtype::Float16),
        }
    }

    /// The quantized format, if this is one.
    pub fn quant_format(self) -> Option<QuantFormat> {
        match self {
            WeightDtype::Quantized(f) => Some(f),
            _ => None,
        }
    }
}

impl fmt::Display for WeightDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WeightDtype {
    type Err = TransformerError;

    /// A name of [`WeightDtype::NAMES`] (case-insensitive).
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "float32" => Ok(WeightDtype::Float32),
            "bfloat16" => Ok(WeightDtype::BFloat16),
            "float16" => Ok(WeightDtype::Float16),
            other if QuantFormat::from_name(other).is_some() => Ok(WeightDtype::Quantized(
                QuantFormat::from_name(other).unwrap_or(QuantFormat::Nf4),
            )),
            _ => Err(TransformerError::Config {
                field: "dtype",
                value: format!("{s:?}"),
                reason: format!("expected one of {:?}", Self::NAMES),
            }),
        }
    }
}

impl DecoderOnlyTransformer {
    /// How the frozen base weights are stored: the quantized format holding the most elements
    /// when any is quantized (a GGUF file may mix formats), else the format of the first frozen
    /// one (all are converted together), float32 when none is frozen.
    pub fn frozen_weights_dtype(&self) -> WeightDtype {
        let frozen = || {
            self.weights()
                .base_parameters()
                .filter(|(_, v)| !v.requires_grad())
        };
        // A GGUF file mixes formats (a Q4_1 file keeps its embedding in Q8_0): the one holding
        // the most elements names the base.
        let mut counts: Vec<(QuantFormat, usize)> = Vec::new();
        for (_, v) in frozen() {
            if let Some(f) = v.value().quant_format() {
                match counts.iter_mut().find(|(g, _)| *g == f) {
                    Some((_, n)) => *n += v.value().numel(),
                    None => counts.push((f, v.value().numel())),
                }
            }
        }
        if let Some(&(f, _)) = counts.iter().max_by_key(|(_, n)| *n) {
            return WeightDtype::Quantized(f);
        }
        frozen()
            .find_map(|(_, v)| v.value().half_dtype())
            .map_or(WeightDtype::Float32, |h| match h {
                HalfDtype::BFloat16 => WeightDtype::BFloat16,
                HalfDtype::Float16 => WeightDtype::Float16,
            })
    }

    /// Stores every frozen base weight in `dtype` (rounded to nearest, ties to even), or back in
    /// float32 (an exact upcast), while every op keeps computing in float32. `memory_stats()`
    /// shows the parameter bytes of the frozen weights halved. A model's logits with bfloat16
    /// frozen weights are bitwise those of an f32 model holding the same rounded values: reads
    /// upcast exactly and the kernels are the same. Like [`DecoderOnlyTransformer::enable_lora`],
    /// it replaces the weight set: decode sessions opened before refuse to decode. While both
    /// sets are alive (during the call, or while an older graph holds the old one) the frozen
    /// weights exist in both formats.
    ///
    /// # Errors
    /// [`TransformerError::Config`] while an owner holds the
    /// parameters between uses ([`crate::residency`]).
    /// [`TransformerError::Config`] (field `dtype`) when no base weight is frozen and `dtype` is
    /// not float32 (trainable weights stay float32: enable LoRA first, which freezes the base),
    /// or when the model is on another device than the CPU and `dtype` is 16-bit (16-bit
    /// storage is CPU-only: move the model back, or use float32 or a quantized format there);
    /// the quantizer's error for a weight it cannot quantize; out of memory; device errors. On
    /// error the model is unchanged.
    ///
    /// On a GPU model a quantized format is applied on the CPU (each weight read back, quantized
    /// there, its bytes uploaded), and float32 dequantizes on the device.
    pub fn set_frozen_weights_dtype(&mut self, dtype: WeightDtype) -> Result<()> {
        self.refuse_while_sharded("set_frozen_weights_dtype")?;
        let device = self.device();
        if dtype.half().is_some() && device != Device::Cpu {
            return Err(TransformerError::Config {
                field: "dtype",
                value: format!("{:?}", dtype.name()),
                reason: format!(
                    "{} frozen weights are stored on the CPU only (16-bit storage has no GPU \
                     path); this model is on device {device}: keep float32 or a quantized \
                     format there, or move the model to the CPU first",
                    dtype.name()
                ),
            });
        }
        let mut w = (**self.weights()).clone();
        let mut converted = 0usize;
        for e in layout::entries_for(&w.config).collect::<Vec<_>>() {
            let Some(v) = w.parameter_mut(e.place) else {
                continue;
            };
            if v.requires_grad() {
                continue;
            }
            let cannot = |err: riftco_tensor::TensorError| TransformerError::Config {
                field: "dtype",
                value: format!("{:?}", dtype.name()),
                reason: format!("cannot store {} in {}: {err}", e.hf_name(), dtype.name()),
            };
            let value = match dtype {
                WeightDtype::Float32 if !v.value().is_compressed() => continue,
                WeightDtype::Float32 => v.value().to_float32()?,
                WeightDtype::Quantized(f) if v.value().quant_format() == Some(f) => continue,
                // Vectors (the RMSNorm gains) stay as they are: formats quantize matrices.
                WeightDtype::Quantized(_) if v.value().dims().len() != 2 => continue,
                WeightDtype::Quantized(f)
                    if not_whole_blocks(&e.hf_name(), v.value().dims(), f).is_some() =>
                {
                    return Err(TransformerError::Config {
                        field: "dtype",
                        value: format!("{:?}", dtype.name()),
                        reason: not_whole_blocks(&e.hf_name(), v.value().dims(), f)
                            .unwrap_or_default(),
                    });
                }
                WeightDtype::Quantized(f) if device == Device::Cpu => {
                    v.value().to_quantized(f).map_err(cannot)?
                }
                WeightDtype::Quantized(f) => {
                    // Quantized on the CPU, then its bytes uploaded.
                    let host = riftco_tensor::Tensor::from_vec(
                        v.value().to_host()?,
                        v.value().shape().clone(),
                        v.value().category(),
                    )?;
                    let mut q = host.to_quantized(f).map_err(cannot)?;
                    drop(host);
                    q.transfer_to(device)?;
                    q
                }
                WeightDtype::BFloat16 | WeightDtype::Float16 => {
                    let h = dtype.half().unwrap_or(HalfDtype::BFloat16);
                    if v.value().half_dtype() == Some(h) {
                        continue;
                    }
                    v.value().to_half(h).map_err(cannot)?
                }
            };
            *v = Variable::named_leaf(value, false, e.hf_name());
            converted += 1;
        }
        let frozen = w
            .base_parameters()
            .filter(|(_, v)| !v.requires_grad())
            .count();
        if frozen == 0 && dtype != WeightDtype::Float32 {
            return Err(TransformerError::Config {
                field: "dtype",
                value: format!("{:?}", dtype.name()),
                reason: format!(
                    "the model has no frozen weights to store in {}: trainable weights stay \
                     float32 (enable LoRA first, which freezes the base weights)",
                    dtype.name()
                ),
            });
        }
        if converted > 0 {
            w.retie();
            self.set_weights(w, "set_frozen_weights_dtype");
        }
        Ok(())
    }

    /// Whether any base weight is stored in 16 bits or quantized.
    pub fn has_half_weights(&self) -> bool {
        self.weights()
            .base_parameters()
            .any(|(_, v)| v.value().is_compressed())
    }
}

/// Why a matrix `name` of `shape` cannot be stored in `format` (its rows are not whole blocks),
/// or `None` when it can.
pub(crate) fn not_whole_blocks(name: &str, shape: &[usize], format: QuantFormat) -> Option<String> {
    let block = format.block_elements();
    match shape {
        [_, cols] if cols % block == 0 => None,
        _ => Some(format!(
            "cannot store {name} (shape {shape:?}) in {format}: {format} keeps matrices whose \
             rows are whole blocks of {block} elements (cols a multiple of {block}); pick a \
             format with smaller blocks (q8_0, q4_0, q4_1, q5_0, q5_1: 32; nf4: 64)"
        )),
    }
}
