//! Contract violations: each a specific CheckpointError, nothing committed.

use super::*;

#[test]
fn a_save_name_no_named_call_uses_is_an_error_listing_the_names_used() {
    let _serial = serial();
    let x = Variable::leaf(rand(&[B, S, D], 1), true);
    let p = block_params(10);
    for save in [vec!["q", "atention"], vec!["atention"]] {
        let p2 = p.clone();
        let err = checkpoint_with_options(
            "layers.0",
            &x,
            &p,
            &CheckpointOptions::saving(save.clone()),
            move |h, _| block(h, &p2, AttentionKind::Flash, &Calls::default()),
        )
        .unwrap_err();
        let message = err.to_string();
        match checkpoint_error(err) {
            CheckpointError::SaveNameUnused {
                name,
                save_name,
                used,
            } => {
                assert_eq!(name, "layers.0");
                assert_eq!(save_name, "atention");
                let mut expected: Vec<String> = NAMES.iter().map(|n| n.to_string()).collect();
                expected.sort();
                assert_eq!(used, expected, "save {save:?}: names used");
            }
            other => panic!("save {save:?}: {other:?}"),
        }
        assert!(message.contains("\"atention\""), "{message}");
        assert!(message.contains("\"attention\""), "{message}");
    }
}

/// `checkpoint_with_options("cap", x, [w], save ["mm"], f)`'s error.
fn forward_error(
    f: impl Fn(&Variable, &Variable) -> Result<Variable> + Send + Sync + 'static,
) -> (CheckpointError, String) {
    let x = Variable::leaf(rand(&[4, 8], 1), true);
    let w = Variable::leaf(rand(&[8, 8], 2), true);
    let w2 = w.clone();
    let err = checkpoint_with_options(
        "cap",
        &x,
        &[w],
        &CheckpointOptions::saving(["mm"]),
        move |h, _| f(h, &w2),
    )
    .unwrap_err();
    let message = err.to_string();
    (checkpoint_error(err), message)
}

#[test]
fn a_saved_function_reading_a_graph_value_it_was_not_given_is_an_error() {
    let _serial = serial();
    // A value computed inside the callable before the named call.
    let (err, message) = forward_error(|h, w| {
        let a = ops::silu(h)?;
        named("mm", &[h], || ops::linear(&a, w))
    });
    assert!(
        matches!(&err, CheckpointError::NamedOpCapturedNode { name, op_name, op, .. }
            if name == "cap" && op_name == "mm" && *op == "silu"),
        "{err:?}"
    );
    assert!(
        message.contains("\"mm\"") && message.contains("silu"),
        "{message}"
    );
    // The checkpoint's own input leaf: a rebuilt node would hold the forward's leaf, and the
    // input gradient would be lost.
    let (err, message) = forward_error(|h, w| named("mm", &[], || ops::linear(h, w)));
    assert!(
        matches!(&err, CheckpointError::NamedOpCapturedNode { op_name, op, node, .. }
            if op_name == "mm" && *op == "leaf" && node.contains("[4, 8]")),
        "{err:?}"
    );
    assert!(message.contains("\"mm\""), "{message}");
    // Passing the value is accepted, and so is the same callable in a plain checkpoint.
    let x = Variable::leaf(rand(&[4, 8], 1), true);
    let w = Variable::leaf(rand(&[8, 8], 2), true);
    let f = |h: &Variable, w: &Variable| {
        let a = ops::silu(h)?;
        named("mm", &[&a], || ops::linear(&a, w))
    };
    let reference = weighted_sum(&f(&x, &w).unwrap());
    reference.backward().unwrap();
    let expected = grad_bits(&[x.clone(), w.clone()]);
    for save in [vec!["mm"], vec![]] {
        let w2 = w.clone();
        let options = CheckpointOptions::saving(save);
        let y = checkpoint_with_options(
            "cap",
            &x,
            std::slice::from_ref(&w),
            &options,
            move |h, _| f(h, &w2),
        )
        .unwrap();
        weighted_sum(&y).backward().unwrap();
        assert_eq!(grad_bits(&[x.clone(), w.clone()]), expected, "{options:?}");
    }
}

