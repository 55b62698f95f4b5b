//! The x86 integer steps the fused quantized mat-vec needs and `pulp`'s generic `Simd` trait has
//! no operation for: widening bytes to 32-bit lanes, shifts and masks of packed bit fields, the
//! int-to-float conversion, and a 16-entry float table lookup. Each is one or two instructions
//! behind `pulp`'s AVX-512 (`V4`) and AVX2 (`V3`) tokens, so it runs only where the CPU has them.
//!
//! A [`Level`] handles 16 weights at a time ([`Level::I`]: 16 `i32` lanes; one `__m512i` or two
//! `__m256i`), and turns them into the f32 vectors of its `Simd` type ([`Level::weights`]), in
//! element order, with exactly the float operations of the scalar dequantization (one rounding
//! per product and per sum, never fused).

use std::arch::x86_64::{__m128i, __m256, __m256i, __m512, __m512i};

use pulp::x86::{V3, V4};
use pulp::Simd;

use super::matvec::Affine;

/// One x86 SIMD level's integer and conversion steps, over 16 lanes.
pub(crate) trait Level: Copy {
    /// The `pulp` level the accumulation runs at.
    type S: Simd;
    /// 16 `i32` lanes.
    type I: Copy;
    /// 16 f32 weights as the level's vectors, in element order.
    type W: AsRef<[<Self::S as Simd>::f32s]>;
    /// The `pulp` token.
    fn simd(self) -> Self::S;
    /// The 16 bytes zero-extended.
    fn u8x16(self, b: [u8; 16]) -> Self::I;
    /// The 16 bytes sign-extended.
    fn i8x16(self, b: [u8; 16]) -> Self::I;
    /// `a & mask`.
    fn and(self, a: Self::I, mask: i32) -> Self::I;
    /// `a | b`.
    fn or(self, a: Self::I, b: Self::I) -> Self::I;
    /// `a - v`.
    fn sub(self, a: Self::I, v: i32) -> Self::I;
    /// `a >> n` (logical).
    fn shr(self, a: Self::I, n: u32) -> Self::I;
    /// `a << n`.
    fn shl(self, a: Self::I, n: u32) -> Self::I;
    /// Lane `j`: bit `first + j` of `bits` (0 or 1).
    fn bits(self, bits: u32, first: u32) -> Self::I;
    /// NF4's code order: byte `i` holds element `2i` in its high nibble and `2i + 1` in its low
    /// nibble; the 32 codes of the 16 bytes, as two groups of 16.
    fn nibble_pairs(self, b: [u8; 16]) -> [Self::I; 2];
    /// The 16 f16 `h` widened to f32 exactly (as `half::f16::to_f32`; a NaN gets the quiet
    /// bit).
    fn widen_f16(self, h: [u16; 16]) -> [f32; 16];
    /// Whether [`Level::table16`] and [`Level::lookup`] are faster than [`Level::weights`]
    /// (AVX-512's one-instruction 16-entry permute).
    const TABLES: bool;
    /// A 16-entry table of weights: entry `t` is what [`Level::weights`] gives for the code
    /// `t - bias`, with the same operations (so the same bits).
    type T: Copy;
    /// The table of the codes `-bias .. 16 - bias`.
    fn table16(self, op: Affine, scale: f32, offset: f32, bias: i32, nf4: &[f32; 16]) -> Self::T;
    /// The weights `t[idx & 15]` of 16 lanes.
    fn lookup(self, idx: Self::I, t: Self::T) -> Self::W;
    /// The 16 weights of codes `q` (see [`Affine`]).
    fn weights(self, q: Self::I, op: Affine, scale: f32, offset: f32, table: &[f32; 16])
        -> Self::W;
}

/// Bytes `at..at + 16` of `b`.
#[inline(always)]
pub(crate) fn bytes16(b: &[u8], at: usize) -> [u8; 16] {
    let mut out = [0u8; 16];
    out.copy_from_slice(&b[at..at + 16]);
    out
}

