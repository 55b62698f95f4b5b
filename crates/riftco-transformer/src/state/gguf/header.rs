//! The bounded parse of a GGUF header: magic, version, metadata key/values, tensor infos,
//! alignment and the data section's offset.
//!
//! Layout (GGUF versions 2 and 3, little endian; `docs/gguf.md` of llama.cpp): `"GGUF"`, `u32`
//! version, `u64` tensor count, `u64` metadata count; each key/value a string key (`u64` byte
//! length, then UTF-8 bytes), a `u32` value type and the value (an array: `u32` element type,
//! `u64` count, the elements); each tensor info a string name, `u32` dimension count, that many
//! `u64` dimensions (`ne[0]` the innermost), a `u32` GGML type and a `u64` offset into the data
//! section; then padding up to `general.alignment` (default 32) where the data section starts.
//!
//! Every length and count is checked against the bytes that remain before anything is
//! allocated or read, and nothing past [`MAX_GGUF_HEADER_BYTES`] is read as header, so a
//! crafted file costs memory proportional to at most that many bytes; each error names the
//! file, the field and the offset.

use super::value::{type_id, type_name, GgufArray, GgufValue};
use super::GgufTensorInfo;
use crate::error::Result;
use crate::state::state_err;
use riftco_kernels::quant::GgmlType;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

/// The most bytes read as the header (metadata and tensor infos): 64 MiB. The largest
/// tokenizers in GGUF files (vocabularies of 256 k tokens with their merges or scores) take
/// about 10 MB.
pub const MAX_GGUF_HEADER_BYTES: u64 = 64 << 20;
/// The alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The most dimensions of a tensor (`GGML_MAX_DIMS`).
const MAX_DIMS: u32 = 4;
/// The deepest nesting of arrays of arrays read (llama.cpp reads none).
const MAX_ARRAY_DEPTH: usize = 8;
/// The bytes `"GGUF"` a file starts with.
pub(super) const MAGIC: [u8; 4] = *b"GGUF";

/// What the header says.
pub(super) struct Header {
    pub(super) version: u32,
    pub(super) metadata: Vec<(String, GgufValue)>,
    pub(super) index: HashMap<String, usize>,
    pub(super) tensors: Vec<GgufTensorInfo>,
    pub(super) alignment: u64,
    pub(super) data_offset: u64,
}

/// The header's reader: a position and the bounds every read is checked against.
struct Cursor<'a> {
    reader: BufReader<&'a File>,
    path: &'a Path,
    pos: u64,
    file_len: u64,
    /// `min(file_len, MAX_GGUF_HEADER_BYTES)`.
    end: u64,
}

type Field<'f> = &'f dyn Fn() -> String;

