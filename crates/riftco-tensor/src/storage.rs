//! Shared, versioned, accounted storage on one device.

use crate::memory::{record_alloc, record_free, MemoryCategory};
use crate::{Device, Result, TensorError};
use riftco_kernels::quant::QuantFormat;
use std::any::Any;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A buffer owned by a non-host backend (see [`crate::backend::Backend`]). The backend that made
/// it is the only code that looks inside (through [`DeviceBuffer::as_any`]); a buffer returns
/// its memory to its backend's pool when dropped.
pub trait DeviceBuffer: Send + Sync + fmt::Debug + Any {
    /// Number of `f32` elements.
    fn len(&self) -> usize;

    /// Whether the buffer holds no element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The buffer as `Any`, for its backend to downcast.
    fn as_any(&self) -> &dyn Any;

    /// The buffer as mutable `Any`, for its backend to downcast.
    fn as_any_mut(&mut self) -> &mut dyn Any;

    /// The block format of a buffer holding a quantized tensor's storage bytes (see
    /// [`Buffer::Quantized`]; [`DeviceBuffer::len`] is then the tensor's element count), or
    /// `None` for a buffer of f32 elements (the default).
    fn quant_format(&self) -> Option<QuantFormat> {
        None
    }

    /// The bytes the memory accounting counts for this buffer: `4 · len()` for f32 elements
    /// (the default); for a quantized buffer its storage bytes
    /// ([`QuantFormat::storage_bytes`] of `len()`), as for a host [`Buffer::Quantized`].
    fn accounted_bytes(&self) -> usize {
        self.len() * std::mem::size_of::<f32>()
    }
}

/// A 16-bit floating-point format a read-only host tensor can be stored in (see
/// [`Buffer::Half`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HalfDtype {
    /// bfloat16: the upper 16 bits of an f32 (8 exponent bits, 7 mantissa bits).
    BFloat16,
    /// IEEE 754 binary16 (5 exponent bits, 10 mantissa bits).
    Float16,
}

impl HalfDtype {
    /// The PyTorch name: `"bfloat16"` or `"float16"`.
    pub fn name(self) -> &'static str {
        match self {
            HalfDtype::BFloat16 => "bfloat16",
            HalfDtype::Float16 => "float16",
        }
    }

    /// `bits` as f32 (exact: every bfloat16 and float16 value is an f32).
    pub fn to_f32(self, bits: u16) -> f32 {
        match self {
            HalfDtype::BFloat16 => f32::from_bits(u32::from(bits) << 16),
            HalfDtype::Float16 => half::f16::from_bits(bits).to_f32(),
        }
    }

    /// `bits` as f32 into `out` (the first `min(bits.len(), out.len())` elements; exact). One
    /// pass per format: bfloat16 is a shift, float16 the `half` crate's slice conversion (F16C
    /// where the CPU has it).
    pub fn upcast(self, bits: &[u16], out: &mut [f32]) {
        let n = bits.len().min(out.len());
        let (bits, out) = (&bits[..n], &mut out[..n]);
        match self {
            HalfDtype::BFloat16 => {
                for (o, &b) in out.iter_mut().zip(bits) {
                    *o = f32::from_bits(u32::from(b) << 16);
                }
            }
            HalfDtype::Float16 => {
                use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
                bits.reinterpret_cast::<half::f16>()
                    .convert_to_f32_slice(out);
            }
        }
    }

    /// `x` rounded to the nearest value of this format, ties to even (NaN stays NaN, values past
    /// the largest finite one become infinite).
    pub fn from_f32(self, x: f32) -> u16 {
        match self {
            HalfDtype::BFloat16 => half::bf16::from_f32(x).to_bits(),
            HalfDtype::Float16 => half::f16::from_f32(x).to_bits(),
        }
    }
}

