//! RMSNorm (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization", eq. 4):
//! `y = x / sqrt(mean(x²) + eps) ⊙ weight`, over the last axis of `[rows, cols]`.

/// Forward. Writes `y` and the per-row reciprocal RMS `rstd[r] = 1/sqrt(mean(x²)+eps)` that the
/// backward pass reuses.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, y: &mut [f32], rstd: &mut [f32]) {
    let cols = weight.len();
    assert!(cols > 0 && x.len() % cols == 0, "rms_norm: cols");
    assert_eq!(y.len(), x.len(), "rms_norm: output length");
    assert_eq!(rstd.len(), x.len() / cols, "rms_norm: rstd length");
    for ((xr, yr), r) in x
        .chunks_exact(cols)
        .zip(y.chunks_exact_mut(cols))
        .zip(rstd.iter_mut())
    {
        let ss: f32 = xr.iter().map(|v| v * v).sum();
        let inv = 1.0 / (ss / cols as f32 + eps).sqrt();
        *r = inv;
        for ((o, &v), &w) in yr.iter_mut().zip(xr).zip(weight) {
            *o = v * inv * w;
        }
    }
}

/// Backward. Given `x`, `weight`, the forward's `rstd` and upstream `dy`, writes
/// `dx = rstd ⊙ (w⊙dy) − x · rstd³ · mean(x ⊙ w ⊙ dy)` and, when `dweight` is given, adds
/// `Σ_rows dy ⊙ x ⊙ rstd` into it.
pub fn rms_norm_backward(
    x: &[f32],
    weight: &[f32],
    rstd: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    mut dweight: Option<&mut [f32]>,
) {
    let cols = weight.len();
    assert!(cols > 0 && x.len() % cols == 0, "rms_norm_backward: cols");
    assert!(
        dy.len() == x.len() && dx.len() == x.len() && rstd.len() == x.len() / cols,
        "rms_norm_backward: lengths"
    );
    for (r, ((xr, gr), dr)) in x
        .chunks_exact(cols)
        .zip(dy.chunks_exact(cols))
        .zip(dx.chunks_exact_mut(cols))
        .enumerate()
    {
        let inv = rstd[r];
        let dot: f32 = xr
            .iter()
            .zip(gr)
            .zip(weight)
            .map(|((&xv, &g), &w)| xv * g * w)
            .sum();
        let coef = dot * inv * inv * inv / cols as f32;
        for (((d, &xv), &g), &w) in dr.iter_mut().zip(xr).zip(gr).zip(weight) {
            *d = inv * w * g - xv * coef;
        }
        if let Some(dw) = dweight.as_deref_mut() {
            for ((a, &xv), &g) in dw.iter_mut().zip(xr).zip(gr) {
                *a += g * xv * inv;
            }
        }
    }
}
