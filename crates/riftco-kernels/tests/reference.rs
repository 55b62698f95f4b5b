//! Every element-wise and row kernel against a plain f64 reference, at whatever SIMD level the
//! machine (or `RIFTCO_FORCE_SCALAR`) selects. Each test states its error bound; `U = 2^-24` is
//! the f32 unit roundoff.

#![allow(clippy::needless_range_loop)] // index loops mirror the math in the references

mod common;

use common::{assert_close, len_strategy, sigmoid, vec_from_seed, U};
use proptest::prelude::*;
use riftco_kernels::{elementwise as ew, loss, norm, rope, simd, softmax};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// add/mul/scale: one rounding, `|err| <= U·|ref|`. axpy (one fused or two roundings):
    /// `|err| <= 2U·(|dst| + |alpha·src|)`.
    #[test]
    fn binary_ops(n in len_strategy(), seed in any::<u64>()) {
        let a = vec_from_seed(n, seed, 10.0);
        let b = vec_from_seed(n, seed ^ 1, 10.0);
        let mut out = vec![0.0; n];
        ew::add(&a, &b, &mut out);
        let want: Vec<f64> = a.iter().zip(&b).map(|(&x, &y)| x as f64 + y as f64).collect();
        assert_close("add", &out, &want, |i| U * want[i].abs());
        ew::mul(&a, &b, &mut out);
        let want: Vec<f64> = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).collect();
        assert_close("mul", &out, &want, |i| U * want[i].abs());
        ew::scale(&a, -0.37, &mut out);
        let want: Vec<f64> = a.iter().map(|&x| -0.37f32 as f64 * x as f64).collect();
        assert_close("scale", &out, &want, |i| U * want[i].abs());
        let mut dst = b.clone();
        ew::axpy(0.37, &a, &mut dst);
        let want: Vec<f64> = a.iter().zip(&b).map(|(&x, &y)| y as f64 + 0.37f32 as f64 * x as f64).collect();
        assert_close("axpy", &dst, &want, |i| 2.0 * U * (b[i].abs() as f64 + (0.37 * a[i]).abs() as f64));
        let mut dst = b.clone();
        ew::add_assign(&mut dst, &a);
        let want: Vec<f64> = a.iter().zip(&b).map(|(&x, &y)| x as f64 + y as f64).collect();
        assert_close("add_assign", &dst, &want, |i| U * want[i].abs());
    }

    /// exp: the Cephes polynomial is within about 1 ulp; with the range reduction and 2^n
    /// scaling we assert `|err| <= 4U·|ref|` on [-80, 80].
    #[test]
    fn exp_kernel(n in len_strategy(), seed in any::<u64>()) {
        let x = vec_from_seed(n, seed, 80.0);
        let mut out = vec![0.0; n];
        simd::exp(&x, &mut out);
        let want: Vec<f64> = x.iter().map(|&v| (v as f64).exp()).collect();
        assert_close("exp", &out, &want, |i| 4.0 * U * want[i]);
    }

    /// SiLU and SwiGLU: exp (4U), 1 + e, the division and products add a few roundings:
    /// `|err| <= 10U·|ref|`. Backward: `1 − σ` is formed with absolute error ~U, multiplied by
    /// `x`, so `|err| <= 10U·|dy|·|up|·(1 + |x|)`.
    #[test]
    fn silu_swiglu(n in len_strategy(), seed in any::<u64>()) {
        let x = vec_from_seed(n, seed, 12.0);
        let up = vec_from_seed(n, seed ^ 2, 3.0);
        let dy = vec_from_seed(n, seed ^ 3, 2.0);
        let mut out = vec![0.0; n];
        let mut out2 = vec![0.0; n];
        let silu = |v: f64| v * sigmoid(v);
        let dsilu = |v: f64| sigmoid(v) * (1.0 + v * (1.0 - sigmoid(v)));
        ew::silu(&x, &mut out);
        let want: Vec<f64> = x.iter().map(|&v| silu(v as f64)).collect();
        assert_close("silu", &out, &want, |i| 10.0 * U * want[i].abs());
        ew::silu_backward(&x, &dy, &mut out);
        let want: Vec<f64> = x.iter().zip(&dy).map(|(&v, &g)| g as f64 * dsilu(v as f64)).collect();
        assert_close("silu_backward", &out, &want, |i| 10.0 * U * (dy[i].abs() as f64) * (1.0 + x[i].abs() as f64));
        ew::swiglu(&x, &up, &mut out);
        let want: Vec<f64> = x.iter().zip(&up).map(|(&g, &u)| silu(g as f64) * u as f64).collect();
        assert_close("swiglu", &out, &want, |i| 10.0 * U * want[i].abs());
        ew::swiglu_backward(&x, &up, &dy, &mut out, &mut out2);
        let want_g: Vec<f64> = (0..n).map(|i| dy[i] as f64 * up[i] as f64 * dsilu(x[i] as f64)).collect();
        let want_u: Vec<f64> = (0..n).map(|i| dy[i] as f64 * silu(x[i] as f64)).collect();
        assert_close("swiglu_backward.dgate", &out, &want_g, |i| 10.0 * U * (dy[i] * up[i]).abs() as f64 * (1.0 + x[i].abs() as f64));
        assert_close("swiglu_backward.dup", &out2, &want_u, |i| 10.0 * U * want_u[i].abs());
    }

    /// Softmax: each `exp(x − max)` carries `(4 + |x − max|)U` relative error and the row sum at
    /// most `(cols/4 + 8)U` (four accumulators summed sequentially in the scalar path):
    /// `|err| <= (cols/4 + 16 + |x − max|)·U·p`. Backward: `y(dy − Σ y dy)` with the dot product
    /// bounded like the sum: `|err| <= (cols/4 + 16)·U·(|y·dy| + y·Σ|y dy|) + U·|p err|·|dy|`.
    #[test]
    fn softmax_and_logsumexp(rows in 1usize..5, cols in len_strategy(), seed in any::<u64>()) {
        let x = vec_from_seed(rows * cols, seed, 15.0);
        let dy = vec_from_seed(rows * cols, seed ^ 9, 1.0);
        let mut y = vec![0.0; rows * cols];
        softmax::softmax_rows(&x, cols, &mut y);
        let mut want = vec![0.0f64; rows * cols];
        let mut want_lse = vec![0.0f64; rows];
        let mut maxes = vec![0.0f64; rows];
        for r in 0..rows {
            let xr = &x[r * cols..(r + 1) * cols];
            let m = xr.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
            let s: f64 = xr.iter().map(|&v| (v as f64 - m).exp()).sum();
            for j in 0..cols {
                want[r * cols + j] = (xr[j] as f64 - m).exp() / s;
            }
            want_lse[r] = m + s.ln();
            maxes[r] = m;
        }
        let c = (cols / 4 + 16) as f64;
        assert_close("softmax_rows", &y, &want, |i| (c + (x[i] as f64 - maxes[i / cols]).abs()) * U * want[i]);
        let mut lse = vec![0.0; rows];
        softmax::logsumexp_rows(&x, cols, &mut lse);
        assert_close("logsumexp_rows", &lse, &want_lse, |r| (c + 30.0) * U + 2.0 * U * want_lse[r].abs());
        let mut dx = vec![0.0; rows * cols];
        softmax::softmax_rows_backward(&y, &dy, cols, &mut dx);
        let mut want_dx = vec![0.0f64; rows * cols];
        let mut abs_dot = vec![0.0f64; rows];
        for r in 0..rows {
            let sl = r * cols..(r + 1) * cols;
            let d: f64 = y[sl.clone()].iter().zip(&dy[sl.clone()]).map(|(&a, &b)| a as f64 * b as f64).sum();
            abs_dot[r] = y[sl.clone()].iter().zip(&dy[sl.clone()]).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
            for i in sl {
                want_dx[i] = y[i] as f64 * (dy[i] as f64 - d);
            }
        }
        assert_close("softmax_rows_backward", &dx, &want_dx, |i| {
            c * U * ((y[i] * dy[i]).abs() as f64 + y[i] as f64 * abs_dot[i / cols])
        });
    }

    /// RMSNorm forward: the sum of squares has relative error `(cols/4 + 8)U`, so `rstd` and `y`
    /// carry `(cols/4 + 16)U` relative. Backward: `dx = rstd·w·dy − x·coef`, each term with
    /// `(cols/4 + 16)U` relative error, the dot product's relative to `Σ|x w dy|` (it cancels):
    /// `|err| <= (cols/4 + 16)U·(|rstd w dy| + |x|·rstd³·Σ|x w dy|/cols)`;
    /// dweight sums `rows` products per block plus the block partials:
    /// `|err| <= (rows + 16)U·Σ_r |dy x rstd|`.
    #[test]
    fn rms_norm_matches_reference(rows in 1usize..70, cols in len_strategy(), seed in any::<u64>()) {
        let x = vec_from_seed(rows * cols, seed, 3.0);
        let w = vec_from_seed(cols, seed ^ 4, 2.0);
        let dy = vec_from_seed(rows * cols, seed ^ 5, 1.0);
        let eps = 1e-5f32;
        let (mut y, mut rstd) = (vec![0.0; rows * cols], vec![0.0; rows]);
        norm::rms_norm(&x, &w, eps, &mut y, &mut rstd);
        let mut want_r = vec![0.0f64; rows];
        let mut want_y = vec![0.0f64; rows * cols];
        for r in 0..rows {
            let xr = &x[r * cols..(r + 1) * cols];
            let ms: f64 = xr.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / cols as f64;
            want_r[r] = 1.0 / (ms + eps as f64).sqrt();
            for j in 0..cols {
                want_y[r * cols + j] = xr[j] as f64 * want_r[r] * w[j] as f64;
            }
        }
        let c = (cols / 4 + 16) as f64 * U;
        assert_close("rms_norm.rstd", &rstd, &want_r, |r| c * want_r[r]);
        assert_close("rms_norm.y", &y, &want_y, |i| c * want_y[i].abs());
        let mut dx = vec![0.0; rows * cols];
        let mut dw = vec![0.5f32; cols];
        norm::rms_norm_backward(&x, &w, &rstd, &dy, &mut dx, Some(&mut dw));
        let mut want_dx = vec![0.0f64; rows * cols];
        let mut tol_dx = vec![0.0f64; rows * cols];
        let mut want_dw = vec![0.5f64; cols];
        let mut abs_dw = vec![0.5f64; cols];
        for r in 0..rows {
            let inv = rstd[r] as f64;
            let sl = r * cols..(r + 1) * cols;
            let dot: f64 = sl.clone().map(|i| x[i] as f64 * dy[i] as f64 * w[i - r * cols] as f64).sum();
            let coef = dot * inv.powi(3) / cols as f64;
            let abs_dot: f64 = sl.clone().map(|i| (x[i] as f64 * dy[i] as f64 * w[i - r * cols] as f64).abs()).sum();
            let abs_coef = abs_dot * inv.powi(3) / cols as f64;
            for i in sl {
                let j = i - r * cols;
                let a = inv * w[j] as f64 * dy[i] as f64;
                want_dx[i] = a - x[i] as f64 * coef;
                tol_dx[i] = c * (a.abs() + (x[i] as f64 * abs_coef).abs()) + 1e-30;
                want_dw[j] += dy[i] as f64 * x[i] as f64 * inv;
                abs_dw[j] += (dy[i] as f64 * x[i] as f64 * inv).abs();
            }
        }
        assert_close("rms_norm_backward.dx", &dx, &want_dx, |i| tol_dx[i]);
        assert_close("rms_norm_backward.dweight", &dw, &want_dw, |j| (rows + 16) as f64 * U * abs_dw[j]);
    }

    /// RoPE with the table's own f32 cos/sin: two products and one add/sub, unfused:
    /// `|err| <= 2U·(|x_i c| + |x_{i+h} s|)`. The inverse rotation undoes the forward one to
    /// within `8U·|x|_∞`.
    #[test]
    fn rope_matches_reference(seq in 1usize..9, heads in 1usize..4, half in 1usize..40, start in 0usize..5, seed in any::<u64>()) {
        let d = 2 * half;
        let batch = 2;
        let table = rope::RopeTable::new(start + seq, d, 10000.0);
        let x = vec_from_seed(batch * seq * heads * d, seed, 2.0);
        let mut out = vec![0.0; x.len()];
        rope::rope(&table, &x, seq, heads, start, false, &mut out);
        let mut want = vec![0.0f64; x.len()];
        let mut tol = vec![0.0f64; x.len()];
        for t in 0..batch * seq {
            let p = start + t % seq;
            let (c, s) = (table.cos_row(p), table.sin_row(p));
            for hd in 0..heads {
                let base = (t * heads + hd) * d;
                for i in 0..half {
                    let (a, b) = (x[base + i] as f64, x[base + half + i] as f64);
                    let (ci, si) = (c[i] as f64, s[i] as f64);
                    want[base + i] = a * ci - b * si;
                    want[base + half + i] = b * ci + a * si;
                    tol[base + i] = 2.0 * U * ((a * ci).abs() + (b * si).abs());
                    tol[base + half + i] = 2.0 * U * ((b * ci).abs() + (a * si).abs());
                }
            }
        }
        assert_close("rope", &out, &want, |i| tol[i]);
        let mut back = vec![0.0; x.len()];
        rope::rope(&table, &out, seq, heads, start, true, &mut back);
        let want_back: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        assert_close("rope.inverse", &back, &want_back, |_| 8.0 * U * 2.0);
    }

    /// Cross-entropy: the loss inherits logsumexp's bound, `(vocab/4 + 46)U + 2U|lse|` per row,
    /// averaged. Backward: softmax's bound times `grad/rows`, plus `U·scale` for the one-hot.
    #[test]
    fn cross_entropy_matches_reference(rows in 1usize..6, vocab in len_strategy(), seed in any::<u64>()) {
        let z = vec_from_seed(rows * vocab, seed, 8.0);
        let targets: Vec<u32> = (0..rows).map(|r| ((seed as usize + 7 * r) % vocab) as u32).collect();
        let mut lse = vec![0.0; rows];
        let l = loss::cross_entropy(&z, &targets, vocab, &mut lse);
        let mut want_lse = vec![0.0f64; rows];
        let mut want_l = 0.0f64;
        for r in 0..rows {
            let zr = &z[r * vocab..(r + 1) * vocab];
            let m = zr.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
            want_lse[r] = m + zr.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
            want_l += (want_lse[r] - zr[targets[r] as usize] as f64) / rows as f64;
        }
        let c = (vocab / 4 + 46) as f64 * U;
        assert_close("cross_entropy.lse", &lse, &want_lse, |r| c + 2.0 * U * want_lse[r].abs());
        assert_close("cross_entropy.loss", &[l], &[want_l], |_| c + 4.0 * U * 20.0);
        let grad = 1.7f32;
        let mut dz = vec![0.0; z.len()];
        loss::cross_entropy_backward(&z, &targets, &lse, grad, &mut dz);
        let scale = grad as f64 / rows as f64;
        let mut want_dz = vec![0.0f64; z.len()];
        for r in 0..rows {
            for j in 0..vocab {
                let i = r * vocab + j;
                want_dz[i] = (z[i] as f64 - want_lse[r]).exp() * scale;
            }
            want_dz[r * vocab + targets[r] as usize] -= scale;
        }
        assert_close("cross_entropy_backward", &dz, &want_dz, |i| {
            (c + 2.0 * U * 30.0) * (want_dz[i].abs() + scale) + 2.0 * U * scale
        });
    }
}

/// Inputs at the edges of `exp`: large negative values and `-inf` give exactly 0, masked rows of
/// softmax stay finite where at least one entry is finite.
#[test]
fn exp_edges() {
    let x = [
        f32::NEG_INFINITY,
        -1e4,
        -104.0,
        -90.0,
        0.0,
        89.0,
        f32::INFINITY,
    ];
    let mut out = [1.0f32; 7];
    simd::exp(&x, &mut out);
    assert_eq!(&out[..4], &[0.0; 4]);
    assert_eq!(out[4], 1.0);
    assert_eq!(out[5], f32::INFINITY);
    assert_eq!(out[6], f32::INFINITY);
    let row = [f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY, 0.0];
    let mut p = [0.0f32; 4];
    softmax::softmax_rows(&row, 4, &mut p);
    assert_eq!(p, [0.0, 0.5, 0.0, 0.5]);
}
