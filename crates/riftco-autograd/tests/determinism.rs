//! The thread's generator state across checkpoint replays (`preserve_rng_state`) and the
//! replay checks of `determinism_check` ("off", "metadata", "values").

mod common;
use common::{block, params, rand};
use riftco_autograd::{
    checkpoint_with_options, manual_seed, named, ops, reserve, rng_state, set_rng_state,
    AutogradError, CheckpointError, CheckpointOptions, CheckpointPass, DeterminismCheck, Result,
    RngState, Variable,
};
use riftco_tensor::{MemoryCategory as C, Tensor};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

fn grads(vars: &[Variable]) -> Vec<Vec<f32>> {
    vars.iter().map(|v| v.grad().unwrap().to_vec()).collect()
}

fn options(check: DeterminismCheck) -> CheckpointOptions {
    CheckpointOptions::default().with_determinism_check(check)
}

/// `Σ block(x)²` through one checkpoint whose callable adds `calls` (the number of times it
/// ran before) to element 5 of its output: the replay computes another value than the forward.
fn counter_loss(
    x: &Variable,
    p: &[Variable],
    check: DeterminismCheck,
) -> (Variable, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let (c, p2) = (calls.clone(), p.to_vec());
    let y = checkpoint_with_options("counter block", x, p, &options(check), move |x, _| {
        let n = c.fetch_add(1, Ordering::Relaxed);
        let h = block(x, &p2)?;
        let mut bump = vec![0.0f32; h.value().numel()];
        bump[5] = n as f32;
        let bump = Tensor::from_vec(bump, h.dims().to_vec(), C::Workspace)?;
        ops::add(&h, &Variable::constant(bump))
    })
    .unwrap();
    (ops::sum(&ops::mul(&y, &y).unwrap()).unwrap(), calls)
}

#[test]
fn values_catches_a_callable_reading_a_counter_and_commits_nothing() {
    let x = Variable::leaf(rand(&[4, 8], 1), true);
    let p = params(2, 8, true);
    let all: Vec<Variable> = p.iter().cloned().chain([x.clone()]).collect();
    // Gradients of an earlier, successful pass: the failed one must leave them as they are.
    let plain = ops::sum(&block(&x, &p).unwrap()).unwrap();
    plain.backward().unwrap();
    let before = grads(&all);

    let (loss, calls) = counter_loss(&x, &p, DeterminismCheck::Values);
    let err = loss.backward().unwrap_err();
    assert_eq!(calls.load(Ordering::Relaxed), 2, "forward and one replay");
    match &err {
        AutogradError::Checkpoint(CheckpointError::ReplayValuesChanged {
            name,
            index,
            forward,
            replay,
        }) => {
            assert_eq!(name, "counter block");
            assert_eq!(*index, 5, "the first (and only) differing element");
            // The replay added 1 where the forward added 0.
            assert_eq!(*replay, *forward + 1.0, "{forward} vs {replay}");
        }
        other => panic!("expected ReplayValuesChanged, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("\"counter block\"") && msg.contains("flat index 5"),
        "{msg}"
    );
    assert_eq!(grads(&all), before, "a failed pass commits nothing");
}

#[test]
fn metadata_does_not_catch_a_changed_value_of_the_same_shape() {
    // PyTorch's level: shape and device only. The pass succeeds with the replay's values.
    let x = Variable::leaf(rand(&[4, 8], 1), true);
    let p = params(2, 8, true);
    let (loss, calls) = counter_loss(&x, &p, DeterminismCheck::Metadata);
    loss.backward().unwrap();
    assert_eq!(calls.load(Ordering::Relaxed), 2);
    let (loss_off, _) = counter_loss(&x, &p, DeterminismCheck::Off);
    loss_off.backward().unwrap();
}

