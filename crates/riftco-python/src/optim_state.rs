//! `Adam.state_dict()` / `load_state_dict()` in PyTorch's shape: `{"state": {index: {"step",
//! "exp_avg", "exp_avg_sq"}}, "param_groups": [{"lr", "betas", "eps", "weight_decay",
//! "decoupled_weight_decay", "params", "param_names", "steps"}]}`, indices into the optimizer's
//! parameter list (frozen parameters have no entry).

use numpy::{IntoPyArray, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyList, PyString};
use riftco_kernels::AdamHyper;
use riftco_transformer::{Adam, AdamParamState, AdamState, TransformerError};

use crate::errors::transformer_err;
use crate::variable::float32_data;

/// The optimizer's state as a dict of NumPy float32 arrays and Python numbers (copies).
pub(crate) fn state_dict<'py>(py: Python<'py>, adam: &Adam) -> PyResult<Bound<'py, PyDict>> {
    let snapshot = adam.state().map_err(transformer_err)?;
    let trainable = trainable_indices(adam);
    let state = PyDict::new(py);
    for (&i, p) in trainable.iter().zip(&snapshot.params) {
        let entry = PyDict::new(py);
        entry.set_item("step", p.steps)?;
        for (key, v) in [("exp_avg", &p.exp_avg), ("exp_avg_sq", &p.exp_avg_sq)] {
            let array = v.clone().into_pyarray(py).reshape(p.shape.clone())?;
            entry.set_item(key, array)?;
        }
        state.set_item(i, entry)?;
    }
    let h = snapshot.hyper;
    let group = PyDict::new(py);
    group.set_item("lr", h.lr)?;
    group.set_item("betas", (h.beta1, h.beta2))?;
    group.set_item("eps", h.eps)?;
    group.set_item("weight_decay", h.weight_decay)?;
    group.set_item("decoupled_weight_decay", h.decoupled)?;
    group.set_item("params", (0..adam.params().len()).collect::<Vec<_>>())?;
    let names: Vec<String> = adam
        .params()
        .iter()
        .enumerate()
        .map(|(i, p)| p.name().unwrap_or_else(|| format!("param {i}")))
        .collect();
    group.set_item("param_names", names)?;
    group.set_item("steps", snapshot.steps)?;
    let d = PyDict::new(py);
    d.set_item("state", state)?;
    d.set_item("param_groups", PyList::new(py, [group])?)?;
    Ok(d)
}

/// Loads a `state_dict()` (all of it checked before anything changes).
pub(crate) fn load_state_dict(adam: &mut Adam, d: &Bound<'_, PyAny>) -> PyResult<()> {
    let snapshot = parse(adam, d).map_err(transformer_err)?;
    adam.restore(&snapshot).map_err(transformer_err)
}

fn trainable_indices(adam: &Adam) -> Vec<usize> {
    adam.params()
        .iter()
        .enumerate()
        .filter(|(_, p)| p.requires_grad())
        .map(|(i, _)| i)
        .collect()
}

fn bad(value: impl Into<String>, reason: impl Into<String>) -> TransformerError {
    TransformerError::Config {
        field: "optimizer state",
        value: value.into(),
        reason: reason.into(),
    }
}

/// A key of a dict, or an error naming it.
fn item<'py>(
    d: &Bound<'py, PyAny>,
    key: &str,
    what: &str,
) -> Result<Bound<'py, PyAny>, TransformerError> {
    let dict = d
        .cast::<PyDict>()
        .map_err(|_| bad(what.to_string(), "expected a dict (from state_dict())"))?;
    dict.get_item(key)
        .ok()
        .flatten()
        .ok_or_else(|| bad(what.to_string(), format!("has no key {key:?}")))
}

fn extract<'py, T: FromPyObjectOwned<'py>>(
    v: &Bound<'py, PyAny>,
    what: &str,
    expected: &str,
) -> Result<T, TransformerError> {
    let repr = || v.repr().map_or_else(|_| "?".to_string(), |r| r.to_string());
    if v.is_instance_of::<PyBool>() && expected != "a bool" {
        return Err(bad(
            format!("{what} = {}", repr()),
            format!("expected {expected}, not a bool"),
        ));
    }
    v.extract::<T>().map_err(|_| {
        bad(
            format!("{what} = {}", repr()),
            format!("expected {expected}"),
        )
    })
}

