//! `ops::to_device`: copies between devices (here the CPU and the mirror test backend, which
//! holds its buffers where no CPU kernel can read them), for leaves and for graph nodes.

mod common;

use common::{bits, rand};
use riftco_autograd::{ops, Variable};
use riftco_tensor::backend::mirror;
use riftco_tensor::{Device, TensorError};

#[test]
fn a_leaf_moves_as_a_new_leaf_with_the_same_values_flag_and_name() {
    mirror::install();
    let x = Variable::named_leaf(rand(&[3, 5], 1), true, "w");
    let moved = ops::to_device(&x, Device::PrivateUse1).unwrap().unwrap();
    assert_eq!(moved.value().device(), Device::PrivateUse1);
    assert!(moved.is_leaf() && moved.requires_grad());
    assert_eq!(moved.name().as_deref(), Some("w"));
    assert_eq!(bits(moved.value()), bits(x.value()));
    // The source keeps its device and version: the copy has its own storage.
    assert_eq!(x.value().device(), Device::Cpu);
    let back = ops::to_device(&moved, Device::Cpu).unwrap().unwrap();
    assert_eq!(bits(back.value()), bits(x.value()));
    assert!(ops::to_device(&x, Device::Cpu).unwrap().is_none());
}

#[test]
fn the_gradient_of_a_moved_graph_node_flows_back_to_the_source_device() {
    mirror::install();
    let x = Variable::leaf(rand(&[4, 3], 2), true);
    let y = ops::mul(&x, &x).unwrap(); // dL/dx = 2x · dL/dy
    let on_mirror = ops::to_device(&y, Device::PrivateUse1).unwrap().unwrap();
    assert!(!on_mirror.is_leaf());
    let loss = ops::sum(&on_mirror).unwrap();
    loss.backward().unwrap();
    let expected: Vec<u32> = x
        .value()
        .to_vec()
        .iter()
        .map(|v| (2.0 * v).to_bits())
        .collect();
    let g = x.grad().unwrap();
    assert_eq!(g.device(), Device::Cpu);
    assert_eq!(bits(&g), expected);
}

#[test]
fn mixing_a_moved_value_with_one_left_behind_is_a_device_mismatch() {
    mirror::install();
    let x = Variable::leaf(rand(&[2, 2], 3), false);
    let moved = ops::to_device(&x, Device::PrivateUse1).unwrap().unwrap();
    match ops::add(&x, &moved) {
        Err(riftco_autograd::AutogradError::Tensor(TensorError::DeviceMismatch { .. })) => {}
        other => panic!("{other:?}"),
    }
}
