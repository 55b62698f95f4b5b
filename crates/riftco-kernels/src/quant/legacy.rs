//! The 32-element blocks of llama.cpp's first quantization formats (`block_q4_0` ...
//! `block_q8_0` of `ggml-common.h`).
//!
//! In every format, element `j < 16` of a block takes the low nibble of quant byte `j` and
//! element `j + 16` its high nibble (Q8_0: one signed byte per element); the 5-bit formats take
//! bit `j` of the little-endian `u32` `qh` as the fifth bit of element `j`. Values are
//! `d * q` (Q4_0, Q5_0, Q8_0) or `(d * q) + m` (Q4_1, Q5_1) in f32, `d` and `m` widened from
//! f16, exactly as `gguf.quants` computes them.
//!
//! The quantizers (`quantize_blocks`, behind [`super::quantize`]) produce the bytes of
//! `gguf.quants.quantize` (gguf-py's `quants.py`, numpy) bit for bit: the same float32 operations
//! in the same order, numpy's reductions (`argmax` of `|x|` takes the first maximum; `max` and
//! `min` take the last of equal values, which decides the sign of a zero), and numpy's
//! float-to-integer casts on x86-64 (the truncation to `int32` of `cvttss2si`, whose out-of-range
//! and NaN result `i32::MIN` keeps a low byte of 0, then the low byte).

use super::{f16_at, f16_bytes, BlockFormat, GgmlType};

/// Elements of a legacy block (`QK4_0 = QK4_1 = QK5_0 = QK5_1 = QK8_0 = 32`).
const QK: usize = 32;

/// `{d: f16, qs: [u8; 16]}`: `d * (q - 8)`, `q` a nibble.
pub struct BlockQ4_0;

impl BlockFormat for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    const ELEMENTS: usize = QK;
    const BYTES: usize = 2 + QK / 2;
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = f16_at(block, 0);
        let qs = &block[2..2 + QK / 2];
        for (j, &q) in qs.iter().enumerate() {
            out[j] = d * f32::from((q & 0x0F) as i8 - 8);
            out[j + QK / 2] = d * f32::from((q >> 4) as i8 - 8);
        }
    }
}

/// `{d: f16, m: f16, qs: [u8; 16]}`: `(d * q) + m`, `q` a nibble.
pub struct BlockQ4_1;

impl BlockFormat for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const ELEMENTS: usize = QK;
    const BYTES: usize = 2 + 2 + QK / 2;
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = f16_at(block, 0);
        let m = f16_at(block, 2);
        let qs = &block[4..4 + QK / 2];
        for (j, &q) in qs.iter().enumerate() {
            out[j] = d * f32::from(q & 0x0F) + m;
            out[j + QK / 2] = d * f32::from(q >> 4) + m;
        }
    }
}

/// The 5-bit quants of a block: nibbles of `qs` with bit `j` of `qh` as bit 4 of element `j`.
#[inline]
fn quants5(qh: &[u8], qs: &[u8]) -> [u8; QK] {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = [0u8; QK];
    for (j, &b) in qs.iter().enumerate() {
        let high = |k: usize| (((qh >> k) & 1) as u8) << 4;
        q[j] = (b & 0x0F) | high(j);
        q[j + QK / 2] = (b >> 4) | high(j + QK / 2);
    }
    q
}

/// `{d: f16, qh: u32, qs: [u8; 16]}`: `d * (q - 16)`, `q` 5 bits.
pub struct BlockQ5_0;

impl BlockFormat for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    const ELEMENTS: usize = QK;
    const BYTES: usize = 2 + 4 + QK / 2;
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = f16_at(block, 0);
        let q = quants5(&block[2..6], &block[6..6 + QK / 2]);
        for (o, &q) in out.iter_mut().zip(&q) {
            *o = d * f32::from(q as i8 - 16);
        }
    }
}

/// `{d: f16, m: f16, qh: u32, qs: [u8; 16]}`: `(d * q) + m`, `q` 5 bits.
pub struct BlockQ5_1;

impl BlockFormat for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    const ELEMENTS: usize = QK;
    const BYTES: usize = 2 + 2 + 4 + QK / 2;
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = f16_at(block, 0);
        let m = f16_at(block, 2);
        let q = quants5(&block[4..8], &block[8..8 + QK / 2]);
        for (o, &q) in out.iter_mut().zip(&q) {
            *o = d * f32::from(q) + m;
        }
    }
}

/// `{d: f16, qs: [i8; 32]}`: `q * d`.
pub struct BlockQ8_0;

