//! Adam and AdamW (Kingma & Ba 2015; Loshchilov & Hutter 2019) with PyTorch's defaults.

use crate::error::{Result, TransformerError};
use riftco_autograd::Variable;
use riftco_tensor::backend::AdamHyper;
use riftco_tensor::{MemoryCategory, Tensor};
use std::collections::HashMap;

mod state;
pub use state::{AdamParamState, AdamState};

/// Adam/AdamW over a fixed list of distinct parameter leaves. First and second moments are
/// allocated in the `optimizer_state` memory category for every trainable parameter. Each step
/// writes the parameters in place, which bumps their versions: a graph recorded before the step
/// is rejected as stale by backward.
///
/// A frozen parameter (`requires_grad = false`, like the base weights under LoRA) may be in
/// the list: it never receives a gradient, so it is never updated (not by weight decay
/// either) and gets no optimizer state. At least one parameter must be trainable.
///
/// Step counts are per parameter, as in PyTorch: a parameter's bias correction uses the number
/// of steps that updated it, and a step with no gradient at all changes nothing and is not
/// counted.
#[derive(Debug)]
pub struct Adam {
    params: Vec<Variable>,
    /// Per parameter: moments and step count; `None` for frozen parameters.
    state: Vec<Option<Moments>>,
    steps: u64,
    /// Hyper-parameters (mutable between steps, e.g. for a learning-rate schedule).
    pub hyper: AdamHyper,
}

#[derive(Debug)]
struct Moments {
    m: Tensor,
    v: Tensor,
    steps: u64,
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
    /// [`TransformerError::Config`] naming an invalid field (lr, betas in [0, 1), eps, decay),
    /// or `params` when the list is empty, holds the same variable twice (it would be updated
    /// twice per step), holds a non-leaf (the result of an op, which no optimizer can update),
    /// or holds only frozen parameters (no step would ever change anything).
    pub fn with_hyper(params: Vec<Variable>, hyper: AdamHyper) -> Result<Self> {
        validate_params(&params)?;
        validate_hyper(&hyper)?;
        let zeros = |p: &Variable| {
            Tensor::try_full_on(
                p.value().shape().clone(),
                0.0,
                MemoryCategory::OptimizerState,
                p.value().device(),
            )
        };
        let state = params
            .iter()
            .map(|p| {
                p.requires_grad()
                    .then(|| {
                        Ok(Moments {
                            m: zeros(p)?,
                            v: zeros(p)?,
                            steps: 0,
                        })
                    })
                    .transpose()
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            state,
            params,
            steps: 0,
            hyper,
        })
    }

    /// Steps taken so far: calls of [`Adam::step`] that updated at least one parameter.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The parameters updated.
    pub fn params(&self) -> &[Variable] {
        &self.params
    }

    /// One update of every trainable parameter that has a gradient (parameters without one are
    /// skipped, as in PyTorch: their moments and step counts stay as they were). When no
    /// parameter has a gradient nothing changes and the step is not counted.
    ///
    /// # Errors
    /// Never for consistent shapes; a gradient whose shape differs from its parameter is an
    /// error naming the parameter, and a parameter, gradient or moment on another device a
    /// `DeviceMismatch` (checked for all before any is updated).
    pub fn step(&mut self) -> Result<()> {
        let mut updates = Vec::new();
        for (i, (p, state)) in self.params.iter().zip(&self.state).enumerate() {
            let (Some(g), Some(state)) = (p.grad(), state) else {
                continue;
            };
            // Every operand on one device, checked for all before any is updated.
            let pd = p.value().device();
            for (what, t) in [
                ("its gradient", &g),
                ("its first moment", &state.m),
                ("its second moment", &state.v),
            ] {
                if t.device() != pd {
                    return Err(TransformerError::OptimizerDevice {
                        parameter: p.describe(),
                        parameter_device: pd,
                        what,
                        other_device: t.device(),
                    });
                }
            }
            if g.dims() != p.dims() {
                return Err(TransformerError::Config {
                    field: "gradient",
                    value: format!("{:?}", g.dims()),
                    reason: format!("does not match parameter {}", p.describe()),
                });
            }
            updates.push((i, g));
        }
        if updates.is_empty() {
            return Ok(());
        }
        // Counts at u64::MAX (a loaded state can hold them) cannot advance: refused before any
        // parameter is updated.
        let at_max = |what: String, steps: u64| {
            (steps == u64::MAX).then(|| TransformerError::Config {
                field: "optimizer state",
                value: format!("{what} steps = {steps}"),
                reason: "the step count cannot advance past u64::MAX".into(),
            })
        };
        if let Some(e) = at_max("the optimizer's".into(), self.steps) {
            return Err(e);
        }
        for (i, _) in &updates {
            if let Some(state) = &self.state[*i] {
                if let Some(e) = at_max(self.params[*i].describe(), state.steps) {
                    return Err(e);
                }
            }
        }
        self.steps += 1;
        for (i, g) in updates {
            let Some(state) = self.state[i].as_mut() else {
                continue;
            };
            state.steps += 1;
            let (p, op) = (self.params[i].value(), "Adam.step");
            riftco_tensor::backend_of(op, &[p, &g, &state.m, &state.v])?.adam_update(
                op,
                p,
                &g,
                &state.m,
                &state.v,
                state.steps,
                self.hyper,
            )?;
        }
        Ok(())
    }

    /// Clears every parameter's gradient.
    ///
    /// # Errors
    /// [`TransformerError::Autograd`] ([`riftco_autograd::CheckpointError::ZeroGradInsideReplay`])
    /// inside a checkpoint's replay; checked for every parameter first, so nothing changes.
    pub fn zero_grad(&self) -> Result<()> {
        if let Some(err) = self.params.iter().find_map(|p| p.check_zero_grad().err()) {
            return Err(err.into());
        }
        for p in &self.params {
            p.zero_grad()?;
        }
        Ok(())
    }
}

/// The hyper-parameter rules of [`Adam::with_hyper`].
fn validate_hyper(hyper: &AdamHyper) -> Result<()> {
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
    Ok(())
}

/// The parameter-list rules of [`Adam::with_hyper`].
fn validate_params(params: &[Variable]) -> Result<()> {
    let bad = |value: String, reason: String| {
        Err(TransformerError::Config {
            field: "params",
            value,
            reason,
        })
    };
    if params.is_empty() {
        return bad(
            "[]".into(),
            "the optimizer needs at least one parameter (got an empty list)".into(),
        );
    }
    let mut seen: HashMap<u64, usize> = HashMap::new();
    for (i, p) in params.iter().enumerate() {
        if !p.is_leaf() {
            return bad(
                p.describe(),
                format!(
                    "parameter {i} is not a leaf (it was computed by op {}); pass the leaf \
                     parameters themselves",
                    p.op_name()
                ),
            );
        }
        if let Some(first) = seen.insert(p.id(), i) {
            return bad(
                p.describe(),
                format!(
                    "parameters {first} and {i} are the same variable; list each parameter \
                     once (it would be updated twice per step)"
                ),
            );
        }
    }
    if !params.iter().any(Variable::requires_grad) {
        return bad(
            format!("{} frozen parameters", params.len()),
            "no parameter requires grad, so no step would ever update one; pass trainable \
             parameters (for example the model's trainable parameters)"
                .into(),
        );
    }
    Ok(())
}
