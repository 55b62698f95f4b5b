#![allow(clippy::cloned_ref_to_slice_refs)]
//! Broadcasting binary ops, element-wise maps, axis reductions and log-softmax: VJPs against
//! central finite differences (`common::gradcheck`, the loss accumulated in f64), broadcasting
//! edge cases (size-1 axes, rank differences, rank 0), errors, and the mirror backend giving
//! bitwise the CPU's results.

mod common;
use common::{bits, gradcheck, rand};
use riftco_autograd::ops::{self, GeluApproximation};
use riftco_autograd::{AutogradError, Variable};
use riftco_tensor::backend::{mirror, BinaryOp};
use riftco_tensor::{Device, MemoryCategory as C, Tensor, TensorError};

/// `rand` moved away from 0 (`|x| >= 0.1`), so no finite difference straddles a kink or a
/// pole; `positive` also makes it > 0.
fn away(shape: &[usize], seed: u64, positive: bool) -> Tensor {
    let t = rand(shape, seed);
    let v: Vec<f32> = t
        .to_vec()
        .iter()
        .map(|&x| {
            let m = x.abs() + 0.1;
            if positive || x >= 0.0 {
                m
            } else {
                -m
            }
        })
        .collect();
    Tensor::from_vec(v, shape.to_vec(), C::Workspace).unwrap()
}

const PAIRS: &[(&[usize], &[usize])] = &[
    (&[3, 4], &[3, 4]),
    (&[3, 4], &[4]),
    (&[4], &[3, 4]),
    (&[3, 1], &[1, 4]),
    (&[2, 1, 3], &[4, 1]),
    (&[], &[2, 3]),
    (&[2, 3], &[]),
    (&[], &[]),
    (&[1], &[2, 1, 1]),
];

#[test]
fn broadcasting_binary_vjps() {
    for (i, &(sa, sb)) in PAIRS.iter().enumerate() {
        let (a, b) = (rand(sa, 10 + i as u64), away(sb, 20 + i as u64, false));
        let both = [a.clone(), b.clone()];
        gradcheck(|v| ops::broadcast_add(&v[0], &v[1]), &both, &[true, true]);
        gradcheck(|v| ops::broadcast_sub(&v[0], &v[1]), &both, &[true, true]);
        gradcheck(|v| ops::broadcast_mul(&v[0], &v[1]), &both, &[true, true]);
        gradcheck(|v| ops::broadcast_div(&v[0], &v[1]), &both, &[true, true]);
        gradcheck(|v| ops::broadcast_div(&v[0], &v[1]), &both, &[false, true]);
        gradcheck(|v| ops::broadcast_mul(&v[0], &v[1]), &both, &[true, false]);
    }
    // One variable on both sides, stretched on one of them.
    let a = rand(&[3, 1], 30);
    gradcheck(
        |v| ops::broadcast_mul(&v[0], &ops::broadcast_sub(&v[0], &v[1])?),
        &[a, rand(&[1, 5], 31)],
        &[true, true],
    );
}

#[test]
fn broadcasting_shapes_and_values() {
    let a = Variable::constant(
        Tensor::from_vec(vec![1.0, 2.0, 3.0], vec![3, 1], C::Workspace).unwrap(),
    );
    let b = Variable::constant(Tensor::from_vec(vec![10.0, 20.0], vec![2], C::Workspace).unwrap());
    let y = ops::broadcast_add(&a, &b).unwrap();
    assert_eq!(y.dims(), &[3, 2]);
    assert_eq!(y.value().to_vec(), vec![11.0, 21.0, 12.0, 22.0, 13.0, 23.0]);
    let s = ops::scalar_like(2.0, &a).unwrap();
    let y = ops::broadcast_div(&s, &a).unwrap();
    assert_eq!(y.dims(), &[3, 1]);
    assert_eq!(y.value().to_vec(), vec![2.0, 1.0, 2.0 / 3.0]);
    // Same shapes: bitwise the same-shape ops the transformer uses.
    let (x, z) = (
        Variable::constant(rand(&[5, 7], 1)),
        Variable::constant(rand(&[5, 7], 2)),
    );
    assert_eq!(
        ops::broadcast_add(&x, &z).unwrap().value().to_vec(),
        ops::add(&x, &z).unwrap().value().to_vec()
    );
    assert_eq!(
        ops::broadcast_mul(&x, &z).unwrap().value().to_vec(),
        ops::mul(&x, &z).unwrap().value().to_vec()
    );
}

