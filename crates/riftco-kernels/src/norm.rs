//! RMSNorm (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization", eq. 4):
//! `y = x / sqrt(mean(x²) + eps) ⊙ weight`, over the last axis of `[rows, cols]`.
//!
//! Rows are independent and split into blocks over the kernel pool. The weight gradient sums
//! over rows: it is accumulated per block of [`DWEIGHT_BLOCK_ROWS`] rows (fixed boundaries,
//! independent of the thread count) and the block partials are added in block order, so the
//! result is bitwise the same for any thread count.

use pulp::Simd;
use rayon::prelude::*;

use crate::par;
use crate::simd::{arch, map2, simd_op, sum_map};

/// One block of the weight-gradient pass: `((((dx, x), rstd), dy), partial)`.
type BwdBlock<'a> = (
    (((&'a mut [f32], &'a [f32]), &'a [f32]), &'a [f32]),
    &'a mut [f32],
);

/// Rows per partial sum of the RMSNorm weight gradient (fixed, so the summation order is too).
pub const DWEIGHT_BLOCK_ROWS: usize = 32;

simd_op!(RmsOp<'a> { x: &'a [f32], weight: &'a [f32], eps: f32, y: &'a mut [f32], rstd: &'a mut [f32] } -> () = |s| {
    let cols = weight.len();
    for ((xr, yr), r) in x.chunks_exact(cols).zip(y.chunks_exact_mut(cols)).zip(rstd.iter_mut()) {
        let ss = sum_map!(S, s, xr, |v| s.mul_f32s(v, v));
        let inv = 1.0 / (ss / cols as f32 + eps).sqrt();
        *r = inv;
        let iv = s.splat_f32s(inv);
        map2!(S, s, xr, weight, yr, |v, w| s.mul_f32s(s.mul_f32s(v, iv), w));
    }
});

simd_op!(RmsBwdOp<'a> {
    x: &'a [f32], weight: &'a [f32], rstd: &'a [f32], dy: &'a [f32], dx: &'a mut [f32],
    dweight: Option<&'a mut [f32]>
} -> () = |s| rms_backward_rows(s, x, weight, rstd, dy, dx, dweight));

/// Backward over a block of rows; when `dweight` is given, overwrites it with this block's
/// `Σ_rows dy ⊙ x ⊙ rstd` (rows in order).
#[inline(always)]
fn rms_backward_rows<S: Simd>(
    s: S,
    x: &[f32],
    weight: &[f32],
    rstd: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    mut dweight: Option<&mut [f32]>,
) {
    let cols = weight.len();
    if let Some(dw) = dweight.as_deref_mut() {
        dw.fill(0.0);
    }
    let (wv, wt) = S::as_simd_f32s(weight);
    for (r, ((xr, gr), dr)) in x
        .chunks_exact(cols)
        .zip(dy.chunks_exact(cols))
        .zip(dx.chunks_exact_mut(cols))
        .enumerate()
    {
        let inv = rstd[r];
        // Σ x·w·dy, with w·dy formed per vector.
        let (xv, xt) = S::as_simd_f32s(xr);
        let (gv, gt) = S::as_simd_f32s(gr);
        let mut acc = s.splat_f32s(0.0);
        for ((&a, &g), &w) in xv.iter().zip(gv).zip(wv) {
            acc = s.mul_add_e_f32s(a, s.mul_f32s(g, w), acc);
        }
        let mut d = s.reduce_sum_f32s(acc);
        for ((&a, &g), &w) in xt.iter().zip(gt).zip(wt) {
            d += a * (g * w);
        }
        let coef = s.splat_f32s(d * inv * inv * inv / cols as f32);
        let iv = s.splat_f32s(inv);
        let (dv, dt) = S::as_mut_simd_f32s(dr);
        for (((o, &a), &g), &w) in dv.iter_mut().zip(xv).zip(gv).zip(wv) {
            *o = rms_dx_v(s, iv, coef, a, g, w);
        }
        if !xt.is_empty() {
            let v = rms_dx_v(
                s,
                iv,
                coef,
                s.partial_load_f32s(xt),
                s.partial_load_f32s(gt),
                s.partial_load_f32s(wt),
            );
            s.partial_store_f32s(dt, v);
        }
        if let Some(dw) = dweight.as_deref_mut() {
            let (awv, awt) = S::as_mut_simd_f32s(dw);
            for ((a, &xa), &g) in awv.iter_mut().zip(xv).zip(gv) {
                *a = s.mul_add_e_f32s(s.mul_f32s(g, xa), iv, *a);
            }
            for ((a, &xa), &g) in awt.iter_mut().zip(xt).zip(gt) {
                *a += g * xa * inv;
            }
        }
    }
}

