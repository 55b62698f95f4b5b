//! Random draws through the thread's generator inside selective checkpoints: a saved
//! [`named`] value that drew a dropout mask is not recomputed at the replay, so the replay must
//! move the generator past the blocks that call drew — otherwise every later draw of the
//! callable gets another mask and the gradients silently belong to another forward.

mod common;
use common::rand;
use riftco_autograd::{
    checkpoint_with_options, manual_seed, named, ops, rng_state, CheckpointOptions,
    DeterminismCheck, Result, Variable,
};

/// `dropout(linear(named("drop_in", dropout(h, 0.3)), w), 0.5)`, both masks drawn from the
/// thread's generator.
fn body(h: &Variable, w: &Variable) -> Result<Variable> {
    let a = named("drop_in", &[h], || ops::dropout_random(h, 0.3))?;
    ops::dropout_random(&ops::linear(&a, w)?, 0.5)
}

/// Gradients of `Σ body(x)` w.r.t. x and w: plain, or through a checkpoint saving `save`.
fn grads(save: Option<&[&str]>, check: DeterminismCheck) -> (Vec<f32>, Vec<f32>, f32) {
    let x = Variable::leaf(rand(&[6, 8], 1), true);
    let w = Variable::leaf(rand(&[8, 8], 9), true);
    manual_seed(4);
    let y = match save {
        None => body(&x, &w).unwrap(),
        Some(names) => {
            let options =
                CheckpointOptions::saving(names.iter().copied()).with_determinism_check(check);
            let w2 = w.clone();
            checkpoint_with_options(
                "two dropouts",
                &x,
                std::slice::from_ref(&w),
                &options,
                move |h, _| body(h, &w2),
            )
            .unwrap()
        }
    };
    let after_forward = rng_state();
    let loss = ops::sum(&y).unwrap();
    loss.backward().unwrap();
    assert_eq!(
        rng_state(),
        after_forward,
        "the backward moved the thread's generator"
    );
    (
        x.grad().unwrap().to_vec(),
        w.grad().unwrap().to_vec(),
        loss.value().item().unwrap(),
    )
}

#[test]
fn a_saved_value_that_drew_random_numbers_keeps_the_later_draws_of_the_replay() {
    let plain = grads(None, DeterminismCheck::Metadata);
    for check in [DeterminismCheck::Metadata, DeterminismCheck::Values] {
        for save in [&["drop_in"][..], &[][..]] {
            let ck = grads(Some(save), check);
            assert_eq!(plain.2.to_bits(), ck.2.to_bits(), "{save:?} {check}: loss");
            assert_eq!(plain.0, ck.0, "{save:?} {check}: dx");
            assert_eq!(plain.1, ck.1, "{save:?} {check}: dw");
        }
    }
}

#[test]
fn values_accepts_a_saved_value_that_drew_random_numbers() {
    // The whole random part is inside the saved value: nothing after it draws, and the replay's
    // generator offsets must still match the forward's for "values".
    let x = Variable::leaf(rand(&[4, 8], 2), true);
    let w = Variable::leaf(rand(&[8, 8], 9), true);
    manual_seed(1);
    let w2 = w.clone();
    let options = CheckpointOptions::saving(["d"]).with_determinism_check(DeterminismCheck::Values);
    let y = checkpoint_with_options(
        "saved dropout",
        &x,
        std::slice::from_ref(&w),
        &options,
        move |h, _| {
            let d = named("d", &[h], || {
                ops::dropout_random(&ops::linear(h, &w2)?, 0.5)
            })?;
            ops::silu(&d)
        },
    )
    .unwrap();
    ops::sum(&y).unwrap().backward().unwrap();
    assert!(w.grad().is_some());
}
