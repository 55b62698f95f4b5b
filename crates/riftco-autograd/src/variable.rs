//! Graph nodes.

use crate::error::Result;
use riftco_tensor::Tensor;
use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Allocates a fresh node id. Ids increase monotonically, so a node created after another has
/// a larger id (checkpoint uses this to tell nodes made inside its callable from older ones).
pub(crate) fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// The id the next node will get.
pub(crate) fn peek_next_id() -> u64 {
    NEXT_ID.load(Ordering::Relaxed)
}

/// A vector–Jacobian product rule: given the node's parents, its forward output and the
/// gradient of the output, return one gradient per parent (`None` for parents that do not
/// require grad, or that receive nothing). The backward pass drops its handle to the gradient
/// right after the rule ran, so a rule may write its result over the gradient when
/// [`Tensor::is_exclusive`] says no other handle shares it (and return that tensor).
pub type VjpFn =
    dyn Fn(&[Variable], &Tensor, &Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync + 'static;

/// Which forward values an op's VJP reads (the data, not the shape or device): its own output
/// and which of its parents. PyTorch's "saved tensors": a value that no VJP reads is released
/// as soon as nothing but the graph refers to its node (see [`Variable`]), so the graph keeps
/// only what backward needs. Declaring too little is never a silent wrong result: a VJP that
/// reads a released value fails with `TensorError::NoData`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Saves {
    output: bool,
    /// Bit `i`: the VJP reads parent `i` (parents from index 64 on always count as read).
    parents: u64,
}

impl Saves {
    /// The VJP reads its output and every parent (the conservative default of
    /// [`Variable::from_op`]).
    pub const ALL: Saves = Saves {
        output: true,
        parents: u64::MAX,
    };
    /// The VJP reads no forward value (for example addition, or a rotation).
    pub const NOTHING: Saves = Saves {
        output: false,
        parents: 0,
    };

    /// The VJP reads the parents at `indices` (and not its output).
    pub const fn parents(indices: &[usize]) -> Saves {
        let mut parents = 0u64;
        let mut i = 0;
        while i < indices.len() {
            if indices[i] < 64 {
                parents |= 1u64 << indices[i];
            }
            i += 1;
        }
        Saves {
            output: false,
            parents,
        }
    }

    /// These reads, and also the op's own output.
    pub const fn and_output(self) -> Saves {
        Saves {
            output: true,
            parents: self.parents,
        }
    }

    /// Whether the VJP reads its own output.
    pub fn reads_output(self) -> bool {
        self.output
    }

    /// Whether the VJP reads parent `index`.
    pub fn reads_parent(self, index: usize) -> bool {
        index >= 64 || self.parents & (1u64 << index) != 0
    }
}

pub(crate) struct OpRecord {
    pub(crate) name: &'static str,
    pub(crate) parents: Vec<Variable>,
    pub(crate) parent_versions: Vec<u64>,
    pub(crate) saves: Saves,
    pub(crate) vjp: Arc<VjpFn>,
}