#[test]
fn values_catches_a_replay_drawing_another_number_of_random_blocks() {
    manual_seed(3);
    let x = Variable::leaf(rand(&[4, 8], 1), true);
    let p = params(2, 8, true);
    let calls = Arc::new(AtomicUsize::new(0));
    let (c, p2) = (calls.clone(), p.clone());
    let opts = options(DeterminismCheck::Values);
    let y = checkpoint_with_options("rng block", &x, &p, &opts, move |x, _| {
        // One block at the forward run, two at the replay; the values do not depend on them.
        reserve(1 + c.fetch_add(1, Ordering::Relaxed) as u64)?;
        block(x, &p2)
    })
    .unwrap();
    assert_eq!(rng_state(), RngState { seed: 3, offset: 1 });
    let err = ops::sum(&y).unwrap().backward().unwrap_err();
    match &err {
        AutogradError::Checkpoint(CheckpointError::ReplayRngChanged {
            name,
            forward_after,
            replay_after,
            ..
        }) => {
            assert_eq!(name, "rng block");
            assert_eq!(forward_after.offset, 1);
            assert_eq!(replay_after.offset, 2);
        }
        other => panic!("expected ReplayRngChanged, got {other:?}"),
    }
    assert!(err.to_string().contains("offset 2"), "{err}");
    assert!(p.iter().all(|v| v.grad().is_none()), "nothing committed");
    // The replay's draws did not leak into the thread's stream.
    assert_eq!(rng_state(), RngState { seed: 3, offset: 1 });
}

/// A callable that reserves 4 blocks and scales its block output by `1 + offset / 100` (so the
/// gradients depend on the draw), recording the state it drew from at each run.
fn drawing(
    x: &Variable,
    p: &[Variable],
    opts: &CheckpointOptions,
) -> (Variable, Arc<Mutex<Vec<RngState>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (s, p2) = (seen.clone(), p.to_vec());
    let y = checkpoint_with_options("drawing", x, p, opts, move |x, _| {
        let state = reserve(4)?;
        s.lock().unwrap().push(state);
        ops::scale(&block(x, &p2)?, 1.0 + state.offset as f32 / 100.0)
    })
    .unwrap();
    (ops::sum(&ops::mul(&y, &y).unwrap()).unwrap(), seen)
}

#[test]
fn preserve_rng_state_replays_the_forward_draws_and_restores_the_thread_state() {
    let x = Variable::leaf(rand(&[4, 8], 1), true);
    let p = params(2, 8, true);
    let all: Vec<Variable> = p.iter().cloned().chain([x.clone()]).collect();
    // Reference: the same computation without a checkpoint.
    manual_seed(10);
    reserve(6).unwrap();
    let state = reserve(4).unwrap();
    let y = ops::scale(&block(&x, &p).unwrap(), 1.0 + state.offset as f32 / 100.0).unwrap();
    ops::sum(&ops::mul(&y, &y).unwrap())
        .unwrap()
        .backward()
        .unwrap();
    let reference = grads(&all);

    for check in DeterminismCheck::ALL {
        manual_seed(10);
        reserve(6).unwrap();
        let (loss, seen) = drawing(&x, &p, &options(check));
        let after_forward = rng_state();
        assert_eq!(
            after_forward,
            RngState {
                seed: 10,
                offset: 10
            }
        );
        // Draws between forward and backward (another model's step, a data shuffle).
        reserve(100).unwrap();
        let before_backward = rng_state();
        loss.backward().unwrap();
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2);
        assert_eq!(
            seen[1], seen[0],
            "{check}: the replay drew from the forward's state"
        );
        assert_eq!(
            rng_state(),
            before_backward,
            "{check}: the thread's stream is untouched"
        );
        assert_eq!(
            grads(&all),
            reference,
            "{check}: the plain graph's gradients"
        );
    }
}

