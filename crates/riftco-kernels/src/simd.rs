//! Run-time SIMD dispatch, the level override, and the vector math the kernels share.
//!
//! Kernels call [`arch`] to get a `pulp::Arch`, which picks AVX-512 (`x86-v4`), AVX2+FMA
//! (`x86-v3`), NEON or scalar at run time; matrix products follow the same level (the `gemm`
//! crate's kernels, dispatched by riftco). The environment variable
//! `RIFTCO_SIMD=scalar|avx2|avx512|neon` (read once, at the first kernel call) forces one level;
//! a level this CPU lacks, or another value, is refused: [`check_env`] returns the error (the
//! Python module raises it at import) and kernels run at the best supported level below the one
//! asked for. `RIFTCO_FORCE_SCALAR=1`
//! is kept as another name for `RIFTCO_SIMD=scalar`. In code, [`set_force_scalar`] and
//! [`set_simd_level`] change the level for the whole process; tests use them to compare every
//! level the machine has.
//!
//! Every kernel is written once, generic over `pulp::Simd`; the scalar path is the same code
//! instantiated with `pulp::Scalar` (one lane, unfused multiply-add), so SIMD and scalar use the
//! same algorithms and differ only by lane-wise summation order and fused multiply-adds.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use pulp::Simd;

// 0 = not yet read from the environment, 1 = SIMD allowed, 2 = scalar forced.
static MODE: AtomicU8 = AtomicU8::new(0);
// Highest level allowed, as a `SimdLevel` discriminant (u8::MAX = no cap).
static CAP: AtomicU8 = AtomicU8::new(u8::MAX);
// Why the environment's request was refused (set once, when it is read).
static ENV_ERROR: OnceLock<String> = OnceLock::new();

/// The environment variable that forces a SIMD level.
pub const SIMD_ENV: &str = "RIFTCO_SIMD";

/// Reads `RIFTCO_SIMD` and `RIFTCO_FORCE_SCALAR` into `MODE` and `CAP` (once).
fn read_env() -> u8 {
    let alias_value = std::env::var("RIFTCO_FORCE_SCALAR").unwrap_or_default();
    let scalar_alias = matches!(alias_value.trim(), "1" | "true" | "TRUE" | "yes");
    let requested = std::env::var(SIMD_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty());
    let (mode, error) = match requested {
        None => (if scalar_alias { 2 } else { 1 }, None),
        Some(value) => match parse_env_level(&value) {
            Err(e) => (if scalar_alias { 2 } else { 1 }, Some(e)),
            Ok(None) => (if scalar_alias { 2 } else { 1 }, None),
            Ok(Some(level)) => {
                if scalar_alias && level != SimdLevel::Scalar {
                    let e = format!(
                        "{SIMD_ENV}={value:?} contradicts RIFTCO_FORCE_SCALAR={alias_value:?}: \
                         set one of them"
                    );
                    (2, Some(e))
                } else if level == SimdLevel::Scalar {
                    (2, None)
                } else {
                    CAP.store(level as u8, Ordering::Relaxed);
                    (1, None)
                }
            }
        },
    };
    if let Some(e) = error {
        let _ = ENV_ERROR.set(e);
    }
    // Another thread may have read the environment too: both stored the same values.
    MODE.store(mode, Ordering::Relaxed);
    mode
}

/// `RIFTCO_SIMD`'s value as a level: `None` for `auto`, an error naming the value and what was
/// expected for an unknown name or a level this CPU lacks.
fn parse_env_level(value: &str) -> Result<Option<SimdLevel>, String> {
    let supported = available_levels();
    let names: Vec<&str> = supported.iter().map(|l| l.name()).collect();
    let v = value.trim().to_ascii_lowercase();
    if v == "auto" {
        return Ok(None);
    }
    let Some(level) = SimdLevel::from_name(&v) else {
        return Err(format!(
            "{SIMD_ENV}={value:?} is not a SIMD level: expected one of auto, scalar, avx2, \
             avx512, neon (this CPU supports {})",
            names.join(", ")
        ));
    };
    if !supported.contains(&level) {
        return Err(format!(
            "{SIMD_ENV}={value:?}: this CPU does not support {}; it supports {}",
            level.name(),
            names.join(", ")
        ));
    }
    Ok(Some(level))
}

