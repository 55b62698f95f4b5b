//! The 256-element "K-quant" super-blocks of llama.cpp (`block_q2_K` ... `block_q6_K` of
//! `ggml-common.h`, Kawrakow 2023): quants in groups of 16 or 32 elements, each group with its
//! own small integer scale (and minimum), the scales scaled by an f16 super-block `d` (and
//! `dmin`).
//!
//! Element order and arithmetic follow `gguf.quants` (`Q2_K.dequantize_blocks` ...): a group's
//! scale is `d * sc` in f32 (`sc` an integer), a value `(d * sc) * q` or
//! `(d * sc) * q - (dmin * m)`, each product and difference rounded to f32 in that order.

//!
//! The quantizers (`quantize_blocks`, behind [`super::quantize`]) are llama.cpp's reference
//! quantizers (`quantize_row_q2_K_ref` ... `quantize_row_q6_K_ref` of `ggml/src/ggml-quants.c`, the
//! ones `llama-quantize` runs without an importance matrix) ported operation for operation: the
//! same float32 operations in the same order, never fused (the C compiled with
//! `-ffp-contract=off`), `nearest_int` by its float bit trick, and C's integer narrowing (`uint8_t`
//! and `int8_t` stores wrap). `gguf.quants` (gguf-py 0.19) has no K-quant quantizer; the bytes are
//! checked against the C functions by `scripts/kquant_fixtures.py`.

use super::{f16_at, f16_bytes, BlockFormat, GgmlType, QK_K};

