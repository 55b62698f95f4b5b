//! The fused quantized mat-vec product `y[r] = Σ_c W[r, c] · x[c]` of decoding: the weights are
//! read as quantized blocks and dequantized in registers (as llama.cpp's `ggml_vec_dot_*` do),
//! never as an f32 row in memory.
//!
//! Contract: the result is bitwise the f32 mat-vec product (`matmul` with `m = 1` and a
//! transposed `[rows, cols]` weight, `crate::matvec::matvec_rows`) applied to the weight's
//! dequantization ([`super::dequantize_range`]), at every SIMD level and whatever the thread
//! count. Two things make that hold:
//! - each weight is dequantized with exactly the float operations of the scalar dequantization
//!   (`d * q`, `(d * q) + m`, `(d * sc) * q - dmin * m`, `NF4[code] * absmax`; one rounding
//!   per operation, never fused);
//! - the accumulation is the f32 path's: vector `v` of a row (`S::F32_LANES` elements) is
//!   multiplied into accumulator `v % 2` by a fused multiply-add (unfused on the scalar level),
//!   then the two accumulators are added and their lanes summed by `pulp`'s `reduce_sum_f32s`.
//!   Rows are whole blocks of at least 32 elements, so there is never a tail, and a 32-element
//!   chunk always starts at an even vector.
//!
//! At AVX-512 and AVX2 the integer codes are unpacked with x86 instructions behind `pulp`'s
//! tokens ([`super::simd_x86`]; `pulp`'s generic `Simd` has no byte widening nor int-to-float
//! conversion), 32 weights (a chunk) at a time, the f16 scales of four rows widened by one vector
//! conversion. At AVX-512 the 4-bit formats whose chunk shares one scale (Q4_0, Q4_1, Q4_K, NF4)
//! compute the chunk's 16 possible weights once, with the same operations, and look each weight
//! up with one permute (VPERMPS reads the low 4 bits of each index, so a code needs no masking).
//! At other levels (scalar, NEON) each block is dequantized by the scalar code into a
//! block-sized buffer on the stack and then accumulated with `pulp`'s vectors.
//!
//! Rows go four at a time (four memory streams), the next four rows' blocks prefetched, and the
//! rows are split over the kernel pool like the f32 product's; a row's value never depends on
//! the rows beside it, so it does not depend on the split nor on the thread count.

// Off x86-64 only the buffered kernel runs; the fused kernel's items stay for the next port.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use pulp::Simd;
use rayon::prelude::*;

use super::format::QuantFormat;
use super::k_quants::{scale_min_k4, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K};
use super::legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0};
use super::nf4::{dynamic_map, NF4};
#[cfg(target_arch = "x86_64")]
use super::simd_x86::{bytes16, Level, L3, L4};
use super::BlockFormat;
use crate::simd::arch;

/// Products smaller than this (elements of `W`) run on the calling thread, as the f32 mat-vec.
const PAR_MIN_ELEMENTS: usize = 64 * 1024;

/// Elements of the unit the fused kernels decode at once.
const CHUNK: usize = 32;

/// How the weights of a group of 16 follow from their integer codes `q` and the group's
/// `scale` and `offset`, each operation rounded to f32 (the scalar dequantization's order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Affine {
    /// `scale * q`.
    Mul,
    /// `scale * q + offset`.
    MulAdd,
    /// `scale * q - offset`.
    MulSub,
    /// `table[q] * scale` (`q` in `0..16`).
    Table,
}

/// A quantized `[rows, cols]` weight, read block by block.
pub(crate) trait Rows: Sync {
    /// Elements per block (a multiple of [`CHUNK`]).
    const BLOCK: usize;
    /// Bytes per block (NF4: of its codes).
    const BLOCK_BYTES: usize;
    /// How the weights follow from the codes.
    const OP: Affine;
    /// What a block's weights share (its scales, minimums), computed once per block.
    type Prep: Copy;
    /// Bytes of a row in the quantized data (NF4: of its codes).
    fn row_bytes(&self) -> usize;
    /// Writes the weights of block `k` of row `r` into `out` (`BLOCK` long), bitwise as
    /// [`super::dequantize_range`].
    fn dequantize(&self, r: usize, k: usize, out: &mut [f32]);
    /// The shared values of block `k` of row `r`.
    fn prep(&self, r: usize, k: usize) -> Self::Prep;
    /// The shared values of block `k` of rows `r0 .. r0 + N` (`N <= 4`).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn prep_rows<L: Level, const N: usize>(&self, _: L, r0: usize, k: usize) -> [Self::Prep; N] {
        let mut prep = [self.prep(r0, k); N];
        for (i, p) in prep.iter_mut().enumerate().skip(1) {
            *p = self.prep(r0 + i, k);
        }
        prep
    }
    /// `(scale, offset)` of elements `16·h .. 16·h + 16` of chunk `c` of the block.
    fn affine(p: &Self::Prep, c: usize, h: usize) -> (f32, f32);
    /// The integer codes of chunk `c` of block `k` of row `r`, in element order.
    #[cfg(target_arch = "x86_64")]
    fn codes<L: Level>(&self, l: L, r: usize, k: usize, c: usize) -> [L::I; 2];
    /// For the 4-bit formats whose 32-element chunks share one scale and offset: the bias
    /// subtracted from a 4-bit index to give the code (so the weights can be looked up in a
    /// 16-entry table per chunk); `None` for the others.
    const TABLE_BIAS: Option<i32> = None;
    /// With [`Rows::TABLE_BIAS`]: 32-bit lanes whose low 4 bits are the chunk's indices.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn indices<L: Level>(&self, l: L, r: usize, k: usize, c: usize) -> [L::I; 2] {
        self.codes(l, r, k, c)
    }
    /// The first byte of block `k` of row `r` (for prefetching; may point past the data).
    fn block_ptr(&self, r: usize, k: usize) -> *const u8;
}