/// The elements of a storage: host memory (CPU kernels read it directly) or a buffer owned by a
/// device backend.
#[derive(Debug)]
pub enum Buffer {
    /// Host memory.
    Host(Vec<f32>),
    /// Host memory in a 16-bit format: read-only. [`Storage::read`] gives the elements upcast to
    /// f32 in a transient copy (counted as workspace while it lives), so every CPU kernel reads
    /// it; writing is an error.
    Half(HalfDtype, Vec<u16>),
    /// Host memory in a block-quantized format (GGML's Q4_0 ... Q6_K, NF4): read-only, like
    /// [`Buffer::Half`]. [`Storage::read`] dequantizes the whole tensor into a transient copy;
    /// the kernels that matter (products against a frozen weight, embedding lookups, the LM
    /// head) dequantize a block of rows at a time instead.
    Quantized(QuantizedBytes),
    /// Memory of a device backend (GPU, or a test backend): f32 elements, or a quantized
    /// tensor's storage bytes ([`DeviceBuffer::quant_format`], read-only like
    /// [`Buffer::Quantized`]; the backend's products, embedding lookups and LM head read it).
    Device(Box<dyn DeviceBuffer>),
    /// No memory at all: a placeholder for this many elements, on any device, that nothing may
    /// read (reads are [`TensorError::NoData`]). The value of a graph-only node.
    Placeholder(usize),
}

/// The bytes of a block-quantized tensor (see [`riftco_kernels::quant::format`] for the
/// layouts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantizedBytes {
    /// The block format.
    pub format: QuantFormat,
    /// The tensor's elements in that format ([`QuantFormat::storage_bytes`] of `numel`).
    pub bytes: Vec<u8>,
    /// Number of elements.
    pub numel: usize,
}

impl QuantizedBytes {
    /// Dequantizes elements `start .. start + out.len()` (whole blocks) into `out`.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] naming `op` when the range is not whole blocks inside
    /// the tensor.
    pub fn dequantize_range(&self, op: &'static str, start: usize, out: &mut [f32]) -> Result<()> {
        riftco_kernels::quant::dequantize_range(self.format, &self.bytes, self.numel, start, out)
            .map_err(|e| TensorError::InvalidArgument {
                op,
                message: e.to_string(),
            })
    }
}

impl Buffer {
    /// Number of `f32` elements.
    pub fn len(&self) -> usize {
        match self {
            Buffer::Host(v) => v.len(),
            Buffer::Half(_, v) => v.len(),
            Buffer::Quantized(q) => q.numel,
            Buffer::Device(b) => b.len(),
            Buffer::Placeholder(n) => *n,
        }
    }

    /// Whether the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn accounted_bytes(&self) -> usize {
        match self {
            Buffer::Host(v) => v.capacity() * std::mem::size_of::<f32>(),
            Buffer::Half(_, v) => v.capacity() * std::mem::size_of::<u16>(),
            Buffer::Quantized(q) => q.bytes.capacity(),
            Buffer::Device(b) => b.accounted_bytes(),
            Buffer::Placeholder(_) => 0,
        }
    }
}

/// The buffer behind one or more [`crate::Tensor`]s (reshapes share it), with its device.
///
/// Registers its bytes with `(device, category)` on creation and releases them on drop (and moves
/// them on a transfer). The version starts at 0 and is bumped by every write access and every
/// device transfer.
#[derive(Debug)]
pub struct Storage {
    data: RwLock<Buffer>,
    device: AtomicU8,
    version: AtomicU64,
    category: MemoryCategory,
    bytes: AtomicU64,
}

/// Shared read access to a host storage's elements (see [`crate::Tensor::read`]): the f32
/// buffer itself, or the f32 upcast of a 16-bit one (a copy counted as CPU workspace while it
/// lives).
pub struct HostRead<'a>(HostReadInner<'a>);

enum HostReadInner<'a> {
    Guard(RwLockReadGuard<'a, Buffer>),
    Upcast(Vec<f32>),
}

impl Drop for HostRead<'_> {
    fn drop(&mut self) {
        if let HostReadInner::Upcast(v) = &mut self.0 {
            let v = std::mem::take(v);
            record_free(
                Device::Cpu,
                MemoryCategory::Workspace,
                v.capacity() * std::mem::size_of::<f32>(),
            );
            crate::pool::give(v);
        }
    }
}

impl Deref for HostRead<'_> {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match &self.0 {
            HostReadInner::Upcast(v) => v,
            HostReadInner::Guard(g) => match &**g {
                Buffer::Host(v) => v,
                // Constructed only over host f32 buffers (checked under the same lock).
                Buffer::Half(..)
                | Buffer::Quantized(_)
                | Buffer::Device(_)
                | Buffer::Placeholder(_) => &[],
            },
        }
    }
}

/// Exclusive write access to a host storage's elements (see [`crate::Tensor::write`]).
pub struct HostWrite<'a>(RwLockWriteGuard<'a, Buffer>);

impl Deref for HostWrite<'_> {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match &*self.0 {
            Buffer::Host(v) => v,
            Buffer::Half(..)
            | Buffer::Quantized(_)
            | Buffer::Device(_)
            | Buffer::Placeholder(_) => &[],
        }
    }
}

