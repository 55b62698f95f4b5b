//! Shared test helpers: central finite differences.
#![allow(dead_code, clippy::needless_range_loop)]

use riftco_autograd::{checkpoint, no_grad, ops, Result, Variable};
use riftco_tensor::{MemoryCategory as C, Tensor};

/// A random tensor in `[-1, 1)` (workspace category).
pub fn rand(shape: &[usize], seed: u64) -> Tensor {
    Tensor::rand_uniform(shape.to_vec(), -1.0, 1.0, seed, C::Workspace)
}

/// Checks the VJPs of `f` at `inputs` against central finite differences of the scalar
/// `L = Σ y ⊙ w` (w random, fixed), `dL/dx_i ≈ (L(x+h e_i) − L(x−h e_i)) / 2h` with `h = 1e-2`,
/// `L` accumulated in f64 from the f32 outputs.
///
/// Tolerance: `|analytic − numeric| ≤ 2e-3 + 2e-2·|numeric|` — f32 forward rounding contributes
/// about `1e-7·|L|/h` and truncation `O(h²)` for smooth ops.
pub fn gradcheck(
    f: impl Fn(&[Variable]) -> Result<Variable>,
    inputs: &[Tensor],
    differentiable: &[bool],
) {
    let leaves: Vec<Variable> = inputs
        .iter()
        .zip(differentiable)
        .map(|(t, &d)| Variable::leaf(t.deep_clone(C::Workspace), d))
        .collect();
    let y = f(&leaves).expect("forward");
    let w = rand(y.dims(), 999);
    let loss = ops::sum(&ops::mul(&y, &Variable::constant(w.clone())).unwrap()).unwrap();
    loss.backward().expect("backward");
    let weights = w.to_vec();
    let eval = |vals: &[Tensor]| -> f64 {
        no_grad(|| {
            let vars: Vec<Variable> = vals.iter().map(|t| Variable::constant(t.clone())).collect();
            let out = f(&vars).expect("forward");
            let data = out.value().to_vec();
            data.iter()
                .zip(&weights)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>()
        })
    };
    let h = 1e-2f32;
    for (idx, leaf) in leaves.iter().enumerate() {
        if !differentiable[idx] {
            assert!(
                leaf.grad().is_none(),
                "input {idx} is frozen but got a gradient"
            );
            continue;
        }
        let analytic = leaf
            .grad()
            .expect("gradient for a differentiable input")
            .to_vec();
        for e in 0..inputs[idx].numel() {
            let vals: Vec<Tensor> = inputs.iter().map(|t| t.deep_clone(C::Workspace)).collect();
            let base = inputs[idx].read().unwrap()[e];
            vals[idx].write().unwrap()[e] = base + h;
            let plus = eval(&vals);
            vals[idx].write().unwrap()[e] = base - h;
            let minus = eval(&vals);
            let numeric = (plus - minus) / (2.0 * h as f64);
            let a = analytic[e] as f64;
            assert!(
                (a - numeric).abs() <= 2e-3 + 2e-2 * numeric.abs(),
                "input {idx} element {e}: analytic {a} vs finite difference {numeric}"
            );
        }
    }
}

/// A small residual MLP block: `x + W2·SiLU(W1·rmsnorm(x, g))`.
pub fn block(x: &Variable, p: &[Variable]) -> Result<Variable> {
    let h = ops::rms_norm(x, &p[0], 1e-5)?;
    let h = ops::silu(&ops::linear(&h, &p[1])?)?;
    ops::add(x, &ops::linear(&h, &p[2])?)
}

/// Parameters of [`block`] for width `d`: RMSNorm gain `[d]`, `W1 [3d, d]`, `W2 [d, 3d]`.
pub fn params(seed: u64, d: usize, trainable: bool) -> Vec<Variable> {
    vec![
        Variable::leaf(rand(&[d], seed), trainable),
        Variable::leaf(rand(&[3 * d, d], seed + 1), trainable),
        Variable::leaf(rand(&[d, 3 * d], seed + 2), trainable),
    ]
}

/// `Σ h²` of a chain of [`block`]s, each checkpointed or not.
pub fn run_chain(x: &Variable, layers: &[Vec<Variable>], ckpt: bool) -> Variable {
    let mut h = x.clone();
    for p in layers {
        h = if ckpt {
            let p2 = p.clone();
            checkpoint(&h, p, move |x| block(x, &p2)).unwrap()
        } else {
            block(&h, p).unwrap()
        };
    }
    ops::sum(&ops::mul(&h, &h).unwrap()).unwrap()
}

/// The bit patterns of a tensor's elements (read from any device), for bitwise comparisons.
pub fn bits(t: &Tensor) -> Vec<u32> {
    t.to_host().unwrap().iter().map(|v| v.to_bits()).collect()
}
