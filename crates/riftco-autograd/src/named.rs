//! Named ops and selective checkpointing: which values a checkpoint keeps from its forward run
//! so that its replay reuses them instead of recomputing them.
//!
//! Inside a checkpoint callable, [`named`] wraps the op (or small group of ops) computing one
//! value and gives it a name (`"q"`, `"attention"`, `"gate"`). A checkpoint whose
//! [`CheckpointOptions::save`] lists that name keeps, at its forward run, the nodes `named`
//! recorded — their values and their VJP rules, with any tensors those rules captured (the
//! logsumexp of flash attention, for example) — and at its replay rebuilds exactly those nodes
//! around the replay's recomputed inputs instead of calling the wrapped function. Every other
//! op of the callable is recomputed as usual. Names outside the save set, and `named` outside
//! any checkpoint, just call the function.
//!
//! This is the save-list form of JAX's remat policies (`jax.checkpoint_policies.
//! save_only_these_names` with `checkpoint_name`) and of PyTorch's selective activation
//! checkpointing (`torch.utils.checkpoint.create_selective_checkpoint_contexts`), applied at
//! the replay: gradients are those of an ordinary checkpoint bit for bit, because every VJP
//! sees the same values.
//!
//! Rules, each checked with a [`CheckpointError`] (nothing committed):
//! - the wrapped function may read, besides leaves (parameters, constants), only the values
//!   passed in `inputs` ([`CheckpointError::NamedOpCapturedNode`]);
//! - the replay must call the saved names in the order and with the input shapes of the
//!   forward run ([`CheckpointError::NamedOpReplayDiverged`]);
//! - every name in the save set must be used by the forward run
//!   ([`CheckpointError::SaveNameUnused`]: a typo would otherwise silently save nothing).
//!
//! Memory: a saved name keeps every value its wrapped function recorded, so wrap the single
//! expensive op (the base matrix product of a LoRA layer rather than the whole layer).

use crate::determinism::DeterminismCheck;
use crate::error::{CheckpointError, Result};
use crate::grad_mode::is_grad_enabled;
use crate::rng::{reserve, rng_state, set_rng_state, RngState};
use crate::variable::{peek_next_id, Saves, Variable, VjpFn};
use riftco_tensor::Tensor;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

/// What a checkpoint does besides keeping its boundary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointOptions {
    /// Names of [`named`] values the forward run keeps for the replay (empty: recompute
    /// everything, the plain checkpoint).
    pub save: Vec<String>,
    /// Whether the replay draws the random numbers the forward run drew (default `true`): the
    /// thread's generator state ([`crate::rng`]) before the forward run is recorded, set again
    /// for the replay, and the state the thread had before the replay is restored afterwards,
    /// so the replay neither changes what it draws nor disturbs the caller's stream (PyTorch's
    /// `preserve_rng_state`). With `false` the replay draws from whatever the state is when the
    /// backward pass reaches it, and advances it.
    pub preserve_rng_state: bool,
    /// What the replay is compared with the forward run on (default
    /// [`DeterminismCheck::Metadata`]: shape and device).
    pub determinism_check: DeterminismCheck,
    /// Whether a dependency the forward run's output does not depend on is dropped from the
    /// checkpoint's boundary (it receives no gradient) instead of being refused with
    /// [`crate::CheckpointError::DependencyUnused`] (default `false`). For dependencies found
    /// automatically (every leaf a module holds, of which a callable may read only some);
    /// a declared list should be exact.
    pub prune_unused_dependencies: bool,
    /// Called once each replay of the checkpoint has handed its VJPs to the outer pass (or
    /// failed): the point after which nothing of that backward step reads the boundary's
    /// values again. A sharded data-parallel model releases the block's gathered parameters
    /// there (default `None`).
    pub on_replay_end: Option<ReplayEndHook>,
}

/// A callback run at the end of every replay of a checkpoint
/// ([`CheckpointOptions::on_replay_end`]). Two hooks compare equal when they are the same
/// callback (the same `Arc`).
#[derive(Clone)]
pub struct ReplayEndHook(pub Arc<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for ReplayEndHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplayEndHook(..)")
    }
}

