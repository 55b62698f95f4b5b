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

pub mod sliced;

use crate::loss::cross_entropy_backward_in_place;
use crate::matmul::{matmul_strided, MatmulSpec, Strides};
use crate::softmax::logsumexp_rows;

/// The LM head weight `W [vocab, d_model]` of [`linear_cross_entropy`]: f32 rows, or rows
/// that a caller converts on demand (a 16-bit base), a block of rows at a time, so that no f32
/// copy of the whole matrix is ever made.
#[derive(Clone, Copy)]
pub enum HeadWeight<'a> {
    /// The rows, row-major.
    F32(&'a [f32]),
    /// `vocab` rows produced by `fill(first_row, out)`, which writes `out.len() / d_model`
    /// consecutive rows starting at `first_row` (exactly, e.g. an upcast).
    Converted {
        /// Number of rows.
        vocab: usize,
        /// Writes rows `first_row..` into `out`.
        fill: &'a (dyn Fn(usize, &mut [f32]) + Sync),
    },
}

impl std::fmt::Debug for HeadWeight<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeadWeight::F32(w) => write!(f, "F32({} elements)", w.len()),
            HeadWeight::Converted { vocab, .. } => write!(f, "Converted({vocab} rows)"),
        }
    }
}

/// The operands of [`linear_cross_entropy`].
#[derive(Clone, Copy, Debug)]
pub struct LinearCrossEntropy<'a> {
    /// Hidden states `x [rows, d_model]`, row-major.
    pub x: &'a [f32],
    /// LM head weight `W [vocab, d_model]` (Hugging Face layout: logits are `x · Wᵀ`).
    pub w: HeadWeight<'a>,
    /// Target ids `[rows]`, each `< vocab`.
    pub targets: &'a [u32],
    /// Hidden size.
    pub d_model: usize,
    /// Rows per chunk (`>= 1`).
    pub chunk_rows: usize,
    /// Vocabulary rows per block of `W` (`>= 1`): each product runs over blocks of this many
    /// rows of `W`, so a converted weight holds one block in f32 at a time. The same blocks for
    /// f32 and converted rows give the same bits.
    pub vocab_block: usize,
}

/// Vocabulary rows per block for `d_model`: as many as [`VOCAB_BLOCK_BYTES`] of f32 rows hold
/// (at least 1).
pub fn vocab_block_rows(d_model: usize) -> usize {
    (VOCAB_BLOCK_BYTES / (4 * d_model.max(1))).max(1)
}

/// The f32 bytes of one block of `W`'s rows (see [`LinearCrossEntropy::vocab_block`]).
pub const VOCAB_BLOCK_BYTES: usize = 8 << 20;

/// The workspace elements [`linear_cross_entropy`] needs: one chunk's logits and logsumexp,
/// and one block of rows when `W` is converted. (Each block's products read and write their
/// columns of the chunk's logits in place: no copy of a block's logits.)
pub fn workspace_len(
    rows: usize,
    vocab: usize,
    d_model: usize,
    chunk_rows: usize,
    vocab_block: usize,
    converted: bool,
) -> usize {
    let chunk = chunk_rows.min(rows);
    let block = vocab_block.min(vocab);
    let mut n = chunk.saturating_mul(vocab).saturating_add(chunk);
    if converted {
        n = n.saturating_add(block.saturating_mul(d_model));
    }
    n
}

