//! llama.cpp's tensor types (GGML) and their dequantization to `f32`.
//!
//! [`GgmlType`] lists every type a GGUF file may declare, with its block layout (elements per
//! block, bytes per block), so a reader can size any tensor. [`dequantize`] turns whole blocks of
//! the types riftco reads into `f32`: F32, F16, BF16, the 32-element "legacy" blocks Q4_0,
//! Q4_1, Q5_0, Q5_1, Q8_0 ([`legacy`]) and the 256-element "K-quant" super-blocks Q2_K, Q3_K,
//! Q4_K, Q5_K, Q6_K ([`k_quants`]).
//!
//! The values are bitwise those of the reference dequantization, `gguf.quants.dequantize` of
//! llama.cpp's `gguf` Python package (`gguf-py/gguf/quants.py`, which mirrors
//! `dequantize_row_*` of `ggml-quants.c`): every block scale stored as f16 is widened to f32
//! exactly, and each value is computed with the reference's float32 operations in the
//! reference's order (`d * q` then `- m` or `+ m`; never a fused multiply-add). The code is
//! scalar (no run-time SIMD dispatch), so the result is the same at every SIMD level.
//!
//! Each block format is a type implementing [`BlockFormat`] (its layout and the dequantization
//! of one block). [`quantize`] writes a whole tensor in any [`QuantFormat`] with the bytes of
//! the format's reference quantizer (`gguf.quants`, llama.cpp's `quantize_row_*_ref`,
//! bitsandbytes' `quantize_4bit`; see [`format::quantize`]).

pub mod blocked;
pub mod format;
pub mod k_quants;
pub mod legacy;
mod matvec;
pub mod nf4;
#[cfg(target_arch = "x86_64")]
mod simd_x86;

pub use format::{dequantize_range, matvec, quantize, QuantFormat};

use std::fmt;

/// A GGML tensor type: its numeric id in GGUF files (`ggml_type` of `ggml.h`), its name and its
/// block layout. Ids 4 and 5 (the removed Q4_2 and Q4_3) and 31..=33 are unassigned.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// 32 elements: an f16 scale and 4-bit quants offset by 8.
    Q4_0,
    /// 32 elements: f16 scale and minimum, 4-bit quants.
    Q4_1,
    /// 32 elements: an f16 scale, 5-bit quants offset by 16.
    Q5_0,
    /// 32 elements: f16 scale and minimum, 5-bit quants.
    Q5_1,
    /// 32 elements: an f16 scale, 8-bit signed quants.
    Q8_0,
    /// 32 elements: f32 scale and sum, 8-bit quants (an intermediate type of llama.cpp).
    Q8_1,
    /// 256 elements: 2-bit quants in 16 groups with 4-bit scales and minimums.
    Q2_K,
    /// 256 elements: 3-bit quants in 16 groups with 6-bit scales.
    Q3_K,
    /// 256 elements: 4-bit quants in 8 groups with 6-bit scales and minimums.
    Q4_K,
    /// 256 elements: 5-bit quants in 8 groups with 6-bit scales and minimums.
    Q5_K,
    /// 256 elements: 6-bit quants in 16 groups with 8-bit scales.
    Q6_K,
    /// 256 elements: 8-bit quants (an intermediate type of llama.cpp).
    Q8_K,
    /// An importance-matrix type (2.06 bits per weight).
    IQ2_XXS,
    /// An importance-matrix type (2.31 bits per weight).
    IQ2_XS,
    /// An importance-matrix type (3.06 bits per weight).
    IQ3_XXS,
    /// An importance-matrix type (1.56 bits per weight).
    IQ1_S,
    /// A non-linear 4-bit type in 32-element blocks.
    IQ4_NL,
    /// An importance-matrix type (3.44 bits per weight).
    IQ3_S,
    /// An importance-matrix type (2.5 bits per weight).
    IQ2_S,
    /// A non-linear 4-bit type in 256-element blocks.
    IQ4_XS,
    /// 8-bit integers.
    I8,
    /// 16-bit integers.
    I16,
    /// 32-bit integers.
    I32,
    /// 64-bit integers.
    I64,
    /// IEEE binary64.
    F64,
    /// An importance-matrix type (1.75 bits per weight).
    IQ1_M,
    /// bfloat16.
    BF16,
    /// Ternary, 1.69 bits per weight.
    TQ1_0,
    /// Ternary, 2.06 bits per weight.
    TQ2_0,
    /// OCP microscaling FP4 (E2M1 values, an E8M0 scale per 32).
    MXFP4,
    /// NVIDIA FP4 (E2M1 values, FP8 scales per 16).
    NVFP4,
    /// 1-bit quants in 128-element blocks.
    Q1_0,
}

