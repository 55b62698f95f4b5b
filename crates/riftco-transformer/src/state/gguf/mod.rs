//! GGUF files (llama.cpp, Ollama, LM Studio): a bounded reader and the `llama` architecture.
//!
//! [`GgufFile::open`] reads and checks the header (versions 2 and 3, little endian): every
//! metadata key/value of any value type (nested arrays included), the tensor infos, the
//! alignment (`general.alignment`, default 32) and the data section's offset. Every count,
//! length, dimension product, offset and size is checked against the file's length before
//! anything is allocated or read (see [`header`](self) for the layout and the limits), so a
//! crafted or truncated file is a [`TransformerError::State`](crate::TransformerError::State)
//! naming the file and the field, never a crash or an unbounded allocation.
//!
//! Tensor data is read one tensor at a time and dequantized to f32 by
//! [`riftco_kernels::quant::dequantize`] (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K,
//! Q3_K, Q4_K, Q5_K, Q6_K; bitwise as `gguf.quants.dequantize`). A model file of the `llama`
//! architecture loads as a [`DecoderOnlyTransformer`](crate::DecoderOnlyTransformer) through
//! [`crate::state::load_model`] (see `llama`).

mod header;
mod llama;
mod value;

pub use header::{DEFAULT_ALIGNMENT, MAX_GGUF_HEADER_BYTES};
pub(crate) use llama::{config_from_gguf, load_llama, load_llama_values};
pub use value::{GgufArray, GgufValue};

use super::read::open_regular;
use super::{io_err, state_err};
use crate::error::Result;
use riftco_kernels::quant::{dequantize, GgmlType};
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// One tensor of a GGUF file, as its tensor info describes it (checked: whole blocks along
/// `ne[0]`, an aligned offset, the data inside the file).
#[derive(Clone, Debug, PartialEq)]
pub struct GgufTensorInfo {
    /// The tensor's name (`blk.0.attn_q.weight`).
    pub name: String,
    /// GGML's `ne`: `dims[0]` is the innermost (contiguous) axis, the reverse of a row-major
    /// shape.
    pub dims: Vec<u64>,
    /// The element type.
    pub ggml_type: GgmlType,
    /// The offset of its data from the start of the data section, in bytes.
    pub offset: u64,
    /// The product of `dims`.
    pub n_elements: u64,
    /// The bytes of its data.
    pub n_bytes: u64,
}

impl GgufTensorInfo {
    /// The row-major shape (`dims` reversed): a Linear weight of `ne = [in, out]` is
    /// `[out, in]`.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// An open GGUF file whose header has been read and checked; tensor data is read on demand.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    file: File,
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    index: HashMap<String, usize>,
    tensors: Vec<GgufTensorInfo>,
    by_name: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

/// Whether `path` names a GGUF file: its extension is `.gguf` (any case) or its first four
/// bytes are the magic `"GGUF"`. A file that cannot be read is not (its loader reports why).
pub fn is_gguf(path: &Path) -> bool {
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        return true;
    }
    let Ok((mut file, len)) = open_regular(path) else {
        return false;
    };
    let mut magic = [0u8; 4];
    len >= 4 && file.read_exact(&mut magic).is_ok() && magic == header::MAGIC
}