fn parse(adam: &Adam, d: &Bound<'_, PyAny>) -> Result<AdamState, TransformerError> {
    let state = item(d, "state", "the state dict")?;
    let groups = item(d, "param_groups", "the state dict")?;
    let groups = groups
        .cast::<PyList>()
        .map_err(|_| bad("param_groups", "expected a list of one dict"))?;
    if groups.len() != 1 {
        return Err(bad(
            format!("{} param_groups", groups.len()),
            "riftco's optimizers have one parameter group",
        ));
    }
    let group = groups
        .get_item(0)
        .map_err(|e| bad("param_groups[0]", e.to_string()))?;
    let g = |key: &str| item(&group, key, "param_groups[0]");
    let (beta1, beta2): (f32, f32) = extract(&g("betas")?, "betas", "two floats")?;
    let hyper = AdamHyper {
        lr: extract(&g("lr")?, "lr", "a float")?,
        beta1,
        beta2,
        eps: extract(&g("eps")?, "eps", "a float")?,
        weight_decay: extract(&g("weight_decay")?, "weight_decay", "a float")?,
        decoupled: extract(
            &g("decoupled_weight_decay")?,
            "decoupled_weight_decay",
            "a bool",
        )?,
    };
    let steps: u64 = extract(&g("steps")?, "steps", "a non-negative int")?;
    let names: Vec<String> = extract(&g("param_names")?, "param_names", "a list of str")?;
    let n = adam.params().len();
    if names.len() != n {
        return Err(bad(
            format!("{} param_names", names.len()),
            format!(
                "this optimizer has {n} parameters; a state for other parameters cannot be loaded"
            ),
        ));
    }
    let state = state
        .cast::<PyDict>()
        .map_err(|_| bad("state", "expected a dict of per-parameter dicts"))?;
    let trainable = trainable_indices(adam);
    if state.len() != trainable.len() {
        return Err(bad(
            format!("{} parameter states", state.len()),
            format!(
                "this optimizer has {} trainable parameters; a state for other parameters \
                 cannot be loaded",
                trainable.len()
            ),
        ));
    }
    let mut params = Vec::with_capacity(trainable.len());
    for i in trainable {
        let what = format!("state[{i}] ({:?})", names[i]);
        let entry = state
            .get_item(i)
            .ok()
            .flatten()
            .ok_or_else(|| bad(what.clone(), "is missing (the parameter is trainable here)"))?;
        let step: u64 = extract(
            &item(&entry, "step", &what)?,
            &format!("{what} step"),
            "a non-negative int",
        )?;
        let moment = |key: &str| -> Result<(Vec<f32>, Vec<usize>), TransformerError> {
            let v = item(&entry, key, &what)?;
            if v.is_none() || v.is_instance_of::<PyString>() || v.is_instance_of::<PyBool>() {
                let repr = v.repr().map_or_else(|_| "?".to_string(), |r| r.to_string());
                return Err(bad(
                    format!("{what} {key} = {repr}"),
                    "expected an array of the parameter's shape",
                ));
            }
            float32_data(&v).map_err(|e| bad(format!("{what} {key}"), e.to_string()))
        };
        let (exp_avg, shape) = moment("exp_avg")?;
        let (exp_avg_sq, shape_sq) = moment("exp_avg_sq")?;
        if shape_sq != shape {
            return Err(bad(
                format!("{what} exp_avg_sq of shape {shape_sq:?}"),
                format!("exp_avg has shape {shape:?}"),
            ));
        }
        params.push(AdamParamState {
            name: names[i].clone(),
            shape,
            steps: step,
            exp_avg,
            exp_avg_sq,
        });
    }
    Ok(AdamState {
        hyper,
        steps,
        params,
    })
}
