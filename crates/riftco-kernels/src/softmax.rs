//! Row-wise softmax and logsumexp over the last axis of a `[rows, cols]` matrix.
//!
//! Each row is reduced by one task in a fixed order; large matrices are split into blocks of
//! whole rows over the kernel pool, so results do not depend on the thread count.

use pulp::Simd;
use rayon::prelude::*;

use crate::par;
use crate::simd::{arch, dot, exp_f32s, map2, max, simd_op, sum_map};

/// Writes `exp(x − shift)` into `out` and returns its sum.
#[inline(always)]
pub(crate) fn exp_shifted_sum<S: Simd>(s: S, x: &[f32], shift: f32, out: &mut [f32]) -> f32 {
    let sh = s.splat_f32s(shift);
    let (xv, xt) = S::as_simd_f32s(x);
    let (ov, ot) = S::as_mut_simd_f32s(out);
    let (mut acc0, mut acc1) = (s.splat_f32s(0.0), s.splat_f32s(0.0));
    let mut pairs_o = ov.chunks_exact_mut(2);
    let mut pairs_x = xv.chunks_exact(2);
    for (o, v) in (&mut pairs_o).zip(&mut pairs_x) {
        let e0 = exp_f32s(s, s.sub_f32s(v[0], sh));
        let e1 = exp_f32s(s, s.sub_f32s(v[1], sh));
        o[0] = e0;
        o[1] = e1;
        acc0 = s.add_f32s(acc0, e0);
        acc1 = s.add_f32s(acc1, e1);
    }
    for (o, &v) in pairs_o.into_remainder().iter_mut().zip(pairs_x.remainder()) {
        let e = exp_f32s(s, s.sub_f32s(v, sh));
        *o = e;
        acc0 = s.add_f32s(acc0, e);
    }
    let mut total = s.reduce_sum_f32s(s.add_f32s(acc0, acc1));
    if !xt.is_empty() {
        let e = exp_f32s(s, s.sub_f32s(s.partial_load_f32s(xt), sh));
        s.partial_store_f32s(ot, e);
        for &v in ot.iter() {
            total += v;
        }
    }
    total
}

/// `out *= alpha`, in place.
#[inline(always)]
pub(crate) fn scale_in_place<S: Simd>(s: S, out: &mut [f32], alpha: f32) {
    let al = s.splat_f32s(alpha);
    let (ov, ot) = S::as_mut_simd_f32s(out);
    for o in ov.iter_mut() {
        *o = s.mul_f32s(*o, al);
    }
    for o in ot.iter_mut() {
        *o *= alpha;
    }
}

/// `Σ exp(x − shift)` without storing.
#[inline(always)]
pub(crate) fn sum_exp_shifted<S: Simd>(s: S, x: &[f32], shift: f32) -> f32 {
    let head = x.len() - x.len() % S::F32_LANES;
    let (xh, xt) = x.split_at(head);
    let sh = s.splat_f32s(shift);
    // The tail is summed lane by lane: zero padding would add exp(0 − shift).
    let mut total = sum_map!(S, s, xh, |v| exp_f32s(s, s.sub_f32s(v, sh)));
    for &v in xt {
        total += exp_f32s(pulp::Scalar, v - shift);
    }
    total
}

simd_op!(SoftmaxOp<'a> { x: &'a [f32], cols: usize, out: &'a mut [f32] } -> () = |s| {
    for (xr, or) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        let m = max(s, xr);
        let sum = exp_shifted_sum(s, xr, m, or);
        scale_in_place(s, or, 1.0 / sum);
    }
});

simd_op!(SoftmaxBwdOp<'a> { y: &'a [f32], dy: &'a [f32], cols: usize, dx: &'a mut [f32] } -> () = |s| {
    for ((yr, gr), dr) in y.chunks_exact(cols).zip(dy.chunks_exact(cols)).zip(dx.chunks_exact_mut(cols)) {
        let d = s.splat_f32s(dot(s, yr, gr));
        map2!(S, s, yr, gr, dr, |yv, g| s.mul_f32s(yv, s.sub_f32s(g, d)));
    }
});

simd_op!(LseOp<'a> { x: &'a [f32], cols: usize, out: &'a mut [f32] } -> () = |s| {
    for (xr, o) in x.chunks_exact(cols).zip(out.iter_mut()) {
        *o = logsumexp_row(s, xr);
    }
});

/// `log Σ exp(x)` of one row (`-inf` when every entry is `-inf`).
#[inline(always)]
pub(crate) fn logsumexp_row<S: Simd>(s: S, xr: &[f32]) -> f32 {
    let m = max(s, xr);
    if m == f32::NEG_INFINITY {
        return f32::NEG_INFINITY;
    }
    m + sum_exp_shifted(s, xr, m).ln()
}

/// `out[r, :] = softmax(x[r, :])`, computed as `exp(x − max) / Σ exp(x − max)`.
pub fn softmax_rows(x: &[f32], cols: usize, out: &mut [f32]) {
    assert!(cols > 0 && x.len() % cols == 0, "softmax_rows: cols");
    assert_eq!(x.len(), out.len(), "softmax_rows: output length");
    let serial = |x: &[f32], out: &mut [f32]| arch().dispatch(SoftmaxOp { x, cols, out });
    match par::rows_per_task(x.len() / cols, cols) {
        None => serial(x, out),
        Some(r) => par::install(|| {
            x.par_chunks(r * cols)
                .zip(out.par_chunks_mut(r * cols))
                .for_each(|(x, o)| serial(x, o));
        }),
    }
}

/// VJP of row softmax given its output `y`: `dx = y ⊙ (dy − Σ_j dy_j y_j)`.
pub fn softmax_rows_backward(y: &[f32], dy: &[f32], cols: usize, dx: &mut [f32]) {
    assert!(
        cols > 0 && y.len() % cols == 0,
        "softmax_rows_backward: cols"
    );
    assert!(
        dy.len() == y.len() && dx.len() == y.len(),
        "softmax_rows_backward: lengths"
    );
    let serial =
        |y: &[f32], dy: &[f32], dx: &mut [f32]| arch().dispatch(SoftmaxBwdOp { y, dy, cols, dx });
    match par::rows_per_task(y.len() / cols, cols) {
        None => serial(y, dy, dx),
        Some(r) => par::install(|| {
            dx.par_chunks_mut(r * cols)
                .zip(y.par_chunks(r * cols))
                .zip(dy.par_chunks(r * cols))
                .for_each(|((d, y), g)| serial(y, g, d));
        }),
    }
}

/// `out[r] = log Σ_j exp(x[r, j])`, computed stably as `max + log Σ exp(x − max)`.
pub fn logsumexp_rows(x: &[f32], cols: usize, out: &mut [f32]) {
    assert!(cols > 0 && x.len() % cols == 0, "logsumexp_rows: cols");
    assert_eq!(x.len() / cols, out.len(), "logsumexp_rows: output length");
    let serial = |x: &[f32], out: &mut [f32]| arch().dispatch(LseOp { x, cols, out });
    match par::rows_per_task(out.len(), cols) {
        None => serial(x, out),
        Some(r) => par::install(|| {
            x.par_chunks(r * cols)
                .zip(out.par_chunks_mut(r))
                .for_each(|(x, o)| serial(x, o));
        }),
    }
}
