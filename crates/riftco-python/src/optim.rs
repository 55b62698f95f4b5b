//! `Adam` and `AdamW` over iterables of Variables.

use std::sync::{Mutex, MutexGuard};

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use riftco_autograd::Variable;
use riftco_kernels::AdamHyper;
use riftco_transformer::{Adam, TransformerError};

use crate::errors::{compute, transformer_err};
use crate::variable::PyVariable;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyAdam>()?;
    m.add_class::<PyAdamW>()?;
    Ok(())
}

/// The Variables of `params`: any iterable of Variables (a list, a tuple, or a generator such
/// as `riftco.nn.Module.parameters()`), not a str; a `TypeError` names the first item that is
/// not a Variable and its index.
fn param_list(params: &Bound<'_, PyAny>) -> PyResult<Vec<Variable>> {
    let type_name = |o: &Bound<'_, PyAny>| {
        o.get_type()
            .name()
            .map_or_else(|_| "?".into(), |n| n.to_string())
    };
    if params.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(
            "params must be an iterable of riftco.Variable, not a str",
        ));
    }
    let items = params.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "params must be an iterable of riftco.Variable; got {}",
            type_name(params)
        ))
    })?;
    let mut out = Vec::new();
    for (i, item) in items.enumerate() {
        let item = item?;
        let v = item.cast::<PyVariable>().map_err(|_| {
            PyTypeError::new_err(format!(
                "params[{i}] must be a riftco.Variable; got {}",
                type_name(&item)
            ))
        })?;
        out.push(v.get().inner().clone());
    }
    Ok(out)
}

/// Shared state of `Adam` and `AdamW`.
struct Optimizer {
    inner: Mutex<Adam>,
}

impl Optimizer {
    fn new(py: Python<'_>, params: &Bound<'_, PyAny>, hyper: AdamHyper) -> PyResult<Self> {
        let params = param_list(params)?;
        let adam = compute(py, move || Adam::with_hyper(params, hyper))?;
        Ok(Self {
            inner: Mutex::new(adam),
        })
    }
    fn lock(&self) -> MutexGuard<'_, Adam> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn step(&self, py: Python<'_>) -> PyResult<()> {
        compute(py, || self.lock().step())
    }
    fn zero_grad(&self, py: Python<'_>) -> PyResult<()> {
        compute(py, || self.lock().zero_grad())
    }
    fn set_lr(&self, lr: f32) -> PyResult<()> {
        if !(lr.is_finite() && lr > 0.0) {
            return Err(transformer_err(TransformerError::Config {
                field: "lr",
                value: lr.to_string(),
                reason: "must be a positive finite number".into(),
            }));
        }
        self.lock().hyper.lr = lr;
        Ok(())
    }
    fn params(&self) -> Vec<PyVariable> {
        self.lock()
            .params()
            .iter()
            .cloned()
            .map(PyVariable)
            .collect()
    }
}

fn hyper(lr: f32, betas: (f32, f32), eps: f32, weight_decay: f32, decoupled: bool) -> AdamHyper {
    AdamHyper {
        lr,
        beta1: betas.0,
        beta2: betas.1,
        eps,
        weight_decay,
        decoupled,
    }
}

/// Adam (Kingma & Ba 2015) with bias correction and PyTorch's defaults; ``weight_decay`` adds
/// ``weight_decay * param`` to the gradient (L2, as ``torch.optim.Adam``).
///
/// First and second moments are counted as ``optimizer_state`` memory. Each ``step()`` writes
/// the parameters in place, so a graph recorded before it is rejected as stale by
/// ``backward()``. Step counts are per parameter, as in PyTorch: bias correction uses the number
/// of steps that updated that parameter.
///
/// A frozen leaf (``requires_grad=False``) may be listed beside trainable ones: it never
/// receives a gradient, so it is never updated (not by weight decay either) and holds no
/// optimizer state.
///
/// Args:
///     params: the distinct leaves to update (for example ``model.parameters()``).
///     lr: learning rate (positive).
///     betas: moment decays, each in ``[0, 1)``.
///     eps: denominator epsilon (non-negative).
///     weight_decay: L2 coefficient (non-negative).
///
/// Raises:
///     ConfigError: naming an invalid hyper-parameter, or ``params`` when it is empty, lists a
///         Variable twice, holds a non-leaf (the result of an op) or only frozen leaves.
#[pyclass(name = "Adam", module = "riftco._native", frozen)]
pub struct PyAdam(Optimizer);

/// AdamW (Loshchilov & Hutter 2019): Adam with decoupled weight decay
/// (``param -= lr * weight_decay * param`` each step), PyTorch's defaults.
///
/// Parameters, frozen leaves and step counts as for ``Adam``.
///
/// Args:
///     params: the distinct leaves to update.
///     lr: learning rate (positive).
///     betas: moment decays, each in ``[0, 1)``.
///     eps: denominator epsilon (non-negative).
///     weight_decay: decoupled decay coefficient (non-negative; default 0.01).
///
/// Raises:
///     ConfigError: naming an invalid hyper-parameter, or ``params`` when it is empty, lists a
///         Variable twice, holds a non-leaf (the result of an op) or only frozen leaves.
#[pyclass(name = "AdamW", module = "riftco._native", frozen)]
pub struct PyAdamW(Optimizer);

