//! Element counts never wrap and allocation failure is an error: overflowing shapes are
//! `ShapeOverflow`, requests the allocator refuses are `OutOfMemory`. The sizes used here
//! (2^50 bytes) exceed the 47-bit user address space of x86_64 and AArch64 Linux, so the
//! allocator refuses them without touching memory, whatever the overcommit setting.

use riftco_tensor::{pool, MemoryCategory as C, Rng, Shape, Tensor, TensorError, MAX_ELEMENTS};

#[test]
fn reshape_to_a_wrapping_shape_is_rejected() {
    let empty = Tensor::from_vec(vec![], [0], C::Activation).unwrap();
    for dims in [
        vec![1usize << 63, 2],
        vec![1 << 62, 4, 0],
        vec![usize::MAX, 0],
    ] {
        let err = empty.reshape(dims.clone()).unwrap_err();
        assert_eq!(
            err,
            TensorError::ShapeOverflow {
                op: "Tensor::reshape",
                shape: dims.clone()
            }
        );
        assert!(err.to_string().contains("too many elements"), "{err}");
    }
    // A valid empty shape with a large dimension is still fine.
    assert_eq!(
        empty.reshape([1usize << 40, 0]).unwrap().dims(),
        [1 << 40, 0]
    );
}

#[test]
fn constructors_reject_wrapping_shapes() {
    let err = Tensor::from_vec(vec![], [1usize << 32, 1 << 32, 0], C::Activation).unwrap_err();
    assert!(matches!(
        err,
        TensorError::ShapeOverflow {
            op: "Tensor::from_vec",
            ..
        }
    ));
    // [2^32, 2^32] wraps to 0 elements in unchecked arithmetic: an empty buffer must not fit it.
    let err = Tensor::from_vec(vec![], [1usize << 32, 1 << 32], C::Activation).unwrap_err();
    assert!(matches!(err, TensorError::ShapeOverflow { .. }), "{err}");
    let err = Tensor::try_zeros([MAX_ELEMENTS, 2], C::Parameter).unwrap_err();
    assert!(matches!(
        err,
        TensorError::ShapeOverflow {
            op: "Tensor::full",
            ..
        }
    ));
    let err = Tensor::try_randn_with([1usize << 63, 2], 0.0, 1.0, &mut Rng::new(0), C::Parameter)
        .unwrap_err();
    assert!(matches!(
        err,
        TensorError::ShapeOverflow {
            op: "Tensor::randn",
            ..
        }
    ));
    assert!(Shape::try_new("op", [1usize << 63, 2]).is_err());
}

#[test]
fn allocation_failure_is_an_error_not_an_abort() {
    let huge = 1usize << 48; // 2^50 bytes
    let expected = TensorError::OutOfMemory {
        op: "Tensor::full",
        bytes: 1 << 50,
    };
    assert_eq!(
        Tensor::try_zeros([huge], C::Activation).unwrap_err(),
        expected
    );
    assert_eq!(
        Tensor::try_full([huge], 2.0, C::Activation).unwrap_err(),
        expected
    );
    let mut rng = Rng::new(7);
    let before = rng.clone().normal();
    assert!(matches!(
        Tensor::try_randn_with([1 << 24, 1 << 24], 0.0, 1.0, &mut rng, C::Parameter),
        Err(TensorError::OutOfMemory { op: "Tensor::randn", bytes }) if bytes == 1 << 50
    ));
    assert_eq!(rng.normal(), before, "a failed allocation draws no sample");
    assert!(matches!(
        pool::try_take("op", huge),
        Err(TensorError::OutOfMemory { op: "op", bytes }) if bytes == 1 << 50
    ));
    assert!(matches!(
        pool::try_take_zeroed("op", huge),
        Err(TensorError::OutOfMemory { .. })
    ));
    let msg = expected.to_string();
    assert!(
        msg.contains("out of memory") && msg.contains("1125899906842624"),
        "{msg}"
    );
}