/// A checkpoint over `x [4, 8]`, `w [8, 8]` saving `save`, whose callable is `f(h, w, pass)`;
/// both leaves first get committed gradients from another graph. Its backward must fail and
/// leave those gradients bit for bit.
fn replay_error(
    save: &[&str],
    f: impl Fn(&Variable, &Variable, CheckpointPass) -> Result<Variable> + Send + Sync + 'static,
) -> (CheckpointError, String) {
    let x = Variable::leaf(rand(&[4, 8], 1), true);
    let w = Variable::leaf(rand(&[8, 8], 2), true);
    let leaves = [x.clone(), w.clone()];
    weighted_sum(&ops::linear(&x, &w).unwrap())
        .backward()
        .unwrap();
    let before = grad_bits(&leaves);
    let w2 = w.clone();
    let options = CheckpointOptions::saving(save.iter().copied());
    let y =
        checkpoint_with_options("div", &x, &[w], &options, move |h, pass| f(h, &w2, pass)).unwrap();
    let err = weighted_sum(&y).backward().unwrap_err();
    assert_eq!(grad_bits(&leaves), before, "a failed backward committed");
    let message = err.to_string();
    (checkpoint_error(err), message)
}

fn diverged(err: &CheckpointError) -> (&str, &str) {
    match err {
        CheckpointError::NamedOpReplayDiverged {
            name,
            expected,
            got,
        } if name == "div" => (expected, got),
        other => panic!("expected NamedOpReplayDiverged of \"div\", got {other:?}"),
    }
}

#[test]
fn a_replay_calling_other_names_is_an_error_and_commits_nothing() {
    let _serial = serial();
    // A saved name the replay does not call.
    let (err, message) = replay_error(&["q"], |h, w, pass| {
        let name = if pass == CheckpointPass::Forward {
            "q"
        } else {
            "q2"
        };
        named(name, &[h], || ops::linear(h, w))
    });
    let (expected, got) = diverged(&err);
    assert_eq!(expected, "\"q\" with inputs [[4, 8]]");
    assert_eq!(got, "the end of the callable");
    assert!(message.contains("\"q\""), "{message}");
    // Two saved names in the other order.
    let (err, _) = replay_error(&["q", "k"], |h, w, pass| {
        let (first, second) = match pass {
            CheckpointPass::Forward => ("q", "k"),
            CheckpointPass::Replay => ("k", "q"),
        };
        let a = named(first, &[h], || ops::linear(h, w))?;
        let b = named(second, &[h], || ops::silu(h))?;
        ops::add(&a, &b)
    });
    let (expected, got) = diverged(&err);
    assert!(
        expected.starts_with("\"q\"") && got.starts_with("\"k\""),
        "{err}"
    );
}

#[test]
fn a_replay_with_other_input_shapes_is_an_error_and_commits_nothing() {
    let _serial = serial();
    let (err, message) = replay_error(&["mm"], |h, w, pass| match pass {
        CheckpointPass::Forward => named("mm", &[h], || ops::linear(h, w)),
        CheckpointPass::Replay => {
            let h3 = ops::reshape(h, vec![2, 2, 8])?;
            let y = named("mm", &[&h3], || ops::linear(&h3, w))?;
            ops::reshape(&y, vec![4, 8])
        }
    });
    let (expected, got) = diverged(&err);
    assert!(expected.contains("[[4, 8]]"), "{err}");
    assert!(got.contains("[[2, 2, 8]]"), "{err}");
    assert!(message.contains("[[2, 2, 8]]"), "{message}");
}

#[test]
fn a_replay_with_fewer_or_more_saved_calls_is_an_error_and_commits_nothing() {
    let _serial = serial();
    let twice_at = |at: CheckpointPass| {
        move |h: &Variable, w: &Variable, pass: CheckpointPass| {
            let a = named("mm", &[h], || ops::linear(h, w))?;
            if pass == at {
                named("mm", &[&a], || ops::linear(&a, w))
            } else {
                ops::linear(&a, w)
            }
        }
    };
    let (err, _) = replay_error(&["mm"], twice_at(CheckpointPass::Forward));
    let (expected, got) = diverged(&err);
    assert_eq!(
        (expected, got),
        ("\"mm\" with inputs [[4, 8]]", "the end of the callable")
    );
    let (err, _) = replay_error(&["mm"], twice_at(CheckpointPass::Replay));
    let (expected, got) = diverged(&err);
    assert_eq!(
        (expected, got),
        ("no more (the forward run saved no further value)", "\"mm\"")
    );
}