impl BlockFormat for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const ELEMENTS: usize = QK;
    const BYTES: usize = 2 + QK;
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = f16_at(block, 0);
        for (o, &q) in out.iter_mut().zip(&block[2..2 + QK]) {
            *o = f32::from(q as i8) * d;
        }
    }
}

/// numpy's `astype(np.uint8)` (or `np.int8`, the same byte) of a float32 that is already a
/// whole number or not finite, on x86-64: NaN and values outside `i32` give 0, others their low
/// byte.
#[inline]
fn np_byte(x: f32) -> u8 {
    const LIMIT: f32 = 2_147_483_648.0;
    if x.is_nan() || !(-LIMIT..LIMIT).contains(&x) {
        0
    } else {
        (x as i32) as u8
    }
}

/// `np.trunc(x).astype(np.uint8)`.
#[inline]
fn trunc_byte(x: f32) -> u8 {
    np_byte(x.trunc())
}

/// `np_roundf` of gguf-py (round half away from zero, in float32 operations:
/// `sign(x) * (floor(|x|) + floor(2 * (|x| - floor(|x|))))`), then `astype(np.int8)`.
#[inline]
fn roundf_byte(x: f32) -> u8 {
    let a = x.abs();
    let floored = a.floor();
    let b = floored + (2.0 * (a - floored)).floor();
    let sign = if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        x
    };
    np_byte(sign * b)
}

/// The value of largest magnitude (the first one), as `take_along_axis(x, argmax(|x|))`.
#[inline]
fn signed_absmax(x: &[f32]) -> f32 {
    let mut best = 0;
    for (j, v) in x.iter().enumerate() {
        if v.abs() > x[best].abs() {
            best = j;
        }
    }
    x[best]
}

/// `(max, min)` as numpy's `max` and `min` reductions return them: of equal values (`0.0` and
/// `-0.0`) the last one.
#[inline]
fn max_min(x: &[f32]) -> (f32, f32) {
    let (mut max, mut min) = (x[0], x[0]);
    for &v in &x[1..] {
        if v >= max {
            max = v;
        }
        if v <= min {
            min = v;
        }
    }
    (max, min)
}

/// `where(d == 0, 0, 1 / d)`.
#[inline]
fn inverse(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// The 4- or 5-bit quants of a `_0` format: `trunc(x * id + offset)` clipped to `max`.
fn quants_symmetric(x: &[f32], divisor: f32, offset: f32, max: u8) -> (f32, [u8; QK]) {
    let d = signed_absmax(x) / divisor;
    let id = inverse(d);
    let mut q = [0u8; QK];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = trunc_byte(v * id + offset).min(max);
    }
    (d, q)
}

/// The 4- or 5-bit quants of a `_1` format: `trunc((x - min) * id + 0.5)` clipped to `levels`.
fn quants_affine(x: &[f32], levels: f32, max_q: u8) -> (f32, f32, [u8; QK]) {
    let (max, min) = max_min(x);
    let d = (max - min) / levels;
    let id = inverse(d);
    let mut q = [0u8; QK];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = trunc_byte((v - min) * id + 0.5).min(max_q);
    }
    (d, min, q)
}

/// Nibbles: element `j` in the low half of byte `j`, element `j + 16` in the high half (higher
/// bits of the quant shifted out, as numpy's `uint8` shift drops them).
fn pack_nibbles(q: &[u8; QK], out: &mut [u8]) {
    for j in 0..QK / 2 {
        out[j] = (q[j] & 0x0F) | (q[j + QK / 2] << 4);
    }
}

/// Bit 4 of each quant, element `j` at bit `j` of a little-endian `u32`.
fn fifth_bits(q: &[u8; QK]) -> [u8; 4] {
    let mut qh = 0u32;
    for (j, &v) in q.iter().enumerate() {
        qh |= u32::from(v >> 4 != 0) << j;
    }
    qh.to_le_bytes()
}

