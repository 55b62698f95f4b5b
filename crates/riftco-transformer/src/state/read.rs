//! Reading and validating safetensors and JSON files with bounded memory.
//!
//! Only regular files are read (after following symlinks): a FIFO, a character or block device
//! (`/dev/zero`, `/dev/urandom`), a socket or a directory is refused before any byte is read.
//! The file is opened non-blocking so that a FIFO cannot block the open itself, and its type is
//! checked on the opened descriptor (no race between the check and the read).
//!
//! A safetensors file is read in three bounded steps: the 8-byte header length (at most
//! [`MAX_HEADER_BYTES`] and at most what the file holds after it), the header, then — only once
//! the header's tensor offsets add up to exactly the file's length and the caller has checked
//! names, dtypes and shapes against the model it expects — the data section. Nothing is ever
//! read past the length the header declares, and allocations are fallible, so a crafted file
//! costs at most its own size.

use super::dtype::{decode, is_readable};
use super::values::ParamValues;
use super::{io_err, state_err};
use crate::error::Result;
use riftco_tensor::HalfDtype;
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::Dtype;
use std::collections::{BTreeSet, HashMap};
use std::fs::{self, File};
use std::io::Read;
use std::path::Path;

/// The largest safetensors header read, in bytes (the limit of the `safetensors` crate).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;
/// The largest JSON file (`config.json`, `adapter_config.json`) read, in bytes.
pub const MAX_JSON_BYTES: u64 = 4 << 20;

/// Opens `path` for reading if it is a regular file (symlinks followed) and returns it with its
/// length in bytes.
///
/// # Errors
/// [`crate::TransformerError::Io`] when it cannot be opened (missing, no permission) or is a
/// directory (`EISDIR`); [`crate::TransformerError::State`] naming the file type for a FIFO,
/// device or socket.
pub(super) fn open_regular(path: &Path) -> Result<(File, u64)> {
    let mut options = fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // A FIFO without a writer would block `open` forever; non-blocking, it opens at once
        // and is then refused by its type. Reads of a regular file ignore the flag.
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = match options.open(path) {
        Ok(file) => file,
        // A socket cannot be opened at all (ENXIO): say what it is.
        Err(source) => {
            return Err(match fs::metadata(path) {
                Ok(meta) if !meta.is_file() && !meta.is_dir() => state_err(
                    path,
                    format!(
                        "is a {}, not a regular file: only regular files are read",
                        describe_type(&meta.file_type())
                    ),
                ),
                _ => io_err(path, source),
            })
        }
    };
    let meta = file.metadata().map_err(|source| io_err(path, source))?;
    let file_type = meta.file_type();
    if file_type.is_dir() {
        #[cfg(unix)]
        let source = std::io::Error::from_raw_os_error(libc::EISDIR);
        #[cfg(not(unix))]
        let source = std::io::Error::other("is a directory");
        return Err(io_err(path, source));
    }
    if !file_type.is_file() {
        return Err(state_err(
            path,
            format!(
                "is a {}, not a regular file: only regular files are read",
                describe_type(&file_type)
            ),
        ));
    }
    Ok((file, meta.len()))
}

#[cfg(unix)]
pub(super) fn describe_type(t: &fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "directory"
    } else if t.is_fifo() {
        "FIFO (named pipe)"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_block_device() {
        "block device"
    } else if t.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

#[cfg(not(unix))]
pub(super) fn describe_type(t: &fs::FileType) -> &'static str {
    if t.is_dir() {
        "directory"
    } else {
        "special file"
    }
}

/// A zeroed buffer of `len` bytes, allocated fallibly.
fn try_buffer(path: &Path, len: u64, what: &str) -> Result<Vec<u8>> {
    let n = usize::try_from(len)
        .map_err(|_| state_err(path, format!("{what} of {len} bytes is not addressable")))?;
    let mut buf = Vec::new();
    buf.try_reserve_exact(n).map_err(|_| {
        io_err(
            path,
            std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                format!("cannot allocate {n} bytes for the {what}"),
            ),
        )
    })?;
    buf.resize(n, 0);
    Ok(buf)
}

