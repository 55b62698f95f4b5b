//! Scalar arguments of ops are validated by the op itself, whoever calls it.

mod common;
use common::rand;
use riftco_autograd::{ops, AutogradError, Variable};
use riftco_tensor::TensorError;

#[test]
fn rms_norm_rejects_eps_that_is_not_finite_and_positive() {
    let x = Variable::leaf(rand(&[2, 8], 1), true);
    let w = Variable::leaf(rand(&[8], 2), true);
    for eps in [f32::NAN, -1.0, 0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY] {
        match ops::rms_norm(&x, &w, eps) {
            Err(AutogradError::Tensor(TensorError::InvalidArgument { op, message })) => {
                assert_eq!(op, "rms_norm");
                assert!(message.contains("eps"), "{message}");
                assert!(message.contains(&format!("{eps:?}")), "{message}");
            }
            other => panic!("eps {eps:?}: expected InvalidArgument, got {other:?}"),
        }
    }
    // The smallest positive f32 is a valid eps and gives finite outputs.
    let y = ops::rms_norm(&x, &w, f32::from_bits(1)).unwrap();
    assert!(y.value().to_vec().iter().all(|v| v.is_finite()));
}

/// RoPE of a tensor without elements (batch, seq or n_heads of 0) is an empty tensor with an
/// empty gradient, not a kernel assertion (the kernel divides by `seq · n_heads · d_head`).
#[test]
fn rope_of_an_empty_tensor_is_empty() {
    use riftco_tensor::backend::RopeTable;
    use std::sync::Arc;
    let table = Arc::new(RopeTable::try_new(8, 4, 10000.0).unwrap());
    for dims in [[0, 3, 2, 4], [2, 0, 2, 4], [2, 3, 0, 4]] {
        let x = Variable::leaf(rand(&dims, 3), true);
        let y = ops::rope(&x, &table, 0).unwrap();
        assert_eq!(y.dims(), &dims);
        let s = ops::sum(&y).unwrap();
        s.backward().unwrap();
        assert_eq!(x.grad().unwrap().dims(), &dims);
    }
}