/// Quantizes `values` (whole 32-element blocks) into `out` (the same number of `ggml_type`'s
/// blocks) as `gguf.quants.quantize` does; `ggml_type` is one of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
/// (checked by the caller, as are the lengths and that the values are finite).
pub(crate) fn quantize_blocks(ggml_type: GgmlType, values: &[f32], out: &mut [u8]) {
    let bytes = ggml_type.block_layout().1;
    for (x, o) in values.chunks_exact(QK).zip(out.chunks_exact_mut(bytes)) {
        match ggml_type {
            GgmlType::Q4_0 => {
                let (d, q) = quants_symmetric(x, -8.0, 8.5, 15);
                o[..2].copy_from_slice(&f16_bytes(d));
                pack_nibbles(&q, &mut o[2..]);
            }
            GgmlType::Q4_1 => {
                let (d, m, q) = quants_affine(x, 15.0, 15);
                o[..2].copy_from_slice(&f16_bytes(d));
                o[2..4].copy_from_slice(&f16_bytes(m));
                pack_nibbles(&q, &mut o[4..]);
            }
            GgmlType::Q5_0 => {
                let (d, q) = quants_symmetric(x, -16.0, 16.5, 31);
                o[..2].copy_from_slice(&f16_bytes(d));
                o[2..6].copy_from_slice(&fifth_bits(&q));
                pack_nibbles(&q, &mut o[6..]);
            }
            GgmlType::Q5_1 => {
                let (d, m, q) = quants_affine(x, 31.0, 31);
                o[..2].copy_from_slice(&f16_bytes(d));
                o[2..4].copy_from_slice(&f16_bytes(m));
                o[4..8].copy_from_slice(&fifth_bits(&q));
                pack_nibbles(&q, &mut o[8..]);
            }
            GgmlType::Q8_0 => {
                let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = inverse(d);
                o[..2].copy_from_slice(&f16_bytes(d));
                for (q, &v) in o[2..].iter_mut().zip(x) {
                    *q = roundf_byte(v * id);
                }
            }
            other => unreachable!("{other} is not a legacy block format"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::dequantize;
    use super::*;

    /// f16 bits of 0.5 and 0.25.
    const HALF: [u8; 2] = [0x00, 0x38];
    const QUARTER: [u8; 2] = [0x00, 0x34];

    #[test]
    fn q4_0_takes_low_nibbles_first() {
        let mut block = HALF.to_vec();
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut out = [0.0f32; 32];
        dequantize(GgmlType::Q4_0, &block, &mut out).unwrap();
        for j in 0..16 {
            assert_eq!(out[j], 0.5 * (j as f32 - 8.0));
            assert_eq!(out[j + 16], 0.5 * ((15 - j) as f32 - 8.0));
        }
    }

    #[test]
    fn q4_1_adds_the_minimum() {
        let mut block = HALF.to_vec();
        block.extend(QUARTER);
        block.extend([0x21u8; 16]);
        let mut out = [0.0f32; 32];
        dequantize(GgmlType::Q4_1, &block, &mut out).unwrap();
        assert!(out[..16].iter().all(|&x| x == 0.5 + 0.25));
        assert!(out[16..].iter().all(|&x| x == 1.0 + 0.25));
    }

    #[test]
    fn q5_takes_bit_j_of_qh_as_the_fifth_bit() {
        // qh = bit 0 and bit 17 set; all nibbles 0.
        let qh = (1u32 | (1 << 17)).to_le_bytes();
        let mut b0 = HALF.to_vec();
        b0.extend(qh);
        b0.extend([0u8; 16]);
        let mut out = [0.0f32; 32];
        dequantize(GgmlType::Q5_0, &b0, &mut out).unwrap();
        assert_eq!(out[0], 0.0);
        assert_eq!(out[17], 0.0);
        assert!(out
            .iter()
            .enumerate()
            .all(|(j, &x)| j == 0 || j == 17 || x == -8.0));
        let mut b1 = HALF.to_vec();
        b1.extend(QUARTER);
        b1.extend(qh);
        b1.extend([0x0Fu8; 16]);
        dequantize(GgmlType::Q5_1, &b1, &mut out).unwrap();
        assert_eq!(out[0], 0.5 * 31.0 + 0.25);
        assert_eq!(out[1], 0.5 * 15.0 + 0.25);
        assert_eq!(out[16], 0.25);
        assert_eq!(out[17], 0.5 * 16.0 + 0.25);
    }

    #[test]
    fn q8_0_reads_signed_bytes() {
        let mut block = QUARTER.to_vec();
        block.extend((0..32).map(|j| (j as i8 - 16) as u8));
        block[2 + 31] = 0x80; // -128
        let mut out = [0.0f32; 32];
        dequantize(GgmlType::Q8_0, &block, &mut out).unwrap();
        for (j, &x) in out.iter().enumerate().take(31) {
            assert_eq!(x, 0.25 * (j as f32 - 16.0));
        }
        assert_eq!(out[31], -32.0);
    }
}
