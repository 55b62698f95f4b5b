//! Element types of model-state tensors: what is read (F32, BF16, F16, converted exactly to
//! f32) and what is written (F32, or BF16 rounded to nearest even).

use super::state_err;
use crate::error::Result;
use half::{bf16, f16};

use safetensors::Dtype;
use std::path::Path;

/// The element type a model state is saved in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StateDtype {
    /// IEEE 754 binary32, exact (the default).
    #[default]
    F32,
    /// bfloat16 (8 exponent bits, 7 mantissa bits): each f32 rounded to the nearest bfloat16,
    /// ties to even (NaN stays NaN). Half the bytes, for exchange; training state should stay
    /// f32.
    BF16,
}

impl StateDtype {
    /// The `torch_dtype` name of Hugging Face `config.json` (`"float32"`, `"bfloat16"`).
    pub fn hf_name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::BF16 => "bfloat16",
        }
    }

    /// The safetensors dtype of a `torch_dtype` name riftco reads (`"float32"`, `"bfloat16"`,
    /// `"float16"`), `None` for any other name. `float16` is read but never written.
    pub(super) fn from_hf_name(name: &str) -> Option<Dtype> {
        match name {
            "float32" => Some(Dtype::F32),
            "bfloat16" => Some(Dtype::BF16),
            "float16" => Some(Dtype::F16),
            _ => None,
        }
    }

    /// The safetensors dtype.
    pub(super) fn safetensors(self) -> Dtype {
        match self {
            Self::F32 => Dtype::F32,
            Self::BF16 => Dtype::BF16,
        }
    }

    /// Bytes per element.
    pub(super) fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::BF16 => 2,
        }
    }

    /// Appends the little-endian encoding of `values` to `out`.
    pub(super) fn encode(self, values: &[f32], out: &mut Vec<u8>) {
        match self {
            Self::F32 => out.extend(values.iter().flat_map(|v| v.to_le_bytes())),
            Self::BF16 => out.extend(
                values
                    .iter()
                    .flat_map(|&v| bf16::from_f32(v).to_bits().to_le_bytes()),
            ),
        }
    }
}

/// Whether tensors of `dtype` are read (F32, BF16, F16).
pub(super) fn is_readable(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16)
}

/// The f32 values of the little-endian `bytes` of tensor `name` in `dtype`, converted exactly
/// (BF16 is the upper half of an f32, shifted in bit for bit; F16 values, subnormals and
/// infinities included, are all representable in f32, and an F16 NaN stays a NaN with its
/// payload and the quiet bit set), into a fallibly allocated vector.
///
/// # Errors
/// [`crate::TransformerError::State`] naming the tensor for a dtype that is not read (checked
/// before by [`is_readable`]) or a failed allocation.
pub(super) fn decode(path: &Path, name: &str, dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>> {
    let size = match dtype {
        Dtype::F32 => 4,
        Dtype::BF16 | Dtype::F16 => 2,
        other => {
            return Err(state_err(
                path,
                format!("tensor {name} has dtype {other:?}; riftco reads F32, BF16 and F16"),
            ))
        }
    };
    let mut values = Vec::new();
    values
        .try_reserve_exact(bytes.len() / size)
        .map_err(|_| state_err(path, format!("cannot allocate tensor {name}")))?;
    match dtype {
        Dtype::F32 => values.extend(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
        // The 16 bits are the upper half of the f32, NaN payloads included.
        Dtype::BF16 => values.extend(
            bytes
                .chunks_exact(2)
                .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)),
        ),
        _ => values.extend(
            bytes
                .chunks_exact(2)
                .map(|b| f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()),
        ),
    }
    Ok(values)
}