/// Runs the product for a validated `data` (`y.len() * x.len()` elements of `format`).
pub(crate) fn matvec(format: QuantFormat, data: &[u8], x: &[f32], y: &mut [f32]) {
    let cols = x.len();
    match format {
        QuantFormat::Q4_0 => run(&Ggml::<BlockQ4_0>::new(data, cols), x, y),
        QuantFormat::Q4_1 => run(&Ggml::<BlockQ4_1>::new(data, cols), x, y),
        QuantFormat::Q5_0 => run(&Ggml::<BlockQ5_0>::new(data, cols), x, y),
        QuantFormat::Q5_1 => run(&Ggml::<BlockQ5_1>::new(data, cols), x, y),
        QuantFormat::Q8_0 => run(&Ggml::<BlockQ8_0>::new(data, cols), x, y),
        QuantFormat::Q2_K => run(&Ggml::<BlockQ2K>::new(data, cols), x, y),
        QuantFormat::Q3_K => run(&Ggml::<BlockQ3K>::new(data, cols), x, y),
        QuantFormat::Q4_K => run(&Ggml::<BlockQ4K>::new(data, cols), x, y),
        QuantFormat::Q5_K => run(&Ggml::<BlockQ5K>::new(data, cols), x, y),
        QuantFormat::Q6_K => run(&Ggml::<BlockQ6K>::new(data, cols), x, y),
        QuantFormat::Nf4 => run(&Nf4Rows::new(data, y.len(), cols), x, y),
    }
}

/// Splits the rows over the kernel pool as the f32 mat-vec does: two tasks per kernel thread of
/// equal row counts; a row's value does not depend on the split.
fn run<R: Rows>(rows: &R, x: &[f32], y: &mut [f32]) {
    let n = y.len();
    if n == 0 {
        return;
    }
    if x.is_empty() {
        y.fill(0.0);
        return;
    }
    if n.saturating_mul(x.len()) < PAR_MIN_ELEMENTS || n < 2 {
        serial(rows, 0, x, y);
        return;
    }
    let tasks = 2 * crate::threading::num_threads();
    let per_task = n.div_ceil(tasks).clamp(1, n);
    crate::par::install(|| {
        y.par_chunks_mut(per_task)
            .enumerate()
            .for_each(|(t, y)| serial(rows, t * per_task, x, y));
    });
}

/// Rows `r0 .. r0 + y.len()` at the selected SIMD level.
fn serial<R: Rows>(rows: &R, r0: usize, x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match arch() {
        pulp::Arch::V4(v4) => {
            return Simd::vectorize(
                v4,
                Fused {
                    l: L4(v4),
                    rows,
                    r0,
                    x,
                    y,
                },
            )
        }
        pulp::Arch::V3(v3) => {
            return Simd::vectorize(
                v3,
                Fused {
                    l: L3(v3),
                    rows,
                    r0,
                    x,
                    y,
                },
            )
        }
        _ => {}
    }
    arch().dispatch(Buffered { rows, r0, x, y });
}

/// Rows four at a time (four memory streams, eight accumulator chains), then one at a time.
macro_rules! quads_then_singles {
    ($y:expr, $r0:expr, |$r:ident, $n:ident| $dot:expr) => {{
        let y: &mut [f32] = $y;
        let done = y.len() - y.len() % 4;
        for (q, out) in y[..done].chunks_exact_mut(4).enumerate() {
            let $r = $r0 + 4 * q;
            let v: [f32; 4] = {
                const $n: usize = 4;
                $dot
            };
            out.copy_from_slice(&v);
        }
        for (j, out) in y.iter_mut().enumerate().skip(done) {
            let $r = $r0 + j;
            let [v]: [f32; 1] = {
                const $n: usize = 1;
                $dot
            };
            *out = v;
        }
    }};
}

/// The fused kernel at an x86 level.
#[cfg(target_arch = "x86_64")]
struct Fused<'a, L, R> {
    l: L,
    rows: &'a R,
    r0: usize,
    x: &'a [f32],
    y: &'a mut [f32],
}

#[cfg(target_arch = "x86_64")]
impl<L: Level, R: Rows> pulp::WithSimd for Fused<'_, L, R> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        let Self { l, rows, r0, x, y } = self;
        quads_then_singles!(y, r0, |r, N| dot_fused::<L, R, N>(l, rows, r, x));
    }
}

