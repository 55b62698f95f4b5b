//! Element-wise maps of one tensor, [`UnaryOp`]: forward ([`unary`]) and VJP
//! ([`unary_backward`]).
//!
//! Every element's result depends only on that element, so large inputs are split into fixed
//! ranges over the kernel pool and the result does not depend on the thread count. The cheap
//! maps (scalar add/mul/div, exp, sigmoid) run at the SIMD level chosen by
//! [`crate::simd::arch`] (exp and sigmoid with the kernels' vectorised exponential: about
//! 1 ulp, results below `2^-125` flushed to 0); negation and ReLU are loops LLVM vectorises;
//! the others are scalar `f32` loops (the exact GELU with [`libm::erff`]).

use pulp::Simd;
use rayon::prelude::*;

use crate::par;
use crate::simd::{arch, exp_f32s, map1, sigmoid_f32s, simd_op};

/// `√(2/π)`, the GELU tanh approximation's scale.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// `1/√(2π)`, the standard normal density at 0.
const INV_SQRT_2PI: f32 = 0.398_942_3;
/// The cubic coefficient of the GELU tanh approximation.
const GELU_TANH_C: f32 = 0.044_715;

/// An element-wise map `y = f(x)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    /// `−x`.
    Neg,
    /// `eˣ`.
    Exp,
    /// `ln x` (NaN below 0, `−inf` at 0).
    Log,
    /// `tanh x`.
    Tanh,
    /// `1 / (1 + e⁻ˣ)`.
    Sigmoid,
    /// `max(x, 0)` (the VJP takes the derivative at 0 as 0, as PyTorch).
    Relu,
    /// Exact GELU, `x · Φ(x) = x/2 · (1 + erf(x/√2))` (Hendrycks & Gimpel 2016; PyTorch's
    /// `approximate="none"`).
    Gelu,
    /// GELU's tanh approximation, `x/2 · (1 + tanh(√(2/π)(x + 0.044715 x³)))` (PyTorch's
    /// `approximate="tanh"`).
    GeluTanh,
    /// `xᵖ` (`powf`; the VJP is `p · xᵖ⁻¹`, exactly 0 for `p = 0`).
    PowScalar(f32),
    /// `x + c`.
    AddScalar(f32),
    /// `c · x`.
    MulScalar(f32),
    /// `x / c`.
    DivScalar(f32),
    /// `c − x`.
    RSubScalar(f32),
    /// `c / x`.
    RDivScalar(f32),
}

impl UnaryOp {
    /// `f(x)` for one element (the scalar path of [`unary`]).
    #[inline(always)]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            UnaryOp::Neg => -x,
            UnaryOp::Exp => crate::simd::exp_scalar(x),
            UnaryOp::Log => x.ln(),
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Sigmoid => 1.0 / (1.0 + crate::simd::exp_scalar(-x)),
            UnaryOp::Relu => relu(x),
            UnaryOp::Gelu => 0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2)),
            UnaryOp::GeluTanh => {
                let inner = SQRT_2_OVER_PI * (x + GELU_TANH_C * x * x * x);
                0.5 * x * (1.0 + inner.tanh())
            }
            UnaryOp::PowScalar(p) => pow(x, p),
            UnaryOp::AddScalar(c) => x + c,
            UnaryOp::MulScalar(c) => c * x,
            UnaryOp::DivScalar(c) => x / c,
            UnaryOp::RSubScalar(c) => c - x,
            UnaryOp::RDivScalar(c) => c / x,
        }
    }

    /// `dy · f'(x)` for one element, given `x` and the forward output `y = f(x)`.
    #[inline(always)]
    pub fn backward(self, x: f32, y: f32, dy: f32) -> f32 {
        match self {
            UnaryOp::Neg | UnaryOp::RSubScalar(_) => -dy,
            UnaryOp::Exp => dy * y,
            UnaryOp::Log => dy / x,
            UnaryOp::Tanh => dy * (1.0 - y * y),
            UnaryOp::Sigmoid => dy * (y * (1.0 - y)),
            UnaryOp::Relu => {
                if x > 0.0 {
                    dy
                } else {
                    0.0
                }
            }
            UnaryOp::Gelu => {
                let cdf = 0.5 * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2));
                let pdf = (-0.5 * x * x).exp() * INV_SQRT_2PI;
                dy * (cdf + x * pdf)
            }
            UnaryOp::GeluTanh => {
                let x2 = x * x;
                let t = (SQRT_2_OVER_PI * (x + GELU_TANH_C * x2 * x)).tanh();
                let dinner = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_TANH_C * x2);
                dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner)
            }
            UnaryOp::PowScalar(p) => {
                if p == 0.0 {
                    0.0
                } else {
                    dy * (p * pow(x, p - 1.0))
                }
            }
            UnaryOp::AddScalar(_) => dy,
            UnaryOp::MulScalar(c) => dy * c,
            UnaryOp::DivScalar(c) => dy / c,
            UnaryOp::RDivScalar(_) => -dy * (y / x),
        }
    }
}

