//! Saved values cost exactly their bytes after the forward and spare the replay as much.

use super::*;

const ROWS: usize = 16;
const WIDTH: usize = 32;
const HIDDEN: usize = 96;

/// `x + W2·SiLU(W1·x)` with the two products named `"up"` and `"down"`.
fn mlp(x: &Variable, p: &[Variable]) -> Result<Variable> {
    let up = named("up", &[x], || ops::linear(x, &p[0]))?;
    let a = ops::silu(&up)?;
    let down = named("down", &[&a], || ops::linear(&a, &p[1]))?;
    ops::add(x, &down)
}

/// Activation bytes retained after the forward, and the activation peak above that during
/// backward.
fn activation_bytes(save: Option<&[&str]>) -> (usize, usize) {
    let x = Variable::leaf(rand(&[ROWS, WIDTH], 1), true);
    let p = vec![
        Variable::leaf(rand(&[HIDDEN, WIDTH], 2), true),
        Variable::leaf(rand(&[WIDTH, HIDDEN], 3), true),
    ];
    let act = || memory_stats().get(C::Activation).current_bytes;
    let base = act();
    let p2 = p.clone();
    let y = match save {
        None => mlp(&x, &p).unwrap(),
        Some(save) => checkpoint_with_options(
            "mlp",
            &x,
            &p,
            &CheckpointOptions::saving(save.iter().copied()),
            move |h, _| mlp(h, &p2),
        )
        .unwrap(),
    };
    let retained = act() - base;
    let loss = weighted_sum(&y);
    let before = act();
    reset_peak_memory_stats();
    loss.backward().unwrap();
    let transient = memory_stats().get(C::Activation).peak_bytes - before;
    (retained, transient)
}

#[test]
fn saved_values_are_retained_for_exactly_their_bytes_and_spare_the_replay_as_much() {
    let _serial = serial();
    let f32_bytes = |n: usize| 4 * n;
    let (up, down, out) = (
        f32_bytes(ROWS * HIDDEN),
        f32_bytes(ROWS * WIDTH),
        f32_bytes(ROWS * WIDTH),
    );
    let (none, none_t) = activation_bytes(None);
    let (plain, plain_t) = activation_bytes(Some(&[]));
    let (s_up, s_up_t) = activation_bytes(Some(&["up"]));
    let (s_down, s_down_t) = activation_bytes(Some(&["down"]));
    let (s_both, s_both_t) = activation_bytes(Some(&["up", "down"]));
    eprintln!(
        "retained: none {none}, plain {plain}, up {s_up}, down {s_down}, both {s_both}; \
         backward peak above retained: none {none_t}, plain {plain_t}, up {s_up_t}, \
         down {s_down_t}, both {s_both_t}"
    );
    // The plain checkpoint keeps its output only; a save set adds the saved values, nothing
    // else (the linear VJP captures no tensor).
    assert_eq!(plain, out, "plain checkpoint");
    assert_eq!(s_up, plain + up, "saving up");
    assert_eq!(s_down, plain + down, "saving down");
    assert_eq!(s_both, plain + up + down, "saving both");
    assert!(
        s_both < none,
        "saving both {s_both} B vs no checkpoint {none} B"
    );
    // The replay does not recompute what was saved.
    assert_eq!(s_up_t + up, plain_t, "replay transient saving up");
    assert_eq!(s_down_t + down, plain_t, "replay transient saving down");
    assert_eq!(
        s_both_t + up + down,
        plain_t,
        "replay transient saving both"
    );
}