/// `[x · W[r0], …, x · W[r0 + N - 1]]`, dequantizing chunk by chunk in registers.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn dot_fused<L: Level, R: Rows, const N: usize>(l: L, rows: &R, r0: usize, x: &[f32]) -> [f32; N] {
    let s = l.simd();
    let lanes = <L::S as Simd>::F32_LANES;
    let (xv, _) = <L::S as Simd>::as_simd_f32s(x);
    let zero = s.splat_f32s(0.0);
    let mut acc = [[zero; 2]; N];
    let row_bytes = rows.row_bytes();
    for k in 0..x.len() / R::BLOCK {
        for i in 0..N {
            prefetch_block::<R>(rows.block_ptr(r0 + i, k).wrapping_add(4 * row_bytes));
        }
        let prep: [R::Prep; N] = rows.prep_rows(l, r0, k);
        let xb = &xv[k * R::BLOCK / lanes..(k + 1) * R::BLOCK / lanes];
        // The chunks with literal indices, so that every shift count and byte offset is a
        // constant after inlining (a K-quant block has 8 chunks).
        macro_rules! chunks {
            ($($c:literal)*) => {$(
                if $c < R::BLOCK / CHUNK {
                    chunk::<L, R, N>(l, rows, r0, k, $c, xb, &prep, &mut acc);
                }
            )*};
        }
        chunks!(0 1 2 3 4 5 6 7);
    }
    let mut out = [0.0f32; N];
    for (o, a) in out.iter_mut().zip(acc) {
        *o = s.reduce_sum_f32s(s.add_f32s(a[0], a[1]));
    }
    out
}

/// Accumulates chunk `c` of block `k` of rows `r0 .. r0 + N` (`xb`: the block's part of `x`).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn chunk<L: Level, R: Rows, const N: usize>(
    l: L,
    rows: &R,
    r0: usize,
    k: usize,
    c: usize,
    xb: &[<L::S as Simd>::f32s],
    prep: &[R::Prep; N],
    acc: &mut [[<L::S as Simd>::f32s; 2]; N],
) {
    let s = l.simd();
    let per_chunk = CHUNK / <L::S as Simd>::F32_LANES;
    let xs = &xb[c * per_chunk..(c + 1) * per_chunk];
    let add = |a: &mut [<L::S as Simd>::f32s; 2], h: usize, w: L::W| {
        let w = w.as_ref();
        for (j, &wv) in w.iter().enumerate() {
            let v = h * w.len() + j;
            a[v % 2] = s.mul_add_e_f32s(xs[v], wv, a[v % 2]);
        }
    };
    if let (true, Some(bias)) = (L::TABLES, R::TABLE_BIAS) {
        // The chunk's 16 possible weights computed once, then looked up.
        for (i, (a, p)) in acc.iter_mut().zip(prep).enumerate() {
            let (scale, offset) = R::affine(p, c, 0);
            let table = l.table16(R::OP, scale, offset, bias, &NF4);
            let [q0, q1] = rows.indices(l, r0 + i, k, c);
            add(a, 0, l.lookup(q0, table));
            add(a, 1, l.lookup(q1, table));
        }
    } else {
        for (i, (a, p)) in acc.iter_mut().zip(prep).enumerate() {
            let [q0, q1] = rows.codes(l, r0 + i, k, c);
            let (scale, offset) = R::affine(p, c, 0);
            add(a, 0, l.weights(q0, R::OP, scale, offset, &NF4));
            let (scale, offset) = R::affine(p, c, 1);
            add(a, 1, l.weights(q1, R::OP, scale, offset, &NF4));
        }
    }
}

/// Prefetches the bytes of a block (a hint: the address is never dereferenced).
#[inline(always)]
fn prefetch_block<R: Rows>(ptr: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        let mut at = 0;
        while at < R::BLOCK_BYTES {
            // SAFETY: a prefetch never faults; the address is only computed (wrapping).
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    ptr.wrapping_add(at).cast::<i8>(),
                );
            }
            at += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ptr;
}

/// The portable kernel: each block dequantized by the scalar code into a stack buffer, then
/// accumulated with `pulp`'s vectors.
struct Buffered<'a, R> {
    rows: &'a R,
    r0: usize,
    x: &'a [f32],
    y: &'a mut [f32],
}

impl<R: Rows> pulp::WithSimd for Buffered<'_, R> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, s: S) {
        let Self { rows, r0, x, y } = self;
        quads_then_singles!(y, r0, |r, N| dot_buffered::<S, R, N>(s, rows, r, x));
    }
}

#[inline(always)]
fn dot_buffered<S: Simd, R: Rows, const N: usize>(
    s: S,
    rows: &R,
    r0: usize,
    x: &[f32],
) -> [f32; N] {
    let zero = s.splat_f32s(0.0);
    let mut acc = [[zero; 2]; N];
    let mut buf = [[0.0f32; 256]; N];
    for (k, xb) in x.chunks_exact(R::BLOCK).enumerate() {
        for (i, b) in buf.iter_mut().enumerate() {
            rows.dequantize(r0 + i, k, &mut b[..R::BLOCK]);
        }
        let (xv, _) = S::as_simd_f32s(xb);
        for (a, b) in acc.iter_mut().zip(&buf) {
            let (wv, _) = S::as_simd_f32s(&b[..R::BLOCK]);
            for (v, (&xx, &ww)) in xv.iter().zip(wv).enumerate() {
                a[v % 2] = s.mul_add_e_f32s(xx, ww, a[v % 2]);
            }
        }
    }
    let mut out = [0.0f32; N];
    for (o, a) in out.iter_mut().zip(acc) {
        *o = s.reduce_sum_f32s(s.add_f32s(a[0], a[1]));
    }
    out
}

