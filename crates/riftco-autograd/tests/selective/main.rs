//! Selective checkpointing: [`named`] values and [`CheckpointOptions::save`]. Gradients equal
//! the plain checkpoint's bit for bit, saved functions are not called again at replay, saved
//! values cost exactly their bytes, and every contract violation is a specific
//! [`CheckpointError`] with nothing committed.
//!
//! Every test holds [`serial`]: the memory counters are process-wide, and `cargo test` runs the
//! tests of one binary on threads of one process (nextest gives each its own process).

#[path = "../common/mod.rs"]
mod common;
mod errors;
mod memory;
mod nesting;
mod parity;
mod retries;

use common::rand;
use riftco_autograd::ops::{self, AttentionKind, AttentionLayout};
use riftco_autograd::{
    checkpoint_with_options, checkpoint_with_pass, named, no_grad, AutogradError, CheckpointError,
    CheckpointOptions, CheckpointPass, Result, Variable,
};
use riftco_tensor::{memory_stats, reset_peak_memory_stats, MemoryCategory as C, Tensor};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// How many times each named function ran, by name.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<HashMap<String, usize>>>);

impl Calls {
    fn hit(&self, name: &str) {
        *self.0.lock().unwrap().entry(name.to_string()).or_default() += 1;
    }

    fn get(&self, name: &str) -> usize {
        self.0.lock().unwrap().get(name).copied().unwrap_or(0)
    }
}

/// [`named`] counting the calls of `f` under `name`.
fn counted(
    calls: &Calls,
    name: &str,
    inputs: &[&Variable],
    f: impl FnOnce() -> Result<Variable>,
) -> Result<Variable> {
    let (calls, tag) = (calls.clone(), name.to_string());
    named(name, inputs, move || {
        calls.hit(&tag);
        f()
    })
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec().iter().map(|v| v.to_bits()).collect()
}

fn grad_bits(vars: &[Variable]) -> Vec<Option<Vec<u32>>> {
    vars.iter().map(|v| v.grad().as_ref().map(bits)).collect()
}

fn checkpoint_error(e: AutogradError) -> CheckpointError {
    match e {
        AutogradError::Checkpoint(c) => c,
        other => panic!("expected a CheckpointError, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The block: pre-norm attention with a LoRA output projection, then an MLP.

const B: usize = 1;
const S: usize = 4;
const D: usize = 8;
const HEADS: usize = 2;
const R: usize = 2;
/// Every name of [`block`]; `"mm"` is used twice per run.
const NAMES: [&str; 6] = ["q", "k", "attention", "lora", "norm", "mm"];

fn calls_per_run(name: &str) -> usize {
    if name == "mm" {
        2
    } else {
        1
    }
}

/// `g1 [D], wq, wk, wv [D, D], wo [D, D] (frozen), lora_a [R, D], lora_b [D, R], g2 [D],
/// w1 [3D, D], w2 [D, 3D]`.
fn block_params(seed: u64) -> Vec<Variable> {
    let shapes: [&[usize]; 10] = [
        &[D],
        &[D, D],
        &[D, D],
        &[D, D],
        &[D, D],
        &[R, D],
        &[D, R],
        &[D],
        &[3 * D, D],
        &[D, 3 * D],
    ];
    shapes
        .iter()
        .enumerate()
        .map(|(i, s)| Variable::leaf(rand(s, seed + i as u64), i != 4))
        .collect()
}

/// `x [B, S, D]` → `[B, S, D]`: a residual attention sub-block with a LoRA output projection
/// (`wo·a + 0.5·B·A·a`, one named value) and a residual MLP whose two matrix products share
/// the name `"mm"`.
fn block(x: &Variable, p: &[Variable], kind: AttentionKind, calls: &Calls) -> Result<Variable> {
    let h = ops::rms_norm(x, &p[0], 1e-5)?;
    let q = counted(calls, "q", &[&h], || ops::linear(&h, &p[1]))?;
    let k = counted(calls, "k", &[&h], || ops::linear(&h, &p[2]))?;
    let v = ops::linear(&h, &p[3])?;
    let heads = |t: &Variable| ops::reshape(t, vec![B, S, HEADS, D / HEADS]);
    let (q, k, v) = (heads(&q)?, heads(&k)?, heads(&v)?);
    let a = counted(calls, "attention", &[&q, &k, &v], || {
        ops::causal_attention(&q, &k, &v, AttentionLayout::BatchSeqHead, kind)
    })?;
    let a = ops::reshape(&a, vec![B, S, D])?;
    let o = counted(calls, "lora", &[&a], || {
        let base = ops::linear(&a, &p[4])?;
        let low = ops::linear(&ops::linear(&a, &p[5])?, &p[6])?;
        ops::add(&base, &ops::scale(&low, 0.5)?)
    })?;
    let h2 = ops::add(x, &o)?;
    let n2 = counted(calls, "norm", &[&h2], || ops::rms_norm(&h2, &p[7], 1e-5))?;
    let up = counted(calls, "mm", &[&n2], || ops::linear(&n2, &p[8]))?;
    let act = ops::silu(&up)?;
    let down = counted(calls, "mm", &[&act], || ops::linear(&act, &p[9]))?;
    ops::add(&h2, &down)
}

#[derive(Clone, Debug)]
enum Mode {
    NoCheckpoint,
    Plain,
    Save(Vec<String>),
}

/// `block(x)`, checkpointed as `mode` says.
fn run_block(
    mode: &Mode,
    x: &Variable,
    p: &[Variable],
    kind: AttentionKind,
    calls: &Calls,
) -> Result<Variable> {
    let (p2, calls2) = (p.to_vec(), calls.clone());
    let f = move |h: &Variable, _: CheckpointPass| block(h, &p2, kind, &calls2);
    match mode {
        Mode::NoCheckpoint => block(x, p, kind, calls),
        Mode::Plain => checkpoint_with_pass("block", x, p, f),
        Mode::Save(save) => {
            let options = CheckpointOptions::saving(save.iter().cloned());
            checkpoint_with_options("block", x, p, &options, f)
        }
    }
}

/// `Σ y ⊙ c` for a fixed random `c`.
fn weighted_sum(y: &Variable) -> Variable {
    let c = Variable::constant(rand(y.dims(), 77));
    ops::sum(&ops::mul(y, &c).unwrap()).unwrap()
}

struct Outcome {
    loss: Vec<u32>,
    /// The input's gradient, then every parameter's (`None` for the frozen one).
    grads: Vec<Option<Vec<u32>>>,
}

fn outcome(mode: &Mode, kind: AttentionKind) -> Outcome {
    let x = Variable::leaf(rand(&[B, S, D], 1), true);
    let p = block_params(10);
    let loss = weighted_sum(&run_block(mode, &x, &p, kind, &Calls::default()).unwrap());
    loss.backward().unwrap();
    let leaves: Vec<Variable> = std::iter::once(x).chain(p).collect();
    Outcome {
        loss: bits(loss.value()),
        grads: grad_bits(&leaves),
    }
}

fn subset(mask: usize) -> Vec<String> {
    NAMES
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, n)| n.to_string())
        .collect()
}
