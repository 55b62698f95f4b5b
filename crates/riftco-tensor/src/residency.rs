//! A tensor's elements as the bytes they are stored in, released and restored in place: what a
//! sharded data-parallel run (ZeRO-3 / FSDP) needs to keep a parameter's storage, shape and
//! version while its elements live as shards on other processes.
//!
//! [`Tensor::encoded_bytes`] gives a host tensor's elements in their storage encoding
//! ([`StorageEncoding`]: little-endian f32, 16-bit bit patterns or quantized blocks);
//! [`Tensor::release_shared`] frees them (the storage becomes a placeholder that reads refuse);
//! [`Tensor::restore_encoded`] puts such bytes back without bumping the version, so graphs and
//! checkpoints recorded before the release read the same value afterwards.

use crate::storage::{Buffer, HalfDtype, QuantizedBytes};
use crate::{Device, Result, Tensor, TensorError};
use riftco_kernels::quant::QuantFormat;

/// How a host tensor's elements are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StorageEncoding {
    /// f32, 4 little-endian bytes per element.
    Float32,
    /// A 16-bit format, 2 little-endian bytes per element (the bit patterns).
    Half(HalfDtype),
    /// Block-quantized ([`QuantFormat::storage_bytes`] bytes for the element count).
    Quantized(QuantFormat),
}

impl StorageEncoding {
    /// `"float32"`, `"bfloat16"`, `"float16"` or the quantized format's name (`"nf4"`,
    /// `"q4_k"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            StorageEncoding::Float32 => "float32",
            StorageEncoding::Half(h) => h.name(),
            StorageEncoding::Quantized(q) => q.name(),
        }
    }

    /// The encoding named `name` (as [`StorageEncoding::name`] writes it; any case).
    pub fn from_name(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "float32" => Some(StorageEncoding::Float32),
            "bfloat16" => Some(StorageEncoding::Half(HalfDtype::BFloat16)),
            "float16" => Some(StorageEncoding::Half(HalfDtype::Float16)),
            other => QuantFormat::from_name(other).map(StorageEncoding::Quantized),
        }
    }

    /// The bytes `numel` elements take in this encoding (`None` on overflow, or for a quantized
    /// format when `numel` is not whole blocks).
    pub fn bytes_for(self, numel: usize) -> Option<usize> {
        match self {
            StorageEncoding::Float32 => numel.checked_mul(4),
            StorageEncoding::Half(_) => numel.checked_mul(2),
            StorageEncoding::Quantized(q) => q.storage_bytes(numel),
        }
    }
}

/// Writes bytes `lo..hi` of the little-endian encoding of `v` (`N` bytes per element) into
/// `out` (`hi - lo` bytes): the partial elements at either end byte by byte, the whole ones in
/// between as fixed-size chunks (a plain copy on a little-endian machine).
fn le_byte_range<T: Copy, const N: usize>(
    v: &[T],
    lo: usize,
    hi: usize,
    to_le: impl Fn(T) -> [u8; N],
    out: &mut [u8],
) {
    let (a0, a1) = (lo.div_ceil(N) * N, (hi / N) * N);
    if a0 > a1 {
        // Within one element.
        let b = to_le(v[lo / N]);
        out.copy_from_slice(&b[lo % N..lo % N + (hi - lo)]);
        return;
    }
    if lo < a0 {
        let b = to_le(v[lo / N]);
        out[..a0 - lo].copy_from_slice(&b[lo % N..]);
    }
    out[a0 - lo..a1 - lo]
        .chunks_exact_mut(N)
        .zip(&v[a0 / N..a1 / N])
        .for_each(|(c, &x)| c.copy_from_slice(&to_le(x)));
    if a1 < hi {
        let b = to_le(v[a1 / N]);
        out[a1 - lo..].copy_from_slice(&b[..hi - a1]);
    }
}

