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
    let c = AdamConsts {
        h,
        step_size,
        inv_bc2_sqrt: 1.0 / bc2_sqrt,
    };
    let serial = |param: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32]| {
        crate::simd::arch().dispatch(AdamOp {
            param,
            grad,
            m,
            v,
            c,
        })
    };
    match crate::par::elements_per_task(n) {
        None => serial(param, grad, m, v),
        Some(t) => crate::par::install(|| {
            use rayon::prelude::*;
            param
                .par_chunks_mut(t)
                .zip(grad.par_chunks(t))
                .zip(m.par_chunks_mut(t))
                .zip(v.par_chunks_mut(t))
                .for_each(|(((p, g), m), v)| serial(p, g, m, v));
        }),
    }
}

#[derive(Clone, Copy)]
struct AdamConsts {
    h: AdamHyper,
    step_size: f32,
    inv_bc2_sqrt: f32,
}

crate::simd::simd_op!(AdamOp<'a> {
    param: &'a mut [f32], grad: &'a [f32], m: &'a mut [f32], v: &'a mut [f32], c: AdamConsts
} -> () = |s| {
    let h = c.h;
    let (l2, decay) = match (h.weight_decay != 0.0, h.decoupled) {
        (false, _) => (0.0, 1.0),
        (true, false) => (h.weight_decay, 1.0),
        (true, true) => (0.0, 1.0 - h.lr * h.weight_decay),
    };
    let (pv, pt) = S::as_mut_simd_f32s(param);
    let (gv, gt) = S::as_simd_f32s(grad);
    let (mv, mt) = S::as_mut_simd_f32s(m);
    let (vv, vt) = S::as_mut_simd_f32s(v);
    for (((p, &g), mm), vq) in pv.iter_mut().zip(gv).zip(mv.iter_mut()).zip(vv.iter_mut()) {
        (*p, *mm, *vq) = adam_v(s, c, l2, decay, *p, g, *mm, *vq);
    }
    if !gt.is_empty() {
        let (p, mm, vq) = adam_v(
            s,
            c,
            l2,
            decay,
            s.partial_load_f32s(pt),
            s.partial_load_f32s(gt),
            s.partial_load_f32s(mt),
            s.partial_load_f32s(vt),
        );
        s.partial_store_f32s(pt, p);
        s.partial_store_f32s(mt, mm);
        s.partial_store_f32s(vt, vq);
    }
});

/// One Adam step on a vector of parameters (an `inline(always)` function rather than a closure so
/// that it is compiled with the dispatching function's target features).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn adam_v<S: pulp::Simd>(
    s: S,
    c: AdamConsts,
    l2: f32,
    decay: f32,
    p: S::f32s,
    g: S::f32s,
    mm: S::f32s,
    vv: S::f32s,
) -> (S::f32s, S::f32s, S::f32s) {
    let h = c.h;
    let p = s.mul_f32s(p, s.splat_f32s(decay));
    let g = s.mul_add_e_f32s(s.splat_f32s(l2), p, g);
    let mm = s.mul_add_e_f32s(
        s.splat_f32s(h.beta1),
        mm,
        s.mul_f32s(s.splat_f32s(1.0 - h.beta1), g),
    );
    let vv = s.mul_add_e_f32s(
        s.splat_f32s(h.beta2),
        vv,
        s.mul_f32s(s.mul_f32s(s.splat_f32s(1.0 - h.beta2), g), g),
    );
    let denom = s.mul_add_e_f32s(
        s.sqrt_f32s(vv),
        s.splat_f32s(c.inv_bc2_sqrt),
        s.splat_f32s(h.eps),
    );
    let p = s.sub_f32s(
        p,
        s.div_f32s(s.mul_f32s(s.splat_f32s(c.step_size), mm), denom),
    );
    (p, mm, vv)
}