impl GgufFile {
    /// Opens `path` (a regular file) and reads its header.
    ///
    /// # Errors
    /// [`TransformerError::Io`](crate::TransformerError::Io) when the file cannot be opened;
    /// [`TransformerError::State`](crate::TransformerError::State) naming the file and the field
    /// for anything wrong with the header: another magic, a version other than 2 and 3, a
    /// big-endian file, a count or length larger than what the file holds, a value type or
    /// tensor type that does not exist, non-UTF-8 text, a key or tensor name given twice, an
    /// alignment that is not a `UINT32` power of two, more than 4 dimensions, a dimension
    /// product past 63 bits, `ne[0]` not whole blocks of the type, a misaligned offset, or
    /// data past the end of the file.
    pub fn open(path: &Path) -> Result<Self> {
        let (file, file_len) = open_regular(path)?;
        let h = header::read_header(path, &file, file_len)?;
        let by_name = h
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(Self {
            path: path.to_path_buf(),
            file,
            version: h.version,
            metadata: h.metadata,
            index: h.index,
            tensors: h.tensors,
            by_name,
            alignment: h.alignment,
            data_offset: h.data_offset,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Every metadata key and value, in file order.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    /// The value of metadata key `key`.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// Every tensor info, in file order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// The tensor info named `name`.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The alignment of the data section and of every tensor's offset, in bytes.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// The file offset of the data section, in bytes.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Reads the stored bytes of `info` (a tensor of this file) into `buf` (resized; reused
    /// from tensor to tensor by loaders).
    ///
    /// # Errors
    /// [`TransformerError::State`](crate::TransformerError::State) when the buffer cannot be
    /// allocated or the file shrank; `Io` for a failing read.
    pub fn read_tensor_bytes(&self, info: &GgufTensorInfo, buf: &mut Vec<u8>) -> Result<()> {
        let n = usize::try_from(info.n_bytes).map_err(|_| {
            state_err(
                &self.path,
                format!(
                    "tensor {:?} of {} bytes is not addressable",
                    info.name, info.n_bytes
                ),
            )
        })?;
        buf.clear();
        buf.try_reserve_exact(n).map_err(|_| {
            state_err(
                &self.path,
                format!("cannot allocate {n} bytes for tensor {:?}", info.name),
            )
        })?;
        buf.resize(n, 0);
        let mut file = &self.file;
        file.seek(SeekFrom::Start(self.data_offset + info.offset))
            .map_err(|e| io_err(&self.path, e))?;
        file.read_exact(buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                state_err(
                    &self.path,
                    format!(
                        "truncated: the file ended inside the data of tensor {:?} (it shrank \
                         while read)",
                        info.name
                    ),
                )
            } else {
                io_err(&self.path, e)
            }
        })
    }

    /// The tensor `name` dequantized to f32, in storage order (row-major in
    /// [`GgufTensorInfo::shape`]), with that shape.
    ///
    /// # Errors
    /// [`TransformerError::State`](crate::TransformerError::State) naming the tensor when the
    /// file has none of that name, or its type is not one riftco dequantizes (naming the type);
    /// as [`GgufFile::read_tensor_bytes`].
    pub fn read_tensor_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let info = self.tensor(name).ok_or_else(|| {
            state_err(&self.path, format!("GGUF: the file has no tensor {name:?}"))
        })?;
        self.check_dequantized(info)?;
        let mut bytes = Vec::new();
        self.read_tensor_bytes(info, &mut bytes)?;
        let mut values = self.f32_buffer(info)?;
        dequantize(info.ggml_type, &bytes, &mut values)
            .map_err(|e| state_err(&self.path, format!("GGUF: tensor {name:?}: {e}")))?;
        Ok((info.shape(), values))
    }

    /// Refuses a tensor whose type riftco does not dequantize, naming both.
    pub(crate) fn check_dequantized(&self, info: &GgufTensorInfo) -> Result<()> {
        if info.ggml_type.is_dequantized() {
            return Ok(());
        }
        Err(state_err(
            &self.path,
            format!(
                "GGUF: tensor {:?} has type {} (id {}), which riftco does not dequantize; it \
                 reads {}",
                info.name,
                info.ggml_type,
                info.ggml_type.id(),
                GgmlType::DEQUANTIZED.map(GgmlType::name).join(", ")
            ),
        ))
    }

    /// A zeroed f32 buffer for the elements of `info`, allocated fallibly.
    pub(crate) fn f32_buffer(&self, info: &GgufTensorInfo) -> Result<Vec<f32>> {
        let n = usize::try_from(info.n_elements).ok();
        let mut v = Vec::new();
        if n.is_none_or(|n| v.try_reserve_exact(n).is_err()) {
            return Err(state_err(
                &self.path,
                format!(
                    "cannot allocate the {} f32 values of tensor {:?}",
                    info.n_elements, info.name
                ),
            ));
        }
        v.resize(n.unwrap_or(0), 0.0);
        Ok(v)
    }
}
