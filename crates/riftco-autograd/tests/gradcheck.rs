#![allow(clippy::cloned_ref_to_slice_refs)]
//! Every VJP rule against central finite differences (see `common::gradcheck` for the tolerance).

mod common;
use common::{gradcheck, rand};
use riftco_autograd::ops;
use riftco_kernels::rope::RopeTable;
use std::sync::Arc;

#[test]
fn add_mul_scale() {
    let (a, b) = (rand(&[3, 5], 1), rand(&[3, 5], 2));
    gradcheck(
        |v| ops::add(&v[0], &v[1]),
        &[a.clone(), b.clone()],
        &[true, true],
    );
    gradcheck(
        |v| ops::mul(&v[0], &v[1]),
        &[a.clone(), b.clone()],
        &[true, true],
    );
    gradcheck(
        |v| ops::mul(&v[0], &v[1]),
        &[a.clone(), b.clone()],
        &[true, false],
    );
    gradcheck(|v| ops::scale(&v[0], -1.7), &[a.clone()], &[true]);
    // A variable used twice: contributions add.
    gradcheck(|v| ops::mul(&v[0], &v[0]), &[a.clone()], &[true]);
    // `x + x`: add's VJP hands the same gradient tensor to both uses (the two contributions
    // share storage), and mixed with a third, distinct contribution.
    gradcheck(|v| ops::add(&v[0], &v[0]), &[a.clone()], &[true]);
    gradcheck(|v| ops::mul(&ops::add(&v[0], &v[0])?, &v[0]), &[a], &[true]);
}

#[test]
fn silu_swiglu_sum() {
    let (a, b) = (rand(&[4, 7], 3), rand(&[4, 7], 4));
    gradcheck(|v| ops::silu(&v[0]), &[a.clone()], &[true]);
    gradcheck(
        |v| ops::swiglu(&v[0], &v[1]),
        &[a.clone(), b],
        &[true, true],
    );
    gradcheck(|v| ops::sum(&v[0]), &[a], &[true]);
}

#[test]
fn linear_matmul_bmm() {
    let x = rand(&[2, 3, 5], 5);
    let w = rand(&[4, 5], 6);
    gradcheck(
        |v| ops::linear(&v[0], &v[1]),
        &[x.clone(), w.clone()],
        &[true, true],
    );
    gradcheck(|v| ops::linear(&v[0], &v[1]), &[x, w], &[true, false]);
    let (a, b) = (rand(&[3, 4], 7), rand(&[4, 6], 8));
    gradcheck(|v| ops::matmul(&v[0], &v[1]), &[a, b], &[true, true]);
    let (a, b, bt) = (
        rand(&[2, 3, 4], 9),
        rand(&[2, 4, 5], 10),
        rand(&[2, 5, 4], 11),
    );
    gradcheck(
        |v| ops::bmm(&v[0], &v[1], false),
        &[a.clone(), b],
        &[true, true],
    );
    gradcheck(|v| ops::bmm(&v[0], &v[1], true), &[a, bt], &[true, true]);
}

#[test]
fn softmax_and_causal_softmax() {
    let s = rand(&[3, 6], 12);
    gradcheck(|v| ops::softmax(&v[0]), &[s], &[true]);
    let s = rand(&[2, 2, 4, 4], 13);
    gradcheck(
        |v| ops::causal_softmax(&v[0], 0.7, true),
        &[s.clone()],
        &[true],
    );
    gradcheck(|v| ops::causal_softmax(&v[0], 0.7, false), &[s], &[true]);
    // seq_q < seq_k (decode-style offset)
    let s = rand(&[1, 2, 2, 5], 14);
    gradcheck(|v| ops::causal_softmax(&v[0], 1.3, true), &[s], &[true]);
}

#[test]
fn rms_norm_rope_shapes() {
    let x = rand(&[3, 8], 15);
    let w = rand(&[8], 16);
    gradcheck(
        |v| ops::rms_norm(&v[0], &v[1], 1e-5),
        &[x.clone(), w.clone()],
        &[true, true],
    );
    gradcheck(
        |v| ops::rms_norm(&v[0], &v[1], 1e-5),
        &[x, w],
        &[true, false],
    );
    let table = Arc::new(RopeTable::new(16, 4, 10000.0));
    let q = rand(&[2, 3, 2, 4], 17);
    gradcheck(|v| ops::rope(&v[0], &table, 0), &[q.clone()], &[true]);
    gradcheck(|v| ops::rope(&v[0], &table, 5), &[q.clone()], &[true]);
    gradcheck(|v| ops::swap_axes_1_2(&v[0]), &[q.clone()], &[true]);
    gradcheck(|v| ops::reshape(&v[0], [6, 8]), &[q], &[true]);
}

#[test]
fn embedding_and_cross_entropy() {
    let table = rand(&[5, 3], 18);
    let ids = [0u32, 4, 2, 4];
    gradcheck(|v| ops::embedding(&v[0], &ids), &[table], &[true]);
    let logits = rand(&[4, 6], 19);
    let targets = [1u32, 5, 0, 3];
    gradcheck(|v| ops::cross_entropy(&v[0], &targets), &[logits], &[true]);
}

#[test]
fn bad_inputs_are_errors_naming_values() {
    use riftco_autograd::Variable;
    let v = |s: &[usize]| Variable::leaf(rand(s, 1), true);
    let e = ops::add(&v(&[2, 3]), &v(&[3, 2])).unwrap_err().to_string();
    assert!(e.contains("[2, 3]") && e.contains("[3, 2]"), "{e}");
    let e = ops::linear(&v(&[2, 3]), &v(&[4, 5]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("[2, 3]"), "{e}");
    let e = ops::embedding(&v(&[5, 3]), &[7]).unwrap_err().to_string();
    assert!(e.contains("token id 7") && e.contains("< 5"), "{e}");
    let e = ops::cross_entropy(&v(&[2, 4]), &[1, 9])
        .unwrap_err()
        .to_string();
    assert!(e.contains("target 9"), "{e}");
    let e = ops::cross_entropy(&v(&[2, 4]), &[1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("[2, 4]"), "{e}");
}

#[test]
#[should_panic(expected = "analytic")]
fn gradcheck_catches_a_wrong_vjp() {
    use riftco_autograd::Variable;
    // y = 2x with a VJP that claims dy/dx = 3: the checker must reject it.
    let wrong = |v: &[Variable]| {
        let y = ops::scale(&v[0], 2.0)?;
        Ok(Variable::from_op(
            "wrong_double",
            y.value().clone(),
            vec![v[0].clone()],
            |_, _, g| {
                let d: Vec<f32> = g.read().unwrap().iter().map(|x| 3.0 * x).collect();
                Ok(vec![Some(riftco_tensor::Tensor::from_vec(
                    d,
                    g.shape().clone(),
                    riftco_tensor::MemoryCategory::Gradient,
                )?)])
            },
        ))
    };
    gradcheck(wrong, &[rand(&[3], 1)], &[true]);
}
