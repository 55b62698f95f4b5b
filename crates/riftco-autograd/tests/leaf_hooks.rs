//! `Variable::backward_with_hook`: each trainable leaf's gradient handed over once, complete,
//! as soon as its last consumer ran; what the hook keeps is not committed.

mod common;
use common::rand;
use riftco_autograd::{ops, AutogradError, BackwardOptions, Variable};
use riftco_tensor::Tensor;

/// `sum((x w1ᵀ) ⊙ (x w1ᵀ)) + sum(w2 ⊙ w2) + sum(x w1ᵀ)`: `w1` has two consumers.
fn loss(x: &Variable, w1: &Variable, w2: &Variable) -> Variable {
    let y = ops::linear(x, w1).unwrap();
    let a = ops::sum(&ops::mul(&y, &y).unwrap()).unwrap();
    let b = ops::sum(&ops::mul(w2, w2).unwrap()).unwrap();
    let c = ops::sum(&y).unwrap();
    ops::add(&ops::add(&a, &b).unwrap(), &c).unwrap()
}

#[test]
fn each_leaf_is_handed_over_once_with_its_whole_gradient() {
    let x = Variable::constant(rand(&[3, 4], 1));
    let w1 = Variable::leaf(rand(&[2, 4], 2), true);
    let w2 = Variable::leaf(rand(&[5], 3), true);
    let l = loss(&x, &w1, &w2);
    l.backward().unwrap();
    let (g1, g2) = (w1.grad().unwrap().to_vec(), w2.grad().unwrap().to_vec());
    w1.zero_grad().unwrap();
    w2.zero_grad().unwrap();

    let mut seen: Vec<(u64, Vec<f32>)> = Vec::new();
    let w2_id = w2.id();
    let mut hook = |leaf: &Variable, g: Tensor| -> riftco_autograd::Result<Option<Tensor>> {
        seen.push((leaf.id(), g.to_vec()));
        // Keep w1's gradient, hand w2's back to be committed.
        Ok((leaf.id() == w2_id).then_some(g))
    };
    l.backward_with_hook(BackwardOptions::default(), &mut hook)
        .unwrap();
    assert_eq!(seen.len(), 2, "one call per leaf");
    let by_id = |id: u64| seen.iter().find(|(i, _)| *i == id).unwrap().1.clone();
    assert_eq!(
        by_id(w1.id()),
        g1,
        "w1's two consumers summed before the hook"
    );
    assert_eq!(by_id(w2.id()), g2);
    assert!(
        w1.grad().is_none(),
        "a gradient the hook took is not committed"
    );
    assert_eq!(w2.grad().unwrap().to_vec(), g2);
}

#[test]
fn a_hook_error_stops_the_pass_and_commits_nothing() {
    let x = Variable::constant(rand(&[3, 4], 1));
    let w1 = Variable::leaf(rand(&[2, 4], 2), true);
    let w2 = Variable::leaf(rand(&[5], 3), true);
    let l = loss(&x, &w1, &w2);
    let mut calls = 0;
    let mut hook = |_: &Variable, _: Tensor| -> riftco_autograd::Result<Option<Tensor>> {
        calls += 1;
        Err(AutogradError::UnknownOption {
            option: "test",
            value: "hook".into(),
            expected: "nothing",
        })
    };
    let e = l
        .backward_with_hook(BackwardOptions::default(), &mut hook)
        .unwrap_err();
    assert!(matches!(e, AutogradError::UnknownOption { .. }), "{e}");
    assert_eq!(calls, 1);
    assert!(w1.grad().is_none() && w2.grad().is_none());
}
