//! The LM head and the mean cross-entropy over a weight that arrives in slices of vocabulary
//! rows, each seen once: an online logsumexp (Milakov & Gimelshein 2018, "Online normalizer
//! calculation for softmax"), with the gradient `dx = Σ_v softmax(z)_v · W_v − W_t` accumulated
//! and rescaled as the running logsumexp grows, as FlashAttention rescales its output (Dao et
//! al. 2022, §3.1). This is what a caller needs when the whole `W` never exists at once in its
//! memory (a head sharded over data-parallel processes and gathered a slice at a time): one pass
//! over the slices gives the loss and `dx`, where [`super::linear_cross_entropy`] reads `W`
//! twice per chunk of rows.
//!
//! Rounding: each logit is a product of the same operands as the unsliced path's, but the
//! product kernel may sum it in another order for another block shape, and the logsumexp is
//! combined per slice in f64 (`L' = max(L, b) + ln(1 + e^{−|L − b|})`) rather than summed over
//! the whole row at once: the loss agrees with [`super::linear_cross_entropy`] within a few f32
//! ulps of the logits' magnitude, `dx` within the products' rounding (Higham 2002, §3.1).

use super::{head_rows, vocab_block_rows, HeadWeight};
use crate::matmul::{matmul_strided, MatmulSpec, Strides};
use crate::softmax::{logsumexp_rows, softmax_rows};

/// The running state of a sliced LM head + cross-entropy over `rows` hidden states.
#[derive(Debug)]
pub struct SlicedLinearCrossEntropy {
    rows: usize,
    d_model: usize,
    vocab: usize,
    /// Rows of `W` seen so far (slices come in order, without gaps).
    seen: usize,
    with_dx: bool,
    /// Running logsumexp per row (−∞ before the first slice).
    lse: Vec<f64>,
    /// Each row's target logit, set by the slice holding the target.
    target_logit: Vec<f32>,
}

/// The caller's `[rows, d_model]` buffers for `dx` (the caller owns them so that it can count
/// them): `acc` accumulates `Σ_v exp(z_v − L) · W_v` over the rows of `W` seen so far (zeros
/// before the first slice; `dx` in place after [`SlicedLinearCrossEntropy::finish`]),
/// `target_rows` receives each row's target row of `W`.
#[derive(Debug)]
pub struct DxBuffers<'a> {
    /// The running sum, then `dx`.
    pub acc: &'a mut [f32],
    /// The target rows of `W`.
    pub target_rows: &'a mut [f32],
}

/// The f32 elements [`SlicedLinearCrossEntropy::absorb`] needs as workspace for `cols` columns
/// of logits per pass: the logits, their softmax (with `dx`), the block of converted rows and
/// one logsumexp per row.
pub fn sliced_workspace_len(rows: usize, d_model: usize, cols: usize, with_dx: bool) -> usize {
    let logits = rows.saturating_mul(cols);
    let softmax = if with_dx { logits } else { 0 };
    let block = vocab_block_rows(d_model).min(cols).saturating_mul(d_model);
    logits
        .saturating_add(softmax)
        .saturating_add(block)
        .saturating_add(rows)
}

/// The columns of logits per pass that fit `bytes` of workspace ([`sliced_workspace_len`]), at
/// least 1 and at most `max_cols` (the rows of the largest slice: no workspace for columns no
/// slice has).
pub fn sliced_cols_for(
    bytes: u64,
    rows: usize,
    d_model: usize,
    with_dx: bool,
    max_cols: usize,
) -> usize {
    let per_col = (rows as u64).saturating_mul(if with_dx { 8 } else { 4 });
    let fixed = 4 * (rows as u64).saturating_add((vocab_block_rows(d_model) * d_model) as u64);
    let cols = bytes.saturating_sub(fixed) / per_col.max(1);
    usize::try_from(cols)
        .unwrap_or(usize::MAX)
        .min(max_cols)
        .max(1)
}

impl SlicedLinearCrossEntropy {
    /// The state before any slice, for `rows` hidden states of `d_model` against a head of
    /// `vocab` rows; `with_dx`: [`SlicedLinearCrossEntropy::absorb`] takes [`DxBuffers`].
    ///
    /// # Panics
    /// When a size is 0 (callers validate first).
    pub fn new(rows: usize, d_model: usize, vocab: usize, with_dx: bool) -> Self {
        assert!(
            rows > 0 && d_model > 0 && vocab > 0,
            "sliced cross-entropy: sizes"
        );
        Self {
            rows,
            d_model,
            vocab,
            seen: 0,
            with_dx,
            lse: vec![f64::NEG_INFINITY; rows],
            target_logit: vec![f32::NAN; rows],
        }
    }

