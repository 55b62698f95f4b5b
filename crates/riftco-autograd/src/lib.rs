//! Reverse-mode automatic differentiation for riftco, with activation checkpointing.
//!
//! - [`Variable`]: a graph node holding its forward value (`Send + Sync`). Leaves are trainable
//!   (`requires_grad`) or frozen; op nodes record their parents and the version of every value
//!   they read.
//! - [`Variable::backward`] runs each pass in an isolated [`GradientContext`]: VJP rules
//!   accumulate into the context only, and public leaf gradients are committed after the whole
//!   pass succeeded. A failed pass commits nothing.
//! - Before differentiating, every value the graph read is checked against the version recorded
//!   at forward: a changed value, a device transfer or an optimizer step is a
//!   [`AutogradError::StaleGraph`].
//! - [`checkpoint()`]: the replay primitive with its validation, after Chen et al. 2016,
//!   "Training Deep Nets with Sublinear Memory Cost".
//! - [`named()`] and [`CheckpointOptions::save`]: selective checkpointing, where a checkpoint
//!   keeps the values of chosen named ops from its forward run and its replay reuses them.
//! - [`rng`]: the thread's random-number generator state (seed and block offset) that random
//!   ops draw from; a checkpoint replays the forward's draws ([`CheckpointOptions::preserve_rng_state`])
//!   and can verify its replay value by value ([`DeterminismCheck`]).
//! - [`Variable::graph_statistics`]: reachable node count and elements owned by those nodes.

pub mod checkpoint;
pub mod context;
pub mod determinism;
pub mod error;
pub mod grad_mode;
pub mod named;
pub mod ops;
pub mod rng;
pub mod stats;
pub mod variable;

pub use checkpoint::{
    checkpoint, checkpoint_multi, checkpoint_multi_with_options, checkpoint_with_name,
    checkpoint_with_options, checkpoint_with_pass, CheckpointPass,
};
pub use context::{panic_message, BackwardOptions, GradientContext, LeafGradientHook};
pub use determinism::{value_hash, DeterminismCheck};
pub use error::{AutogradError, CheckpointError, Result};
pub use grad_mode::{enable_grad, is_grad_enabled, no_grad, set_grad_enabled, NoGradGuard};
pub use named::{named, CheckpointOptions, ReplayEndHook};
pub use rng::{draw_counter, fork_rng, manual_seed, reserve, rng_state, set_rng_state, RngState};
pub use stats::GraphStatistics;
pub use variable::{Saves, Variable};