macro_rules! optimizer_methods {
    ($ty:ident, $decay:expr, $decoupled:expr, $sig:literal) => {
        #[pymethods]
        impl $ty {
            #[new]
            #[pyo3(signature = (params, lr = 1e-3, betas = (0.9, 0.999), eps = 1e-8,
                                                weight_decay = $decay), text_signature = $sig)]
            fn new(
                py: Python<'_>,
                params: &Bound<'_, PyAny>,
                lr: f32,
                betas: (f32, f32),
                eps: f32,
                weight_decay: f32,
            ) -> PyResult<Self> {
                Optimizer::new(py, params, hyper(lr, betas, eps, weight_decay, $decoupled))
                    .map(Self)
            }

            /// One update of every trainable parameter that has a gradient (the others are
            /// skipped: their moments and step counts stay as they were). When no parameter has
            /// a gradient nothing changes and the step is not counted. The GIL is released
            /// meanwhile.
            ///
            /// Raises:
            ///     ConfigError: when a gradient's shape differs from its parameter's.
            fn step(&self, py: Python<'_>) -> PyResult<()> {
                self.0.step(py)
            }

            /// Clears every parameter's gradient.
            fn zero_grad(&self, py: Python<'_>) -> PyResult<()> {
                self.0.zero_grad(py)
            }

            /// The learning rate (writable between steps, for schedules).
            ///
            /// Raises:
            ///     ConfigError: when set to a non-positive or non-finite value.
            #[getter]
            fn get_lr(&self) -> f32 {
                self.0.lock().hyper.lr
            }

            #[setter]
            fn set_lr(&self, lr: f32) -> PyResult<()> {
                self.0.set_lr(lr)
            }

            /// Steps taken so far: ``step()`` calls that updated at least one parameter.
            #[getter]
            fn steps(&self) -> u64 {
                self.0.lock().steps()
            }

            /// The parameters this optimizer updates.
            fn parameters(&self) -> Vec<PyVariable> {
                self.0.params()
            }

            /// The optimizer's state in PyTorch's shape (copies): ``{"state": {index:
            /// {"step": int, "exp_avg": ndarray, "exp_avg_sq": ndarray}}, "param_groups":
            /// [{"lr", "betas", "eps", "weight_decay", "decoupled_weight_decay", "params",
            /// "param_names", "steps"}]}``; indices into ``parameters()``, frozen parameters
            /// have no entry; arrays float32 of the parameter's shape.
            fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
                crate::optim_state::state_dict(py, &self.0.lock())
            }

            /// Loads a ``state_dict()``: the hyper-parameters, the step counts and every moment.
            /// The whole dict is checked before anything changes.
            ///
            /// Raises:
            ///     ConfigError: naming the first mismatch: another number of (trainable)
            ///         parameters, a parameter of another name or shape, a missing key, a
            ///         non-finite or negative moment, invalid hyper-parameters.
            fn load_state_dict(&self, state_dict: &Bound<'_, PyAny>) -> PyResult<()> {
                crate::optim_state::load_state_dict(&mut self.0.lock(), state_dict)
            }

            /// Writes the state to the safetensors file ``path`` atomically (a kill leaves the
            /// old file or the new one): for each trainable parameter, named as in the model,
            /// the float32 tensors ``{name}.exp_avg`` and ``{name}.exp_avg_sq``, and in the
            /// header's metadata ``riftco_optimizer`` the hyper-parameters and step counts.
            ///
            /// Raises:
            ///     OSError: the folder is missing or not writable (naming the path).
            ///     ModelStateError: ``path`` has no file name.
            fn save(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
                compute(py, || {
                    riftco_transformer::save_optimizer_state(&self.0.lock(), &path)
                })
            }

            /// Loads a state written by ``save()``: the file is read and checked whole first, so
            /// on error the optimizer is unchanged.
            ///
            /// Raises:
            ///     OSError: the file cannot be read.
            ///     ModelStateError: not such a state (missing or invalid metadata, missing,
            ///         extra or mis-shaped tensors), naming the file.
            ///     ConfigError: a state of other parameters (names, shapes, count), naming the
            ///         first mismatch.
            fn load(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
                compute(py, || {
                    riftco_transformer::load_optimizer_state(&mut self.0.lock(), &path)
                })
            }

            fn __repr__(&self) -> String {
                let a = self.0.lock();
                let h = a.hyper;
                format!(
                    "{}(n_params={}, lr={}, betas=({}, {}), eps={}, weight_decay={}, steps={})",
                    stringify!($ty).trim_start_matches("Py"),
                    a.params().len(),
                    h.lr,
                    h.beta1,
                    h.beta2,
                    h.eps,
                    h.weight_decay,
                    a.steps()
                )
            }
        }
    };
}

optimizer_methods!(
    PyAdam,
    0.0,
    false,
    "(params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.0)"
);
optimizer_methods!(
    PyAdamW,
    0.01,
    true,
    "(params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01)"
);
