//! Adam and AdamW against a hand-written f64 transcription of PyTorch's `torch.optim.Adam` /
//! `AdamW` (single-tensor, non-amsgrad, non-maximize) over several steps.
//!
//! Bound: the f32 kernel rounds each of ~12 operations per step and carries the rounded state
//! forward; over `steps` steps we allow `|err| <= 64·U·steps·(|θ| + lr)` on the parameters and
//! `64·U·steps·(|m| + max|g|)` on the moments.

mod common;

use common::{vec_from_seed, U};
use riftco_kernels::{adam_update, AdamHyper};

/// PyTorch's update for one step (1-based `t`), in f64.
fn torch_step(p: &mut [f64], g: &[f64], m: &mut [f64], v: &mut [f64], t: i32, h: AdamHyper) {
    let (lr, b1, b2, eps, wd) = (
        h.lr as f64,
        h.beta1 as f64,
        h.beta2 as f64,
        h.eps as f64,
        h.weight_decay as f64,
    );
    for i in 0..p.len() {
        let mut grad = g[i];
        if h.decoupled {
            p[i] *= 1.0 - lr * wd; // AdamW: param.mul_(1 - lr * weight_decay)
        } else if wd != 0.0 {
            grad += wd * p[i]; // Adam: grad = grad.add(param, alpha=weight_decay)
        }
        m[i] = b1 * m[i] + (1.0 - b1) * grad; // exp_avg.lerp_(grad, 1 - beta1)
        v[i] = b2 * v[i] + (1.0 - b2) * grad * grad; // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2)
        let bc1 = 1.0 - b1.powi(t);
        let bc2 = 1.0 - b2.powi(t);
        let step_size = lr / bc1;
        let denom = v[i].sqrt() / bc2.sqrt() + eps;
        p[i] -= step_size * m[i] / denom;
    }
}

#[test]
fn adam_and_adamw_match_pytorch_formula() {
    let n = 1037;
    for (wd, decoupled) in [(0.0f32, false), (0.05, false), (0.05, true), (0.0, true)] {
        let h = AdamHyper {
            lr: 3e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: wd,
            decoupled,
        };
        let mut p = vec_from_seed(n, 1, 1.0);
        let (mut m, mut v) = (vec![0.0f32; n], vec![0.0f32; n]);
        let mut pr: Vec<f64> = p.iter().map(|&x| x as f64).collect();
        let (mut mr, mut vr) = (vec![0.0f64; n], vec![0.0f64; n]);
        let steps = 7;
        for t in 1..=steps {
            let g = vec_from_seed(n, 100 + t as u64, 0.5);
            adam_update(&mut p, &g, &mut m, &mut v, t as u64, h);
            let gr: Vec<f64> = g.iter().map(|&x| x as f64).collect();
            torch_step(&mut pr, &gr, &mut mr, &mut vr, t, h);
            let k = 64.0 * U * t as f64;
            common::assert_close("adam.param", &p, &pr, |i| k * (pr[i].abs() + h.lr as f64));
            common::assert_close("adam.m", &m, &mr, |i| k * (mr[i].abs() + 0.6));
            common::assert_close("adam.v", &v, &vr, |i| k * (vr[i].abs() + 0.36));
        }
    }
}
