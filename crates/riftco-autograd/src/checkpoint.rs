//! Activation checkpointing: the replay primitive (forward keeps only the boundary; backward
//! replays the callable in a nested gradient context), after Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost".
//!
//! Forward: evaluate the callable normally on fresh leaves holding the inputs' values (one
//! input, or several with [`checkpoint_multi`]), verify its graph against the declared
//! boundary, keep the output value, discard the internal graph, and retain one checkpoint node
//! whose parents are the inputs and then the dependencies.
//!
//! Backward: evaluate the callable again on fresh leaves holding the saved inputs, verify shape,
//! device and boundary, compute the local VJP in a nested [`GradientContext`], hand each input
//! VJP and each dependency VJP to the outer pass, and release the replay graph. Replay never runs
//! `backward()` against live parameters, so public gradients are never touched by it.
//!
//! Random numbers: with [`CheckpointOptions::preserve_rng_state`] (the default) the replay runs
//! from the generator state ([`crate::rng`]) the forward run started from, and the thread's
//! state is restored afterwards. [`CheckpointOptions::determinism_check`] selects what the
//! replay is compared on ([`DeterminismCheck`]: the output shape only, shape and device, or
//! also a hash of the output values and the generator state); a mismatch is an error of the
//! VJP, so the backward pass commits nothing.
//!
//! What a callable may not do while it is replayed, each rejected with an error and nothing
//! committed: call `backward()` (or a variant) of any graph
//! ([`CheckpointError::BackwardInsideReplay`]: a replay commits no gradient of its own, so a
//! failed outer pass leaves every public gradient as it was); start a functional pass
//! ([`GradientContext::compute`]) that reaches the checkpoint being replayed
//! ([`CheckpointError::ReentrantReplay`]); or change a value the graph read, such as an optimizer
//! step or a weight load ([`AutogradError::StaleGraph`], checked for the input and dependencies
//! after the forward run and after each replay, and for the whole outer graph after every VJP
//! ran, before anything is committed).

use crate::context::{panic_message, GradientContext};
use crate::determinism::{self, tensor_hash, DeterminismCheck, RunRecord};
use crate::error::{AutogradError, CheckpointError, Result};
use crate::grad_mode::{enable_grad, is_grad_enabled};
use crate::named::{self, CheckpointOptions, SavedValues};
use crate::rng::{rng_state, set_rng_state, CounterFrameGuard, RestoreRng, RngState};
use crate::variable::{peek_next_id, Variable};
use riftco_tensor::{Device, Tensor};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

thread_local! {
    /// The checkpoints whose replay is running on this thread, innermost last: a token unique
    /// to each checkpoint node, and its name.
    static REPLAYING: RefCell<Vec<(u64, String)>> = const { RefCell::new(Vec::new()) };
}

static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

/// The checkpoints whose replay is running in the process, on any thread (their tokens). A
/// checkpoint node belongs to one graph, so a second replay of the same token while one runs is
/// a backward pass over that graph from another thread: from a thread the replay callable
/// started (which the thread-local marker cannot see), or a second concurrent backward pass.
/// Other graphs — two threads each training on their own loss, even of one model — never share
/// a token.
static REPLAYING_ANYWHERE: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());

/// The name of the innermost checkpoint whose replay is running on this thread, if any.
pub(crate) fn replay_in_progress() -> Option<String> {
    REPLAYING.with(|r| r.borrow().last().map(|(_, name)| name.clone()))
}

/// Marks a checkpoint's replay as running on this thread until dropped (also on errors and
/// panics).
struct ReplayMarker {
    token: u64,
}

impl ReplayMarker {
    fn enter(token: u64, name: &str) -> Result<Self> {
        REPLAYING.with(|r| -> Result<()> {
            let r = r.borrow();
            if r.iter().any(|(t, _)| *t == token) {
                return Err(CheckpointError::ReentrantReplay {
                    name: name.to_string(),
                }
                .into());
            }
            Ok(())
        })?;
        {
            let mut anywhere = REPLAYING_ANYWHERE.lock().unwrap_or_else(|e| e.into_inner());
            if anywhere.contains(&token) {
                return Err(CheckpointError::ReplayRunningElsewhere {
                    name: name.to_string(),
                }
                .into());
            }
            anywhere.push(token);
        }
        REPLAYING.with(|r| r.borrow_mut().push((token, name.to_string())));
        Ok(ReplayMarker { token })
    }
}

