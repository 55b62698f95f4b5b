//! Graph nodes.

use crate::error::Result;
use riftco_tensor::Tensor;
use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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
/// require grad, or that receive nothing).
pub type VjpFn =
    dyn Fn(&[Variable], &Tensor, &Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync + 'static;

pub(crate) struct OpRecord {
    pub(crate) name: &'static str,
    pub(crate) parents: Vec<Variable>,
    pub(crate) parent_versions: Vec<u64>,
    pub(crate) vjp: Arc<VjpFn>,
}

pub(crate) struct Node {
    pub(crate) id: u64,
    pub(crate) value: Tensor,
    pub(crate) requires_grad: bool,
    pub(crate) op: Option<OpRecord>,
    pub(crate) grad: Mutex<Option<Tensor>>,
    pub(crate) name: Mutex<Option<String>>,
}

impl Drop for Node {
    // Dropping a long chain of Arc<Node> recursively would overflow the stack on deep graphs;
    // unlink parents iteratively instead.
    fn drop(&mut self) {
        let Some(op) = self.op.take() else { return };
        let mut stack: Vec<Variable> = op.parents;
        while let Some(var) = stack.pop() {
            if let Ok(mut node) = Arc::try_unwrap(var.0) {
                if let Some(op) = node.op.take() {
                    stack.extend(op.parents);
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
#[derive(Clone)]
pub struct Variable(pub(crate) Arc<Node>);

impl Variable {
    /// A leaf: a trainable parameter (`requires_grad = true`), a frozen parameter or an input.
    pub fn leaf(value: Tensor, requires_grad: bool) -> Self {
        Self(Arc::new(Node {
            id: next_id(),
            value,
            requires_grad,
            op: None,
            grad: Mutex::new(None),
            name: Mutex::new(None),
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

    /// Records an op node. When recording is disabled ([`crate::no_grad`]) the result is a
    /// constant leaf. Parents that do not require grad are still recorded: their values are
    /// version-checked before backward, and checkpoint uses them to verify its boundary.
    pub fn from_op(
        name: &'static str,
        value: Tensor,
        parents: Vec<Variable>,
        vjp: impl Fn(&[Variable], &Tensor, &Tensor) -> Result<Vec<Option<Tensor>>>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        Self::from_op_shared(name, value, parents, Arc::new(vjp))
    }

    /// [`Variable::from_op`] with a VJP rule shared with other nodes (a selective checkpoint
    /// replay rebuilds a saved node around the VJP the forward recorded).
    pub(crate) fn from_op_shared(
        name: &'static str,
        value: Tensor,
        parents: Vec<Variable>,
        vjp: Arc<VjpFn>,
    ) -> Self {
        if !crate::grad_mode::is_grad_enabled() || parents.is_empty() {
            return Self::constant(value);
        }
        let requires_grad = parents.iter().any(|p| p.requires_grad());
        let parent_versions = parents.iter().map(|p| p.value().version()).collect();
        Self(Arc::new(Node {
            id: next_id(),
            value,
            requires_grad,
            op: Some(OpRecord {
                name,
                parents,
                parent_versions,
                vjp,
            }),
            grad: Mutex::new(None),
            name: Mutex::new(None),
        }))
    }

    /// The forward value.
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
        self.0.op.is_none()
    }

    /// The op name, `"leaf"` for leaves.
    pub fn op_name(&self) -> &'static str {
        self.0.op.as_ref().map(|o| o.name).unwrap_or("leaf")
    }

    /// A process-unique id.
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// The parents of an op node (empty for leaves).
    pub fn parents(&self) -> &[Variable] {
        self.0
            .op
            .as_ref()
            .map(|o| o.parents.as_slice())
            .unwrap_or(&[])
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

    /// Clears the committed gradient.
    pub fn zero_grad(&self) {
        *self.0.grad.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    pub(crate) fn set_grad(&self, g: Tensor) {
        *self.0.grad.lock().unwrap_or_else(|e| e.into_inner()) = Some(g);
    }

    /// The op record of an op node (`None` for leaves).
    pub(crate) fn op_record(&self) -> Option<&OpRecord> {
        self.0.op.as_ref()
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
            for p in v.parents() {
                if seen.insert(p.id()) {
                    stack.push(p.clone());
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
