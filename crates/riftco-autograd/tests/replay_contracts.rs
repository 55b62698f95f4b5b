//! What a checkpoint callable may not do while it is replayed: start `backward()` (of the
//! graph that contains it or of any other), or change a value the outer graph read. Each is a
//! clear error, and a failed pass commits no public gradient, nested passes included.

mod common;
use common::{block, params, rand, run_chain};
use riftco_autograd::{
    checkpoint, ops, AutogradError, CheckpointError, GradientContext, Result, Variable,
};
use riftco_tensor::{MemoryCategory, Tensor};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

fn grads(vars: &[Variable]) -> Vec<Option<Vec<f32>>> {
    vars.iter().map(|v| v.grad().map(|g| g.to_vec())).collect()
}

/// Adds `delta` to every element of `v` in place (bumps its version, like an optimizer step).
fn nudge(v: &Variable, delta: f32) {
    for e in v.value().write().unwrap().iter_mut() {
        *e += delta;
    }
}

type Slot = Arc<Mutex<Option<Variable>>>;

/// `sum(checkpoint(block)(x)²)` whose callable, during replay, runs `during_replay` with the
/// loss (held in a slot filled after the forward).
fn loss_with_replay_hook(
    x: &Variable,
    p: &[Variable],
    during_replay: impl Fn(&Variable) -> Result<()> + Send + Sync + 'static,
) -> (Variable, Arc<AtomicUsize>) {
    let slot: Slot = Arc::new(Mutex::new(None));
    let replays = Arc::new(AtomicUsize::new(0));
    let (slot2, replays2, p2) = (slot.clone(), replays.clone(), p.to_vec());
    let y = checkpoint(x, p, move |h| {
        let loss = slot2.lock().unwrap().clone();
        if let Some(loss) = loss {
            replays2.fetch_add(1, Ordering::SeqCst);
            during_replay(&loss)?;
        }
        block(h, &p2)
    })
    .unwrap();
    let loss = ops::sum(&ops::mul(&y, &y).unwrap()).unwrap();
    *slot.lock().unwrap() = Some(loss.clone());
    (loss, replays)
}