impl Drop for ReplayMarker {
    fn drop(&mut self) {
        REPLAYING.with(|r| {
            r.borrow_mut().pop();
        });
        let mut anywhere = REPLAYING_ANYWHERE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = anywhere.iter().rposition(|t| *t == self.token) {
            anywhere.swap_remove(i);
        }
    }
}

/// Checkpoints `recompute` applied to `input`, with the parameters it reads declared in
/// `dependencies`.
///
/// `recompute` must be deterministic and replay-safe (no mutable caches, no random numbers
/// other than riftco's generator, [`crate::rng`]): it runs once now and once more during
/// backward, and by default ([`CheckpointOptions::preserve_rng_state`]) the replay draws the
/// random numbers the forward run drew. Every dependency must be a distinct leaf
/// (trainable or frozen); frozen ones receive no gradient but are version-checked and their
/// input VJP still flows.
///
/// `recompute` must not call `backward()` (or a variant) during its replay, nor change any
/// value the graph read (no optimizer step, no weight load): see the module documentation.
///
/// # Errors
/// [`CheckpointError`] variants for: duplicate dependencies or non-leaf dependencies; a
/// pre-existing leaf read but not declared ([`CheckpointError::MissingDependency`]); a captured
/// graph node from outside the boundary; a new differentiable leaf created inside; an output not
/// depending on the input or on every dependency; at replay, a changed output shape or device,
/// a `backward()` inside the replay ([`CheckpointError::BackwardInsideReplay`]) or a pass
/// reaching this checkpoint again ([`CheckpointError::ReentrantReplay`]; from another thread,
/// such as one the callable started, [`CheckpointError::ReplayRunningElsewhere`]).
/// [`AutogradError::StaleGraph`] when the callable changed the input or a dependency (in the
/// forward run, or in the replay; the whole graph is checked again before backward commits).
/// Errors of `recompute` itself propagate unchanged; a panic in it becomes
/// [`AutogradError::Panic`].
pub fn checkpoint<F>(input: &Variable, dependencies: &[Variable], recompute: F) -> Result<Variable>
where
    F: Fn(&Variable) -> Result<Variable> + Send + Sync + 'static,
{
    checkpoint_with_name("checkpoint", input, dependencies, recompute)
}

/// [`checkpoint`] with a name used in error messages (for example `"layers.3"`).
pub fn checkpoint_with_name<F>(
    name: &str,
    input: &Variable,
    dependencies: &[Variable],
    recompute: F,
) -> Result<Variable>
where
    F: Fn(&Variable) -> Result<Variable> + Send + Sync + 'static,
{
    checkpoint_with_pass(name, input, dependencies, move |x, _| recompute(x))
}

/// Which run of a checkpoint callable this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointPass {
    /// The forward run: the returned value becomes the checkpoint's output.
    Forward,
    /// The replay during backward: only the recorded graph is differentiated (seeded with the
    /// output gradient); the returned Variable's value is never read. A callable may record its
    /// final ops with the graph-only variants of [`crate::ops`] (for example
    /// [`crate::ops::linear_graph_only`]) to skip kernels whose results nothing reads.
    Replay,
}

/// [`checkpoint_with_name`] whose callable is told which run it is ([`CheckpointPass`]). Both
/// runs must record the same computation; the replay may leave the *values* of ops that feed
/// only the returned output unevaluated. Same validation and errors as [`checkpoint`].
pub fn checkpoint_with_pass<F>(
    name: &str,
    input: &Variable,
    dependencies: &[Variable],
    recompute: F,
) -> Result<Variable>
where
    F: Fn(&Variable, CheckpointPass) -> Result<Variable> + Send + Sync + 'static,
{
    checkpoint_with_options(
        name,
        input,
        dependencies,
        &CheckpointOptions::default(),
        recompute,
    )
}

