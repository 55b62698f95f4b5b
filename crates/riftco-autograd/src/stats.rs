//! Structural graph diagnostics.

use crate::variable::Variable;

/// What a graph retains, structurally: reachable nodes and the tensor elements those nodes own
/// directly (forward values and committed gradients). Tensors captured by VJP closures and
/// backend workspaces are not included: this is a diagnostic, not a memory profiler (use
/// `riftco_tensor::memory_stats` for bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct GraphStatistics {
    /// Nodes reachable from the variable, itself included.
    pub node_count: usize,
    /// Elements of the values and gradients owned by those nodes (graph-only placeholders own
    /// none).
    pub element_count: usize,
}

impl Variable {
    /// Counts the nodes reachable from this variable and the elements they own.
    pub fn graph_statistics(&self) -> GraphStatistics {
        let mut stats = GraphStatistics::default();
        self.walk(&|_| false, &mut |v| {
            stats.node_count += 1;
            // A graph-only value is a placeholder that owns no elements.
            if !v.value().is_placeholder() {
                stats.element_count += v.value().numel();
            }
            if let Some(g) = v.grad() {
                stats.element_count += g.numel();
            }
        });
        stats
    }
}