impl GgmlType {
    /// Every type, in id order.
    pub const ALL: [GgmlType; 34] = [
        Self::F32,
        Self::F16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q8_1,
        Self::Q2_K,
        Self::Q3_K,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
        Self::Q8_K,
        Self::IQ2_XXS,
        Self::IQ2_XS,
        Self::IQ3_XXS,
        Self::IQ1_S,
        Self::IQ4_NL,
        Self::IQ3_S,
        Self::IQ2_S,
        Self::IQ4_XS,
        Self::I8,
        Self::I16,
        Self::I32,
        Self::I64,
        Self::F64,
        Self::IQ1_M,
        Self::BF16,
        Self::TQ1_0,
        Self::TQ2_0,
        Self::MXFP4,
        Self::NVFP4,
        Self::Q1_0,
    ];

    /// The types [`dequantize`] reads.
    pub const DEQUANTIZED: [GgmlType; 13] = [
        Self::F32,
        Self::F16,
        Self::BF16,
        Self::Q8_0,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q2_K,
        Self::Q3_K,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
    ];

    /// The type of GGUF id `id`, `None` for an id no type has.
    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.id() == id)
    }

    /// The GGUF id (`ggml_type` in `ggml.h`).
    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q8_1 => 9,
            Self::Q2_K => 10,
            Self::Q3_K => 11,
            Self::Q4_K => 12,
            Self::Q5_K => 13,
            Self::Q6_K => 14,
            Self::Q8_K => 15,
            Self::IQ2_XXS => 16,
            Self::IQ2_XS => 17,
            Self::IQ3_XXS => 18,
            Self::IQ1_S => 19,
            Self::IQ4_NL => 20,
            Self::IQ3_S => 21,
            Self::IQ2_S => 22,
            Self::IQ4_XS => 23,
            Self::I8 => 24,
            Self::I16 => 25,
            Self::I32 => 26,
            Self::I64 => 27,
            Self::F64 => 28,
            Self::IQ1_M => 29,
            Self::BF16 => 30,
            Self::TQ1_0 => 34,
            Self::TQ2_0 => 35,
            Self::MXFP4 => 39,
            Self::NVFP4 => 40,
            Self::Q1_0 => 41,
        }
    }

    /// The name llama.cpp gives it (`"Q4_K"`, `"BF16"`).
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q8_1 => "Q8_1",
            Self::Q2_K => "Q2_K",
            Self::Q3_K => "Q3_K",
            Self::Q4_K => "Q4_K",
            Self::Q5_K => "Q5_K",
            Self::Q6_K => "Q6_K",
            Self::Q8_K => "Q8_K",
            Self::IQ2_XXS => "IQ2_XXS",
            Self::IQ2_XS => "IQ2_XS",
            Self::IQ3_XXS => "IQ3_XXS",
            Self::IQ1_S => "IQ1_S",
            Self::IQ4_NL => "IQ4_NL",
            Self::IQ3_S => "IQ3_S",
            Self::IQ2_S => "IQ2_S",
            Self::IQ4_XS => "IQ4_XS",
            Self::I8 => "I8",
            Self::I16 => "I16",
            Self::I32 => "I32",
            Self::I64 => "I64",
            Self::F64 => "F64",
            Self::IQ1_M => "IQ1_M",
            Self::BF16 => "BF16",
            Self::TQ1_0 => "TQ1_0",
            Self::TQ2_0 => "TQ2_0",
            Self::MXFP4 => "MXFP4",
            Self::NVFP4 => "NVFP4",
            Self::Q1_0 => "Q1_0",
        }
    }

    /// `(elements per block, bytes per block)`, as `GGML_QUANT_SIZES` of the `gguf` package
    /// (`QK_K = 256` for the K-quants and the importance-matrix types).
    pub fn block_layout(self) -> (usize, usize) {
        const K: usize = QK_K;
        match self {
            Self::F32 | Self::I32 => (1, 4),
            Self::F16 | Self::BF16 | Self::I16 => (1, 2),
            Self::I8 => (1, 1),
            Self::I64 | Self::F64 => (1, 8),
            Self::Q4_0 | Self::IQ4_NL => (32, 2 + 16),
            Self::Q4_1 => (32, 2 + 2 + 16),
            Self::Q5_0 => (32, 2 + 4 + 16),
            Self::Q5_1 => (32, 2 + 2 + 4 + 16),
            Self::Q8_0 => (32, 2 + 32),
            Self::Q8_1 => (32, 4 + 4 + 32),
            Self::Q2_K => (K, 2 + 2 + K / 16 + K / 4),
            Self::Q3_K => (K, 2 + K / 4 + K / 8 + 12),
            Self::Q4_K => (K, 2 + 2 + K / 2 + 12),
            Self::Q5_K => (K, 2 + 2 + K / 2 + K / 8 + 12),
            Self::Q6_K => (K, 2 + K / 2 + K / 4 + K / 16),
            Self::Q8_K => (K, 4 + K + K / 8),
            Self::IQ2_XXS => (K, 2 + K / 4),
            Self::IQ2_XS => (K, 2 + K / 4 + K / 32),
            Self::IQ3_XXS => (K, 2 + K / 4 + K / 8),
            Self::IQ1_S => (K, 2 + K / 8 + K / 16),
            Self::IQ3_S => (K, 2 + K / 4 + K / 8 + K / 32 + 4),
            Self::IQ2_S => (K, 2 + K / 4 + K / 16),
            Self::IQ4_XS => (K, 2 + 2 + K / 2 + K / 64),
            Self::IQ1_M => (K, K / 8 + K / 16 + K / 32),
            Self::TQ1_0 => (K, 2 + 4 * 13),
            Self::TQ2_0 => (K, 2 + 64),
            Self::MXFP4 => (32, 1 + 16),
            Self::NVFP4 => (64, 4 + 32),
            Self::Q1_0 => (128, 2 + 16),
        }
    }

    /// Whether [`dequantize`] reads this type.
    pub fn is_dequantized(self) -> bool {
        Self::DEQUANTIZED.contains(&self)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Elements of a K-quant super-block (`QK_K` of `ggml-common.h`).
pub const QK_K: usize = 256;

/// The largest magnitude [`format::quantize`] accepts for a GGML format: the largest finite
/// float16. Its block scales and minimums are float16, and a block of larger values would need
/// a scale (or minimum) beyond it; Q8_0, with the widest quants, overflows only past 127 times
/// this, but one bound for every format is simpler to state and never binds for trained weights.
pub const F16_VALUE_LIMIT: f32 = 65504.0;

/// A block format: how many elements a block holds, how many bytes it takes, and how it
/// dequantizes (bitwise as `gguf.quants.dequantize`).
pub trait BlockFormat {
    /// The GGML type.
    const TYPE: GgmlType;
    /// Elements per block.
    const ELEMENTS: usize;
    /// Bytes per block.
    const BYTES: usize;
    /// Writes the `ELEMENTS` values of the block `block` (`BYTES` long) into `out`
    /// (`ELEMENTS` long).
    fn dequantize_block(block: &[u8], out: &mut [f32]);
}

/// Why [`dequantize`], [`dequantize_range`] or [`quantize`] refused its input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QuantError {
    /// The type is not one [`dequantize`] reads.
    Unsupported(GgmlType),
    /// The byte and element counts are not whole blocks of the same number.
    Length {
        /// The type.
        ggml_type: GgmlType,
        /// Bytes given.
        bytes: usize,
        /// Elements asked for.
        elements: usize,
    },
    /// A range of a quantized tensor that is not whole blocks inside it, or storage of the
    /// wrong length for the tensor.
    Range {
        /// The format.
        format: QuantFormat,
        /// Bytes given.
        bytes: usize,
        /// Elements of the tensor.
        numel: usize,
        /// First element asked for.
        start: usize,
        /// Elements asked for.
        len: usize,
    },
    /// Values to quantize that are not a whole number of the format's blocks.
    NotWholeBlocks {
        /// The format.
        format: QuantFormat,
        /// Elements given.
        numel: usize,
    },
    /// A value to quantize that is NaN or infinite (the first one).
    NonFinite {
        /// The format.
        format: QuantFormat,
        /// Its index in the values.
        index: usize,
        /// The value's f32 bits (`f32::from_bits(bits)` is the value; kept as bits so the
        /// error compares with `Eq`).
        bits: u32,
    },
    /// A finite value beyond what a GGML format's float16 block scales can represent (the
    /// first one; see [`F16_VALUE_LIMIT`]).
    OutOfRange {
        /// The format.
        format: QuantFormat,
        /// Its index in the values.
        index: usize,
        /// The value's f32 bits.
        bits: u32,
    },
}