#[test]
fn backward_of_the_enclosing_loss_inside_a_replay_is_rejected_not_recursed() {
    // Before: every replay started a new pass over the same graph, which replayed the
    // checkpoint again, until the stack overflowed.
    let x = Variable::leaf(rand(&[3, 8], 1), true);
    let p = params(2, 8, true);
    let (loss, replays) = loss_with_replay_hook(&x, &p, |loss| loss.backward());
    let err = loss.backward().unwrap_err();
    assert!(
        matches!(
            &err,
            AutogradError::Checkpoint(CheckpointError::BackwardInsideReplay { name })
                if name == "checkpoint"
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("backward"), "{err}");
    assert_eq!(replays.load(Ordering::SeqCst), 1, "replayed more than once");
    assert!(
        grads(&p).iter().all(Option::is_none),
        "a failed pass committed"
    );
}

#[test]
fn a_callable_that_swallows_the_rejection_still_gives_the_plain_gradients() {
    let x = Variable::leaf(rand(&[3, 8], 1), true);
    let p = params(2, 8, true);
    let rejected = Arc::new(AtomicBool::new(false));
    let r2 = rejected.clone();
    let (loss, _) = loss_with_replay_hook(&x, &p, move |loss| {
        r2.store(loss.backward_accumulate().is_err(), Ordering::SeqCst);
        Ok(())
    });
    loss.backward().unwrap();
    assert!(rejected.load(Ordering::SeqCst));
    let g_ck = grads(&p);
    run_chain(&x, std::slice::from_ref(&p), false)
        .backward()
        .unwrap();
    assert_eq!(g_ck, grads(&p));
}

#[test]
fn functional_pass_over_the_enclosing_graph_inside_a_replay_is_rejected() {
    // GradientContext::compute commits nothing, so it is allowed inside a replay, but a pass
    // that reaches the checkpoint being replayed would replay it again without end.
    let x = Variable::leaf(rand(&[3, 8], 1), true);
    let p = params(2, 8, true);
    let (loss, replays) = loss_with_replay_hook(&x, &p, |loss| {
        let seed = Tensor::ones(loss.value().shape().clone(), MemoryCategory::Gradient);
        GradientContext::compute(loss, seed).map(|_| ())
    });
    let err = loss.backward().unwrap_err();
    assert!(
        matches!(
            &err,
            AutogradError::Checkpoint(CheckpointError::ReentrantReplay { .. })
        ),
        "{err:?}"
    );
    assert_eq!(
        replays.load(Ordering::SeqCst),
        1,
        "the nested replay ran the callable"
    );
    assert!(
        grads(&p).iter().all(Option::is_none),
        "a failed pass committed"
    );
}

/// The gradients with the checkpoint, those of the plain graph, what the spawned thread's pass
/// returned, and how often the callable was replayed.
type SpawnedOutcome = (Vec<Option<Vec<f32>>>, Vec<Option<Vec<f32>>>, String, usize);

/// A pass over the enclosing graph from a thread that the replay callable started: the
/// thread-local replay marker cannot see it, the process-wide one refuses it.
fn from_a_spawned_thread(
    pass: impl Fn(&Variable) -> Result<()> + Send + Sync + Copy + 'static,
) -> SpawnedOutcome {
    let x = Variable::leaf(rand(&[3, 8], 1), true);
    let p = params(2, 8, true);
    let seen: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let seen2 = seen.clone();
    let (loss, replays) = loss_with_replay_hook(&x, &p, move |loss| {
        let loss = loss.clone();
        let outcome = std::thread::spawn(move || pass(&loss)).join().unwrap();
        *seen2.lock().unwrap() = Some(match outcome {
            Err(AutogradError::Checkpoint(CheckpointError::ReplayRunningElsewhere { name })) => {
                format!("refused: {name}")
            }
            other => format!("{other:?}"),
        });
        Ok(())
    });
    loss.backward().unwrap();
    let g_ck = grads(&p);
    for v in &p {
        v.zero_grad().unwrap();
    }
    run_chain(&x, std::slice::from_ref(&p), false)
        .backward()
        .unwrap();
    let seen = seen.lock().unwrap().clone().unwrap();
    (g_ck, grads(&p), seen, replays.load(Ordering::SeqCst))
}

#[test]
fn backward_from_a_thread_the_replay_started_is_refused_and_commits_nothing() {
    let (g_ck, g_plain, seen, replays) = from_a_spawned_thread(|loss| loss.backward_accumulate());
    assert_eq!(
        seen, "refused: checkpoint",
        "the spawned thread's backward ran: {seen}"
    );
    assert_eq!(replays, 1, "the spawned pass replayed the checkpoint");
    assert_eq!(
        g_ck, g_plain,
        "the spawned pass changed the public gradients"
    );
}

#[test]
fn functional_pass_from_a_thread_the_replay_started_is_refused() {
    let (g_ck, g_plain, seen, replays) = from_a_spawned_thread(|loss| {
        let seed = Tensor::ones(loss.value().shape().clone(), MemoryCategory::Gradient);
        GradientContext::compute(loss, seed).map(|_| ())
    });
    assert_eq!(seen, "refused: checkpoint", "{seen}");
    assert_eq!(replays, 1);
    assert_eq!(g_ck, g_plain);
}

#[test]
fn two_threads_differentiating_their_own_graphs_of_shared_parameters_are_not_refused() {
    // The rule is per checkpoint node, so concurrent training of one model from two threads
    // (each thread its own loss over the same parameters) stays allowed.
    let p = params(2, 8, true);
    let handles: Vec<_> = (0..2)
        .map(|t| {
            let p = p.clone();
            std::thread::spawn(move || {
                let x = Variable::leaf(rand(&[3, 8], 10 + t), false);
                for _ in 0..20 {
                    let p2 = p.clone();
                    let y = checkpoint(&x, &p, move |h| block(h, &p2)).unwrap();
                    ops::sum(&ops::mul(&y, &y).unwrap())
                        .unwrap()
                        .backward_accumulate()?;
                }
                Ok::<(), AutogradError>(())
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap().unwrap();
    }
    assert!(p.iter().all(|v| v.grad().is_some()));
}

#[test]
fn nested_backward_then_raise_leaves_public_gradients_bit_for_bit() {
    // Before: the nested backward committed its gradients, then the replay failed, and the
    // "nothing committed on failure" contract was broken (max diff 77.8 in the Python repro).
    let x = Variable::leaf(rand(&[3, 8], 1), true);
    let p = params(2, 8, true);
    run_chain(&x, std::slice::from_ref(&p), false)
        .backward()
        .unwrap();
    let before = grads(&p);
    let nested: Arc<Mutex<Option<AutogradError>>> = Arc::new(Mutex::new(None));
    let (n2, p2) = (nested.clone(), p.clone());
    let (loss, _) = loss_with_replay_hook(&x, &p, move |_| {
        let other = ops::sum(&ops::scale(&ops::linear(&rand_leaf(), &p2[1])?, 20.0)?)?;
        *n2.lock().unwrap() = other.backward().err();
        Err(riftco_tensor::TensorError::InvalidArgument {
            op: "test",
            message: "replay failed after a nested backward".into(),
        }
        .into())
    });
    let err = loss.backward().unwrap_err().to_string();
    assert!(
        err.contains("replay failed after a nested backward"),
        "{err}"
    );
    assert_eq!(grads(&p), before, "public gradients changed");
    let nested = nested.lock().unwrap().take();
    assert!(
        matches!(
            nested,
            Some(AutogradError::Checkpoint(
                CheckpointError::BackwardInsideReplay { .. }
            ))
        ),
        "{nested:?}"
    );
}

fn rand_leaf() -> Variable {
    Variable::constant(rand(&[2, 8], 7))
}

#[test]
fn backward_outside_any_replay_is_unaffected_after_a_rejection() {
    let x = Variable::leaf(rand(&[3, 8], 1), true);
    let p = params(2, 8, true);
    let (loss, _) = loss_with_replay_hook(&x, &p, |loss| loss.backward());
    assert!(loss.backward().is_err());
    // The replay marker was removed on the error path: an ordinary backward works.
    run_chain(&x, std::slice::from_ref(&p), true)
        .backward()
        .unwrap();
    assert!(grads(&p).iter().all(Option::is_some));
}

#[test]
fn replay_that_changes_a_dependency_is_stale_and_commits_nothing() {
    // An optimizer step inside the callable: the replay would differentiate other weights than
    // the forward used.
    let x = Variable::leaf(rand(&[3, 8], 1), true);
    let p = params(2, 8, true);
    run_chain(&x, std::slice::from_ref(&p), false)
        .backward()
        .unwrap();
    let before = grads(&p);
    p[1].set_name("w1");
    let w1 = p[1].clone();
    let (loss, _) = loss_with_replay_hook(&x, &p, move |_| {
        nudge(&w1, 0.5);
        Ok(())
    });
    let err = loss.backward().unwrap_err();
    assert!(
        matches!(&err, AutogradError::StaleGraph { tensor, .. } if tensor.contains("w1")),
        "{err:?}"
    );
    assert_eq!(grads(&p), before);
}

#[test]
fn replay_that_changes_a_value_read_outside_the_checkpoint_is_stale() {
    // `v` is read by the outer graph only, after the checkpoint: its VJP already ran with the
    // old value when the replay changes it, so only a check after the replays catches it.
    let x = Variable::leaf(rand(&[3, 8], 1), true);
    let p = params(2, 8, true);
    let v = Variable::named_leaf(rand(&[8, 8], 9), true, "v");
    let v2 = v.clone();
    let p2 = p.clone();
    let y = checkpoint(&x, &p, {
        let calls = Arc::new(AtomicUsize::new(0));
        move |h| {
            if calls.fetch_add(1, Ordering::SeqCst) == 1 {
                nudge(&v2, 0.25);
            }
            block(h, &p2)
        }
    })
    .unwrap();
    let loss = ops::sum(&ops::linear(&y, &v).unwrap()).unwrap();
    let err = loss.backward().unwrap_err();
    assert!(
        matches!(&err, AutogradError::StaleGraph { tensor, .. } if tensor.contains("\"v\"")),
        "{err:?}"
    );
    assert!(v.grad().is_none() && grads(&p).iter().all(Option::is_none));
}

#[test]
fn forward_run_that_changes_a_dependency_is_rejected() {
    let x = Variable::leaf(rand(&[3, 8], 1), true);
    let p = params(2, 8, true);
    p[0].set_name("gain");
    let p2 = p.clone();
    let err = checkpoint(&x, &p, move |h| {
        let y = block(h, &p2)?;
        nudge(&p2[0], 1.0);
        Ok(y)
    })
    .unwrap_err();
    assert!(
        matches!(&err, AutogradError::StaleGraph { tensor, .. } if tensor.contains("gain")),
        "{err:?}"
    );
}

#[test]
fn nested_checkpoints_are_not_mistaken_for_reentrant_replays() {
    let x = Variable::leaf(rand(&[3, 8], 1), true);
    let (p, q) = (params(2, 8, true), params(20, 8, true));
    let deps: Vec<Variable> = p.iter().chain(&q).cloned().collect();
    let (p2, q2) = (p.clone(), q.clone());
    let y = checkpoint(&x, &deps, move |h| {
        let (p3, q3) = (p2.clone(), q2.clone());
        let inner = checkpoint(h, &p2, move |g| block(g, &p3))?;
        checkpoint(&inner, &q2, move |g| block(g, &q3))
    })
    .unwrap();
    ops::sum(&ops::mul(&y, &y).unwrap())
        .unwrap()
        .backward()
        .unwrap();
    let g_ck = grads(&deps);
    run_chain(&x, &[p.clone(), q.clone()], false)
        .backward()
        .unwrap();
    assert_eq!(g_ck, grads(&deps));
}
