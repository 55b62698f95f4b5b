//! Atomic writes of a group of files into one folder, file by file.
//!
//! The model and adapter saves use this protocol only where a whole-folder exchange cannot be
//! used (see the `folder` module); [`write_file_atomic`] always uses it.
//!
//! Each file of the group is written in full into a temporary file beside its destination and
//! fsynced; only then are the temporaries renamed over their destinations, in staging order,
//! and the folder fsynced. A process killed before the renames leaves every destination as it
//! was; one killed between two renames (a window of a few system calls) leaves the files
//! renamed so far new and the others old, which the loaders detect (the last file of a group
//! names the content of the earlier ones: see the `model_file` and `lora` modules).
//!
//! Temporary files are named `.{file name}.tmp.{pid}.{counter}`. A failed write removes its
//! own; a killed process cannot, so each save first removes the temporaries of the files it is
//! about to write that were left by processes no longer running
//! ([`remove_stale_temporaries`]).

use super::dtype::StateDtype;
use super::{io_err, parent_dir, state_err};
use crate::error::Result;
use crate::residency::{AcquireReason, ResidencyUnit, SharedResidency};
use riftco_tensor::Tensor;
use serde_json::json;
use std::collections::HashMap;
use std::fs;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Files written together: staged into temporaries, then renamed by [`AtomicGroup::commit`].
/// Dropping an uncommitted group removes its temporaries.
pub(super) struct AtomicGroup {
    staged: Vec<(PathBuf, PathBuf)>,
}

impl AtomicGroup {
    pub(super) fn new() -> Self {
        Self { staged: Vec::new() }
    }

    /// Writes the content of `path` through `write` into a fresh temporary file beside it and
    /// fsyncs it. `path` itself is not touched until [`AtomicGroup::commit`].
    pub(super) fn stage(
        &mut self,
        path: &Path,
        write: impl FnOnce(&mut BufWriter<fs::File>) -> Result<()>,
    ) -> Result<()> {
        let dir = parent_dir(path);
        let name = path
            .file_name()
            .ok_or_else(|| state_err(path, "the path has no file name"))?;
        let tmp = dir.join(temporary_name(&name.to_string_lossy()));
        check_destination(path)?;
        // Created exclusively first, so a missing or read-only folder fails before any work.
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|source| io_err(path, source))?;
        self.staged.push((tmp.clone(), path.to_path_buf()));
        let mut out = BufWriter::with_capacity(1 << 20, file);
        write(&mut out)?;
        let file = out.into_inner().map_err(|e| io_err(path, e.into_error()))?;
        set_readable(&tmp).map_err(|source| io_err(path, source))?;
        file.sync_all().map_err(|source| io_err(path, source))
    }

    /// Renames every staged temporary over its destination, in staging order, then fsyncs the
    /// folders.
    pub(super) fn commit(mut self) -> Result<()> {
        let staged = std::mem::take(&mut self.staged);
        let mut dirs: Vec<PathBuf> = Vec::new();
        for (i, (tmp, path)) in staged.iter().enumerate() {
            if let Err(source) = fs::rename(tmp, path) {
                for (rest, _) in &staged[i..] {
                    let _ = fs::remove_file(rest);
                }
                return Err(io_err(path, source));
            }
            let dir = parent_dir(path);
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        for dir in dirs {
            sync_dir(&dir).map_err(|source| io_err(&dir, source))?;
        }
        Ok(())
    }
}

impl Drop for AtomicGroup {
    fn drop(&mut self) {
        for (tmp, _) in &self.staged {
            let _ = fs::remove_file(tmp);
        }
    }
}