#[test]
fn without_preserve_rng_state_the_replay_draws_from_the_current_state() {
    let x = Variable::leaf(rand(&[4, 8], 1), true);
    let p = params(2, 8, true);
    manual_seed(10);
    let preserved = options(DeterminismCheck::Metadata);
    let (loss, _) = drawing(&x, &p, &preserved);
    loss.backward().unwrap();
    let reference = grads(&p);

    manual_seed(10);
    let opts = preserved.clone().with_preserve_rng_state(false);
    let (loss, seen) = drawing(&x, &p, &opts);
    assert_eq!(
        rng_state(),
        RngState {
            seed: 10,
            offset: 4
        }
    );
    loss.backward().unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen[0],
        RngState {
            seed: 10,
            offset: 0
        }
    );
    assert_eq!(
        seen[1],
        RngState {
            seed: 10,
            offset: 4
        },
        "the thread's state"
    );
    assert_eq!(
        rng_state(),
        RngState {
            seed: 10,
            offset: 8
        },
        "and it advanced"
    );
    // The replay scaled by another factor than the forward: other gradients, silently.
    assert_ne!(grads(&p), reference);

    // The same number of blocks drawn: "values" accepts the RNG use, but sees the values.
    manual_seed(10);
    let opts = opts.with_determinism_check(DeterminismCheck::Values);
    let (loss, _) = drawing(&x, &p, &opts);
    let err = loss.backward().unwrap_err();
    assert!(
        matches!(
            err,
            AutogradError::Checkpoint(CheckpointError::ReplayValuesChanged { index: 0, .. })
        ),
        "{err:?}"
    );
}

#[test]
fn off_still_rejects_a_replay_of_another_shape() {
    let x = Variable::leaf(rand(&[4, 8], 1), true);
    let p = params(2, 8, true);
    let p2 = p.clone();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let y = checkpoint_with_options(
        "reshaping",
        &x,
        &p,
        &options(DeterminismCheck::Off),
        move |x, _| {
            let h = block(x, &p2)?;
            if c.fetch_add(1, Ordering::Relaxed) == 0 {
                Ok(h)
            } else {
                ops::reshape(&h, [8, 4])
            }
        },
    )
    .unwrap();
    let err = ops::sum(&y).unwrap().backward().unwrap_err();
    assert!(
        matches!(
            &err,
            AutogradError::Checkpoint(CheckpointError::ReplayShapeChanged { name, .. })
                if name == "reshaping"
        ),
        "{err:?}"
    );
    assert!(p.iter().all(|v| v.grad().is_none()));
}

/// Two nested checkpoints (the inner one selective, saving `"mm"`) whose callables draw random
/// blocks; the outer callable returns a graph-only tail at replay.
fn nested_loss(x: &Variable, p: &[Variable], check: DeterminismCheck) -> Variable {
    let (p_outer, p_inner) = (p.to_vec(), p[..2].to_vec());
    let outer = options(check);
    checkpoint_with_options("outer", x, p, &outer, move |x, pass| {
        let state = reserve(2)?;
        let inner = CheckpointOptions::saving(["mm"]).with_determinism_check(check);
        let p_in = p_inner.clone();
        let h = checkpoint_with_options("inner", x, &p_inner, &inner, move |x, _| {
            let state = reserve(3)?;
            let n = ops::rms_norm(x, &p_in[0], 1e-5)?;
            let h = named("mm", &[&n], || ops::linear(&n, &p_in[1]))?;
            ops::scale(&ops::silu(&h)?, 1.0 + state.offset as f32 / 64.0)
        })?;
        let h = ops::scale(&h, 1.0 + state.offset as f32 / 32.0)?;
        match pass {
            CheckpointPass::Forward => ops::add(x, &ops::linear(&h, &p_outer[2])?),
            CheckpointPass::Replay => {
                ops::add_graph_only(x, &ops::linear_graph_only(&h, &p_outer[2])?)
            }
        }
    })
    .map(|y| ops::sum(&ops::mul(&y, &y).unwrap()).unwrap())
    .unwrap()
}

#[test]
fn values_passes_silently_on_nested_selective_checkpoints_with_random_draws() {
    let x = Variable::leaf(rand(&[4, 8], 1), true);
    let p = params(2, 8, true);
    let all: Vec<Variable> = p.iter().cloned().chain([x.clone()]).collect();
    let mut results = Vec::new();
    for check in DeterminismCheck::ALL {
        manual_seed(5);
        let loss = nested_loss(&x, &p, check);
        let after_forward = rng_state();
        loss.backward().unwrap();
        assert_eq!(rng_state(), after_forward, "{check}");
        results.push((loss.value().to_vec(), grads(&all)));
    }
    assert_eq!(results[0], results[1], "off vs metadata");
    assert_eq!(results[1], results[2], "metadata vs values, bitwise");
}