#[test]
fn mismatched_broadcast_names_both_shapes() {
    let a = Variable::constant(rand(&[2, 3], 1));
    let b = Variable::constant(rand(&[4, 3], 2));
    for r in [
        ops::broadcast_add(&a, &b),
        ops::broadcast_sub(&a, &b),
        ops::broadcast_mul(&a, &b),
        ops::broadcast_div(&a, &b),
        ops::compare(&a, &b, BinaryOp::Lt),
    ] {
        let err = r.expect_err("mismatch");
        assert!(
            matches!(&err, AutogradError::Tensor(TensorError::BroadcastMismatch { lhs, rhs, .. })
                if lhs == &[2, 3] && rhs == &[4, 3]),
            "{err}"
        );
        assert!(err.to_string().contains("[2, 3] and [4, 3]"), "{err}");
    }
}

#[test]
fn comparisons_are_constants() {
    let a = Variable::leaf(
        Tensor::from_vec(vec![1.0, 2.0, 3.0], vec![3], C::Workspace).unwrap(),
        true,
    );
    let b = ops::scalar_like(2.0, &a).unwrap();
    for (kind, want) in [
        (BinaryOp::Lt, [1.0, 0.0, 0.0]),
        (BinaryOp::Le, [1.0, 1.0, 0.0]),
        (BinaryOp::Gt, [0.0, 0.0, 1.0]),
        (BinaryOp::Ge, [0.0, 1.0, 1.0]),
        (BinaryOp::Eq, [0.0, 1.0, 0.0]),
        (BinaryOp::Ne, [1.0, 0.0, 1.0]),
    ] {
        let y = ops::compare(&a, &b, kind).unwrap();
        assert_eq!(y.value().to_vec(), want, "{kind:?}");
        assert!(
            !y.requires_grad() && y.is_leaf(),
            "{kind:?} must not record a graph"
        );
    }
    assert!(ops::compare(&a, &b, BinaryOp::Add).is_err());
}

#[test]
fn unary_vjps() {
    let x = away(&[3, 5], 40, false);
    let p = away(&[3, 5], 41, true);
    let one = |f: fn(&Variable) -> riftco_autograd::Result<Variable>, t: &Tensor| {
        gradcheck(|v| f(&v[0]), &[t.clone()], &[true])
    };
    one(ops::neg, &x);
    one(ops::exp, &x);
    one(ops::log, &p);
    one(ops::tanh, &x);
    one(ops::sigmoid, &x);
    one(ops::relu, &x);
    gradcheck(
        |v| ops::gelu(&v[0], GeluApproximation::None),
        &[x.clone()],
        &[true],
    );
    gradcheck(
        |v| ops::gelu(&v[0], GeluApproximation::Tanh),
        &[x.clone()],
        &[true],
    );
    for e in [2.0, 3.0, -1.0, 0.0] {
        gradcheck(|v| ops::pow_scalar(&v[0], e), &[x.clone()], &[true]);
    }
    gradcheck(|v| ops::pow_scalar(&v[0], 1.5), &[p.clone()], &[true]);
    gradcheck(|v| ops::add_scalar(&v[0], 0.7), &[x.clone()], &[true]);
    gradcheck(|v| ops::sub_scalar(&v[0], 0.7), &[x.clone()], &[true]);
    gradcheck(|v| ops::rsub_scalar(0.7, &v[0]), &[x.clone()], &[true]);
    gradcheck(|v| ops::mul_scalar(&v[0], -1.3), &[x.clone()], &[true]);
    gradcheck(|v| ops::div_scalar(&v[0], 3.0), &[x.clone()], &[true]);
    gradcheck(|v| ops::rdiv_scalar(2.0, &v[0]), &[x.clone()], &[true]);
    // Rank 0.
    gradcheck(|v| ops::tanh(&v[0]), &[away(&[], 42, false)], &[true]);
}

