//! Row-wise softmax and logsumexp over the last axis of a `[rows, cols]` matrix.

/// `out[r, :] = softmax(x[r, :])`, computed as `exp(x − max) / Σ exp(x − max)`.
pub fn softmax_rows(x: &[f32], cols: usize, out: &mut [f32]) {
    assert!(cols > 0 && x.len() % cols == 0, "softmax_rows: cols");
    assert_eq!(x.len(), out.len(), "softmax_rows: output length");
    for (xr, or) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        let max = xr.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f32;
        for (o, &v) in or.iter_mut().zip(xr) {
            let e = (v - max).exp();
            *o = e;
            sum += e;
        }
        let inv = 1.0 / sum;
        for o in or.iter_mut() {
            *o *= inv;
        }
    }
}

/// VJP of row softmax given its output `y`: `dx = y ⊙ (dy − Σ_j dy_j y_j)`.
pub fn softmax_rows_backward(y: &[f32], dy: &[f32], cols: usize, dx: &mut [f32]) {
    assert!(cols > 0 && y.len() % cols == 0, "softmax_rows_backward: cols");
    assert!(
        dy.len() == y.len() && dx.len() == y.len(),
        "softmax_rows_backward: lengths"
    );
    for ((yr, gr), dr) in y
        .chunks_exact(cols)
        .zip(dy.chunks_exact(cols))
        .zip(dx.chunks_exact_mut(cols))
    {
        let dot: f32 = yr.iter().zip(gr).map(|(a, b)| a * b).sum();
        for ((d, &yv), &g) in dr.iter_mut().zip(yr).zip(gr) {
            *d = yv * (g - dot);
        }
    }
}

/// `out[r] = log Σ_j exp(x[r, j])`, computed stably as `max + log Σ exp(x − max)`.
pub fn logsumexp_rows(x: &[f32], cols: usize, out: &mut [f32]) {
    assert!(cols > 0 && x.len() % cols == 0, "logsumexp_rows: cols");
    assert_eq!(x.len() / cols, out.len(), "logsumexp_rows: output length");
    for (xr, o) in x.chunks_exact(cols).zip(out.iter_mut()) {
        let max = xr.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            *o = f32::NEG_INFINITY;
            continue;
        }
        let sum: f32 = xr.iter().map(|&v| (v - max).exp()).sum();
        *o = max + sum.ln();
    }
}
