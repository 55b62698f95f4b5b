//! Atomic writes: a temporary file beside the destination, fsync, rename, fsync of the folder.

use super::{io_err, parent_dir, state_err};
use crate::error::Result;
use riftco_tensor::Tensor;
use safetensors::tensor::SafeTensorError;
use safetensors::{Dtype, View};
use std::borrow::Cow;
use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// A parameter as an f32 little-endian safetensors view (bytes produced on demand while
/// writing, one tensor at a time).
pub(super) struct F32View {
    tensor: Tensor,
    shape: Vec<usize>,
}

impl F32View {
    pub(super) fn new(tensor: &Tensor) -> Self {
        Self {
            tensor: tensor.clone(),
            shape: tensor.dims().to_vec(),
        }
    }
}

impl View for F32View {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned(
            self.tensor
                .read()
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
        )
    }
    fn data_len(&self) -> usize {
        self.tensor.numel() * 4
    }
}

pub(super) fn write_safetensors_atomic(
    path: &Path,
    tensors: Vec<(String, F32View)>,
    metadata: HashMap<String, String>,
) -> Result<()> {
    write_atomic(path, |tmp| {
        safetensors::serialize_to_file(tensors, Some(metadata), tmp).map_err(|e| match e {
            SafeTensorError::IoError(source) => io_err(path, source),
            other => state_err(path, other),
        })
    })
}

/// Writes through `write` into a fresh temporary file beside `path`, fsyncs it, renames it over
/// `path` and fsyncs the folder. The temporary file is removed on failure.
pub(super) fn write_atomic(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = parent_dir(path);
    let name = path
        .file_name()
        .ok_or_else(|| state_err(path, "the path has no file name"))?;
    let tmp = dir.join(format!(
        ".{}.tmp.{}.{}",
        name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    // Create it exclusively first, so a missing or read-only folder fails before any work.
    let result = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(|source| io_err(path, source))
        .and_then(|_| write(&tmp))
        .and_then(|()| set_readable(&tmp).map_err(|source| io_err(path, source)))
        .and_then(|()| {
            let file = fs::OpenOptions::new()
                .write(true)
                .open(&tmp)
                .map_err(|source| io_err(path, source))?;
            file.sync_all().map_err(|source| io_err(path, source))?;
            fs::rename(&tmp, path).map_err(|source| io_err(path, source))
        });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
        return result;
    }
    sync_dir(&dir).map_err(|source| io_err(&dir, source))
}

/// Model files are ordinary user files (`rw-r--r--`), whatever mode the writer created the
/// temporary file with (the safetensors crate writes through a private 0600 temporary).
#[cfg(unix)]
fn set_readable(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o644))
}

#[cfg(not(unix))]
fn set_readable(_path: &Path) -> std::io::Result<()> {
    Ok(())
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> std::io::Result<()> {
    Ok(())
}
