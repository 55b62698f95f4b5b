#![allow(clippy::needless_range_loop)]
//! Isolated gradient contexts: fresh passes, explicit accumulation, atomic commit, stale-graph
//! validation, frozen leaves, deep graphs.

mod common;
use common::rand;
use riftco_autograd::{ops, AutogradError, Variable};
use riftco_tensor::{Device, MemoryCategory as C, Tensor};

fn loss_of(x: &Variable, w: &Variable) -> Variable {
    let y = ops::linear(x, w).unwrap();
    ops::sum(&ops::mul(&y, &y).unwrap()).unwrap()
}

#[test]
fn repeated_backward_is_a_fresh_pass_not_doubled() {
    let x = Variable::leaf(rand(&[3, 4], 1), false);
    let w = Variable::leaf(rand(&[2, 4], 2), true);
    let loss = loss_of(&x, &w);
    loss.backward().unwrap();
    let first = w.grad().unwrap().to_vec();
    loss.backward().unwrap();
    assert_eq!(w.grad().unwrap().to_vec(), first);
    assert!(
        x.grad().is_none(),
        "input without requires_grad got a gradient"
    );
}

#[test]
fn backward_accumulate_adds_micro_batches() {
    let w = Variable::leaf(rand(&[2, 4], 2), true);
    let x1 = Variable::constant(rand(&[3, 4], 3));
    let x2 = Variable::constant(rand(&[3, 4], 4));
    loss_of(&x1, &w).backward().unwrap();
    let g1 = w.grad().unwrap().to_vec();
    loss_of(&x2, &w).backward().unwrap();
    let g2 = w.grad().unwrap().to_vec();
    w.zero_grad().unwrap();
    loss_of(&x1, &w).backward_accumulate().unwrap();
    loss_of(&x2, &w).backward_accumulate().unwrap();
    let acc = w.grad().unwrap().to_vec();
    for i in 0..acc.len() {
        assert_eq!(acc[i], g1[i] + g2[i]);
    }
}

#[test]
fn stale_trainable_value_is_rejected_and_nothing_committed() {
    let x = Variable::constant(rand(&[3, 4], 1));
    let w = Variable::named_leaf(rand(&[2, 4], 2), true, "w");
    loss_of(&x, &w).backward().unwrap();
    let before = w.grad().unwrap().to_vec();
    let loss = loss_of(&x, &w);
    w.value().write().unwrap()[0] += 1.0;
    let err = loss.backward().unwrap_err();
    assert!(matches!(err, AutogradError::StaleGraph { .. }), "{err}");
    assert!(err.to_string().contains("\"w\""), "{err}");
    assert_eq!(w.grad().unwrap().to_vec(), before);
    // A new forward after the change is not stale.
    loss_of(&x, &w).backward().unwrap();
}

#[test]
fn stale_frozen_value_and_input_are_rejected() {
    let x = Variable::named_leaf(rand(&[3, 4], 1), false, "tokens");
    let frozen = Variable::named_leaf(rand(&[2, 4], 2), false, "base.weight");
    let a = Variable::named_leaf(rand(&[2, 2], 3), true, "adapter");
    let y = ops::linear(&ops::linear(&x, &frozen).unwrap(), &a).unwrap();
    let loss = ops::sum(&y).unwrap();
    frozen.value().write().unwrap()[1] = 0.0;
    let err = loss.backward().unwrap_err().to_string();
    assert!(err.contains("base.weight"), "{err}");
    assert!(a.grad().is_none());

    let y = ops::linear(&ops::linear(&x, &frozen).unwrap(), &a).unwrap();
    let loss = ops::sum(&y).unwrap();
    x.value().write().unwrap()[0] = 5.0;
    let err = loss.backward().unwrap_err().to_string();
    assert!(err.contains("tokens"), "{err}");
}

#[test]
fn device_transfer_makes_graph_stale() {
    let x = Variable::constant(rand(&[3, 4], 1));
    let mut value = rand(&[2, 4], 2);
    let w = Variable::named_leaf(value.clone(), true, "w");
    let loss = loss_of(&x, &w);
    value.transfer_to(Device::Cpu).unwrap(); // shares storage with w's value
    let err = loss.backward().unwrap_err();
    assert!(matches!(err, AutogradError::StaleGraph { .. }), "{err}");
}

