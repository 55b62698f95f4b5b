//! checkpoint(): parity with the plain graph, shared parameters, recompute count, atomicity,
//! the five rejections, graph statistics and retained activation bytes.

mod common;
use common::{block, params, rand, run_chain};
use riftco_autograd::{checkpoint, ops, AutogradError, CheckpointError, Result, Variable};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

fn grads(vars: &[Variable]) -> Vec<Vec<f32>> {
    vars.iter().map(|v| v.grad().unwrap().to_vec()).collect()
}

#[test]
fn checkpointed_chain_matches_plain_bitwise() {
    let x = Variable::leaf(rand(&[5, 8], 1), true);
    let layers: Vec<_> = (0..4).map(|i| params(10 * i + 2, 8, true)).collect();
    let plain = run_chain(&x, &layers, false);
    plain.backward().unwrap();
    let all: Vec<Variable> = layers
        .iter()
        .flatten()
        .cloned()
        .chain([x.clone()])
        .collect();
    let g_plain = grads(&all);
    let ck = run_chain(&x, &layers, true);
    assert_eq!(plain.value().to_vec(), ck.value().to_vec());
    ck.backward().unwrap();
    // Same ops in the same order: bitwise equal.
    assert_eq!(grads(&all), g_plain);
}

#[test]
fn shared_parameters_count_every_contribution_once() {
    let x = Variable::leaf(rand(&[5, 8], 1), true);
    let shared = params(2, 8, true);
    let layers = vec![shared.clone(), shared.clone(), shared.clone()];
    let plain = run_chain(&x, &layers, false);
    plain.backward().unwrap();
    let g_plain = grads(&shared);
    let ck = run_chain(&x, &layers, true);
    ck.backward().unwrap();
    let g_ck = grads(&shared);
    for (a, b) in g_plain.iter().flatten().zip(g_ck.iter().flatten()) {
        assert!((a - b).abs() <= 1e-6 * a.abs().max(1.0), "{a} vs {b}");
    }
    // And they really are sums of three contributions: differ from a single block's gradient.
    let single = run_chain(&x, &layers[..1], false);
    single.backward().unwrap();
    assert_ne!(grads(&shared), g_ck);
}

#[test]
fn callable_runs_exactly_twice_per_forward_and_backward() {
    let x = Variable::leaf(rand(&[3, 4], 1), true);
    let p = params(2, 4, true);
    let count = Arc::new(AtomicUsize::new(0));
    let (c2, p2) = (count.clone(), p.clone());
    let y = checkpoint(&x, &p, move |x| {
        c2.fetch_add(1, Ordering::SeqCst);
        block(x, &p2)
    })
    .unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 1);
    ops::sum(&y).unwrap().backward().unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 2);
}

#[test]
fn failure_on_kth_replay_leaves_gradients_bit_for_bit_and_later_backward_works() {
    let x = Variable::leaf(rand(&[3, 8], 1), true);
    let layers: Vec<_> = (0..3).map(|i| params(10 * i + 2, 8, true)).collect();
    let all: Vec<Variable> = layers
        .iter()
        .flatten()
        .cloned()
        .chain([x.clone()])
        .collect();
    run_chain(&x, &layers, false).backward().unwrap();
    let before = grads(&all);
    let calls = Arc::new(AtomicUsize::new(0));
    let fail_at = Arc::new(AtomicUsize::new(5)); // forward: calls 1..=3, replays: 4, 5, 6
    let mut h = x.clone();
    for p in &layers {
        let (p2, c2, f2) = (p.clone(), calls.clone(), fail_at.clone());
        h = checkpoint(&h, p, move |x| {
            let n = c2.fetch_add(1, Ordering::SeqCst) + 1;
            if n == f2.load(Ordering::SeqCst) {
                return Err(riftco_tensor::TensorError::InvalidArgument {
                    op: "test",
                    message: format!("replay {n} failed"),
                }
                .into());
            }
            block(x, &p2)
        })
        .unwrap();
    }
    let loss = ops::sum(&ops::mul(&h, &h).unwrap()).unwrap();
    let err = loss.backward().unwrap_err().to_string();
    assert!(err.contains("replay 5 failed"), "{err}");
    assert_eq!(
        grads(&all),
        before,
        "a failed pass changed public gradients"
    );
    fail_at.store(0, Ordering::SeqCst);
    loss.backward().unwrap();
    assert_eq!(
        grads(&all),
        before,
        "clean backward must equal the plain gradients"
    );
}

