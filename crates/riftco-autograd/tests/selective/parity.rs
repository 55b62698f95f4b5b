//! Gradients equal the uncheckpointed block for every save set; saved functions run once.

use super::*;

#[test]
fn every_save_subset_gives_the_gradients_of_the_plain_checkpoint_bit_for_bit() {
    let _serial = serial();
    for kind in [AttentionKind::Flash, AttentionKind::Materialized] {
        let reference = outcome(&Mode::NoCheckpoint, kind);
        assert!(reference.grads[0].is_some(), "the input got no gradient");
        assert!(reference.grads[5].is_none(), "the frozen wo got a gradient");
        let plain = outcome(&Mode::Plain, kind);
        assert_eq!(
            plain.loss, reference.loss,
            "{kind:?}: plain checkpoint loss"
        );
        assert_eq!(plain.grads, reference.grads, "{kind:?}: plain checkpoint");
        for mask in 0..1 << NAMES.len() {
            let save = subset(mask);
            let got = outcome(&Mode::Save(save.clone()), kind);
            assert_eq!(got.loss, reference.loss, "{kind:?}, save {save:?}: loss");
            for (i, (g, r)) in got.grads.iter().zip(&reference.grads).enumerate() {
                assert_eq!(g, r, "{kind:?}, save {save:?}: gradient of leaf {i}");
            }
        }
    }
}

#[test]
fn a_saved_function_runs_once_and_an_unsaved_one_again_at_replay() {
    let _serial = serial();
    let saves: [&[&str]; 4] = [&[], &["mm"], &["q", "attention", "norm"], &NAMES];
    for save in saves {
        let calls = Calls::default();
        let x = Variable::leaf(rand(&[B, S, D], 1), true);
        let p = block_params(10);
        let mode = Mode::Save(save.iter().map(|s| s.to_string()).collect());
        let y = run_block(&mode, &x, &p, AttentionKind::Flash, &calls).unwrap();
        for name in NAMES {
            assert_eq!(calls.get(name), calls_per_run(name), "{name} after forward");
        }
        weighted_sum(&y).backward().unwrap();
        for name in NAMES {
            let runs = if save.contains(&name) { 1 } else { 2 };
            assert_eq!(
                calls.get(name),
                runs * calls_per_run(name),
                "{name} after backward with save {save:?}"
            );
        }
    }
}
