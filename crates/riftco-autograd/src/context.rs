//! Backward passes in isolated gradient contexts.
//!
//! A pass never writes a public gradient while it runs: VJP results accumulate into a
//! [`GradientContext`] private to the pass, and only [`Variable::backward`] (and its variants)
//! commit the context's leaf gradients, after the whole pass succeeded. A checkpoint replay runs
//! a nested pass with its own context and hands its input and dependency VJPs to the outer one.

use crate::error::{AutogradError, Result};
use crate::variable::{Node, OpRecord, Variable};
use riftco_tensor::{MemoryCategory, Tensor, TensorError};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Weak};

struct Slot {
    var: Variable,
    grad: Tensor,
    // Whether the context allocated `grad` itself (then it may be updated in place); VJP rules
    // may return tensors that alias other gradients (for example `add` passes its upstream
    // gradient to both parents).
    owned: bool,
}

/// Receives a trainable leaf's gradient in a backward pass as soon as the pass has summed all of
/// it (the leaf's last consumer ran): see [`Variable::backward_with_hook`]. Returns `Some` to
/// commit a gradient at the end of the pass as usual, `None` when the hook took it over.
pub type LeafGradientHook<'a> = dyn FnMut(&Variable, Tensor) -> Result<Option<Tensor>> + 'a;

/// The gradients of one backward pass, keyed by leaf. Returned by [`GradientContext::compute`]
/// (the functional API, which commits nothing).
#[derive(Default)]
pub struct GradientContext {
    leaves: HashMap<u64, Slot>,
}

impl GradientContext {
    /// Runs a backward pass from `root` seeded with `seed` (same shape as `root`) and returns the
    /// gradients of every leaf that requires grad and was reached. Public gradients are not
    /// touched.
    ///
    /// # Errors
    /// [`AutogradError::StaleGraph`] when a value read at forward changed (checked for the whole
    /// graph before any VJP runs, and again after the last one, so that a checkpoint replay
    /// that changed a value is caught before anything is returned or committed),
    /// [`AutogradError::NoGradient`] when `root` does not require grad, shape errors for a bad
    /// seed, and any error of a VJP or checkpoint replay (among them
    /// [`crate::CheckpointError::ReentrantReplay`] when this pass, started inside a replay,
    /// reaches the checkpoint being replayed).
    pub fn compute(root: &Variable, seed: Tensor) -> Result<Self> {
        Self::compute_with(root, seed, true)
    }

    /// [`GradientContext::compute`] choosing whether the graph is kept: with `retain_graph`
    /// false, each op node's record (its parents, its VJP and the values the VJP holds) is
    /// released as soon as its VJP has run, so the memory of the part already differentiated
    /// is freed during the pass (PyTorch's `retain_graph=False`); differentiating the graph
    /// again is then [`AutogradError::GraphFreed`]. The values read by VJPs that ran are
    /// version-checked after the pass all the same.
    ///
    /// # Errors
    /// As [`GradientContext::compute`]; [`AutogradError::GraphFreed`] when the graph reaches a
    /// node an earlier freeing pass differentiated (checked before any VJP runs).
    pub fn compute_with(root: &Variable, seed: Tensor, retain_graph: bool) -> Result<Self> {
        Self::compute_hooked(root, seed, retain_graph, None)
    }

    /// [`GradientContext::compute_with`] handing each leaf gradient to `hook` when complete
    /// (see [`Variable::backward_with_hook`]); what the hook returns stays in the context.
    ///
    /// # Errors
    /// As [`GradientContext::compute_with`], and the hook's errors (the pass stops there).
    pub fn compute_hooked(
        root: &Variable,
        seed: Tensor,
        retain_graph: bool,
        hook: Option<&mut LeafGradientHook<'_>>,
    ) -> Result<Self> {
        if !root.requires_grad() {
            return Err(AutogradError::NoGradient {
                what: root.describe(),
            });
        }
        if seed.dims() != root.dims() {
            return Err(TensorError::ShapeMismatch {
                op: "backward (seed gradient)",
                expected: root.dims().to_vec(),
                got: seed.dims().to_vec(),
            }
            .into());
        }
        let pending = validate_and_count(root)?;
        let mut watches = Vec::new();
        let ctx = run(
            root,
            seed,
            pending,
            (!retain_graph).then_some(&mut watches),
            hook,
        )?;
        // Checkpoint replays run user code during the pass: a value read by a VJP that already
        // ran may have changed since.
        check_versions(root)?;
        watches.iter().try_for_each(Watch::check)?;
        Ok(ctx)
    }