fn read_exact(path: &Path, file: &mut File, buf: &mut [u8], what: &str) -> Result<()> {
    file.read_exact(buf).map_err(|source| {
        if source.kind() == std::io::ErrorKind::UnexpectedEof {
            state_err(
                path,
                format!("truncated: the file ended inside the {what} (it shrank while read)"),
            )
        } else {
            io_err(path, source)
        }
    })
}

/// Reads a regular JSON file of at most [`MAX_JSON_BYTES`] bytes and parses it.
///
/// # Errors
/// As [`open_regular`]; [`crate::TransformerError::State`] when the file is larger than the
/// bound or is not valid JSON.
pub(super) fn read_json(path: &Path) -> Result<serde_json::Value> {
    let bytes = read_json_bytes(path)?;
    serde_json::from_slice(&bytes).map_err(|e| state_err(path, format!("not valid JSON: {e}")))
}

/// The bytes of a regular file of at most [`MAX_JSON_BYTES`] bytes.
pub(super) fn read_json_bytes(path: &Path) -> Result<Vec<u8>> {
    let (file, len) = open_regular(path)?;
    if len > MAX_JSON_BYTES {
        return Err(state_err(
            path,
            format!("the file has {len} bytes; a JSON config may have at most {MAX_JSON_BYTES}"),
        ));
    }
    let mut bytes = Vec::new();
    // `take` bounds the read even if the file grows after the length was taken.
    file.take(MAX_JSON_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| io_err(path, source))?;
    if bytes.len() as u64 > MAX_JSON_BYTES {
        return Err(state_err(
            path,
            format!("the file grew past {MAX_JSON_BYTES} bytes while read"),
        ));
    }
    Ok(bytes)
}

/// Whether `path` is a regular file holding exactly `content` (any read failure: no).
pub(super) fn unchanged(path: &Path, content: &[u8]) -> bool {
    read_json_bytes(path).is_ok_and(|old| old == content)
}

/// Whether the first bytes of a file look like JSON text (optional whitespace, then `{` or
/// `[`): read as a safetensors header length they give an absurd size (`{"we` is
/// 8388068008349082235 bytes).
fn starts_like_json(prefix: &[u8]) -> bool {
    prefix
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| matches!(b, b'{' | b'['))
}

/// A safetensors file whose header has been read and validated; its data section is not read
/// yet.
pub(super) struct Header {
    /// The tensors' names, dtypes, shapes and offsets.
    pub(super) tensors: Metadata,
    /// The header's `__metadata__` map (empty when absent).
    pub(super) metadata: HashMap<String, String>,
    file: File,
    /// The file offset of the data section (just past the header).
    data_start: u64,
    data_len: u64,
}