    /// Rows of `W` absorbed so far.
    pub fn seen(&self) -> usize {
        self.seen
    }

    /// Rows of `W` in all.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Absorbs the next slice of `W`: its rows `seen()..seen() + n` (`w` of `n` rows), with the
    /// hidden states `x [rows, d_model]` and `targets [rows]`, `cols` logits columns per pass in
    /// `workspace` ([`sliced_workspace_len`] elements), and `dx`'s buffers when kept.
    ///
    /// # Panics
    /// When a length disagrees with the sizes, the slice goes past `vocab`, `cols == 0`, or
    /// `dx` is given exactly when `with_dx` was not.
    pub fn absorb(
        &mut self,
        x: &[f32],
        targets: &[u32],
        w: HeadWeight<'_>,
        cols: usize,
        workspace: &mut [f32],
        mut dx: Option<DxBuffers<'_>>,
    ) {
        let (rows, d) = (self.rows, self.d_model);
        assert_eq!(x.len(), rows * d, "sliced cross-entropy: x length");
        assert_eq!(targets.len(), rows, "sliced cross-entropy: targets length");
        assert!(cols > 0, "sliced cross-entropy: cols");
        let n = match w {
            HeadWeight::F32(w) => {
                assert_eq!(w.len() % d, 0, "sliced cross-entropy: W length");
                w.len() / d
            }
            HeadWeight::Converted { vocab, .. } => vocab,
        };
        assert!(
            self.seen + n <= self.vocab,
            "sliced cross-entropy: slice past the vocabulary"
        );
        assert_eq!(
            dx.is_some(),
            self.with_dx,
            "sliced cross-entropy: dx buffers"
        );
        if let Some(b) = dx.as_ref() {
            assert!(
                b.acc.len() == rows * d && b.target_rows.len() == rows * d,
                "sliced cross-entropy: dx buffer lengths"
            );
        }
        let cols = cols.min(n.max(1));
        let block = vocab_block_rows(d).min(cols);
        assert!(
            workspace.len() >= sliced_workspace_len(rows, d, cols, self.with_dx),
            "sliced cross-entropy: workspace length"
        );
        let (z_all, rest) = workspace.split_at_mut(rows * cols);
        let (p_all, rest) = rest.split_at_mut(if self.with_dx { rows * cols } else { 0 });
        let (wbuf, rest) = rest.split_at_mut(block * d);
        let lse_b = &mut rest[..rows];
        let mut c0 = 0;
        while c0 < n {
            let nc = cols.min(n - c0);
            let z = &mut z_all[..rows * nc];
            // The pass's logits, a block of W's rows at a time, into their columns.
            let mut b0 = 0;
            while b0 < nc {
                let nb = block.min(nc - b0);
                let wr = head_rows(w, d, c0 + b0, nb, wbuf);
                let spec = MatmulSpec::new(rows, d, nb).trans_b(true);
                let strides = Strides {
                    c: nc,
                    ..Strides::packed(spec)
                };
                matmul_strided(spec, x, wr, &mut z[b0..], strides);
                if let Some(b) = dx.as_mut() {
                    take_target_rows(targets, self.seen + c0 + b0, nb, d, wr, b.target_rows);
                }
                b0 += nb;
            }
            let v0 = self.seen + c0;
            for (i, &t) in targets.iter().enumerate() {
                let t = t as usize;
                if (v0..v0 + nc).contains(&t) {
                    self.target_logit[i] = z[i * nc + t - v0];
                }
            }
            logsumexp_rows(z, nc, lse_b);
            // Per row: the running logsumexp L and this pass's b combine to L'; what was
            // accumulated is rescaled by e^{L − L'}, this pass's softmax by e^{b − L'}.
            let mut rescale = vec![(0.0f32, 0.0f32); rows];
            for (i, r) in rescale.iter_mut().enumerate() {
                let (l, b) = (self.lse[i], f64::from(lse_b[i]));
                // A NaN or +∞ logit makes the row's logsumexp NaN or +∞ for good, as the whole
                // row's would be (`f64::max` alone would drop a NaN).
                let hi = l.max(b);
                let merged = if l.is_nan() || b.is_nan() {
                    f64::NAN
                } else if hi.is_infinite() {
                    hi
                } else {
                    hi + (-(l - b).abs()).exp().ln_1p()
                };
                *r = ((l - merged).exp() as f32, (b - merged).exp() as f32);
                self.lse[i] = merged;
            }
            if let Some(b) = dx.as_mut() {
                let p = &mut p_all[..rows * nc];
                softmax_rows(z, nc, p);
                for (i, &(old, new)) in rescale.iter().enumerate() {
                    b.acc[i * d..(i + 1) * d].iter_mut().for_each(|a| *a *= old);
                    p[i * nc..(i + 1) * nc].iter_mut().for_each(|v| *v *= new);
                }
                let mut b0 = 0;
                while b0 < nc {
                    let nb = block.min(nc - b0);
                    let wr = head_rows(w, d, c0 + b0, nb, wbuf);
                    let spec = MatmulSpec::new(rows, nb, d).accumulate(true);
                    let strides = Strides {
                        a: nc,
                        ..Strides::packed(spec)
                    };
                    matmul_strided(spec, &p[b0..], wr, b.acc, strides);
                    b0 += nb;
                }
            }
            c0 += nc;
        }
        self.seen += n;
    }

