//! Nested checkpoints, grad mode, threads.

use super::*;

#[test]
fn nested_plain_and_selective_checkpoints_keep_their_own_names() {
    let _serial = serial();
    let x = Variable::leaf(rand(&[4, 8], 1), true);
    let w = vec![
        Variable::leaf(rand(&[8, 8], 2), true),
        Variable::leaf(rand(&[8, 8], 3), true),
    ];
    let leaves = [x.clone(), w[0].clone(), w[1].clone()];
    // Both levels name their matrix product "mm"; the calls are counted as "outer" and "inner".
    let inner = |h: &Variable, w1: &Variable, calls: &Calls| -> Result<Variable> {
        let c = calls.clone();
        let y = named("mm", &[h], move || {
            c.hit("inner");
            ops::linear(h, w1)
        })?;
        ops::silu(&y)
    };
    let outer = move |x: &Variable, w: &[Variable], inner_save: &[&str], calls: &Calls| {
        let c = calls.clone();
        let h = named("mm", &[x], move || {
            c.hit("outer");
            ops::linear(x, &w[0])
        })?;
        let (w1, c) = (w[1].clone(), calls.clone());
        let options = CheckpointOptions::saving(inner_save.iter().copied());
        let y = checkpoint_with_options("inner", &h, &w[1..], &options, move |h, _| {
            inner(h, &w1, &c)
        })?;
        ops::add(&h, &y)
    };
    let reference = {
        let h = ops::linear(&x, &w[0]).unwrap();
        let y = inner(&h, &w[1], &Calls::default()).unwrap();
        weighted_sum(&ops::add(&h, &y).unwrap()).backward().unwrap();
        grad_bits(&leaves)
    };
    // (outer save, inner save, outer calls, inner calls) after forward and backward: a plain
    // inner checkpoint runs its function three times (outer forward, outer replay, its own
    // replay), whatever the outer one saves; a selective one twice.
    let cases: [(
        &'static [&'static str],
        &'static [&'static str],
        usize,
        usize,
    ); 4] = [
        (&["mm"], &[], 1, 3),
        (&[], &["mm"], 2, 2),
        (&["mm"], &["mm"], 1, 2),
        (&[], &[], 2, 3),
    ];
    for (outer_save, inner_save, outer_calls, inner_calls) in cases {
        let calls = Calls::default();
        let (w2, c2) = (w.clone(), calls.clone());
        let y = checkpoint_with_options(
            "outer",
            &x,
            &w,
            &CheckpointOptions::saving(outer_save.iter().copied()),
            move |x, _| outer(x, &w2, inner_save, &c2),
        )
        .unwrap();
        weighted_sum(&y).backward().unwrap();
        let case = format!("outer save {outer_save:?}, inner save {inner_save:?}");
        assert_eq!(grad_bits(&leaves), reference, "{case}");
        assert_eq!(calls.get("outer"), outer_calls, "{case}: outer calls");
        assert_eq!(calls.get("inner"), inner_calls, "{case}: inner calls");
    }
}

#[test]
fn under_no_grad_a_selective_checkpoint_just_computes() {
    let _serial = serial();
    let x = Variable::leaf(rand(&[B, S, D], 1), true);
    let p = block_params(10);
    let expected = bits(
        run_block(
            &Mode::NoCheckpoint,
            &x,
            &p,
            AttentionKind::Flash,
            &Calls::default(),
        )
        .unwrap()
        .value(),
    );
    for save in [
        vec!["q".to_string(), "mm".into()],
        vec!["no such name".into()],
    ] {
        let calls = Calls::default();
        let y = no_grad(|| {
            run_block(
                &Mode::Save(save.clone()),
                &x,
                &p,
                AttentionKind::Flash,
                &calls,
            )
        })
        .unwrap();
        assert_eq!(bits(y.value()), expected, "save {save:?}");
        assert!(y.is_leaf() && !y.requires_grad(), "save {save:?}: {y:?}");
        for name in NAMES {
            assert_eq!(
                calls.get(name),
                calls_per_run(name),
                "save {save:?}: {name}"
            );
        }
    }
}

#[test]
fn named_outside_any_checkpoint_returns_what_its_function_returns() {
    let _serial = serial();
    let x = Variable::leaf(rand(&[4, 8], 1), true);
    let w = Variable::leaf(rand(&[8, 8], 2), true);
    let h = ops::silu(&x).unwrap();
    let made = Arc::new(AtomicUsize::new(0));
    let made2 = made.clone();
    // Reads `h` without passing it: no contract outside a selective checkpoint.
    let y = named("mm", &[], || {
        let y = ops::linear(&h, &w)?;
        made2.store(y.id() as usize, Ordering::SeqCst);
        Ok(y)
    })
    .unwrap();
    assert_eq!(
        y.id() as usize,
        made.load(Ordering::SeqCst),
        "not the function's value"
    );
    weighted_sum(&y).backward().unwrap();
    let got = grad_bits(&[x.clone(), w.clone()]);
    weighted_sum(&ops::linear(&ops::silu(&x).unwrap(), &w).unwrap())
        .backward()
        .unwrap();
    assert_eq!(got, grad_bits(&[x, w]));
}