/// The f16 `bits` widened to f32 exactly, as `half::f16::to_f32` (a NaN gets the quiet bit).
#[inline(always)]
pub(crate) fn f16_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits & 0x8000) << 16;
    let magnitude = u32::from(bits & 0x7FFF);
    if magnitude >= 0x7C00 {
        let nan = if magnitude > 0x7C00 { 0x0040_0000 } else { 0 };
        return f32::from_bits(sign | 0x7F80_0000 | nan | ((magnitude & 0x3FF) << 13));
    }
    // The 15 bits moved into the f32 exponent and mantissa fields give the value · 2^-112
    // (subnormals included); multiplying by 2^112 is exact.
    let scaled = f32::from_bits(magnitude << 13) * f32::from_bits((127 + 112) << 23);
    f32::from_bits(sign | scaled.to_bits())
}

/// The f16 at `b[at..at + 2]`, widened exactly.
#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// A GGML block format, row-major with whole blocks per row.
struct Ggml<'a, B> {
    data: &'a [u8],
    row_bytes: usize,
    format: std::marker::PhantomData<B>,
}

impl<'a, B: BlockFormat> Ggml<'a, B> {
    fn new(data: &'a [u8], cols: usize) -> Self {
        Self {
            data,
            row_bytes: cols / B::ELEMENTS * B::BYTES,
            format: std::marker::PhantomData,
        }
    }

    #[inline(always)]
    fn block(&self, r: usize, k: usize) -> &[u8] {
        let at = r * self.row_bytes + k * B::BYTES;
        &self.data[at..at + B::BYTES]
    }
}

/// How a GGML block's codes and shared values are read.
trait GgmlFused: BlockFormat + Sync {
    const OP: Affine;
    type Prep: Copy;
    fn prep(block: &[u8]) -> Self::Prep;
    /// For the 32-element formats, whose block starts with the f16 `d` (and `m`): the shared
    /// values from the widened f16 at bytes 0..2 and 2..4 (for the formats without `m`, the
    /// second is a widened pair of quant bytes, unused).
    const PAIR: Option<fn(f32, f32) -> Self::Prep> = None;
    /// See [`Rows::TABLE_BIAS`].
    const TABLE_BIAS: Option<i32> = None;
    /// See [`Rows::indices`].
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn indices<L: Level>(l: L, block: &[u8], c: usize) -> [L::I; 2] {
        Self::codes(l, block, c)
    }
    fn affine(p: &Self::Prep, c: usize, h: usize) -> (f32, f32);
    #[cfg(target_arch = "x86_64")]
    fn codes<L: Level>(l: L, block: &[u8], c: usize) -> [L::I; 2];
}

impl<B: GgmlFused> Rows for Ggml<'_, B> {
    const BLOCK: usize = B::ELEMENTS;
    const BLOCK_BYTES: usize = B::BYTES;
    const OP: Affine = B::OP;
    type Prep = B::Prep;
    fn row_bytes(&self) -> usize {
        self.row_bytes
    }
    #[inline(always)]
    fn dequantize(&self, r: usize, k: usize, out: &mut [f32]) {
        B::dequantize_block(self.block(r, k), out);
    }
    #[inline(always)]
    fn prep(&self, r: usize, k: usize) -> B::Prep {
        B::prep(self.block(r, k))
    }
    /// The legacy formats' f16 `d` and `m` of the rows widened together (one vector
    /// conversion instead of a scalar one per value).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn prep_rows<L: Level, const N: usize>(&self, l: L, r0: usize, k: usize) -> [B::Prep; N] {
        let Some(pair) = B::PAIR else {
            let mut prep = [self.prep(r0, k); N];
            for (i, p) in prep.iter_mut().enumerate().skip(1) {
                *p = self.prep(r0 + i, k);
            }
            return prep;
        };
        let mut h = [0u16; 16];
        for i in 0..N.min(8) {
            let b = self.block(r0 + i, k);
            h[2 * i] = u16::from_le_bytes([b[0], b[1]]);
            h[2 * i + 1] = u16::from_le_bytes([b[2], b[3]]);
        }
        let f = l.widen_f16(h);
        let mut prep = [pair(f[0], f[1]); N];
        for (i, p) in prep.iter_mut().enumerate().skip(1) {
            *p = pair(f[2 * i], f[2 * i + 1]);
        }
        prep
    }
    #[inline(always)]
    fn affine(p: &B::Prep, c: usize, h: usize) -> (f32, f32) {
        B::affine(p, c, h)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn codes<L: Level>(&self, l: L, r: usize, k: usize, c: usize) -> [L::I; 2] {
        B::codes(l, self.block(r, k), c)
    }
    const TABLE_BIAS: Option<i32> = B::TABLE_BIAS;
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn indices<L: Level>(&self, l: L, r: usize, k: usize, c: usize) -> [L::I; 2] {
        B::indices(l, self.block(r, k), c)
    }
    #[inline(always)]
    fn block_ptr(&self, r: usize, k: usize) -> *const u8 {
        self.data
            .as_ptr()
            .wrapping_add(r * self.row_bytes + k * B::BYTES)
    }
}