    /// The mean loss `(1/rows) Σ_r (L_r − z_r[t_r])` (summed in f64 in row order) and, when
    /// kept, `dx = (acc − W_t) / rows` for an upstream gradient of 1, written over `acc`.
    ///
    /// # Panics
    /// Before every row of `W` was absorbed, or when `dx` is given without `with_dx` or has
    /// another length.
    pub fn finish(self, dx: Option<DxBuffers<'_>>) -> f32 {
        assert_eq!(
            self.seen, self.vocab,
            "sliced cross-entropy: slices missing"
        );
        let rows = self.rows;
        let total: f64 = self
            .lse
            .iter()
            .zip(&self.target_logit)
            .map(|(&l, &z)| (l as f32 - z) as f64)
            .sum();
        if let Some(b) = dx {
            assert!(self.with_dx, "sliced cross-entropy: dx was not kept");
            let n = rows * self.d_model;
            assert!(
                b.acc.len() == n && b.target_rows.len() == n,
                "sliced cross-entropy: dx buffer lengths"
            );
            let scale = 1.0f32 / rows as f32;
            for (a, &w) in b.acc.iter_mut().zip(b.target_rows.iter()) {
                *a = (*a - w) * scale;
            }
        }
        (total / rows as f64) as f32
    }
}

/// Copies into `out` the target rows of `W` that fall in rows `v0..v0 + n` (`wr`, f32).
fn take_target_rows(targets: &[u32], v0: usize, n: usize, d: usize, wr: &[f32], out: &mut [f32]) {
    for (i, &t) in targets.iter().enumerate() {
        let t = t as usize;
        if (v0..v0 + n).contains(&t) {
            let local = t - v0;
            out[i * d..(i + 1) * d].copy_from_slice(&wr[local * d..(local + 1) * d]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::reference;
    use super::*;

    fn lcg(seed: u32, n: usize, spread: f32) -> Vec<f32> {
        let mut state = seed;
        (0..n)
            .map(|_| {
                state = state.wrapping_mul(1664525).wrapping_add(1013904223);
                ((state >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0) * spread
            })
            .collect()
    }

    /// Every split of the vocabulary into slices and every pass width give the f64
    /// reference's loss and `dx` within f32 rounding of values of order 1.
    #[test]
    fn every_slicing_matches_the_f64_reference() {
        let (rows, d, vocab) = (6, 5, 17);
        // Large logits (|z| up to ~40) so that the running logsumexp really rescales.
        let x = lcg(3, rows * d, 3.0);
        let w = lcg(11, vocab * d, 3.0);
        let t: Vec<u32> = (0..rows).map(|i| (i * 7 % vocab) as u32).collect();
        let (loss_ref, dx_ref, _) = reference(&x, &w, &t, d);
        for (slice, cols) in [(17, 17), (1, 1), (4, 3), (5, 2), (16, 8), (3, 100)] {
            let mut state = SlicedLinearCrossEntropy::new(rows, d, vocab, true);
            let mut ws = vec![f32::NAN; sliced_workspace_len(rows, d, cols, true)];
            let (mut dx, mut wt) = (vec![0.0; rows * d], vec![f32::NAN; rows * d]);
            let mut v0 = 0;
            while v0 < vocab {
                let n = slice.min(vocab - v0);
                let part = &w[v0 * d..(v0 + n) * d];
                let bufs = DxBuffers {
                    acc: &mut dx,
                    target_rows: &mut wt,
                };
                state.absorb(&x, &t, HeadWeight::F32(part), cols, &mut ws, Some(bufs));
                v0 += n;
            }
            let loss = state.finish(Some(DxBuffers {
                acc: &mut dx,
                target_rows: &mut wt,
            }));
            assert!(
                (loss as f64 - loss_ref).abs() < 1e-5 * loss_ref.abs().max(1.0),
                "slice {slice}, cols {cols}: {loss} vs {loss_ref}"
            );
            // Each of dx's sums has at most `vocab` rescalings and products of `d` terms of
            // magnitude <= 3 (|W| <= 3, softmax weights <= 1): within 4·(vocab + d)·ε·3 of the
            // exact value on any SIMD level (Higham 2002, §3.1).
            let dx_tol = 4.0 * (vocab + d) as f64 * f64::from(f32::EPSILON) * 3.0;
            for (a, b) in dx.iter().zip(&dx_ref) {
                assert!(
                    (*a as f64 - b).abs() < dx_tol,
                    "slice {slice}, cols {cols}: {a} vs {b}"
                );
            }
            // Without dx the same loss.
            let mut state = SlicedLinearCrossEntropy::new(rows, d, vocab, false);
            let mut ws = vec![f32::NAN; sliced_workspace_len(rows, d, cols, false)];
            let mut v0 = 0;
            while v0 < vocab {
                let n = slice.min(vocab - v0);
                let part = &w[v0 * d..(v0 + n) * d];
                state.absorb(&x, &t, HeadWeight::F32(part), cols, &mut ws, None);
                v0 += n;
            }
            assert_eq!(state.finish(None).to_bits(), loss.to_bits());
        }
    }

    /// A NaN anywhere in `W` (here in the first slice, where the running logsumexp is still
    /// −∞) makes the loss NaN, as the whole-row computation does.
    #[test]
    fn a_nan_in_any_slice_is_a_nan_loss() {
        let (rows, d, vocab) = (2, 3, 8);
        let x = lcg(1, rows * d, 1.0);
        for bad in [0, 5] {
            let mut w = lcg(2, vocab * d, 1.0);
            w[bad * d + 1] = f32::NAN;
            let t = [7u32, 6];
            let mut state = SlicedLinearCrossEntropy::new(rows, d, vocab, false);
            let mut ws = vec![0.0; sliced_workspace_len(rows, d, 2, false)];
            for v0 in (0..vocab).step_by(2) {
                let part = &w[v0 * d..(v0 + 2) * d];
                state.absorb(&x, &t, HeadWeight::F32(part), 2, &mut ws, None);
            }
            assert!(state.finish(None).is_nan(), "NaN in row {bad}");
        }
    }

    #[test]
    fn converted_rows_give_the_bits_of_f32_rows() {
        let (rows, d, vocab) = (3, 4, 9);
        let x = lcg(5, rows * d, 1.0);
        let w = lcg(6, vocab * d, 1.0);
        let t = [8u32, 0, 4];
        let run = |converted: bool| {
            let mut state = SlicedLinearCrossEntropy::new(rows, d, vocab, true);
            let mut ws = vec![0.0; sliced_workspace_len(rows, d, 2, true)];
            let (mut dx, mut wt) = (vec![0.0; rows * d], vec![0.0; rows * d]);
            for v0 in (0..vocab).step_by(4) {
                let n = 4.min(vocab - v0);
                let part = &w[v0 * d..(v0 + n) * d];
                let fill = |r0: usize, out: &mut [f32]| {
                    out.copy_from_slice(&part[r0 * d..r0 * d + out.len()])
                };
                let head = if converted {
                    HeadWeight::Converted {
                        vocab: n,
                        fill: &fill,
                    }
                } else {
                    HeadWeight::F32(part)
                };
                let bufs = DxBuffers {
                    acc: &mut dx,
                    target_rows: &mut wt,
                };
                state.absorb(&x, &t, head, 2, &mut ws, Some(bufs));
            }
            let loss = state.finish(Some(DxBuffers {
                acc: &mut dx,
                target_rows: &mut wt,
            }));
            (
                loss.to_bits(),
                dx.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            )
        };
        assert_eq!(run(true), run(false));
    }

    #[test]
    fn the_workspace_width_fits_its_budget() {
        for (rows, d, with_dx) in [(1024, 2048, true), (7, 3, false), (1, 1, true)] {
            for bytes in [1u64, 4096, 64 << 20] {
                let cols = sliced_cols_for(bytes, rows, d, with_dx, usize::MAX);
                assert!(cols >= 1);
                assert_eq!(sliced_cols_for(bytes, rows, d, with_dx, 3), cols.min(3));
                if cols > 1 {
                    let need = 4 * sliced_workspace_len(rows, d, cols, with_dx) as u64;
                    assert!(
                        need <= bytes,
                        "{rows}x{d}: {cols} cols take {need} > {bytes}"
                    );
                }
            }
        }
    }
}
