//! The general maps (`map`), broadcasting binary ops (`broadcast`) and axis reductions
//! (`reduce`) against naive `f64` references, on shapes with size-1 axes, rank differences and
//! rank 0, sizes on both sides of the parallel threshold.

use proptest::prelude::*;
use riftco_kernels::broadcast::{binary, broadcast_shape};
use riftco_kernels::map::{unary, unary_backward};
use riftco_kernels::reduce::reduce;
use riftco_kernels::{BinaryOp, ReduceOp, UnaryOp};

fn numel(d: &[usize]) -> usize {
    d.iter().product()
}

fn data(n: usize, seed: u64) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u64 ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            (h % 2001) as f32 / 250.0 - 4.0
        })
        .collect()
}

/// The element of `x [dims]` that output multi-index `idx` (of rank >= dims' rank) reads.
fn at(x: &[f32], dims: &[usize], idx: &[usize]) -> f32 {
    let off = idx.len() - dims.len();
    let mut flat = 0;
    for (k, &d) in dims.iter().enumerate() {
        flat = flat * d + if d == 1 { 0 } else { idx[off + k] };
    }
    x[flat]
}

fn unravel(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for k in (0..dims.len()).rev() {
        idx[k] = i % dims[k];
        i /= dims[k];
    }
    idx
}

fn check_binary(a_dims: &[usize], b_dims: &[usize]) {
    let out_dims = broadcast_shape(a_dims, b_dims).expect("broadcastable");
    let (a, b) = (data(numel(a_dims), 1), data(numel(b_dims), 2));
    for kind in [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Lt,
        BinaryOp::Ge,
        BinaryOp::Eq,
        BinaryOp::Ne,
    ] {
        let mut out = vec![f32::NAN; numel(&out_dims)];
        binary(kind, &a, a_dims, &b, b_dims, &out_dims, &mut out);
        for (i, &o) in out.iter().enumerate() {
            let idx = unravel(i, &out_dims);
            let want = kind.apply(at(&a, a_dims, &idx), at(&b, b_dims, &idx));
            assert_eq!(
                o.to_bits(),
                want.to_bits(),
                "{kind:?} {a_dims:?} {b_dims:?} at {idx:?}"
            );
        }
    }
}

#[test]
fn binary_broadcasts_like_numpy() {
    check_binary(&[], &[]);
    check_binary(&[3], &[]);
    check_binary(&[], &[2, 3]);
    check_binary(&[2, 3], &[3]);
    check_binary(&[2, 1], &[1, 3]);
    check_binary(&[4, 1, 5], &[3, 1]);
    check_binary(&[1], &[2, 1, 1]);
    check_binary(&[7, 1], &[7, 4]);
    // Above the parallel threshold (row split).
    check_binary(&[300, 257], &[257]);
    check_binary(&[300, 1], &[1, 257]);
}

#[test]
fn broadcast_shape_rejects_mismatches() {
    assert_eq!(broadcast_shape(&[2, 3], &[4, 3]), None);
    assert_eq!(broadcast_shape(&[3], &[4]), None);
    assert_eq!(broadcast_shape(&[2, 0], &[1]), Some(vec![2, 0]));
    assert_eq!(broadcast_shape(&[5, 1, 2], &[3, 1]), Some(vec![5, 3, 2]));
}

fn check_reduce(dims: &[usize], out_dims: &[usize]) {
    let x = data(numel(dims), 3);
    let n = numel(out_dims);
    let mut sum = vec![0.0f64; n];
    let mut max = vec![f32::NEG_INFINITY; n];
    for (i, &v) in x.iter().enumerate() {
        let idx = unravel(i, dims);
        let mut o = 0;
        for (k, &d) in out_dims.iter().enumerate() {
            o = o * d + if d == 1 { 0 } else { idx[k] };
        }
        sum[o] += v as f64;
        max[o] = max[o].max(v);
    }
    let mut out = vec![f32::NAN; n];
    reduce(ReduceOp::Sum, &x, dims, out_dims, &mut out);
    for (o, s) in out.iter().zip(&sum) {
        assert_eq!(
            o.to_bits(),
            (*s as f32).to_bits(),
            "sum {dims:?} -> {out_dims:?}"
        );
    }
    reduce(ReduceOp::Max, &x, dims, out_dims, &mut out);
    assert_eq!(out, max, "max {dims:?} -> {out_dims:?}");
}

#[test]
fn reduce_matches_f64_reference() {
    check_reduce(&[], &[]);
    check_reduce(&[5], &[1]);
    check_reduce(&[3, 4], &[3, 1]);
    check_reduce(&[3, 4], &[1, 4]);
    check_reduce(&[3, 4], &[1, 1]);
    check_reduce(&[2, 3, 4], &[2, 1, 4]);
    check_reduce(&[2, 3, 4], &[1, 3, 1]);
    check_reduce(&[2, 1, 4], &[2, 1, 1]);
    check_reduce(&[0, 4], &[1, 4]);
}

