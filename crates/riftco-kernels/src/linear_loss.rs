//! The LM head and the mean cross-entropy fused and computed in chunks of rows, so that the
//! `[rows, vocab]` logits and their gradient never exist whole: each chunk's logits are
//! computed, reduced to the rows' logsumexp and losses, turned into their gradient in place and
//! multiplied back into `dx` and `dW` before the next chunk reuses the buffer. This is the
//! chunked scheme of Liger Kernel's fused linear cross-entropy (Hsu et al. 2024, "Liger Kernel:
//! Efficient Triton Kernels for LLM Training", §3.2); Cut Cross-Entropy (Wijmans et al. 2024)
//! goes further on a GPU by never writing a logit to global memory.
//!
//! Gradients are those of the loss itself (upstream gradient 1), computed during the forward
//! pass: the logits are then needed once, not again in the backward pass (no recomputed
//! product). A caller with another upstream gradient `g` scales them by `g`.

use crate::loss::cross_entropy_backward_in_place;
use crate::matmul::{matmul, MatmulSpec};
use crate::softmax::logsumexp_rows;

/// The operands of [`linear_cross_entropy`].
#[derive(Clone, Copy, Debug)]
pub struct LinearCrossEntropy<'a> {
    /// Hidden states `x [rows, d_model]`, row-major.
    pub x: &'a [f32],
    /// LM head weight `W [vocab, d_model]` (Hugging Face layout: logits are `x · Wᵀ`).
    pub w: &'a [f32],
    /// Target ids `[rows]`, each `< vocab`.
    pub targets: &'a [u32],
    /// Hidden size.
    pub d_model: usize,
    /// Rows per chunk (`>= 1`).
    pub chunk_rows: usize,
}

