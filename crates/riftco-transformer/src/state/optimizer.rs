//! An optimizer's state in one safetensors file: for each trainable parameter (named as in the
//! model, e.g. `model.layers.0.self_attn.q_proj.lora_A.weight`) the f32 tensors `{name}.exp_avg`
//! and `{name}.exp_avg_sq` (PyTorch's keys), and in the header's metadata `riftco_optimizer`, a
//! JSON object with the hyper-parameters, the optimizer's step count and each parameter's
//! (`{"steps": n, "hyper": {...}, "params": [{"name", "steps"}, ...]}`). Written atomically;
//! read with bounded memory and checked whole before the optimizer changes.

use super::atomic::{remove_stale_temporaries, write_safetensors, AtomicGroup};
use super::read::{check_tensors, read_header, read_values};
use super::values::ParamValues;
use super::{io_err, state_err};
use crate::error::Result;
use crate::optim::{Adam, AdamParamState, AdamState};
use riftco_tensor::backend::AdamHyper;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// The metadata key holding the JSON description.
pub const OPTIMIZER_METADATA_KEY: &str = "riftco_optimizer";

#[derive(Serialize, Deserialize)]
struct Description {
    steps: u64,
    hyper: Hyper,
    params: Vec<ParamSteps>,
}

#[derive(Serialize, Deserialize)]
struct Hyper {
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
    decoupled: bool,
}

impl From<AdamHyper> for Hyper {
    fn from(h: AdamHyper) -> Self {
        let AdamHyper {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            decoupled,
        } = h;
        Self {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            decoupled,
        }
    }
}

impl From<Hyper> for AdamHyper {
    fn from(h: Hyper) -> Self {
        let Hyper {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            decoupled,
        } = h;
        Self {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            decoupled,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct ParamSteps {
    name: String,
    steps: u64,
}

/// Writes `adam`'s state ([`Adam::state`]) to the safetensors file `path`, atomically (a kill
/// leaves the old file or the new one, never a mix).
///
/// # Errors
/// [`crate::TransformerError::Io`] when the folder is missing or not writable,
/// [`crate::TransformerError::State`] for a path without a file name or a device error reading
/// a moment (naming the path).
pub fn save_optimizer_state(adam: &Adam, path: &Path) -> Result<()> {
    // The moments are written from the optimizer's own tensors (host ones read in place), not
    // from copies: copies wrapped in tensors would be left in the buffer pool at every save.
    let params = adam.param_moments();
    let description = Description {
        steps: adam.steps(),
        hyper: Hyper::from(adam.hyper),
        params: params
            .iter()
            .map(|p| ParamSteps {
                name: p.name.clone(),
                steps: p.steps,
            })
            .collect(),
    };
    let text = serde_json::to_string(&description).map_err(|e| state_err(path, e))?;
    let mut tensors = Vec::with_capacity(2 * params.len());
    for p in params {
        tensors.push((format!("{}.exp_avg", p.name), p.exp_avg));
        tensors.push((format!("{}.exp_avg_sq", p.name), p.exp_avg_sq));
    }
    let metadata = HashMap::from([
        ("format".to_string(), "pt".to_string()),
        (OPTIMIZER_METADATA_KEY.to_string(), text),
    ]);
    let name = path
        .file_name()
        .ok_or_else(|| state_err(path, "the path has no file name"))?
        .to_string_lossy()
        .into_owned();
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(io_err(
            dir,
            std::io::Error::new(std::io::ErrorKind::NotFound, "the folder does not exist"),
        ));
    }
    remove_stale_temporaries(dir, &[&name]);
    let mut group = AtomicGroup::new();
    group.stage(path, |out| {
        write_safetensors(path, out, &tensors, metadata, None)
    })?;
    group.commit()
}

/// Reads an optimizer state written by [`save_optimizer_state`] and puts it into `adam`
/// ([`Adam::restore`]): the file is read and checked whole first, so on error `adam` is as it
/// was.
///
/// # Errors
/// [`crate::TransformerError::Io`] when the file cannot be read;
/// [`crate::TransformerError::State`] for a file that is not such a state (no or invalid
/// `riftco_optimizer` metadata, missing or other tensors, wrong dtypes or shapes);
/// [`crate::TransformerError::Config`] (field `optimizer state`) for a state of other
/// parameters, as [`Adam::restore`].
pub fn load_optimizer_state(adam: &mut Adam, path: &Path) -> Result<()> {
    let header = read_header(path)?;
    let text = header
        .metadata
        .get(OPTIMIZER_METADATA_KEY)
        .ok_or_else(|| {
            state_err(
                path,
                format!(
                    "no {OPTIMIZER_METADATA_KEY:?} metadata: not an optimizer state written by \
                     riftco"
                ),
            )
        })?
        .clone();
    let d: Description = serde_json::from_str(&text).map_err(|e| {
        state_err(
            path,
            format!("invalid {OPTIMIZER_METADATA_KEY:?} metadata: {e}"),
        )
    })?;
    // The shapes the file must hold: this optimizer's parameters of those names, checked
    // against the file's own list by `restore` after reading.
    let shape_of: HashMap<String, Vec<usize>> = adam
        .params()
        .iter()
        .filter_map(|p| p.name().map(|n| (n, p.dims().to_vec())))
        .collect();
    let mut expected = Vec::with_capacity(2 * d.params.len());
    for p in &d.params {
        let shape =
            shape_of
                .get(&p.name)
                .cloned()
                .ok_or_else(|| crate::TransformerError::Config {
                    field: "optimizer state",
                    value: format!("{:?}", p.name),
                    reason: "this optimizer has no parameter of that name; a state for other \
                         parameters cannot be loaded"
                        .into(),
                })?;
        for key in ["exp_avg", "exp_avg_sq"] {
            expected.push((format!("{}.{key}", p.name), shape.clone()));
        }
    }
    check_tensors(path, &header, &expected, "its riftco_optimizer metadata")?;
    let values = read_values(path, header, &expected, None, None)?;
    let mut values = values.into_iter().map(|(_, v)| match v {
        ParamValues::F32(v) => v,
        ParamValues::Half(dtype, bits) => bits.iter().map(|&b| dtype.to_f32(b)).collect(),
        // read_values never makes quantized values (only the GGUF reader does).
        ParamValues::Quantized(..) => Vec::new(),
    });
    let mut params = Vec::with_capacity(d.params.len());
    for p in d.params {
        let shape = shape_of[&p.name].clone();
        let exp_avg = values.next().unwrap_or_default();
        let exp_avg_sq = values.next().unwrap_or_default();
        params.push(AdamParamState {
            name: p.name,
            shape,
            steps: p.steps,
            exp_avg,
            exp_avg_sq,
        });
    }
    adam.restore(&AdamState {
        hyper: d.hyper.into(),
        steps: d.steps,
        params,
    })
}
