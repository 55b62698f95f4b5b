//! What the graph keeps: values no VJP reads are released once only the graph refers to them
//! (the contract that a second `backward()` on an unchanged graph gives the same gradients
//! still holds), and `retain_graph = false` frees each node's record as soon as its VJP ran.
//! Bytes are this thread's activation allocations ([`ThreadMemoryScope`]), exact.

use riftco_autograd::ops::{linear, relu, scale, sum};
use riftco_autograd::{checkpoint, AutogradError, BackwardOptions, Saves, Variable};
use riftco_tensor::{Device, HalfDtype, MemoryCategory, Tensor, TensorError, ThreadMemoryScope};

const ROWS: usize = 4;
const D: usize = 8;
/// Bytes of one `[ROWS, D]` f32 value.
const VALUE: i64 = (ROWS * D * 4) as i64;

fn leaf(rows: usize, cols: usize, seed: u32, requires_grad: bool) -> Variable {
    let data = (0..rows * cols)
        .map(|i| ((i as u32 * 37 + seed * 11) % 17) as f32 / 8.0 - 1.0)
        .collect();
    let t = Tensor::from_vec(data, [rows, cols], MemoryCategory::Workspace).unwrap();
    Variable::leaf(t, requires_grad)
}

fn host(t: &Tensor) -> Vec<f32> {
    t.to_host().unwrap()
}

fn activations() -> ThreadMemoryScope {
    ThreadMemoryScope::new(Device::Cpu, MemoryCategory::Activation)
}

#[test]
fn a_value_no_vjp_reads_goes_when_its_handle_goes_and_gradients_stay_exact() {
    let (x, w) = (leaf(ROWS, D, 1, true), leaf(D, D, 2, true));
    let scope = activations();
    let h = linear(&x, &w).unwrap();
    let s = scale(&h, 2.0).unwrap();
    assert_eq!(scope.current_bytes(), 2 * VALUE);
    // `scale`'s VJP reads nothing: the product goes with its last handle.
    drop(h);
    assert_eq!(scope.current_bytes(), VALUE);
    let out = sum(&s).unwrap();
    drop(s);
    assert_eq!(scope.current_bytes(), 4, "only the scalar output is left");
    // The released value keeps its shape; reading it is an error, never garbage.
    let released = out.parents()[0].clone();
    assert_eq!(released.dims(), [ROWS, D]);
    let e = released.value().to_host().unwrap_err();
    assert!(matches!(e, TensorError::NoData { .. }), "{e}");
    assert!(e.to_string().contains("released"), "{e}");
    drop(released);
    // out = Σ 2·x·Wᵀ: dx[i, k] = 2 Σ_j W[j, k], dW[j, k] = 2 Σ_i x[i, k] (f64 reference).
    out.backward().unwrap();
    let (gx, gw) = (host(&x.grad().unwrap()), host(&w.grad().unwrap()));
    let (xv, wv) = (host(x.value()), host(w.value()));
    for i in 0..ROWS {
        for k in 0..D {
            let want: f64 = (0..D).map(|j| 2.0 * f64::from(wv[j * D + k])).sum();
            assert!((f64::from(gx[i * D + k]) - want).abs() < 1e-5);
        }
    }
    for j in 0..D {
        for k in 0..D {
            let want: f64 = (0..ROWS).map(|i| 2.0 * f64::from(xv[i * D + k])).sum();
            assert!((f64::from(gw[j * D + k]) - want).abs() < 1e-5);
        }
    }
    // The contract: a second backward on the unchanged graph gives the same gradients.
    out.backward().unwrap();
    assert_eq!(host(&x.grad().unwrap()), gx);
    assert_eq!(host(&w.grad().unwrap()), gw);
}

