//! Softmax cross-entropy with logits, `loss_r = logsumexp(z_r) − z_r[t_r]`, averaged over rows.

/// Forward: writes the per-row logsumexp into `lse` (`[rows]`) and returns the mean loss,
/// accumulated in f64 in row order.
///
/// # Panics
/// When lengths disagree or a target is `>= vocab` (callers validate first).
pub fn cross_entropy(logits: &[f32], targets: &[u32], vocab: usize, lse: &mut [f32]) -> f32 {
    let rows = targets.len();
    assert!(
        vocab > 0 && logits.len() == rows * vocab,
        "cross_entropy: layout"
    );
    assert_eq!(lse.len(), rows, "cross_entropy: lse length");
    crate::softmax::logsumexp_rows(logits, vocab, lse);
    let mut total = 0.0f64;
    for (r, &t) in targets.iter().enumerate() {
        let t = t as usize;
        assert!(t < vocab, "cross_entropy: target out of range");
        total += (lse[r] - logits[r * vocab + t]) as f64;
    }
    if rows == 0 {
        0.0
    } else {
        (total / rows as f64) as f32
    }
}

/// Backward of the *mean* loss times upstream scalar `grad`: `dlogits = (softmax(z) − onehot(t))
/// · grad / rows`.
pub fn cross_entropy_backward(
    logits: &[f32],
    targets: &[u32],
    lse: &[f32],
    grad: f32,
    dlogits: &mut [f32],
) {
    let rows = targets.len();
    assert!(rows > 0, "cross_entropy_backward: layout");
    cross_entropy_backward_scaled(logits, targets, lse, grad / rows as f32, dlogits);
}

/// `dlogits = (softmax(z) − onehot(t)) · scale` for rows of `logits [rows, vocab]` with their
/// `lse [rows]`: [`cross_entropy_backward`] with the factor given (`grad / rows` there), so a
/// caller that splits the rows into chunks keeps the factor of the whole mean.
///
/// # Panics
/// When the lengths disagree or a target is `>= vocab` (callers validate first).
pub fn cross_entropy_backward_scaled(
    logits: &[f32],
    targets: &[u32],
    lse: &[f32],
    scale: f32,
    dlogits: &mut [f32],
) {
    let rows = targets.len();
    assert!(
        rows > 0 && logits.len() % rows == 0 && dlogits.len() == logits.len(),
        "cross_entropy_backward: layout"
    );
    assert_eq!(lse.len(), rows, "cross_entropy_backward: lse length");
    let vocab = logits.len() / rows;
    let serial = |targets: &[u32], lse: &[f32], logits: &[f32], dlogits: &mut [f32]| {
        crate::simd::arch().dispatch(CeBwdOp {
            logits,
            targets,
            lse,
            scale,
            dlogits,
        })
    };
    match crate::par::rows_per_task(rows, vocab) {
        None => serial(targets, lse, logits, dlogits),
        Some(r) => crate::par::install(|| {
            use rayon::prelude::*;
            dlogits
                .par_chunks_mut(r * vocab)
                .zip(logits.par_chunks(r * vocab))
                .zip(targets.par_chunks(r))
                .zip(lse.par_chunks(r))
                .for_each(|(((d, z), t), l)| serial(t, l, z, d));
        }),
    }
}

crate::simd::simd_op!(CeBwdOp<'a> {
    logits: &'a [f32], targets: &'a [u32], lse: &'a [f32], scale: f32, dlogits: &'a mut [f32]
} -> () = |s| {
    let vocab = logits.len() / targets.len().max(1);
    let sc = s.splat_f32s(scale);
    for (r, (zr, dr)) in logits.chunks_exact(vocab).zip(dlogits.chunks_exact_mut(vocab)).enumerate() {
        let l = s.splat_f32s(lse[r]);
        ce_grad_row(s, zr, l, sc, dr);
        let t = targets[r] as usize;
        assert!(t < vocab, "cross_entropy_backward: target out of range");
        dr[t] -= scale;
    }
});

/// [`cross_entropy_backward_scaled`] in place: `z` (the logits of `targets.len()` rows) is
/// overwritten by its gradient, bitwise what the out-of-place form writes.
///
/// # Panics
/// When the lengths disagree or a target is `>= vocab` (callers validate first).
pub fn cross_entropy_backward_in_place(z: &mut [f32], targets: &[u32], lse: &[f32], scale: f32) {
    let rows = targets.len();
    assert!(
        rows > 0 && z.len() % rows == 0,
        "cross_entropy_backward: layout"
    );
    assert_eq!(lse.len(), rows, "cross_entropy_backward: lse length");
    let vocab = z.len() / rows;
    let serial = |targets: &[u32], lse: &[f32], z: &mut [f32]| {
        crate::simd::arch().dispatch(CeBwdInPlaceOp {
            z,
            targets,
            lse,
            scale,
        })
    };
    match crate::par::rows_per_task(rows, vocab) {
        None => serial(targets, lse, z),
        Some(r) => crate::par::install(|| {
            use rayon::prelude::*;
            z.par_chunks_mut(r * vocab)
                .zip(targets.par_chunks(r))
                .zip(lse.par_chunks(r))
                .for_each(|((z, t), l)| serial(t, l, z));
        }),
    }
}

crate::simd::simd_op!(CeBwdInPlaceOp<'a> {
    z: &'a mut [f32], targets: &'a [u32], lse: &'a [f32], scale: f32
} -> () = |s| {
    let vocab = z.len() / targets.len().max(1);
    let sc = s.splat_f32s(scale);
    for (r, zr) in z.chunks_exact_mut(vocab).enumerate() {
        let l = s.splat_f32s(lse[r]);
        ce_grad_row_in_place(s, zr, l, sc);
        let t = targets[r] as usize;
        assert!(t < vocab, "cross_entropy_backward: target out of range");
        zr[t] -= scale;
    }
});

/// `z = exp(z − l) · scale` for one row, in place (the arithmetic of [`ce_grad_row`]).
#[inline(always)]
fn ce_grad_row_in_place<S: pulp::Simd>(s: S, z: &mut [f32], l: S::f32s, sc: S::f32s) {
    let (zv, zt) = S::as_mut_simd_f32s(z);
    for x in zv.iter_mut() {
        *x = s.mul_f32s(crate::simd::exp_f32s(s, s.sub_f32s(*x, l)), sc);
    }
    if !zt.is_empty() {
        let e = crate::simd::exp_f32s(s, s.sub_f32s(s.partial_load_f32s(zt), l));
        s.partial_store_f32s(zt, s.mul_f32s(e, sc));
    }
}

/// `d = exp(z − l) · scale` for one row (an `inline(always)` function, not a closure, so it is
/// compiled with the dispatching function's target features).
#[inline(always)]
fn ce_grad_row<S: pulp::Simd>(s: S, z: &[f32], l: S::f32s, sc: S::f32s, d: &mut [f32]) {
    let (zv, zt) = S::as_simd_f32s(z);
    let (dv, dt) = S::as_mut_simd_f32s(d);
    for (o, &x) in dv.iter_mut().zip(zv) {
        *o = s.mul_f32s(crate::simd::exp_f32s(s, s.sub_f32s(x, l)), sc);
    }
    if !zt.is_empty() {
        let e = crate::simd::exp_f32s(s, s.sub_f32s(s.partial_load_f32s(zt), l));
        s.partial_store_f32s(dt, s.mul_f32s(e, sc));
    }
}