/// The mean cross-entropy `(1/rows) Σ_r (logsumexp(z_r) − z_r[t_r])` of the logits `z = x · Wᵀ`,
/// computed `chunk_rows` rows at a time in `workspace` ([`workspace_len`] elements). When given,
/// `dx [rows, d_model]` receives `∂loss/∂x = dz · W` and `dw [vocab, d_model]` receives
/// `∂loss/∂W = dzᵀ · x` (overwritten; only for an f32 `W`), with
/// `dz = (softmax(z) − onehot(t)) / rows`. Each product runs over blocks of `vocab_block` rows
/// of `W` (one block: the plain products).
///
/// The loss sums the rows' f32 losses in row order in f64 and divides by `rows` in f64, as
/// [`crate::loss::cross_entropy`] does, and `dz` is [`crate::loss::cross_entropy_backward`]'s
/// for an upstream gradient of 1. With one chunk of all rows and one block the products are the
/// unchunked path's, so the loss and `dx` are bitwise its; with smaller chunks they agree
/// within the products' rounding, not bitwise, because the product kernel may sum a row in
/// another order for another number of rows (`gemm`'s one-row and small-product paths and its
/// split of long sums depend on it): each logit within `2·γ_d·Σ_k|x_k·W_vk|` of the other
/// path's (Higham 2002, §3.1). `dw` sums the rows chunk by chunk (another order of the same
/// sum), and `dx` block by block when there are several.
///
/// # Panics
/// When a length disagrees with the sizes, `chunk_rows == 0`, `vocab_block == 0`,
/// `d_model == 0`, there are no rows, a target is `>= vocab`, or `dw` is asked of a converted
/// `W` (callers validate first).
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
        vocab_block,
    } = op;
    let rows = targets.len();
    assert!(
        d > 0 && chunk_rows > 0 && rows > 0 && vocab_block > 0,
        "linear_cross_entropy: sizes"
    );
    assert_eq!(x.len(), rows * d, "linear_cross_entropy: x length");
    let (vocab, converted) = match w {
        HeadWeight::F32(w) => {
            assert!(
                !w.is_empty() && w.len() % d == 0,
                "linear_cross_entropy: W length"
            );
            (w.len() / d, false)
        }
        HeadWeight::Converted { vocab, .. } => {
            assert!(vocab > 0, "linear_cross_entropy: W length");
            assert!(dw.is_none(), "linear_cross_entropy: dW of a converted W");
            (vocab, true)
        }
    };
    let chunk = chunk_rows.min(rows);
    let block = vocab_block.min(vocab);
    assert!(
        workspace.len() >= workspace_len(rows, vocab, d, chunk_rows, vocab_block, converted),
        "linear_cross_entropy: workspace length"
    );
    if let Some(dx) = dx.as_deref() {
        assert_eq!(dx.len(), rows * d, "linear_cross_entropy: dx length");
    }
    if let Some(dw) = dw.as_deref() {
        assert_eq!(dw.len(), vocab * d, "linear_cross_entropy: dW length");
    }
    let (z_all, rest) = workspace.split_at_mut(chunk * vocab);
    let (lse_all, rest) = rest.split_at_mut(chunk);
    let wbuf = &mut rest[..if converted { block * d } else { 0 }];
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
        let mut v0 = 0;
        while v0 < vocab {
            let n = block.min(vocab - v0);
            let wr = head_rows(w, d, v0, n, &mut *wbuf);
            // The block's logits straight into their columns of the chunk's logits.
            let spec = MatmulSpec::new(r, d, n).trans_b(true);
            let strides = Strides {
                c: vocab,
                ..Strides::packed(spec)
            };
            matmul_strided(spec, xc, wr, &mut z[v0..], strides);
            v0 += n;
        }
        logsumexp_rows(z, vocab, lse);
        for (i, &t) in tc.iter().enumerate() {
            let t = t as usize;
            assert!(t < vocab, "linear_cross_entropy: target out of range");
            total += (lse[i] - z[i * vocab + t]) as f64;
        }
        if want_grad {
            cross_entropy_backward_in_place(z, tc, lse, scale);
            let mut v0 = 0;
            while v0 < vocab {
                let n = block.min(vocab - v0);
                let first = v0 == 0;
                // The block's columns of the chunk's logits gradient, read in place.
                let dz = &z[v0..];
                if let Some(dx) = dx.as_deref_mut() {
                    let wr = head_rows(w, d, v0, n, &mut *wbuf);
                    let spec = MatmulSpec::new(r, n, d).accumulate(!first);
                    let strides = Strides {
                        a: vocab,
                        ..Strides::packed(spec)
                    };
                    matmul_strided(spec, dz, wr, &mut dx[r0 * d..(r0 + r) * d], strides);
                }
                if let Some(dw) = dw.as_deref_mut() {
                    let spec = MatmulSpec::new(n, r, d).trans_a(true).accumulate(r0 > 0);
                    let strides = Strides {
                        a: vocab,
                        ..Strides::packed(spec)
                    };
                    matmul_strided(spec, dz, xc, &mut dw[v0 * d..(v0 + n) * d], strides);
                }
                v0 += n;
            }
        }
        r0 += r;
    }
    (total / rows as f64) as f32
}

