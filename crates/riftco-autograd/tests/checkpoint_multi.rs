//! checkpoint_multi(): a checkpoint of several inputs (PyTorch's `checkpoint(fn, *args)`):
//! gradients equal the plain run bitwise, and the input rejections.

mod common;
use common::rand;
use riftco_autograd::{checkpoint_multi, ops, AutogradError, CheckpointError, Result, Variable};

fn two_input_block(a: &Variable, b: &Variable, w: &Variable) -> Result<Variable> {
    let h = ops::linear(a, w)?;
    let s = ops::silu(&h)?;
    ops::mul(&s, b)
}

fn checkpoint_err(r: Result<Variable>) -> CheckpointError {
    match r {
        Err(AutogradError::Checkpoint(e)) => e,
        Err(e) => panic!("expected a CheckpointError, got {e}"),
        Ok(_) => panic!("expected a CheckpointError, got Ok"),
    }
}

fn grads(vars: &[&Variable]) -> Vec<Vec<f32>> {
    vars.iter().map(|v| v.grad().unwrap().to_vec()).collect()
}

#[test]
fn two_input_checkpoint_gradients_equal_the_plain_run_bitwise() {
    let x = Variable::leaf(rand(&[5, 8], 1), true);
    let w0 = Variable::leaf(rand(&[8, 8], 2), true);
    let w = Variable::leaf(rand(&[8, 8], 3), true);
    // Both inputs are op results (not leaves), as in a real network.
    let a = ops::linear(&x, &w0).unwrap();
    let b = ops::scale(&x, 0.5).unwrap();
    let plain = ops::sum(&two_input_block(&a, &b, &w).unwrap()).unwrap();
    plain.backward().unwrap();
    let all = [&x, &w0, &w];
    let g_plain = grads(&all);

    let a = ops::linear(&x, &w0).unwrap();
    let b = ops::scale(&x, 0.5).unwrap();
    let w2 = w.clone();
    let y = checkpoint_multi(&[a, b], std::slice::from_ref(&w), move |xs| {
        two_input_block(&xs[0], &xs[1], &w2)
    })
    .unwrap();
    let ck = ops::sum(&y).unwrap();
    assert_eq!(plain.value().to_vec(), ck.value().to_vec());
    ck.backward().unwrap();
    assert_eq!(grads(&all), g_plain);
}

#[test]
fn each_input_receives_its_own_gradient() {
    // y = a * 3 + b * 5 (sum): da = 3, db = 5, in that order.
    let a = Variable::leaf(rand(&[2, 3], 1), true);
    let b = Variable::leaf(rand(&[2, 3], 2), true);
    let y = checkpoint_multi(&[a.clone(), b.clone()], &[], |xs| {
        ops::add(&ops::scale(&xs[0], 3.0)?, &ops::scale(&xs[1], 5.0)?)
    })
    .unwrap();
    ops::sum(&y).unwrap().backward().unwrap();
    assert_eq!(a.grad().unwrap().to_vec(), vec![3.0; 6]);
    assert_eq!(b.grad().unwrap().to_vec(), vec![5.0; 6]);
}

#[test]
fn an_input_without_grad_gets_none_and_the_other_its_gradient() {
    let a = Variable::leaf(rand(&[2, 3], 1), true);
    let mask = Variable::constant(rand(&[2, 3], 2));
    let y = checkpoint_multi(&[a.clone(), mask.clone()], &[], |xs| {
        ops::mul(&xs[0], &xs[1])
    })
    .unwrap();
    ops::sum(&y).unwrap().backward().unwrap();
    assert_eq!(a.grad().unwrap().to_vec(), mask.value().to_vec());
    assert!(mask.grad().is_none());
}

#[test]
fn rejects_an_unused_input_naming_its_position() {
    let a = Variable::leaf(rand(&[2, 3], 1), true);
    let b = Variable::leaf(rand(&[2, 3], 2), true);
    let e = checkpoint_err(checkpoint_multi(&[a.clone(), b.clone()], &[], |xs| {
        ops::scale(&xs[0], 2.0)
    }));
    assert!(
        matches!(
            e,
            CheckpointError::InputUnusedAt {
                index: 1,
                count: 2,
                ..
            }
        ),
        "{e}"
    );
    // Also an input that requires no grad: the rule is "every input is used".
    let c = Variable::constant(rand(&[2, 3], 3));
    let e = checkpoint_err(checkpoint_multi(&[c, a], &[], |xs| ops::scale(&xs[1], 2.0)));
    assert!(
        matches!(e, CheckpointError::InputUnusedAt { index: 0, .. }),
        "{e}"
    );
}