/// Opens `path` and reads its safetensors header, with reasons that say what is wrong with the
/// file. Checks that the tensors' offsets cover the data section exactly, so that the data read
/// later is the file's own length.
pub(super) fn read_header(path: &Path) -> Result<Header> {
    const N_LEN: u64 = 8;
    let (mut file, file_len) = open_regular(path)?;
    if file_len < N_LEN {
        return Err(state_err(
            path,
            format!(
                "truncated: the file has {file_len} bytes, fewer than the 8-byte header length \
                 that starts a safetensors file"
            ),
        ));
    }
    let mut prefix = [0u8; N_LEN as usize];
    read_exact(path, &mut file, &mut prefix, "header length")?;
    let header_len = u64::from_le_bytes(prefix);
    let available = file_len - N_LEN;
    if header_len > available.min(MAX_HEADER_BYTES) && starts_like_json(&prefix) {
        return Err(state_err(
            path,
            format!(
                "this is a JSON file (it starts with {:?}), not safetensors (whose first 8 bytes \
                 are the binary size of its header): a shard index or config.json given as \
                 weights?",
                String::from_utf8_lossy(&prefix)
            ),
        ));
    }
    if header_len > available {
        return Err(state_err(
            path,
            format!(
                "header length {header_len} bytes exceeds the {available} bytes after the length \
                 prefix: the file is truncated or not a safetensors file"
            ),
        ));
    }
    if header_len > MAX_HEADER_BYTES {
        return Err(state_err(
            path,
            format!("header length {header_len} bytes exceeds the limit of {MAX_HEADER_BYTES}"),
        ));
    }
    let mut header = try_buffer(path, header_len, "safetensors header")?;
    read_exact(path, &mut file, &mut header, "header")?;
    let text = std::str::from_utf8(&header).map_err(|_| {
        state_err(
            path,
            "the header is not UTF-8: not a safetensors file (garbage bytes)",
        )
    })?;
    let tensors: Metadata = serde_json::from_str(text).map_err(|e| {
        state_err(
            path,
            format!("the header is not valid safetensors JSON: {e}"),
        )
    })?;
    let data_len = available - header_len;
    let declared = tensors.data_len() as u64;
    if declared != data_len {
        return Err(state_err(
            path,
            format!(
                "the data section ({data_len} bytes) does not match the tensor offsets in the \
                 header ({declared} bytes): the file is truncated or has trailing bytes"
            ),
        ));
    }
    let metadata = tensors.metadata().clone().unwrap_or_default();
    Ok(Header {
        tensors,
        metadata,
        file,
        data_start: N_LEN + header_len,
        data_len,
    })
}

/// Checks that the header holds exactly the `expected` names, each of a dtype that is read
/// (F32, BF16, F16) with the expected shape. `context` describes where the expectation comes
/// from (the config), for the error message.
pub(super) fn check_tensors(
    path: &Path,
    header: &Header,
    expected: &[(String, Vec<usize>)],
    context: &str,
) -> Result<()> {
    check_tensor_infos(path, &header.tensors.tensors(), expected, context)
}

/// [`check_tensors`] for the tensors of one or several files (a sharded state), by name.
pub(super) fn check_tensor_infos(
    path: &Path,
    infos: &HashMap<String, &TensorInfo>,
    expected: &[(String, Vec<usize>)],
    context: &str,
) -> Result<()> {
    let names: BTreeSet<&str> = infos.keys().map(String::as_str).collect();
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
    for (name, shape) in expected {
        let info = infos[name.as_str()];
        if !is_readable(info.dtype) {
            return Err(state_err(
                path,
                format!(
                    "tensor {name} has dtype {:?}; riftco reads F32, BF16 and F16 (converted to \
                     f32 exactly)",
                    info.dtype
                ),
            ));
        }
        if info.shape != *shape {
            return Err(state_err(
                path,
                format!(
                    "tensor {name} has shape {:?} but the config ({context}) expects {shape:?}",
                    info.shape
                ),
            ));
        }
    }
    Ok(())
}

