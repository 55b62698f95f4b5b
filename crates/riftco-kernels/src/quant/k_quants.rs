//! The 256-element "K-quant" super-blocks of llama.cpp (`block_q2_K` ... `block_q6_K` of
//! `ggml-common.h`, Kawrakow 2023): quants in groups of 16 or 32 elements, each group with its
//! own small integer scale (and minimum), the scales scaled by an f16 super-block `d` (and
//! `dmin`).
//!
//! Element order and arithmetic follow `gguf.quants` (`Q2_K.dequantize_blocks` ...): a group's
//! scale is `d * sc` in f32 (`sc` an integer), a value `(d * sc) * q` or
//! `(d * sc) * q - (dmin * m)`, each product and difference rounded to f32 in that order.

use super::{f16_at, BlockFormat, GgmlType, QK_K};

/// `{scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16}`: 2-bit quants in 16 groups of 16, a
/// group's scale the low nibble of its `scales` byte and its minimum the high nibble.
pub struct BlockQ2K;

impl BlockFormat for BlockQ2K {
    const TYPE: GgmlType = GgmlType::Q2_K;
    const ELEMENTS: usize = QK_K;
    const BYTES: usize = QK_K / 16 + QK_K / 4 + 2 + 2;
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let scales = &block[..16];
        let qs = &block[16..80];
        let d = f16_at(block, 80);
        let dmin = f16_at(block, 82);
        // Element i = 128·g + 32·s + l is bits 2s..2s+2 of qs[32·g + l]; its group is i / 16.
        for (i, o) in out.iter_mut().enumerate().take(QK_K) {
            let (g, s, l) = (i / 128, (i / 32) % 4, i % 32);
            let q = f32::from((qs[32 * g + l] >> (2 * s)) & 3);
            let sc = scales[i / 16];
            let dl = d * f32::from(sc & 0x0F);
            let ml = dmin * f32::from(sc >> 4);
            *o = dl * q - ml;
        }
    }
}

/// `{hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16}`: 3-bit quants (2 low bits in
/// `qs`, the third in `hmask`, inverted: a clear bit subtracts 4) in 16 groups of 16 with 6-bit
/// scales offset by 32.
pub struct BlockQ3K;

impl BlockQ3K {
    /// The 16 signed group scales packed in 12 bytes: the low 4 bits of scale `i` are nibble
    /// `i / 8` of byte `i % 8`, the high 2 bits are bits `2·(i / 4)..` of byte `8 + i % 4`.
    pub(super) fn scales(packed: &[u8]) -> [i8; 16] {
        let mut out = [0i8; 16];
        for (i, o) in out.iter_mut().enumerate() {
            let low = if i < 8 {
                packed[i] & 0x0F
            } else {
                packed[i - 8] >> 4
            };
            let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 0x03;
            *o = (low | (high << 4)) as i8 - 32;
        }
        out
    }
}

impl BlockFormat for BlockQ3K {
    const TYPE: GgmlType = GgmlType::Q3_K;
    const ELEMENTS: usize = QK_K;
    const BYTES: usize = QK_K / 8 + QK_K / 4 + 12 + 2;
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let hmask = &block[..32];
        let qs = &block[32..96];
        let scales = Self::scales(&block[96..108]);
        let d = f16_at(block, 108);
        // Element i = 128·g + 32·s + l: low bits 2s.. of qs[32·g + l], high bit i / 32 of
        // hmask[l].
        for (i, o) in out.iter_mut().enumerate().take(QK_K) {
            let (g, s, l) = (i / 128, (i / 32) % 4, i % 32);
            let low = ((qs[32 * g + l] >> (2 * s)) & 3) as i8;
            let high = ((hmask[l] >> (i / 32)) & 1) ^ 1;
            let q = f32::from(low - ((high << 2) as i8));
            let dl = d * f32::from(scales[i / 16]);
            *o = dl * q;
        }
    }
}

/// The 8 scales and 8 minimums (6 bits each) of a Q4_K or Q5_K super-block, packed in 12
/// bytes (`get_scale_min_k4` of `ggml-quants.c`, `Q4_K.get_scale_min` of `gguf.quants`).
pub(super) fn scale_min_k4(packed: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (d, m, md) = (&packed[..4], &packed[4..8], &packed[8..12]);
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for k in 0..4 {
        sc[k] = d[k] & 0x3F;
        sc[k + 4] = (md[k] & 0x0F) | ((d[k] >> 2) & 0x30);
        mn[k] = m[k] & 0x3F;
        mn[k + 4] = (md[k] >> 4) | ((m[k] >> 2) & 0x30);
    }
    (sc, mn)
}

/// `{d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]}`: 4-bit quants in 8 groups of 32; group
/// `2·g + h` is nibble `h` of `qs[32·g..32·g + 32]`.
pub struct BlockQ4K;