#[test]
fn pow_rejects_non_finite_exponents() {
    let x = Variable::constant(rand(&[2], 1));
    for p in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let err = ops::pow_scalar(&x, p).expect_err("non-finite exponent");
        assert!(
            err.to_string().contains("exponent must be a finite number"),
            "{err}"
        );
    }
}

#[test]
fn reduction_vjps() {
    let x = rand(&[2, 3, 4], 50);
    let cases: &[(Option<&[i64]>, bool)] = &[
        (None, false),
        (None, true),
        (Some(&[0]), false),
        (Some(&[-1]), true),
        (Some(&[0, 2]), false),
        (Some(&[1, -3]), true),
        (Some(&[]), false),
    ];
    for &(axes, keep) in cases {
        gradcheck(|v| ops::sum_axes(&v[0], axes, keep), &[x.clone()], &[true]);
        gradcheck(|v| ops::mean_axes(&v[0], axes, keep), &[x.clone()], &[true]);
    }
    gradcheck(
        |v| ops::sum_axes(&v[0], None, false),
        &[rand(&[], 51)],
        &[true],
    );
    for axis in [0, 1, -1] {
        gradcheck(|v| ops::log_softmax(&v[0], axis), &[x.clone()], &[true]);
    }
}

#[test]
fn reduction_shapes_and_values() {
    let x = Variable::constant(
        Tensor::from_vec((0..6).map(|v| v as f32).collect(), vec![2, 3], C::Workspace).unwrap(),
    );
    let s = ops::sum_axes(&x, Some(&[0]), false).unwrap();
    assert_eq!(
        (s.dims(), s.value().to_vec()),
        (&[3][..], vec![3.0, 5.0, 7.0])
    );
    let s = ops::sum_axes(&x, Some(&[-1]), true).unwrap();
    assert_eq!(
        (s.dims(), s.value().to_vec()),
        (&[2, 1][..], vec![3.0, 12.0])
    );
    let m = ops::mean_axes(&x, None, false).unwrap();
    assert_eq!((m.dims(), m.value().to_vec()), (&[][..], vec![2.5]));
    let id = ops::sum_axes(&x, Some(&[]), false).unwrap();
    assert_eq!(id.value().to_vec(), x.value().to_vec());
}

#[test]
fn bad_axes_name_axis_and_rank() {
    let x = Variable::constant(rand(&[2, 3], 1));
    let cases: &[(&[i64], i64, &str)] = &[
        (&[2], 2, "is out of range"),
        (&[-3], -3, "is out of range"),
        (&[0, -2], -2, "is repeated"),
    ];
    for &(axes, axis, problem) in cases {
        for r in [
            ops::sum_axes(&x, Some(axes), false),
            ops::mean_axes(&x, Some(axes), true),
        ] {
            let err = r.expect_err("bad axis");
            assert!(
                matches!(&err, AutogradError::Tensor(TensorError::BadAxis { axis: a, rank: 2, problem: p, .. })
                    if *a == axis && *p == problem),
                "{err}"
            );
            assert!(err.to_string().contains(&format!("axis {axis}")), "{err}");
        }
    }
    let scalar = Variable::constant(rand(&[], 2));
    assert!(ops::log_softmax(&scalar, 0).is_err());
    assert!(ops::log_softmax(&x, 2).is_err());
}