/// Refuses a destination that is a folder (or a path ending in a separator, which names one) or
/// an existing non-regular file, before any file of a group is written or renamed: a group whose
/// later rename failed on a folder would already have replaced its earlier files (the
/// config.json beside it), and renaming over a device node, a FIFO or a socket would destroy it.
///
/// # Errors
/// [`TransformerError::Io`](crate::TransformerError::Io) (`IsADirectory`) or
/// [`TransformerError::State`](crate::TransformerError::State) naming `path`.
pub(super) fn check_destination(path: &Path) -> Result<()> {
    // A folder (or a path ending in a separator, which names one) is refused here, before
    // any file of the group is renamed: a group whose later rename failed on a folder would
    // already have replaced its earlier files (the config.json beside it).
    let names_folder = path
        .as_os_str()
        .to_string_lossy()
        .ends_with(std::path::is_separator);
    if names_folder || fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        return Err(io_err(
            path,
            std::io::Error::new(
                std::io::ErrorKind::IsADirectory,
                "the destination is a folder, not a file: give the file's own path \
                 (e.g. <folder>/model.safetensors)",
            ),
        ));
    }
    // Only a regular file is ever replaced: renaming over a device node, a FIFO or a socket
    // would destroy it, and the loaders refuse such paths anyway.
    if let Ok(existing) = fs::metadata(path) {
        if !existing.is_file() {
            return Err(state_err(
                path,
                format!(
                    "the destination exists and is a {}, not a regular file: refusing to \
                     replace it",
                    super::read::describe_type(&existing.file_type())
                ),
            ));
        }
    }
    Ok(())
}

/// Writes `bytes` to the file `path` atomically, as the model files are written: into a fresh
/// temporary `.{file name}.tmp.{pid}.{n}` beside it (mode `0644` on Unix), fsynced, renamed over
/// `path`, then the folder fsynced. A process killed at any moment leaves `path` entirely old or
/// entirely new; temporaries of `path` left by killed processes are removed first.
///
/// # Errors
/// [`TransformerError::Io`](crate::TransformerError::Io) naming `path` when the folder is
/// missing or not writable (`path` is left intact);
/// [`TransformerError::State`](crate::TransformerError::State) when `path` has no file name or
/// is a FIFO, device or socket (never replaced).
pub fn write_file_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| state_err(path, "the path has no file name"))?
        .to_string_lossy()
        .into_owned();
    remove_stale_temporaries(&parent_dir(path), &[&name]);
    let mut group = AtomicGroup::new();
    group.stage(path, |out| {
        out.write_all(bytes).map_err(|source| io_err(path, source))
    })?;
    group.commit()
}

/// A fresh temporary name for the destination `name`: `.{name}.tmp.{pid}.{counter}`.
pub(super) fn temporary_name(name: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}{}.{}",
        temporary_prefix(name),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// `.{name}.tmp.`: the start of every temporary file name of the destination `name`.
fn temporary_prefix(name: &str) -> String {
    format!(".{name}.tmp.")
}

/// Removes the temporaries of the files or folders `names` in `dir` left by processes that are
/// no longer running (killed during a save): a temporary file is removed, a temporary folder
/// (of a folder save, see the `folder` module) with everything in it; a symlink is removed, never
/// followed. Temporaries of this process and of live processes are kept (they may belong to a
/// save in progress); entries of any other naming are never touched. Best effort: an entry that
/// cannot be removed is left.
pub(super) fn remove_stale_temporaries(dir: &Path, names: &[&str]) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let prefixes: Vec<String> = names.iter().map(|n| temporary_prefix(n)).collect();
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let file_name = file_name.to_string_lossy();
        let Some(pid) = prefixes
            .iter()
            .find_map(|p| file_name.strip_prefix(p.as_str()))
            .and_then(temporary_pid)
        else {
            continue;
        };
        if pid != std::process::id() && !process_is_running(pid) {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = fs::remove_dir_all(entry.path());
            } else {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

/// The pid of a temporary name's `{pid}.{counter}` tail, `None` for another shape.
fn temporary_pid(tail: &str) -> Option<u32> {
    let (pid, counter) = tail.split_once('.')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !(digits(pid) && digits(counter)) {
        return None;
    }
    pid.parse().ok()
}

#[cfg(unix)]
fn process_is_running(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 sends nothing; it only checks that the process exists.
    let alive = unsafe { libc::kill(pid, 0) } == 0;
    alive || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Without a way to ask, every other process counts as running: nothing is removed.
#[cfg(not(unix))]
fn process_is_running(_pid: u32) -> bool {
    true
}

/// Writes `tensors` (f32, little endian, in the given order) as a safetensors file with the
/// header `__metadata__` `metadata`. The header JSON has sorted keys (the same model saves to
/// the same bytes) and is padded with spaces to a multiple of 8 bytes, as the `safetensors`
/// crate does.
///
/// With a residency `owner` (a model whose parameters are sharded), each tensor's unit is
/// acquired before its data is written and released when the next tensor belongs to another
/// unit (or at the end): one unit's parameters are present at a time. Tensors of one unit must
/// be consecutive.
pub(super) fn write_safetensors(
    path: &Path,
    out: &mut impl Write,
    tensors: &[(String, Tensor)],
    metadata: HashMap<String, String>,
    owner: Option<&SharedResidency>,
) -> Result<()> {
    write_safetensors_as(path, out, tensors, metadata, StateDtype::F32, owner)
}

/// Makes each tensor's unit present while the tensor is written ([`write_safetensors`]).
struct UnitStream<'a> {
    owner: Option<&'a SharedResidency>,
    current: Option<ResidencyUnit>,
}

impl UnitStream<'_> {
    fn enter(&mut self, name: &str) -> Result<()> {
        let Some(owner) = self.owner else {
            return Ok(());
        };
        let unit = ResidencyUnit::of_parameter(name);
        if unit != self.current {
            if let Some(done) = self.current.take() {
                owner.release(done);
            }
            if let Some(u) = unit {
                owner.acquire(u, AcquireReason::Forward, None)?;
            }
            self.current = unit;
        }
        Ok(())
    }
}

