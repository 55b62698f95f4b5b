//! Quantized storage of frozen weights: the block formats a weight may be kept in while ops read
//! it dequantized ([`QuantFormat`]), with their byte layout, row-range dequantization, the
//! quantizers, and the fused mat-vec product decoding uses.
//!
//! A quantized `[rows, cols]` weight is stored row-major, each row a whole number of blocks
//! (`cols % block_elements == 0`), so any range of rows is a contiguous range of blocks: ops
//! dequantize a block of rows at a time into a transient f32 workspace, never the whole weight.
//!
//! The GGML formats are laid out exactly as in GGUF files (`block_q4_0` ... of llama.cpp's
//! `ggml-common.h`). NF4 is QLoRA's 4-bit NormalFloat (Dettmers et al. 2023, "QLoRA: Efficient
//! Finetuning of Quantized LLMs") as bitsandbytes stores it with double quantization: blocks of
//! 64 elements, each block's absmax itself quantized to 8 bits (bitsandbytes' signed dynamic
//! map) in groups of 256 blocks, with one f32 scale per group and one f32 offset (the mean of
//! the absmaxes) per tensor. Its bytes, for `n` elements (`nb = n / 64` blocks,
//! `ng = ceil(nb / 256)` groups):
//!
//! | bytes | what |
//! |---|---|
//! | `n / 2` | the 4-bit codes, two per byte, element `2i` in the high nibble (bitsandbytes' order) |
//! | `nb` | each block's quantized absmax (an index into the dynamic map) |
//! | `4 * ng` | each group's absmax scale, f32 little endian |
//! | `4` | the offset, f32 little endian |
//!
//! so the codes of element `i` sit at byte `i / 2`, and a value is
//! `NF4[code] * (DYNAMIC[qabsmax[b]] * scale[b / 256] + offset)` in f32, one rounding per
//! operation, in that order (bitsandbytes' `dequantize_4bit` of the same state).

use super::{GgmlType, QuantError};

/// A quantized storage format for a frozen weight.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// GGML Q4_0: 32 elements, f16 scale, 4.5 bits per weight.
    Q4_0,
    /// GGML Q4_1: 32 elements, f16 scale and minimum, 5 bits per weight.
    Q4_1,
    /// GGML Q5_0: 32 elements, 5.5 bits per weight.
    Q5_0,
    /// GGML Q5_1: 32 elements, 6 bits per weight.
    Q5_1,
    /// GGML Q8_0: 32 elements, f16 scale, 8.5 bits per weight.
    Q8_0,
    /// GGML Q2_K: 256 elements, 2.625 bits per weight.
    Q2_K,
    /// GGML Q3_K: 256 elements, 3.4375 bits per weight.
    Q3_K,
    /// GGML Q4_K: 256 elements, 4.5 bits per weight.
    Q4_K,
    /// GGML Q5_K: 256 elements, 5.5 bits per weight.
    Q5_K,
    /// GGML Q6_K: 256 elements, 6.5625 bits per weight.
    Q6_K,
    /// QLoRA's NF4 with double-quantized absmax: 64 elements, about 4.127 bits per weight.
    Nf4,
}

impl QuantFormat {
    /// Every format.
    pub const ALL: [QuantFormat; 11] = [
        Self::Nf4,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q2_K,
        Self::Q3_K,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
    ];

    /// Elements of the NF4 block.
    pub const NF4_BLOCK: usize = 64;
    /// Blocks per group of NF4's double quantization.
    pub const NF4_GROUP: usize = 256;

    /// The lower-case name used by `dtype=` and `--frozen-weights-dtype`: `"nf4"`, `"q4_0"`,
    /// `"q4_k"`, ...
    pub fn name(self) -> &'static str {
        match self {
            Self::Q4_0 => "q4_0",
            Self::Q4_1 => "q4_1",
            Self::Q5_0 => "q5_0",
            Self::Q5_1 => "q5_1",
            Self::Q8_0 => "q8_0",
            Self::Q2_K => "q2_k",
            Self::Q3_K => "q3_k",
            Self::Q4_K => "q4_k",
            Self::Q5_K => "q5_k",
            Self::Q6_K => "q6_k",
            Self::Nf4 => "nf4",
        }
    }

    /// The format named `name` (case-insensitive), `None` for any other name.
    pub fn from_name(name: &str) -> Option<Self> {
        let lower = name.to_ascii_lowercase();
        Self::ALL.into_iter().find(|f| f.name() == lower)
    }

    /// The GGML type with this layout; `None` for NF4.
    pub fn ggml_type(self) -> Option<GgmlType> {
        Some(match self {
            Self::Q4_0 => GgmlType::Q4_0,
            Self::Q4_1 => GgmlType::Q4_1,
            Self::Q5_0 => GgmlType::Q5_0,
            Self::Q5_1 => GgmlType::Q5_1,
            Self::Q8_0 => GgmlType::Q8_0,
            Self::Q2_K => GgmlType::Q2_K,
            Self::Q3_K => GgmlType::Q3_K,
            Self::Q4_K => GgmlType::Q4_K,
            Self::Q5_K => GgmlType::Q5_K,
            Self::Q6_K => GgmlType::Q6_K,
            Self::Nf4 => return None,
        })
    }

    /// The format of a GGML type; `None` for a type that is not a block format kept quantized
    /// (F32, F16, BF16, the intermediate and importance-matrix types).
    pub fn from_ggml(t: GgmlType) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.ggml_type() == Some(t))
    }

    /// Elements per block: 32, 64 (NF4) or 256 (K-quants). A quantized weight's rows must be a
    /// whole number of blocks.
    pub fn block_elements(self) -> usize {
        match self {
            Self::Nf4 => Self::NF4_BLOCK,
            other => other.ggml_type().map_or(1, |t| t.block_layout().0),
        }
    }

    /// Bytes of `numel` elements in this format; `None` when `numel` is not a whole number of
    /// blocks (or the count overflows).
    pub fn storage_bytes(self, numel: usize) -> Option<usize> {
        let block = self.block_elements();
        if numel % block != 0 {
            return None;
        }
        let blocks = numel / block;
        match self {
            Self::Nf4 => {
                let groups = blocks.div_ceil(Self::NF4_GROUP);
                (numel / 2)
                    .checked_add(blocks)?
                    .checked_add(groups.checked_mul(4)?)?
                    .checked_add(4)
            }
            other => blocks.checked_mul(other.ggml_type()?.block_layout().1),
        }
    }
}