/// [`checkpoint_with_pass`] with [`CheckpointOptions`]: a non-empty `options.save` makes it a
/// selective checkpoint, whose forward run keeps the values of the [`crate::named()`] calls with
/// those names and whose replay reuses them instead of recomputing them (see
/// [`mod@crate::named`]'s module). Gradients are the plain checkpoint's, bit for bit.
///
/// `options.preserve_rng_state` and `options.determinism_check`: see [`CheckpointOptions`] and
/// [`DeterminismCheck`].
///
/// # Errors
/// Those of [`checkpoint`] (with [`DeterminismCheck::Off`] the replay's device is not
/// compared); with [`DeterminismCheck::Values`], at replay,
/// [`CheckpointError::ReplayValuesChanged`], [`CheckpointError::ReplayHashChanged`] and
/// [`CheckpointError::ReplayRngChanged`]; for a save set [`CheckpointError::SaveNameUnused`],
/// [`CheckpointError::NamedOpCapturedNode`] and [`CheckpointError::NamedOpReplayDiverged`].
pub fn checkpoint_with_options<F>(
    name: &str,
    input: &Variable,
    dependencies: &[Variable],
    options: &CheckpointOptions,
    recompute: F,
) -> Result<Variable>
where
    F: Fn(&Variable, CheckpointPass) -> Result<Variable> + Send + Sync + 'static,
{
    checkpoint_multi_with_options(
        name,
        std::slice::from_ref(input),
        dependencies,
        options,
        move |xs, pass| recompute(&xs[0], pass),
    )
}

/// [`checkpoint`] of a callable of several inputs (PyTorch's `checkpoint(fn, *args)`):
/// `recompute` receives one fresh leaf per input, in order, holding that input's value (at the
/// forward run and again at the replay). The checkpoint node's parents are the inputs, then the
/// dependencies; its VJP hands each input the gradient of its leaf.
///
/// Rule for inputs (the one-input rule, generalised): the output must depend on **every**
/// input, whether it requires grad or not ([`CheckpointError::InputUnused`] with one input,
/// [`CheckpointError::InputUnusedAt`] naming the position with several); an input that is not
/// needed is not passed. Inputs may be any Variables (op results or leaves), but each must be
/// distinct and none may also be a dependency.
///
/// # Errors
/// Those of [`checkpoint`]; [`CheckpointError::NoInputs`] for an empty `inputs`;
/// [`CheckpointError::DuplicateInput`] when the same Variable is passed twice;
/// [`CheckpointError::InputIsDependency`] when an input is also listed in `dependencies`.
pub fn checkpoint_multi<F>(
    inputs: &[Variable],
    dependencies: &[Variable],
    recompute: F,
) -> Result<Variable>
where
    F: Fn(&[Variable]) -> Result<Variable> + Send + Sync + 'static,
{
    checkpoint_multi_with_options(
        "checkpoint",
        inputs,
        dependencies,
        &CheckpointOptions::default(),
        move |xs, _| recompute(xs),
    )
}

/// [`checkpoint_with_options`] of a callable of several inputs (see [`checkpoint_multi`] for
/// the rule for inputs). Same validation and errors as [`checkpoint_with_options`] and
/// [`checkpoint_multi`].
pub fn checkpoint_multi_with_options<F>(
    name: &str,
    inputs: &[Variable],
    dependencies: &[Variable],
    options: &CheckpointOptions,
    recompute: F,
) -> Result<Variable>
where
    F: Fn(&[Variable], CheckpointPass) -> Result<Variable> + Send + Sync + 'static,
{
    let name = name.to_string();
    validate_inputs(&name, inputs, dependencies)?;
    validate_dependencies(&name, dependencies)?;
    if !is_grad_enabled() {
        return call(&recompute, inputs, CheckpointPass::Forward);
    }
    let boundary: Vec<&Variable> = inputs.iter().chain(dependencies).collect();
    let versions: Vec<u64> = boundary.iter().map(|v| v.value().version()).collect();
    let x0 = fresh_leaves(inputs);
    let start = peek_next_id();
    let save: Arc<[String]> = options.save.clone().into();
    let rng_before = rng_state();
    let forward = || enable_grad(|| call(&recompute, &x0, CheckpointPass::Forward));
    let counters = options.preserve_rng_state.then(CounterFrameGuard::record);
    let (out, saved) = if save.is_empty() {
        (named::plain(forward)?, SavedValues::default())
    } else {
        named::record(&name, &save, &x0, forward)?
    };
    let counters = counters.map(CounterFrameGuard::finish);
    let rng_after = rng_state();
    let saved = Arc::new(saved);
    check_unchanged(&boundary, &versions, "checkpoint callable (forward run)")?;
    let (used, graph) = validate_boundary(
        &name,
        &out,
        &x0,
        dependencies,
        start,
        options.prune_unused_dependencies,
    )?;
    // With `prune_unused_dependencies`, the boundary keeps only what the output depends on.
    let kept: Vec<Variable> = dependencies
        .iter()
        .zip(&used)
        .filter(|(_, &u)| u)
        .map(|(d, _)| d.clone())
        .collect();
    let dependencies = kept.as_slice();
    let versions: Vec<u64> = inputs
        .iter()
        .chain(dependencies)
        .map(|v| v.value().version())
        .collect();
    let value = out.value().clone();
    if value.is_placeholder() {
        return Err(CheckpointError::GraphOnlyForwardOutput { name }.into());
    }
    let check = options.determinism_check;
    let record = match check {
        DeterminismCheck::Values => Some(RunRecord {
            hash: tensor_hash(&value)?,
            rng_before,
            rng_after,
        }),
        DeterminismCheck::Off | DeterminismCheck::Metadata => None,
    };
    let spec = ReplaySpec {
        name,
        save,
        saved,
        versions,
        n_inputs: inputs.len(),
        forward_shape: value.dims().to_vec(),
        forward_device: value.device(),
        forward_graph: graph,
        check,
        preserve_rng_state: options.preserve_rng_state.then_some(rng_before),
        counters,
        record,
    };
    // Discard the internal block graph: only the output value is kept.
    drop(out);
    drop(x0);

    let mut parents = Vec::with_capacity(inputs.len() + dependencies.len());
    parents.extend(inputs.iter().cloned());
    parents.extend(dependencies.iter().cloned());
    let recompute = Arc::new(recompute);
    let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
    let on_replay_end = options.on_replay_end.clone();
    let vjp = move |parents: &[Variable], out: &Tensor, grad_out: &Tensor| {
        // Runs the hook when this VJP ends, returned or unwound.
        let _end = on_replay_end.as_ref().map(ReplayEnd);
        let _marker = ReplayMarker::enter(token, &spec.name)?;
        replay_vjp(&spec, &*recompute, parents, out, grad_out)
    };
    Ok(Variable::from_op("checkpoint", value, parents, vjp))
}