impl Cursor<'_> {
    fn err(&self, reason: impl std::fmt::Display) -> crate::TransformerError {
        state_err(self.path, format!("GGUF: {reason}"))
    }

    /// Checks that `n` more bytes can be read as header at the current position.
    fn check(&self, n: u64, field: Field<'_>) -> Result<()> {
        match self.pos.checked_add(n) {
            Some(stop) if stop <= self.end => Ok(()),
            Some(stop) if stop <= self.file_len => Err(self.err(format!(
                "{} ({n} bytes at offset {}) lies beyond the first {MAX_GGUF_HEADER_BYTES} bytes, \
                 the most read as metadata and tensor infos",
                field(),
                self.pos
            ))),
            _ => Err(self.err(format!(
                "truncated: {} needs {n} bytes at offset {} but the file has {} bytes",
                field(),
                self.pos,
                self.file_len
            ))),
        }
    }

    /// `count` entries of at least `min_bytes` each must fit in what remains of the header.
    fn check_count(&self, count: u64, min_bytes: u64, field: Field<'_>) -> Result<usize> {
        let remaining = self.end - self.pos;
        let need = count.checked_mul(min_bytes);
        match usize::try_from(count) {
            Ok(n) if need.is_some_and(|need| need <= remaining) => Ok(n),
            _ => {
                let what = if self.end < self.file_len {
                    format!("the header may take at most the first {MAX_GGUF_HEADER_BYTES} bytes")
                } else {
                    "a truncated or corrupt file".to_string()
                };
                Err(self.err(format!(
                    "{} = {count}: that many entries of at least {min_bytes} bytes each need {} \
                     bytes, but only {remaining} bytes remain after offset {} ({what})",
                    field(),
                    need.map_or_else(|| "more than 2^64".to_string(), |n| n.to_string()),
                    self.pos
                )))
            }
        }
    }

    fn read_into(&mut self, buf: &mut [u8], field: Field<'_>) -> Result<()> {
        self.check(buf.len() as u64, field)?;
        self.reader.read_exact(buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                self.err(format!(
                    "truncated: the file ended inside {} at offset {} (it shrank while read)",
                    field(),
                    self.pos
                ))
            } else {
                crate::state::io_err(self.path, e)
            }
        })?;
        self.pos += buf.len() as u64;
        Ok(())
    }

    fn fixed<const N: usize>(&mut self, field: Field<'_>) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.read_into(&mut b, field)?;
        Ok(b)
    }

    fn u32(&mut self, field: Field<'_>) -> Result<u32> {
        Ok(u32::from_le_bytes(self.fixed(field)?))
    }

    fn u64(&mut self, field: Field<'_>) -> Result<u64> {
        Ok(u64::from_le_bytes(self.fixed(field)?))
    }

    /// `n` bytes (already known to fit), into a fallibly allocated buffer.
    fn bytes(&mut self, n: usize, field: Field<'_>) -> Result<Vec<u8>> {
        self.check(n as u64, field)?;
        let mut buf = Vec::new();
        buf.try_reserve_exact(n)
            .map_err(|_| self.err(format!("cannot allocate {n} bytes for {}", field())))?;
        buf.resize(n, 0);
        self.read_into(&mut buf, field)?;
        Ok(buf)
    }

    fn string(&mut self, field: Field<'_>) -> Result<String> {
        let len = self.u64(&|| format!("the length of {}", field()))?;
        let n = self.check_count(len, 1, &|| format!("the length of {}", field()))?;
        let bytes = self.bytes(n, field)?;
        String::from_utf8(bytes).map_err(|e| {
            self.err(format!(
                "{} is not UTF-8 (invalid byte at position {})",
                field(),
                e.utf8_error().valid_up_to()
            ))
        })
    }

    /// A value of type `ty`; `depth` counts the arrays around it.
    fn value(&mut self, ty: u32, depth: usize, field: Field<'_>) -> Result<GgufValue> {
        Ok(match ty {
            type_id::UINT8 => GgufValue::U8(u8::from_le_bytes(self.fixed(field)?)),
            type_id::INT8 => GgufValue::I8(i8::from_le_bytes(self.fixed(field)?)),
            type_id::UINT16 => GgufValue::U16(u16::from_le_bytes(self.fixed(field)?)),
            type_id::INT16 => GgufValue::I16(i16::from_le_bytes(self.fixed(field)?)),
            type_id::UINT32 => GgufValue::U32(self.u32(field)?),
            type_id::INT32 => GgufValue::I32(i32::from_le_bytes(self.fixed(field)?)),
            type_id::FLOAT32 => GgufValue::F32(f32::from_le_bytes(self.fixed(field)?)),
            type_id::BOOL => GgufValue::Bool(self.fixed::<1>(field)?[0] != 0),
            type_id::STRING => GgufValue::String(self.string(field)?),
            type_id::ARRAY => GgufValue::Array(self.array(depth, field)?),
            type_id::UINT64 => GgufValue::U64(self.u64(field)?),
            type_id::INT64 => GgufValue::I64(i64::from_le_bytes(self.fixed(field)?)),
            type_id::FLOAT64 => GgufValue::F64(f64::from_le_bytes(self.fixed(field)?)),
            other => return Err(self.unknown_type(other, field)),
        })
    }

    fn unknown_type(&self, ty: u32, field: Field<'_>) -> crate::TransformerError {
        self.err(format!(
            "{} has value type {ty}, which is not a GGUF value type (0 UINT8 to 12 FLOAT64)",
            field()
        ))
    }

    /// The elements of an array value: element type, count, elements.
    fn array(&mut self, depth: usize, field: Field<'_>) -> Result<GgufArray> {
        let elem = self.u32(&|| format!("the element type of {}", field()))?;
        let count = self.u64(&|| format!("the element count of {}", field()))?;
        let Some(min) = min_value_bytes(elem) else {
            return Err(self.unknown_type(elem, &|| format!("the elements of {}", field())));
        };
        let n = self.check_count(count, min, &|| {
            format!("the element count of {} ({})", field(), type_name(elem))
        })?;
        let raw = |c: &mut Self, size: usize| -> Result<Vec<u8>> {
            c.bytes(n * size, &|| format!("the {n} elements of {}", field()))
        };
        macro_rules! numbers {
            ($variant:ident, $t:ty) => {{
                let bytes = raw(self, std::mem::size_of::<$t>())?;
                let mut v: Vec<$t> = Vec::new();
                v.try_reserve_exact(n).map_err(|_| {
                    self.err(format!("cannot allocate the {n} elements of {}", field()))
                })?;
                v.extend(
                    bytes
                        .chunks_exact(std::mem::size_of::<$t>())
                        .map(|b| <$t>::from_le_bytes(b.try_into().unwrap_or_default())),
                );
                GgufArray::$variant(v)
            }};
        }
        Ok(match elem {
            type_id::UINT8 => GgufArray::U8(raw(self, 1)?),
            type_id::INT8 => numbers!(I8, i8),
            type_id::UINT16 => numbers!(U16, u16),
            type_id::INT16 => numbers!(I16, i16),
            type_id::UINT32 => numbers!(U32, u32),
            type_id::INT32 => numbers!(I32, i32),
            type_id::FLOAT32 => numbers!(F32, f32),
            type_id::UINT64 => numbers!(U64, u64),
            type_id::INT64 => numbers!(I64, i64),
            type_id::FLOAT64 => numbers!(F64, f64),
            type_id::BOOL => GgufArray::Bool(raw(self, 1)?.into_iter().map(|b| b != 0).collect()),
            type_id::STRING => {
                let mut v = Vec::new();
                v.try_reserve_exact(n).map_err(|_| {
                    self.err(format!("cannot allocate the {n} strings of {}", field()))
                })?;
                for i in 0..n {
                    v.push(self.string(&|| format!("element {i} of {}", field()))?);
                }
                GgufArray::String(v)
            }
            _ => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.err(format!(
                        "{} nests arrays more than {MAX_ARRAY_DEPTH} deep",
                        field()
                    )));
                }
                let mut v = Vec::new();
                v.try_reserve_exact(n).map_err(|_| {
                    self.err(format!("cannot allocate the {n} arrays of {}", field()))
                })?;
                for i in 0..n {
                    v.push(self.array(depth + 1, &|| format!("element {i} of {}", field()))?);
                }
                GgufArray::Array(v)
            }
        })
    }
}