impl BlockFormat for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    const ELEMENTS: usize = QK_K;
    const BYTES: usize = 2 + 2 + 12 + QK_K / 2;
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = f16_at(block, 0);
        let dmin = f16_at(block, 2);
        let (sc, mn) = scale_min_k4(&block[4..16]);
        let qs = &block[16..16 + QK_K / 2];
        for (j, group) in out.chunks_exact_mut(32).enumerate().take(8) {
            let (g, h) = (j / 2, j % 2);
            let dl = d * f32::from(sc[j]);
            let ml = dmin * f32::from(mn[j]);
            for (l, o) in group.iter_mut().enumerate() {
                let q = f32::from((qs[32 * g + l] >> (4 * h)) & 0x0F);
                *o = dl * q - ml;
            }
        }
    }
}

/// `{d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]}`: Q4_K's nibbles with bit
/// `j` of `qh[l]` as the fifth bit of element `l` of group `j`.
pub struct BlockQ5K;

impl BlockFormat for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
    const ELEMENTS: usize = QK_K;
    const BYTES: usize = 2 + 2 + 12 + QK_K / 8 + QK_K / 2;
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let d = f16_at(block, 0);
        let dmin = f16_at(block, 2);
        let (sc, mn) = scale_min_k4(&block[4..16]);
        let qh = &block[16..48];
        let qs = &block[48..48 + QK_K / 2];
        for (j, group) in out.chunks_exact_mut(32).enumerate().take(8) {
            let (g, h) = (j / 2, j % 2);
            let dl = d * f32::from(sc[j]);
            let ml = dmin * f32::from(mn[j]);
            for (l, o) in group.iter_mut().enumerate() {
                let low = (qs[32 * g + l] >> (4 * h)) & 0x0F;
                let high = (qh[l] >> j) & 1;
                *o = dl * f32::from(low | (high << 4)) - ml;
            }
        }
    }
}

/// `{ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16}`: 6-bit quants offset by 32 in 16
/// groups of 16 with signed 8-bit scales.
pub struct BlockQ6K;

impl BlockFormat for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    const ELEMENTS: usize = QK_K;
    const BYTES: usize = QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;
    fn dequantize_block(block: &[u8], out: &mut [f32]) {
        let ql = &block[..128];
        let qh = &block[128..192];
        let scales = &block[192..208];
        let d = f16_at(block, 208);
        // Element i = 128·g + 64·h + k takes nibble h of ql[64·g + k]; i = 128·g + 32·s + l
        // takes bits 2s.. of qh[32·g + l] as its bits 4 and 5.
        for (i, o) in out.iter_mut().enumerate().take(QK_K) {
            let g = i / 128;
            let (h, k) = ((i / 64) % 2, i % 64);
            let (s, l) = ((i / 32) % 4, i % 32);
            let low = (ql[64 * g + k] >> (4 * h)) & 0x0F;
            let high = (qh[32 * g + l] >> (2 * s)) & 0x03;
            let q = f32::from((low | (high << 4)) as i8 - 32);
            let dl = d * f32::from(scales[i / 16] as i8);
            *o = dl * q;
        }
    }
}

// The references index as the C loops of ggml-quants.c do.
#[allow(clippy::needless_range_loop)]
#[cfg(test)]
mod tests {
    use super::super::dequantize;
    use super::*;

    /// f16 bits of 1.0 and 0.5.
    const ONE: [u8; 2] = [0x00, 0x3c];
    const HALF: [u8; 2] = [0x00, 0x38];