#[test]
fn panicking_replay_is_an_error() {
    let x = Variable::leaf(rand(&[3, 4], 1), true);
    let p = params(2, 4, true);
    let (p2, n) = (p.clone(), Arc::new(AtomicUsize::new(0)));
    let y = checkpoint(&x, &p, move |x| {
        if n.fetch_add(1, Ordering::SeqCst) == 1 {
            panic!("replay panicked");
        }
        block(x, &p2)
    })
    .unwrap();
    let err = ops::sum(&y).unwrap().backward().unwrap_err();
    assert!(matches!(err, AutogradError::Panic { .. }), "{err}");
    assert!(p[0].grad().is_none());
}

fn checkpoint_err(r: Result<Variable>) -> CheckpointError {
    match r {
        Err(AutogradError::Checkpoint(e)) => e,
        Err(e) => panic!("expected a checkpoint error, got {e}"),
        Ok(_) => panic!("expected a checkpoint error, got Ok"),
    }
}

#[test]
fn rejects_missing_dependency() {
    let x = Variable::leaf(rand(&[3, 4], 1), true);
    let p = params(2, 4, true);
    let p2 = p.clone();
    let e = checkpoint_err(checkpoint(&x, &p[..2], move |x| block(x, &p2)));
    assert!(
        matches!(e, CheckpointError::MissingDependency { .. }),
        "{e}"
    );
    let p3 = p.clone();
    let e = checkpoint_err(checkpoint(&x, &[], move |x| block(x, &p3)));
    assert!(
        matches!(e, CheckpointError::MissingDependency { .. }),
        "{e}"
    );
}

#[test]
fn rejects_duplicate_and_non_leaf_dependencies() {
    let x = Variable::leaf(rand(&[3, 4], 1), true);
    let p = params(2, 4, true);
    let deps = vec![p[0].clone(), p[1].clone(), p[2].clone(), p[1].clone()];
    let p2 = p.clone();
    let e = checkpoint_err(checkpoint(&x, &deps, move |x| block(x, &p2)));
    assert!(
        matches!(e, CheckpointError::DuplicateDependency { .. }),
        "{e}"
    );
    let derived = ops::scale(&p[0], 2.0).unwrap();
    let e = checkpoint_err(checkpoint(&x, &[derived], |x| Ok(x.clone())));
    assert!(
        matches!(e, CheckpointError::DependencyNotLeaf { .. }),
        "{e}"
    );
}

#[test]
fn rejects_captured_external_graph_node() {
    let x = Variable::leaf(rand(&[3, 4], 1), true);
    let w = Variable::leaf(rand(&[4], 2), true);
    let outside = ops::scale(&x, 2.0).unwrap(); // a graph node computed before the checkpoint
    let e = checkpoint_err(checkpoint(&x, &[], move |x| ops::add(x, &outside)));
    assert!(
        matches!(e, CheckpointError::CapturedExternalNode { .. }),
        "{e}"
    );
    let _ = w;
}

#[test]
fn rejects_new_undeclared_differentiable_leaf() {
    let x = Variable::leaf(rand(&[3, 4], 1), true);
    let e = checkpoint_err(checkpoint(&x, &[], |x| {
        let fresh = Variable::leaf(rand(&[3, 4], 9), true);
        ops::mul(x, &fresh)
    }));
    assert!(matches!(e, CheckpointError::UndeclaredLeaf { .. }), "{e}");
    // A new constant (no grad) inside is fine.
    checkpoint(&x, &[], |x| {
        ops::mul(x, &Variable::constant(rand(&[3, 4], 9)))
    })
    .unwrap();
}

#[test]
fn rejects_callable_not_depending_on_input_or_a_dependency() {
    let x = Variable::leaf(rand(&[3, 4], 1), true);
    let w = Variable::leaf(rand(&[4, 4], 2), true);
    let u = Variable::leaf(rand(&[4, 4], 3), true);
    let w2 = w.clone();
    let e = checkpoint_err(checkpoint(&x, std::slice::from_ref(&w), move |_x| {
        ops::scale(&w2, 2.0)
    }));
    assert!(matches!(e, CheckpointError::InputUnused { .. }), "{e}");
    let w3 = w.clone();
    let e = checkpoint_err(checkpoint(&x, &[w, u], move |x| ops::linear(x, &w3)));
    assert!(matches!(e, CheckpointError::DependencyUnused { .. }), "{e}");
}