impl Tensor {
    /// Frees this tensor's elements when no other handle shares its storage (see
    /// [`crate::storage::Storage::release`]): its shape, device and version stay, later reads are
    /// [`TensorError::NoData`]. Returns whether it released them.
    pub fn release_if_exclusive(&self) -> bool {
        if !self.is_exclusive() {
            return false;
        }
        self.storage().release();
        true
    }

    /// How many tensor handles share this tensor's storage (this one included).
    pub fn storage_handles(&self) -> usize {
        std::sync::Arc::strong_count(self.storage())
    }

    /// Frees the elements of the storage this tensor shares with others (see
    /// [`crate::storage::Storage::release`]): every tensor sharing it loses its data. For a caller that knows
    /// every other handle (the graph's views of one value).
    pub fn release_shared(&self) {
        self.storage().release();
    }

    /// How this tensor's elements are stored (for a released tensor: `None`, the encoding is
    /// the caller's to remember).
    ///
    /// # Errors
    /// [`TensorError::NotOnHost`] for a tensor on a device: device storage is not encoded here.
    pub fn storage_encoding(&self) -> Result<Option<StorageEncoding>> {
        let storage = self.storage();
        let buffer = storage.buffer();
        match &*buffer {
            Buffer::Host(_) => Ok(Some(StorageEncoding::Float32)),
            Buffer::Half(h, _) => Ok(Some(StorageEncoding::Half(*h))),
            Buffer::Quantized(q) => Ok(Some(StorageEncoding::Quantized(q.format))),
            Buffer::Placeholder(_) => Ok(None),
            Buffer::Device(_) => Err(TensorError::NotOnHost {
                op: "Tensor::storage_encoding",
                device: storage.device(),
            }),
        }
    }

    /// The elements as stored ([`Tensor::storage_encoding`]), little-endian: a copy, with no
    /// conversion (bitwise what the storage holds, NaN payloads included).
    ///
    /// # Errors
    /// [`TensorError::NoData`] for a released tensor, [`TensorError::NotOnHost`] for a device
    /// tensor, [`TensorError::OutOfMemory`] when the copy cannot be allocated.
    pub fn encoded_bytes(&self) -> Result<Vec<u8>> {
        self.encoded_byte_range(0..usize::MAX)
    }

    /// How many bytes [`Tensor::encoded_bytes`] gives (without copying them).
    ///
    /// # Errors
    /// As [`Tensor::encoded_bytes`], but never out of memory.
    pub fn encoded_len(&self) -> Result<usize> {
        const OP: &str = "Tensor::encoded_len";
        let storage = self.storage();
        let buffer = storage.buffer();
        match &*buffer {
            Buffer::Host(v) => Ok(v.len() * 4),
            Buffer::Half(_, v) => Ok(v.len() * 2),
            Buffer::Quantized(q) => Ok(q.bytes.len()),
            Buffer::Placeholder(_) => Err(TensorError::NoData { op: OP }),
            Buffer::Device(_) => Err(TensorError::NotOnHost {
                op: OP,
                device: storage.device(),
            }),
        }
    }

    /// Bytes `range` of [`Tensor::encoded_bytes`] (clipped to its length): a copy of only
    /// those, for a caller that keeps a part of a parameter (one rank's shard).
    ///
    /// # Errors
    /// As [`Tensor::encoded_bytes`].
    pub fn encoded_byte_range(&self, range: std::ops::Range<usize>) -> Result<Vec<u8>> {
        const OP: &str = "Tensor::encoded_bytes";
        let storage = self.storage();
        let buffer = storage.buffer();
        let n = match &*buffer {
            Buffer::Host(v) => v.len() * 4,
            Buffer::Half(_, v) => v.len() * 2,
            Buffer::Quantized(q) => q.bytes.len(),
            Buffer::Placeholder(_) => return Err(TensorError::NoData { op: OP }),
            Buffer::Device(_) => {
                return Err(TensorError::NotOnHost {
                    op: OP,
                    device: storage.device(),
                })
            }
        };
        let (lo, hi) = (range.start.min(n), range.end.min(n));
        let len = hi.saturating_sub(lo);
        let mut out = Vec::new();
        out.try_reserve_exact(len)
            .map_err(|_| TensorError::OutOfMemory { op: OP, bytes: len })?;
        if len == 0 {
            return Ok(out);
        }
        out.resize(len, 0);
        match &*buffer {
            Buffer::Host(v) => le_byte_range(v, lo, hi, |x| x.to_le_bytes(), &mut out),
            Buffer::Half(_, v) => le_byte_range(v, lo, hi, |x| x.to_le_bytes(), &mut out),
            Buffer::Quantized(q) => out.copy_from_slice(&q.bytes[lo..hi]),
            Buffer::Placeholder(_) | Buffer::Device(_) => {}
        }
        Ok(out)
    }

