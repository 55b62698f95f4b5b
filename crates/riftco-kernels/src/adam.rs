//! Adam and AdamW updates (Kingma & Ba 2015, Algorithm 1; Loshchilov & Hutter 2019, Algorithm 2),
//! with PyTorch's defaults and bias correction.

/// Hyper-parameters of one Adam/AdamW update.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamHyper {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay (PyTorch default 0.9).
    pub beta1: f32,
    /// Second-moment decay (PyTorch default 0.999).
    pub beta2: f32,
    /// Denominator epsilon (PyTorch default 1e-8).
    pub eps: f32,
    /// Weight decay: L2 added to the gradient (Adam) or decoupled (AdamW).
    pub weight_decay: f32,
    /// AdamW: decay the weights directly instead of adding `wd·θ` to the gradient.
    pub decoupled: bool,
}

impl Default for AdamHyper {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
        }
    }
}

/// One update at 1-based `step`, in place on `param`, `m` and `v`:
/// `m ← β1 m + (1−β1) g`, `v ← β2 v + (1−β2) g²`,
/// `θ ← θ − (lr / (1−β1^t)) · m / (sqrt(v) / sqrt(1−β2^t) + eps)` (PyTorch's formulation).
pub fn adam_update(
    param: &mut [f32],
    grad: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    step: u64,
    h: AdamHyper,
) {
    let n = param.len();
    assert!(
        grad.len() == n && m.len() == n && v.len() == n,
        "adam_update: lengths"
    );
    assert!(step >= 1, "adam_update: step is 1-based");
    let t = step.min(i32::MAX as u64) as i32;
    let bc1 = 1.0 - h.beta1.powi(t);
    let bc2_sqrt = (1.0 - h.beta2.powi(t)).sqrt();
    let step_size = h.lr / bc1;
    for i in 0..n {
        let mut g = grad[i];
        if h.weight_decay != 0.0 {
            if h.decoupled {
                param[i] *= 1.0 - h.lr * h.weight_decay;
            } else {
                g += h.weight_decay * param[i];
            }
        }
        m[i] = h.beta1 * m[i] + (1.0 - h.beta1) * g;
        v[i] = h.beta2 * v[i] + (1.0 - h.beta2) * g * g;
        let denom = v[i].sqrt() / bc2_sqrt + h.eps;
        param[i] -= step_size * m[i] / denom;
    }
}