impl fmt::Display for QuantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unsupported(t) => write!(
                f,
                "tensor type {t} (id {}) is not dequantized; riftco reads {}",
                t.id(),
                GgmlType::DEQUANTIZED.map(GgmlType::name).join(", ")
            ),
            Self::Length {
                ggml_type,
                bytes,
                elements,
            } => {
                let (n, b) = ggml_type.block_layout();
                write!(
                    f,
                    "{bytes} bytes of {ggml_type} for {elements} elements: {ggml_type} stores \
                     {n} elements in blocks of {b} bytes, and both must be whole blocks of the \
                     same count"
                )
            }
            Self::Range {
                format,
                bytes,
                numel,
                start,
                len,
            } => write!(
                f,
                "elements {start}..{} of a {format} tensor of {numel} elements in {bytes} bytes: \
                 {format} keeps whole blocks of {} elements ({:?} bytes for {numel} elements), \
                 and a range must be whole blocks inside the tensor",
                start.saturating_add(*len),
                format.block_elements(),
                format.storage_bytes(*numel),
            ),
            Self::NotWholeBlocks { format, numel } => write!(
                f,
                "{numel} values cannot be quantized to {format}: {format} stores whole blocks of \
                 {} elements, and {numel} is not a multiple of {}",
                format.block_elements(),
                format.block_elements(),
            ),
            Self::NonFinite {
                format,
                index,
                bits,
            } => write!(
                f,
                "value {index} is {}: only finite values can be quantized to {format}",
                f32::from_bits(*bits)
            ),
            Self::OutOfRange {
                format,
                index,
                bits,
            } => write!(
                f,
                "value {index} is {}: {format} stores its block scales (and minimums) as \
                 float16, so it holds values of magnitude up to {} only (the reference \
                 quantizers write infinities or NaNs beyond); keep this tensor in float32 or \
                 bfloat16, or use nf4 (float32 scales)",
                f32::from_bits(*bits),
                F16_VALUE_LIMIT
            ),
        }
    }
}