#[test]
fn reserve_overflow_is_an_error_and_leaves_the_state() {
    let near_end = RngState {
        seed: 1,
        offset: u64::MAX - 1,
    };
    set_rng_state(near_end);
    assert_eq!(reserve(1).unwrap(), near_end);
    let err = reserve(1).unwrap_err();
    assert!(
        matches!(
            err,
            AutogradError::RngOffsetOverflow {
                offset: u64::MAX,
                blocks: 1
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.kind(), riftco_tensor::ErrorKind::InvalidArgument);
    assert_eq!(rng_state().offset, u64::MAX);
    assert!(reserve(0).is_ok(), "zero blocks still fit");
    manual_seed(0);
    assert_eq!(reserve(u64::MAX).unwrap().offset, 0);
    assert!(reserve(1).is_err());
}

#[test]
fn bad_determinism_check_spellings_are_errors_naming_the_value() {
    for bad in ["", "value", "METADATA", "none", "shape"] {
        let err = bad.parse::<DeterminismCheck>().unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("{bad:?}")) && msg.contains("\"off\", \"metadata\", \"values\""),
            "{msg}"
        );
        assert_eq!(err.kind(), riftco_tensor::ErrorKind::UnknownOption);
    }
    assert_eq!(
        "  off ".parse::<DeterminismCheck>().unwrap(),
        DeterminismCheck::Off
    );
}

#[test]
fn default_options_preserve_the_rng_state_and_check_metadata() -> Result<()> {
    let d = CheckpointOptions::default();
    assert!(d.preserve_rng_state);
    assert_eq!(d.determinism_check, DeterminismCheck::Metadata);
    let s = CheckpointOptions::saving(["q"]);
    assert!(s.preserve_rng_state);
    assert_eq!(s.determinism_check, DeterminismCheck::Metadata);
    Ok(())
}

/// `Σ y²` through a checkpoint whose callable applies SiLU only while `flag` is set (a
/// module's `train()` / `eval()` switch, say): the flag is cleared between the forward and
/// the backward pass, so the replay takes another path.
fn switched_loss(x: &Variable, p: &[Variable], check: DeterminismCheck) -> Variable {
    let flag = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (f, p2) = (flag.clone(), p.to_vec());
    let y = checkpoint_with_options("switched block", x, p, &options(check), move |x, _| {
        let h = block(x, &p2)?;
        if f.load(Ordering::Relaxed) {
            ops::silu(&h)
        } else {
            Ok(h)
        }
    })
    .unwrap();
    flag.store(false, Ordering::Relaxed);
    ops::sum(&ops::mul(&y, &y).unwrap()).unwrap()
}

#[test]
fn metadata_catches_a_replay_that_records_another_graph_and_commits_nothing() {
    let x = Variable::leaf(rand(&[4, 8], 1), true);
    let p = params(2, 8, true);
    let all: Vec<Variable> = p.iter().cloned().chain([x.clone()]).collect();
    ops::sum(&block(&x, &p).unwrap())
        .unwrap()
        .backward()
        .unwrap();
    let before = grads(&all);
    for check in [DeterminismCheck::Metadata, DeterminismCheck::Values] {
        let err = switched_loss(&x, &p, check).backward().unwrap_err();
        match &err {
            AutogradError::Checkpoint(CheckpointError::ReplayGraphChanged {
                name,
                forward_ops,
                replay_ops,
                ..
            }) => {
                assert_eq!(name, "switched block");
                assert_eq!(*forward_ops, *replay_ops + 1, "the SiLU node is missing");
            }
            other => panic!("{check:?}: expected ReplayGraphChanged, got {other:?}"),
        }
        assert!(err.to_string().contains("train() and eval()"), "{err}");
        assert_eq!(grads(&all), before, "a failed pass commits nothing");
    }
    // "off" compares nothing: the backward differentiates the replay's graph.
    switched_loss(&x, &p, DeterminismCheck::Off)
        .backward()
        .unwrap();
}
