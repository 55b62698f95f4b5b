//! The one rayon pool every kernel runs on.
//!
//! Its size comes from `RIFTCO_NUM_THREADS` when set to a positive integer, otherwise from the
//! number of physical cores (`std::thread::available_parallelism` counts logical CPUs; we halve it
//! when the machine reports SMT siblings through `/sys`, and never go below 1).

use std::sync::OnceLock;

static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();

/// The number of worker threads kernels use (>= 1).
pub fn num_threads() -> usize {
    thread_pool().current_num_threads()
}

/// The shared kernel thread pool, built on first use.
pub fn thread_pool() -> &'static rayon::ThreadPool {
    POOL.get_or_init(|| {
        let n = requested_threads().unwrap_or_else(physical_cores).max(1);
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("riftco-kernel-{i}"))
            .build()
            .unwrap_or_else(|_| {
                // Building a pool only fails when the OS refuses threads: fall back to one.
                rayon::ThreadPoolBuilder::new()
                    .num_threads(1)
                    .build()
                    .expect("a one-thread rayon pool can always be built")
            })
    })
}

fn requested_threads() -> Option<usize> {
    std::env::var("RIFTCO_NUM_THREADS")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
}

fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let smt = std::fs::read_to_string("/sys/devices/system/cpu/smt/active")
        .map(|s| s.trim() == "1")
        .unwrap_or(false);
    if smt {
        (logical / 2).max(1)
    } else {
        logical
    }
}
