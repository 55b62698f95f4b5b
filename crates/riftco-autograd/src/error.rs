//! Errors of graph construction, backward passes and checkpoint replay.

use riftco_tensor::{ClassifiedError, ErrorKind, TensorError};
use std::sync::Arc;

/// Why a [`crate::checkpoint()`] call or its replay was rejected (the replay contract).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CheckpointError {
    /// A dependency is listed twice.
    #[error("checkpoint {name:?}: dependency {dependency} is declared more than once")]
    DuplicateDependency { name: String, dependency: String },
    /// A declared dependency is not a leaf.
    #[error("checkpoint {name:?}: dependency {dependency} is not a leaf (it was computed by op {op}); declare the parameters it came from")]
    DependencyNotLeaf {
        name: String,
        dependency: String,
        op: &'static str,
    },
    /// The callable used a pre-existing leaf that was not declared.
    #[error("checkpoint {name:?}: the callable reads {leaf}, which is not a declared dependency")]
    MissingDependency { name: String, leaf: String },
    /// The callable captured a graph node computed outside the checkpoint boundary.
    #[error("checkpoint {name:?}: the callable captured graph node {node} (op {op}) computed outside the checkpoint; pass it as the input or compute it inside")]
    CapturedExternalNode {
        name: String,
        node: String,
        op: &'static str,
    },
    /// The callable created a new differentiable leaf, whose gradient would be lost.
    #[error("checkpoint {name:?}: the callable created a new differentiable leaf {leaf}; create parameters outside and declare them as dependencies")]
    UndeclaredLeaf { name: String, leaf: String },
    /// The output does not depend on the input.
    #[error("checkpoint {name:?}: the callable's output does not depend on its input")]
    InputUnused { name: String },
    /// A checkpoint of several inputs: the output does not depend on input `index` (of `count`).
    #[error("checkpoint {name:?}: the callable's output does not depend on input {index} (of {count} inputs); every input must be used (drop the ones that are not)")]
    InputUnusedAt {
        name: String,
        index: usize,
        count: usize,
    },
    /// A checkpoint was given no input.
    #[error("checkpoint {name:?}: no input was given; pass at least one Variable input")]
    NoInputs { name: String },
    /// The same Variable is passed twice as an input.
    #[error("checkpoint {name:?}: input {input} is passed twice (at positions {first} and {second}); pass it once and use it twice inside the callable")]
    DuplicateInput {
        name: String,
        input: String,
        first: usize,
        second: usize,
    },
    /// A Variable is passed both as an input and as a dependency.
    #[error("checkpoint {name:?}: {input} is input {index} and also a declared dependency; pass it only once (as an input, or as a dependency it is read from)")]
    InputIsDependency {
        name: String,
        input: String,
        index: usize,
    },
    /// The output does not depend on a declared dependency.
    #[error("checkpoint {name:?}: the callable's output does not depend on declared dependency {dependency}")]
    DependencyUnused { name: String, dependency: String },
    /// Replay produced another shape than the original forward.
    #[error(
        "checkpoint {name:?}: replay produced shape {replay:?}, the forward produced {forward:?}"
    )]
    ReplayShapeChanged {
        name: String,
        forward: Vec<usize>,
        replay: Vec<usize>,
    },
    /// `backward()` (or a variant) was called while a checkpoint replay was running on this
    /// thread: a replay must not commit gradients of its own (and a backward of the graph that
    /// contains the checkpoint would replay it again without end).
    #[error("checkpoint {name:?}: backward() was called inside its replay (during an outer backward pass, on the replay's thread or on a thread that reaches the checkpoint's parameters); a checkpoint callable must not run backward(), backward_with_grad() or backward_accumulate(): compute gradients outside the checkpointed function")]
    BackwardInsideReplay { name: String },
    /// `zero_grad()` was called inside a replay (on the replay's thread, or on a parameter of
    /// the checkpoint from another thread): the outer backward pass owns the gradients until it
    /// commits them.
    #[error("checkpoint {name:?}: zero_grad() was called inside its replay (during an outer backward pass); a checkpoint callable, or a thread it started, must not change public gradients: clear gradients outside the checkpointed function")]
    ZeroGradInsideReplay { name: String },
    /// A backward pass started inside a replay reached the checkpoint being replayed, which
    /// would replay it again without end.
    #[error("checkpoint {name:?}: replayed again while its own replay was running (the callable started a backward pass over the graph that contains this checkpoint); a checkpoint callable must not differentiate the graph it belongs to")]
    ReentrantReplay { name: String },
    /// The checkpoint's replay was started while another thread was replaying the same
    /// checkpoint: a backward pass from a thread that a replay callable started, or two backward
    /// passes over one graph at once.
    #[error("checkpoint {name:?}: replayed on this thread while its replay was running on another thread (a backward pass from a thread that the checkpoint callable started, or two backward passes over one graph at the same time); a checkpoint callable must not differentiate the graph it belongs to, and one graph is differentiated by one thread at a time")]
    ReplayRunningElsewhere { name: String },
    /// Replay produced its output on another device than the original forward.
    #[error(
        "checkpoint {name:?}: replay produced its output on {replay}, the forward on {forward}"
    )]
    ReplayDeviceChanged {
        name: String,
        forward: riftco_tensor::Device,
        replay: riftco_tensor::Device,
    },
    /// The replay recorded another graph than the forward run (other ops, or ops on other
    /// shapes): the callable read state that changed between the forward and the backward pass
    /// (a module switched between `train()` and `eval()`, a Python flag), so its gradients
    /// would belong to another computation than the output (PyTorch's metadata check raises
    /// for this too: a different number of tensors saved).
    #[error("checkpoint {name:?}: the replay recorded another graph than the forward run ({replay_ops} ops against {forward_ops}{detail}): the callable depends on state that changed between the forward and the backward pass (a module switched between train() and eval(), a flag); gradients would belong to another computation. Keep such state fixed until backward, or pass determinism_check=\"off\"")]
    ReplayGraphChanged {
        name: String,
        forward_ops: usize,
        replay_ops: usize,
        /// Empty, or `", the same count with other ops or shapes"`.
        detail: &'static str,
    },
    /// The forward run returned a graph-only value (a placeholder holding no data): the
    /// graph-only op variants are for the replay's tail only.
    #[error("checkpoint {name:?}: the callable's forward run returned a value holding no data (a graph-only op's placeholder); use the graph-only variants only on CheckpointPass::Replay")]
    GraphOnlyForwardOutput { name: String },
    /// A name in the checkpoint's save set was not used by any `named` call of the forward run.
    #[error("checkpoint {name:?}: save name {save_name:?} is not used by the callable at this checkpoint's level (a name inside the function of another saved name is saved with it; names used: {used:?})")]
    SaveNameUnused {
        name: String,
        save_name: String,
        used: Vec<String>,
    },
    /// A saved `named` function read a graph value that is not one of its declared inputs.
    #[error("checkpoint {name:?}: named value {op_name:?} reads graph node {node} (op {op}), which is not one of the inputs passed to named(); pass it in the inputs")]
    NamedOpCapturedNode {
        name: String,
        op_name: String,
        node: String,
        op: &'static str,
    },
    /// The replay called the saved names in another order, or with other input shapes, than the
    /// forward run.
    #[error("checkpoint {name:?}: the replay diverged from the forward run: expected saved value {expected}, got {got}")]
    NamedOpReplayDiverged {
        name: String,
        expected: String,
        got: String,
    },
    /// `DeterminismCheck::Values`: the replay's output differs from the forward's; `index` is
    /// the flat (row-major) index of the first differing element.
    #[error("checkpoint {name:?}: the replay computed other values than the forward run (determinism_check \"values\"): first difference at flat index {index}: forward {forward:e} (bits {:#010x}), replay {replay:e} (bits {:#010x}); the callable is not deterministic (it reads state that changes between calls, draws random numbers outside riftco's generator, or draws through it with preserve_rng_state off)", .forward.to_bits(), .replay.to_bits())]
    ReplayValuesChanged {
        name: String,
        index: usize,
        forward: f32,
        replay: f32,
    },
    /// `DeterminismCheck::Values`: the output hashes differ but the differing element could not
    /// be located (the values could not be read back, or the checkpoint's output value itself
    /// was changed).
    #[error("checkpoint {name:?}: the replay's output hash {replay_hash:#018x} differs from the forward's {forward_hash:#018x} (determinism_check \"values\"); the first differing element cannot be named: {reason}")]
    ReplayHashChanged {
        name: String,
        forward_hash: u64,
        replay_hash: u64,
        reason: String,
    },
    /// `DeterminismCheck::Values`: the replay reserved other generator blocks than the forward
    /// run (states as (seed, offset) before and after each run).
    #[error("checkpoint {name:?}: the replay drew other random numbers than the forward run (determinism_check \"values\"): the forward moved the generator from (seed {}, offset {}) to (seed {}, offset {}), the replay from (seed {}, offset {}) to (seed {}, offset {})", .forward_before.seed, .forward_before.offset, .forward_after.seed, .forward_after.offset, .replay_before.seed, .replay_before.offset, .replay_after.seed, .replay_after.offset)]
    ReplayRngChanged {
        name: String,
        forward_before: crate::rng::RngState,
        forward_after: crate::rng::RngState,
        replay_before: crate::rng::RngState,
        replay_after: crate::rng::RngState,
    },
}