#[test]
fn values_a_vjp_reads_stay_and_a_held_handle_keeps_its_value() {
    let (x, w) = (leaf(ROWS, D, 3, true), leaf(D, D, 4, true));
    let scope = activations();
    // ReLU's VJP reads its output: the product before it goes, the output stays.
    let r = relu(&linear(&x, &w).unwrap()).unwrap();
    assert_eq!(scope.current_bytes(), VALUE);
    // A value a user holds stays readable, whatever the graph needs.
    let h = linear(&x, &w).unwrap();
    let s = scale(&h, 3.0).unwrap();
    let out = sum(&ops_add(&r, &s)).unwrap();
    drop(s);
    assert_eq!(host(h.value()).len(), ROWS * D);
    drop(h);
    out.backward().unwrap();
    let g1 = host(&w.grad().unwrap());
    out.backward().unwrap();
    assert_eq!(host(&w.grad().unwrap()), g1);
}

fn ops_add(a: &Variable, b: &Variable) -> Variable {
    riftco_autograd::ops::add(a, b).unwrap()
}

#[test]
fn a_vjp_reading_a_value_it_did_not_declare_fails_with_an_error() {
    let x = leaf(ROWS, D, 5, true);
    let p = scale(&x, 1.0).unwrap();
    // Declares that its VJP reads nothing, then reads its parent.
    let bad = Variable::from_op_saving(
        "bad",
        p.value().clone(),
        vec![p.clone()],
        Saves::NOTHING,
        |parents, _, g| {
            parents[0].value().to_host()?;
            Ok(vec![Some(g.clone())])
        },
    );
    // `bad`'s value shares the parent's storage, so nothing is released yet; a fresh parent
    // whose only handle goes is.
    drop(bad);
    let q = scale(&x, 1.0).unwrap();
    let bad = Variable::from_op_saving(
        "bad",
        Tensor::zeros([ROWS, D], MemoryCategory::Activation),
        vec![q.clone()],
        Saves::NOTHING,
        |parents, _, g| {
            parents[0].value().to_host()?;
            Ok(vec![Some(g.clone())])
        },
    );
    drop(q);
    let out = sum(&bad).unwrap();
    let e = out.backward().unwrap_err();
    assert!(
        matches!(e, AutogradError::Tensor(TensorError::NoData { .. })),
        "{e}"
    );
    assert!(x.grad().is_none(), "nothing was committed");
    drop(p);
}

/// `blocks` blocks of `relu(linear(h, w))`, the first `checkpointed` of them in one checkpoint.
fn chain(x: &Variable, ws: &[Variable], checkpointed: usize) -> Variable {
    let head = ws[..checkpointed].to_vec();
    let mut h = if checkpointed > 0 {
        let deps = head.clone();
        checkpoint(x, &deps, move |h| {
            let mut h = h.clone();
            for w in &head {
                h = relu(&linear(&h, w)?)?;
            }
            Ok(h)
        })
        .unwrap()
    } else {
        x.clone()
    };
    for w in &ws[checkpointed..] {
        h = relu(&linear(&h, w).unwrap()).unwrap();
    }
    sum(&h).unwrap()
}

/// Gradients of every weight and the activation peak of the backward above what the forward
/// left.
fn run(retain_graph: bool) -> (Vec<Vec<f32>>, i64, Variable) {
    let x = leaf(ROWS, D, 6, true);
    let ws: Vec<Variable> = (0..8).map(|i| leaf(D, D, 10 + i, true)).collect();
    let scope = activations();
    let out = chain(&x, &ws, 4);
    let retained = scope.current_bytes();
    scope.reset_peak();
    out.backward_with(BackwardOptions {
        retain_graph,
        ..BackwardOptions::default()
    })
    .unwrap();
    let peak = scope.peak_bytes() - retained;
    let grads = ws.iter().map(|w| host(&w.grad().unwrap())).collect();
    (grads, peak + retained, out)
}