/// The codes of a 32-element block of 4-bit quants at `qs` (element `j` the low nibble of
/// byte `j`, element `j + 16` the high one), minus `bias`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn nibbles<L: Level>(l: L, block: &[u8], qs: usize, bias: i32) -> [L::I; 2] {
    let q = l.u8x16(bytes16(block, qs));
    [l.sub(l.and(q, 0x0F), bias), l.sub(l.shr(q, 4), bias)]
}

/// `(b >> shift) & mask` for the 16 bytes `b` at `block[at..]`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn field<L: Level>(l: L, block: &[u8], at: usize, shift: u32, mask: i32) -> L::I {
    l.and(l.shr(l.u8x16(bytes16(block, at)), shift), mask)
}

/// The 5-bit codes of a legacy block: nibbles at `qs` and bit `j` of the `u32` at `qh`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn five_bits<L: Level>(l: L, block: &[u8], qh: usize, qs: usize, bias: i32) -> [L::I; 2] {
    let high = u32::from_le_bytes([block[qh], block[qh + 1], block[qh + 2], block[qh + 3]]);
    let q = l.u8x16(bytes16(block, qs));
    let lo = l.or(l.and(q, 0x0F), l.shl(l.bits(high, 0), 4));
    let hi = l.or(l.shr(q, 4), l.shl(l.bits(high, 16), 4));
    [l.sub(lo, bias), l.sub(hi, bias)]
}

impl GgmlFused for BlockQ4_0 {
    const OP: Affine = Affine::Mul;
    type Prep = f32;
    const PAIR: Option<fn(f32, f32) -> Self::Prep> = Some(|d, _| d);
    #[inline(always)]
    fn prep(block: &[u8]) -> f32 {
        f16_at(block, 0)
    }
    #[inline(always)]
    fn affine(d: &f32, _: usize, _: usize) -> (f32, f32) {
        (*d, 0.0)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn codes<L: Level>(l: L, block: &[u8], _: usize) -> [L::I; 2] {
        nibbles(l, block, 2, 8)
    }
    const TABLE_BIAS: Option<i32> = Some(8);
    /// Byte `j` as is (its low nibble is element `j`) and shifted by 4 (element `j + 16`).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn indices<L: Level>(l: L, block: &[u8], _: usize) -> [L::I; 2] {
        let q = l.u8x16(bytes16(block, 2));
        [q, l.shr(q, 4)]
    }
}

impl GgmlFused for BlockQ4_1 {
    const OP: Affine = Affine::MulAdd;
    type Prep = (f32, f32);
    const PAIR: Option<fn(f32, f32) -> Self::Prep> = Some(|d, m| (d, m));
    #[inline(always)]
    fn prep(block: &[u8]) -> (f32, f32) {
        (f16_at(block, 0), f16_at(block, 2))
    }
    #[inline(always)]
    fn affine(p: &(f32, f32), _: usize, _: usize) -> (f32, f32) {
        *p
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn codes<L: Level>(l: L, block: &[u8], _: usize) -> [L::I; 2] {
        nibbles(l, block, 4, 0)
    }
    const TABLE_BIAS: Option<i32> = Some(0);
    /// Byte `j` as is (its low nibble is element `j`) and shifted by 4 (element `j + 16`).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn indices<L: Level>(l: L, block: &[u8], _: usize) -> [L::I; 2] {
        let q = l.u8x16(bytes16(block, 4));
        [q, l.shr(q, 4)]
    }
}