/// `Err` with one line naming the value when `RIFTCO_SIMD` (or `RIFTCO_FORCE_SCALAR`) asked
/// for a level that cannot be used: an unknown name, or a level this CPU lacks. Kernels then
/// run at the best supported level below the request; callers that expose riftco (the Python
/// module, `riftco info`) turn this into an error so the request is never silently ignored.
pub fn check_env() -> Result<(), String> {
    force_scalar();
    match ENV_ERROR.get() {
        Some(e) => Err(e.clone()),
        None => Ok(()),
    }
}

/// Whether kernels must take their scalar path.
pub fn force_scalar() -> bool {
    match MODE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => read_env() == 2,
    }
}

/// Force (or stop forcing) the scalar path for the whole process.
pub fn set_force_scalar(forced: bool) {
    force_scalar(); // the environment is read first, so it cannot undo this later
    MODE.store(if forced { 2 } else { 1 }, Ordering::Relaxed);
}

/// An instruction-set level a kernel can run at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    /// One lane, plain Rust arithmetic.
    Scalar = 0,
    /// x86-64 AVX2 + FMA (8 lanes).
    Avx2 = 1,
    /// x86-64 AVX-512 F/BW/CD/DQ/VL (16 lanes).
    Avx512 = 2,
    /// AArch64 NEON (4 lanes).
    Neon = 3,
}

impl SimdLevel {
    /// The level's name as `RIFTCO_SIMD` spells it: `scalar`, `avx2`, `avx512`, `neon`.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
            SimdLevel::Neon => "neon",
        }
    }

    /// The level named `name` (as [`SimdLevel::name`] spells it), if any.
    pub fn from_name(name: &str) -> Option<SimdLevel> {
        [
            SimdLevel::Scalar,
            SimdLevel::Avx2,
            SimdLevel::Avx512,
            SimdLevel::Neon,
        ]
        .into_iter()
        .find(|l| l.name() == name)
    }
}

/// Caps the SIMD level for the whole process: `Some(level)` makes [`arch`] return `level` when
/// the CPU supports it (and the best supported level below it otherwise), `None` removes the cap.
/// [`set_force_scalar`] still wins.
pub fn set_simd_level(level: Option<SimdLevel>) {
    force_scalar(); // the environment is read first, so it cannot undo this later
    CAP.store(level.map_or(u8::MAX, |l| l as u8), Ordering::Relaxed);
}

/// The levels this CPU supports, scalar first.
pub fn available_levels() -> Vec<SimdLevel> {
    let mut levels = vec![SimdLevel::Scalar];
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        if pulp::x86::V3::try_new().is_some() {
            levels.push(SimdLevel::Avx2);
        }
        if pulp::x86::V4::try_new().is_some() {
            levels.push(SimdLevel::Avx512);
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if pulp::aarch64::Neon::try_new().is_some() {
            levels.push(SimdLevel::Neon);
        }
    }
    levels
}

/// The level [`arch`] currently selects.
pub fn current_level() -> SimdLevel {
    #[allow(unreachable_patterns)]
    match arch() {
        pulp::Arch::Scalar => SimdLevel::Scalar,
        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
        pulp::Arch::V3(_) => SimdLevel::Avx2,
        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
        pulp::Arch::V4(_) => SimdLevel::Avx512,
        #[cfg(target_arch = "aarch64")]
        pulp::Arch::Neon(_) => SimdLevel::Neon,
        _ => SimdLevel::Scalar,
    }
}