    /// Puts `bytes` (the elements in `encoding`, as [`Tensor::encoded_bytes`] gives them) back
    /// into this released host tensor, without bumping its version: the caller states that
    /// they are the value the tensor had when it was released. Memory is counted again in the
    /// storage's category.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] when the tensor was not released or lives on a device,
    /// or when `bytes` is not the size `encoding` takes for the tensor's element count (both
    /// named); [`TensorError::OutOfMemory`] when the buffer cannot be allocated.
    pub fn restore_encoded(&self, encoding: StorageEncoding, bytes: &[u8]) -> Result<()> {
        const OP: &str = "Tensor::restore_encoded";
        let storage = self.storage();
        if storage.device() != Device::Cpu {
            return Err(TensorError::InvalidArgument {
                op: OP,
                message: format!(
                    "the tensor lives on {}: only host tensors are restored from bytes",
                    storage.device()
                ),
            });
        }
        let numel = self.numel();
        let expected = encoding.bytes_for(numel);
        if expected != Some(bytes.len()) {
            return Err(TensorError::InvalidArgument {
                op: OP,
                message: format!(
                    "{} bytes for {numel} elements in {}; expected {}",
                    bytes.len(),
                    encoding.name(),
                    expected.map_or_else(|| "whole blocks".to_string(), |b| b.to_string())
                ),
            });
        }
        let oom = |_| TensorError::OutOfMemory {
            op: OP,
            bytes: bytes.len(),
        };
        let buffer = match encoding {
            StorageEncoding::Float32 => {
                let mut v = Vec::new();
                v.try_reserve_exact(numel).map_err(oom)?;
                v.extend(
                    bytes
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                );
                Buffer::Host(v)
            }
            StorageEncoding::Half(h) => {
                let mut v = Vec::new();
                v.try_reserve_exact(numel).map_err(oom)?;
                v.extend(
                    bytes
                        .chunks_exact(2)
                        .map(|c| u16::from_le_bytes([c[0], c[1]])),
                );
                Buffer::Half(h, v)
            }
            StorageEncoding::Quantized(format) => {
                let mut v = Vec::new();
                v.try_reserve_exact(bytes.len()).map_err(oom)?;
                v.extend_from_slice(bytes);
                Buffer::Quantized(QuantizedBytes {
                    format,
                    bytes: v,
                    numel,
                })
            }
        };
        storage.restore(OP, buffer)
    }