#[test]
fn log_softmax_is_stable_and_shift_invariant() {
    let base = rand(&[3, 5], 60).to_vec();
    let big: Vec<f32> = base.iter().map(|v| v + 1000.0).collect();
    let run = |v: Vec<f32>| {
        let x = Variable::constant(Tensor::from_vec(v, vec![3, 5], C::Workspace).unwrap());
        ops::log_softmax(&x, -1).unwrap().value().to_vec()
    };
    let (small, large) = (run(base.clone()), run(big));
    for (i, (s, l)) in small.iter().zip(&large).enumerate() {
        assert!(l.is_finite(), "element {i} of log_softmax(x + 1000) is {l}");
        assert!((s - l).abs() < 1e-3, "element {i}: {s} vs {l}");
    }
    // Rows of exp(log_softmax) sum to 1.
    for row in small.chunks(5) {
        let total: f64 = row.iter().map(|&v| (v as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-5, "{total}");
    }
}

/// Every new op through the mirror backend (CPU kernels on copies): bitwise the CPU's values
/// and gradients.
#[test]
fn mirror_backend_is_bitwise_the_cpu() {
    mirror::install();
    let run = |device: Device| {
        let leaf = |shape: &[usize], seed| {
            let mut t = rand(shape, seed);
            t.transfer_to(device).unwrap();
            Variable::leaf(t, true)
        };
        let (a, b, bias) = (leaf(&[4, 3], 70), leaf(&[4, 1], 71), leaf(&[3], 72));
        let h = ops::broadcast_add(&ops::broadcast_mul(&a, &b).unwrap(), &bias).unwrap();
        let h = ops::gelu(&ops::relu(&h).unwrap(), GeluApproximation::None).unwrap();
        let h =
            ops::broadcast_div(&h, &ops::add_scalar(&ops::exp(&b).unwrap(), 1.0).unwrap()).unwrap();
        let h = ops::broadcast_sub(&ops::tanh(&h).unwrap(), &ops::sigmoid(&bias).unwrap()).unwrap();
        let h = ops::log_softmax(&ops::pow_scalar(&h, 2.0).unwrap(), -1).unwrap();
        let m = ops::mean_axes(&h, Some(&[0]), true).unwrap();
        let cmp = ops::compare(&h, &m, BinaryOp::Gt).unwrap();
        let loss = ops::sum_axes(&ops::broadcast_mul(&h, &m).unwrap(), None, false).unwrap();
        loss.backward().unwrap();
        let mut r = vec![bits(loss.value()), bits(h.value()), bits(cmp.value())];
        r.extend([&a, &b, &bias].iter().map(|l| bits(&l.grad().unwrap())));
        r
    };
    let calls = mirror::kernel_calls();
    assert_eq!(run(Device::Cpu), run(Device::PrivateUse1));
    assert!(
        mirror::kernel_calls() > calls,
        "the mirror run went through the mirror backend"
    );
}

#[test]
fn linear_with_bias_is_one_node_and_bitwise_linear_then_add() {
    for x_dims in [&[5, 3][..], &[2, 4, 3], &[3]] {
        let x = Variable::leaf(rand(x_dims, 1), true);
        let w = Variable::leaf(rand(&[4, 3], 2), true);
        let b = Variable::leaf(rand(&[4], 3), true);
        let composed = ops::broadcast_add(&ops::linear(&x, &w).unwrap(), &b).unwrap();
        let fused = ops::linear_bias(&x, &w, &b).unwrap();
        assert_eq!(fused.value().to_vec(), composed.value().to_vec());
        // One node over the leaves, not two: the product before the bias is not retained.
        assert_eq!(fused.graph_statistics().node_count, 4);
        assert_eq!(composed.graph_statistics().node_count, 5);
        let grads = |y: &Variable| {
            ops::sum(&ops::mul(y, y).unwrap())
                .unwrap()
                .backward()
                .unwrap();
            [&x, &w, &b].map(|v| v.grad().unwrap().to_vec())
        };
        let want = grads(&composed);
        assert_eq!(grads(&fused), want, "x dims {x_dims:?}");
        gradcheck(
            |v| ops::linear_bias(&v[0], &v[1], &v[2]),
            &[rand(x_dims, 1), rand(&[4, 3], 2), rand(&[4], 3)],
            &[true, true, true],
        );
    }
    let x = Variable::leaf(rand(&[2, 3], 1), true);
    let w = Variable::leaf(rand(&[4, 3], 2), true);
    let err = ops::linear_bias(&x, &w, &Variable::leaf(rand(&[3], 3), true)).unwrap_err();
    assert!(err.to_string().contains("[3]"), "{err}");
}