#[test]
fn reduce_max_propagates_nan() {
    let mut out = [0.0; 1];
    reduce(ReduceOp::Max, &[1.0, f32::NAN, 3.0], &[3], &[1], &mut out);
    assert!(out[0].is_nan());
}

/// `f(x)` and `f'(x)` in f64 for the reference.
fn reference(kind: UnaryOp, x: f64) -> (f64, f64) {
    let erf = series_erf;
    match kind {
        UnaryOp::Neg => (-x, -1.0),
        UnaryOp::Exp => (x.exp(), x.exp()),
        UnaryOp::Log => (x.ln(), 1.0 / x),
        UnaryOp::Tanh => (x.tanh(), 1.0 - x.tanh().powi(2)),
        UnaryOp::Sigmoid => {
            let s = 1.0 / (1.0 + (-x).exp());
            (s, s * (1.0 - s))
        }
        UnaryOp::Relu => (x.max(0.0), if x > 0.0 { 1.0 } else { 0.0 }),
        UnaryOp::Gelu => {
            let cdf = 0.5 * (1.0 + erf(x / 2f64.sqrt()));
            let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
            (x * cdf, cdf + x * pdf)
        }
        UnaryOp::GeluTanh => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            let t = (c * (x + 0.044715 * x.powi(3))).tanh();
            (
                0.5 * x * (1.0 + t),
                0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x),
            )
        }
        UnaryOp::PowScalar(p) => (x.powf(p as f64), p as f64 * x.powf(p as f64 - 1.0)),
        UnaryOp::AddScalar(c) => (x + c as f64, 1.0),
        UnaryOp::MulScalar(c) => (x * c as f64, c as f64),
        UnaryOp::DivScalar(c) => (x / c as f64, 1.0 / c as f64),
        UnaryOp::RSubScalar(c) => (c as f64 - x, -1.0),
        UnaryOp::RDivScalar(c) => (c as f64 / x, -(c as f64) / (x * x)),
    }
}

/// erf from its Maclaurin series (independent of the kernel's `libm`; accurate in f64 for the
/// test range |x| <= 4 with 200 terms).
fn series_erf(x: f64) -> f64 {
    let mut term = x;
    let mut sum = x;
    for n in 1..200 {
        term *= -x * x / n as f64;
        sum += term / (2 * n + 1) as f64;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

#[test]
fn unary_matches_f64_reference() {
    let n = 40_000; // above the parallel threshold
    let x: Vec<f32> = data(n, 4);
    let pos: Vec<f32> = x.iter().map(|v| v.abs() + 0.25).collect();
    let dy = data(n, 5);
    for kind in [
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Gelu,
        UnaryOp::GeluTanh,
        UnaryOp::PowScalar(2.0),
        UnaryOp::PowScalar(1.5),
        UnaryOp::PowScalar(-1.0),
        UnaryOp::AddScalar(0.5),
        UnaryOp::MulScalar(-3.0),
        UnaryOp::DivScalar(3.0),
        UnaryOp::RSubScalar(2.0),
        UnaryOp::RDivScalar(2.0),
    ] {
        let positive_only = matches!(
            kind,
            UnaryOp::Log | UnaryOp::PowScalar(_) | UnaryOp::RDivScalar(_)
        );
        let x = if positive_only { &pos } else { &x };
        let mut y = vec![0.0; n];
        let mut dx = vec![0.0; n];
        unary(kind, x, &mut y);
        unary_backward(kind, x, &y, &dy, &mut dx);
        for i in 0..n {
            let (f, d) = reference(kind, x[i] as f64);
            let tol = |v: f64| 2e-6 * v.abs().max(1.0);
            assert!(
                (y[i] as f64 - f).abs() <= tol(f),
                "{kind:?}({}) = {} not {f}",
                x[i],
                y[i]
            );
            let g = dy[i] as f64 * d;
            assert!(
                (dx[i] as f64 - g).abs() <= 4.0 * tol(g),
                "{kind:?}'({}) · {} = {} not {g}",
                x[i],
                dy[i],
                dx[i]
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn binary_random_broadcasts(dims in proptest::collection::vec(1usize..4, 0..4),
                                mask_a in 0u8..16, mask_b in 0u8..16, drop in 0usize..3) {
        // Each operand takes the output dims with some axes set to 1 and some leading ones
        // dropped.
        let squash = |mask: u8| -> Vec<usize> {
            dims.iter().enumerate().map(|(k, &d)| if mask >> k & 1 == 1 { 1 } else { d }).collect()
        };
        let a = squash(mask_a);
        let b: Vec<usize> = squash(mask_b).into_iter().skip(drop.min(dims.len())).collect();
        check_binary(&a, &b);
        check_reduce(&dims, &a);
    }
}