    /// The gradient of `leaf` in this pass, if it was reached.
    pub fn get(&self, leaf: &Variable) -> Option<&Tensor> {
        self.leaves.get(&leaf.id()).map(|s| &s.grad)
    }

    /// Removes and returns the gradient of `leaf`.
    pub fn take(&mut self, leaf: &Variable) -> Option<Tensor> {
        self.leaves.remove(&leaf.id()).map(|s| s.grad)
    }

    /// Number of leaves with a gradient.
    pub fn len(&self) -> usize {
        self.leaves.len()
    }

    /// Whether no leaf received a gradient.
    pub fn is_empty(&self) -> bool {
        self.leaves.is_empty()
    }

    /// Commits every leaf gradient: replacing the public gradient, or adding to it when
    /// `accumulate`. Every new gradient is computed first (the fallible part: copies and sums);
    /// only then are they all published, so a commit is all-or-nothing.
    ///
    /// # Errors
    /// Out of memory (or a device error) while computing the gradients; nothing is published.
    pub(crate) fn commit(self, accumulate: bool) -> Result<()> {
        let mut ready = Vec::with_capacity(self.leaves.len());
        for (_, slot) in self.leaves {
            let grad = if slot.owned || slot.grad.is_exclusive() {
                slot.grad
            } else {
                slot.grad.try_deep_clone(MemoryCategory::Gradient)?
            };
            let grad = match slot.var.grad() {
                Some(old) if accumulate && old.dims() == grad.dims() => {
                    let sum = old.try_deep_clone(MemoryCategory::Gradient)?;
                    let op = "gradient accumulation";
                    crate::ops::backend_t(op, &[&sum, &grad])?.add_assign(op, &sum, &grad)?;
                    sum
                }
                _ => grad,
            };
            ready.push((slot.var, grad));
        }
        for (var, grad) in ready {
            var.set_grad(grad);
        }
        Ok(())
    }
}

/// The stale-graph error of the first parent of `v` whose value changed since `v` was recorded.
fn stale_parent(op: &OpRecord) -> Option<AutogradError> {
    op.parents
        .iter()
        .zip(&op.parent_versions)
        .find_map(|(p, &recorded)| {
            let current = p.value().version();
            (current != recorded).then(|| AutogradError::StaleGraph {
                tensor: p.describe(),
                op: op.name,
                recorded,
                current,
            })
        })
}

/// Checks every recorded parent version in the graph (all nodes, also those that do not require
/// grad) and counts, for each node that requires grad, how many consumers will send it a
/// gradient.
fn validate_and_count(root: &Variable) -> Result<HashMap<u64, usize>> {
    let mut pending: HashMap<u64, usize> = HashMap::new();
    let mut error: Option<AutogradError> = None;
    root.walk(&|_| false, &mut |v| {
        if error.is_some() {
            return;
        }
        let Some(op) = v.op_record() else {
            if v.is_graph_freed() && v.requires_grad() {
                error = Some(AutogradError::GraphFreed { what: v.describe() });
            }
            return;
        };
        error = stale_parent(&op);
        if error.is_none() && v.requires_grad() {
            for p in op.parents.iter().filter(|p| p.requires_grad()) {
                *pending.entry(p.id()).or_insert(0) += 1;
            }
        }
    });
    match error {
        Some(e) => Err(e),
        None => Ok(pending),
    }
}

