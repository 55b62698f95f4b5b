//! Adam and AdamW (Kingma & Ba 2015; Loshchilov & Hutter 2019) with PyTorch's defaults.

use crate::error::{Result, TransformerError};
use riftco_autograd::Variable;
use riftco_kernels::{adam_update, AdamHyper};
use riftco_tensor::{MemoryCategory, Tensor};

/// Adam/AdamW over a fixed list of parameter leaves. First and second moments are allocated in
/// the `optimizer_state` memory category. Each step writes the parameters in place, which bumps
/// their versions: a graph recorded before the step is rejected as stale by backward.
#[derive(Debug)]
pub struct Adam {
    params: Vec<Variable>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    step: u64,
    /// Hyper-parameters (mutable between steps, e.g. for a learning-rate schedule).
    pub hyper: AdamHyper,
}

impl Adam {
    /// Adam with learning rate `lr` and PyTorch's other defaults (β = (0.9, 0.999), eps 1e-8,
    /// no weight decay).
    ///
    /// # Errors
    /// [`TransformerError::Config`] for a non-positive or non-finite `lr`.
    pub fn new(params: Vec<Variable>, lr: f32) -> Result<Self> {
        Self::with_hyper(
            params,
            AdamHyper {
                lr,
                ..AdamHyper::default()
            },
        )
    }

    /// AdamW with decoupled weight decay (PyTorch's AdamW default decay is 0.01).
    ///
    /// # Errors
    /// As [`Adam::with_hyper`].
    pub fn adamw(params: Vec<Variable>, lr: f32, weight_decay: f32) -> Result<Self> {
        Self::with_hyper(
            params,
            AdamHyper {
                lr,
                weight_decay,
                decoupled: true,
                ..AdamHyper::default()
            },
        )
    }

    /// Any hyper-parameters.
    ///
    /// # Errors
    /// [`TransformerError::Config`] naming an invalid field (lr, betas in [0, 1), eps, decay).
    pub fn with_hyper(params: Vec<Variable>, hyper: AdamHyper) -> Result<Self> {
        let bad = |field: &'static str, value: f32, reason: &str| {
            Err(TransformerError::Config {
                field,
                value: value.to_string(),
                reason: reason.into(),
            })
        };
        if !(hyper.lr.is_finite() && hyper.lr > 0.0) {
            return bad("lr", hyper.lr, "must be a positive finite number");
        }
        for (f, b) in [("beta1", hyper.beta1), ("beta2", hyper.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return bad(f, b, "must be in [0, 1)");
            }
        }
        if !(hyper.eps.is_finite() && hyper.eps >= 0.0) {
            return bad("eps", hyper.eps, "must be a non-negative finite number");
        }
        if !(hyper.weight_decay.is_finite() && hyper.weight_decay >= 0.0) {
            return bad(
                "weight_decay",
                hyper.weight_decay,
                "must be a non-negative finite number",
            );
        }
        let zeros =
            |p: &Variable| Tensor::zeros(p.value().shape().clone(), MemoryCategory::OptimizerState);
        Ok(Self {
            m: params.iter().map(zeros).collect(),
            v: params.iter().map(zeros).collect(),
            params,
            step: 0,
            hyper,
        })
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// The parameters updated.
    pub fn params(&self) -> &[Variable] {
        &self.params
    }

    /// One update of every parameter that has a gradient (parameters without one are skipped,
    /// as in PyTorch).
    ///
    /// # Errors
    /// Never for consistent shapes; a gradient whose shape differs from its parameter is an
    /// error naming the parameter.
    pub fn step(&mut self) -> Result<()> {
        for p in &self.params {
            if let Some(g) = p.grad() {
                if g.dims() != p.dims() {
                    return Err(TransformerError::Config {
                        field: "gradient",
                        value: format!("{:?}", g.dims()),
                        reason: format!("does not match parameter {}", p.describe()),
                    });
                }
            }
        }
        self.step += 1;
        for ((p, m), v) in self.params.iter().zip(&self.m).zip(&self.v) {
            let Some(g) = p.grad() else { continue };
            adam_update(
                &mut p.value().write(),
                &g.read(),
                &mut m.write(),
                &mut v.write(),
                self.step,
                self.hyper,
            );
        }
        Ok(())
    }

    /// Clears every parameter's gradient.
    pub fn zero_grad(&self) {
        for p in &self.params {
            p.zero_grad();
        }
    }
}
