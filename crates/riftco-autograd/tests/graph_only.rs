//! Graph-only ops and `checkpoint_with_pass`: the replay tail is recorded without its forward
//! kernels, yet gradients equal the plain graph's bit for bit.

mod common;
use common::{params, rand};
use riftco_autograd::{
    checkpoint_with_pass, no_grad, ops, CheckpointPass, GradientContext, Result, Variable,
};
use std::sync::{Arc, Mutex};

/// [`common::block`] with its last projection and residual add graph-only when `tail_graph_only`.
fn block_tail(x: &Variable, p: &[Variable], tail_graph_only: bool) -> Result<Variable> {
    let h = ops::rms_norm(x, &p[0], 1e-5)?;
    let h = ops::silu(&ops::linear(&h, &p[1])?)?;
    if tail_graph_only {
        ops::add_graph_only(
            x,
            &ops::scale_graph_only(&ops::linear_graph_only(&h, &p[2])?, 0.5)?,
        )
    } else {
        ops::add(x, &ops::scale(&ops::linear(&h, &p[2])?, 0.5)?)
    }
}

#[test]
fn graph_only_values_are_unevaluated_and_vjps_equal_the_plain_ops() {
    let x = Variable::leaf(rand(&[6, 8], 1), true);
    let w = Variable::leaf(rand(&[5, 8], 2), true);
    let b = Variable::leaf(rand(&[6, 5], 3), true);
    let plain = ops::add(&ops::scale(&ops::linear(&x, &w).unwrap(), 0.3).unwrap(), &b).unwrap();
    let lazy = ops::add_graph_only(
        &ops::scale_graph_only(&ops::linear_graph_only(&x, &w).unwrap(), 0.3).unwrap(),
        &b,
    )
    .unwrap();
    assert_eq!(lazy.dims(), plain.dims());
    // Unevaluated: the value is a placeholder owning no memory; reading it is an error, not
    // garbage.
    assert!(lazy.value().is_placeholder());
    assert!(matches!(
        lazy.value().to_host(),
        Err(riftco_tensor::TensorError::NoData { .. })
    ));
    assert!(matches!(
        lazy.value().read().map(|_| ()),
        Err(riftco_tensor::TensorError::NoData { .. })
    ));
    let before = riftco_tensor::memory_stats().get(riftco_tensor::MemoryCategory::Activation);
    let again = ops::linear_graph_only(&x, &w).unwrap();
    let after = riftco_tensor::memory_stats().get(riftco_tensor::MemoryCategory::Activation);
    assert_eq!(
        after.current_bytes, before.current_bytes,
        "a placeholder owns no memory"
    );
    // An op reading a placeholder fails with NoData instead of computing on garbage.
    assert!(matches!(
        ops::silu(&again),
        Err(riftco_autograd::AutogradError::Tensor(
            riftco_tensor::TensorError::NoData { .. }
        ))
    ));
    assert!(plain.value().to_vec().iter().any(|&v| v != 0.0));
    let seed = rand(&[6, 5], 4);
    let mut gp = GradientContext::compute(&plain, seed.clone()).unwrap();
    let mut gl = GradientContext::compute(&lazy, seed).unwrap();
    for v in [&x, &w, &b] {
        assert_eq!(
            gp.take(v).unwrap().to_vec(),
            gl.take(v).unwrap().to_vec(),
            "gradient of {}",
            v.describe()
        );
    }
}

#[test]
fn graph_only_ops_compute_their_value_when_no_graph_is_recorded() {
    let x = Variable::leaf(rand(&[4, 8], 1), true);
    let w = Variable::leaf(rand(&[3, 8], 2), true);
    let (plain, lazy) = no_grad(|| {
        (
            ops::scale(&ops::linear(&x, &w).unwrap(), 2.0).unwrap(),
            ops::scale_graph_only(&ops::linear_graph_only(&x, &w).unwrap(), 2.0).unwrap(),
        )
    });
    assert_eq!(plain.value().to_vec(), lazy.value().to_vec());
    let sum = no_grad(|| ops::add_graph_only(&plain, &lazy).unwrap());
    let twice: Vec<f32> = plain.value().to_vec().iter().map(|v| v + v).collect();
    assert_eq!(sum.value().to_vec(), twice);
}