impl Drop for UnitStream<'_> {
    fn drop(&mut self) {
        if let (Some(owner), Some(done)) = (self.owner, self.current.take()) {
            owner.release(done);
        }
    }
}

/// [`write_safetensors`] with every tensor encoded in `dtype`.
pub(super) fn write_safetensors_as(
    path: &Path,
    out: &mut impl Write,
    tensors: &[(String, Tensor)],
    metadata: HashMap<String, String>,
    dtype: StateDtype,
    owner: Option<&SharedResidency>,
) -> Result<()> {
    let mut header = serde_json::Map::new();
    let metadata: serde_json::Map<String, serde_json::Value> = metadata
        .into_iter()
        .map(|(k, v)| (k, serde_json::Value::String(v)))
        .collect();
    header.insert("__metadata__".into(), metadata.into());
    let mut offset = 0usize;
    for (name, t) in tensors {
        let end = t
            .numel()
            .checked_mul(dtype.size())
            .and_then(|n| n.checked_add(offset))
            .ok_or_else(|| state_err(path, format!("tensor {name} is too large to save")))?;
        let info =
            json!({"dtype": dtype.safetensors(), "shape": t.dims(), "data_offsets": [offset, end]});
        if header.insert(name.clone(), info).is_some() {
            return Err(state_err(path, format!("tensor name {name} appears twice")));
        }
        offset = end;
    }
    let mut header = serde_json::to_vec(&header).map_err(|e| state_err(path, e))?;
    header.resize(header.len().next_multiple_of(8), b' ');
    let io = |source| io_err(path, source);
    out.write_all(&(header.len() as u64).to_le_bytes())
        .map_err(io)?;
    out.write_all(&header).map_err(io)?;
    let mut bytes = Vec::new();
    let mut stream = UnitStream {
        owner,
        current: None,
    };
    for (name, t) in tensors {
        stream.enter(name)?;
        // Host tensors are read in place; a device tensor is copied to the host first.
        let (guard, copy);
        let data: &[f32] = if t.device() == riftco_tensor::Device::Cpu {
            guard = t.read().map_err(|e| state_err(path, e))?;
            &guard
        } else {
            copy = t.to_host().map_err(|e| state_err(path, e))?;
            &copy
        };
        for chunk in data.chunks(1 << 14) {
            bytes.clear();
            dtype.encode(chunk, &mut bytes);
            out.write_all(&bytes).map_err(io)?;
        }
    }
    Ok(())
}

/// Model files are ordinary user files (`rw-r--r--`).
#[cfg(unix)]
pub(super) fn set_readable(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o644))
}

#[cfg(not(unix))]
pub(super) fn set_readable(_path: &Path) -> std::io::Result<()> {
    Ok(())
}

#[cfg(unix)]
pub(super) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

#[cfg(not(unix))]
pub(super) fn sync_dir(_dir: &Path) -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::temporary_pid;

    #[test]
    fn temporary_names_parse_only_our_shape() {
        assert_eq!(temporary_pid("123.4"), Some(123));
        for other in ["", "123", "123.", ".4", "12a.4", "123.4.5", "123.x"] {
            assert_eq!(temporary_pid(other), None, "{other:?}");
        }
    }
}