/// The mean cross-entropy `(1/rows) Σ_r (logsumexp(z_r) − z_r[t_r])` of the logits `z = x · Wᵀ`,
/// computed `chunk_rows` rows at a time in `workspace` (at least `min(chunk_rows, rows) · vocab`
/// elements for the logits of one chunk, then `min(chunk_rows, rows)` for their logsumexp).
/// When given, `dx [rows, d_model]` receives `∂loss/∂x = dz · W` and `dw [vocab, d_model]`
/// receives `∂loss/∂W = dzᵀ · x` (overwritten), with `dz = (softmax(z) − onehot(t)) / rows`.
///
/// The loss sums the rows' f32 losses in row order in f64 and divides by `rows` in f64, as
/// [`crate::loss::cross_entropy`] does, and `dz` is [`crate::loss::cross_entropy_backward`]'s
/// for an upstream gradient of 1: when the product kernel gives a row the same values whatever
/// the number of rows in the product, the loss and `dx` are bitwise those of the unchunked
/// path; `dw` sums the rows chunk by chunk (another order of the same sum).
///
/// # Panics
/// When a length disagrees with the sizes, `chunk_rows == 0`, `d_model == 0`, there are no
/// rows, or a target is `>= vocab` (callers validate first).
pub fn linear_cross_entropy(
    op: LinearCrossEntropy<'_>,
    workspace: &mut [f32],
    mut dx: Option<&mut [f32]>,
    mut dw: Option<&mut [f32]>,
) -> f32 {
    let LinearCrossEntropy {
        x,
        w,
        targets,
        d_model: d,
        chunk_rows,
    } = op;
    let rows = targets.len();
    assert!(
        d > 0 && chunk_rows > 0 && rows > 0,
        "linear_cross_entropy: sizes"
    );
    assert_eq!(x.len(), rows * d, "linear_cross_entropy: x length");
    assert!(
        !w.is_empty() && w.len() % d == 0,
        "linear_cross_entropy: W length"
    );
    let vocab = w.len() / d;
    let chunk = chunk_rows.min(rows);
    assert!(
        workspace.len() >= chunk * vocab + chunk,
        "linear_cross_entropy: workspace length"
    );
    if let Some(dx) = dx.as_deref() {
        assert_eq!(dx.len(), rows * d, "linear_cross_entropy: dx length");
    }
    if let Some(dw) = dw.as_deref() {
        assert_eq!(dw.len(), vocab * d, "linear_cross_entropy: dW length");
    }
    let (z_all, lse_all) = workspace.split_at_mut(chunk * vocab);
    let want_grad = dx.is_some() || dw.is_some();
    // `grad / rows` of the unchunked backward for grad = 1.
    let scale = 1.0f32 / rows as f32;
    let mut total = 0.0f64;
    let mut r0 = 0;
    while r0 < rows {
        let r = chunk.min(rows - r0);
        let xc = &x[r0 * d..(r0 + r) * d];
        let tc = &targets[r0..r0 + r];
        let z = &mut z_all[..r * vocab];
        let lse = &mut lse_all[..r];
        matmul(MatmulSpec::new(r, d, vocab).trans_b(true), xc, w, z);
        logsumexp_rows(z, vocab, lse);
        for (i, &t) in tc.iter().enumerate() {
            let t = t as usize;
            assert!(t < vocab, "linear_cross_entropy: target out of range");
            total += (lse[i] - z[i * vocab + t]) as f64;
        }
        if want_grad {
            cross_entropy_backward_in_place(z, tc, lse, scale);
            if let Some(dx) = dx.as_deref_mut() {
                let spec = MatmulSpec::new(r, vocab, d);
                matmul(spec, z, w, &mut dx[r0 * d..(r0 + r) * d]);
            }
            if let Some(dw) = dw.as_deref_mut() {
                let spec = MatmulSpec::new(vocab, r, d)
                    .trans_a(true)
                    .accumulate(r0 > 0);
                matmul(spec, z, xc, dw);
            }
        }
        r0 += r;
    }
    (total / rows as f64) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An f64 reference: logits, loss and both gradients written out plainly.
    fn reference(x: &[f32], w: &[f32], t: &[u32], d: usize) -> (f64, Vec<f64>, Vec<f64>) {
        let rows = t.len();
        let vocab = w.len() / d;
        let (mut loss, mut dx, mut dw) = (0.0, vec![0.0; rows * d], vec![0.0; vocab * d]);
        for r in 0..rows {
            let z: Vec<f64> = (0..vocab)
                .map(|v| {
                    (0..d)
                        .map(|k| x[r * d + k] as f64 * w[v * d + k] as f64)
                        .sum()
                })
                .collect();
            let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + z.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            loss += lse - z[t[r] as usize];
            for v in 0..vocab {
                let dz = ((z[v] - lse).exp() - f64::from(v == t[r] as usize)) / rows as f64;
                for k in 0..d {
                    dx[r * d + k] += dz * w[v * d + k] as f64;
                    dw[v * d + k] += dz * x[r * d + k] as f64;
                }
            }
        }
        (loss / rows as f64, dx, dw)
    }

    #[test]
    fn every_chunk_size_matches_the_f64_reference() {
        let (rows, d, vocab) = (7, 5, 11);
        let mut state = 12345u32;
        let mut next = || {
            state = state.wrapping_mul(1664525).wrapping_add(1013904223);
            (state >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
        };
        let x: Vec<f32> = (0..rows * d).map(|_| next()).collect();
        let w: Vec<f32> = (0..vocab * d).map(|_| next()).collect();
        let t: Vec<u32> = (0..rows).map(|i| (i * 4 % vocab) as u32).collect();
        let (loss_ref, dx_ref, dw_ref) = reference(&x, &w, &t, d);
        for chunk_rows in [1, 2, 3, 7, 100] {
            let mut ws = vec![0.0; chunk_rows.min(rows) * (vocab + 1)];
            let (mut dx, mut dw) = (vec![0.0; rows * d], vec![9.0; vocab * d]);
            let op = LinearCrossEntropy {
                x: &x,
                w: &w,
                targets: &t,
                d_model: d,
                chunk_rows,
            };
            let loss = linear_cross_entropy(op, &mut ws, Some(&mut dx), Some(&mut dw));
            assert!(
                (loss as f64 - loss_ref).abs() < 1e-6,
                "chunk {chunk_rows}: {loss}"
            );
            for (a, b) in dx.iter().zip(&dx_ref).chain(dw.iter().zip(&dw_ref)) {
                assert!(
                    (*a as f64 - b).abs() < 1e-6,
                    "chunk {chunk_rows}: {a} vs {b}"
                );
            }
            // Without gradients the loss is the same value.
            let loss_only = linear_cross_entropy(op, &mut ws, None, None);
            assert_eq!(loss_only.to_bits(), loss.to_bits());
        }
    }
}