#[test]
fn rejects_no_input_a_repeated_input_and_an_input_that_is_a_dependency() {
    let a = Variable::leaf(rand(&[2, 3], 1), true);
    let w = Variable::leaf(rand(&[3, 3], 2), true);
    let e = checkpoint_err(checkpoint_multi(&[], &[], |_| {
        Ok(Variable::constant(rand(&[1], 1)))
    }));
    assert!(matches!(e, CheckpointError::NoInputs { .. }), "{e}");
    let e = checkpoint_err(checkpoint_multi(&[a.clone(), a.clone()], &[], |xs| {
        ops::add(&xs[0], &xs[1])
    }));
    assert!(
        matches!(
            e,
            CheckpointError::DuplicateInput {
                first: 0,
                second: 1,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("positions 0 and 1"), "{e}");
    let w2 = w.clone();
    let e = checkpoint_err(checkpoint_multi(
        &[a.clone(), w.clone()],
        std::slice::from_ref(&w),
        move |xs| ops::linear(&xs[0], &w2),
    ));
    assert!(
        matches!(e, CheckpointError::InputIsDependency { index: 1, .. }),
        "{e}"
    );
}

#[test]
fn multi_input_checkpoint_keeps_the_dependency_rejections() {
    let a = Variable::leaf(rand(&[2, 3], 1), true);
    let b = Variable::leaf(rand(&[2, 3], 2), true);
    let w = Variable::leaf(rand(&[3, 3], 3), true);
    let w2 = w.clone();
    let e = checkpoint_err(checkpoint_multi(&[a.clone(), b.clone()], &[], move |xs| {
        ops::add(&ops::linear(&xs[0], &w2)?, &xs[1])
    }));
    assert!(
        matches!(e, CheckpointError::MissingDependency { .. }),
        "{e}"
    );
    // A value computed outside and captured instead of passed as an input.
    let h = ops::scale(&a, 2.0).unwrap();
    let e = checkpoint_err(checkpoint_multi(&[a.clone(), b.clone()], &[], move |xs| {
        ops::add(&ops::add(&xs[0], &h)?, &xs[1])
    }));
    assert!(
        matches!(e, CheckpointError::CapturedExternalNode { .. }),
        "{e}"
    );
}

#[test]
fn selective_multi_input_checkpoint_equals_the_plain_one_bitwise() {
    use riftco_autograd::{checkpoint_multi_with_options, named, CheckpointOptions};
    let x = Variable::leaf(rand(&[4, 6], 1), true);
    let w = Variable::leaf(rand(&[6, 6], 2), true);
    let run = |save: Vec<String>| {
        let a = ops::scale(&x, 2.0).unwrap();
        let b = ops::scale(&x, -1.0).unwrap();
        let w2 = w.clone();
        let y = checkpoint_multi_with_options(
            "two",
            &[a, b],
            std::slice::from_ref(&w),
            &CheckpointOptions::saving(save),
            move |xs, _| {
                let z = named("z", &[&xs[0]], || ops::linear(&xs[0], &w2))?;
                ops::mul(&ops::silu(&z)?, &xs[1])
            },
        )
        .unwrap();
        ops::sum(&y).unwrap().backward().unwrap();
        (x.grad().unwrap().to_vec(), w.grad().unwrap().to_vec())
    };
    assert_eq!(run(vec![]), run(vec!["z".to_string()]));
}

#[test]
fn a_saved_named_value_may_not_read_another_input_it_was_not_given() {
    use riftco_autograd::{checkpoint_multi_with_options, named, CheckpointOptions};
    let a = Variable::leaf(rand(&[2, 3], 1), true);
    let b = Variable::leaf(rand(&[2, 3], 2), true);
    let e = checkpoint_err(checkpoint_multi_with_options(
        "two",
        &[a, b],
        &[],
        &CheckpointOptions::saving(["z"]),
        |xs, _| named("z", &[&xs[0]], || ops::add(&xs[0], &xs[1])),
    ));
    assert!(
        matches!(e, CheckpointError::NamedOpCapturedNode { .. }),
        "{e}"
    );
}

#[test]
fn with_grad_mode_off_the_callable_runs_once_on_the_inputs() {
    let a = Variable::leaf(rand(&[2, 3], 1), true);
    let b = Variable::leaf(rand(&[2, 3], 2), true);
    let want = ops::add(&a, &b).unwrap().value().to_vec();
    let y = riftco_autograd::no_grad(|| {
        checkpoint_multi(&[a.clone(), b.clone()], &[], |xs| ops::add(&xs[0], &xs[1]))
    })
    .unwrap();
    assert_eq!(y.value().to_vec(), want);
    assert!(!y.requires_grad());
}

#[test]
fn prune_unused_dependencies_drops_an_unread_leaf_and_keeps_the_gradients_bitwise() {
    use riftco_autograd::{checkpoint_multi_with_options, CheckpointOptions};
    let x = Variable::leaf(rand(&[5, 8], 1), true);
    let w = Variable::leaf(rand(&[8, 8], 3), true);
    let unread = Variable::leaf(rand(&[8, 8], 4), true);
    let plain = ops::sum(&ops::silu(&ops::linear(&x, &w).unwrap()).unwrap()).unwrap();
    plain.backward().unwrap();
    let g_plain = grads(&[&x, &w]);
    x.zero_grad().unwrap();
    w.zero_grad().unwrap();

    let deps = [w.clone(), unread.clone()];
    let w2 = w.clone();
    let block = move |xs: &[Variable], _| ops::silu(&ops::linear(&xs[0], &w2)?);
    // Without the option an unread dependency is refused, naming it.
    let strict = checkpoint_multi_with_options(
        "block",
        std::slice::from_ref(&x),
        &deps,
        &CheckpointOptions::default(),
        block.clone(),
    );
    assert!(matches!(
        checkpoint_err(strict),
        CheckpointError::DependencyUnused { .. }
    ));
    let options = CheckpointOptions::default().with_prune_unused_dependencies(true);
    let y =
        checkpoint_multi_with_options("block", std::slice::from_ref(&x), &deps, &options, block)
            .unwrap();
    // The boundary is the input and the one dependency read.
    assert_eq!(y.parents().len(), 2);
    ops::sum(&y).unwrap().backward().unwrap();
    assert_eq!(grads(&[&x, &w]), g_plain);
    assert!(unread.grad().is_none());
}
