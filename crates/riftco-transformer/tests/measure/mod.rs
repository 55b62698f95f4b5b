//! Measured activation bytes of one training step, for the memory tests.
//!
//! The memory counters are process-wide: a test reading them holds [`lock`] for its whole
//! measurement so that, also under `cargo test` (one process, many threads), no other test of
//! the same binary allocates meanwhile. (nextest runs each test in its own process.)
#![allow(dead_code)]

use riftco_autograd::BackwardOptions;
use riftco_tensor::{memory_stats, reset_peak_memory_stats, MemoryCategory};
use riftco_transformer::DecoderOnlyTransformer;
use std::sync::{Mutex, MutexGuard};

static MEMORY: Mutex<()> = Mutex::new(());

/// The process-wide measurement lock (a test that panicked while holding it does not block the
/// others).
pub fn lock() -> MutexGuard<'static, ()> {
    MEMORY.lock().unwrap_or_else(|e| e.into_inner())
}

/// A deterministic `[batch, seq + 1]` token block.
pub fn tokens(batch: usize, seq_plus_one: usize, vocab: u32) -> Vec<u32> {
    (0..batch * seq_plus_one)
        .map(|i| ((i as u32).wrapping_mul(2654435761) >> 7) % vocab)
        .collect()
}

/// Current and peak activation bytes of the host.
pub fn activation_bytes() -> (u64, u64) {
    let s = memory_stats().get(MemoryCategory::Activation);
    (s.current_bytes as u64, s.peak_bytes as u64)
}

/// One measured training step.
#[derive(Clone, Copy, Debug)]
pub struct StepBytes {
    /// Activation bytes alive after the forward (the graph's retained values).
    pub retained: u64,
    /// Activation peak of forward + backward.
    pub peak: u64,
    /// Activation peak of the backward alone.
    pub backward_peak: u64,
}

/// Retained activation bytes after the forward of `loss` on `[batch, seq + 1]` tokens and the
/// activation peak of forward + backward, both above what was alive before the step. The plan
/// is resolved first: for `auto` and budgets this measures (and resets the peak counters)
/// before the step, as the first training forward of a shape would. Asserts that dropping the
/// graph frees every activation of the step.
pub fn measure_step(m: &DecoderOnlyTransformer, batch: usize, seq: usize) -> StepBytes {
    m.activation_checkpointing_plan(batch, seq).unwrap();
    let t = tokens(batch, seq + 1, m.config().vocab_size as u32);
    let (before, _) = activation_bytes();
    reset_peak_memory_stats();
    let loss = m.loss(&t, batch, seq + 1).unwrap();
    let (after_forward, forward_peak) = activation_bytes();
    reset_peak_memory_stats();
    // As a training step (the stages): each node's values go as soon as its VJP ran.
    loss.backward_with(BackwardOptions::freeing()).unwrap();
    let (_, backward_peak) = activation_bytes();
    let peak = forward_peak.max(backward_peak);
    drop(loss);
    let (after, _) = activation_bytes();
    assert_eq!(
        after,
        before,
        "{}: the step leaked activations",
        m.activation_checkpointing()
    );
    StepBytes {
        retained: after_forward - before,
        peak: peak - before,
        backward_peak: backward_peak - before,
    }
}

/// `(measured − expected) / expected`.
pub fn relative_error(measured: u64, expected: u64) -> f64 {
    (measured as f64 - expected as f64) / expected as f64
}
