//! A second backward after a failed one reuses the saved values.

use super::*;

#[test]
fn a_second_backward_after_a_failure_past_the_replay_reuses_the_saved_values() {
    let _serial = serial();
    let kind = AttentionKind::Flash;
    let save = vec!["q".to_string(), "attention".into(), "mm".into()];
    let reference = outcome(&Mode::NoCheckpoint, kind);
    let x = Variable::leaf(rand(&[B, S, D], 1), true);
    let p = block_params(10);
    let leaves: Vec<Variable> = std::iter::once(x.clone()).chain(p.clone()).collect();
    // An identity op below the checkpoint whose VJP, which runs after the replay, fails once.
    let fail = Arc::new(AtomicBool::new(true));
    let fail2 = fail.clone();
    let x1 = Variable::from_op(
        "fail_once",
        x.value().clone(),
        vec![x.clone()],
        move |_, _, g| {
            if fail2.swap(false, Ordering::SeqCst) {
                return Err(AutogradError::Panic {
                    during: "fail_once",
                    message: "injected failure".into(),
                });
            }
            Ok(vec![Some(g.clone())])
        },
    );
    let calls = Calls::default();
    let loss = weighted_sum(&run_block(&Mode::Save(save.clone()), &x1, &p, kind, &calls).unwrap());
    let err = loss.backward().unwrap_err();
    assert!(err.to_string().contains("injected failure"), "{err}");
    assert!(!fail.load(Ordering::SeqCst), "the failing VJP did not run");
    assert!(
        leaves.iter().all(|l| l.grad().is_none()),
        "a failed pass committed"
    );
    for round in 2..=3 {
        loss.backward().unwrap();
        assert_eq!(grad_bits(&leaves), reference.grads, "backward {round}");
    }
    // A fourth pass accumulating onto the third: every gradient doubles (exact in f32).
    loss.backward_accumulate().unwrap();
    let doubled: Vec<Option<Vec<u32>>> = reference
        .grads
        .iter()
        .map(|g| {
            g.as_ref().map(|g| {
                g.iter()
                    .map(|&b| (2.0 * f32::from_bits(b)).to_bits())
                    .collect()
            })
        })
        .collect();
    assert_eq!(grad_bits(&leaves), doubled, "backward_accumulate");
    // Four replays ran to the end; the saved functions ran at the forward only.
    for name in NAMES {
        let runs = if save.iter().any(|s| s == name) { 1 } else { 5 };
        assert_eq!(calls.get(name), runs * calls_per_run(name), "{name}");
    }
}

#[test]
fn a_replay_that_fails_after_rebuilding_a_value_can_be_retried() {
    let _serial = serial();
    let kind = AttentionKind::Materialized;
    let reference = outcome(&Mode::NoCheckpoint, kind);
    let x = Variable::leaf(rand(&[B, S, D], 1), true);
    let p = block_params(10);
    let leaves: Vec<Variable> = std::iter::once(x.clone()).chain(p.clone()).collect();
    let fail = Arc::new(AtomicBool::new(true));
    let (fail2, p2, calls) = (fail.clone(), p.clone(), Calls::default());
    let calls2 = calls.clone();
    // Fails in its first replay after the first saved value ("q") was rebuilt.
    let f = move |h: &Variable, pass: CheckpointPass| {
        let y = block(h, &p2, kind, &calls2)?;
        if pass == CheckpointPass::Replay && fail2.swap(false, Ordering::SeqCst) {
            return Err(AutogradError::Panic {
                during: "callable",
                message: "injected failure".into(),
            });
        }
        Ok(y)
    };
    let options = CheckpointOptions::saving(["q", "lora"]);
    let y = checkpoint_with_options("block", &x, &p, &options, f).unwrap();
    let loss = weighted_sum(&y);
    assert!(loss.backward().is_err());
    assert!(
        leaves.iter().all(|l| l.grad().is_none()),
        "a failed pass committed"
    );
    loss.backward().unwrap();
    assert_eq!(grad_bits(&leaves), reference.grads);
    assert_eq!((calls.get("q"), calls.get("k")), (1, 3));
}