impl GgmlFused for BlockQ5_0 {
    const OP: Affine = Affine::Mul;
    type Prep = f32;
    const PAIR: Option<fn(f32, f32) -> Self::Prep> = Some(|d, _| d);
    #[inline(always)]
    fn prep(block: &[u8]) -> f32 {
        f16_at(block, 0)
    }
    #[inline(always)]
    fn affine(d: &f32, _: usize, _: usize) -> (f32, f32) {
        (*d, 0.0)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn codes<L: Level>(l: L, block: &[u8], _: usize) -> [L::I; 2] {
        five_bits(l, block, 2, 6, 16)
    }
}

impl GgmlFused for BlockQ5_1 {
    const OP: Affine = Affine::MulAdd;
    type Prep = (f32, f32);
    const PAIR: Option<fn(f32, f32) -> Self::Prep> = Some(|d, m| (d, m));
    #[inline(always)]
    fn prep(block: &[u8]) -> (f32, f32) {
        (f16_at(block, 0), f16_at(block, 2))
    }
    #[inline(always)]
    fn affine(p: &(f32, f32), _: usize, _: usize) -> (f32, f32) {
        *p
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn codes<L: Level>(l: L, block: &[u8], _: usize) -> [L::I; 2] {
        five_bits(l, block, 4, 8, 0)
    }
}

impl GgmlFused for BlockQ8_0 {
    const OP: Affine = Affine::Mul;
    type Prep = f32;
    const PAIR: Option<fn(f32, f32) -> Self::Prep> = Some(|d, _| d);
    #[inline(always)]
    fn prep(block: &[u8]) -> f32 {
        f16_at(block, 0)
    }
    #[inline(always)]
    fn affine(d: &f32, _: usize, _: usize) -> (f32, f32) {
        (*d, 0.0)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn codes<L: Level>(l: L, block: &[u8], _: usize) -> [L::I; 2] {
        [l.i8x16(bytes16(block, 2)), l.i8x16(bytes16(block, 18))]
    }
}

impl GgmlFused for BlockQ2K {
    const OP: Affine = Affine::MulSub;
    /// `(d · sc, dmin · m)` of the 16 groups of 16.
    type Prep = ([f32; 16], [f32; 16]);
    #[inline(always)]
    fn prep(block: &[u8]) -> Self::Prep {
        let (d, dmin) = (f16_at(block, 80), f16_at(block, 82));
        let sc = &block[..16];
        (
            table(|i| d * f32::from(sc[i] & 0x0F)),
            table(|i| dmin * f32::from(sc[i] >> 4)),
        )
    }
    #[inline(always)]
    fn affine(p: &Self::Prep, c: usize, h: usize) -> (f32, f32) {
        (p.0[2 * c + h], p.1[2 * c + h])
    }
    /// Chunk `c` = 4·g + s: bits 2s.. of `qs[32·g + l]`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn codes<L: Level>(l: L, block: &[u8], c: usize) -> [L::I; 2] {
        let (g, s) = (c / 4, (c % 4) as u32);
        let at = 16 + 32 * g;
        [
            field(l, block, at, 2 * s, 3),
            field(l, block, at + 16, 2 * s, 3),
        ]
    }
}

impl GgmlFused for BlockQ3K {
    const OP: Affine = Affine::Mul;
    /// `d · sc` of the 16 groups of 16.
    type Prep = [f32; 16];
    #[inline(always)]
    fn prep(block: &[u8]) -> [f32; 16] {
        let d = f16_at(block, 108);
        let sc = BlockQ3K::scales(&block[96..108]);
        table(|i| d * f32::from(sc[i]))
    }
    #[inline(always)]
    fn affine(p: &[f32; 16], c: usize, h: usize) -> (f32, f32) {
        (p[2 * c + h], 0.0)
    }
    /// Chunk `c` = 4·g + s: bits 2s.. of `qs[32·g + l]`, minus 4 unless bit `c` of `hmask[l]`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn codes<L: Level>(l: L, block: &[u8], c: usize) -> [L::I; 2] {
        let (g, s) = (c / 4, (c % 4) as u32);
        let (ql, c) = (32 + 32 * g, c as u32);
        let low = [
            field(l, block, ql, 2 * s, 3),
            field(l, block, ql + 16, 2 * s, 3),
        ];
        let high = [field(l, block, 0, c, 1), field(l, block, 16, c, 1)];
        [
            l.sub(l.or(low[0], l.shl(high[0], 2)), 4),
            l.sub(l.or(low[1], l.shl(high[1], 2)), 4),
        ]
    }
}

impl GgmlFused for BlockQ4K {
    const OP: Affine = Affine::MulSub;
    /// `(d · sc, dmin · m)` of the 8 groups of 32.
    type Prep = ([f32; 8], [f32; 8]);
    #[inline(always)]
    fn prep(block: &[u8]) -> Self::Prep {
        k_prep(block)
    }
    #[inline(always)]
    fn affine(p: &Self::Prep, c: usize, _: usize) -> (f32, f32) {
        (p.0[c], p.1[c])
    }
    /// Chunk `c` = 2·g + h: nibble `h` of `qs[32·g + l]`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn codes<L: Level>(l: L, block: &[u8], c: usize) -> [L::I; 2] {
        let (g, h) = (c / 2, (c % 2) as u32);
        let at = 16 + 32 * g;
        [
            field(l, block, at, 4 * h, 0x0F),
            field(l, block, at + 16, 4 * h, 0x0F),
        ]
    }
    const TABLE_BIAS: Option<i32> = Some(0);
    /// `qs[32·g + l] >> 4·h`: nibble `h` in the low 4 bits.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn indices<L: Level>(l: L, block: &[u8], c: usize) -> [L::I; 2] {
        let (g, h) = (c / 2, (c % 2) as u32);
        let at = 16 + 32 * g;
        [
            l.shr(l.u8x16(bytes16(block, at)), 4 * h),
            l.shr(l.u8x16(bytes16(block, at + 16)), 4 * h),
        ]
    }
}

/// `[f(0), …, f(M - 1)]` (a loop the compiler inlines, unlike `std::array::from_fn`'s).
#[inline(always)]
fn table<const M: usize>(f: impl Fn(usize) -> f32) -> [f32; M] {
    let mut out = [0.0f32; M];
    for (i, o) in out.iter_mut().enumerate() {
        *o = f(i);
    }
    out
}

/// The group scales and minimums of a Q4_K or Q5_K block.
#[inline(always)]
fn k_prep(block: &[u8]) -> ([f32; 8], [f32; 8]) {
    let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
    let (sc, mn) = scale_min_k4(&block[4..16]);
    (
        table(|i| d * f32::from(sc[i])),
        table(|i| dmin * f32::from(mn[i])),
    )
}