/// `(high nibbles, low nibbles)` of `b` interleaved high first: the 32 codes of NF4's order.
#[inline(always)]
fn nibble_pairs_sse2(sse2: pulp::core_arch::x86::Sse2, b: [u8; 16]) -> [__m128i; 2] {
    let m: __m128i = pulp::cast(b);
    let mask = sse2._mm_set1_epi8(0x0F);
    let hi = sse2._mm_and_si128(sse2._mm_srli_epi16::<4>(m), mask);
    let lo = sse2._mm_and_si128(m, mask);
    [
        sse2._mm_unpacklo_epi8(hi, lo),
        sse2._mm_unpackhi_epi8(hi, lo),
    ]
}

/// AVX-512: 16 lanes in one register.
#[derive(Clone, Copy)]
pub(crate) struct L4(pub V4);

impl Level for L4 {
    type S = V4;
    type I = __m512i;
    type W = [<V4 as Simd>::f32s; 1];
    type T = __m512;
    const TABLES: bool = true;

    #[inline(always)]
    fn simd(self) -> V4 {
        self.0
    }
    #[inline(always)]
    fn u8x16(self, b: [u8; 16]) -> __m512i {
        self.0.avx512f._mm512_cvtepu8_epi32(pulp::cast(b))
    }
    #[inline(always)]
    fn i8x16(self, b: [u8; 16]) -> __m512i {
        self.0.avx512f._mm512_cvtepi8_epi32(pulp::cast(b))
    }
    #[inline(always)]
    fn and(self, a: __m512i, mask: i32) -> __m512i {
        let f = self.0.avx512f;
        f._mm512_and_si512(a, f._mm512_set1_epi32(mask))
    }
    #[inline(always)]
    fn or(self, a: __m512i, b: __m512i) -> __m512i {
        self.0.avx512f._mm512_or_si512(a, b)
    }
    #[inline(always)]
    fn sub(self, a: __m512i, v: i32) -> __m512i {
        let f = self.0.avx512f;
        f._mm512_sub_epi32(a, f._mm512_set1_epi32(v))
    }
    #[inline(always)]
    fn shr(self, a: __m512i, n: u32) -> __m512i {
        let count = self.0.sse2._mm_cvtsi32_si128(n as i32);
        self.0.avx512f._mm512_srl_epi32(a, count)
    }
    #[inline(always)]
    fn shl(self, a: __m512i, n: u32) -> __m512i {
        let count = self.0.sse2._mm_cvtsi32_si128(n as i32);
        self.0.avx512f._mm512_sll_epi32(a, count)
    }
    #[inline(always)]
    fn bits(self, bits: u32, first: u32) -> __m512i {
        let f = self.0.avx512f;
        let j = |i: u32| (first + i) as i32;
        let shifts = f._mm512_setr_epi32(
            j(0),
            j(1),
            j(2),
            j(3),
            j(4),
            j(5),
            j(6),
            j(7),
            j(8),
            j(9),
            j(10),
            j(11),
            j(12),
            j(13),
            j(14),
            j(15),
        );
        let v = f._mm512_srlv_epi32(f._mm512_set1_epi32(bits as i32), shifts);
        self.and(v, 1)
    }
    #[inline(always)]
    fn table16(self, op: Affine, scale: f32, offset: f32, bias: i32, nf4: &[f32; 16]) -> __m512 {
        let f = self.0.avx512f;
        let codes = f._mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let [w] = self.weights(self.sub(codes, bias), op, scale, offset, nf4);
        pulp::cast(w)
    }
    #[inline(always)]
    fn lookup(self, idx: __m512i, t: __m512) -> Self::W {
        // VPERMPS reads the low 4 bits of each index.
        [pulp::cast(self.0.avx512f._mm512_permutexvar_ps(idx, t))]
    }
    #[inline(always)]
    fn widen_f16(self, h: [u16; 16]) -> [f32; 16] {
        // VCVTPH2PS: exact, subnormals kept (riftco never sets DAZ), signalling NaNs quietened.
        pulp::cast(self.0.avx512f._mm512_cvtph_ps(pulp::cast(h)))
    }
    #[inline(always)]
    fn nibble_pairs(self, b: [u8; 16]) -> [__m512i; 2] {
        let [e0, e1] = nibble_pairs_sse2(self.0.sse2, b);
        let f = self.0.avx512f;
        [f._mm512_cvtepu8_epi32(e0), f._mm512_cvtepu8_epi32(e1)]
    }
    #[inline(always)]
    fn weights(
        self,
        q: __m512i,
        op: Affine,
        scale: f32,
        offset: f32,
        table: &[f32; 16],
    ) -> Self::W {
        let f = self.0.avx512f;
        let sc = f._mm512_set1_ps(scale);
        let w: __m512 = match op {
            Affine::Mul => f._mm512_mul_ps(sc, f._mm512_cvtepi32_ps(q)),
            Affine::MulAdd => f._mm512_add_ps(
                f._mm512_mul_ps(sc, f._mm512_cvtepi32_ps(q)),
                f._mm512_set1_ps(offset),
            ),
            Affine::MulSub => f._mm512_sub_ps(
                f._mm512_mul_ps(sc, f._mm512_cvtepi32_ps(q)),
                f._mm512_set1_ps(offset),
            ),
            Affine::Table => {
                let t: __m512 = pulp::cast(*table);
                f._mm512_mul_ps(f._mm512_permutexvar_ps(q, t), sc)
            }
        };
        [pulp::cast(w)]
    }
}

