//! Softmax cross-entropy with logits, `loss_r = logsumexp(z_r) − z_r[t_r]`, averaged over rows.

/// Forward: writes the per-row logsumexp into `lse` (`[rows]`) and returns the mean loss,
/// accumulated in f64 in row order.
///
/// # Panics
/// When lengths disagree or a target is `>= vocab` (callers validate first).
pub fn cross_entropy(logits: &[f32], targets: &[u32], vocab: usize, lse: &mut [f32]) -> f32 {
    let rows = targets.len();
    assert!(vocab > 0 && logits.len() == rows * vocab, "cross_entropy: layout");
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
    assert!(rows > 0 && logits.len() % rows == 0, "cross_entropy_backward: layout");
    let vocab = logits.len() / rows;
    assert_eq!(dlogits.len(), logits.len(), "cross_entropy_backward: output length");
    let scale = grad / rows as f32;
    for (r, (zr, dr)) in logits
        .chunks_exact(vocab)
        .zip(dlogits.chunks_exact_mut(vocab))
        .enumerate()
    {
        let l = lse[r];
        for (d, &z) in dr.iter_mut().zip(zr) {
            *d = (z - l).exp() * scale;
        }
        dr[targets[r] as usize] -= scale;
    }
}
