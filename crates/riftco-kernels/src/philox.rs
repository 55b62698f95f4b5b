//! Philox4x32-10, a counter-based random number generator (Salmon, Moraes, Dror, Shaw 2011,
//! "Parallel Random Numbers: As Easy as 1, 2, 3", SC'11, section 4.3), and the dropout mask it
//! defines.
//!
//! A counter-based generator is a pure function of (counter, key): any element's random word
//! can be computed on its own, in any order, on any thread, and again in a backward pass or a
//! checkpoint replay, without storing the mask or carrying generator state.
//!
//! # The mask contract
//! Element `e` (0-based linear index in the op's index space) of a [`DropoutMask`] uses the
//! Philox block `n = offset + e / 4` (wrapping in `u64`) with counter
//! `[n as u32, (n >> 32) as u32, stream[0], stream[1]]` and key `key`, and output word `e % 4`;
//! call it `x`. The element is kept iff `((x >> 8) as f32) · 2⁻²⁴ >= p` (a uniform draw on the
//! 24-bit grid `[0, 1)`, exact in `f32`). Kept elements are multiplied by `1 / (1 − p)`
//! (computed in `f32`), dropped ones are exactly 0. `p == 0` keeps everything.

/// Philox multipliers (`M0`, `M1`) and Weyl key increments (`W0`, `W1`) of the paper.
const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Elements per chunk of [`DropoutMask::for_each_chunk`] (a multiple of 4, and of the
/// backward's key tile).
pub const KEEP_CHUNK: usize = 64;

/// One Philox round on `c` with round key `k`.
#[inline(always)]
fn round(c: [u32; 4], k: [u32; 2]) -> [u32; 4] {
    let p0 = u64::from(M0) * u64::from(c[0]);
    let p1 = u64::from(M1) * u64::from(c[2]);
    [
        ((p1 >> 32) as u32) ^ c[1] ^ k[0],
        p1 as u32,
        ((p0 >> 32) as u32) ^ c[3] ^ k[1],
        p0 as u32,
    ]
}

/// Philox4x32 with 10 rounds: the four 32-bit output words of block `counter` under `key`.
/// Matches the Random123 known-answer vectors (`examples/kat_vectors` of the Random123
/// distribution).
#[inline(always)]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    c = round(c, k);
    for _ in 1..10 {
        k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        c = round(c, k);
    }
    c
}

/// The dropout mask of one op: a pure function of `(p, key, stream, offset)` and the element
/// index (see the [module documentation](self) for the exact contract).
///
/// `p` is the drop probability, finite and in `[0, 1)` (callers validate it with
/// [`DropoutMask::is_valid_p`]); `key` is the Philox key (from the seed), `stream` selects an
/// independent stream (for example per op call), and `offset` is the first Philox block, so
/// several ops can share a stream on disjoint block ranges.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropoutMask {
    /// Drop probability in `[0, 1)`.
    pub p: f32,
    /// Philox key.
    pub key: [u32; 2],
    /// Counter words 2 and 3 of every block.
    pub stream: [u32; 2],
    /// Philox block of element 0 (counter words 0 and 1).
    pub offset: u64,
}

impl DropoutMask {
    /// Whether `p` is a usable drop probability: finite and in `[0, 1)`.
    pub fn is_valid_p(p: f32) -> bool {
        p.is_finite() && (0.0..1.0).contains(&p)
    }

    /// The factor kept elements are multiplied by: `1 / (1 − p)` in `f32`.
    #[inline]
    pub fn scale(&self) -> f32 {
        1.0 / (1.0 - self.p)
    }

    /// Whether the mask keeps every element (`p == 0`): no generation is needed.
    #[inline]
    pub fn is_identity(&self) -> bool {
        self.p == 0.0
    }

    /// The four random words of Philox block `offset + b` (wrapping).
    #[inline(always)]
    pub fn block(&self, b: u64) -> [u32; 4] {
        let n = self.offset.wrapping_add(b);
        philox4x32_10(
            [n as u32, (n >> 32) as u32, self.stream[0], self.stream[1]],
            self.key,
        )
    }

    /// Whether the random word `x` keeps its element: `((x >> 8) as f32) · 2⁻²⁴ >= p`.
    #[inline(always)]
    pub fn keeps_word(&self, x: u32) -> bool {
        ((x >> 8) as f32) * (1.0 / 16_777_216.0) >= self.p
    }

