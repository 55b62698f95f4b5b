//! Reading and validating safetensors files.

use super::{io_err, state_err};
use crate::error::Result;
use safetensors::tensor::{SafeTensorError, TensorView};
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::Path;

pub(super) fn read_file(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).map_err(|source| io_err(path, source))
}

/// Parses a safetensors buffer with reasons that say what is wrong with the file.
/// Returns the tensors and the header's `__metadata__` map (empty when absent).
pub(super) fn parse_safetensors<'a>(path: &Path, bytes: &'a [u8]) -> Result<Parsed<'a>> {
    const N_LEN: usize = 8;
    let Some(prefix) = bytes.get(..N_LEN) else {
        return Err(state_err(
            path,
            format!(
                "truncated: the file has {} bytes, fewer than the 8-byte header length that \
                 starts a safetensors file",
                bytes.len()
            ),
        ));
    };
    let mut n = [0u8; N_LEN];
    n.copy_from_slice(prefix);
    let header_len = u64::from_le_bytes(n);
    let available = (bytes.len() - N_LEN) as u64;
    if header_len > available {
        return Err(state_err(
            path,
            format!(
                "header length {header_len} bytes exceeds the {available} bytes after the length \
                 prefix: the file is truncated or not a safetensors file"
            ),
        ));
    }
    let to_state = |e: SafeTensorError| {
        let reason = match e {
            SafeTensorError::InvalidHeader(_) => {
                "the header is not UTF-8: not a safetensors file (garbage bytes)".to_string()
            }
            SafeTensorError::InvalidHeaderDeserialization(e) => {
                format!("the header is not valid safetensors JSON: {e}")
            }
            SafeTensorError::MetadataIncompleteBuffer => format!(
                "the data section ({} bytes) does not match the tensor offsets in the header: \
                 the file is truncated or has trailing bytes",
                available - header_len
            ),
            other => format!("invalid safetensors file: {other}"),
        };
        state_err(path, reason)
    };
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(to_state)?;
    let metadata = meta.metadata().clone().unwrap_or_default();
    let tensors = SafeTensors::deserialize(bytes).map_err(to_state)?;
    Ok(Parsed { tensors, metadata })
}

pub(super) struct Parsed<'a> {
    pub(super) tensors: SafeTensors<'a>,
    pub(super) metadata: HashMap<String, String>,
}

/// Checks that the file holds exactly the `expected` names, each F32 with the expected shape,
/// and returns their values in `expected` order. `context` describes where the expectation comes
/// from (the config), for the error message.
pub(super) fn validated_f32(
    path: &Path,
    parsed: &Parsed<'_>,
    expected: &[(String, Vec<usize>)],
    context: &str,
) -> Result<Vec<(String, Vec<f32>)>> {
    let st = &parsed.tensors;
    let names: BTreeSet<&str> = st.names().into_iter().collect();
    let wanted: BTreeSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    let list = |v: Vec<&str>| {
        let shown: Vec<&str> = v.iter().take(5).copied().collect();
        let more = if v.len() > 5 {
            format!(" and {} more", v.len() - 5)
        } else {
            String::new()
        };
        format!("{shown:?}{more}")
    };
    let missing: Vec<&str> = wanted.difference(&names).copied().collect();
    if !missing.is_empty() {
        return Err(state_err(
            path,
            format!(
                "{} expected tensor(s) missing for the config ({context}): {}",
                missing.len(),
                list(missing)
            ),
        ));
    }
    let unknown: Vec<&str> = names.difference(&wanted).copied().collect();
    if !unknown.is_empty() {
        return Err(state_err(
            path,
            format!(
                "{} unknown tensor(s) for the config ({context}): {}",
                unknown.len(),
                list(unknown)
            ),
        ));
    }
    let mut views = Vec::with_capacity(expected.len());
    for (name, shape) in expected {
        let view = st.tensor(name).map_err(|e| state_err(path, e))?;
        if view.dtype() != Dtype::F32 {
            return Err(state_err(
                path,
                format!("tensor {name} has dtype {:?}, expected F32", view.dtype()),
            ));
        }
        if view.shape() != shape.as_slice() {
            return Err(state_err(
                path,
                format!(
                    "tensor {name} has shape {:?} but the config ({context}) expects {shape:?}",
                    view.shape()
                ),
            ));
        }
        views.push(view);
    }
    Ok(expected
        .iter()
        .zip(&views)
        .map(|((name, _), view)| (name.clone(), decode_f32(view)))
        .collect())
}

fn decode_f32(view: &TensorView<'_>) -> Vec<f32> {
    view.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Copies validated values into the parameters of the same names; checks that every parameter
/// has a value before writing any. Bumps each written tensor's version.
pub(super) fn copy_into(
    path: &Path,
    params: &[(String, riftco_autograd::Variable)],
    values: Vec<(String, Vec<f32>)>,
) -> Result<()> {
    let mut by_name: HashMap<String, Vec<f32>> = values.into_iter().collect();
    let mut plan = Vec::with_capacity(params.len());
    for (name, p) in params {
        match by_name.remove(name) {
            Some(v) if v.len() == p.value().numel() => plan.push((p, v)),
            _ => {
                return Err(state_err(
                    path,
                    format!("internal: no value of the right size for parameter {name}"),
                ))
            }
        }
    }
    for (p, v) in plan {
        p.value().copy_from_slice(&v)?;
    }
    Ok(())
}