/// Checks every recorded parent version in the graph, as [`validate_and_count`] does.
fn check_versions(root: &Variable) -> Result<()> {
    let mut error: Option<AutogradError> = None;
    root.walk(&|_| false, &mut |v| {
        if error.is_none() {
            error = v.op_record().and_then(|op| stale_parent(&op));
        }
    });
    error.map_or(Ok(()), Err)
}

/// A value a VJP read, watched after a freeing pass released the record that read it: the
/// node (weakly: a node nobody keeps can no longer change) and the version recorded at forward.
struct Watch {
    node: Weak<Node>,
    recorded: u64,
    op: &'static str,
}

impl Watch {
    fn check(&self) -> Result<()> {
        let Some(node) = self.node.upgrade() else {
            return Ok(());
        };
        let var = Variable(node);
        let current = var.value().version();
        if current == self.recorded {
            return Ok(());
        }
        Err(AutogradError::StaleGraph {
            tensor: var.describe(),
            op: self.op,
            recorded: self.recorded,
            current,
        })
    }
}

/// Runs the VJPs in dependency order. With `watches` (a freeing pass) each node's record is
/// taken out of the graph before its VJP runs and dropped right after, its parents' recorded
/// versions going to `watches`.
fn run(
    root: &Variable,
    seed: Tensor,
    mut pending: HashMap<u64, usize>,
    mut watches: Option<&mut Vec<Watch>>,
    mut hook: Option<&mut LeafGradientHook<'_>>,
) -> Result<GradientContext> {
    // Gradients of op nodes waiting for their VJP; removed (and freed) as soon as it runs.
    let mut inner: HashMap<u64, Slot> = HashMap::new();
    let mut ctx = GradientContext::default();
    let mut ready: Vec<Variable> = Vec::new();
    let root_slot = Slot {
        var: root.clone(),
        grad: seed,
        owned: false,
    };
    if root.is_leaf() {
        ctx.leaves.insert(root.id(), root_slot);
        return Ok(ctx);
    }
    inner.insert(root.id(), root_slot);
    ready.push(root.clone());
    while let Some(node) = ready.pop() {
        let record =
            match watches.as_deref_mut() {
                Some(watches) => {
                    let record = node.take_op_record();
                    if let Some(r) = &record {
                        watches.extend(r.parents.iter().zip(&r.parent_versions).map(|(p, &v)| {
                            Watch {
                                node: Arc::downgrade(&p.0),
                                recorded: v,
                                op: r.name,
                            }
                        }));
                    }
                    record
                }
                None => node.op_record(),
            };
        let op = record.ok_or_else(|| AutogradError::GraphFreed {
            what: node.describe(),
        })?;
        let slot = inner.remove(&node.id());
        let freeing = watches.is_some();
        if freeing {
            // Every consumer's VJP has run: a value its own VJP does not read goes before that
            // VJP runs, not after (the engine's handles: `node` and the slot's).
            node.release_value_kept_only_by(1 + usize::from(slot.is_some()), &op);
        }
        // A node every consumer sent `None` has no gradient: its parents get none from it,
        // but their pending counts must still fall.
        let grads = match slot {
            None => vec![None; op.parents.len()],
            Some(slot) => catch_unwind(AssertUnwindSafe(|| {
                (op.vjp)(&op.parents, node.value(), &slot.grad)
            }))
            .map_err(|payload| AutogradError::Panic {
                during: op.name,
                message: panic_message(&*payload),
            })??,
        };
        if freeing {
            // This VJP never runs again: the values it read have one reader less.
            op.release_reads(&node);
        }
        if grads.len() != op.parents.len() {
            return Err(AutogradError::Panic {
                during: op.name,
                message: format!(
                    "VJP returned {} gradients for {} parents",
                    grads.len(),
                    op.parents.len()
                ),
            });
        }
        for (p, g) in op.parents.iter().zip(grads) {
            if !p.requires_grad() {
                continue;
            }
            if let Some(g) = g {
                if g.dims() != p.dims() {
                    return Err(TensorError::ShapeMismatch {
                        op: op.name,
                        expected: p.dims().to_vec(),
                        got: g.dims().to_vec(),
                    }
                    .into());
                }
                let map = if p.is_leaf() {
                    &mut ctx.leaves
                } else {
                    &mut inner
                };
                accumulate(map, p, g)?;
            }
            let count = pending.get_mut(&p.id()).expect("counted in validation");
            *count -= 1;
            if *count == 0 && !p.is_leaf() {
                ready.push(p.clone());
            }
            if let (0, true, Some(hook)) = (*count, p.is_leaf(), hook.as_deref_mut()) {
                if let Some(slot) = ctx.leaves.remove(&p.id()) {
                    // The hook may keep the tensor: hand over a buffer of the pass's own.
                    let grad = if slot.owned || slot.grad.is_exclusive() {
                        slot.grad
                    } else {
                        slot.grad.try_deep_clone(MemoryCategory::Gradient)?
                    };
                    if let Some(grad) = hook(&slot.var, grad)? {
                        ctx.leaves.insert(
                            p.id(),
                            Slot {
                                var: slot.var,
                                grad,
                                owned: true,
                            },
                        );
                    }
                }
            }
        }
    }
    Ok(ctx)
}

