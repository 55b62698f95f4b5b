//! Dropout (Srivastava et al. 2014, "Dropout: A Simple Way to Prevent Neural Networks from
//! Overfitting", eq. 2 with inverted scaling) with the counter-based mask of
//! [`crate::philox::DropoutMask`]: the mask is regenerated from its parameters, never stored.

use rayon::prelude::*;

pub use crate::philox::DropoutMask;

/// `out[e] = x[e] / (1 − p)` where `mask` keeps element `e`, exactly 0 where it drops it; a copy
/// of `x` when `p == 0` (no random words are generated). Forward and VJP are the same map.
///
/// Tasks cover whole 4-element Philox blocks, and each element's result depends only on
/// `(mask, e)`, so the output is bitwise the same for any thread count.
///
/// # Panics
/// When `x` and `out` differ in length.
pub fn dropout(x: &[f32], out: &mut [f32], mask: &DropoutMask) {
    assert_eq!(
        x.len(),
        out.len(),
        "dropout: x has {} elements, out {}",
        x.len(),
        out.len()
    );
    if mask.is_identity() {
        out.copy_from_slice(x);
        return;
    }
    // Philox is compute-bound (10 rounds per 4 elements): split well below the memory-bound
    // element-wise threshold. A multiple of 4 keeps each task on whole blocks.
    const TASK: usize = 4 * 1024;
    if x.len() <= TASK {
        mask.apply(0, x, out);
        return;
    }
    crate::par::install(|| {
        x.par_chunks(TASK)
            .zip(out.par_chunks_mut(TASK))
            .enumerate()
            .for_each(|(t, (xs, os))| mask.apply((t * TASK) as u64, xs, os));
    });
}