/// AVX2: 16 lanes in two registers.
#[derive(Clone, Copy)]
pub(crate) struct L3(pub V3);

impl Level for L3 {
    type S = V3;
    type I = [__m256i; 2];
    type W = [<V3 as Simd>::f32s; 2];
    type T = [__m256; 2];
    const TABLES: bool = false;

    #[inline(always)]
    fn simd(self) -> V3 {
        self.0
    }
    #[inline(always)]
    fn u8x16(self, b: [u8; 16]) -> [__m256i; 2] {
        let m: __m128i = pulp::cast(b);
        let a = self.0.avx2;
        [
            a._mm256_cvtepu8_epi32(m),
            a._mm256_cvtepu8_epi32(self.0.sse2._mm_srli_si128::<8>(m)),
        ]
    }
    #[inline(always)]
    fn i8x16(self, b: [u8; 16]) -> [__m256i; 2] {
        let m: __m128i = pulp::cast(b);
        let a = self.0.avx2;
        [
            a._mm256_cvtepi8_epi32(m),
            a._mm256_cvtepi8_epi32(self.0.sse2._mm_srli_si128::<8>(m)),
        ]
    }
    #[inline(always)]
    fn and(self, a: [__m256i; 2], mask: i32) -> [__m256i; 2] {
        let m = self.0.avx._mm256_set1_epi32(mask);
        let x = self.0.avx2;
        [x._mm256_and_si256(a[0], m), x._mm256_and_si256(a[1], m)]
    }
    #[inline(always)]
    fn or(self, a: [__m256i; 2], b: [__m256i; 2]) -> [__m256i; 2] {
        let x = self.0.avx2;
        [x._mm256_or_si256(a[0], b[0]), x._mm256_or_si256(a[1], b[1])]
    }
    #[inline(always)]
    fn sub(self, a: [__m256i; 2], v: i32) -> [__m256i; 2] {
        let m = self.0.avx._mm256_set1_epi32(v);
        let x = self.0.avx2;
        [x._mm256_sub_epi32(a[0], m), x._mm256_sub_epi32(a[1], m)]
    }
    #[inline(always)]
    fn shr(self, a: [__m256i; 2], n: u32) -> [__m256i; 2] {
        let count = self.0.sse2._mm_cvtsi32_si128(n as i32);
        let x = self.0.avx2;
        [
            x._mm256_srl_epi32(a[0], count),
            x._mm256_srl_epi32(a[1], count),
        ]
    }
    #[inline(always)]
    fn shl(self, a: [__m256i; 2], n: u32) -> [__m256i; 2] {
        let count = self.0.sse2._mm_cvtsi32_si128(n as i32);
        let x = self.0.avx2;
        [
            x._mm256_sll_epi32(a[0], count),
            x._mm256_sll_epi32(a[1], count),
        ]
    }
    #[inline(always)]
    fn bits(self, bits: u32, first: u32) -> [__m256i; 2] {
        let (x, a) = (self.0.avx, self.0.avx2);
        let j = |i: u32| (first + i) as i32;
        let v = x._mm256_set1_epi32(bits as i32);
        let s0 = x._mm256_setr_epi32(j(0), j(1), j(2), j(3), j(4), j(5), j(6), j(7));
        let s1 = x._mm256_setr_epi32(j(8), j(9), j(10), j(11), j(12), j(13), j(14), j(15));
        self.and([a._mm256_srlv_epi32(v, s0), a._mm256_srlv_epi32(v, s1)], 1)
    }
    #[inline(always)]
    fn table16(
        self,
        op: Affine,
        scale: f32,
        offset: f32,
        bias: i32,
        nf4: &[f32; 16],
    ) -> [__m256; 2] {
        let x = self.0.avx;
        let codes = [
            x._mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            x._mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15),
        ];
        pulp::cast(self.weights(self.sub(codes, bias), op, scale, offset, nf4))
    }
    #[inline(always)]
    fn lookup(self, idx: [__m256i; 2], t: [__m256; 2]) -> Self::W {
        let (x, a) = (self.0.avx, self.0.avx2);
        let one = |q: __m256i| -> <V3 as Simd>::f32s {
            let lo = a._mm256_permutevar8x32_ps(t[0], q);
            let hi = a._mm256_permutevar8x32_ps(t[1], q);
            let pick = x._mm256_castsi256_ps(a._mm256_slli_epi32::<28>(q));
            pulp::cast(x._mm256_blendv_ps(lo, hi, pick))
        };
        [one(idx[0]), one(idx[1])]
    }
    #[inline(always)]
    fn widen_f16(self, h: [u16; 16]) -> [f32; 16] {
        // AVX2 does not imply F16C: the exact conversion in integer steps.
        let [h0, h1]: [__m128i; 2] = pulp::cast(h);
        let a = self.0.avx2;
        pulp::cast([
            self.widen_f16x8(a._mm256_cvtepu16_epi32(h0)),
            self.widen_f16x8(a._mm256_cvtepu16_epi32(h1)),
        ])
    }
    #[inline(always)]
    fn nibble_pairs(self, b: [u8; 16]) -> [[__m256i; 2]; 2] {
        let [e0, e1] = nibble_pairs_sse2(self.0.sse2, b);
        [self.u8x16(pulp::cast(e0)), self.u8x16(pulp::cast(e1))]
    }
    #[inline(always)]
    fn weights(
        self,
        q: [__m256i; 2],
        op: Affine,
        scale: f32,
        offset: f32,
        table: &[f32; 16],
    ) -> Self::W {
        [
            self.weights8(q[0], op, scale, offset, table),
            self.weights8(q[1], op, scale, offset, table),
        ]
    }
}