#[test]
fn retain_graph_false_gives_the_same_gradients_frees_the_graph_and_peaks_lower() {
    let (kept, kept_peak, kept_out) = run(true);
    let (freed, freed_peak, freed_out) = run(false);
    assert_eq!(kept, freed, "bitwise the same gradients");
    assert!(!kept_out.is_graph_freed());
    assert!(freed_out.is_graph_freed());
    // The graph kept: 4 plain blocks keep their ReLU outputs, the checkpoint its output, and
    // the replay of 4 blocks comes on top. Freed: the tail's values are gone by the replay.
    eprintln!("backward peak: retained graph {kept_peak} B, freed {freed_peak} B");
    // After the forward: the checkpoint's output, the tail's four ReLU outputs (their VJPs read
    // them; the products before them are released) and the scalar.
    let retained = 5 * VALUE + 4;
    // The replay adds its four ReLU outputs and one product in flight.
    assert_eq!(kept_peak, retained + 5 * VALUE);
    // Freed: only the checkpoint's output and the scalar are left when the replay runs.
    assert_eq!(freed_peak, VALUE + 4 + 5 * VALUE);
    // Differentiating a freed graph again is an error naming retain_graph; nothing changes.
    let e = freed_out.backward().unwrap_err();
    assert!(matches!(e, AutogradError::GraphFreed { .. }), "{e}");
    assert!(e.to_string().contains("retain_graph"), "{e}");
    // The retained graph differentiates again, the same.
    kept_out.backward().unwrap();
}

#[test]
fn a_value_changed_during_a_freeing_pass_is_still_a_stale_graph() {
    let x = leaf(ROWS, D, 7, true);
    let w = leaf(D, D, 8, true);
    let tail = leaf(D, D, 9, true);
    let w2 = w.clone();
    let t = tail.clone();
    let y = checkpoint(&x, std::slice::from_ref(&w), move |h| {
        let out = linear(h, &w2)?;
        // Changes a weight whose VJP already ran (the tail's) when this runs as the replay.
        t.value().write()?;
        Ok(out)
    })
    .unwrap();
    let out = sum(&linear(&y, &tail).unwrap()).unwrap();
    let e = out.backward_with(BackwardOptions::freeing()).unwrap_err();
    assert!(matches!(e, AutogradError::StaleGraph { .. }), "{e}");
    assert!(
        tail.grad().is_none() && w.grad().is_none(),
        "nothing committed"
    );
}

#[test]
fn broadcasting_sums_and_reductions_keep_nothing_products_keep_their_operands() {
    use riftco_autograd::ops::{broadcast_add, broadcast_mul, sum_axes};
    let (x, w) = (leaf(ROWS, D, 11, true), leaf(ROWS, D, 12, true));
    let scope = activations();
    // A sum's VJP reads no value: its output goes with its handle.
    let h = broadcast_add(&x, &w).unwrap();
    let s = scale(&h, 2.0).unwrap();
    drop(h);
    assert_eq!(scope.current_bytes(), VALUE);
    // A reduction reads only its input's shape.
    let r = sum_axes(&s, Some(&[0]), false).unwrap();
    drop(s);
    assert_eq!(scope.current_bytes(), (D * 4) as i64);
    // A product's VJP reads both operands: they stay.
    let p = scale(&x, 1.0).unwrap();
    let q = broadcast_mul(&p, &w).unwrap();
    drop(p);
    assert_eq!(scope.current_bytes(), (D * 4) as i64 + 2 * VALUE);
    let out = sum(&ops_add(&sum_axes(&q, Some(&[0]), false).unwrap(), &r)).unwrap();
    drop(q);
    out.backward().unwrap();
    let g = host(&w.grad().unwrap());
    out.backward().unwrap();
    assert_eq!(host(&w.grad().unwrap()), g);
}

/// `probe(x)`: an op whose VJP reads nothing (not even its output) and passes the gradient
/// through; it records whether its own value was still there when its VJP ran.
fn probe(x: &Variable, seen: &std::sync::Arc<std::sync::Mutex<Vec<bool>>>) -> Variable {
    let seen = seen.clone();
    let value = Tensor::from_vec(
        host(x.value()),
        x.value().shape().clone(),
        MemoryCategory::Activation,
    )
    .unwrap();
    Variable::from_op_saving(
        "probe",
        value,
        vec![x.clone()],
        Saves::NOTHING,
        move |_, out, g| {
            seen.lock().unwrap().push(out.to_host().is_ok());
            Ok(vec![Some(g.clone())])
        },
    )
}

