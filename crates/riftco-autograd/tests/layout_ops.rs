//! Layout ops through strided views: permute/transpose, basic indexing, concat/stack and
//! reshape with -1. Values on known inputs, VJPs against f64 finite differences
//! (`common::gradcheck`; these ops are linear, so the differences are exact up to f32
//! rounding), edge sizes, errors, and the mirror backend bitwise equal to the CPU.

mod common;
use common::{bits, gradcheck, rand};
use riftco_autograd::ops::{self, IndexItem as I};
use riftco_autograd::{AutogradError, Variable};
use riftco_tensor::backend::mirror;
use riftco_tensor::{Device, MemoryCategory as C, Tensor, TensorError};

fn iota(dims: &[usize]) -> Variable {
    let n: usize = dims.iter().product();
    let t = Tensor::from_vec(
        (0..n).map(|i| i as f32).collect(),
        dims.to_vec(),
        C::Workspace,
    )
    .unwrap();
    Variable::leaf(t, true)
}

fn sl(start: Option<isize>, stop: Option<isize>, step: Option<isize>) -> I {
    I::Slice { start, stop, step }
}

fn tensor_err(r: riftco_autograd::Result<Variable>) -> TensorError {
    match r {
        Err(AutogradError::Tensor(e)) => e,
        Err(e) => panic!("expected a TensorError, got {e}"),
        Ok(v) => panic!("expected an error, got shape {:?}", v.dims()),
    }
}