#[test]
fn rejects_output_shape_change_between_forward_and_replay() {
    let x = Variable::leaf(rand(&[3, 4], 1), true);
    let n = Arc::new(AtomicUsize::new(0));
    let y = checkpoint(&x, &[], move |x| {
        if n.fetch_add(1, Ordering::SeqCst) == 0 {
            ops::scale(x, 2.0)
        } else {
            ops::reshape(x, [4, 3])
        }
    })
    .unwrap();
    let err = ops::sum(&y).unwrap().backward().unwrap_err();
    assert!(
        matches!(
            err,
            AutogradError::Checkpoint(CheckpointError::ReplayShapeChanged { .. })
        ),
        "{err}"
    );
    assert!(x.grad().is_none());
}

#[test]
fn stale_dependency_rejected_before_replay() {
    let x = Variable::leaf(rand(&[3, 4], 1), true);
    let p = params(2, 4, true);
    let calls = Arc::new(AtomicUsize::new(0));
    let (p2, c2) = (p.clone(), calls.clone());
    let y = checkpoint(&x, &p, move |x| {
        c2.fetch_add(1, Ordering::SeqCst);
        block(x, &p2)
    })
    .unwrap();
    p[1].value().write().unwrap()[0] += 0.5;
    let err = ops::sum(&y).unwrap().backward().unwrap_err();
    assert!(matches!(err, AutogradError::StaleGraph { .. }), "{err}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "replay ran on a stale graph"
    );
}

#[test]
fn frozen_dependencies_lora_style_gradients_reach_adapters() {
    // Frozen base weight W and trainable adapters A, B: y = x·Wᵀ + (x·Aᵀ)·Bᵀ, checkpointed.
    let x = Variable::leaf(rand(&[3, 4], 1), false);
    let w = Variable::leaf(rand(&[4, 4], 2), false);
    let a = Variable::leaf(rand(&[2, 4], 3), true);
    let b = Variable::leaf(rand(&[4, 2], 4), true);
    let f = {
        let (w, a, b) = (w.clone(), a.clone(), b.clone());
        move |x: &Variable| -> Result<Variable> {
            let base = ops::linear(x, &w)?;
            let lora = ops::linear(&ops::linear(x, &a)?, &b)?;
            ops::silu(&ops::add(&base, &lora)?)
        }
    };
    let plain = ops::sum(&f(&x).unwrap()).unwrap();
    plain.backward().unwrap();
    let (ga, gb) = (a.grad().unwrap().to_vec(), b.grad().unwrap().to_vec());
    let deps = [w.clone(), a.clone(), b.clone()];
    let y = checkpoint(&x, &deps, f).unwrap();
    ops::sum(&y).unwrap().backward().unwrap();
    assert_eq!(a.grad().unwrap().to_vec(), ga);
    assert_eq!(b.grad().unwrap().to_vec(), gb);
    assert!(w.grad().is_none(), "frozen base weight got a gradient");
    assert!(x.grad().is_none());
}

#[test]
fn nested_checkpoints_match_plain() {
    let x = Variable::leaf(rand(&[3, 8], 1), true);
    let p1 = params(2, 8, true);
    let p2 = params(7, 8, true);
    let plain = {
        let h = block(&block(&x, &p1).unwrap(), &p2).unwrap();
        ops::sum(&ops::mul(&h, &h).unwrap()).unwrap()
    };
    plain.backward().unwrap();
    let all: Vec<Variable> = p1.iter().chain(&p2).cloned().chain([x.clone()]).collect();
    let g_plain = grads(&all);
    let deps: Vec<Variable> = p1.iter().chain(&p2).cloned().collect();
    let (q1, q2) = (p1.clone(), p2.clone());
    let y = checkpoint(&x, &deps, move |x| {
        let (q1b, q2b) = (q1.clone(), q2.clone());
        let inner = checkpoint(x, &q1, move |x| block(x, &q1b))?;
        block(&inner, &q2b)
    })
    .unwrap();
    ops::sum(&ops::mul(&y, &y).unwrap())
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(grads(&all), g_plain);
}