impl L3 {
    /// Eight f16 (in the low halves of 32-bit lanes) widened exactly: the 15 magnitude bits
    /// moved into the f32 exponent and mantissa fields give the value times 2^-112
    /// (subnormals included), and the exact product by 2^112 restores it; infinities and NaNs
    /// (magnitude >= 0x7C00) are built directly, a NaN with the quiet bit.
    #[inline(always)]
    fn widen_f16x8(self, h: __m256i) -> __m256 {
        let (x, a) = (self.0.avx, self.0.avx2);
        let c = |v: i32| x._mm256_set1_epi32(v);
        let sign = a._mm256_slli_epi32::<16>(a._mm256_and_si256(h, c(0x8000)));
        let mag = a._mm256_and_si256(h, c(0x7FFF));
        let scaled = x._mm256_mul_ps(
            x._mm256_castsi256_ps(a._mm256_slli_epi32::<13>(mag)),
            x._mm256_set1_ps(f32::from_bits((127 + 112) << 23)),
        );
        let finite = a._mm256_or_si256(x._mm256_castps_si256(scaled), sign);
        let nan = a._mm256_and_si256(a._mm256_cmpgt_epi32(mag, c(0x7C00)), c(0x0040_0000));
        let payload = a._mm256_slli_epi32::<13>(a._mm256_and_si256(mag, c(0x03FF)));
        let special = a._mm256_or_si256(
            a._mm256_or_si256(sign, c(0x7F80_0000)),
            a._mm256_or_si256(nan, payload),
        );
        let is_special = a._mm256_cmpgt_epi32(mag, c(0x7BFF));
        x._mm256_castsi256_ps(a._mm256_blendv_epi8(finite, special, is_special))
    }

