//! Saves that replace a whole folder atomically, for any reader.
//!
//! A save of the files `names` into the folder `dir` builds the complete new folder under a
//! temporary sibling `<parent>/.<dir name>.tmp.<pid>.<n>`: the new files, written in full and
//! fsynced, plus every other entry of the current folder reproduced by hard links (subfolders
//! re-created as folders, recursively; regular files and other non-folders hard-linked; symlinks
//! re-created as symlinks with the same target), so files that other programs keep there
//! (`tokenizer.json`, `README.md`, `checkpoints/`) survive the save. Every folder of the new tree
//! is fsynced, then the new folder is exchanged with the live one in one system call (Linux
//! `renameat2(RENAME_EXCHANGE)`, macOS `renamex_np(RENAME_SWAP)`), the parent is fsynced, and
//! the old tree (now under the temporary name) is removed. When the folder does not exist yet
//! the new one is renamed into place. A reader that opens files by path at any moment sees the
//! old folder whole or the new folder whole: never a `config.json` of one save beside weights of
//! another. Files a reader already has open stay readable (the old tree's files are unlinked,
//! not overwritten).
//!
//! What is lost: an entry created in the folder by another program while the save runs (after
//! the new tree was built, before the exchange) ends up in the old tree and is removed with it.
//!
//! [`save_folder_atomic`] reports [`Exchange::Unsupported`] (and leaves nothing behind) where
//! the exchange cannot be used, and the callers then fall back to the per-file protocol of the
//! `atomic` module: on systems other than Linux and macOS; where the filesystem refuses the
//! exchange or the hard links (`EINVAL`, `ENOSYS`, `EXDEV`, `EPERM`, `ENOTSUP`, `EMLINK`: some
//! network and FUSE filesystems, a subfolder that is another mount, files of another user under
//! `fs.protected_hardlinks`); where the parent folder is not writable or read-only (the
//! temporary sibling cannot be created; the per-file protocol needs only the folder itself
//! writable); where an entry of the folder cannot be read to be reproduced; where the folder is
//! a filesystem root or contains this process's working folder (exchanging it would leave the
//! process in the removed old tree).
//!
//! A folder given through a symlink is resolved: the target folder is exchanged and the link is
//! left as it is. A killed save leaves its temporary sibling; the next save of that folder
//! removes the siblings of processes no longer running
//! ([`super::atomic::remove_stale_temporaries`]).

use super::atomic::{remove_stale_temporaries, set_readable, sync_dir, temporary_name};
use super::{io_err, state_err};
use crate::error::Result;
use std::fs;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// A function writing the full content of one new file of a folder save.
pub(super) type WriteFile<'a> = &'a dyn Fn(&mut dyn Write) -> Result<()>;

/// How a folder save went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Exchange {
    /// The new folder replaced the live one in one exchange.
    Exchanged,
    /// The folder did not exist; the new one was renamed into place.
    Created,
    /// The exchange cannot be used here (see the module docs); nothing was changed and no
    /// temporary remains: the caller falls back to the per-file protocol.
    Unsupported,
}

