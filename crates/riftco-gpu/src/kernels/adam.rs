//! Adam and AdamW updates in place (`shaders/adam.wgsl`), the GPU twin of
//! `riftco_kernels::adam::adam_update` (Kingma & Ba 2015, Algorithm 1; Loshchilov & Hutter
//! 2019, Algorithm 2; PyTorch's formulation with bias correction). The step's constants
//! (`lr / (1 − β1^t)`, `1 / sqrt(1 − β2^t)`, the decay) are computed on the host exactly as the
//! CPU kernel computes them.

use riftco_kernels::adam::AdamHyper;

use super::{dispatch, expect_len, grid_1d, to_u32, words};
use crate::error::{GpuError, Result};
use crate::pipelines::{Family, Kernel};
use crate::pool::GpuBuffer;
use crate::GpuContext;

/// One update at 1-based `step`, in place on `param`, `m` and `v` (all `[n]` f32, like
/// `grad`): `m ← β1 m + (1−β1) g`, `v ← β2 v + (1−β2) g²`,
/// `θ ← θ − (lr / (1−β1^t)) · m / (sqrt(v) / sqrt(1−β2^t) + eps)`; with weight decay, `g +=
/// wd·θ` (Adam) or `θ ← θ (1 − lr·wd)` first (AdamW, `h.decoupled`).
///
/// # Errors
/// [`GpuError::Shape`] when `step` is 0 or the four lengths differ, or when two of `param`,
/// `m`, `v` are the same buffer; device errors.
pub fn adam_update(
    ctx: &GpuContext,
    param: &GpuBuffer,
    grad: &GpuBuffer,
    m: &GpuBuffer,
    v: &GpuBuffer,
    step: u64,
    h: AdamHyper,
) -> Result<()> {
    let op = "adam_update";
    if step == 0 {
        return Err(GpuError::Shape {
            op,
            message: "step = 0, expected a 1-based step".to_owned(),
        });
    }
    let n = param.len();
    expect_len(op, "grad", grad, n)?;
    expect_len(op, "m", m, n)?;
    expect_len(op, "v", v, n)?;
    if param.raw() == m.raw() || param.raw() == v.raw() || m.raw() == v.raw() {
        return Err(GpuError::Shape {
            op,
            message: "param, m and v must be three distinct buffers".to_owned(),
        });
    }
    if n == 0 {
        return Ok(());
    }
    let t = step.min(i32::MAX as u64) as i32;
    let bc1 = 1.0 - h.beta1.powi(t);
    let bc2_sqrt = (1.0 - h.beta2.powi(t)).sqrt();
    let step_size = h.lr / bc1;
    let inv_bc2_sqrt = 1.0 / bc2_sqrt;
    let (l2, decay) = match (h.weight_decay != 0.0, h.decoupled) {
        (false, _) => (0.0f32, 1.0f32),
        (true, false) => (h.weight_decay, 1.0),
        (true, true) => (0.0, 1.0 - h.lr * h.weight_decay),
    };
    let params = words(&[
        to_u32(op, "n", n)?,
        step_size.to_bits(),
        inv_bc2_sqrt.to_bits(),
        h.beta1.to_bits(),
        h.beta2.to_bits(),
        (1.0 - h.beta1).to_bits(),
        (1.0 - h.beta2).to_bits(),
        h.eps.to_bits(),
        l2.to_bits(),
        decay.to_bits(),
        0,
        0,
    ]);
    let kernel = Kernel::new(Family::Adam, op);
    dispatch(ctx, kernel, &[grad, param, m, v], &params, grid_1d(op, n)?)
}