/// Runs a checkpoint's [`CheckpointOptions::on_replay_end`] when dropped.
struct ReplayEnd<'a>(&'a crate::named::ReplayEndHook);

impl Drop for ReplayEnd<'_> {
    fn drop(&mut self) {
        (self.0 .0)();
    }
}

/// One fresh leaf per input, holding its value (shared storage) and its `requires_grad`.
fn fresh_leaves(inputs: &[Variable]) -> Vec<Variable> {
    inputs
        .iter()
        .map(|i| Variable::leaf(i.value().clone(), i.requires_grad()))
        .collect()
}

/// What a checkpoint's replay needs from its forward run.
struct ReplaySpec {
    name: String,
    save: Arc<[String]>,
    saved: Arc<SavedValues>,
    /// The versions of the inputs and the dependencies at the forward run.
    versions: Vec<u64>,
    /// How many of the checkpoint node's parents are inputs (the rest are dependencies).
    n_inputs: usize,
    forward_shape: Vec<usize>,
    forward_device: Device,
    /// The forward run's graph inside the boundary (see [`GraphFingerprint`]).
    forward_graph: GraphFingerprint,
    check: DeterminismCheck,
    /// With `preserve_rng_state`: the generator state before the forward run.
    preserve_rng_state: Option<RngState>,
    /// With `preserve_rng_state`: the values the forward run drew through
    /// [`crate::rng::draw_counter`] (a model's dropout steps), handed out again at the replay.
    counters: Option<Arc<[u64]>>,
    /// With [`DeterminismCheck::Values`]: the forward run's output hash and generator states.
    record: Option<RunRecord>,
}

fn call<F>(f: &F, xs: &[Variable], pass: CheckpointPass) -> Result<Variable>
where
    F: Fn(&[Variable], CheckpointPass) -> Result<Variable>,
{
    catch_unwind(AssertUnwindSafe(|| f(xs, pass))).map_err(|payload| AutogradError::Panic {
        during: "checkpoint callable",
        message: panic_message(&*payload),
    })?
}

/// Fails with [`AutogradError::StaleGraph`] when a variable's version differs from `recorded`.
fn check_unchanged(vars: &[&Variable], recorded: &[u64], op: &'static str) -> Result<()> {
    for (v, &recorded) in vars.iter().zip(recorded) {
        let current = v.value().version();
        if current != recorded {
            return Err(AutogradError::StaleGraph {
                tensor: v.describe(),
                op,
                recorded,
                current,
            });
        }
    }
    Ok(())
}