impl std::error::Error for QuantError {}

/// Dequantizes `bytes` (whole blocks of `ggml_type`, little endian, as stored in a GGUF file)
/// into `out` (the same number of blocks' elements), in storage order: element `i` of the
/// tensor, with `ne[0]` the innermost axis.
///
/// Values equal `gguf.quants.dequantize(bytes, ggml_type)` bit for bit (see the module docs);
/// an F16 or BF16 NaN stays a NaN (F16 NaN payloads get the quiet bit).
///
/// # Errors
/// [`QuantError::Unsupported`] for a type outside [`GgmlType::DEQUANTIZED`];
/// [`QuantError::Length`] when `bytes` and `out` are not the same whole number of blocks.
pub fn dequantize(ggml_type: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    use k_quants::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K};
    use legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0};
    match ggml_type {
        GgmlType::F32 => blocks::<F32>(bytes, out),
        GgmlType::F16 => blocks::<F16>(bytes, out),
        GgmlType::BF16 => blocks::<BF16>(bytes, out),
        GgmlType::Q4_0 => blocks::<BlockQ4_0>(bytes, out),
        GgmlType::Q4_1 => blocks::<BlockQ4_1>(bytes, out),
        GgmlType::Q5_0 => blocks::<BlockQ5_0>(bytes, out),
        GgmlType::Q5_1 => blocks::<BlockQ5_1>(bytes, out),
        GgmlType::Q8_0 => blocks::<BlockQ8_0>(bytes, out),
        GgmlType::Q2_K => blocks::<BlockQ2K>(bytes, out),
        GgmlType::Q3_K => blocks::<BlockQ3K>(bytes, out),
        GgmlType::Q4_K => blocks::<BlockQ4K>(bytes, out),
        GgmlType::Q5_K => blocks::<BlockQ5K>(bytes, out),
        GgmlType::Q6_K => blocks::<BlockQ6K>(bytes, out),
        other => Err(QuantError::Unsupported(other)),
    }
}