/// Rows `v0..v0 + n` of `W` as f32: a slice of an f32 `W`, or converted into `wbuf`.
fn head_rows<'b>(
    w: HeadWeight<'b>,
    d: usize,
    v0: usize,
    n: usize,
    wbuf: &'b mut [f32],
) -> &'b [f32] {
    match w {
        HeadWeight::F32(w) => &w[v0 * d..(v0 + n) * d],
        HeadWeight::Converted { fill, .. } => {
            let out = &mut wbuf[..n * d];
            fill(v0, out);
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An f64 reference: logits, loss and both gradients written out plainly.
    pub(super) fn reference(
        x: &[f32],
        w: &[f32],
        t: &[u32],
        d: usize,
    ) -> (f64, Vec<f64>, Vec<f64>) {
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
                w: HeadWeight::F32(&w),
                targets: &t,
                d_model: d,
                chunk_rows,
                vocab_block: vocab,
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

    #[test]
    fn vocabulary_blocks_and_converted_rows_match_the_reference_and_each_other() {
        let (rows, d, vocab) = (9, 6, 13);
        let mut state = 777u32;
        let mut next = || {
            state = state.wrapping_mul(1664525).wrapping_add(1013904223);
            (state >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
        };
        let x: Vec<f32> = (0..rows * d).map(|_| next()).collect();
        let w: Vec<f32> = (0..vocab * d).map(|_| next()).collect();
        let t: Vec<u32> = (0..rows).map(|i| (i * 5 % vocab) as u32).collect();
        let (loss_ref, dx_ref, dw_ref) = reference(&x, &w, &t, d);
        let fill = |v0: usize, out: &mut [f32]| out.copy_from_slice(&w[v0 * d..v0 * d + out.len()]);
        for (chunk_rows, vocab_block) in [(4, 1), (4, 3), (9, 5), (2, 13), (100, 100)] {
            let run = |w: HeadWeight<'_>, want_dw: bool| {
                let converted = matches!(w, HeadWeight::Converted { .. });
                let n = workspace_len(rows, vocab, d, chunk_rows, vocab_block, converted);
                let mut ws = vec![f32::NAN; n];
                let (mut dx, mut dw) = (vec![0.0; rows * d], vec![9.0; vocab * d]);
                let op = LinearCrossEntropy {
                    x: &x,
                    w,
                    targets: &t,
                    d_model: d,
                    chunk_rows,
                    vocab_block,
                };
                let dw_out = want_dw.then_some(dw.as_mut_slice());
                let loss = linear_cross_entropy(op, &mut ws, Some(&mut dx), dw_out);
                (loss, dx, dw)
            };
            let (loss, dx, dw) = run(HeadWeight::F32(&w), true);
            assert!(
                (loss as f64 - loss_ref).abs() < 1e-6,
                "{chunk_rows}/{vocab_block}"
            );
            for (a, b) in dx.iter().zip(&dx_ref).chain(dw.iter().zip(&dw_ref)) {
                assert!(
                    (*a as f64 - b).abs() < 1e-6,
                    "{chunk_rows}/{vocab_block}: {a} vs {b}"
                );
            }
            // Converted rows in the same blocks: the same bits.
            let (loss_c, dx_c, _) = run(HeadWeight::Converted { vocab, fill: &fill }, false);
            assert_eq!(loss_c.to_bits(), loss.to_bits());
            assert_eq!(
                dx_c.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                dx.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }
}