/// Forward. Writes `y` and the per-row reciprocal RMS `rstd[r] = 1/sqrt(mean(x²)+eps)` that the
/// backward pass reuses.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, y: &mut [f32], rstd: &mut [f32]) {
    let cols = weight.len();
    assert!(cols > 0 && x.len() % cols == 0, "rms_norm: cols");
    assert_eq!(y.len(), x.len(), "rms_norm: output length");
    assert_eq!(rstd.len(), x.len() / cols, "rms_norm: rstd length");
    let serial = |x: &[f32], y: &mut [f32], rstd: &mut [f32]| {
        arch().dispatch(RmsOp {
            x,
            weight,
            eps,
            y,
            rstd,
        })
    };
    match par::rows_per_task(rstd.len(), cols) {
        None => serial(x, y, rstd),
        Some(r) => par::install(|| {
            y.par_chunks_mut(r * cols)
                .zip(rstd.par_chunks_mut(r))
                .zip(x.par_chunks(r * cols))
                .for_each(|((y, rs), x)| serial(x, y, rs));
        }),
    }
}

/// Backward. Given `x`, `weight`, the forward's `rstd` and upstream `dy`, writes
/// `dx = rstd ⊙ (w⊙dy) − x · rstd³ · mean(x ⊙ w ⊙ dy)` and, when `dweight` is given, adds
/// `Σ_rows dy ⊙ x ⊙ rstd` into it (per-block partials of [`DWEIGHT_BLOCK_ROWS`] rows, added in
/// block order).
pub fn rms_norm_backward(
    x: &[f32],
    weight: &[f32],
    rstd: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    dweight: Option<&mut [f32]>,
) {
    let cols = weight.len();
    assert!(cols > 0 && x.len() % cols == 0, "rms_norm_backward: cols");
    assert!(
        dy.len() == x.len() && dx.len() == x.len() && rstd.len() == x.len() / cols,
        "rms_norm_backward: lengths"
    );
    let rows = rstd.len();
    let Some(dweight) = dweight else {
        let serial = |x: &[f32], rstd: &[f32], dy: &[f32], dx: &mut [f32]| {
            arch().dispatch(RmsBwdOp {
                x,
                weight,
                rstd,
                dy,
                dx,
                dweight: None,
            })
        };
        match par::rows_per_task(rows, cols) {
            None => serial(x, rstd, dy, dx),
            Some(r) => par::install(|| {
                dx.par_chunks_mut(r * cols)
                    .zip(x.par_chunks(r * cols))
                    .zip(rstd.par_chunks(r))
                    .zip(dy.par_chunks(r * cols))
                    .for_each(|(((d, x), rs), g)| serial(x, rs, g, d));
            }),
        }
        return;
    };
    assert_eq!(dweight.len(), cols, "rms_norm_backward: dweight length");
    if rows == 0 {
        return;
    }
    let block = DWEIGHT_BLOCK_ROWS;
    let n_blocks = rows.div_ceil(block);
    let mut partials = vec![0.0f32; n_blocks * cols];
    let task = |((((d, x), rs), g), p): BwdBlock<'_>| {
        arch().dispatch(RmsBwdOp {
            x,
            weight,
            rstd: rs,
            dy: g,
            dx: d,
            dweight: Some(p),
        })
    };
    if par::rows_per_task(rows, cols).is_some() {
        par::install(|| {
            dx.par_chunks_mut(block * cols)
                .zip(x.par_chunks(block * cols))
                .zip(rstd.par_chunks(block))
                .zip(dy.par_chunks(block * cols))
                .zip(partials.par_chunks_mut(cols))
                .for_each(task);
        });
    } else {
        // Same blocks, same order of additions, on the calling thread.
        dx.chunks_mut(block * cols)
            .zip(x.chunks(block * cols))
            .zip(rstd.chunks(block))
            .zip(dy.chunks(block * cols))
            .zip(partials.chunks_mut(cols))
            .for_each(task);
    }
    for p in partials.chunks_exact(cols) {
        crate::elementwise::add_assign(dweight, p);
    }
}

/// `dx = rstd·(w·dy) − x·coef` on one vector.
#[inline(always)]
fn rms_dx_v<S: Simd>(
    s: S,
    iv: S::f32s,
    coef: S::f32s,
    x: S::f32s,
    g: S::f32s,
    w: S::f32s,
) -> S::f32s {
    s.sub_f32s(s.mul_f32s(iv, s.mul_f32s(w, g)), s.mul_f32s(x, coef))
}