/// The SIMD architecture kernels should use: `pulp::Arch::Scalar` when scalar is forced.
pub fn arch() -> pulp::Arch {
    if force_scalar() {
        return pulp::Arch::Scalar;
    }
    let cap = CAP.load(Ordering::Relaxed);
    if cap == u8::MAX {
        return pulp::Arch::new();
    }
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        if cap >= SimdLevel::Avx512 as u8 && cap != SimdLevel::Neon as u8 {
            if let Some(s) = pulp::x86::V4::try_new() {
                return pulp::Arch::V4(s);
            }
        }
        if cap >= SimdLevel::Avx2 as u8 {
            if let Some(s) = pulp::x86::V3::try_new() {
                return pulp::Arch::V3(s);
            }
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if cap >= SimdLevel::Neon as u8 {
            if let Some(s) = pulp::aarch64::Neon::try_new() {
                return pulp::Arch::Neon(s);
            }
        }
    }
    pulp::Arch::Scalar
}

/// Defines a one-shot `pulp::WithSimd` operation: a struct holding the listed fields, whose
/// `with_simd` destructures them and evaluates the body with the chosen `Simd` bound to `$s`.
macro_rules! simd_op {
    ($name:ident<$lt:lifetime> { $($f:ident : $t:ty),* $(,)? } -> $out:ty = |$s:ident| $body:expr) => {
        struct $name<$lt> {
            $($f: $t),*
        }
        impl<$lt> pulp::WithSimd for $name<$lt> {
            type Output = $out;
            #[inline(always)]
            fn with_simd<S: pulp::Simd>(self, $s: S) -> $out {
                let Self { $($f),* } = self;
                $body
            }
        }
    };
}
pub(crate) use simd_op;

// Cephes `expf` constants (S. L. Moshier, Cephes Math Library, expf.c).
const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4; // 0.693359375: 9 significant bits, so n·LN2_HI is exact.
const LN2_LO: f32 = -2.121_944_4e-4;
const EXP_P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5, // Cephes: 5.0000001201e-1, which rounds to 0.5 in f32
];
/// Below this the result is flushed to 0 (`exp(-86.643) = 2^-125`, near the smallest normal).
const EXP_LO: f32 = -86.643_4;
/// Above this the result is `+inf` (`ln(f32::MAX)`).
const EXP_HI: f32 = 88.722_84;
/// `1.5 · 2^23`: adding it rounds a float of magnitude < 2^22 to an integer held in the low
/// mantissa bits.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// Vectorised `exp`: Cephes range reduction `x = n·ln2 + r`, `|r| <= ln2/2`, a degree-7
/// polynomial for `e^r`, and `2^n` built in the exponent bits. About 1 ulp over the normal range;
/// `x < -86.64` (including `-inf`) gives `0`, `x > 88.72` gives `+inf`, NaN gives NaN.
#[inline(always)]
pub(crate) fn exp_f32s<S: Simd>(s: S, x: S::f32s) -> S::f32s {
    let xc = s.min_f32s(s.max_f32s(x, s.splat_f32s(EXP_LO)), s.splat_f32s(EXP_HI));
    let magic = s.splat_f32s(ROUND_MAGIC);
    let t = s.mul_add_e_f32s(xc, s.splat_f32s(LOG2E), magic);
    let n = s.sub_f32s(t, magic);
    let r = s.negate_mul_add_e_f32s(n, s.splat_f32s(LN2_HI), xc);
    let r = s.negate_mul_add_e_f32s(n, s.splat_f32s(LN2_LO), r);
    let mut p = s.splat_f32s(EXP_P[0]);
    for &c in &EXP_P[1..] {
        p = s.mul_add_e_f32s(p, r, s.splat_f32s(c));
    }
    let r2 = s.mul_f32s(r, r);
    let y = s.add_f32s(s.mul_add_e_f32s(p, r2, r), s.splat_f32s(1.0));
    // bits(t) = bits(1.5·2^23) + n; shifting left by 23 keeps (n mod 2^9) in the exponent field,
    // and adding 126 builds 2^(n-1), a normal number for n in [-125, 128].
    let bits = s.wrapping_dyn_shl_u32s(s.transmute_u32s_f32s(t), s.splat_u32s(23));
    let pow = s.transmute_f32s_u32s(s.add_u32s(bits, s.splat_u32s(126 << 23)));
    // (2y)·2^(n−1), not (y·2^(n−1))·2: near the lower clamp y·2^(n−1) would be subnormal, and
    // every operation on a subnormal takes a slow microcode path (measured: a quarter of the
    // flash-attention forward time went to masked lanes clamped to EXP_LO). Both orders give
    // the same bits whenever the result is normal.
    let e = s.mul_f32s(s.mul_f32s(y, s.splat_f32s(2.0)), pow);
    let e = s.select_f32s(
        s.less_than_f32s(x, s.splat_f32s(EXP_LO)),
        s.splat_f32s(0.0),
        e,
    );
    let e = s.select_f32s(
        s.greater_than_f32s(x, s.splat_f32s(EXP_HI)),
        s.splat_f32s(f32::INFINITY),
        e,
    );
    // NaN in, NaN out (the clamps above would otherwise turn it into a number).
    s.select_f32s(s.equal_f32s(x, x), e, x)
}