impl DerefMut for HostWrite<'_> {
    fn deref_mut(&mut self) -> &mut [f32] {
        match &mut *self.0 {
            Buffer::Host(v) => v,
            Buffer::Half(..)
            | Buffer::Quantized(_)
            | Buffer::Device(_)
            | Buffer::Placeholder(_) => &mut [],
        }
    }
}

impl Storage {
    /// Takes ownership of host `data`, shrinking its capacity to its length so the accounted
    /// bytes are exactly what is held.
    pub fn new(mut data: Vec<f32>, category: MemoryCategory) -> Self {
        data.shrink_to_fit();
        Self::from_buffer(Buffer::Host(data), Device::Cpu, category)
    }

    /// A storage over `buffer` on `device` (a host buffer for [`Device::Cpu`], a device buffer
    /// otherwise).
    pub fn from_buffer(buffer: Buffer, device: Device, category: MemoryCategory) -> Self {
        let bytes = buffer.accounted_bytes();
        record_alloc(device, category, bytes);
        Self {
            data: RwLock::new(buffer),
            device: AtomicU8::new(device.index() as u8),
            version: AtomicU64::new(0),
            category,
            bytes: AtomicU64::new(bytes as u64),
        }
    }

    /// The device the elements live on.
    pub fn device(&self) -> Device {
        Device::from_index(self.device.load(Ordering::Acquire) as usize)
    }

    fn not_on_host(&self, op: &'static str) -> TensorError {
        TensorError::NotOnHost {
            op,
            device: self.device(),
        }
    }