/// Reads the values of the `expected` tensors, in `expected` order: converted to f32, or with
/// `half` stored in that 16-bit format (the file's own bits when it holds that format, else each
/// value rounded to nearest, ties to even). Call [`check_tensors`] first (the data section's
/// length was checked against the file by [`read_header`]).
///
/// Streams: each tensor's bytes are read from its offset into one buffer reused from tensor to
/// tensor and decoded from there, so the memory in use is the values read so far plus the file
/// bytes of one tensor (and its f32 decoding when rounding), never the whole data section and
/// the values at once.
pub(super) fn read_values(
    path: &Path,
    mut header: Header,
    expected: &[(String, Vec<usize>)],
    half: Option<HalfDtype>,
    quantize: Option<riftco_tensor::QuantFormat>,
) -> Result<Vec<(String, ParamValues)>> {
    use std::io::{Seek, SeekFrom};
    let mut out = Vec::new();
    out.try_reserve_exact(expected.len())
        .map_err(|_| state_err(path, "cannot allocate the tensor list"))?;
    let mut bytes: Vec<u8> = Vec::new();
    for (name, shape) in expected {
        let info: &TensorInfo = header
            .tensors
            .info(name)
            .ok_or_else(|| state_err(path, format!("internal: tensor {name} not in the header")))?;
        let (start, end) = info.data_offsets;
        if start > end || end as u64 > header.data_len {
            return Err(state_err(
                path,
                format!("tensor {name} lies outside the data"),
            ));
        }
        let len = end - start;
        bytes.clear();
        bytes.try_reserve_exact(len).map_err(|_| {
            state_err(
                path,
                format!("cannot allocate {len} bytes for tensor {name}"),
            )
        })?;
        bytes.resize(len, 0);
        header
            .file
            .seek(SeekFrom::Start(header.data_start + start as u64))
            .map_err(|e| state_err(path, format!("cannot seek to tensor {name}: {e}")))?;
        read_exact(path, &mut header.file, &mut bytes, "tensor data")?;
        let values = match half {
            None => ParamValues::F32(decode(path, name, info.dtype, &bytes)?),
            Some(h) => {
                let same = matches!(
                    (h, info.dtype),
                    (HalfDtype::BFloat16, Dtype::BF16) | (HalfDtype::Float16, Dtype::F16)
                );
                let mut bits: Vec<u16> = Vec::new();
                let n = if same {
                    len / 2
                } else {
                    len / dtype_size(info.dtype)
                };
                bits.try_reserve_exact(n)
                    .map_err(|_| state_err(path, format!("cannot allocate tensor {name}")))?;
                if same {
                    bits.extend(
                        bytes
                            .chunks_exact(2)
                            .map(|b| u16::from_le_bytes([b[0], b[1]])),
                    );
                } else {
                    let f = decode(path, name, info.dtype, &bytes)?;
                    bits.extend(f.iter().map(|&x| h.from_f32(x)));
                    if let Some(i) = riftco_tensor::tensor::first_overflow(&f, &bits, h) {
                        return Err(state_err(
                            path,
                            format!(
                                "tensor {name} element {i} = {} is beyond the range of {} (it \
                                 would become infinite): load it as float32 or bfloat16",
                                f[i],
                                h.name()
                            ),
                        ));
                    }
                }
                ParamValues::Half(h, bits)
            }
        };
        let values = match quantize {
            Some(f) => super::values::quantize_param(path, name, shape, f, values)?,
            None => values,
        };
        out.push((name.clone(), values));
    }
    Ok(out)
}

/// Bytes per element of a readable dtype (F32, BF16, F16; 4 for anything else, which
/// [`check_tensors`] refused before).
fn dtype_size(dtype: Dtype) -> usize {
    match dtype {
        Dtype::BF16 | Dtype::F16 => 2,
        _ => 4,
    }
}

/// Copies validated values into the parameters of the same names; checks that every parameter
/// has a value before writing any. Bumps each written tensor's version.
pub(super) fn copy_into(
    path: &Path,
    params: &[(String, riftco_autograd::Variable)],
    values: Vec<(String, ParamValues)>,
) -> Result<()> {
    let mut by_name: HashMap<String, ParamValues> = values.into_iter().collect();
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
        match v {
            ParamValues::F32(v) => p.value().copy_from_slice(&v)?,
            ParamValues::Half(dtype, bits) => {
                let v: Vec<f32> = bits.iter().map(|&b| dtype.to_f32(b)).collect();
                p.value().copy_from_slice(&v)?
            }
            ParamValues::Quantized(format, bytes, numel) => {
                let mut v = vec![0.0f32; numel];
                riftco_tensor::QuantizedBytes {
                    format,
                    bytes,
                    numel,
                }
                .dequantize_range("load_weights_into", 0, &mut v)?;
                p.value().copy_from_slice(&v)?
            }
        }
    }
    Ok(())
}
