//! Exact memory accounting by category.
//!
//! Every tensor storage registers its byte size (`4 · elements`) with its category when it is
//! allocated and unregisters it when the last reference is dropped. Counters are process-wide
//! atomics; `peak` is the highest `current` seen since the last [`reset_peak_memory_stats`].
//! These are the numbers riftco's memory claims are made with; process RSS is secondary.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What a tensor allocation is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryCategory {
    /// Model weights (trainable or frozen).
    Parameter,
    /// Gradients: public leaf gradients and those held in a gradient context during backward.
    Gradient,
    /// Optimizer state (Adam's first and second moments).
    OptimizerState,
    /// Forward values retained by the graph or produced during a forward pass.
    Activation,
    /// Temporaries (kernel scratch, copies made for transfers, inputs built from user data).
    Workspace,
}

impl MemoryCategory {
    /// All categories, in reporting order.
    pub const ALL: [MemoryCategory; 5] = [
        MemoryCategory::Parameter,
        MemoryCategory::Gradient,
        MemoryCategory::OptimizerState,
        MemoryCategory::Activation,
        MemoryCategory::Workspace,
    ];

    /// The snake_case name used by the Python and C APIs.
    pub fn name(self) -> &'static str {
        match self {
            MemoryCategory::Parameter => "parameter",
            MemoryCategory::Gradient => "gradient",
            MemoryCategory::OptimizerState => "optimizer_state",
            MemoryCategory::Activation => "activation",
            MemoryCategory::Workspace => "workspace",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for MemoryCategory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

struct Counter {
    current: AtomicUsize,
    peak: AtomicUsize,
}

impl Counter {
    const fn new() -> Self {
        Self {
            current: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    fn add(&self, bytes: usize) {
        let now = self.current.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    fn sub(&self, bytes: usize) {
        self.current.fetch_sub(bytes, Ordering::Relaxed);
    }

    fn reset_peak(&self) {
        self.peak
            .store(self.current.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

static COUNTERS: [Counter; 5] = [
    Counter::new(),
    Counter::new(),
    Counter::new(),
    Counter::new(),
    Counter::new(),
];
static TOTAL: Counter = Counter::new();

pub(crate) fn record_alloc(category: MemoryCategory, bytes: usize) {
    COUNTERS[category.index()].add(bytes);
    TOTAL.add(bytes);
}

pub(crate) fn record_free(category: MemoryCategory, bytes: usize) {
    COUNTERS[category.index()].sub(bytes);
    TOTAL.sub(bytes);
}

/// Current and peak bytes of one category.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CategoryStats {
    /// Bytes allocated now.
    pub current_bytes: usize,
    /// Highest `current_bytes` since the last peak reset.
    pub peak_bytes: usize,
}

/// A snapshot of all counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MemoryStats {
    /// Per category, in [`MemoryCategory::ALL`] order.
    pub categories: [CategoryStats; 5],
    /// All categories together (the peak of the sum, not the sum of peaks).
    pub total: CategoryStats,
    /// Bytes of freed buffers the [`crate::pool`] keeps for reuse (in no category).
    pub cached_bytes: usize,
}

impl MemoryStats {
    /// The stats of one category.
    pub fn get(&self, category: MemoryCategory) -> CategoryStats {
        self.categories[category.index()]
    }
}

/// Reads every counter.
pub fn memory_stats() -> MemoryStats {
    let read = |c: &Counter| CategoryStats {
        current_bytes: c.current.load(Ordering::Relaxed),
        peak_bytes: c.peak.load(Ordering::Relaxed),
    };
    let mut stats = MemoryStats {
        total: read(&TOTAL),
        cached_bytes: crate::pool::cached_bytes(),
        ..Default::default()
    };
    for (slot, c) in stats.categories.iter_mut().zip(COUNTERS.iter()) {
        *slot = read(c);
    }
    stats
}

/// Sets every peak to its current value.
pub fn reset_peak_memory_stats() {
    for c in COUNTERS.iter() {
        c.reset_peak();
    }
    TOTAL.reset_peak();
}