    /// Shared read access to host elements.
    ///
    /// # Errors
    /// [`TensorError::NotOnHost`] when the storage lives on another device.
    pub fn read(&self) -> Result<HostRead<'_>> {
        let guard = self.data.read().unwrap_or_else(|e| e.into_inner());
        match &*guard {
            Buffer::Host(_) => Ok(HostRead(HostReadInner::Guard(guard))),
            Buffer::Half(dtype, bits) => {
                let mut v = crate::pool::try_take("Tensor::read (upcast)", bits.len())?;
                dtype.upcast(bits, &mut v);
                record_alloc(
                    Device::Cpu,
                    MemoryCategory::Workspace,
                    v.capacity() * std::mem::size_of::<f32>(),
                );
                Ok(HostRead(HostReadInner::Upcast(v)))
            }
            Buffer::Quantized(q) => {
                let mut v = crate::pool::try_take("Tensor::read (dequantize)", q.numel)?;
                q.dequantize_range("Tensor::read", 0, &mut v)?;
                record_alloc(
                    Device::Cpu,
                    MemoryCategory::Workspace,
                    v.capacity() * std::mem::size_of::<f32>(),
                );
                Ok(HostRead(HostReadInner::Upcast(v)))
            }
            Buffer::Device(_) => Err(self.not_on_host("Tensor::read")),
            Buffer::Placeholder(_) => Err(TensorError::NoData { op: "Tensor::read" }),
        }
    }

    /// Exclusive write access to host elements; bumps the version.
    ///
    /// # Errors
    /// [`TensorError::NotOnHost`] when the storage lives on another device.
    pub fn write(&self) -> Result<HostWrite<'_>> {
        let guard = self.data.write().unwrap_or_else(|e| e.into_inner());
        match &*guard {
            Buffer::Host(_) => {
                self.version.fetch_add(1, Ordering::AcqRel);
                Ok(HostWrite(guard))
            }
            Buffer::Half(dtype, _) => Err(half_is_read_only("Tensor::write", *dtype)),
            Buffer::Quantized(q) => Err(quantized_is_read_only("Tensor::write", q.format)),
            Buffer::Device(_) => Err(self.not_on_host("Tensor::write")),
            Buffer::Placeholder(_) => Err(TensorError::NoData {
                op: "Tensor::write",
            }),
        }
    }

    /// Shared access to the buffer, whatever its device (for backends).
    pub fn buffer(&self) -> RwLockReadGuard<'_, Buffer> {
        self.data.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Exclusive access to the buffer, whatever its device (for backends); bumps the version.
    pub fn buffer_mut(&self) -> RwLockWriteGuard<'_, Buffer> {
        self.version.fetch_add(1, Ordering::AcqRel);
        self.data.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces the buffer with one on `device` holding the same elements (a transfer): moves
    /// the accounted bytes from the old device to the new one and bumps the version. The old
    /// buffer is returned to its owner (the host pool, or the device backend by its drop).
    pub fn replace(&self, buffer: Buffer, device: Device) {
        let mut guard = self.data.write().unwrap_or_else(|e| e.into_inner());
        self.version.fetch_add(1, Ordering::AcqRel);
        let new_bytes = buffer.accounted_bytes();
        let old = std::mem::replace(&mut *guard, buffer);
        let old_bytes = self.bytes.swap(new_bytes as u64, Ordering::AcqRel) as usize;
        record_free(self.device(), self.category, old_bytes);
        record_alloc(device, self.category, new_bytes);
        self.device.store(device.index() as u8, Ordering::Release);
        drop(guard);
        give_back(old);
    }

    /// Frees the elements, keeping the element count, device and version (the value did not
    /// change: it is no longer kept). Later reads and writes are [`TensorError::NoData`]. For
    /// values no computation will read again (the graph's released values).
    pub fn release(&self) {
        let mut guard = self.data.write().unwrap_or_else(|e| e.into_inner());
        if matches!(*guard, Buffer::Placeholder(_)) {
            return;
        }
        let n = guard.len();
        let old = std::mem::replace(&mut *guard, Buffer::Placeholder(n));
        let old_bytes = self.bytes.swap(0, Ordering::AcqRel) as usize;
        record_free(self.device(), self.category, old_bytes);
        drop(guard);
        give_back(old);
    }

    /// Puts elements back into a released storage ([`Storage::release`]) without bumping the
    /// version: the caller states that `buffer` holds the value the storage had when it was
    /// released (a parameter gathered again from its shards), so graphs recorded before the
    /// release stay valid. A caller whose value changed meanwhile bumps the version itself
    /// ([`Storage::bump_version`]).
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] naming `op` when the storage holds elements (it was not
    /// released) or `buffer` holds another number of elements.
    pub fn restore(&self, op: &'static str, buffer: Buffer) -> Result<()> {
        let mut guard = self.data.write().unwrap_or_else(|e| e.into_inner());
        let Buffer::Placeholder(n) = *guard else {
            return Err(TensorError::InvalidArgument {
                op,
                message: "the tensor holds its elements: only a released one can be restored"
                    .into(),
            });
        };
        if buffer.len() != n {
            return Err(TensorError::InvalidArgument {
                op,
                message: format!(
                    "the released tensor has {n} elements; the restored buffer has {}",
                    buffer.len()
                ),
            });
        }
        let bytes = buffer.accounted_bytes();
        *guard = buffer;
        self.bytes.store(bytes as u64, Ordering::Release);
        record_alloc(self.device(), self.category, bytes);
        Ok(())
    }

    /// The current version.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Bumps the version without touching the data.
    pub fn bump_version(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// The accounting category.
    pub fn category(&self) -> MemoryCategory {
        self.category
    }

    /// Accounted bytes.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Acquire) as usize
    }
}

/// The error of writing a tensor stored in a 16-bit format.
pub(crate) fn half_is_read_only(op: &'static str, dtype: HalfDtype) -> TensorError {
    TensorError::InvalidArgument {
        op,
        message: format!(
            "the tensor is stored in {} (read-only: ops read it upcast to float32, nothing \
             writes it); keep weights that change (trainable weights, merged LoRA, loaded \
             values) in float32",
            dtype.name()
        ),
    }
}

/// The error of writing (or asking the gradient of) a tensor stored in a block-quantized
/// format, for `op`.
pub fn quantized_is_read_only(op: &'static str, format: QuantFormat) -> TensorError {
    TensorError::InvalidArgument {
        op,
        message: format!(
            "the tensor is stored quantized ({format}; read-only: ops read it dequantized to \
             float32, nothing writes it); dequantize it to float32 first to train, merge into \
             or load values into it"
        ),
    }
}

fn give_back(buffer: Buffer) {
    match buffer {
        Buffer::Host(v) => crate::pool::give(v),
        Buffer::Half(..) | Buffer::Quantized(_) => {}
        // A device buffer returns its memory to its backend when dropped.
        Buffer::Device(b) => drop(b),
        Buffer::Placeholder(_) => {}
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        record_free(self.device(), self.category, self.bytes());
        let data = std::mem::replace(
            self.data.get_mut().unwrap_or_else(|e| e.into_inner()),
            Buffer::Host(Vec::new()),
        );
        give_back(data);
    }
}
