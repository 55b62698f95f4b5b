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
#[inline]
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

    /// Calls `f(c, keep(e0 + c))` for `c` in `0..len`, in order, with one Philox call per four
    /// elements (the fast path of every dropout kernel).
    #[inline(always)]
    pub fn for_each_keep(&self, e0: u64, len: usize, mut f: impl FnMut(usize, bool)) {
        let mut c = 0;
        let mut e = e0;
        while c < len {
            let words = self.block(e / 4);
            let lane = (e % 4) as usize;
            let take = (4 - lane).min(len - c);
            for (t, &x) in words[lane..lane + take].iter().enumerate() {
                f(c + t, self.keeps_word(x));
            }
            c += take;
            e += take as u64;
        }
    }

    /// `out[c] = x[c] / (1 − p)` where element `e0 + c` is kept, exactly 0 where it is dropped.
    ///
    /// # Panics
    /// When `x` and `out` differ in length.
    #[inline]
    pub fn apply(&self, e0: u64, x: &[f32], out: &mut [f32]) {
        assert_eq!(x.len(), out.len(), "DropoutMask::apply: x and out lengths");
        let s = self.scale();
        self.for_each_keep(e0, x.len(), |c, keep| {
            out[c] = if keep { x[c] * s } else { 0.0 };
        });
    }

    /// [`DropoutMask::apply`] in place on `x`.
    #[inline]
    pub fn apply_in_place(&self, e0: u64, x: &mut [f32]) {
        let s = self.scale();
        self.for_each_keep(e0, x.len(), |c, keep| {
            x[c] = if keep { x[c] * s } else { 0.0 };
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
            let mut got = Vec::new();
            m.for_each_keep(e0, 23, |c, k| got.push((c, k)));
            let want: Vec<_> = (0..23).map(|c| (c, m.keep(e0 + c as u64))).collect();
            assert_eq!(got, want, "e0 = {e0}");
        }
    }
}