/// `GROUP_MAX_EPS` of ggml-quants.c: a group whose largest magnitude is below it is all zeros.
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: `fval + 12582912` (1.5 * 2^23) in f32, the low 23 bits of the result
/// less 2^22; round half to even for `|fval| <= 4194303`, the same bits as the C otherwise.
#[inline]
fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12_582_912.0;
    (val.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// f16 bits of `x` widened back to f32 (`GGML_FP16_TO_FP32(GGML_FP32_TO_FP16(x))`).
#[inline]
fn f16_round(x: f32) -> f32 {
    f16_at(&f16_bytes(x), 0)
}

/// ggml's `make_qx_quants` with `rmse_type = 1` and no importance weights (weights `x * x`):
/// symmetric quants in `[-nmax, nmax)` stored offset by `nmax` in `l`; returns the scale.
fn make_qx_quants(x: &[f32], nmax: i32, l: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let nmaxf = nmax as f32;
    let clamp = |q: i32| q.clamp(-nmax, nmax - 1);
    let mut iscale = -nmaxf / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (li, &v) in l.iter_mut().zip(x) {
        let q = clamp(nearest_int(iscale * v));
        *li = (q + nmax) as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmaxf + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let q = clamp(nearest_int(iscale * v));
            let w = v * v;
            sumlx += w * v * q as f32;
            suml2 += w * q as f32 * q as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (li, &v) in l.iter_mut().zip(x) {
                *li = (nmax + clamp(nearest_int(iscale * v))) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_q3_quants` with `do_rmse`: symmetric quants in `[-nmax, nmax)` refined by up to
/// 5 passes of coordinate descent on the weighted error (weights `x * x`), stored offset by
/// `nmax`; returns the scale.
fn make_q3_quants(x: &[f32], nmax: i32, l: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let clamp = |q: i32| q.clamp(-nmax, nmax - 1);
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (li, &v) in l.iter_mut().zip(x) {
        let q = clamp(nearest_int(iscale * v));
        *li = q as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut changed = 0;
        for (li, &v) in l.iter_mut().zip(x) {
            let w = v * v;
            let old = f32::from(*li);
            let mut slx = sumlx - w * v * old;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * old * old;
                let new_l = clamp(nearest_int(v * sl2 / slx));
                if new_l != i32::from(*li) {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *li = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed += 1;
                    }
                }
            }
        }
        if changed == 0 {
            break;
        }
    }
    for li in l.iter_mut() {
        *li += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// ggml's `make_qkx2_quants`: affine quants in `[0, nmax]` (`x ≈ scale * l - the_min`) with
/// weights `weights`, searching `nstep + 1` scales around `nmax / (max - min)` for the least
/// weighted squared (or, `use_mad`, absolute) error. Returns `(scale, the_min)`.
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    x: &[f32],
    nmax: i32,
    weights: &[f32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let nmaxf = nmax as f32;
    let err = |diff: f32| if use_mad { diff.abs() } else { diff * diff };
    let mut iscale = nmaxf / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * f32::from(l[i]) + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    let mut aux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmaxf) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            aux[i] = q as u8;
            let (w, qf) = (weights[i], q as f32);
            sum_l += w * qf;
            sum_l2 += w * qf * qf;
            sum_xl += w * qf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * f32::from(aux[i]) + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Packs 2-bit quants `l` (256) as Q2_K and Q3_K store them: element `128·g + 32·s + j` at bits
/// `2s..2s + 2` of byte `32·g + j`.
fn pack_2bit(l: &[u8], qs: &mut [u8]) {
    for g in 0..2 {
        for j in 0..32 {
            let b = 128 * g + j;
            qs[32 * g + j] = l[b] | (l[b + 32] << 2) | (l[b + 64] << 4) | (l[b + 96] << 6);
        }
    }
}

/// `quantize_row_q2_K_ref`.
fn quantize_q2_k(x: &[f32], y: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let mut mins = [0.0f32; 16];
    let mut scales = [0.0f32; 16];
    let q4scale = 15.0f32;
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        let weights: [f32; 16] = std::array::from_fn(|i| xs[i].abs());
        let (scale, min) = make_qkx2_quants(
            xs,
            3,
            &weights,
            &mut l[16 * j..16 * j + 16],
            -0.5,
            0.1,
            15,
            true,
        );
        scales[j] = scale;
        mins[j] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }
    let (sc, rest) = y.split_at_mut(16);
    let (qs, dd) = rest.split_at_mut(64);
    if max_scale > 0.0 {
        let iscale = q4scale / max_scale;
        for j in 0..16 {
            sc[j] = nearest_int(iscale * scales[j]) as u8;
        }
        dd[..2].copy_from_slice(&f16_bytes(max_scale / q4scale));
    } else {
        sc.fill(0);
        dd[..2].copy_from_slice(&f16_bytes(0.0));
    }
    if max_min > 0.0 {
        let iscale = q4scale / max_min;
        for j in 0..16 {
            let q = nearest_int(iscale * mins[j]);
            sc[j] |= (q << 4) as u8;
        }
        dd[2..4].copy_from_slice(&f16_bytes(max_min / q4scale));
    } else {
        dd[2..4].copy_from_slice(&f16_bytes(0.0));
    }
    let (d_all, m_all) = (f16_at(dd, 0), f16_at(dd, 2));
    for j in 0..16 {
        let d = d_all * f32::from(sc[j] & 0xF);
        if d == 0.0 {
            continue;
        }
        let dm = m_all * f32::from(sc[j] >> 4);
        for ii in 0..16 {
            l[16 * j + ii] = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3) as u8;
        }
    }
    pack_2bit(&l, qs);
}

/// `quantize_row_q3_K_ref`.
fn quantize_q3_k(x: &[f32], y: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
    for j in 0..16 {
        scales[j] = make_q3_quants(&x[16 * j..16 * j + 16], 4, &mut l[16 * j..16 * j + 16]);
        let scale = scales[j].abs();
        if scale > amax {
            amax = scale;
            max_scale = scales[j];
        }
    }
    let (hmask, rest) = y.split_at_mut(32);
    let (qs, rest) = rest.split_at_mut(64);
    let (sc, dd) = rest.split_at_mut(12);
    sc.fill(0);
    if max_scale != 0.0 {
        let iscale = -32.0f32 / max_scale;
        for j in 0..16 {
            let q = nearest_int(iscale * scales[j]) as i8;
            let q = (i32::from(q).clamp(-32, 31) + 32) as u8;
            if j < 8 {
                sc[j] = q & 0xF;
            } else {
                sc[j - 8] |= (q & 0xF) << 4;
            }
            sc[j % 4 + 8] |= (q >> 4) << (2 * (j / 4));
        }
        dd.copy_from_slice(&f16_bytes(1.0 / iscale));
    } else {
        dd.copy_from_slice(&f16_bytes(0.0));
    }
    let d_all = f16_at(dd, 0);
    for j in 0..16 {
        let low = if j < 8 { sc[j] & 0xF } else { sc[j - 8] >> 4 };
        let s = (low | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) as i8 - 32;
        let d = d_all * f32::from(s);
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let q = nearest_int(x[16 * j + ii] / d).clamp(-4, 3);
            l[16 * j + ii] = (q + 4) as i8;
        }
    }
    hmask.fill(0);
    let mut lu = [0u8; QK_K];
    for (j, (u, &v)) in lu.iter_mut().zip(&l).enumerate() {
        let mut v = v as u8;
        if v > 3 {
            hmask[j % 32] |= 1 << (j / 32);
            v -= 4;
        }
        *u = v;
    }
    pack_2bit(&lu, qs);
}

/// The weights, scales and minimums of the eight 32-element groups of a Q4_K or Q5_K super-block
/// (`make_qkx2_quants` with weights `sqrt(mean(x²)) + |x|`), then the 6-bit scales and minimums
/// packed into `scales` (12 bytes) and `d`, `dmin` into `dd` (4 bytes), as
/// `quantize_row_q4_K_ref` and `quantize_row_q5_K_ref` do; returns the final quants (in
/// `[0, nmax]`) requantized with the packed scales.
fn quantize_k4_scales(
    x: &[f32],
    nmax: i32,
    rmin: f32,
    nstep: i32,
    dd: &mut [u8],
    packed: &mut [u8],
) -> [u8; QK_K] {
    let mut l = [0u8; QK_K];
    let mut mins = [0.0f32; 8];
    let mut scales = [0.0f32; 8];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|i| av_x + xs[i].abs());
        let (scale, min) = make_qkx2_quants(
            xs,
            nmax,
            &weights,
            &mut l[32 * j..32 * j + 32],
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = scale;
        mins[j] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    packed.fill(0);
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    dd[..2].copy_from_slice(&f16_bytes(max_scale / 63.0));
    dd[2..4].copy_from_slice(&f16_bytes(max_min / 63.0));
    let (d_all, m_all) = (f16_at(dd, 0), f16_at(dd, 2));
    let (sc, mn) = scale_min_k4(packed);
    for j in 0..8 {
        let d = d_all * f32::from(sc[j]);
        if d == 0.0 {
            continue;
        }
        let dm = m_all * f32::from(mn[j]);
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, nmax) as u8;
        }
    }
    l
}

/// `quantize_row_q4_K_ref`.
fn quantize_q4_k(x: &[f32], y: &mut [u8]) {
    let (head, qs) = y.split_at_mut(16);
    let (dd, packed) = head.split_at_mut(4);
    let l = quantize_k4_scales(x, 15, -1.0, 20, dd, packed);
    for g in 0..4 {
        for j in 0..32 {
            qs[32 * g + j] = l[64 * g + j] | (l[64 * g + j + 32] << 4);
        }
    }
}

/// `quantize_row_q5_K_ref`.
fn quantize_q5_k(x: &[f32], y: &mut [u8]) {
    let (head, rest) = y.split_at_mut(16);
    let (dd, packed) = head.split_at_mut(4);
    let (qh, ql) = rest.split_at_mut(32);
    let l = quantize_k4_scales(x, 31, -0.5, 15, dd, packed);
    qh.fill(0);
    for g in 0..4 {
        let (m1, m2) = (1u8 << (2 * g), 2u8 << (2 * g));
        for j in 0..32 {
            let mut l1 = l[64 * g + j];
            if l1 > 15 {
                l1 -= 16;
                qh[j] |= m1;
            }
            let mut l2 = l[64 * g + j + 32];
            if l2 > 15 {
                l2 -= 16;
                qh[j] |= m2;
            }
            ql[32 * g + j] = l1 | (l2 << 4);
        }
    }
}

/// `quantize_row_q6_K_ref`.
fn quantize_q6_k(x: &[f32], y: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
    for ib in 0..16 {
        let scale = make_qx_quants(&x[16 * ib..16 * ib + 16], 32, &mut l[16 * ib..16 * ib + 16]);
        scales[ib] = scale;
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = scale;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        y.fill(0);
        return;
    }
    let (ql, rest) = y.split_at_mut(128);
    let (qh, rest) = rest.split_at_mut(64);
    let (sc, dd) = rest.split_at_mut(16);
    let iscale = -128.0f32 / max_scale;
    dd.copy_from_slice(&f16_bytes(1.0 / iscale));
    for ib in 0..16 {
        sc[ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
    }
    let d_all = f16_round(1.0 / iscale);
    for j in 0..16 {
        let d = d_all * f32::from(sc[j] as i8);
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let q = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
            l[16 * j + ii] = (q + 32) as i8;
        }
    }
    for g in 0..2 {
        for j in 0..32 {
            let b = 128 * g + j;
            let q = |k: usize| l[b + 32 * k] as u8;
            ql[64 * g + j] = (q(0) & 0xF) | ((q(2) & 0xF) << 4);
            ql[64 * g + j + 32] = (q(1) & 0xF) | ((q(3) & 0xF) << 4);
            qh[32 * g + j] =
                (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
        }
    }
}

/// Quantizes `values` (whole 256-element super-blocks) into `out` (the same number of
/// `ggml_type`'s blocks) with llama.cpp's reference quantizer; `ggml_type` is one of Q2_K ...
/// Q6_K (checked by the caller, as are the lengths and that the values are finite).
pub(crate) fn quantize_blocks(ggml_type: GgmlType, values: &[f32], out: &mut [u8]) {
    let quantize_block: fn(&[f32], &mut [u8]) = match ggml_type {
        GgmlType::Q2_K => quantize_q2_k,
        GgmlType::Q3_K => quantize_q3_k,
        GgmlType::Q4_K => quantize_q4_k,
        GgmlType::Q5_K => quantize_q5_k,
        GgmlType::Q6_K => quantize_q6_k,
        other => unreachable!("{other} is not a K-quant"),
    };
    let bytes = ggml_type.block_layout().1;
    for (x, y) in values.chunks_exact(QK_K).zip(out.chunks_exact_mut(bytes)) {
        quantize_block(x, y);
    }
}

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
