//! The optimizer's state as data: [`Adam::state`] takes a snapshot, [`Adam::restore`] puts one
//! back (PyTorch's `state_dict()` / `load_state_dict()`), checked whole before anything changes.

use super::{validate_hyper, Adam, Moments};
use crate::error::{Result, TransformerError};
use riftco_tensor::backend::AdamHyper;
use riftco_tensor::{MemoryCategory, Tensor};

/// A snapshot of an [`Adam`] optimizer: its hyper-parameters, its step count and, for each
/// trainable parameter in the optimizer's order, the moments and step count (frozen parameters
/// have no state and are not listed).
#[derive(Clone, Debug, PartialEq)]
pub struct AdamState {
    /// Learning rate, betas, eps, weight decay and whether it is decoupled (AdamW).
    pub hyper: AdamHyper,
    /// Steps taken ([`Adam::steps`]).
    pub steps: u64,
    /// One entry per trainable parameter, in order.
    pub params: Vec<AdamParamState>,
}

/// One trainable parameter's optimizer state.
#[derive(Clone, Debug, PartialEq)]
pub struct AdamParamState {
    /// The parameter's name (its Variable name, or `param {index}` when it has none).
    pub name: String,
    /// The parameter's shape.
    pub shape: Vec<usize>,
    /// Steps that updated this parameter (its bias correction).
    pub steps: u64,
    /// First moment, row-major, `shape`'s element count (PyTorch's `exp_avg`).
    pub exp_avg: Vec<f32>,
    /// Second moment, non-negative (PyTorch's `exp_avg_sq`).
    pub exp_avg_sq: Vec<f32>,
}

/// One trainable parameter's optimizer state with the moments as the optimizer's own tensors
/// (shared storage, not copies): what a save writes, read in place.
pub(crate) struct AdamParamMoments {
    pub(crate) name: String,
    pub(crate) shape: Vec<usize>,
    pub(crate) steps: u64,
    pub(crate) exp_avg: Tensor,
    pub(crate) exp_avg_sq: Tensor,
}

impl Adam {
    /// The optimizer's state, copied to host memory.
    ///
    /// # Errors
    /// A device error reading a moment back.
    pub fn state(&self) -> Result<AdamState> {
        let params = self
            .param_moments()
            .into_iter()
            .map(|p| {
                Ok(AdamParamState {
                    exp_avg: p.exp_avg.to_host()?,
                    exp_avg_sq: p.exp_avg_sq.to_host()?,
                    name: p.name,
                    shape: p.shape,
                    steps: p.steps,
                })
            })
            .collect::<Result<_>>()?;
        Ok(AdamState {
            hyper: self.hyper,
            steps: self.steps,
            params,
        })
    }

    /// For each trainable parameter, in order, its state without copying the moments: the
    /// tensors share the optimizer's storage. A save writes these in place, so it allocates no
    /// moment-sized buffers (copies wrapped in tensors would go to the buffer pool when dropped,
    /// where nothing takes them back: the pool would grow by the moments' bytes at every save).
    pub(crate) fn param_moments(&self) -> Vec<AdamParamMoments> {
        self.params
            .iter()
            .zip(&self.state)
            .enumerate()
            .filter_map(|(i, (p, state))| {
                let state = state.as_ref()?;
                Some(AdamParamMoments {
                    name: parameter_name(p, i),
                    shape: p.dims().to_vec(),
                    steps: state.steps,
                    exp_avg: state.m.clone(),
                    exp_avg_sq: state.v.clone(),
                })
            })
            .collect()
    }

    /// Puts a snapshot back: the hyper-parameters, the step counts and every moment. The whole
    /// snapshot is checked, and the new moments are built, before anything changes, so on
    /// error the optimizer is as it was.
    ///
    /// # Errors
    /// [`TransformerError::Config`] (field `optimizer state`) naming the first mismatch: another
    /// number of trainable parameters, a parameter of another name or shape (in order), a moment
    /// of the wrong length, a non-finite moment or a negative second moment, a parameter step
    /// count above the optimizer's; invalid hyper-parameters as [`Adam::with_hyper`]; out of
    /// memory building the moments.
    pub fn restore(&mut self, snapshot: &AdamState) -> Result<()> {
        validate_hyper(&snapshot.hyper)?;
        let trainable: Vec<usize> = (0..self.params.len())
            .filter(|&i| self.state[i].is_some())
            .collect();
        if snapshot.params.len() != trainable.len() {
            return Err(mismatch(
                format!("{} parameters", snapshot.params.len()),
                format!(
                    "this optimizer has {} trainable parameters; a state for other parameters \
                     cannot be loaded",
                    trainable.len()
                ),
            ));
        }
        let mut moments = Vec::with_capacity(trainable.len());
        for (&i, s) in trainable.iter().zip(&snapshot.params) {
            let p = &self.params[i];
            let name = parameter_name(p, i);
            if s.name != name {
                return Err(mismatch(
                    format!("{:?}", s.name),
                    format!("trainable parameter {} is {name:?}", moments.len()),
                ));
            }
            if s.shape != p.dims() {
                return Err(mismatch(
                    format!("{name:?} of shape {:?}", s.shape),
                    format!("the parameter has shape {:?}", p.dims()),
                ));
            }
            let numel = p.value().numel();
            for (what, v) in [("exp_avg", &s.exp_avg), ("exp_avg_sq", &s.exp_avg_sq)] {
                if v.len() != numel {
                    return Err(mismatch(
                        format!("{name:?} {what} of {} elements", v.len()),
                        format!("expected {numel}"),
                    ));
                }
                if let Some(j) = v.iter().position(|x| !x.is_finite()) {
                    return Err(mismatch(
                        format!("{name:?} {what}[{j}] = {}", v[j]),
                        "moments must be finite".into(),
                    ));
                }
            }
            if let Some(j) = s.exp_avg_sq.iter().position(|&x| x < 0.0) {
                return Err(mismatch(
                    format!("{name:?} exp_avg_sq[{j}] = {}", s.exp_avg_sq[j]),
                    "a second moment is never negative".into(),
                ));
            }
            if s.steps > snapshot.steps {
                return Err(mismatch(
                    format!("{name:?} steps = {}", s.steps),
                    format!(
                        "more than the optimizer's {} steps (a parameter is updated at most \
                         once per step)",
                        snapshot.steps
                    ),
                ));
            }
            let tensor = |v: &[f32]| -> Result<Tensor> {
                let t = Tensor::try_full_on(
                    p.value().shape().clone(),
                    0.0,
                    MemoryCategory::OptimizerState,
                    p.value().device(),
                )?;
                t.copy_from_slice(v)?;
                Ok(t)
            };
            moments.push(Moments {
                m: tensor(&s.exp_avg)?,
                v: tensor(&s.exp_avg_sq)?,
                steps: s.steps,
            });
        }
        for (&i, m) in trainable.iter().zip(moments) {
            self.state[i] = Some(m);
        }
        self.steps = snapshot.steps;
        self.hyper = snapshot.hyper;
        Ok(())
    }
}

/// The name an optimizer state uses for parameter `index`.
fn parameter_name(p: &riftco_autograd::Variable, index: usize) -> String {
    p.name().unwrap_or_else(|| format!("param {index}"))
}

fn mismatch(value: String, reason: String) -> TransformerError {
    TransformerError::Config {
        field: "optimizer state",
        value,
        reason,
    }
}