/// Replaces the files `files` (name in the folder, writer) of the folder `dir` as described in
/// the module docs, keeping every other entry of the folder.
///
/// # Errors
/// [`crate::TransformerError::Io`] naming the path on a failure other than the unsupported
/// cases (a write of a new file failing, a full disk, a refused exchange); the live folder is
/// then unchanged and the temporary removed. Errors of the writers are returned as they are.
pub(super) fn save_folder_atomic(dir: &Path, files: &[(&str, WriteFile<'_>)]) -> Result<Exchange> {
    if !cfg!(any(target_os = "linux", target_os = "macos")) {
        return Ok(Exchange::Unsupported);
    }
    let Some(live) = resolve_folder(dir)? else {
        return Ok(Exchange::Unsupported);
    };
    let (Some(parent), Some(dir_name)) = (live.parent(), live.file_name()) else {
        return Ok(Exchange::Unsupported);
    };
    let dir_name = dir_name.to_string_lossy().into_owned();
    if contains_working_folder(&live) {
        return Ok(Exchange::Unsupported);
    }
    let exists = match fs::symlink_metadata(&live) {
        Ok(m) if m.is_dir() => true,
        Ok(m) => {
            return Err(state_err(
                dir,
                format!(
                    "the folder to save into is a {}, not a folder",
                    super::read::describe_type(&m.file_type())
                ),
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(source) => return Err(io_err(dir, source)),
    };
    remove_stale_temporaries(parent, &[&dir_name]);
    if exists {
        let names: Vec<&str> = files.iter().map(|(n, _)| *n).collect();
        remove_stale_temporaries(&live, &names);
    }
    let tmp = TempTree(parent.join(temporary_name(&dir_name)));
    match fs::create_dir(&tmp.0) {
        Ok(()) => {}
        Err(e) if parent_refuses(&e) => return Ok(Exchange::Unsupported),
        Err(source) => return Err(io_err(&tmp.0, source)),
    }
    if exists {
        let skip: Vec<&str> = files.iter().map(|(n, _)| *n).collect();
        if reproduce(&live, &tmp.0, &skip).is_err() {
            return Ok(Exchange::Unsupported);
        }
    }
    for (name, write) in files {
        let path = tmp.0.join(name);
        let shown = live.join(name);
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|source| io_err(&shown, source))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        write(&mut out)?;
        let file = out
            .into_inner()
            .map_err(|e| io_err(&shown, e.into_error()))?;
        set_readable(&path).map_err(|source| io_err(&shown, source))?;
        file.sync_all().map_err(|source| io_err(&shown, source))?;
    }
    sync_dir(&tmp.0).map_err(|source| io_err(&tmp.0, source))?;
    let outcome = if exists {
        match exchange(&tmp.0, &live) {
            Ok(()) => Exchange::Exchanged,
            Err(e) if exchange_unsupported(&e) => return Ok(Exchange::Unsupported),
            Err(source) => return Err(io_err(&live, source)),
        }
    } else {
        fs::rename(&tmp.0, &live).map_err(|source| io_err(&live, source))?;
        Exchange::Created
    };
    // Committed: the parent's entries are made durable; the temporary name now holds the old
    // tree (or nothing), which the guard removes.
    sync_dir(parent).map_err(|source| io_err(parent, source))?;
    drop(tmp);
    Ok(outcome)
}

/// The folder to exchange: `dir` with every symlink resolved (a symlinked folder is replaced
/// at its target, the link kept), or, when `dir` does not exist, its resolved parent joined
/// with its name. `None` when there is nothing to exchange (`/`, `..` as the last component).
fn resolve_folder(dir: &Path) -> Result<Option<PathBuf>> {
    match fs::canonicalize(dir) {
        Ok(p) => Ok(Some(p)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let Some(name) = dir.file_name() else {
                return Ok(None);
            };
            let parent = super::parent_dir(dir);
            let parent = fs::canonicalize(&parent).map_err(|source| io_err(&parent, source))?;
            Ok(Some(parent.join(name)))
        }
        Err(source) => Err(io_err(dir, source)),
    }
}

/// Whether this process's working folder is `live` or inside it.
fn contains_working_folder(live: &Path) -> bool {
    std::env::current_dir()
        .and_then(fs::canonicalize)
        .is_ok_and(|cwd| cwd.starts_with(live))
}

/// Creating the temporary sibling failed because the parent does not let us write.
fn parent_refuses(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::PermissionDenied || is_errno(e, &[libc_erofs()])
}

/// The exchange failed because the system or the filesystem does not support it.
fn exchange_unsupported(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::Unsupported || is_errno(e, &unsupported_errnos())
}

fn is_errno(e: &std::io::Error, codes: &[i32]) -> bool {
    e.raw_os_error().is_some_and(|c| codes.contains(&c))
}

#[cfg(unix)]
fn libc_erofs() -> i32 {
    libc::EROFS
}

#[cfg(not(unix))]
fn libc_erofs() -> i32 {
    -1
}

#[cfg(unix)]
fn unsupported_errnos() -> Vec<i32> {
    vec![
        libc::EINVAL,
        libc::ENOSYS,
        libc::EXDEV,
        libc::EPERM,
        libc::ENOTSUP,
        libc::EOPNOTSUPP,
    ]
}

#[cfg(not(unix))]
fn unsupported_errnos() -> Vec<i32> {
    Vec::new()
}

/// Reproduces every entry of `from` except the names `skip` (top level only) into the empty
/// folder `to`: folders re-created (same permissions) and filled recursively, symlinks
/// re-created, everything else hard-linked. Each created folder is fsynced.
fn reproduce(from: &Path, to: &Path, skip: &[&str]) -> std::io::Result<()> {
    let perms = fs::metadata(from)?.permissions();
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name();
        if skip.iter().any(|s| name == *s) {
            continue;
        }
        let (src, dst) = (entry.path(), to.join(&name));
        let kind = entry.file_type()?;
        if kind.is_dir() {
            fs::create_dir(&dst)?;
            reproduce(&src, &dst, &[])?;
        } else if kind.is_symlink() {
            symlink(&fs::read_link(&src)?, &dst)?;
        } else {
            fs::hard_link(&src, &dst)?;
        }
    }
    fs::set_permissions(to, perms)?;
    sync_dir(to)
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(not(unix))]
fn symlink(_target: &Path, _link: &Path) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// Swaps the folders `a` and `b` in one system call.
#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    let (a, b) = (c_path(a)?, c_path(b)?);
    // SAFETY: both pointers are NUL-terminated paths that outlive the call; renameat2 reads
    // them only. The raw syscall works on every glibc and musl (the wrapper needs glibc 2.28).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(target_os = "macos")]
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    let (a, b) = (c_path(a)?, c_path(b)?);
    // SAFETY: both pointers are NUL-terminated paths that outlive the call.
    let rc = unsafe { libc::renamex_np(a.as_ptr(), b.as_ptr(), libc::RENAME_SWAP) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn exchange(_a: &Path, _b: &Path) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

#[cfg(unix)]
fn c_path(p: &Path) -> std::io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL byte in a path"))
}

/// A temporary folder tree, removed when dropped (after a failure, or after the exchange, when
/// it holds the old tree).
struct TempTree(PathBuf);

impl Drop for TempTree {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[cfg(all(test, any(target_os = "linux", target_os = "macos")))]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "riftco-folder-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn text(s: &'static str) -> impl Fn(&mut dyn Write) -> Result<()> {
        move |out| {
            out.write_all(s.as_bytes())
                .map_err(|e| io_err(Path::new(s), e))
        }
    }

    /// Names in `dir` starting with `.`.
    fn hidden(dir: &Path) -> Vec<String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect()
    }

    #[test]
    fn a_new_folder_is_renamed_into_place() {
        let root = scratch("new");
        let dir = root.join("model");
        let (a, b) = (text("A"), text("B"));
        let out = save_folder_atomic(&dir, &[("a.json", &a), ("b.bin", &b)]).unwrap();
        assert_eq!(out, Exchange::Created);
        assert_eq!(fs::read_to_string(dir.join("a.json")).unwrap(), "A");
        assert_eq!(fs::read_to_string(dir.join("b.bin")).unwrap(), "B");
        assert!(hidden(&root).is_empty(), "{:?}", hidden(&root));
    }

    #[test]
    fn an_existing_folder_keeps_its_other_entries() {
        let root = scratch("existing");
        let dir = root.join("model");
        fs::create_dir_all(dir.join("checkpoints/step-1")).unwrap();
        fs::write(dir.join("a.json"), "old A").unwrap();
        fs::write(dir.join("tokenizer.json"), "tok").unwrap();
        fs::write(dir.join("checkpoints/step-1/w.bin"), "w1").unwrap();
        std::os::unix::fs::symlink("tokenizer.json", dir.join("link")).unwrap();
        // A reader holding the old file open keeps reading the old content.
        let mut held = fs::File::open(dir.join("a.json")).unwrap();
        let inode_before = fs::metadata(dir.join("tokenizer.json")).unwrap();
        let (a, b) = (text("A"), text("B"));
        let out = save_folder_atomic(&dir, &[("a.json", &a), ("b.bin", &b)]).unwrap();
        assert_eq!(out, Exchange::Exchanged);
        assert_eq!(fs::read_to_string(dir.join("a.json")).unwrap(), "A");
        assert_eq!(fs::read_to_string(dir.join("b.bin")).unwrap(), "B");
        assert_eq!(
            fs::read_to_string(dir.join("tokenizer.json")).unwrap(),
            "tok"
        );
        assert_eq!(
            fs::read_to_string(dir.join("checkpoints/step-1/w.bin")).unwrap(),
            "w1"
        );
        assert_eq!(
            fs::read_link(dir.join("link")).unwrap(),
            Path::new("tokenizer.json")
        );
        // Hard links: the same file, not a copy.
        use std::os::unix::fs::MetadataExt;
        let inode_after = fs::metadata(dir.join("tokenizer.json")).unwrap();
        assert_eq!(inode_before.ino(), inode_after.ino());
        let mut old = String::new();
        std::io::Read::read_to_string(&mut held, &mut old).unwrap();
        assert_eq!(old, "old A");
        assert!(hidden(&root).is_empty(), "{:?}", hidden(&root));
    }

    #[test]
    fn a_symlinked_folder_is_replaced_at_its_target() {
        let root = scratch("symlink");
        let target = root.join("real");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("keep.txt"), "k").unwrap();
        std::os::unix::fs::symlink(&target, root.join("via")).unwrap();
        let a = text("A");
        let out = save_folder_atomic(&root.join("via"), &[("a.json", &a)]).unwrap();
        assert_eq!(out, Exchange::Exchanged);
        assert!(fs::symlink_metadata(root.join("via"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read_to_string(target.join("a.json")).unwrap(), "A");
        assert_eq!(fs::read_to_string(target.join("keep.txt")).unwrap(), "k");
    }

    #[test]
    fn stale_temporaries_of_dead_processes_are_removed() {
        let root = scratch("stale");
        let dir = root.join("model");
        fs::create_dir(&dir).unwrap();
        // A pid that cannot be running (above the kernel's maximum), and our own (kept: it may
        // be a save in progress in another thread).
        let dead = root.join(".model.tmp.4294967.0");
        fs::create_dir_all(dead.join("sub")).unwrap();
        fs::write(dead.join("sub/x"), "x").unwrap();
        let inside = dir.join(".a.json.tmp.4294967.3");
        fs::write(&inside, "partial").unwrap();
        let other = root.join(".model.tmp.notours");
        fs::write(&other, "").unwrap();
        let a = text("A");
        save_folder_atomic(&dir, &[("a.json", &a)]).unwrap();
        assert!(!dead.exists() && !dir.join(".a.json.tmp.4294967.3").exists());
        assert!(other.exists(), "a file of another naming is never touched");
    }

    #[test]
    fn a_writer_error_leaves_the_folder_and_no_temporary() {
        let root = scratch("fails");
        let dir = root.join("model");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("a.json"), "old").unwrap();
        let fail = |_: &mut dyn Write| Err(state_err(Path::new("x"), "refused"));
        let err = save_folder_atomic(&dir, &[("a.json", &fail)]).unwrap_err();
        assert!(err.to_string().contains("refused"), "{err}");
        assert_eq!(fs::read_to_string(dir.join("a.json")).unwrap(), "old");
        assert!(hidden(&root).is_empty(), "{:?}", hidden(&root));
    }
}
