//! Quantized storage of frozen weights: the block formats a weight may be kept in while ops read
//! it dequantized ([`QuantFormat`]), with their byte layout, row-range dequantization, the
//! quantizers, and the fused mat-vec product decoding uses.
//!
//! A quantized `[rows, cols]` weight is stored row-major, each row a whole number of blocks
//! (`cols % block_elements == 0`): ops dequantize a block of rows at a time into a transient f32
//! workspace, never the whole weight. In the GGML formats a range of rows is also a contiguous
//! range of the bytes; NF4 keeps every block's absmax and every group's scale after all the
//! codes (below), so a range of its rows is not a byte range of its own.
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

/// Quantizes `values` (a whole tensor, row-major, `values.len()` elements) to `format`, returning
/// its storage ([`QuantFormat::storage_bytes`] long, the layout of the module docs).
///
/// The bytes are those of the reference quantizer of each format, bit for bit:
/// - Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: `gguf.quants.quantize(values, GGMLQuantizationType.X)` of
///   llama.cpp's `gguf` Python package (0.19);
/// - Q2_K ... Q6_K: llama.cpp's `quantize_row_qX_K_ref` (`ggml-quants.c`, the quantizer of
///   `llama-quantize` without an importance matrix; `gguf.quants` has none for them);
/// - NF4: bitsandbytes' `quantize_4bit(values, blocksize=64, quant_type="nf4",
///   compress_statistics=True)` on the CPU (codes, quantized absmax, group scales, offset), with
///   the offset (the mean of the block absmaxes) summed in PyTorch's order on one thread: a
///   multi-threaded PyTorch (more than 32768 blocks and more than one thread) splits that sum
///   per thread and may differ in the offset's last bits.
///
/// The code is scalar, with no fused multiply-add, so the bytes are the same at every SIMD level,
/// thread count and machine (the GGML formats' blocks are quantized in parallel on the kernel
/// pool, each block on its own).
///
/// # Errors
/// [`QuantError::NotWholeBlocks`] when `values.len()` is not a multiple of
/// [`QuantFormat::block_elements`]; [`QuantError::NonFinite`] naming the first NaN or infinite
/// value (the references give format-specific garbage for them).
pub fn quantize(format: QuantFormat, values: &[f32]) -> Result<Vec<u8>, QuantError> {
    let numel = values.len();
    let bytes = format
        .storage_bytes(numel)
        .ok_or(QuantError::NotWholeBlocks { format, numel })?;
    if let Some(index) = values.iter().position(|v| !v.is_finite()) {
        return Err(QuantError::NonFinite {
            format,
            index,
            bits: values[index].to_bits(),
        });
    }
    if format.ggml_type().is_some() {
        if let Some(index) = values.iter().position(|v| v.abs() > super::F16_VALUE_LIMIT) {
            return Err(QuantError::OutOfRange {
                format,
                index,
                bits: values[index].to_bits(),
            });
        }
    }
    let out = match format.ggml_type() {
        None => super::nf4::quantize(values),
        Some(t) => {
            // Blocks are independent: chunks of them run on the kernel pool, each block's bytes
            // the same whatever thread computes them.
            use rayon::prelude::*;
            const CHUNK_BLOCKS: usize = 64;
            let (block, block_bytes) = t.block_layout();
            let quantize_blocks = if block == super::QK_K {
                super::k_quants::quantize_blocks
            } else {
                super::legacy::quantize_blocks
            };
            let mut out = vec![0u8; bytes];
            crate::threading::thread_pool().install(|| {
                out.par_chunks_mut(CHUNK_BLOCKS * block_bytes)
                    .zip(values.par_chunks(CHUNK_BLOCKS * block))
                    .for_each(|(o, v)| quantize_blocks(t, v, o));
            });
            out
        }
    };
    debug_assert_eq!(out.len(), bytes);
    Ok(out)
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

#[cfg(test)]
mod quantize_tests {
    use super::*;

    /// Deterministic N(0, 1)-like values (Box-Muller on an xorshift stream).
    fn gaussian(n: usize, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut uniform = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        (0..n)
            .map(|_| {
                let (u, v) = (uniform(), uniform());
                ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
            })
            .collect()
    }

    fn round_trip(format: QuantFormat, x: &[f32]) -> Vec<f32> {
        let data = quantize(format, x).unwrap();
        assert_eq!(Some(data.len()), format.storage_bytes(x.len()), "{format}");
        let mut out = vec![0.0f32; x.len()];
        dequantize_range(format, &data, x.len(), 0, &mut out).unwrap();
        out
    }

    /// Half an f16 ulp, relative: the error of rounding a stored scale to f16.
    const F16_HALF_ULP: f32 = 1.0 / 2048.0;
    /// Slack for the f32 roundings of the quantizer and the dequantization, relative to the
    /// block's largest magnitude.
    const F32_SLACK: f32 = 1e-6;

    /// The legacy formats' worst case per block, from their definitions: symmetric (`_0`) with
    /// `d = max / -half`, `q` rounded half up and clipped at `half - 1` (so `-max` lands one step
    /// off): `|d| · (1 + half · 2^-11)`; affine (`_1`) with `d = (max - min) / levels`, `q`
    /// rounded: `d / 2 + levels · d · 2^-11 + |min| · 2^-11`; Q8_0 with `d = amax / 127`, `q`
    /// rounded: `d · (1/2 + 127 · 2^-11)`.
    #[test]
    fn legacy_round_trips_are_within_a_step() {
        let x = gaussian(32 * 64, 1);
        for format in [
            QuantFormat::Q4_0,
            QuantFormat::Q5_0,
            QuantFormat::Q4_1,
            QuantFormat::Q5_1,
            QuantFormat::Q8_0,
        ] {
            let y = round_trip(format, &x);
            for (b, (xs, ys)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
                let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let max = xs.iter().copied().fold(f32::MIN, f32::max);
                let min = xs.iter().copied().fold(f32::MAX, f32::min);
                let bound = match format {
                    QuantFormat::Q4_0 => amax / 8.0 * (1.0 + 8.0 * F16_HALF_ULP),
                    QuantFormat::Q5_0 => amax / 16.0 * (1.0 + 16.0 * F16_HALF_ULP),
                    QuantFormat::Q4_1 | QuantFormat::Q5_1 => {
                        let levels = if format == QuantFormat::Q4_1 {
                            15.0
                        } else {
                            31.0
                        };
                        let d = (max - min) / levels;
                        d / 2.0 + levels * d * F16_HALF_ULP + min.abs() * F16_HALF_ULP
                    }
                    _ => amax / 127.0 * (0.5 + 127.0 * F16_HALF_ULP),
                } + amax * F32_SLACK;
                for (j, (a, b2)) in xs.iter().zip(ys).enumerate() {
                    assert!(
                        (a - b2).abs() <= bound,
                        "{format} block {b} element {j}: {a} -> {b2}, bound {bound}"
                    );
                }
            }
        }
    }

    /// NF4: a value is `NF4[c] · absmax'`, `c` the nearest code (at most half the widest gap of
    /// the NF4 values, `(1 - 0.6961928) / 2 < 0.152`, times the absmax), and `absmax'` the block
    /// absmax through the 8-bit dynamic map (at most half its widest gap, `0.0141 / 2`, plus a
    /// bin of `2 / 65535`, times the group's scale `max |absmax - offset|`).
    #[test]
    fn nf4_round_trip_is_within_half_a_code_and_the_absmax_error() {
        let mut x = gaussian(64 * 600, 2);
        for (b, block) in x.chunks_mut(64).enumerate() {
            let s = 1.0 + (b % 7) as f32 * 3.0;
            block.iter_mut().for_each(|v| *v *= s);
        }
        let y = round_trip(QuantFormat::Nf4, &x);
        let absmax: Vec<f32> = x
            .chunks(64)
            .map(|b| b.iter().fold(0.0f32, |m, v| m.max(v.abs())))
            .collect();
        let offset = absmax.iter().map(|&a| f64::from(a)).sum::<f64>() / absmax.len() as f64;
        for (g, group) in absmax.chunks(256).enumerate() {
            let scale = group
                .iter()
                .fold(0.0f64, |m, &a| m.max((f64::from(a) - offset).abs()))
                as f32;
            for (k, &am) in group.iter().enumerate() {
                let b = 256 * g + k;
                let bound =
                    0.152 * am + (0.0141 / 2.0 + 2.0 / 65535.0) * scale * 1.01 + am * F32_SLACK;
                for j in 0..64 {
                    let (a, d) = (x[64 * b + j], y[64 * b + j]);
                    assert!(
                        (a - d).abs() <= bound,
                        "block {b} [{j}]: {a} -> {d}, absmax {am}, scale {scale}, bound {bound}"
                    );
                }
            }
        }
    }

    /// The K-quants on Gaussian data: the root-mean-square error of uniform quantization with
    /// step `s` is `s / sqrt(12)`; with the group's step (range over levels: Q2_K 2 bits over
    /// about 4σ in 16, Q3_K `amax / 4`, Q4_K 4σ / 15, Q5_K 4σ / 31, Q6_K `amax / 32`) that is at
    /// most 0.35σ, 0.15σ, 0.08σ, 0.04σ and 0.02σ; the bound is twice that. No element is off by
    /// more than twice its super-block's largest magnitude.
    #[test]
    fn k_quant_round_trips_have_the_error_of_their_bits() {
        let x = gaussian(256 * 64, 3);
        for (format, rms_bound) in [
            (QuantFormat::Q2_K, 0.7),
            (QuantFormat::Q3_K, 0.3),
            (QuantFormat::Q4_K, 0.16),
            (QuantFormat::Q5_K, 0.08),
            (QuantFormat::Q6_K, 0.04),
        ] {
            let y = round_trip(format, &x);
            let sq: f64 = x
                .iter()
                .zip(&y)
                .map(|(a, b)| f64::from(a - b).powi(2))
                .sum();
            let rms = (sq / x.len() as f64).sqrt();
            assert!(rms <= rms_bound, "{format}: rms error {rms}");
            for (xs, ys) in x.chunks(256).zip(y.chunks(256)) {
                let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                for (a, b) in xs.iter().zip(ys) {
                    assert!((a - b).abs() <= 2.0 * amax, "{format}: {a} -> {b}");
                }
            }
        }
    }

    #[test]
    fn blocks_are_quantized_on_their_own() {
        // Many chunks of the parallel loop against one block at a time.
        for format in QuantFormat::ALL {
            let Some(t) = format.ggml_type() else {
                continue;
            };
            let block = format.block_elements();
            let x = gaussian(block * 150, 4);
            let whole = quantize(format, &x).unwrap();
            let one_by_one: Vec<u8> = x
                .chunks(block)
                .flat_map(|b| quantize(format, b).unwrap())
                .collect();
            assert_eq!(whole, one_by_one, "{t}");
        }
    }

    #[test]
    fn zeros_round_trip_exactly() {
        for format in QuantFormat::ALL {
            let n = format.block_elements() * 3;
            let y = round_trip(format, &vec![0.0; n]);
            assert!(y.iter().all(|&v| v == 0.0), "{format}: {y:?}");
        }
    }

    #[test]
    fn bad_input_is_refused_with_the_reason() {
        for format in QuantFormat::ALL {
            let block = format.block_elements();
            let err = quantize(format, &vec![1.0; block + 1]).unwrap_err();
            assert_eq!(
                err,
                QuantError::NotWholeBlocks {
                    format,
                    numel: block + 1
                }
            );
            let msg = err.to_string();
            assert!(
                msg.contains(&format!("blocks of {block} elements")),
                "{msg}"
            );
            let mut x = vec![0.5f32; 2 * block];
            x[block + 3] = f32::NAN;
            x[block + 1] = f32::NEG_INFINITY;
            let err = quantize(format, &x).unwrap_err();
            assert_eq!(
                err,
                QuantError::NonFinite {
                    format,
                    index: block + 1,
                    bits: f32::NEG_INFINITY.to_bits()
                }
            );
            assert!(err
                .to_string()
                .contains(&format!("value {} is -inf", block + 1)));
            assert_eq!(
                quantize(format, &[]).unwrap().len(),
                format.storage_bytes(0).unwrap()
            );
        }
    }

    #[test]
    fn nf4_tables_are_bitsandbytes() {
        let map = super::super::nf4::dynamic_map();
        assert!(map.windows(2).all(|w| w[0] < w[1]));
        assert_eq!((map[0], map[127], map[255]), (-0.992_968_75, 0.0, 1.0));
        let nf4 = super::super::nf4::NF4;
        assert!(nf4.windows(2).all(|w| w[0] < w[1]));
        assert_eq!((nf4[0], nf4[7], nf4[15]), (-1.0, 0.0, 1.0));
    }
}
