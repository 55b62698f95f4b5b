//! A small, documented, portable random number generator.
//!
//! `Rng` is xoshiro256++ (Blackman & Vigna 2019) seeded through SplitMix64, so a `u64` seed gives
//! the same stream on every platform. Uniform floats take the top 24 (f32) or 53 (f64) bits.
//! Normal samples use the Box–Muller transform computed in f64 with the pure-Rust `libm`
//! functions (`log`, `sqrt`, `cos`, `sin`), which give the same bits on every platform, then round
//! once to f32.

/// xoshiro256++ generator.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
    spare_normal: Option<f64>,
}

impl Rng {
    /// Seeds the state with four SplitMix64 outputs of `seed`.
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Self {
            s: [next(), next(), next(), next()],
            spare_normal: None,
        }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 * (1.0 / (1u32 << 24) as f32);
        lo + (hi - lo) * u
    }

    /// Uniform integer in `[0, n)` (`n > 0`), by rejection so it is unbiased.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "Rng::below: n must be positive");
        let zone = u64::MAX - (u64::MAX % n);
        loop {
            let r = self.next_u64();
            if r < zone {
                return r % n;
            }
        }
    }

    /// Standard normal sample (Box–Muller, both outputs used).
    pub fn normal(&mut self) -> f64 {
        if let Some(z) = self.spare_normal.take() {
            return z;
        }
        // u1 in (0, 1] so log(u1) is finite.
        let u1 = 1.0 - self.next_f64();
        let u2 = self.next_f64();
        let r = libm::sqrt(-2.0 * libm::log(u1));
        let theta = 2.0 * std::f64::consts::PI * u2;
        self.spare_normal = Some(r * libm::sin(theta));
        r * libm::cos(theta)
    }
}
