//! How kernels split work over the kernel pool.
//!
//! Work is split only along independent rows (or independent element ranges): every reduction
//! runs inside one task, in a fixed order, so results do not depend on the thread count. Whether
//! to go parallel depends only on the problem size, never on the number of threads.

/// Problems smaller than this (in elements) run on the calling thread.
pub(crate) const PAR_MIN_ELEMENTS: usize = 32 * 1024;

/// Target number of elements per parallel task.
const TASK_ELEMENTS: usize = 16 * 1024;

/// Rows per parallel task for a `[rows, cols]` row kernel, or `None` to stay serial.
pub(crate) fn rows_per_task(rows: usize, cols: usize) -> Option<usize> {
    let total = rows.saturating_mul(cols);
    if total < PAR_MIN_ELEMENTS || rows < 2 {
        return None;
    }
    Some(TASK_ELEMENTS.div_ceil(cols.max(1)).clamp(1, rows))
}

/// Elements per parallel task for an element-wise kernel on `n` elements, or `None` to stay
/// serial. A multiple of 64 so that every task but the last covers whole vectors.
pub(crate) fn elements_per_task(n: usize) -> Option<usize> {
    if n < PAR_MIN_ELEMENTS {
        None
    } else {
        Some(TASK_ELEMENTS)
    }
}

/// Runs `f` on the kernel pool.
pub(crate) fn install<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    crate::threading::thread_pool().install(f)
}