#[test]
fn a_saved_name_also_used_under_no_grad_inside_the_callable_is_saved_only_where_recorded() {
    let _serial = serial();
    let x = Variable::leaf(rand(&[4, 8], 1), true);
    let w = Variable::leaf(rand(&[8, 8], 2), true);
    let leaves = [x.clone(), w.clone()];
    // A value of the callable computed without a graph (a constant), then the same name with
    // one: only the second is recorded at the forward run, so only it may be rebuilt.
    let f = |h: &Variable, w: &Variable, calls: &Calls| -> Result<Variable> {
        let c = no_grad(|| counted(calls, "mm", &[h], || ops::linear(h, w)))?;
        let y = counted(calls, "mm", &[h], || ops::linear(h, w))?;
        ops::add(&ops::silu(&y)?, &c)
    };
    weighted_sum(&f(&x, &w, &Calls::default()).unwrap())
        .backward()
        .unwrap();
    let expected = grad_bits(&leaves);
    let calls = Calls::default();
    let (w2, c2) = (w.clone(), calls.clone());
    let y = checkpoint_with_options(
        "ng",
        &x,
        std::slice::from_ref(&w),
        &CheckpointOptions::saving(["mm"]),
        move |h, _| f(h, &w2, &c2),
    )
    .unwrap();
    weighted_sum(&y).backward().unwrap();
    assert_eq!(grad_bits(&leaves), expected);
    // Forward: both; replay: the no-grad one only.
    assert_eq!(calls.get("mm"), 3);
}

/// Waits until `count` reaches `n` (every thread arrived), failing after a minute.
fn rendezvous(count: &AtomicUsize, n: usize) {
    count.fetch_add(1, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(60);
    while count.load(Ordering::SeqCst) < n {
        assert!(Instant::now() < deadline, "the other thread never arrived");
        std::thread::yield_now();
    }
}

/// Releases the other thread's rendezvous when this thread panics, so that it fails at once.
struct ReleaseOnPanic(Vec<Arc<AtomicUsize>>);

impl Drop for ReleaseOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for count in &self.0 {
                count.fetch_add(2, Ordering::SeqCst);
            }
        }
    }
}

#[test]
fn concurrent_selective_checkpoints_on_two_threads_keep_their_own_frames() {
    let _serial = serial();
    let kinds = [AttentionKind::Flash, AttentionKind::Materialized];
    let references: Vec<Outcome> = kinds
        .iter()
        .map(|&k| outcome(&Mode::NoCheckpoint, k))
        .collect();
    // Both threads are inside their checkpoint callables (forward run, then replay) before
    // either calls `named`.
    let forward = Arc::new(AtomicUsize::new(0));
    let replay = Arc::new(AtomicUsize::new(0));
    let saves = [vec!["q", "attention", "mm"], vec!["k", "lora", "norm"]];
    let handles: Vec<_> = kinds
        .into_iter()
        .zip(saves)
        .map(|(kind, save)| {
            let (forward, replay) = (forward.clone(), replay.clone());
            std::thread::spawn(move || {
                let _release = ReleaseOnPanic(vec![forward.clone(), replay.clone()]);
                let x = Variable::leaf(rand(&[B, S, D], 1), true);
                let p = block_params(10);
                let (p2, calls) = (p.clone(), Calls::default());
                let c2 = calls.clone();
                let f = move |h: &Variable, pass: CheckpointPass| {
                    match pass {
                        CheckpointPass::Forward => rendezvous(&forward, 2),
                        CheckpointPass::Replay => rendezvous(&replay, 2),
                    }
                    block(h, &p2, kind, &c2)
                };
                let options = CheckpointOptions::saving(save.iter().copied());
                let y = checkpoint_with_options("block", &x, &p, &options, f).unwrap();
                let loss = weighted_sum(&y);
                loss.backward().unwrap();
                let leaves: Vec<Variable> = std::iter::once(x).chain(p).collect();
                let saved_calls: Vec<usize> = save.iter().map(|n| calls.get(n)).collect();
                (bits(loss.value()), grad_bits(&leaves), save, saved_calls)
            })
        })
        .collect();
    for (handle, reference) in handles.into_iter().zip(&references) {
        let (loss, grads, save, saved_calls) = handle.join().unwrap();
        assert_eq!(loss, reference.loss, "save {save:?}: loss");
        assert_eq!(grads, reference.grads, "save {save:?}: gradients");
        let once: Vec<usize> = save.iter().map(|n| calls_per_run(n)).collect();
        assert_eq!(
            saved_calls, once,
            "save {save:?}: saved functions ran again"
        );
    }
}