fn replay_vjp<F>(
    spec: &ReplaySpec,
    recompute: &F,
    parents: &[Variable],
    forward_out: &Tensor,
    grad_out: &Tensor,
) -> Result<Vec<Option<Tensor>>>
where
    F: Fn(&[Variable], CheckpointPass) -> Result<Variable>,
{
    let name = spec.name.as_str();
    let (inputs, dependencies) = parents.split_at(spec.n_inputs.min(parents.len()));
    // The replay runs from the forward's generator state; the thread's own state comes back
    // when `_restore` drops (also on errors and panics).
    let _restore = spec.preserve_rng_state.map(|forward_state| {
        let restore = RestoreRng::save();
        set_rng_state(forward_state);
        restore
    });
    let _counters = spec.counters.clone().map(CounterFrameGuard::replay);
    // 1. fresh leaves holding the saved block inputs
    let x0 = fresh_leaves(inputs);
    let start = peek_next_id();
    // 2. evaluate the same block again, recording a local graph (with output values when they
    // are compared)
    let pass = match spec.check {
        DeterminismCheck::Values => CheckpointPass::Forward,
        DeterminismCheck::Off | DeterminismCheck::Metadata => CheckpointPass::Replay,
    };
    let rng_before = rng_state();
    let run = || enable_grad(|| call(recompute, &x0, pass));
    let out = if spec.save.is_empty() {
        named::plain(run)?
    } else {
        named::replay(name, &spec.save, &spec.saved, run)?
    };
    let rng_after = rng_state();
    // An optimizer step or a weight load inside the callable: the replay read other values
    // than the forward did.
    let boundary: Vec<&Variable> = parents.iter().collect();
    check_unchanged(&boundary, &spec.versions, "checkpoint replay")?;
    // Checked at every level: a replay of another shape would hand a wrong-shaped gradient on.
    if out.dims() != spec.forward_shape.as_slice() {
        return Err(CheckpointError::ReplayShapeChanged {
            name: name.to_string(),
            forward: spec.forward_shape.clone(),
            replay: out.dims().to_vec(),
        }
        .into());
    }
    if spec.check != DeterminismCheck::Off && out.value().device() != spec.forward_device {
        return Err(CheckpointError::ReplayDeviceChanged {
            name: name.to_string(),
            forward: spec.forward_device,
            replay: out.value().device(),
        }
        .into());
    }
    let (_, graph) = validate_boundary(name, &out, &x0, dependencies, start, false)?;
    if spec.check != DeterminismCheck::Off && graph != spec.forward_graph {
        return Err(CheckpointError::ReplayGraphChanged {
            name: name.to_string(),
            forward_ops: spec.forward_graph.nodes,
            replay_ops: graph.nodes,
            detail: if graph.nodes == spec.forward_graph.nodes {
                ", the same count with other ops or shapes"
            } else {
                ""
            },
        }
        .into());
    }
    if let Some(forward) = &spec.record {
        let replay = RunRecord {
            hash: tensor_hash(out.value())?,
            rng_before,
            rng_after,
        };
        determinism::compare_values(
            name,
            spec.preserve_rng_state.is_some(),
            forward,
            &replay,
            forward_out,
            out.value(),
        )?;
    }
    if !out.requires_grad() {
        return Ok(vec![None; parents.len()]);
    }
    // 3. local VJP in a nested, isolated context
    // The replay graph is this pass's alone: each node's record goes as soon as its VJP ran.
    let mut local = GradientContext::compute_with(&out, grad_out.clone(), false)?;
    // 4.–5. input VJPs and dependency VJPs go to the outer pass (which accumulates them)
    let mut grads = Vec::with_capacity(parents.len());
    for x in &x0 {
        grads.push(local.take(x));
    }
    for d in dependencies {
        grads.push(local.take(d));
    }
    // 6. the replay graph is released when `out`, `x0` and `local` drop here
    Ok(grads)
}

/// At least one input, each a distinct Variable, none also a dependency.
fn validate_inputs(name: &str, inputs: &[Variable], dependencies: &[Variable]) -> Result<()> {
    if inputs.is_empty() {
        return Err(CheckpointError::NoInputs {
            name: name.to_string(),
        }
        .into());
    }
    let mut seen: HashMap<u64, usize> = HashMap::new();
    for (i, x) in inputs.iter().enumerate() {
        if let Some(&first) = seen.get(&x.id()) {
            return Err(CheckpointError::DuplicateInput {
                name: name.to_string(),
                input: x.describe(),
                first,
                second: i,
            }
            .into());
        }
        seen.insert(x.id(), i);
    }
    if let Some(d) = dependencies.iter().find(|d| seen.contains_key(&d.id())) {
        return Err(CheckpointError::InputIsDependency {
            name: name.to_string(),
            input: d.describe(),
            index: seen[&d.id()],
        }
        .into());
    }
    Ok(())
}