    /// Whether element `e` is kept.
    pub fn keep(&self, e: u64) -> bool {
        self.keeps_word(self.block(e / 4)[(e % 4) as usize])
    }

    /// All ones where the word `x` keeps its element, 0 where it drops it (a select mask).
    #[inline(always)]
    pub fn keep_bits(&self, x: u32) -> u32 {
        u32::from(self.keeps_word(x)).wrapping_neg()
    }

    /// `words[c]` = the random word of element `e0 + c`: one Philox call per 4 elements
    /// (a partial block at an unaligned start and at the end).
    #[inline(always)]
    pub fn fill_words(&self, e0: u64, words: &mut [u32]) {
        let head = ((4 - (e0 % 4) as usize) % 4).min(words.len());
        if head > 0 {
            let lane = (e0 % 4) as usize;
            words[..head].copy_from_slice(&self.block(e0 / 4)[lane..lane + head]);
        }
        let mut b = e0.div_ceil(4);
        let mut body = words[head..].chunks_exact_mut(4);
        for w in &mut body {
            w.copy_from_slice(&self.block(b));
            b += 1;
        }
        let rest = body.into_remainder();
        let n = rest.len();
        if n > 0 {
            rest.copy_from_slice(&self.block(b)[..n]);
        }
    }

    /// Calls `f(c0, masks)` for consecutive chunks (at most [`KEEP_CHUNK`] elements) covering
    /// `0..len`, in order, where `masks[t]` is [`DropoutMask::keep_bits`] of element
    /// `e0 + c0 + t`: the fast path of every dropout kernel. Selecting with the mask
    /// (`bits(x) & mask`) keeps the per-element work branch-free and vectorizable.
    #[inline(always)]
    pub fn for_each_chunk(&self, e0: u64, len: usize, mut f: impl FnMut(usize, &[u32])) {
        let mut words = [0u32; KEEP_CHUNK];
        let mut c0 = 0;
        while c0 < len {
            let n = KEEP_CHUNK.min(len - c0);
            let w = &mut words[..n];
            self.fill_words(e0 + c0 as u64, w);
            for x in w.iter_mut() {
                *x = self.keep_bits(*x);
            }
            f(c0, w);
            c0 += n;
        }
    }

    /// `out[c] = x[c] / (1 − p)` where element `e0 + c` is kept, exactly 0 where it is dropped.
    ///
    /// # Panics
    /// When `x` and `out` differ in length.
    #[inline(always)]
    pub fn apply(&self, e0: u64, x: &[f32], out: &mut [f32]) {
        assert_eq!(x.len(), out.len(), "DropoutMask::apply: x and out lengths");
        let s = self.scale();
        self.for_each_chunk(e0, x.len(), |c0, masks| {
            let n = masks.len();
            for ((o, &v), &m) in out[c0..c0 + n].iter_mut().zip(&x[c0..c0 + n]).zip(masks) {
                *o = f32::from_bits((v * s).to_bits() & m);
            }
        });
    }

    /// [`DropoutMask::apply`] in place on `x`.
    #[inline(always)]
    pub fn apply_in_place(&self, e0: u64, x: &mut [f32]) {
        let s = self.scale();
        self.for_each_chunk(e0, x.len(), |c0, masks| {
            for (v, &m) in x[c0..c0 + masks.len()].iter_mut().zip(masks) {
                *v = f32::from_bits((*v * s).to_bits() & m);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_path_matches_keep_at_unaligned_starts() {
        let m = DropoutMask {
            p: 0.5,
            key: [1, 2],
            stream: [3, 4],
            offset: u64::MAX - 2,
        };
        for e0 in 0..9u64 {
            for len in [0, 1, 3, 4, 23, 64, 65, 200] {
                let mut got = Vec::new();
                m.for_each_chunk(e0, len, |c0, masks| {
                    assert_eq!(c0, got.len());
                    got.extend(masks.iter().map(|&b| b == u32::MAX));
                    assert!(masks.iter().all(|&b| b == 0 || b == u32::MAX));
                });
                let want: Vec<_> = (0..len).map(|c| m.keep(e0 + c as u64)).collect();
                assert_eq!(got, want, "e0 = {e0}, len {len}");
            }
        }
    }
}