    /// A new host tensor of `shape` over `bytes` in `encoding` (as [`Tensor::encoded_bytes`]
    /// gives them): a part of a parameter gathered from its shards, for instance.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] when `bytes` is not the size `encoding` takes for the
    /// shape (both named), [`TensorError::LengthMismatch`] for a quantized shape that is not
    /// whole blocks per row ([`Tensor::from_quantized_bytes`]); out of memory.
    pub fn from_encoded(
        encoding: StorageEncoding,
        bytes: &[u8],
        shape: impl Into<crate::Shape>,
        category: crate::MemoryCategory,
    ) -> Result<Tensor> {
        const OP: &str = "Tensor::from_encoded";
        let shape = shape.into();
        let numel = shape.checked_numel();
        let expected = numel.and_then(|n| encoding.bytes_for(n));
        if expected != Some(bytes.len()) {
            return Err(TensorError::InvalidArgument {
                op: OP,
                message: format!(
                    "{} bytes of {} for the shape {:?}; expected {}",
                    bytes.len(),
                    encoding.name(),
                    shape.dims(),
                    expected.map_or_else(|| "whole blocks".to_string(), |b| b.to_string())
                ),
            });
        }
        match encoding {
            StorageEncoding::Float32 => {
                let mut v: Vec<f32> = crate::alloc::try_vec_with_capacity(OP, bytes.len() / 4)?;
                v.extend(
                    bytes
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                );
                Tensor::from_vec(v, shape, category)
            }
            StorageEncoding::Half(h) => {
                let mut v: Vec<u16> = crate::alloc::try_vec_with_capacity(OP, bytes.len() / 2)?;
                v.extend(
                    bytes
                        .chunks_exact(2)
                        .map(|c| u16::from_le_bytes([c[0], c[1]])),
                );
                Tensor::from_half_bits(h, v, shape, category)
            }
            StorageEncoding::Quantized(q) => {
                let mut v: Vec<u8> = crate::alloc::try_vec_with_capacity(OP, bytes.len())?;
                v.extend_from_slice(bytes);
                Tensor::from_quantized_bytes(q, v, shape, category)
            }
        }
    }

    /// Bumps the version without touching the data: a released tensor whose value changed
    /// while released (its shards were updated), so graphs recorded before refuse to run.
    pub fn bump_version(&self) {
        self.storage().bump_version();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryCategory;

    #[test]
    fn a_byte_range_is_that_range_of_the_whole_encoding() {
        let f = Tensor::from_vec(vec![1.5, -2.25, 3.0], [3], MemoryCategory::Parameter).unwrap();
        let h = f.to_half(HalfDtype::BFloat16).unwrap();
        for t in [&f, &h] {
            let all = t.encoded_bytes().unwrap();
            assert_eq!(t.encoded_len().unwrap(), all.len());
            for lo in 0..=all.len() {
                for hi in lo..=all.len() + 2 {
                    let got = t.encoded_byte_range(lo..hi).unwrap();
                    assert_eq!(got, all[lo..hi.min(all.len())], "{lo}..{hi}");
                }
            }
        }
    }

    #[test]
    fn release_and_restore_keep_the_bits_and_the_version() {
        let values = [
            1.5f32,
            f32::from_bits(0x7fc0_0123),
            -0.0,
            f32::MIN_POSITIVE / 4.0,
        ];
        let t = Tensor::from_vec(values.to_vec(), [2, 2], MemoryCategory::Parameter).unwrap();
        let bytes = t.encoded_bytes().unwrap();
        let version = t.version();
        t.release_shared();
        assert!(t.read().is_err());
        assert_eq!(t.storage_encoding().unwrap(), None);
        t.restore_encoded(StorageEncoding::Float32, &bytes).unwrap();
        assert_eq!(t.version(), version);
        let back: Vec<u32> = t.read().unwrap().iter().map(|x| x.to_bits()).collect();
        let want: Vec<u32> = values.iter().map(|x| x.to_bits()).collect();
        assert_eq!(back, want);
        // A second restore is refused: the tensor holds its elements.
        assert!(t.restore_encoded(StorageEncoding::Float32, &bytes).is_err());
    }

    #[test]
    fn restore_refuses_a_wrong_size_naming_both() {
        let t = Tensor::from_vec(vec![0.0; 6], [2, 3], MemoryCategory::Parameter).unwrap();
        t.release_shared();
        let e = t
            .restore_encoded(StorageEncoding::Float32, &[0u8; 20])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("20 bytes for 6 elements") && e.contains("expected 24"),
            "{e}"
        );
    }
}
