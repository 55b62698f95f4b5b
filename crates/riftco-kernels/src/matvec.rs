//! Matrix-vector products `y[n] (+)= x[k] · Wᵀ` with `W` stored `[n, k]` row-major: a linear
//! layer applied to one row, the shape of every product when decoding one token.
//!
//! Decoding is memory-bound: each product reads all of `W` once and does two flops per element
//! read, so what matters is streaming `W` at the memory's bandwidth. A general GEMM driver packs
//! `W` into panels first (a second pass over the weights); here each output is one dot product
//! over a contiguous row of `W`, rows split over the kernel pool. Every row's sum runs in one
//! task in a fixed order (four vector accumulators, then their lanes), so results do not depend
//! on the thread count; they depend on the SIMD level's lane count, as GEMM's do.

use rayon::prelude::*;

use crate::simd::{arch, dot, simd_op};

/// Rows per task: about 64 K elements of `W` (256 KiB) each.
const TASK_ELEMENTS: usize = 64 * 1024;
/// Products smaller than this (elements of `W`) run on the calling thread.
const PAR_MIN_ELEMENTS: usize = 256 * 1024;

simd_op!(RowsOp<'a> { x: &'a [f32], w: &'a [f32], ld: usize, y: &'a mut [f32], accumulate: bool } -> () = |s| {
    let k = x.len();
    for (j, out) in y.iter_mut().enumerate() {
        let row = &w[j * ld..j * ld + k];
        let v = dot(s, x, row);
        *out = if accumulate { *out + v } else { v };
    }
});

/// `y[j] (+)= Σ_i x[i]·w[j·ld + i]` for `j < y.len()`, `i < x.len()`.
///
/// `parallel`: split the rows over the kernel pool when the product is large enough (callers
/// that already run one product per task pass `false`).
///
/// # Panics
/// When `ld < x.len()` or `w` is shorter than `(y.len() - 1)·ld + x.len()` (callers validate).
pub(crate) fn matvec_rows(
    x: &[f32],
    w: &[f32],
    ld: usize,
    y: &mut [f32],
    accumulate: bool,
    parallel: bool,
) {
    let (k, n) = (x.len(), y.len());
    assert!(ld >= k, "matvec: row stride shorter than a row");
    if n == 0 {
        return;
    }
    assert!(w.len() >= (n - 1) * ld + k, "matvec: weight length");
    let serial = |w: &[f32], y: &mut [f32]| {
        arch().dispatch(RowsOp {
            x,
            w,
            ld,
            y,
            accumulate,
        })
    };
    let elements = n.saturating_mul(k);
    if !parallel || elements < PAR_MIN_ELEMENTS || n < 2 {
        serial(w, y);
        return;
    }
    let rows = TASK_ELEMENTS.div_ceil(k.max(1)).clamp(1, n);
    crate::par::install(|| {
        y.par_chunks_mut(rows).enumerate().for_each(|(t, y)| {
            let start = t * rows * ld;
            let end = (start + (y.len() - 1) * ld + k).min(w.len());
            serial(&w[start..end], y);
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each output is within the dot product's rounding bound of the f64 sum:
    /// `|ŷ − y| ≤ γ_k · Σ|x_i·w_i|` (Higham 2002, eq. 3.5), any summation order.
    #[test]
    fn rows_agree_with_f64_within_the_dot_product_bound() {
        for (n, k, ld) in [(1, 1, 1), (7, 13, 13), (33, 576, 600), (300, 1536, 1536)] {
            let x: Vec<f32> = (0..k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
                .collect();
            let w: Vec<f32> = (0..(n - 1) * ld + k)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) / 23.0)
                .collect();
            for accumulate in [false, true] {
                let mut y = vec![0.5f32; n];
                matvec_rows(&x, &w, ld, &mut y, accumulate, true);
                let u = f64::from(f32::EPSILON) / 2.0;
                let gamma = (k + 1) as f64 * u / (1.0 - (k + 1) as f64 * u);
                for (j, &got) in y.iter().enumerate() {
                    let row = &w[j * ld..j * ld + k];
                    let exact: f64 = x.iter().zip(row).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let abs: f64 = x
                        .iter()
                        .zip(row)
                        .map(|(&a, &b)| (a as f64 * b as f64).abs())
                        .sum();
                    let want = exact + if accumulate { 0.5 } else { 0.0 };
                    let bound = gamma * (abs + 0.5) + u * want.abs();
                    assert!(
                        (got as f64 - want).abs() <= bound,
                        "n {n} k {k} row {j}: {got} vs {want} (bound {bound})"
                    );
                }
            }
        }
    }

    #[test]
    fn parallel_and_serial_are_bitwise_equal() {
        let (n, k) = (1000, 700);
        let x: Vec<f32> = (0..k).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.011).cos()).collect();
        let mut a = vec![0.0; n];
        let mut b = vec![0.0; n];
        matvec_rows(&x, &w, k, &mut a, false, true);
        matvec_rows(&x, &w, k, &mut b, false, false);
        assert_eq!(
            a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }
}