fn accumulate(map: &mut HashMap<u64, Slot>, var: &Variable, g: Tensor) -> Result<()> {
    match map.get_mut(&var.id()) {
        None => {
            map.insert(
                var.id(),
                Slot {
                    var: var.clone(),
                    grad: g,
                    owned: false,
                },
            );
        }
        Some(slot) => {
            let op = "backward (gradient sum)";
            let be = crate::ops::backend_t(op, &[&slot.grad, &g])?;
            if slot.owned || slot.grad.is_exclusive() {
                be.add_assign(op, &slot.grad, &g)?;
            } else {
                // The first gradient may alias another tensor: sum out of place (one pass) into a
                // buffer of the context's own. `x + x` hands over one tensor twice: read it once.
                slot.grad = if g.same_storage(&slot.grad) {
                    be.scale(op, &g, 2.0, MemoryCategory::Gradient)?
                } else {
                    be.add(op, &slot.grad, &g, MemoryCategory::Gradient)?
                }
                .reshape(g.shape().clone())?;
            }
            slot.owned = true;
        }
    }
    Ok(())
}

/// The message of a caught panic payload (`&str` or `String`), for turning panics into errors
/// at every boundary (VJPs, checkpoint callables, the C ABI, the Python module).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// How [`Variable::backward_with`] runs: PyTorch's `Tensor.backward(gradient, retain_graph)`,
/// plus gradient accumulation.
#[derive(Clone, Debug)]
pub struct BackwardOptions {
    /// The seed gradient, of the output's shape; `None` seeds a one-element output with 1.
    pub gradient: Option<Tensor>,
    /// Keep the graph (the default, `true`): a second backward pass on an unchanged graph
    /// gives the same gradients. `false` frees each node's record (parents, VJP, saved values)
    /// as soon as its VJP has run, so memory falls during the pass (a graph whose tail runs
    /// plainly peaks at the larger of the tail and one checkpoint replay, not their sum); a
    /// second pass is then [`AutogradError::GraphFreed`].
    pub retain_graph: bool,
    /// Add the gradients to the committed ones instead of replacing them.
    pub accumulate: bool,
}

impl Default for BackwardOptions {
    fn default() -> Self {
        Self {
            gradient: None,
            retain_graph: true,
            accumulate: false,
        }
    }
}

impl BackwardOptions {
    /// The default options with `retain_graph = false` (the form training loops use).
    pub fn freeing() -> Self {
        Self {
            retain_graph: false,
            ..Self::default()
        }
    }
}

