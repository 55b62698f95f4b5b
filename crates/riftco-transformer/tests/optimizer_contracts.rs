//! Adam's parameter-list and step contracts: distinct leaves only, at least one trainable,
//! frozen parameters never updated, and per-parameter step counts (a step without any gradient
//! changes nothing and is not counted), as in PyTorch.

use riftco_autograd::{ops, Variable};
use riftco_tensor::{MemoryCategory, Tensor};
use riftco_transformer::{Adam, TransformerError};

fn leaf(values: &[f32], trainable: bool, name: &str) -> Variable {
    let t = Tensor::from_vec(values.to_vec(), [values.len()], MemoryCategory::Parameter).unwrap();
    Variable::named_leaf(t, trainable, name)
}

/// Sets `p.grad` to `g` with a backward pass of `sum(p ⊙ g)`.
fn give_grad(p: &Variable, g: &[f32]) {
    let c = Tensor::from_vec(g.to_vec(), [g.len()], MemoryCategory::Workspace).unwrap();
    ops::sum(&ops::mul(p, &Variable::constant(c)).unwrap())
        .unwrap()
        .backward()
        .unwrap();
}

fn config_err(r: Result<Adam, TransformerError>) -> (String, String) {
    match r {
        Err(TransformerError::Config {
            field,
            value,
            reason,
        }) => (field.to_string(), format!("{value}: {reason}")),
        other => panic!("expected a Config error, got {other:?}"),
    }
}

#[test]
fn duplicate_parameters_are_rejected_naming_both_positions() {
    // Before: Adam([p, p]) updated p twice per step.
    let p = leaf(&[0.0; 3], true, "p");
    let q = leaf(&[0.0; 3], true, "q");
    let (field, msg) = config_err(Adam::new(vec![p.clone(), q, p], 0.1));
    assert_eq!(field, "params");
    assert!(msg.contains("\"p\"") && msg.contains("0 and 2"), "{msg}");
}

#[test]
fn empty_non_leaf_and_all_frozen_lists_are_rejected() {
    let (field, msg) = config_err(Adam::new(vec![], 0.1));
    assert_eq!(field, "params");
    assert!(msg.contains("empty"), "{msg}");

    let p = leaf(&[1.0, 2.0], true, "p");
    let non_leaf = ops::mul(&p, &p).unwrap();
    let (_, msg) = config_err(Adam::new(vec![p.clone(), non_leaf], 0.1));
    assert!(
        msg.contains("parameter 1 is not a leaf") && msg.contains("mul"),
        "{msg}"
    );

    let frozen = leaf(&[1.0, 2.0], false, "frozen");
    let (_, msg) = config_err(Adam::new(vec![frozen], 0.1));
    assert!(msg.contains("no parameter requires grad"), "{msg}");
}

#[test]
fn frozen_parameters_beside_trainable_ones_are_never_updated() {
    let p = leaf(&[1.0, -1.0], true, "p");
    let frozen = leaf(&[3.0, 4.0], false, "frozen");
    let mut opt = Adam::adamw(vec![p.clone(), frozen.clone()], 0.1, 0.5).unwrap();
    for _ in 0..3 {
        give_grad(&p, &[1.0, 1.0]);
        opt.step().unwrap();
    }
    assert_eq!(opt.steps(), 3);
    assert_eq!(frozen.value().to_vec(), vec![3.0, 4.0], "no decay either");
    assert_ne!(p.value().to_vec(), vec![1.0, -1.0]);
}

#[test]
fn a_step_without_any_gradient_changes_nothing_and_is_not_counted() {
    // Before: step() with no gradients counted a step, so the first real update used the bias
    // correction of step 2.
    let p = leaf(&[0.5, -0.5, 2.0], true, "p");
    let reference = leaf(&[0.5, -0.5, 2.0], true, "reference");
    let mut opt = Adam::new(vec![p.clone()], 0.1).unwrap();
    let mut fresh = Adam::new(vec![reference.clone()], 0.1).unwrap();
    opt.step().unwrap();
    opt.step().unwrap();
    assert_eq!(opt.steps(), 0);
    assert_eq!(p.value().to_vec(), vec![0.5, -0.5, 2.0]);
    let g = [0.3, -2.0, 0.01];
    give_grad(&p, &g);
    give_grad(&reference, &g);
    opt.step().unwrap();
    fresh.step().unwrap();
    assert_eq!(opt.steps(), 1);
    assert_eq!(p.value().to_vec(), reference.value().to_vec());
}

#[test]
fn step_counts_are_per_parameter() {
    // `b` first gets a gradient at the optimizer's third step: its update is a first step.
    let a = leaf(&[1.0, 2.0], true, "a");
    let b = leaf(&[-1.0, 0.5], true, "b");
    let b_ref = leaf(&[-1.0, 0.5], true, "b_ref");
    let mut opt = Adam::new(vec![a.clone(), b.clone()], 0.05).unwrap();
    for _ in 0..2 {
        give_grad(&a, &[0.5, 0.5]);
        opt.step().unwrap();
    }
    assert!(b.grad().is_none());
    give_grad(&b, &[0.2, -0.7]);
    give_grad(&b_ref, &[0.2, -0.7]);
    a.zero_grad().unwrap();
    opt.step().unwrap();
    Adam::new(vec![b_ref.clone()], 0.05)
        .unwrap()
        .step()
        .unwrap();
    assert_eq!(opt.steps(), 3);
    assert_eq!(b.value().to_vec(), b_ref.value().to_vec());
}