    /// [`Level::weights`] for 8 lanes.
    #[inline(always)]
    fn weights8(
        self,
        q: __m256i,
        op: Affine,
        scale: f32,
        offset: f32,
        table: &[f32; 16],
    ) -> <V3 as Simd>::f32s {
        let (x, a) = (self.0.avx, self.0.avx2);
        let sc = x._mm256_set1_ps(scale);
        let w: __m256 = match op {
            Affine::Mul => x._mm256_mul_ps(sc, x._mm256_cvtepi32_ps(q)),
            Affine::MulAdd => x._mm256_add_ps(
                x._mm256_mul_ps(sc, x._mm256_cvtepi32_ps(q)),
                x._mm256_set1_ps(offset),
            ),
            Affine::MulSub => x._mm256_sub_ps(
                x._mm256_mul_ps(sc, x._mm256_cvtepi32_ps(q)),
                x._mm256_set1_ps(offset),
            ),
            Affine::Table => {
                // Entries 0..8 from the first half of the table, 8..16 from the second: bit 3
                // of the code, moved to the sign bit, selects.
                let [t0, t1]: [__m256; 2] = pulp::cast(*table);
                let lo = a._mm256_permutevar8x32_ps(t0, q);
                let hi = a._mm256_permutevar8x32_ps(t1, q);
                let pick = x._mm256_castsi256_ps(a._mm256_slli_epi32::<28>(q));
                x._mm256_mul_ps(x._mm256_blendv_ps(lo, hi, pick), sc)
            }
        };
        pulp::cast(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both levels' f16 widening against `half` for every bit pattern.
    #[test]
    fn f16_widening_is_halfs_for_every_bit_pattern_at_both_levels() {
        fn check(widen: impl Fn([u16; 16]) -> [f32; 16], level: &str) {
            for base in (0..=u16::MAX).step_by(16) {
                let h: [u16; 16] = std::array::from_fn(|i| base + i as u16);
                let got = widen(h);
                for (&bits, &v) in h.iter().zip(&got) {
                    let want = half::f16::from_bits(bits).to_f32();
                    assert_eq!(v.to_bits(), want.to_bits(), "{level} {bits:#06x}");
                }
            }
        }
        if let Some(v4) = V4::try_new() {
            check(|h| v4.vectorize(|| L4(v4).widen_f16(h)), "avx512");
        }
        if let Some(v3) = V3::try_new() {
            check(|h| v3.vectorize(|| L3(v3).widen_f16(h)), "avx2");
        }
    }
}