fn validate_dependencies(name: &str, dependencies: &[Variable]) -> Result<()> {
    let mut seen: HashSet<u64> = HashSet::new();
    for d in dependencies {
        if !d.is_leaf() {
            return Err(CheckpointError::DependencyNotLeaf {
                name: name.to_string(),
                dependency: d.describe(),
                op: d.op_name(),
            }
            .into());
        }
        if !seen.insert(d.id()) {
            return Err(CheckpointError::DuplicateDependency {
                name: name.to_string(),
                dependency: d.describe(),
            }
            .into());
        }
    }
    Ok(())
}

/// Verifies that the graph of `out` reaches outside itself only through the input leaves `x0`
/// and the declared dependencies, creates no new differentiable leaf, and uses every input and
/// every dependency (with `allow_unused`, a dependency may go unused). Returns which
/// dependencies the output depends on. Nodes with id `>= start` were created by the callable.
fn validate_boundary(
    name: &str,
    out: &Variable,
    x0: &[Variable],
    dependencies: &[Variable],
    start: u64,
    allow_unused: bool,
) -> Result<(Vec<bool>, GraphFingerprint)> {
    let inputs: HashMap<u64, usize> = x0.iter().enumerate().map(|(i, x)| (x.id(), i)).collect();
    let declared: HashMap<u64, usize> = dependencies
        .iter()
        .enumerate()
        .map(|(i, d)| (d.id(), i))
        .collect();
    let mut used = vec![false; dependencies.len()];
    let mut input_used = vec![false; x0.len()];
    let mut error: Option<CheckpointError> = None;
    let boundary = |v: &Variable| {
        v.id() < start || declared.contains_key(&v.id()) || inputs.contains_key(&v.id())
    };
    let mut graph = GraphFingerprint::default();
    out.walk(&boundary, &mut |v| {
        if error.is_some() {
            return;
        }
        if v.id() >= start {
            graph.add(v);
        }
        if let Some(&i) = inputs.get(&v.id()) {
            input_used[i] = true;
        } else if let Some(&i) = declared.get(&v.id()) {
            used[i] = true;
        } else if v.id() < start {
            error = Some(if v.is_leaf() {
                CheckpointError::MissingDependency {
                    name: name.to_string(),
                    leaf: v.describe(),
                }
            } else {
                CheckpointError::CapturedExternalNode {
                    name: name.to_string(),
                    node: v.describe(),
                    op: v.op_name(),
                }
            });
        } else if v.is_leaf() && v.requires_grad() {
            error = Some(CheckpointError::UndeclaredLeaf {
                name: name.to_string(),
                leaf: v.describe(),
            });
        }
    });
    if let Some(e) = error {
        return Err(e.into());
    }
    if let Some(i) = input_used.iter().position(|u| !u) {
        return Err(if x0.len() == 1 {
            CheckpointError::InputUnused {
                name: name.to_string(),
            }
        } else {
            CheckpointError::InputUnusedAt {
                name: name.to_string(),
                index: i,
                count: x0.len(),
            }
        }
        .into());
    }
    if let Some(i) = used.iter().position(|u| !u).filter(|_| !allow_unused) {
        return Err(CheckpointError::DependencyUnused {
            name: name.to_string(),
            dependency: dependencies[i].describe(),
        }
        .into());
    }
    Ok((used, graph))
}

/// What the replay's graph is compared with the forward run's on (with
/// [`DeterminismCheck::Metadata`] and `Values`): the number of nodes the callable recorded
/// inside the boundary and an order-independent hash of their op names and shapes. A replay
/// that takes another path (a module switched to `eval()` skipping its dropout, a Python flag)
/// records another graph, whose gradients would not belong to the forward's output. The
/// graph-only op variants of the replay's tail record the same op names and shapes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct GraphFingerprint {
    nodes: usize,
    hash: u64,
}

impl GraphFingerprint {
    fn add(&mut self, v: &Variable) {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        v.op_name().hash(&mut h);
        v.dims().hash(&mut h);
        self.nodes += 1;
        // A sum: the walk order does not matter.
        self.hash = self.hash.wrapping_add(h.finish());
    }
}