/// Errors of the autograd layer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AutogradError {
    /// A tensor-level error (shapes, lengths, devices).
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// A value the graph read at forward changed before backward.
    #[error("stale graph: {tensor} was read by op {op} at version {recorded} but is now at version {current} (it was modified, transferred or updated by an optimizer after the forward pass); run the forward again")]
    StaleGraph {
        tensor: String,
        op: &'static str,
        recorded: u64,
        current: u64,
    },
    /// `backward()` without a seed gradient needs a one-element output.
    #[error("backward: output has shape {shape:?}; backward() without a gradient needs a single-element output (use backward_with_grad)")]
    NotScalar { shape: Vec<usize> },
    /// The output does not require gradients (no trainable leaf reaches it).
    #[error("backward: {what} does not require grad (no trainable leaf reaches it)")]
    NoGradient { what: String },
    /// A backward pass reached an op node whose graph an earlier backward pass with
    /// `retain_graph = false` freed (PyTorch: "Trying to backward through the graph a second
    /// time").
    #[error("backward: {what} was already differentiated by a backward pass with retain_graph=False, which freed its graph (its parents and saved values); run the forward again, or pass retain_graph=True to the first backward to differentiate twice")]
    GraphFreed { what: String },
    /// A gradient given to [`crate::Variable::replace_grad`] whose shape differs from the
    /// value's.
    #[error(
        "setting the gradient of {what}: shape {got:?} does not match the value's {expected:?}"
    )]
    GradShape {
        what: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    /// [`crate::Variable::replace_grad`] on a node that cannot hold a committed gradient (an op
    /// result, a leaf that does not require grad) or with a gradient on another device.
    #[error("setting the gradient of {what}: {reason}")]
    GradNotSettable { what: String, reason: String },
    /// A checkpoint contract violation.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A Rust panic inside a VJP or a checkpoint callable, caught at the boundary.
    #[error("panic inside {during}: {message}")]
    Panic {
        during: &'static str,
        message: String,
    },
    /// The generator offset would pass `u64::MAX` ([`crate::rng::reserve`]); the state is
    /// unchanged.
    #[error("random number generator: reserving {blocks} blocks at offset {offset} would overflow the 64-bit block counter; call manual_seed() to start a new stream")]
    RngOffsetOverflow { offset: u64, blocks: u64 },
    /// A counter drawn through [`crate::rng::draw_counter`] (such as a model's dropout step) is
    /// at `u64::MAX`: the next value would repeat an earlier one.
    #[error("{what} is {max} and cannot advance: the next value would wrap to 0 and repeat earlier random masks; set it back explicitly to start a new stream", max = u64::MAX)]
    CounterOverflow { what: &'static str },
    /// An unknown spelling of an enum-like option.
    #[error("unknown {option} {value:?}; expected one of {expected}")]
    UnknownOption {
        option: &'static str,
        value: String,
        expected: &'static str,
    },
    /// An error raised by user code (for example a Python exception inside a checkpoint
    /// callable, or a `TransformerError` of a checkpointed block), carried unchanged so the
    /// binding can re-raise the original; its kind is the carried error's.
    #[error("{0}")]
    External(Arc<dyn ClassifiedError>),
}

impl CheckpointError {
    /// The class of this error: every checkpoint contract violation is
    /// [`ErrorKind::Checkpoint`].
    pub fn kind(&self) -> ErrorKind {
        match self {
            CheckpointError::DuplicateDependency { .. }
            | CheckpointError::DependencyNotLeaf { .. }
            | CheckpointError::MissingDependency { .. }
            | CheckpointError::CapturedExternalNode { .. }
            | CheckpointError::UndeclaredLeaf { .. }
            | CheckpointError::InputUnused { .. }
            | CheckpointError::InputUnusedAt { .. }
            | CheckpointError::NoInputs { .. }
            | CheckpointError::DuplicateInput { .. }
            | CheckpointError::InputIsDependency { .. }
            | CheckpointError::DependencyUnused { .. }
            | CheckpointError::ReplayShapeChanged { .. }
            | CheckpointError::BackwardInsideReplay { .. }
            | CheckpointError::ZeroGradInsideReplay { .. }
            | CheckpointError::ReentrantReplay { .. }
            | CheckpointError::ReplayRunningElsewhere { .. }
            | CheckpointError::ReplayDeviceChanged { .. }
            | CheckpointError::ReplayGraphChanged { .. }
            | CheckpointError::GraphOnlyForwardOutput { .. }
            | CheckpointError::SaveNameUnused { .. }
            | CheckpointError::NamedOpCapturedNode { .. }
            | CheckpointError::NamedOpReplayDiverged { .. }
            | CheckpointError::ReplayValuesChanged { .. }
            | CheckpointError::ReplayHashChanged { .. }
            | CheckpointError::ReplayRngChanged { .. } => ErrorKind::Checkpoint,
        }
    }
}

impl AutogradError {
    /// Wraps a user error; its [`ClassifiedError::kind`] becomes this error's kind.
    pub fn external<E: ClassifiedError>(e: E) -> Self {
        AutogradError::External(Arc::new(e))
    }

    /// The class of this error (what the Python and C layers map to an exception or a status).
    /// A nested error (`Tensor`, `Checkpoint`, `External`) has the kind of the error it carries.
    pub fn kind(&self) -> ErrorKind {
        match self {
            AutogradError::Tensor(e) => e.kind(),
            AutogradError::StaleGraph { .. } => ErrorKind::StaleGraph,
            AutogradError::NotScalar { .. } | AutogradError::GradShape { .. } => ErrorKind::Shape,
            AutogradError::GradNotSettable { .. } => ErrorKind::InvalidArgument,
            AutogradError::NoGradient { .. } | AutogradError::GraphFreed { .. } => {
                ErrorKind::Backward
            }
            AutogradError::Checkpoint(e) => e.kind(),
            AutogradError::Panic { .. } => ErrorKind::Panic,
            AutogradError::RngOffsetOverflow { .. } | AutogradError::CounterOverflow { .. } => {
                ErrorKind::InvalidArgument
            }
            AutogradError::UnknownOption { .. } => ErrorKind::UnknownOption,
            AutogradError::External(e) => e.kind(),
        }
    }
}

impl ClassifiedError for CheckpointError {
    fn kind(&self) -> ErrorKind {
        CheckpointError::kind(self)
    }
}

impl ClassifiedError for AutogradError {
    fn kind(&self) -> ErrorKind {
        AutogradError::kind(self)
    }
}

/// Result alias for autograd operations.
pub type Result<T, E = AutogradError> = std::result::Result<T, E>;