impl Variable {
    /// Backpropagates from this single-element output (seed gradient 1) in a fresh, isolated
    /// pass, then replaces the public gradient of every trainable leaf reached. Calling it again
    /// on the same unchanged graph gives the same gradients (not doubled).
    ///
    /// Not allowed inside a checkpoint replay: a checkpoint callable that calls it (during the
    /// outer backward pass) gets [`crate::CheckpointError::BackwardInsideReplay`] and nothing is
    /// committed, so a failed outer pass still leaves every public gradient as it was. The same
    /// holds for [`Variable::backward_with_grad`], [`Variable::backward_accumulate`] and
    /// [`Variable::backward_with`].
    ///
    /// # Errors
    /// [`AutogradError::NotScalar`] for multi-element outputs,
    /// [`crate::CheckpointError::BackwardInsideReplay`] inside a checkpoint replay, plus
    /// everything [`GradientContext::compute`] returns. On error no public gradient changes.
    pub fn backward(&self) -> Result<()> {
        self.backward_with(BackwardOptions::default())
    }

    /// Like [`Variable::backward`] with an explicit seed gradient of the output's shape.
    pub fn backward_with_grad(&self, seed: Tensor) -> Result<()> {
        self.backward_with(BackwardOptions {
            gradient: Some(seed),
            ..BackwardOptions::default()
        })
    }

    /// Gradient accumulation across micro-batches: runs a fresh isolated pass like
    /// [`Variable::backward`], then *adds* its gradients to the public ones instead of replacing
    /// them. Call [`Variable::zero_grad`] on the parameters (or use the first micro-batch's plain
    /// `backward()`) to start a new accumulation.
    pub fn backward_accumulate(&self) -> Result<()> {
        self.backward_with(BackwardOptions {
            accumulate: true,
            ..BackwardOptions::default()
        })
    }

    /// A backward pass with [`BackwardOptions`] (seed gradient, `retain_graph`, accumulation).
    /// With `retain_graph = false` a failed pass still commits nothing, but the part of the
    /// graph it differentiated is freed (as in PyTorch): run the forward again.
    ///
    /// # Errors
    /// As [`Variable::backward`]; [`AutogradError::GraphFreed`] when an earlier freeing pass
    /// differentiated this graph.
    pub fn backward_with(&self, options: BackwardOptions) -> Result<()> {
        self.backward_hooked(options, None)
    }

    /// [`Variable::backward_with`] handing each trainable leaf's gradient to `hook` as soon as
    /// the pass has summed all of it (its last consumer ran), in the pass's order (the same for
    /// the same graph, so every data-parallel rank reaches the leaves in one order). What the
    /// hook returns (`Some`) is committed at the end as usual; what it takes (`None`) never
    /// reaches the public gradients. ZeRO-2 reduce-scatters gradients bucket by bucket this
    /// way, so a whole gradient is never held (PyTorch's `register_post_accumulate_grad_hook`).
    ///
    /// The pass stays all-or-nothing for the public gradients, but not for what the hook did:
    /// after an error later in the pass, the leaves handed over stay handed over.
    ///
    /// # Errors
    /// As [`Variable::backward_with`], and the hook's first error (the pass stops there).
    pub fn backward_with_hook(
        &self,
        options: BackwardOptions,
        hook: &mut LeafGradientHook<'_>,
    ) -> Result<()> {
        self.backward_hooked(options, Some(hook))
    }

    fn backward_hooked(
        &self,
        options: BackwardOptions,
        hook: Option<&mut LeafGradientHook<'_>>,
    ) -> Result<()> {
        if let Some(name) = crate::checkpoint::replay_in_progress() {
            return Err(crate::CheckpointError::BackwardInsideReplay { name }.into());
        }
        let seed = match options.gradient {
            Some(s) => s,
            None => {
                if self.value().numel() != 1 {
                    return Err(AutogradError::NotScalar {
                        shape: self.dims().to_vec(),
                    });
                }
                Tensor::try_full_on(
                    self.value().shape().clone(),
                    1.0,
                    MemoryCategory::Gradient,
                    self.value().device(),
                )?
            }
        };
        let ctx = GradientContext::compute_hooked(self, seed, options.retain_graph, hook)?;
        ctx.commit(options.accumulate)
    }
}