#[test]
fn the_callable_is_told_forward_then_replay_and_a_graph_only_tail_keeps_gradients_exact() {
    let x = Variable::leaf(rand(&[5, 8], 1), true);
    let layers: Vec<_> = (0..3).map(|i| params(10 * i + 2, 8, true)).collect();
    let plain = {
        let mut h = x.clone();
        for p in &layers {
            h = block_tail(&h, p, false).unwrap();
        }
        ops::sum(&ops::mul(&h, &h).unwrap()).unwrap()
    };
    plain.backward().unwrap();
    let all: Vec<Variable> = layers.iter().flatten().chain([&x]).cloned().collect();
    let g_plain: Vec<Vec<f32>> = all.iter().map(|v| v.grad().unwrap().to_vec()).collect();

    let passes = Arc::new(Mutex::new(Vec::new()));
    let mut h = x.clone();
    for p in &layers {
        let (p2, log) = (p.clone(), passes.clone());
        h = checkpoint_with_pass("tail", &h, p, move |x, pass| {
            log.lock().unwrap().push(pass);
            block_tail(x, &p2, pass == CheckpointPass::Replay)
        })
        .unwrap();
    }
    let ck = ops::sum(&ops::mul(&h, &h).unwrap()).unwrap();
    assert_eq!(ck.value().to_vec(), plain.value().to_vec());
    assert_eq!(*passes.lock().unwrap(), vec![CheckpointPass::Forward; 3]);
    ck.backward().unwrap();
    assert_eq!(
        passes.lock().unwrap()[3..],
        [CheckpointPass::Replay; 3],
        "each block replayed once during backward"
    );
    let g_ck: Vec<Vec<f32>> = all.iter().map(|v| v.grad().unwrap().to_vec()).collect();
    assert_eq!(g_ck, g_plain);
}

#[test]
fn a_graph_only_value_returned_by_the_forward_run_is_a_checkpoint_error() {
    // The contract for callers: the Forward pass must evaluate its output, because the
    // checkpoint keeps it. Running the graph-only tail on Forward leaves a placeholder, which
    // the checkpoint refuses (it used to keep garbage).
    let x = Variable::leaf(rand(&[5, 8], 1), true);
    let p = params(2, 8, true);
    let p2 = p.clone();
    let wrong = checkpoint_with_pass("misuse", &x, &p, move |x, _| block_tail(x, &p2, true));
    match wrong {
        Err(riftco_autograd::AutogradError::Checkpoint(
            riftco_autograd::CheckpointError::GraphOnlyForwardOutput { name },
        )) => assert_eq!(name, "misuse"),
        other => panic!("expected GraphOnlyForwardOutput, got {other:?}"),
    }
    let right = block_tail(&x, &p, false).unwrap();
    assert!(right.value().to_vec().iter().any(|&v| v != 0.0));
}

#[test]
fn graph_only_ops_evaluate_when_no_input_requires_grad() {
    let x = Variable::leaf(rand(&[4, 8], 1), false);
    let w = Variable::leaf(rand(&[3, 8], 2), false);
    let plain = ops::linear(&x, &w).unwrap();
    let lazy = ops::linear_graph_only(&x, &w).unwrap();
    assert_eq!(plain.value().to_vec(), lazy.value().to_vec());
    let lazy_sum =
        ops::add_graph_only(&plain, &ops::scale_graph_only(&plain, 2.0).unwrap()).unwrap();
    let want: Vec<f32> = plain.value().to_vec().iter().map(|v| v + 2.0 * v).collect();
    assert_eq!(lazy_sum.value().to_vec(), want);
}

#[test]
fn linear_with_zero_input_features_gives_zeros_of_the_right_shape() {
    let x = Variable::leaf(
        riftco_tensor::Tensor::zeros([3, 0], riftco_tensor::MemoryCategory::Workspace),
        true,
    );
    let w = Variable::leaf(
        riftco_tensor::Tensor::zeros([5, 0], riftco_tensor::MemoryCategory::Parameter),
        true,
    );
    let y = ops::linear(&x, &w).unwrap();
    assert_eq!(y.dims(), [3, 5]);
    assert_eq!(y.value().to_vec(), vec![0.0; 15]);
    // The graph-only variant records the same shape (its value is never evaluated).
    assert_eq!(ops::linear_graph_only(&x, &w).unwrap().dims(), [3, 5]);
}

/// Graph statistics count the elements a graph owns: a graph-only placeholder owns none.
#[test]
fn graph_statistics_do_not_count_placeholders() {
    let x = Variable::leaf(rand(&[6, 8], 1), true);
    let w = Variable::leaf(rand(&[5, 8], 2), true);
    let plain = ops::linear(&x, &w).unwrap();
    let lazy = ops::linear_graph_only(&x, &w).unwrap();
    let (p, l) = (plain.graph_statistics(), lazy.graph_statistics());
    assert_eq!(p.node_count, l.node_count);
    assert_eq!(p.element_count, 6 * 8 + 5 * 8 + 6 * 5);
    assert_eq!(l.element_count, 6 * 8 + 5 * 8);
}