    /// Element values from a direct reading of `dequantize_row_q*_K` of `ggml-quants.c` (loops
    /// over 128-element halves, as llama.cpp writes them), against the element-order reading
    /// of `gguf.quants` above.
    #[test]
    fn q2_k_matches_the_ggml_loop() {
        let block: Vec<u8> = (0..84u32).map(|i| (i * 37 + 11) as u8).collect();
        let mut block = block;
        block[80..82].copy_from_slice(&HALF);
        block[82..84].copy_from_slice(&ONE);
        let mut out = [0.0f32; 256];
        dequantize(GgmlType::Q2_K, &block, &mut out).unwrap();
        let (d, dmin) = (0.5f32, 1.0f32);
        let mut want = Vec::new();
        let mut is = 0;
        for n in 0..2 {
            let q = &block[16 + 32 * n..16 + 32 * n + 32];
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let sc = block[is];
                    is += 1;
                    let (dl, ml) = (d * f32::from(sc & 0xF), dmin * f32::from(sc >> 4));
                    for l in 0..16 {
                        want.push(dl * f32::from((q[l + 16 * half] >> shift) & 3) - ml);
                    }
                }
            }
        }
        assert_eq!(out.to_vec(), want);
    }

    #[test]
    fn q3_k_matches_the_ggml_loop() {
        let mut block: Vec<u8> = (0..110u32).map(|i| (i * 53 + 7) as u8).collect();
        block[108..110].copy_from_slice(&HALF);
        let mut out = [0.0f32; 256];
        dequantize(GgmlType::Q3_K, &block, &mut out).unwrap();
        // ggml: the scales through the kmask1/kmask2 u32 shuffle.
        let s = &block[96..108];
        let aux =
            |k: usize| u32::from_le_bytes([s[4 * k], s[4 * k + 1], s[4 * k + 2], s[4 * k + 3]]);
        let (kmask1, kmask2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
        let (a0, a1, tmp) = (aux(0), aux(1), aux(2));
        let words = [
            (a0 & kmask2) | ((tmp & kmask1) << 4),
            (a1 & kmask2) | (((tmp >> 2) & kmask1) << 4),
            ((a0 >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4),
            ((a1 >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4),
        ];
        let scales: Vec<i8> = words
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .map(|b| b as i8)
            .collect();
        let mut want = Vec::new();
        let (hm, mut m, mut is) = (&block[..32], 1u8, 0);
        for n in 0..2 {
            let q = &block[32 + 32 * n..64 + 32 * n];
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let dl = 0.5f32 * f32::from(scales[is] - 32);
                    is += 1;
                    for l in 16 * half..16 * half + 16 {
                        let sub = if hm[l] & m != 0 { 0 } else { 4 };
                        want.push(dl * f32::from(((q[l] >> shift) & 3) as i8 - sub));
                    }
                }
                m <<= 1;
            }
        }
        assert_eq!(out.to_vec(), want);
    }

    #[test]
    fn q4_k_and_q5_k_match_the_ggml_loop() {
        let mut q4: Vec<u8> = (0..144u32).map(|i| (i * 29 + 3) as u8).collect();
        q4[..2].copy_from_slice(&HALF);
        q4[2..4].copy_from_slice(&ONE);
        let mut q5: Vec<u8> = (0..176u32).map(|i| (i * 31 + 5) as u8).collect();
        q5[..2].copy_from_slice(&HALF);
        q5[2..4].copy_from_slice(&ONE);
        let get_scale_min = |j: usize, q: &[u8]| -> (u8, u8) {
            if j < 4 {
                (q[j] & 63, q[j + 4] & 63)
            } else {
                (
                    (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
                    (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
                )
            }
        };
        for (block, t) in [(&q4, GgmlType::Q4_K), (&q5, GgmlType::Q5_K)] {
            let mut out = [0.0f32; 256];
            dequantize(t, block, &mut out).unwrap();
            let scales = &block[4..16];
            let qs = if t == GgmlType::Q4_K {
                &block[16..]
            } else {
                &block[48..]
            };
            let qh = &block[16..48];
            let mut want = Vec::new();
            let (mut is, mut u1, mut u2) = (0, 1u8, 2u8);
            for j in 0..4 {
                let q = &qs[32 * j..32 * j + 32];
                let (sc, m) = get_scale_min(is, scales);
                let (d1, m1) = (0.5f32 * f32::from(sc), f32::from(m));
                let (sc, m) = get_scale_min(is + 1, scales);
                let (d2, m2) = (0.5f32 * f32::from(sc), f32::from(m));
                let h = |l: usize, u: u8| {
                    if t == GgmlType::Q5_K && qh[l] & u != 0 {
                        16
                    } else {
                        0
                    }
                };
                for l in 0..32 {
                    want.push(d1 * f32::from((q[l] & 0xF) + h(l, u1)) - m1);
                }
                for l in 0..32 {
                    want.push(d2 * f32::from((q[l] >> 4) + h(l, u2)) - m2);
                }
                is += 2;
                u1 <<= 2;
                u2 <<= 2;
            }
            assert_eq!(out.to_vec(), want, "{t}");
        }
    }

    #[test]
    fn q6_k_matches_the_ggml_loop() {
        let mut block: Vec<u8> = (0..210u32).map(|i| (i * 41 + 13) as u8).collect();
        block[208..210].copy_from_slice(&HALF);
        let mut out = [0.0f32; 256];
        dequantize(GgmlType::Q6_K, &block, &mut out).unwrap();
        let mut want = vec![0.0f32; 256];
        for n in 0..2 {
            let ql = &block[64 * n..64 * n + 64];
            let qh = &block[128 + 32 * n..128 + 32 * n + 32];
            let sc = &block[192 + 8 * n..192 + 8 * n + 8];
            let y = &mut want[128 * n..128 * n + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
                let s = |k: usize| 0.5f32 * f32::from(sc[is + k] as i8);
                y[l] = s(0) * f32::from(q1);
                y[l + 32] = s(2) * f32::from(q2);
                y[l + 64] = s(4) * f32::from(q3);
                y[l + 96] = s(6) * f32::from(q4);
            }
        }
        assert_eq!(out.to_vec(), want);
    }
}