#[test]
fn a_freeing_pass_releases_a_value_before_its_own_vjp_once_no_vjp_reads_it() {
    let (x, w) = (leaf(ROWS, D, 6, true), leaf(D, D, 7, true));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let grads = |retain_graph: bool, hold: bool| {
        // `linear` reads the probe's value; once its VJP ran, nothing will read it again.
        let p = probe(&x, &seen);
        let out = sum(&linear(&p, &w).unwrap()).unwrap();
        let held = hold.then(|| p.clone());
        drop(p);
        let scope = activations();
        out.backward_with(BackwardOptions {
            retain_graph,
            ..BackwardOptions::default()
        })
        .unwrap();
        let freed = -scope.current_bytes();
        if let Some(p) = held {
            // A handle the caller keeps keeps the value, freeing pass or not.
            assert_eq!(host(p.value()), host(x.value()));
        }
        (host(&x.grad().unwrap()), host(&w.grad().unwrap()), freed)
    };
    let kept = grads(true, false);
    let freed = grads(false, false);
    let held = grads(false, true);
    assert_eq!(
        *seen.lock().unwrap(),
        [true, false, true],
        "the value was there for the kept graph, gone before the VJP in the freeing pass, \
         there when the caller held it"
    );
    assert_eq!((&kept.0, &kept.1), (&freed.0, &freed.1));
    assert_eq!((&kept.0, &kept.1), (&held.0, &held.1));
    // The freeing pass released the probe's value (the linear's output, which no VJP reads,
    // went with its handle at the forward already).
    assert_eq!(kept.2, 0);
    assert_eq!(freed.2, VALUE);
    assert_eq!(held.2, 0);
}

#[test]
fn swiglu_writes_d_gate_over_a_gradient_only_the_pass_holds() {
    use riftco_autograd::ops::swiglu;
    let (gate, up) = (leaf(ROWS, D, 8, true), leaf(ROWS, D, 9, true));
    let seed_values: Vec<f32> = (0..ROWS * D).map(|i| (i % 7) as f32 / 4.0 - 0.5).collect();
    let seed = || Tensor::from_vec(seed_values.clone(), [ROWS, D], MemoryCategory::Gradient);
    let run = |seed: Tensor| {
        let y = swiglu(&gate, &up).unwrap();
        let scope = ThreadMemoryScope::new(Device::Cpu, MemoryCategory::Gradient);
        y.backward_with_grad(seed).unwrap();
        let peak = scope.peak_bytes();
        (host(&gate.grad().unwrap()), host(&up.grad().unwrap()), peak)
    };
    // The seed moved into the pass: d gate is written over it, only d up is new.
    let (dg, du, peak_exclusive) = run(seed().unwrap());
    // A seed the caller keeps: never written, d gate gets a buffer of its own.
    let shared = seed().unwrap();
    let (dg2, du2, peak_shared) = run(shared.clone());
    assert_eq!(
        host(&shared),
        seed_values,
        "the caller's tensor is unchanged"
    );
    assert_eq!(dg, dg2);
    assert_eq!(du, du2);
    assert_eq!(peak_exclusive, VALUE);
    assert_eq!(peak_shared, 2 * VALUE);
    // A 16-bit seed (read-only storage) moved into the pass: read upcast, never written.
    for dtype in [HalfDtype::BFloat16, HalfDtype::Float16] {
        let half = seed().unwrap().to_half(dtype).unwrap();
        let want = host(&half);
        let (dg3, du3, _) = run(half);
        let (dg4, du4, _) =
            run(Tensor::from_vec(want, [ROWS, D], MemoryCategory::Gradient).unwrap());
        assert_eq!((dg3, du3), (dg4, du4), "{dtype:?}");
    }
    // f64 reference: d gate = s · u · σ(g)(1 + g(1 − σ(g))), d up = s · g σ(g).
    let (g, u) = (host(gate.value()), host(up.value()));
    for i in 0..ROWS * D {
        let (gi, ui, si) = (f64::from(g[i]), f64::from(u[i]), f64::from(seed_values[i]));
        let sig = 1.0 / (1.0 + (-gi).exp());
        let want_g = si * ui * sig * (1.0 + gi * (1.0 - sig));
        let want_u = si * gi * sig;
        assert!((f64::from(dg[i]) - want_g).abs() <= 1e-6 * (1.0 + want_g.abs()));
        assert!((f64::from(du[i]) - want_u).abs() <= 1e-6 * (1.0 + want_u.abs()));
    }
}
