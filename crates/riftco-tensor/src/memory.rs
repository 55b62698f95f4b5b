//! Exact memory accounting by category.
//!
//! Every tensor storage registers its byte size (`4 · elements`) with its device and category when
//! it is allocated and unregisters it when the last reference is dropped. Counters are process-wide
//! atomics; `peak` is the highest `current` seen since the last [`reset_peak_memory_stats`].
//! These are the numbers riftco's memory claims are made with; process RSS is secondary.

use crate::Device;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

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

/// The counters of one device: one per category and their total.
struct DeviceCounters {
    categories: [Counter; 5],
    total: Counter,
    /// Each category's `current` when `total` last reached a new peak.
    at_total_peak: Mutex<[usize; 5]>,
}

impl DeviceCounters {
    const fn new() -> Self {
        Self {
            categories: [
                Counter::new(),
                Counter::new(),
                Counter::new(),
                Counter::new(),
                Counter::new(),
            ],
            total: Counter::new(),
            at_total_peak: Mutex::new([0; 5]),
        }
    }

    fn categories_now(&self) -> [usize; 5] {
        std::array::from_fn(|i| self.categories[i].current.load(Ordering::Relaxed))
    }

    /// Records the categories as the composition of a new total peak `now`, unless another
    /// thread has since raised the peak above it (that thread records its own).
    fn record_total_peak(&self, now: usize) {
        let mut at = self.at_total_peak.lock().unwrap_or_else(|e| e.into_inner());
        if self.total.peak.load(Ordering::Relaxed) == now {
            *at = self.categories_now();
        }
    }
}

const N_DEVICES: usize = Device::ALL.len();
static COUNTERS: [DeviceCounters; N_DEVICES] = [const { DeviceCounters::new() }; N_DEVICES];

pub(crate) fn record_alloc(device: Device, category: MemoryCategory, bytes: usize) {
    let c = &COUNTERS[device.index()];
    c.categories[category.index()].add(bytes);
    let now = c.total.current.fetch_add(bytes, Ordering::Relaxed) + bytes;
    if c.total.peak.fetch_max(now, Ordering::Relaxed) < now {
        c.record_total_peak(now);
    }
    record_in_scopes(device, category, bytes as i64);
}

pub(crate) fn record_free(device: Device, category: MemoryCategory, bytes: usize) {
    let c = &COUNTERS[device.index()];
    c.categories[category.index()].sub(bytes);
    c.total.sub(bytes);
    record_in_scopes(device, category, -(bytes as i64));
}

/// This thread's allocations and frees of one device and category since a scope began.
#[derive(Clone, Copy, Debug, Default)]
struct ScopeCounter {
    current: i64,
    peak: i64,
}

struct Scope {
    id: u64,
    device: Device,
    category: MemoryCategory,
    counter: ScopeCounter,
}

thread_local! {
    static SCOPES: std::cell::RefCell<Vec<Scope>> = const { std::cell::RefCell::new(Vec::new()) };
}

static NEXT_SCOPE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn record_in_scopes(device: Device, category: MemoryCategory, delta: i64) {
    // `try_with`: storages dropped while the thread's locals are destroyed count nowhere.
    let _ = SCOPES.try_with(|scopes| {
        if let Ok(mut scopes) = scopes.try_borrow_mut() {
            for s in scopes.iter_mut() {
                if s.device == device && s.category == category {
                    s.counter.current += delta;
                    s.counter.peak = s.counter.peak.max(s.counter.current);
                }
            }
        }
    });
}

/// Counts the bytes of one device and category that **this thread** allocates and frees while
/// it lives, unaffected by other threads (the process-wide counters of [`memory_stats_for`] see
/// every thread). A measurement tool: riftco's checkpointing planner measures its probe passes
/// with it. Frees of storages allocated before the scope count too (`current` can go
/// negative); storages dropped on other threads do not.
#[derive(Debug)]
pub struct ThreadMemoryScope {
    id: u64,
    /// Bound to its thread (not `Send`): its counter lives in that thread's locals.
    _thread: std::marker::PhantomData<*const ()>,
}