/// Dequantizes every block of `bytes` into `out` with format `B`.
fn blocks<B: BlockFormat>(bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let whole = bytes.len() % B::BYTES == 0
        && out.len() % B::ELEMENTS == 0
        && bytes.len() / B::BYTES == out.len() / B::ELEMENTS;
    if !whole {
        return Err(QuantError::Length {
            ggml_type: B::TYPE,
            bytes: bytes.len(),
            elements: out.len(),
        });
    }
    for (block, values) in bytes
        .chunks_exact(B::BYTES)
        .zip(out.chunks_exact_mut(B::ELEMENTS))
    {
        B::dequantize_block(block, values);
    }
    Ok(())
}

/// The little-endian bytes of `x` rounded to f16 (to nearest, ties to even; out of range to
/// infinity), as numpy's `astype(np.float16)` and ggml's `GGML_FP32_TO_FP16` round it.
#[inline]
pub(crate) fn f16_bytes(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}

/// The f16 at `bytes[at..at + 2]` (little endian), widened to f32 exactly.
#[inline]
pub(crate) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

/// IEEE binary32 elements.
pub struct F32;

impl BlockFormat for F32 {
    const TYPE: GgmlType = GgmlType::F32;
    const ELEMENTS: usize = 1;
    const BYTES: usize = 4;
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        out[0] = f32::from_le_bytes([block[0], block[1], block[2], block[3]]);
    }
}

/// IEEE binary16 elements, widened exactly (`data.view(np.float16).astype(np.float32)`).
pub struct F16;

impl BlockFormat for F16 {
    const TYPE: GgmlType = GgmlType::F16;
    const ELEMENTS: usize = 1;
    const BYTES: usize = 2;
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        out[0] = f16_at(block, 0);
    }
}

/// bfloat16 elements: the upper 16 bits of an f32 (`int32(bits) << 16`).
pub struct BF16;