impl OpRecord {
    /// After this record's VJP ran for the last time (a freeing backward pass released the
    /// record of `node`): one reader less for each value it read, so that a value no VJP will
    /// read again can be released.
    pub(crate) fn release_reads(&self, node: &Variable) {
        for (i, p) in self.parents.iter().enumerate() {
            if self.saves.reads_parent(i) {
                p.0.readers.fetch_sub(1, Ordering::AcqRel);
            }
        }
        if self.saves.reads_output() {
            node.0.readers.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

pub(crate) struct Node {
    pub(crate) id: u64,
    pub(crate) value: Tensor,
    pub(crate) requires_grad: bool,
    /// The op name; `None` for leaves. Stays after a freeing backward released the record.
    pub(crate) op_name: Option<&'static str>,
    /// The op record: `None` for leaves, and for op nodes whose record a backward pass with
    /// `retain_graph = false` released.
    pub(crate) op: Mutex<Option<Arc<OpRecord>>>,
    pub(crate) grad: Mutex<Option<Tensor>>,
    pub(crate) name: Mutex<Option<String>>,
    /// How many VJPs read this node's value (its own, and its consumers').
    pub(crate) readers: AtomicUsize,
    /// How many op records hold this node as a parent (one per occurrence).
    pub(crate) graph_refs: AtomicUsize,
}

impl Node {
    fn op_lock(&self) -> MutexGuard<'_, Option<Arc<OpRecord>>> {
        self.op.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Unlinks a released record's parents: one graph reference less each.
fn unlink(record: &OpRecord) {
    for p in &record.parents {
        p.0.graph_refs.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Node {
    // Dropping a long chain of Arc<Node> recursively would overflow the stack on deep graphs;
    // unlink parents iteratively instead.
    fn drop(&mut self) {
        let Some(op) = self.op.get_mut().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        let mut stack: Vec<Variable> = Vec::new();
        let release = |op: Arc<OpRecord>, stack: &mut Vec<Variable>| {
            if let Ok(mut record) = Arc::try_unwrap(op) {
                unlink(&record);
                stack.append(&mut record.parents);
            }
        };
        release(op, &mut stack);
        while let Some(mut var) = stack.pop() {
            if let Some(node) = Arc::get_mut(&mut var.0) {
                if let Some(op) = node.op.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
                    release(op, &mut stack);
                }
            }
        }
    }
}

/// A node of the computation graph: a forward value, and for op nodes the parents, the
/// versions of the values read and the VJP rule.
///
/// Cloning is cheap (`Arc`). The graph keeps alive everything backward needs, so dropping the
/// model or the inputs after a forward pass does not break the backward pass.
///
/// # What the graph keeps
/// An op node's value is released (its memory freed; its shape, device and version stay, and
/// reading it is `TensorError::NoData`) once no `Variable` handle outside the graph refers to
/// the node, when no VJP reads it ([`Saves`]) and no other tensor shares its storage. Values a
/// VJP reads stay until the graph is dropped, or until a backward pass with
/// `retain_graph = false` ran that VJP ([`BackwardOptions`](crate::BackwardOptions)); such a
/// pass also releases a node's own value before the node's VJP runs when that VJP does not
/// read it and no other will.
#[derive(Clone)]
pub struct Variable(pub(crate) Arc<Node>);

/// Whether `node`'s value is needed by nothing but the graph, which never reads it: an op node
/// that no VJP reads, referred to only by op records (`extra` more handles are being dropped
/// by the caller).
fn only_the_graph_keeps(node: &Arc<Node>, extra: usize) -> bool {
    node.op_name.is_some()
        && node.readers.load(Ordering::Acquire) == 0
        && Arc::strong_count(node) - extra == node.graph_refs.load(Ordering::Acquire)
}

impl Drop for Variable {
    fn drop(&mut self) {
        if !only_the_graph_keeps(&self.0, 1) || Arc::strong_count(&self.0) == 1 {
            return;
        }
        if self.0.value.release_if_exclusive() {
            return;
        }
        // A view (a reshape shares its input's storage): release the storage when every node
        // of the chain of views down to the one that allocated it is kept by the graph alone
        // and nothing else shares it.
        let mut chain = 1;
        let mut record = self.0.op_lock().clone();
        while let Some(r) = record {
            let Some(parent) = r.parents.first() else {
                return;
            };
            if r.name != "reshape" || !parent.value().same_storage(&self.0.value) {
                return;
            }
            if !only_the_graph_keeps(&parent.0, 0) {
                return;
            }
            chain += 1;
            if self.0.value.storage_handles() == chain {
                self.0.value.release_shared();
                return;
            }
            record = parent.0.op_lock().clone();
        }
    }
}

impl Variable {
    /// A leaf: a trainable parameter (`requires_grad = true`), a frozen parameter or an input.
    pub fn leaf(value: Tensor, requires_grad: bool) -> Self {
        Self(Arc::new(Node {
            id: next_id(),
            value,
            requires_grad,
            op_name: None,
            op: Mutex::new(None),
            grad: Mutex::new(None),
            name: Mutex::new(None),
            readers: AtomicUsize::new(0),
            graph_refs: AtomicUsize::new(0),
        }))
    }

    /// A named leaf (the name appears in error messages, e.g. stale-graph errors).
    pub fn named_leaf(value: Tensor, requires_grad: bool, name: impl Into<String>) -> Self {
        let v = Self::leaf(value, requires_grad);
        v.set_name(name);
        v
    }

    /// A leaf that never requires grad.
    pub fn constant(value: Tensor) -> Self {
        Self::leaf(value, false)
    }

    /// Records an op node whose VJP may read its output and every parent ([`Saves::ALL`]).
    /// When recording is disabled ([`crate::no_grad`]) the result is a constant leaf. Parents
    /// that do not require grad are still recorded: their values are version-checked before
    /// backward, and checkpoint uses them to verify its boundary.
    pub fn from_op(
        name: &'static str,
        value: Tensor,
        parents: Vec<Variable>,
        vjp: impl Fn(&[Variable], &Tensor, &Tensor) -> Result<Vec<Option<Tensor>>>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        Self::from_op_saving(name, value, parents, Saves::ALL, vjp)
    }

    /// [`Variable::from_op`] declaring which forward values the VJP reads: the others are
    /// released as soon as nothing outside the graph refers to them (see [`Variable`]).
    pub fn from_op_saving(
        name: &'static str,
        value: Tensor,
        parents: Vec<Variable>,
        saves: Saves,
        vjp: impl Fn(&[Variable], &Tensor, &Tensor) -> Result<Vec<Option<Tensor>>>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        Self::from_op_shared(name, value, parents, saves, Arc::new(vjp))
    }

    /// [`Variable::from_op_saving`] with a VJP rule shared with other nodes (a selective
    /// checkpoint replay rebuilds a saved node around the VJP the forward recorded).
    pub(crate) fn from_op_shared(
        name: &'static str,
        value: Tensor,
        parents: Vec<Variable>,
        saves: Saves,
        vjp: Arc<VjpFn>,
    ) -> Self {
        if !crate::grad_mode::is_grad_enabled() || parents.is_empty() {
            return Self::constant(value);
        }
        let requires_grad = parents.iter().any(|p| p.requires_grad());
        let parent_versions = parents.iter().map(|p| p.value().version()).collect();
        for (i, p) in parents.iter().enumerate() {
            p.0.graph_refs.fetch_add(1, Ordering::AcqRel);
            if saves.reads_parent(i) {
                p.0.readers.fetch_add(1, Ordering::AcqRel);
            }
        }
        Self(Arc::new(Node {
            id: next_id(),
            value,
            requires_grad,
            op_name: Some(name),
            op: Mutex::new(Some(Arc::new(OpRecord {
                name,
                parents,
                parent_versions,
                saves,
                vjp,
            }))),
            grad: Mutex::new(None),
            name: Mutex::new(None),
            readers: AtomicUsize::new(usize::from(saves.reads_output())),
            graph_refs: AtomicUsize::new(0),
        }))
    }

    /// The forward value. An op node's value that no VJP reads is released once nothing
    /// outside the graph refers to the node (see [`Variable`]); reading a released value is
    /// `TensorError::NoData`.
    pub fn value(&self) -> &Tensor {
        &self.0.value
    }

    /// The shape of the value.
    pub fn dims(&self) -> &[usize] {
        self.0.value.dims()
    }

    /// Whether gradients flow to this node.
    pub fn requires_grad(&self) -> bool {
        self.0.requires_grad
    }

    /// Whether this is a leaf (no op recorded).
    pub fn is_leaf(&self) -> bool {
        self.0.op_name.is_none()
    }

    /// The op name, `"leaf"` for leaves.
    pub fn op_name(&self) -> &'static str {
        self.0.op_name.unwrap_or("leaf")
    }

    /// A process-unique id.
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// The parents of an op node (empty for leaves, and for op nodes whose graph a backward
    /// pass with `retain_graph = false` freed).
    pub fn parents(&self) -> Vec<Variable> {
        self.op_record()
            .map(|o| o.parents.clone())
            .unwrap_or_default()
    }

    /// Whether a backward pass with `retain_graph = false` freed this op node's record (its
    /// parents and saved values): differentiating through it again is
    /// [`crate::AutogradError::GraphFreed`].
    pub fn is_graph_freed(&self) -> bool {
        self.0.op_name.is_some() && self.0.op_lock().is_none()
    }

    /// Sets the name used in messages.
    pub fn set_name(&self, name: impl Into<String>) {
        *self.0.name.lock().unwrap_or_else(|e| e.into_inner()) = Some(name.into());
    }

    /// The name, if one was set.
    pub fn name(&self) -> Option<String> {
        self.0
            .name
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A description for messages: the name, or the op, id and shape.
    pub fn describe(&self) -> String {
        match self.name() {
            Some(n) => format!("{n:?} {:?}", self.dims()),
            None => format!("{} #{} {:?}", self.op_name(), self.id(), self.dims()),
        }
    }

    /// The committed gradient (set by the last successful backward pass that reached this
    /// leaf), if any.
    pub fn grad(&self) -> Option<Tensor> {
        self.0
            .grad
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Clears the committed gradient, releasing its buffer (PyTorch's
    /// `zero_grad(set_to_none=True)`): the next backward pass writes a fresh one.
    ///
    /// # Errors
    /// [`crate::CheckpointError::ZeroGradInsideReplay`] inside a checkpoint's replay (on its
    /// thread, or for a parameter of that checkpoint from any thread): the outer backward pass
    /// owns the gradients until it commits; nothing changes.
    pub fn zero_grad(&self) -> crate::Result<()> {
        self.check_zero_grad()?;
        *self.0.grad.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Ok(())
    }

    /// Whether [`Variable::zero_grad`] may clear this gradient now.
    ///
    /// # Errors
    /// As [`Variable::zero_grad`].
    pub fn check_zero_grad(&self) -> crate::Result<()> {
        let owner = crate::checkpoint::replay_in_progress();
        match owner {
            Some(name) => Err(crate::CheckpointError::ZeroGradInsideReplay { name }.into()),
            None => Ok(()),
        }
    }

    /// Replaces the committed gradient of this trainable leaf (PyTorch's `p.grad = g`); `None`
    /// clears it as [`Variable::zero_grad`] does. Data-parallel training writes the all-reduced
    /// gradients back with it before the optimizer step.
    ///
    /// # Errors
    /// [`crate::AutogradError::GradShape`] when `g`'s shape differs from the value's;
    /// [`crate::AutogradError::GradNotSettable`] for an op result, a leaf that does not require
    /// grad, or a gradient on another device than the value; as [`Variable::zero_grad`] inside a
    /// checkpoint's replay. Nothing changes on error.
    pub fn replace_grad(&self, g: Option<Tensor>) -> crate::Result<()> {
        self.check_zero_grad()?;
        let not_settable = |reason: String| crate::AutogradError::GradNotSettable {
            what: self.describe(),
            reason,
        };
        if !self.is_leaf() {
            return Err(not_settable(format!(
                "it is the result of op {} (only leaves hold gradients)",
                self.op_name()
            )));
        }
        if !self.requires_grad() {
            return Err(not_settable("it does not require grad".into()));
        }
        if let Some(g) = &g {
            if g.dims() != self.dims() {
                return Err(crate::AutogradError::GradShape {
                    what: self.describe(),
                    expected: self.dims().to_vec(),
                    got: g.dims().to_vec(),
                });
            }
            if g.device() != self.value().device() {
                return Err(not_settable(format!(
                    "the gradient is on {:?}, the value on {:?}",
                    g.device(),
                    self.value().device()
                )));
            }
        }
        *self.0.grad.lock().unwrap_or_else(|e| e.into_inner()) = g;
        Ok(())
    }

    pub(crate) fn set_grad(&self, g: Tensor) {
        *self.0.grad.lock().unwrap_or_else(|e| e.into_inner()) = Some(g);
    }

    /// The op record of an op node (`None` for leaves and freed op nodes).
    pub(crate) fn op_record(&self) -> Option<Arc<OpRecord>> {
        self.0.op_lock().clone()
    }

    /// Releases this op node's value (as [`Tensor::release_if_exclusive`]) when `record`, its
    /// own released record, does not read it, no other VJP will read it, and nothing refers to
    /// the node but `engine` handles of a backward pass and op records. Returns whether it did.
    pub(crate) fn release_value_kept_only_by(&self, engine: usize, record: &OpRecord) -> bool {
        !record.saves.reads_output()
            && self.0.readers.load(Ordering::Acquire) == 0
            && Arc::strong_count(&self.0) == engine + self.0.graph_refs.load(Ordering::Acquire)
            && self.0.value.release_if_exclusive()
    }

    /// Removes the op record (a freeing backward pass, after the node's VJP ran): the parents
    /// lose one graph reference each, and the record's saved values go when the returned
    /// record drops.
    pub(crate) fn take_op_record(&self) -> Option<Arc<OpRecord>> {
        let record = self.0.op_lock().take();
        if let Some(r) = &record {
            unlink(r);
        }
        record
    }

    pub(crate) fn ptr_eq(&self, other: &Variable) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// A new leaf sharing this node's value, detached from the graph.
    pub fn detach(&self) -> Variable {
        Variable::constant(self.value().clone())
    }

    /// Calls `visit` once for every node reachable from `self` (including `self`), walking all
    /// parents (also those that do not require grad), iteratively. `stop` nodes are visited
    /// but not walked through.
    pub(crate) fn walk(&self, stop: &dyn Fn(&Variable) -> bool, visit: &mut dyn FnMut(&Variable)) {
        let mut seen: HashSet<u64> = HashSet::new();
        let mut stack = vec![self.clone()];
        seen.insert(self.id());
        while let Some(v) = stack.pop() {
            visit(&v);
            if stop(&v) {
                continue;
            }
            if let Some(record) = v.op_record() {
                for p in &record.parents {
                    if seen.insert(p.id()) {
                        stack.push(p.clone());
                    }
                }
            }
        }
    }
}

impl fmt::Debug for Variable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Variable")
            .field("id", &self.id())
            .field("op", &self.op_name())
            .field("shape", &self.dims())
            .field("requires_grad", &self.requires_grad())
            .finish()
    }
}