#[test]
fn permute_and_transpose_values() {
    let x = iota(&[2, 3]);
    let t = ops::transpose(&x, 0, -1).unwrap();
    assert_eq!(t.dims(), &[3, 2]);
    assert_eq!(t.value().to_vec(), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    let x = iota(&[2, 3, 4]);
    let p = ops::permute(&x, &[2, 0, 1]).unwrap();
    assert_eq!(p.dims(), &[4, 2, 3]);
    // p[k, i, j] = x[i, j, k] = 12 i + 4 j + k
    let v = p.value().to_vec();
    assert_eq!(v[(3 * 2 + 1) * 3 + 2], (12 + 4 * 2 + 3) as f32);
    // transpose_0213 (the transformer's layout op) agrees with permute(0, 2, 1, 3).
    let x = Variable::leaf(rand(&[2, 3, 4, 5], 3), true);
    let a = ops::swap_axes_1_2(&x).unwrap();
    let b = ops::permute(&x, &[0, 2, 1, 3]).unwrap();
    assert_eq!(a.value().to_vec(), b.value().to_vec());
}

#[test]
fn permute_transpose_vjps_match_finite_differences() {
    gradcheck(
        |v| ops::permute(&v[0], &[1, -1, 0]),
        &[rand(&[2, 3, 4], 1)],
        &[true],
    );
    gradcheck(
        |v| ops::transpose(&v[0], 0, 1),
        &[rand(&[3, 1], 2)],
        &[true],
    );
    gradcheck(|v| ops::permute(&v[0], &[]), &[rand(&[], 3)], &[true]);
}

#[test]
fn index_follows_numpy_basic_indexing() {
    let x = iota(&[2, 3, 4]);
    // x[1, ::-2, None, -1] = [[x[1,2,3]], [x[1,0,3]]] = [[23], [15]]
    let y = ops::index(
        &x,
        &[I::Int(1), sl(None, None, Some(-2)), I::NewAxis, I::Int(-1)],
    )
    .unwrap();
    assert_eq!(y.dims(), &[2, 1]);
    assert_eq!(y.value().to_vec(), vec![23.0, 15.0]);
    // x[..., 1:3] keeps the leading axes; clamped bounds: x[0, -100:100:2, 5:] is [2, 0].
    let y = ops::index(&x, &[I::Ellipsis, sl(Some(1), Some(3), None)]).unwrap();
    assert_eq!(y.dims(), &[2, 3, 2]);
    assert_eq!(&y.value().to_vec()[..4], &[1.0, 2.0, 5.0, 6.0]);
    let y = ops::index(
        &x,
        &[
            I::Int(0),
            sl(Some(-100), Some(100), Some(2)),
            sl(Some(5), None, None),
        ],
    )
    .unwrap();
    assert_eq!(y.dims(), &[2, 0]);
    assert!(y.value().to_vec().is_empty());
    // A rank-0 result, and x[()] (no items) is a copy of x.
    let y = ops::index(&x, &[I::Int(-1), I::Int(2), I::Int(0)]).unwrap();
    assert_eq!(y.dims(), &[] as &[usize]);
    assert_eq!(y.value().to_vec(), vec![20.0]);
    let y = ops::index(&x, &[]).unwrap();
    assert_eq!(y.value().to_vec(), x.value().to_vec());
    // Negative step from a clamped start: x[0, 0, 10::-3] = x[0,0,3], x[0,0,0]
    let y = ops::index(&x, &[I::Int(0), I::Int(0), sl(Some(10), None, Some(-3))]).unwrap();
    assert_eq!(y.value().to_vec(), vec![3.0, 0.0]);
}

#[test]
fn extreme_slice_bounds_and_steps_clamp_as_in_python() {
    let x = iota(&[2, 5]);
    let y = ops::index(&x, &[I::Int(1), sl(None, None, Some(isize::MAX))]).unwrap();
    assert_eq!(y.value().to_vec(), vec![5.0]);
    let y = ops::index(&x, &[I::Int(1), sl(None, None, Some(isize::MIN))]).unwrap();
    assert_eq!(y.value().to_vec(), vec![9.0]);
    let y = ops::index(
        &x,
        &[I::Int(0), sl(Some(isize::MIN), Some(isize::MAX), Some(3))],
    )
    .unwrap();
    assert_eq!(y.value().to_vec(), vec![0.0, 3.0]);
    let y = ops::index(
        &x,
        &[I::Int(0), sl(Some(isize::MAX), Some(isize::MIN), Some(-4))],
    )
    .unwrap();
    assert_eq!(y.value().to_vec(), vec![4.0, 0.0]);
    let e = tensor_err(ops::index(&x, &[I::Int(isize::MIN)]));
    assert!(
        matches!(
            e,
            TensorError::IndexOutOfBounds {
                axis: 0,
                size: 2,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn index_vjp_scatters_into_zeros_and_matches_finite_differences() {
    let exprs: Vec<Vec<I>> = vec![
        vec![I::Int(1)],
        vec![
            sl(None, None, Some(-1)),
            I::NewAxis,
            sl(Some(1), None, Some(2)),
        ],
        vec![I::Ellipsis, I::Int(-2)],
        vec![
            sl(Some(0), Some(1), None),
            I::Ellipsis,
            sl(Some(3), Some(0), Some(-2)),
        ],
    ];
    for e in exprs {
        let e2 = e.clone();
        gradcheck(
            move |v| ops::index(&v[0], &e2),
            &[rand(&[3, 1, 4], 5)],
            &[true],
        );
    }
    // The exact adjoint: ones scattered into the selected positions, zeros elsewhere.
    let x = iota(&[2, 3]);
    let y = ops::index(&x, &[I::Int(0), sl(None, None, Some(2))]).unwrap();
    ops::sum(&y).unwrap().backward().unwrap();
    assert_eq!(
        x.grad().unwrap().to_vec(),
        vec![1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    );
    // An empty selection: gradient of zeros with the input's shape.
    let x = iota(&[2, 3]);
    let y = ops::index(&x, &[sl(Some(1), Some(1), None)]).unwrap();
    assert_eq!(y.dims(), &[0, 3]);
    let z = ops::concat(
        &[y, ops::index(&x, &[sl(Some(0), Some(1), None)]).unwrap()],
        0,
    )
    .unwrap();
    ops::sum(&z).unwrap().backward().unwrap();
    assert_eq!(
        x.grad().unwrap().to_vec(),
        vec![1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    );
}

#[test]
fn index_errors_name_index_axis_and_size() {
    let x = iota(&[2, 3]);
    let e = tensor_err(ops::index(&x, &[I::Ellipsis, I::Int(3)]));
    assert_eq!(
        e,
        TensorError::IndexOutOfBounds {
            op: "index",
            index: 3,
            axis: 1,
            size: 3
        }
    );
    let msg = e.to_string();
    assert!(
        msg.contains("index 3") && msg.contains("axis 1") && msg.contains("size 3"),
        "{msg}"
    );
    let e = tensor_err(ops::index(&x, &[I::Int(-3)]));
    assert!(e.to_string().contains("-2..2"), "{e}");
    for (items, want) in [
        (vec![sl(None, None, Some(0))], "step cannot be zero"),
        (vec![I::Ellipsis, I::Ellipsis], "single ellipsis"),
        (vec![I::Int(0), I::Int(0), I::Int(0)], "too many indices"),
    ] {
        let e = tensor_err(ops::index(&x, &items));
        assert!(e.to_string().contains(want), "{e}");
        // Too many indices and two `...` are index errors (NumPy's IndexError), a zero step an
        // invalid argument (NumPy's ValueError).
        let index_error = matches!(e, TensorError::InvalidIndex { .. });
        assert_eq!(index_error, want != "step cannot be zero", "{e:?}");
    }
}

#[test]
fn concat_and_stack_values_and_vjps() {
    let a = iota(&[2, 1]);
    let b = Variable::leaf(
        Tensor::from_vec(vec![10.0, 11.0, 12.0, 13.0], vec![2, 2], C::Workspace).unwrap(),
        true,
    );
    let c = ops::concat(&[a.clone(), b.clone()], -1).unwrap();
    assert_eq!(c.dims(), &[2, 3]);
    assert_eq!(c.value().to_vec(), vec![0.0, 10.0, 11.0, 1.0, 12.0, 13.0]);
    let s = ops::stack(&[a.clone(), a.clone()], 1).unwrap();
    assert_eq!(s.dims(), &[2, 2, 1]);
    assert_eq!(s.value().to_vec(), vec![0.0, 0.0, 1.0, 1.0]);
    gradcheck(
        |v| ops::concat(&[v[0].clone(), v[1].clone(), v[2].clone()], 1),
        &[
            rand(&[2, 1, 3], 1),
            rand(&[2, 0, 3], 2),
            rand(&[2, 2, 3], 3),
        ],
        &[true, true, true],
    );
    gradcheck(
        |v| ops::stack(&[v[0].clone(), v[1].clone()], -1),
        &[rand(&[3, 2], 4), rand(&[3, 2], 5)],
        &[true, false],
    );
    gradcheck(
        |v| ops::stack(std::slice::from_ref(&v[0]), 0),
        &[rand(&[], 6)],
        &[true],
    );
}

#[test]
fn concat_and_stack_errors_name_shapes_and_axis() {
    let a = iota(&[2, 3]);
    let b = iota(&[3, 3]);
    let e = tensor_err(ops::concat(&[a.clone(), b.clone()], 1));
    let msg = e.to_string();
    assert!(
        msg.contains("[3, 3]") && msg.contains("[2, 3]") && msg.contains("axis 1"),
        "{msg}"
    );
    assert!(matches!(
        e,
        TensorError::JoinShapeMismatch {
            index: 1,
            axis: 1,
            ..
        }
    ));
    assert!(ops::concat(&[a.clone(), b.clone()], 0).is_ok());
    let e = tensor_err(ops::stack(&[a.clone(), b], 0));
    assert!(e.to_string().contains("same shape"), "{e}");
    let e = tensor_err(ops::concat(&[], 0));
    assert!(e.to_string().contains("empty list"), "{e}");
    let e = tensor_err(ops::stack(&[], 0));
    assert!(e.to_string().contains("empty list"), "{e}");
    let e = tensor_err(ops::concat(std::slice::from_ref(&a), 2));
    assert_eq!(
        e,
        TensorError::AxisOutOfRange {
            op: "concat",
            axis: 2,
            rank: 2
        }
    );
    let e = tensor_err(ops::stack(std::slice::from_ref(&a), -4));
    assert_eq!(
        e,
        TensorError::AxisOutOfRange {
            op: "stack",
            axis: -4,
            rank: 3
        }
    );
    let e = tensor_err(ops::concat(&[a.clone(), iota(&[2])], 0));
    assert!(matches!(e, TensorError::JoinShapeMismatch { .. }), "{e}");
}

#[test]
fn permute_and_reshape_errors() {
    let x = iota(&[2, 3]);
    assert!(tensor_err(ops::permute(&x, &[0]))
        .to_string()
        .contains("expected 2 axes"));
    assert!(tensor_err(ops::permute(&x, &[1, -1]))
        .to_string()
        .contains("repeat axis 1"));
    assert_eq!(
        tensor_err(ops::transpose(&x, 0, 2)),
        TensorError::AxisOutOfRange {
            op: "transpose",
            axis: 2,
            rank: 2
        }
    );
    let y = ops::reshape_infer(&x, &[-1, 2]).unwrap();
    assert_eq!(y.dims(), &[3, 2]);
    assert_eq!(ops::reshape_infer(&x, &[6]).unwrap().dims(), &[6]);
    for (shape, want) in [
        (vec![-1, -1], "more than one -1"),
        (vec![-2, 3], "negative dimension -2"),
        (vec![4, -1], "cannot be inferred"),
    ] {
        let e = tensor_err(ops::reshape_infer(&x, &shape));
        assert!(e.to_string().contains(want), "{e}");
    }
    let empty = iota(&[0, 3]);
    assert!(tensor_err(ops::reshape_infer(&empty, &[0, -1]))
        .to_string()
        .contains("cannot be inferred"));
    assert!(matches!(
        tensor_err(ops::reshape_infer(&x, &[5])),
        TensorError::ShapeMismatch { .. } | TensorError::LengthMismatch { .. }
    ));
}

#[test]
fn mirror_backend_is_bitwise_the_cpu() {
    mirror::install();
    let run = |device: Device| {
        let leaves: Vec<Variable> = (0..2)
            .map(|i| {
                let mut t = rand(&[3, 4, 2], 70 + i);
                t.transfer_to(device).unwrap();
                Variable::leaf(t, true)
            })
            .collect();
        let p = ops::permute(&leaves[0], &[2, 0, 1]).unwrap();
        let i = ops::index(
            &leaves[1],
            &[sl(None, None, Some(-1)), I::Int(1), I::NewAxis],
        )
        .unwrap();
        let c = ops::concat(
            &[
                ops::transpose(&p, 0, 1).unwrap(),
                ops::transpose(&leaves[1], 1, 2).unwrap(),
            ],
            2,
        )
        .unwrap();
        let s = ops::stack(&[i.clone(), i], 0).unwrap();
        let loss = ops::add(
            &ops::sum(&ops::mul(&c, &c).unwrap()).unwrap(),
            &ops::sum(&ops::mul(&s, &s).unwrap()).unwrap(),
        )
        .unwrap();
        loss.backward().unwrap();
        let mut r = vec![bits(c.value()), bits(s.value())];
        r.extend(leaves.iter().map(|l| bits(&l.grad().unwrap())));
        r
    };
    let before = mirror::kernel_calls();
    assert_eq!(run(Device::Cpu), run(Device::PrivateUse1));
    assert!(mirror::kernel_calls() > before);
}