#[test]
fn optimizer_step_between_forward_and_backward_is_stale_but_not_after() {
    let x = Variable::constant(rand(&[3, 4], 1));
    let w = Variable::named_leaf(rand(&[2, 4], 2), true, "w");
    let (mut m, mut v) = (vec![0.0; 8], vec![0.0; 8]);
    let step = |w: &Variable, m: &mut Vec<f32>, v: &mut Vec<f32>, t: u64| {
        let g = w.grad().unwrap().to_vec();
        riftco_kernels::adam_update(
            &mut w.value().write().unwrap(),
            &g,
            m,
            v,
            t,
            riftco_kernels::AdamHyper::default(),
        );
    };
    loss_of(&x, &w).backward().unwrap();
    let stale = loss_of(&x, &w);
    step(&w, &mut m, &mut v, 1);
    assert!(matches!(
        stale.backward().unwrap_err(),
        AutogradError::StaleGraph { .. }
    ));
    // forward → backward → step → forward → backward is the normal loop and must work.
    let loss = loss_of(&x, &w);
    loss.backward().unwrap();
    step(&w, &mut m, &mut v, 2);
    loss_of(&x, &w).backward().unwrap();
}

#[test]
fn failing_vjp_commits_nothing() {
    let w1 = Variable::leaf(rand(&[4], 1), true);
    let w2 = Variable::leaf(rand(&[4], 2), true);
    ops::sum(&ops::add(&w1, &w2).unwrap())
        .unwrap()
        .backward()
        .unwrap();
    let (g1, g2) = (w1.grad().unwrap().to_vec(), w2.grad().unwrap().to_vec());
    // w1's VJP runs fine, a later one fails: neither gradient may change.
    let ok = ops::scale(&w1, 3.0).unwrap();
    let failing = Variable::from_op(
        "failing",
        w2.value().clone(),
        vec![w2.clone()],
        |_, _, _| {
            Err(riftco_tensor::TensorError::InvalidArgument {
                op: "failing",
                message: "boom".into(),
            }
            .into())
        },
    );
    let loss = ops::sum(&ops::add(&ok, &failing).unwrap()).unwrap();
    let err = loss.backward().unwrap_err().to_string();
    assert!(err.contains("boom"), "{err}");
    assert_eq!(w1.grad().unwrap().to_vec(), g1);
    assert_eq!(w2.grad().unwrap().to_vec(), g2);
}

#[test]
fn panicking_vjp_is_an_error_not_a_crash() {
    let w = Variable::leaf(rand(&[4], 1), true);
    let bad = Variable::from_op("bad", w.value().clone(), vec![w.clone()], |_, _, _| {
        panic!("vjp exploded")
    });
    let err = ops::sum(&bad).unwrap().backward().unwrap_err().to_string();
    assert!(err.contains("vjp exploded"), "{err}");
    assert!(w.grad().is_none());
}

#[test]
fn frozen_leaf_gets_no_gradient_but_input_vjp_flows() {
    let x = Variable::leaf(rand(&[3, 4], 1), true);
    let frozen = Variable::leaf(rand(&[5, 4], 2), false);
    let loss = ops::sum(&ops::linear(&x, &frozen).unwrap()).unwrap();
    loss.backward().unwrap();
    assert!(frozen.grad().is_none());
    // d/dx Σ x·Wᵀ = column sums of W, for every row
    let w = frozen.value().to_vec();
    let gx = x.grad().unwrap().to_vec();
    for r in 0..3 {
        for c in 0..4 {
            let expect: f32 = (0..5).map(|o| w[o * 4 + c]).sum();
            assert!((gx[r * 4 + c] - expect).abs() < 1e-6);
        }
    }
}

#[test]
fn deep_graph_of_100k_nodes_backprops_and_drops_without_stack_overflow() {
    let w = Variable::leaf(
        Tensor::from_vec(vec![1.0], [1], C::Parameter).unwrap(),
        true,
    );
    let mut y = w.clone();
    for _ in 0..100_000 {
        y = ops::scale(&y, 1.0).unwrap();
    }
    let loss = ops::sum(&y).unwrap();
    assert_eq!(loss.graph_statistics().node_count, 100_002);
    loss.backward().unwrap();
    assert_eq!(w.grad().unwrap().to_vec(), vec![1.0]);
    drop(loss);
    drop(y);
}

#[test]
fn backward_needs_scalar_or_seed() {
    let w = Variable::leaf(rand(&[3], 1), true);
    let y = ops::scale(&w, 2.0).unwrap();
    assert!(matches!(
        y.backward().unwrap_err(),
        AutogradError::NotScalar { .. }
    ));
    y.backward_with_grad(Tensor::ones([3], C::Gradient))
        .unwrap();
    assert_eq!(w.grad().unwrap().to_vec(), vec![2.0; 3]);
    let c = ops::scale(&Variable::constant(rand(&[3], 1)), 2.0).unwrap();
    assert!(matches!(
        ops::sum(&c).unwrap().backward().unwrap_err(),
        AutogradError::NoGradient { .. }
    ));
}

#[test]
fn graph_keeps_inputs_alive_after_handles_drop() {
    let w = Variable::leaf(rand(&[2, 4], 2), true);
    let loss = {
        let x = Variable::constant(rand(&[3, 4], 1));
        let w_alias = w.clone();
        loss_of(&x, &w_alias)
    };
    loss.backward().unwrap();
    assert!(w.grad().is_some());
}