#[inline(always)]
fn relu(x: f32) -> f32 {
    // NaN stays NaN (as PyTorch); -0.0 becomes +0.0.
    if x > 0.0 || x.is_nan() {
        x
    } else {
        0.0
    }
}

/// `xᵖ` with the small integer powers as exact products (so `x ** 2` is `x · x`, as PyTorch).
#[inline(always)]
fn pow(x: f32, p: f32) -> f32 {
    if p == 1.0 {
        x
    } else if p == 2.0 {
        x * x
    } else if p == 0.5 {
        x.sqrt()
    } else {
        x.powf(p)
    }
}

/// The SIMD body for the maps that have one; `false` (nothing written) for the others.
#[inline(always)]
fn unary_simd<S: Simd>(s: S, kind: UnaryOp, x: &[f32], out: &mut [f32]) -> bool {
    match kind {
        UnaryOp::AddScalar(c) => map1!(S, s, x, out, |v| s.add_f32s(v, s.splat_f32s(c))),
        UnaryOp::MulScalar(c) => map1!(S, s, x, out, |v| s.mul_f32s(s.splat_f32s(c), v)),
        UnaryOp::DivScalar(c) => map1!(S, s, x, out, |v| s.div_f32s(v, s.splat_f32s(c))),
        UnaryOp::RSubScalar(c) => map1!(S, s, x, out, |v| s.sub_f32s(s.splat_f32s(c), v)),
        UnaryOp::RDivScalar(c) => map1!(S, s, x, out, |v| s.div_f32s(s.splat_f32s(c), v)),
        UnaryOp::Exp => map1!(S, s, x, out, |v| exp_f32s(s, v)),
        UnaryOp::Sigmoid => map1!(S, s, x, out, |v| sigmoid_f32s(s, v)),
        _ => return false,
    }
    true
}

simd_op!(UnaryKernel<'a> { kind: UnaryOp, x: &'a [f32], out: &'a mut [f32] } -> () = |s| {
    if !unary_simd(s, kind, x, out) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = kind.apply(v);
        }
    }
});

/// `out[i] = f(x[i])` for the map `kind`.
///
/// # Panics
/// When `x.len() != out.len()`.
pub fn unary(kind: UnaryOp, x: &[f32], out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "unary: lengths");
    let serial = |x: &[f32], out: &mut [f32]| {
        if kind == UnaryOp::Neg {
            // A sign flip (−0 for +0, as PyTorch), which LLVM vectorises.
            for (o, &v) in out.iter_mut().zip(x) {
                *o = -v;
            }
        } else if matches!(kind, UnaryOp::Relu) {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = relu(v);
            }
        } else {
            arch().dispatch(UnaryKernel { kind, x, out });
        }
    };
    match par::elements_per_task(x.len()) {
        None => serial(x, out),
        Some(n) => par::install(|| {
            out.par_chunks_mut(n)
                .zip(x.par_chunks(n))
                .for_each(|(o, x)| serial(x, o));
        }),
    }
}

/// `dx[i] = dy[i] · f'(x[i])` for the map `kind`, given its input `x` and output `y`.
///
/// # Panics
/// When the four lengths differ.
pub fn unary_backward(kind: UnaryOp, x: &[f32], y: &[f32], dy: &[f32], dx: &mut [f32]) {
    let n = dx.len();
    assert!(
        x.len() == n && y.len() == n && dy.len() == n,
        "unary_backward: lengths"
    );
    let serial = |x: &[f32], y: &[f32], dy: &[f32], dx: &mut [f32]| {
        for (((d, &x), &y), &g) in dx.iter_mut().zip(x).zip(y).zip(dy) {
            *d = kind.backward(x, y, g);
        }
    };
    match par::elements_per_task(n) {
        None => serial(x, y, dy, dx),
        Some(t) => par::install(|| {
            dx.par_chunks_mut(t)
                .zip(x.par_chunks(t))
                .zip(y.par_chunks(t))
                .zip(dy.par_chunks(t))
                .for_each(|(((d, x), y), g)| serial(x, y, g, d));
        }),
    }
}