impl GgmlFused for BlockQ5K {
    const OP: Affine = Affine::MulSub;
    type Prep = ([f32; 8], [f32; 8]);
    #[inline(always)]
    fn prep(block: &[u8]) -> Self::Prep {
        k_prep(block)
    }
    #[inline(always)]
    fn affine(p: &Self::Prep, c: usize, _: usize) -> (f32, f32) {
        (p.0[c], p.1[c])
    }
    /// Chunk `c` = 2·g + h: nibble `h` of `qs[32·g + l]`, bit `c` of `qh[l]` as bit 4.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn codes<L: Level>(l: L, block: &[u8], c: usize) -> [L::I; 2] {
        let (g, h) = (c / 2, (c % 2) as u32);
        let (qs, c) = (48 + 32 * g, c as u32);
        let low = [
            field(l, block, qs, 4 * h, 0x0F),
            field(l, block, qs + 16, 4 * h, 0x0F),
        ];
        let high = [field(l, block, 16, c, 1), field(l, block, 32, c, 1)];
        [
            l.or(low[0], l.shl(high[0], 4)),
            l.or(low[1], l.shl(high[1], 4)),
        ]
    }
}

impl GgmlFused for BlockQ6K {
    const OP: Affine = Affine::Mul;
    /// `d · sc` of the 16 groups of 16.
    type Prep = [f32; 16];
    #[inline(always)]
    fn prep(block: &[u8]) -> [f32; 16] {
        let d = f16_at(block, 208);
        table(|i| d * f32::from(block[192 + i] as i8))
    }
    #[inline(always)]
    fn affine(p: &[f32; 16], c: usize, h: usize) -> (f32, f32) {
        (p[2 * c + h], 0.0)
    }
    /// Chunk `c` = 4·g + s: nibble `s / 2` of `ql[64·g + 32·(s % 2) + l]` and bits 2s.. of
    /// `qh[32·g + l]` as bits 4 and 5, minus 32.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn codes<L: Level>(l: L, block: &[u8], c: usize) -> [L::I; 2] {
        let (g, s) = (c / 4, c % 4);
        let ql = 64 * g + 32 * (s % 2);
        let qh = 128 + 32 * g;
        let (lo_shift, hi_shift) = (4 * (s / 2) as u32, 2 * s as u32);
        let low = [
            field(l, block, ql, lo_shift, 0x0F),
            field(l, block, ql + 16, lo_shift, 0x0F),
        ];
        let high = [
            field(l, block, qh, hi_shift, 3),
            field(l, block, qh + 16, hi_shift, 3),
        ];
        [
            l.sub(l.or(low[0], l.shl(high[0], 4)), 32),
            l.sub(l.or(low[1], l.shl(high[1], 4)), 32),
        ]
    }
}

/// bitsandbytes' signed dynamic map ([`dynamic_map`]), built once: it costs microseconds, the
/// size of a small product.
fn dynamic() -> &'static [f32; 256] {
    static MAP: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    MAP.get_or_init(dynamic_map)
}

/// An NF4 weight (layout in [`super::format`]).
struct Nf4Rows<'a> {
    codes: &'a [u8],
    qabsmax: &'a [u8],
    scales: &'a [u8],
    offset: f32,
    dynamic: &'static [f32; 256],
    blocks_per_row: usize,
}

impl<'a> Nf4Rows<'a> {
    fn new(data: &'a [u8], rows: usize, cols: usize) -> Self {
        let numel = rows * cols;
        let blocks = numel / QuantFormat::NF4_BLOCK;
        let groups = blocks.div_ceil(QuantFormat::NF4_GROUP);
        let (codes, rest) = data.split_at(numel / 2);
        let (qabsmax, rest) = rest.split_at(blocks);
        let (scales, rest) = rest.split_at(4 * groups);
        Self {
            codes,
            qabsmax,
            scales,
            offset: f32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]),
            dynamic: dynamic(),
            blocks_per_row: cols / QuantFormat::NF4_BLOCK,
        }
    }

    /// The block's absmax: `DYNAMIC[qabsmax[b]] * scale[b / 256] + offset`, unfused.
    #[inline(always)]
    fn absmax(&self, b: usize) -> f32 {
        let g = 4 * (b / QuantFormat::NF4_GROUP);
        let s = &self.scales[g..g + 4];
        let scale = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        self.dynamic[usize::from(self.qabsmax[b])] * scale + self.offset
    }
}

impl Rows for Nf4Rows<'_> {
    const BLOCK: usize = QuantFormat::NF4_BLOCK;
    const BLOCK_BYTES: usize = QuantFormat::NF4_BLOCK / 2;
    const OP: Affine = Affine::Table;
    const TABLE_BIAS: Option<i32> = Some(0);
    type Prep = f32;
    fn row_bytes(&self) -> usize {
        self.blocks_per_row * Self::BLOCK / 2
    }
    fn dequantize(&self, r: usize, k: usize, out: &mut [f32]) {
        let b = r * self.blocks_per_row + k;
        let absmax = self.absmax(b);
        let bytes = &self.codes[b * Self::BLOCK / 2..(b + 1) * Self::BLOCK / 2];
        for (pair, &byte) in out.chunks_exact_mut(2).zip(bytes) {
            pair[0] = NF4[usize::from(byte >> 4)] * absmax;
            pair[1] = NF4[usize::from(byte & 0x0F)] * absmax;
        }
    }
    #[inline(always)]
    fn prep(&self, r: usize, k: usize) -> f32 {
        self.absmax(r * self.blocks_per_row + k)
    }
    #[inline(always)]
    fn affine(absmax: &f32, _: usize, _: usize) -> (f32, f32) {
        (*absmax, 0.0)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn codes<L: Level>(&self, l: L, r: usize, k: usize, c: usize) -> [L::I; 2] {
        let b = r * self.blocks_per_row + k;
        l.nibble_pairs(bytes16(self.codes, b * Self::BLOCK / 2 + 16 * c))
    }
    #[inline(always)]
    fn block_ptr(&self, r: usize, k: usize) -> *const u8 {
        let b = r * self.blocks_per_row + k;
        self.codes.as_ptr().wrapping_add(b * Self::BLOCK / 2)
    }
}