/// The fewest bytes a value of type `ty` takes (a string: its length; an array: its element
/// type and count); `None` for an unknown type.
fn min_value_bytes(ty: u32) -> Option<u64> {
    Some(match ty {
        type_id::UINT8 | type_id::INT8 | type_id::BOOL => 1,
        type_id::UINT16 | type_id::INT16 => 2,
        type_id::UINT32 | type_id::INT32 | type_id::FLOAT32 => 4,
        type_id::UINT64 | type_id::INT64 | type_id::FLOAT64 | type_id::STRING => 8,
        type_id::ARRAY => 12,
        _ => return None,
    })
}

/// Reads and checks the header of the open GGUF file `file` of `file_len` bytes.
pub(super) fn read_header(path: &Path, file: &File, file_len: u64) -> Result<Header> {
    let mut c = Cursor {
        reader: BufReader::with_capacity(1 << 16, file),
        path,
        pos: 0,
        file_len,
        end: file_len.min(MAX_GGUF_HEADER_BYTES),
    };
    let magic: [u8; 4] = c.fixed(&|| "the magic \"GGUF\"".into())?;
    if magic != MAGIC {
        return Err(c.err(format!(
            "not a GGUF file: it starts with the bytes {magic:02x?}, not the magic \"GGUF\" \
             (47 47 55 46)"
        )));
    }
    let version = c.u32(&|| "the version".into())?;
    match version {
        2 | 3 => {}
        v if v & 0xFFFF == 0 => {
            return Err(c.err(format!(
                "version field {v:#010x} reads as a big-endian file (version {}); riftco reads \
                 little-endian GGUF",
                v.swap_bytes()
            )))
        }
        v => {
            return Err(c.err(format!(
                "version {v} is not read: riftco reads GGUF versions 2 and 3"
            )))
        }
    }
    let tensor_count = c.u64(&|| "the tensor count".into())?;
    let kv_count = c.u64(&|| "the metadata count".into())?;
    // A key/value takes at least 13 bytes (key length, value type, one byte of value); a
    // tensor info 24 (name length, dimension count, type, offset).
    let n_kv = c.check_count(kv_count, 13, &|| "the metadata count".into())?;
    let mut metadata = Vec::new();
    let mut index = HashMap::new();
    for i in 0..n_kv {
        let key = c.string(&|| format!("the key of metadata entry {i}"))?;
        let field = |what: &str| format!("{what} of metadata key {key:?}");
        let ty = c.u32(&|| field("the value type"))?;
        let value = c.value(ty, 0, &|| field("the value"))?;
        if index.insert(key.clone(), metadata.len()).is_some() {
            return Err(c.err(format!("metadata key {key:?} appears twice")));
        }
        metadata.push((key, value));
    }
    let n_tensors = c.check_count(tensor_count, 24, &|| "the tensor count".into())?;
    let mut raw = Vec::new();
    raw.try_reserve_exact(n_tensors)
        .map_err(|_| c.err(format!("cannot allocate {n_tensors} tensor infos")))?;
    let mut names = std::collections::HashSet::new();
    for i in 0..n_tensors {
        let name = c.string(&|| format!("the name of tensor info {i}"))?;
        let field = |what: &str| format!("{what} of tensor {name:?}");
        let n_dims = c.u32(&|| field("the dimension count"))?;
        if n_dims > MAX_DIMS {
            return Err(c.err(format!(
                "{} is {n_dims}; GGML tensors have at most {MAX_DIMS}",
                field("the dimension count")
            )));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(c.u64(&|| field(&format!("dimension {d}")))?);
        }
        let type_id = c.u32(&|| field("the type"))?;
        let offset = c.u64(&|| field("the data offset"))?;
        let Some(ggml_type) = GgmlType::from_id(type_id) else {
            return Err(c.err(format!(
                "{} is {type_id}, which is not a GGML tensor type",
                field("the type")
            )));
        };
        if !names.insert(name.clone()) {
            return Err(c.err(format!("tensor {name:?} appears twice")));
        }
        raw.push((name, dims, ggml_type, offset));
    }
    let alignment = match index.get("general.alignment").map(|&i| &metadata[i].1) {
        None => DEFAULT_ALIGNMENT,
        Some(GgufValue::U32(a)) if a.is_power_of_two() => u64::from(*a),
        Some(other) => {
            return Err(c.err(format!(
                "metadata key \"general.alignment\" is {other} ({}); expected a UINT32 power of \
                 two",
                other.type_name()
            )))
        }
    };
    let data_offset = c.pos.next_multiple_of(alignment);
    let data_len = file_len.saturating_sub(data_offset);
    let mut tensors = Vec::with_capacity(raw.len());
    for (name, dims, ggml_type, offset) in raw {
        tensors.push(tensor_info(
            &c, name, dims, ggml_type, offset, alignment, data_len,
        )?);
    }
    Ok(Header {
        version,
        metadata,
        index,
        tensors,
        alignment,
        data_offset,
    })
}