/// Logistic sigmoid `1 / (1 + e^-x)` on one vector.
#[inline(always)]
pub(crate) fn sigmoid_f32s<S: Simd>(s: S, x: S::f32s) -> S::f32s {
    let one = s.splat_f32s(1.0);
    let e = exp_f32s(s, s.sub_f32s(s.splat_f32s(0.0), x));
    s.div_f32s(one, s.add_f32s(one, e))
}

/// The scalar `exp` with exactly the algorithm of the vector one (unfused multiply-adds).
pub fn exp_scalar(x: f32) -> f32 {
    exp_f32s(pulp::Scalar, x)
}

/// `out[i] = exp(x[i])` with the kernels' vectorised exponential (see the module docs; about
/// 1 ulp, results below `2^-125` flushed to 0).
///
/// # Panics
/// When `x.len() != out.len()`.
pub fn exp(x: &[f32], out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "exp: lengths");
    simd_op!(Exp<'a> { x: &'a [f32], out: &'a mut [f32] } -> () = |s| map1!(S, s, x, out, |v| exp_f32s(s, v)));
    arch().dispatch(Exp { x, out });
}

// The helpers below are macros, not functions taking closures: a closure (or the `Fn` shim of a
// function item) that LLVM declines to inline is compiled without the dispatching function's
// target features, and then every SIMD operation inside it becomes an out-of-line call
// (measured: `exp` at 50 ns per element instead of under 1). Macro bodies are pasted into the
// caller, which `pulp` compiles with the right features.

/// `out[i] = body(a[i])` over whole vectors and a zero-padded tail.
/// Usage: `map1!(S, s, a, out, |x| expr)`.
macro_rules! map1 {
    ($S:ty, $s:ident, $a:expr, $out:expr, |$x:ident| $body:expr) => {{
        let (av, at) = <$S>::as_simd_f32s($a);
        let (ov, ot) = <$S>::as_mut_simd_f32s($out);
        for (o, &$x) in ov.iter_mut().zip(av) {
            *o = $body;
        }
        if !at.is_empty() {
            let $x = $s.partial_load_f32s(at);
            let r = $body;
            $s.partial_store_f32s(ot, r);
        }
    }};
}
pub(crate) use map1;

/// `out[i] = body(a[i], b[i])` over whole vectors and a zero-padded tail.
/// Usage: `map2!(S, s, a, b, out, |x, y| expr)`.
macro_rules! map2 {
    ($S:ty, $s:ident, $a:expr, $b:expr, $out:expr, |$x:ident, $y:ident| $body:expr) => {{
        let (av, at) = <$S>::as_simd_f32s($a);
        let (bv, bt) = <$S>::as_simd_f32s($b);
        let (ov, ot) = <$S>::as_mut_simd_f32s($out);
        for ((o, &$x), &$y) in ov.iter_mut().zip(av).zip(bv) {
            *o = $body;
        }
        if !at.is_empty() {
            let $x = $s.partial_load_f32s(at);
            let $y = $s.partial_load_f32s(bt);
            let r = $body;
            $s.partial_store_f32s(ot, r);
        }
    }};
}
pub(crate) use map2;