impl ThreadMemoryScope {
    /// Starts counting `category` on `device` for this thread.
    pub fn new(device: Device, category: MemoryCategory) -> Self {
        let id = NEXT_SCOPE.fetch_add(1, Ordering::Relaxed);
        SCOPES.with(|s| {
            s.borrow_mut().push(Scope {
                id,
                device,
                category,
                counter: ScopeCounter::default(),
            })
        });
        Self {
            id,
            _thread: std::marker::PhantomData,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut ScopeCounter) -> T) -> T {
        SCOPES.with(|s| {
            let mut s = s.borrow_mut();
            let scope = s
                .iter_mut()
                .find(|x| x.id == self.id)
                .expect("a live scope is registered on its thread");
            f(&mut scope.counter)
        })
    }

    /// Bytes allocated minus bytes freed by this thread since the scope began.
    pub fn current_bytes(&self) -> i64 {
        self.with(|c| c.current)
    }

    /// The highest [`ThreadMemoryScope::current_bytes`] since the scope began or the last
    /// [`ThreadMemoryScope::reset_peak`].
    pub fn peak_bytes(&self) -> i64 {
        self.with(|c| c.peak)
    }

    /// Sets the peak to the current value.
    pub fn reset_peak(&self) {
        self.with(|c| c.peak = c.current)
    }
}

impl Drop for ThreadMemoryScope {
    fn drop(&mut self) {
        let _ = SCOPES.try_with(|s| s.borrow_mut().retain(|x| x.id != self.id));
    }
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
    /// Bytes of freed buffers the device's pool keeps for reuse (in no category): the
    /// [`crate::pool`] for the CPU, the backend's own pool for another device.
    pub cached_bytes: usize,
}

impl MemoryStats {
    /// The stats of one category.
    pub fn get(&self, category: MemoryCategory) -> CategoryStats {
        self.categories[category.index()]
    }
}

/// The counters of the host ([`Device::Cpu`]): [`memory_stats_for`]`(Device::Cpu)`.
pub fn memory_stats() -> MemoryStats {
    memory_stats_for(Device::Cpu)
}

/// Reads every counter of `device` (each device has its own counters and its own pool).
pub fn memory_stats_for(device: Device) -> MemoryStats {
    let read = |c: &Counter| CategoryStats {
        current_bytes: c.current.load(Ordering::Relaxed),
        peak_bytes: c.peak.load(Ordering::Relaxed),
    };
    let counters = &COUNTERS[device.index()];
    let cached_bytes = match device {
        Device::Cpu => crate::pool::cached_bytes(),
        _ => crate::backend::for_device(device).map_or(0, |b| b.cached_bytes()),
    };
    let mut stats = MemoryStats {
        total: read(&counters.total),
        cached_bytes,
        ..Default::default()
    };
    for (slot, c) in stats.categories.iter_mut().zip(counters.categories.iter()) {
        *slot = read(c);
    }
    stats
}

/// Sets every peak of every device to its current value.
pub fn reset_peak_memory_stats() {
    for d in COUNTERS.iter() {
        for c in d.categories.iter() {
            c.reset_peak();
        }
        d.total.reset_peak();
        let mut at = d.at_total_peak.lock().unwrap_or_else(|e| e.into_inner());
        *at = d.categories_now();
    }
}

/// What the total peak of [`memory_stats_for`] was made of: each category's bytes at the moment
/// the total reached its peak (since the last [`reset_peak_memory_stats`]), in
/// [`MemoryCategory::ALL`] order. A category's own peak may lie elsewhere in time; this says
/// which bytes were alive together at the highest point. Exact when one thread allocates at a
/// time; with concurrent allocations a category may lack another thread's allocation that was
/// still being counted.
pub fn memory_at_total_peak_for(device: Device) -> [usize; 5] {
    let at = COUNTERS[device.index()].at_total_peak.lock();
    *at.unwrap_or_else(|e| e.into_inner())
}