/// A tensor info with its element and byte counts, checked: whole blocks along `ne[0]`, no
/// overflow, an aligned offset, the data inside the file.
fn tensor_info(
    c: &Cursor<'_>,
    name: String,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    offset: u64,
    alignment: u64,
    data_len: u64,
) -> Result<GgufTensorInfo> {
    let (block_elements, block_bytes) = ggml_type.block_layout();
    let n_elements = dims
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .filter(|&n| i64::try_from(n).is_ok());
    let Some(n_elements) = n_elements else {
        return Err(c.err(format!(
            "tensor {name:?} has dimensions {dims:?}, whose product overflows 63 bits"
        )));
    };
    let ne0 = dims.first().copied().unwrap_or(1);
    if ne0 % block_elements as u64 != 0 {
        return Err(c.err(format!(
            "tensor {name:?} has {ne0} elements along dimension 0 (ne[0]), not a multiple of the \
             {block_elements}-element blocks of its type {ggml_type}"
        )));
    }
    let Some(n_bytes) = (n_elements / block_elements as u64).checked_mul(block_bytes as u64) else {
        return Err(c.err(format!(
            "tensor {name:?} has dimensions {dims:?}: its size in bytes overflows 64 bits"
        )));
    };
    if offset % alignment != 0 {
        return Err(c.err(format!(
            "tensor {name:?} has data offset {offset}, not a multiple of the alignment {alignment}"
        )));
    }
    if offset.checked_add(n_bytes).is_none_or(|end| end > data_len) {
        return Err(c.err(format!(
            "tensor {name:?} ({ggml_type}, dimensions {dims:?}: {n_bytes} bytes at data offset \
             {offset}) lies past the end of the file: its data section has {data_len} bytes"
        )));
    }
    Ok(GgufTensorInfo {
        name,
        dims,
        ggml_type,
        offset,
        n_elements,
        n_bytes,
    })
}