/// `Σ body(a[i])` with four vector accumulators (a fixed order for a given level and length).
/// `body(0)` must be 0: the tail is zero-padded. Usage: `sum_map!(S, s, a, |x| expr)`.
macro_rules! sum_map {
    ($S:ty, $s:ident, $a:expr, |$x:ident| $body:expr) => {{
        let (av, at) = <$S>::as_simd_f32s($a);
        let zero = $s.splat_f32s(0.0);
        let mut acc = [zero; 4];
        let mut quads = av.chunks_exact(4);
        for q in &mut quads {
            for (a, &$x) in acc.iter_mut().zip(q) {
                *a = $s.add_f32s(*a, $body);
            }
        }
        for (a, &$x) in acc.iter_mut().zip(quads.remainder()) {
            *a = $s.add_f32s(*a, $body);
        }
        if !at.is_empty() {
            let $x = $s.partial_load_f32s(at);
            acc[0] = $s.add_f32s(acc[0], $body);
        }
        let total = $s.add_f32s($s.add_f32s(acc[0], acc[1]), $s.add_f32s(acc[2], acc[3]));
        $s.reduce_sum_f32s(total)
    }};
}
pub(crate) use sum_map;

/// The vector at `v[i..i + lanes]` (unaligned load).
#[inline(always)]
pub(crate) fn load_at<S: Simd>(v: &[f32], i: usize) -> S::f32s {
    S::as_simd_f32s(&v[i..i + S::F32_LANES]).0[0]
}

/// `Σ a[i]·b[i]` with four fused vector accumulators.
#[inline(always)]
pub(crate) fn dot<S: Simd>(s: S, a: &[f32], b: &[f32]) -> f32 {
    let (av, at) = S::as_simd_f32s(a);
    let (bv, bt) = S::as_simd_f32s(b);
    let zero = s.splat_f32s(0.0);
    let mut acc = [zero; 4];
    let mut qa = av.chunks_exact(4);
    let mut qb = bv.chunks_exact(4);
    for (x4, y4) in (&mut qa).zip(&mut qb) {
        for ((a, &x), &y) in acc.iter_mut().zip(x4).zip(y4) {
            *a = s.mul_add_e_f32s(x, y, *a);
        }
    }
    for ((a, &x), &y) in acc.iter_mut().zip(qa.remainder()).zip(qb.remainder()) {
        *a = s.mul_add_e_f32s(x, y, *a);
    }
    if !at.is_empty() {
        acc[0] = s.mul_add_e_f32s(s.partial_load_f32s(at), s.partial_load_f32s(bt), acc[0]);
    }
    let total = s.add_f32s(s.add_f32s(acc[0], acc[1]), s.add_f32s(acc[2], acc[3]));
    s.reduce_sum_f32s(total)
}

/// `max_i a[i]` (`-inf` for an empty slice); the tail is handled lane by lane so it is never
/// padded with zeros.
#[inline(always)]
pub(crate) fn max<S: Simd>(s: S, a: &[f32]) -> f32 {
    let (av, at) = S::as_simd_f32s(a);
    let ninf = s.splat_f32s(f32::NEG_INFINITY);
    let mut acc = [ninf; 2];
    let mut pairs = av.chunks_exact(2);
    for p in &mut pairs {
        acc[0] = s.max_f32s(acc[0], p[0]);
        acc[1] = s.max_f32s(acc[1], p[1]);
    }
    for &x in pairs.remainder() {
        acc[0] = s.max_f32s(acc[0], x);
    }
    let mut m = s.reduce_max_f32s(s.max_f32s(acc[0], acc[1]));
    for &x in at {
        m = m.max(x);
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_scalar_matches_std_within_two_ulp() {
        let mut x = -86.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = exp_scalar(x) as f64;
            let ulp = (want as f32).abs() * f32::EPSILON;
            assert!(
                (got - want).abs() <= 2.0 * ulp as f64,
                "x={x} got={got} want={want}"
            );
            x += 0.0137;
        }
        assert_eq!(exp_scalar(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_scalar(-1000.0), 0.0);
        assert_eq!(exp_scalar(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_scalar(0.0), 1.0);
        assert!(exp_scalar(f32::NAN).is_nan());
    }
}