impl PartialEq for ReplayEndHook {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ReplayEndHook {}

impl Default for CheckpointOptions {
    /// No save set, `preserve_rng_state: true`, `determinism_check: Metadata`.
    fn default() -> Self {
        Self {
            save: Vec::new(),
            preserve_rng_state: true,
            determinism_check: DeterminismCheck::Metadata,
            prune_unused_dependencies: false,
            on_replay_end: None,
        }
    }
}

impl CheckpointOptions {
    /// Options saving the values named `names` (the other fields at their defaults).
    pub fn saving<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Self {
        Self {
            save: names.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// These options with `determinism_check` set to `check`.
    pub fn with_determinism_check(mut self, check: DeterminismCheck) -> Self {
        self.determinism_check = check;
        self
    }

    /// These options with `prune_unused_dependencies` set to `prune`.
    pub fn with_prune_unused_dependencies(mut self, prune: bool) -> Self {
        self.prune_unused_dependencies = prune;
        self
    }

    /// These options with `on_replay_end` set to `hook`.
    pub fn with_replay_end(mut self, hook: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_replay_end = Some(ReplayEndHook(Arc::new(hook)));
        self
    }

    /// These options with `preserve_rng_state` set to `preserve`.
    pub fn with_preserve_rng_state(mut self, preserve: bool) -> Self {
        self.preserve_rng_state = preserve;
        self
    }
}

/// Where a rebuilt node's parent comes from.
enum ParentRef {
    /// The `i`-th value passed to [`named`].
    Input(usize),
    /// An earlier node of the same saved op.
    Internal(usize),
    /// A leaf (a parameter or a constant), the same in the forward run and the replay.
    Leaf(Variable),
}

/// One node a saved [`named`] call recorded.
struct SavedNode {
    op: &'static str,
    value: Tensor,
    saves: Saves,
    vjp: Arc<VjpFn>,
    parents: Vec<ParentRef>,
}

/// What one saved [`named`] call recorded at the forward run.
pub(crate) struct SavedOp {
    name: String,
    input_dims: Vec<Vec<usize>>,
    /// In creation (topological) order.
    nodes: Vec<SavedNode>,
    /// The returned value.
    output: ParentRef,
    /// The thread's generator state before and after the call, when the call moved it (it drew
    /// random numbers, e.g. a dropout mask): the replay, which does not call it, moves the
    /// generator the same way so that later draws of the callable stay those of the forward.
    rng: Option<(RngState, RngState)>,
}

/// The saved ops of one checkpoint's forward run, in call order.
#[derive(Default)]
pub(crate) struct SavedValues {
    ops: Vec<SavedOp>,
}

enum Frame {
    /// A checkpoint's forward run: saved names are recorded.
    Record {
        checkpoint: String,
        save: Arc<[String]>,
        /// The ids of the checkpoint's own input leaves, which a saved op must receive in
        /// `inputs`.
        x0: Arc<[u64]>,
        saved: SavedValues,
        used: HashMap<String, usize>,
    },
    /// A checkpoint's replay: saved names are rebuilt from `saved`, in order.
    Replay {
        checkpoint: String,
        save: Arc<[String]>,
        saved: Arc<SavedValues>,
        cursor: usize,
    },
    /// Inside a function whose value is being saved (or outside any selective checkpoint):
    /// nested names just run.
    Plain,
}

thread_local! {
    static FRAMES: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
}

/// Pops the frame it pushed when dropped (also on errors and panics).
struct FrameGuard;

impl FrameGuard {
    fn push(frame: Frame) -> Self {
        FRAMES.with(|f| f.borrow_mut().push(frame));
        FrameGuard
    }
}

impl Drop for FrameGuard {
    fn drop(&mut self) {
        FRAMES.with(|f| {
            f.borrow_mut().pop();
        });
    }
}

/// Runs a checkpoint's forward run under `save`, returning its result and the saved values.
///
/// # Errors
/// The error of `run`; [`CheckpointError::SaveNameUnused`] for a save name no [`named`] call
/// used.
pub(crate) fn record<T>(
    checkpoint: &str,
    save: &[String],
    x0: &[Variable],
    run: impl FnOnce() -> Result<T>,
) -> Result<(T, SavedValues)> {
    let guard = FrameGuard::push(Frame::Record {
        checkpoint: checkpoint.to_string(),
        save: save.into(),
        x0: x0.iter().map(Variable::id).collect(),
        saved: SavedValues::default(),
        used: HashMap::new(),
    });
    let out = run();
    let frame = FRAMES.with(|f| f.borrow_mut().pop());
    std::mem::forget(guard);
    let out = out?;
    let Some(Frame::Record { saved, used, .. }) = frame else {
        unreachable!("the record frame is the innermost one after its run")
    };
    if let Some(unused) = save.iter().find(|s| !used.contains_key(s.as_str())) {
        let mut names: Vec<&String> = used.keys().collect();
        names.sort();
        return Err(CheckpointError::SaveNameUnused {
            name: checkpoint.to_string(),
            save_name: unused.clone(),
            used: names.into_iter().cloned().collect(),
        }
        .into());
    }
    Ok((out, saved))
}

/// Runs a checkpoint's replay, rebuilding the saved ops from `saved`.
///
/// # Errors
/// The error of `run`; [`CheckpointError::NamedOpReplayDiverged`] when the replay called fewer
/// saved names than the forward run.
pub(crate) fn replay<T>(
    checkpoint: &str,
    save: &[String],
    saved: &Arc<SavedValues>,
    run: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let guard = FrameGuard::push(Frame::Replay {
        checkpoint: checkpoint.to_string(),
        save: save.into(),
        saved: saved.clone(),
        cursor: 0,
    });
    let out = run();
    let frame = FRAMES.with(|f| f.borrow_mut().pop());
    std::mem::forget(guard);
    let out = out?;
    if let Some(Frame::Replay { cursor, saved, .. }) = frame {
        if let Some(op) = saved.ops.get(cursor) {
            return Err(CheckpointError::NamedOpReplayDiverged {
                name: checkpoint.to_string(),
                expected: format!("{:?} with inputs {:?}", op.name, op.input_dims),
                got: "the end of the callable".into(),
            }
            .into());
        }
    }
    Ok(out)
}

/// Runs a plain checkpoint (no save set) so that names inside it are not saved by an enclosing
/// selective checkpoint.
pub(crate) fn plain<T>(run: impl FnOnce() -> T) -> T {
    let _guard = FrameGuard::push(Frame::Plain);
    run()
}

/// What [`named`] does for the innermost frame.
enum Action {
    Run,
    Record { x0: Arc<[u64]>, checkpoint: String },
    Rebuild,
}

/// Names the value `f` computes from `inputs` (and from leaves: parameters, constants), so
/// that a checkpoint whose save set lists `name` keeps it from its forward run and reuses it
/// in its replay instead of calling `f` again (see the module documentation). Outside a
/// checkpoint, or when the innermost checkpoint does not save `name`, it returns `f()`.
///
/// # Errors
/// The error of `f`; inside a checkpoint saving `name`:
/// [`CheckpointError::NamedOpCapturedNode`] when `f` read a graph value not in `inputs`, and at
/// replay [`CheckpointError::NamedOpReplayDiverged`] when the saved names come in another order
/// or with other input shapes than at the forward run.
pub fn named<F>(name: &str, inputs: &[&Variable], f: F) -> Result<Variable>
where
    F: FnOnce() -> Result<Variable>,
{
    let action = FRAMES.with(|frames| {
        let frames = frames.borrow();
        match frames.last() {
            Some(Frame::Record {
                save,
                x0,
                checkpoint,
                ..
            }) if is_grad_enabled() && save.iter().any(|s| s == name) => Action::Record {
                x0: x0.clone(),
                checkpoint: checkpoint.clone(),
            },
            // As at the forward run, a call without a graph was not recorded: it runs again.
            Some(Frame::Replay { save, .. })
                if is_grad_enabled() && save.iter().any(|s| s == name) =>
            {
                Action::Rebuild
            }
            _ => Action::Run,
        }
    });
    match action {
        Action::Run => {
            // Count every name the forward run uses, also when grad mode is off, so that
            // SaveNameUnused means the name is not in the callable at all and lists the names
            // that are.
            mark_used(name);
            f()
        }
        Action::Record { x0, checkpoint } => {
            let start = peek_next_id();
            let rng_before = rng_state();
            let out = plain(f)?;
            let rng_after = rng_state();
            let mut op = capture(&checkpoint, name, inputs, &out, start, &x0)?;
            op.rng = (rng_after != rng_before).then_some((rng_before, rng_after));
            FRAMES.with(|frames| {
                if let Some(Frame::Record { saved, used, .. }) = frames.borrow_mut().last_mut() {
                    saved.ops.push(op);
                    *used.entry(name.to_string()).or_default() += 1;
                }
            });
            Ok(out)
        }
        Action::Rebuild => rebuild(name, inputs),
    }
}

fn mark_used(name: &str) {
    FRAMES.with(|frames| {
        if let Some(Frame::Record { used, .. }) = frames.borrow_mut().last_mut() {
            *used.entry(name.to_string()).or_default() += 1;
        }
    });
}

/// The nodes `f` created (ids `>= start`) between `inputs` and `out`.
fn capture(
    checkpoint: &str,
    name: &str,
    inputs: &[&Variable],
    out: &Variable,
    start: u64,
    x0: &[u64],
) -> Result<SavedOp> {
    let input_index = |v: &Variable| inputs.iter().position(|i| i.ptr_eq(v));
    let internal = |v: &Variable| v.id() >= start && !v.is_leaf() && input_index(v).is_none();
    let mut nodes: Vec<Variable> = Vec::new();
    out.walk(&|v| !internal(v), &mut |v| {
        if internal(v) {
            nodes.push(v.clone());
        }
    });
    // Ids increase in creation order and every parent is created before its children.
    nodes.sort_by_key(Variable::id);
    let position: HashMap<u64, usize> =
        nodes.iter().enumerate().map(|(i, v)| (v.id(), i)).collect();
    let reference = |v: &Variable| -> Result<ParentRef> {
        if let Some(&i) = position.get(&v.id()) {
            Ok(ParentRef::Internal(i))
        } else if let Some(i) = input_index(v) {
            Ok(ParentRef::Input(i))
        } else if v.is_leaf() && !x0.contains(&v.id()) {
            Ok(ParentRef::Leaf(v.clone()))
        } else {
            Err(CheckpointError::NamedOpCapturedNode {
                name: checkpoint.to_string(),
                op_name: name.to_string(),
                node: v.describe(),
                op: v.op_name(),
            }
            .into())
        }
    };
    let mut saved = Vec::with_capacity(nodes.len());
    for v in &nodes {
        let record = v.op_record().expect("internal nodes are op nodes");
        let parents = record
            .parents
            .iter()
            .map(&reference)
            .collect::<Result<Vec<_>>>()?;
        saved.push(SavedNode {
            op: record.name,
            value: v.value().clone(),
            saves: record.saves,
            vjp: record.vjp.clone(),
            parents,
        });
    }
    Ok(SavedOp {
        name: name.to_string(),
        input_dims: inputs.iter().map(|v| v.dims().to_vec()).collect(),
        output: reference(out)?,
        nodes: saved,
        rng: None,
    })
}

/// The replay of a saved [`named`] call: its nodes rebuilt around `inputs`.
fn rebuild(name: &str, inputs: &[&Variable]) -> Result<Variable> {
    let (checkpoint, saved, index) = FRAMES.with(|frames| {
        let mut frames = frames.borrow_mut();
        match frames.last_mut() {
            Some(Frame::Replay {
                checkpoint,
                saved,
                cursor,
                ..
            }) => {
                let index = *cursor;
                *cursor += 1;
                (checkpoint.clone(), saved.clone(), index)
            }
            _ => unreachable!("rebuild runs in a replay frame"),
        }
    });
    let diverged = |expected: String, got: String| CheckpointError::NamedOpReplayDiverged {
        name: checkpoint.clone(),
        expected,
        got,
    };
    let Some(op) = saved.ops.get(index) else {
        return Err(diverged(
            "no more (the forward run saved no further value)".into(),
            format!("{name:?}"),
        )
        .into());
    };
    let dims: Vec<Vec<usize>> = inputs.iter().map(|v| v.dims().to_vec()).collect();
    if op.name != name || op.input_dims != dims {
        return Err(diverged(
            format!("{:?} with inputs {:?}", op.name, op.input_dims),
            format!("{name:?} with inputs {dims:?}"),
        )
        .into());
    }
    let mut rebuilt: Vec<Variable> = Vec::with_capacity(op.nodes.len());
    let resolve = |r: &ParentRef, rebuilt: &[Variable]| match r {
        ParentRef::Input(i) => inputs[*i].clone(),
        ParentRef::Internal(i) => rebuilt[*i].clone(),
        ParentRef::Leaf(v) => v.clone(),
    };
    for node in &op.nodes {
        let parents = node.parents.iter().map(|p| resolve(p, &rebuilt)).collect();
        rebuilt.push(Variable::from_op_shared(
            node.op,
            node.value.clone(),
            parents,
            node.saves,
            node.vjp.clone(),
        ));
    }
    // The call drew random numbers at the forward run: advance the generator past them, as the
    // call would have (by the same number of blocks when it did not reseed, else to the state
    // it left).
    if let Some((before, after)) = op.rng {
        if before.seed == after.seed && after.offset >= before.offset {
            reserve(after.offset - before.offset)?;
        } else {
            set_rng_state(after);
        }
    }
    Ok(resolve(&op.output, &rebuilt))
}