/// Dequantizes blocks `k0 .. k0 + out.len() / block` of row `r` of a `[rows, cols]` weight in
/// `format` into `out`, with the fused kernel's in-register dequantization at AVX-512 / AVX2
/// (the same operations as [`super::dequantize_range`], so the same bits) and the scalar
/// blocks elsewhere. `out.len()` and the range are whole blocks inside the row (checked by the
/// caller).
pub(crate) fn dequantize_row_blocks(
    format: QuantFormat,
    data: &[u8],
    rows: usize,
    cols: usize,
    r: usize,
    k0: usize,
    out: &mut [f32],
) {
    match format {
        QuantFormat::Q4_0 => blocks_of(&Ggml::<BlockQ4_0>::new(data, cols), r, k0, out),
        QuantFormat::Q4_1 => blocks_of(&Ggml::<BlockQ4_1>::new(data, cols), r, k0, out),
        QuantFormat::Q5_0 => blocks_of(&Ggml::<BlockQ5_0>::new(data, cols), r, k0, out),
        QuantFormat::Q5_1 => blocks_of(&Ggml::<BlockQ5_1>::new(data, cols), r, k0, out),
        QuantFormat::Q8_0 => blocks_of(&Ggml::<BlockQ8_0>::new(data, cols), r, k0, out),
        QuantFormat::Q2_K => blocks_of(&Ggml::<BlockQ2K>::new(data, cols), r, k0, out),
        QuantFormat::Q3_K => blocks_of(&Ggml::<BlockQ3K>::new(data, cols), r, k0, out),
        QuantFormat::Q4_K => blocks_of(&Ggml::<BlockQ4K>::new(data, cols), r, k0, out),
        QuantFormat::Q5_K => blocks_of(&Ggml::<BlockQ5K>::new(data, cols), r, k0, out),
        QuantFormat::Q6_K => blocks_of(&Ggml::<BlockQ6K>::new(data, cols), r, k0, out),
        QuantFormat::Nf4 => blocks_of(&Nf4Rows::new(data, rows, cols), r, k0, out),
    }
}

fn blocks_of<R: Rows>(rows: &R, r: usize, k0: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match arch() {
        pulp::Arch::V4(v4) => {
            let l = L4(v4);
            return Simd::vectorize(
                v4,
                StoreBlocks {
                    l,
                    rows,
                    r,
                    k0,
                    out,
                },
            );
        }
        pulp::Arch::V3(v3) => {
            let l = L3(v3);
            return Simd::vectorize(
                v3,
                StoreBlocks {
                    l,
                    rows,
                    r,
                    k0,
                    out,
                },
            );
        }
        _ => {}
    }
    for (i, block) in out.chunks_exact_mut(R::BLOCK).enumerate() {
        rows.dequantize(r, k0 + i, block);
    }
}

/// Stores the fused kernel's dequantized weights instead of accumulating them.
#[cfg(target_arch = "x86_64")]
struct StoreBlocks<'a, L, R> {
    l: L,
    rows: &'a R,
    r: usize,
    k0: usize,
    out: &'a mut [f32],
}

#[cfg(target_arch = "x86_64")]
impl<L: Level, R: Rows> pulp::WithSimd for StoreBlocks<'_, L, R> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        let Self {
            l,
            rows,
            r,
            k0,
            out,
        } = self;
        let (vectors, _) = <L::S as Simd>::as_mut_simd_f32s(out);
        let per_block = R::BLOCK / <L::S as Simd>::F32_LANES;
        for (i, block) in vectors.chunks_exact_mut(per_block).enumerate() {
            let k = k0 + i;
            let prep = rows.prep(r, k);
            let per_chunk = CHUNK / <L::S as Simd>::F32_LANES;
            for c in 0..R::BLOCK / CHUNK {
                let dst = &mut block[c * per_chunk..(c + 1) * per_chunk];
                let [q0, q1] = rows.codes(l, r, k, c);
                for (h, q) in [q0, q1].into_iter().enumerate() {
                    let (scale, offset) = R::affine(&prep, c, h);
                    let w = l.weights(q, R::OP, scale, offset, &NF4);
                    let w = w.as_ref();
                    dst[h * w.len()..(h + 1) * w.len()].copy_from_slice(w);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_widening_is_halfs_for_every_bit_pattern() {
        for bits in 0..=u16::MAX {
            let want = half::f16::from_bits(bits).to_f32();
            assert_eq!(f16_to_f32(bits).to_bits(), want.to_bits(), "{bits:#06x}");
        }
    }
}