impl std::fmt::Display for QuantFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Dequantizes elements `start .. start + out.len()` of a quantized tensor of `numel` elements
/// stored in `data` (its whole storage, [`QuantFormat::storage_bytes`] long) into `out`.
/// `start` and `out.len()` must be whole blocks. Values are bitwise those of the whole tensor's
/// dequantization (each block on its own).
///
/// # Errors
/// [`QuantError::Range`] when the range is not whole blocks inside the tensor, or `data` has
/// not the format's length for `numel`.
pub fn dequantize_range(
    format: QuantFormat,
    data: &[u8],
    numel: usize,
    start: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    let block = format.block_elements();
    let end = start.checked_add(out.len());
    let fits = end.is_some_and(|e| e <= numel)
        && start % block == 0
        && out.len() % block == 0
        && format.storage_bytes(numel) == Some(data.len());
    if !fits {
        return Err(QuantError::Range {
            format,
            bytes: data.len(),
            numel,
            start,
            len: out.len(),
        });
    }
    match format.ggml_type() {
        Some(t) => {
            let block_bytes = t.block_layout().1;
            let first = start / block * block_bytes;
            let last = first + out.len() / block * block_bytes;
            super::dequantize(t, &data[first..last], out)
        }
        None => {
            super::nf4::dequantize_range(data, numel, start, out);
            Ok(())
        }
    }
}

/// `y[r] = Σ_c W[r, c] · x[c]` for a quantized `W[rows, cols]` stored in `data`, with
/// `cols = x.len()` and `rows = y.len()`: the mat-vec product of decoding, reading the quantized
/// blocks directly (dequantized in registers, never as an f32 row in memory), rows split over
/// the kernel pool.
///
/// The result is bitwise that of the f32 mat-vec product (`matmul` with `m = 1` and
/// `trans_b`) on the weight's dequantization ([`dequantize_range`]) at the same SIMD level,
/// whatever the thread count: each weight is dequantized with the same float operations, and
/// summed in the f32 product's order (see `quant/matvec.rs`). So decoding on a quantized weight
/// gives the bits of decoding on its dequantized f32 copy.
///
/// # Errors
/// [`QuantError::Range`] when `cols` is not whole blocks or `data` has not the length of
/// `rows * cols` elements.
pub fn matvec(
    format: QuantFormat,
    data: &[u8],
    x: &[f32],
    y: &mut [f32],
) -> Result<(), QuantError> {
    let (rows, cols) = (y.len(), x.len());
    let numel = rows.checked_mul(cols);
    let ok = cols % format.block_elements() == 0
        && numel.is_some_and(|n| format.storage_bytes(n) == Some(data.len()));
    if !ok {
        return Err(QuantError::Range {
            format,
            bytes: data.len(),
            numel: numel.unwrap_or(usize::MAX),
            start: 0,
            len: numel.unwrap_or(usize::MAX),
        });
    }
    super::matvec::matvec(format, data, x, y);
    Ok(())
}

/// Quantizes a whole tensor's `values` (whole blocks of `format`) into its bytes.
///
/// # Errors
/// [`QuantError::Range`] when `values` is not whole blocks; [`QuantError::NotQuantized`] for a
/// format without a quantizer.
pub fn quantize(format: QuantFormat, values: &[f32]) -> Result<Vec<u8>, QuantError> {
    if format.storage_bytes(values.len()).is_none() {
        return Err(QuantError::Range {
            format,
            bytes: 0,
            numel: values.len(),
            start: 0,
            len: values.len(),
        });
    }
    Err(QuantError::NotQuantized(format))
}