impl BlockFormat for BF16 {
    const TYPE: GgmlType = GgmlType::BF16;
    const ELEMENTS: usize = 1;
    const BYTES: usize = 2;
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        out[0] = f32::from_bits(u32::from(u16::from_le_bytes([block[0], block[1]])) << 16);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_names_and_layouts_are_consistent() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            let (n, b) = t.block_layout();
            assert!(n > 0 && b > 0, "{t}");
        }
        for id in [4, 5, 31, 32, 33, 36, 42, u32::MAX] {
            assert_eq!(GgmlType::from_id(id), None, "{id}");
        }
        assert_eq!(GgmlType::Q6_K.to_string(), "Q6_K");
        assert!(GgmlType::DEQUANTIZED.iter().all(|t| t.is_dequantized()));
        assert!(!GgmlType::IQ2_XXS.is_dequantized());
    }

    #[test]
    fn the_format_types_agree_with_the_layout_table() {
        fn check<B: BlockFormat>() {
            assert_eq!(
                B::TYPE.block_layout(),
                (B::ELEMENTS, B::BYTES),
                "{}",
                B::TYPE
            );
        }
        check::<F32>();
        check::<F16>();
        check::<BF16>();
        check::<legacy::BlockQ4_0>();
        check::<legacy::BlockQ4_1>();
        check::<legacy::BlockQ5_0>();
        check::<legacy::BlockQ5_1>();
        check::<legacy::BlockQ8_0>();
        check::<k_quants::BlockQ2K>();
        check::<k_quants::BlockQ3K>();
        check::<k_quants::BlockQ4K>();
        check::<k_quants::BlockQ5K>();
        check::<k_quants::BlockQ6K>();
    }

    #[test]
    fn floats_widen_exactly() {
        let mut out = [0.0f32; 3];
        let f32_bytes: Vec<u8> = [1.5f32, -0.0, f32::MIN_POSITIVE]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        dequantize(GgmlType::F32, &f32_bytes, &mut out).unwrap();
        assert_eq!(
            out.map(f32::to_bits),
            [1.5f32, -0.0, f32::MIN_POSITIVE].map(f32::to_bits)
        );
        // f16: 1.0, the smallest subnormal 2^-24, -65504.
        let f16_bytes = [0x00, 0x3c, 0x01, 0x00, 0xff, 0xfb];
        dequantize(GgmlType::F16, &f16_bytes, &mut out).unwrap();
        assert_eq!(out, [1.0, 2f32.powi(-24), -65504.0]);
        // bf16: 1.0, -2.0, the bits 0x0001 (a subnormal f32 2^-133).
        let bf16_bytes = [0x80, 0x3f, 0x00, 0xc0, 0x01, 0x00];
        dequantize(GgmlType::BF16, &bf16_bytes, &mut out).unwrap();
        assert_eq!(
            out.map(f32::to_bits),
            [0x3f80_0000, 0xc000_0000, 0x0001_0000]
        );
    }

    #[test]
    fn partial_blocks_and_other_types_are_refused() {
        let mut out = vec![0.0f32; 32];
        let err = dequantize(GgmlType::Q8_0, &[0u8; 33], &mut out).unwrap_err();
        assert!(
            matches!(
                err,
                QuantError::Length {
                    bytes: 33,
                    elements: 32,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("blocks of 34 bytes"), "{err}");
        let err = dequantize(GgmlType::Q8_0, &[0u8; 68], &mut out).unwrap_err();
        assert!(matches!(err, QuantError::Length { .. }), "{err}");
        let err = dequantize(GgmlType::IQ2_XXS, &[0u8; 66], &mut vec![0.0; 256]).unwrap_err();
        assert_eq!(err, QuantError::Unsupported(GgmlType::IQ2_XXS));
        assert!(err.to_string().contains("IQ2_XXS (id 16)"), "{err}");
        dequantize(GgmlType::Q4_K, &[], &mut []).unwrap();
    }

    #[test]
    fn any_bytes_dequantize_without_panicking() {
        // Every byte pattern is a valid block (NaN and infinite scales included).
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let bytes: Vec<u8> = (0..210 * 32 * 18)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        for t in GgmlType::DEQUANTIZED {
            let (n, b) = t.block_layout();
            let blocks = bytes.len() / b;
            let mut out = vec![0.0f32; blocks * n];
            dequantize(t, &bytes[..blocks * b], &mut out).unwrap();
        }
    }
}
