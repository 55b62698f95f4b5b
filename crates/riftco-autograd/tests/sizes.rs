//! Output shapes are checked before anything is allocated: a shape whose element count wraps
//! is `ShapeOverflow` (it used to be accepted with a wrapped count of 0 and crash the next
//! kernel), and an output the allocator refuses is `OutOfMemory`. The refused size here (2^50
//! bytes) exceeds the 47-bit user address space, so no memory is touched.

use riftco_autograd::{ops, AutogradError, Variable};
use riftco_tensor::{MemoryCategory as C, Tensor, TensorError};

fn empty(dims: &[usize]) -> Variable {
    Variable::leaf(Tensor::from_vec(vec![], dims, C::Activation).unwrap(), true)
}

fn is_overflow(r: riftco_autograd::Result<Variable>, op: &str) -> bool {
    matches!(r, Err(AutogradError::Tensor(TensorError::ShapeOverflow { op: o, .. })) if o == op)
}

#[test]
fn reshape_to_a_wrapping_shape_is_a_shape_error() {
    let x = empty(&[0]);
    assert!(is_overflow(
        ops::reshape(&x, [1usize << 63, 2]),
        "Tensor::reshape"
    ));
}

#[test]
fn linear_of_empty_operands_with_a_wrapping_output_is_a_shape_error() {
    // x [2^32, 0] · xᵀ would be [2^32, 2^32]: 2^64 elements, 0 after wrapping.
    let x = empty(&[1 << 32, 0]);
    let err = ops::linear(&x, &x).unwrap_err();
    assert!(
        matches!(&err, AutogradError::Tensor(TensorError::ShapeOverflow { op: "linear", shape })
            if shape == &[1usize << 32, 1 << 32]),
        "{err}"
    );
    assert!(is_overflow(ops::linear_graph_only(&x, &x), "linear"));
}

#[test]
fn matmul_and_bmm_outputs_are_checked() {
    assert!(is_overflow(
        ops::matmul(&empty(&[1 << 32, 0]), &empty(&[0, 1 << 32])),
        "matmul"
    ));
    assert!(is_overflow(
        ops::bmm(&empty(&[2, 1 << 31, 0]), &empty(&[2, 0, 1 << 32]), false),
        "bmm"
    ));
    assert!(is_overflow(
        ops::bmm(&empty(&[2, 1 << 31, 0]), &empty(&[2, 1 << 32, 0]), true),
        "bmm"
    ));
}

#[test]
fn an_output_the_allocator_refuses_is_out_of_memory() {
    // [2^24, 0] · [0, 2^24] = [2^24, 2^24] zeros: a valid shape of 2^50 bytes.
    let err = ops::matmul(&empty(&[1 << 24, 0]), &empty(&[0, 1 << 24])).unwrap_err();
    assert!(
        matches!(
            err,
            AutogradError::Tensor(TensorError::OutOfMemory {
                op: "matmul",
                bytes
            }) if bytes == 1 << 50
        ),
        "{err}"
    );
    let err = ops::linear(&empty(&[1 << 24, 0]), &empty(&[1 << 24, 0])).unwrap_err();
    assert!(
        matches!(
            err,
            AutogradError::Tensor(TensorError::OutOfMemory { op: "linear", .. })
        ),
        "{err}"
    );
}
