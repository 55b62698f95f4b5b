//! Sharded model states: `model.safetensors.index.json` (`{"metadata": {...}, "weight_map":
//! {tensor name: shard file name}}`, the layout Hugging Face `save_pretrained` writes above its
//! `max_shard_size`) and the shard files it names in the same folder.

use super::model_file::{
    config_summary, expected_file_shapes, resolve_config, untie_values, LM_HEAD,
};
use super::read::{check_tensor_infos, read_header, read_json_bytes, read_values};
use super::{parent_dir, state_err};
use crate::checkpointing::ActivationCheckpointing;
use crate::error::Result;
use crate::model::DecoderOnlyTransformer;
use crate::policy::FullSequenceAttentionKind;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};

/// File name of the shard index Hugging Face writes beside sharded weights.
pub const SHARD_INDEX_FILE: &str = "model.safetensors.index.json";

/// Whether `path` names a shard index (its file name ends with `.index.json`).
pub(super) fn is_shard_index(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(".index.json"))
}

/// The `weight_map` entries in file order, duplicates kept (a JSON object parsed into a map
/// would keep only the last of two equal keys).
struct Entries(Vec<(String, String)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object mapping tensor names to shard file names")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<Entries, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, String>()? {
                    out.push((k, v));
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Deserialize)]
struct Index {
    weight_map: Entries,
}

/// Loads a sharded model state: the config from `config.json` beside the index (as
/// [`super::load_model`] does for a file without riftco metadata), then every shard the index
/// names, each validated (header, dtypes F32/BF16/F16, shapes) before any is read in full and
/// before the model is built.
///
/// # Errors
/// [`crate::TransformerError::State`] naming the index and the offending entry for: an index
/// that is not JSON or has no `weight_map` object of strings; a tensor listed twice (the two
/// shard files are named); a shard name that is absolute or leaves the folder (`../x`); a
/// shard file that does not exist; a shard that is the index itself or a JSON file (not
/// safetensors); a tensor missing from the shard the index maps it to; a
/// tensor held by a shard but mapped to another shard or to none; and every check
/// [`super::load_model`] makes of names, dtypes, shapes and config.
/// [`crate::TransformerError::Io`] when a file cannot be read.
pub(super) fn load_sharded(
    index_path: &Path,
    attention: FullSequenceAttentionKind,
    checkpointing: impl Into<ActivationCheckpointing>,
    half: Option<riftco_tensor::HalfDtype>,
    quantize: Option<riftco_tensor::QuantFormat>,
) -> Result<DecoderOnlyTransformer> {
    let bytes = read_json_bytes(index_path)?;
    let index: Index = serde_json::from_slice(&bytes).map_err(|e| {
        state_err(
            index_path,
            format!("not a shard index (an object with a \"weight_map\" of strings): {e}"),
        )
    })?;
    let dir = parent_dir(index_path);
    // tensor name -> shard file, and shard file -> its tensors, both checked.
    let mut file_of: HashMap<String, String> = HashMap::new();
    let mut shards: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, file) in index.weight_map.0 {
        if let Some(first) = file_of.get(&name) {
            return Err(state_err(
                index_path,
                format!("tensor {name} is mapped twice in weight_map: to {first:?} and {file:?}"),
            ));
        }
        shard_path(index_path, &dir, &file)?;
        shards.entry(file.clone()).or_default().push(name.clone());
        file_of.insert(name, file);
    }
    let config = resolve_config(index_path, &HashMap::new())?;
    let expected = expected_file_shapes(&config, file_of.contains_key(LM_HEAD));
    let mut headers = Vec::with_capacity(shards.len());
    for (file, names) in &shards {
        let path = shard_path(index_path, &dir, file)?;
        if !path.exists() {
            return Err(state_err(
                index_path,
                format!(
                    "weight_map names the shard {file:?} (for tensor {}), but {} does not exist",
                    names[0],
                    path.display()
                ),
            ));
        }
        if is_same_file(&path, index_path) {
            return Err(state_err(
                index_path,
                format!(
                    "weight_map maps tensor {} to the shard {file:?}, which is this index file \
                     itself, not a safetensors shard",
                    names[0]
                ),
            ));
        }
        let header = read_header(&path)?;
        let held = header.tensors.tensors();
        for name in names {
            if !held.contains_key(name) {
                return Err(state_err(
                    &path,
                    format!(
                        "tensor {name} is mapped to this shard by {SHARD_INDEX_FILE} but the \
                         shard does not hold it"
                    ),
                ));
            }
        }
        headers.push((path, file, header));
    }
    // Only once every mapped tensor is found where the index says: tensors held elsewhere.
    for (path, file, header) in &headers {
        for name in header.tensors.tensors().keys() {
            match file_of.get(name) {
                Some(f) if f == *file => {}
                Some(other) => {
                    return Err(state_err(
                        path,
                        format!(
                            "tensor {name} is in this shard but {SHARD_INDEX_FILE} maps it to \
                             {other:?}: one tensor in two files"
                        ),
                    ))
                }
                None => {
                    return Err(state_err(
                        path,
                        format!("tensor {name} is in this shard but not in {SHARD_INDEX_FILE}"),
                    ))
                }
            }
        }
    }
    {
        let infos = headers
            .iter()
            .flat_map(|(_, _, h)| h.tensors.tensors())
            .collect::<HashMap<_, _>>();
        check_tensor_infos(index_path, &infos, &expected, &config_summary(&config))?;
    }
    let mut values = Vec::with_capacity(expected.len());
    for (path, _, header) in headers {
        let mine: Vec<(String, Vec<usize>)> = expected
            .iter()
            .filter(|(n, _)| header.tensors.info(n).is_some())
            .cloned()
            .collect();
        values.extend(read_values(&path, header, &mine, half, quantize)?);
    }
    let values = untie_values(index_path, &config, values)?;
    // The parameters take the values read (no initialised model to copy them into).
    DecoderOnlyTransformer::from_parameter_values(config, attention, checkpointing, values)
}

/// Whether `a` and `b` name one file: the same device and inode on Unix (so a hard link or a
/// symlink to the index counts), else compared after resolving links and `.` (equal paths when
/// either cannot be resolved).
fn is_same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(ma), Ok(mb)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return (ma.dev(), ma.ino()) == (mb.dev(), mb.ino());
        }
    }
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// `dir/file` when `file` is a relative path that stays inside `dir` (only plain components:
/// no `..`, no root, no drive prefix).
fn shard_path(index_path: &Path, dir: &Path, file: &str) -> Result<PathBuf> {
    let p = Path::new(file);
    let inside = !file.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
    if !inside {
        return Err(state_err(
            index_path,
            format!(
                "weight_map names the shard {file:?}, which is not a file name inside the \
                 folder {} (absolute paths and \"..\" are refused)",
                dir.display()
            ),
        ));
    }
    Ok(dir.join(p))
}
