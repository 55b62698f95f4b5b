//! The tensor type.

use crate::memory::MemoryCategory;
use crate::random::Rng;
use crate::storage::{Buffer, HostRead, HostWrite, QuantizedBytes, Storage};
use crate::QuantFormat;
use crate::{Device, Result, Shape, TensorError};
use std::sync::{Arc, RwLockReadGuard, RwLockWriteGuard};

/// Checks that `shape` is valid and holds `len` elements.
fn check_len(op: &'static str, shape: &Shape, len: usize) -> Result<()> {
    let numel = shape.check(op)?;
    if len != numel {
        return Err(TensorError::LengthMismatch {
            op,
            shape: shape.dims().to_vec(),
            expected: numel,
            got: len,
        });
    }
    Ok(())
}

/// A contiguous, row-major `f32` tensor on one [`Device`].
///
/// Cloning a `Tensor` is cheap and shares storage (and therefore the version counter and the
/// device); use [`Tensor::deep_clone`] for an independent copy. Host access ([`Tensor::read`],
/// [`Tensor::write`]) exists only for tensors on the CPU; ops reach the elements of any device
/// through its [`crate::backend::Backend`], and [`Tensor::to_host`] copies them to host memory.
/// Writing bumps the version, and so does a transfer.
#[derive(Clone, Debug)]
pub struct Tensor {
    storage: Arc<Storage>,
    shape: Shape,
}

impl Tensor {
    /// A tensor owning `data` with the given shape.
    ///
    /// # Errors
    /// [`TensorError::ShapeOverflow`] for an invalid shape (see [`Shape`]),
    /// [`TensorError::LengthMismatch`] when `data.len()` is not the shape's element count.
    pub fn from_vec(
        data: Vec<f32>,
        shape: impl Into<Shape>,
        category: MemoryCategory,
    ) -> Result<Self> {
        let shape = shape.into();
        check_len("Tensor::from_vec", &shape, data.len())?;
        Ok(Self::from_vec_unchecked(data, shape, category))
    }

    /// Like [`Tensor::from_vec`] for callers that computed `data` for a valid `shape`
    /// themselves (a buffer of `shape.numel()` elements for a shape built with
    /// [`Shape::try_new`] or taken from another tensor).
    ///
    /// # Panics
    /// In debug builds, when the length disagrees with the shape.
    pub fn from_vec_unchecked(data: Vec<f32>, shape: Shape, category: MemoryCategory) -> Self {
        debug_assert_eq!(Some(data.len()), shape.checked_numel());
        Self {
            storage: Arc::new(Storage::new(data, category)),
            shape,
        }
    }

    /// A tensor over a backend's `buffer` on `device` (for backends).
    ///
    /// # Errors
    /// [`TensorError::ShapeOverflow`] for an invalid shape, [`TensorError::LengthMismatch`] when
    /// the buffer does not hold the shape's element count, [`TensorError::InvalidArgument`] for
    /// a host buffer on another device than the CPU or a device buffer on the CPU.
    pub fn from_buffer(
        buffer: Buffer,
        shape: impl Into<Shape>,
        device: Device,
        category: MemoryCategory,
    ) -> Result<Self> {
        let shape = shape.into();
        check_len("Tensor::from_buffer", &shape, buffer.len())?;
        let placeholder = matches!(buffer, Buffer::Placeholder(_));
        let host = matches!(
            buffer,
            Buffer::Host(_) | Buffer::Half(..) | Buffer::Quantized(_)
        );
        if !placeholder && host != (device == Device::Cpu) {
            return Err(TensorError::InvalidArgument {
                op: "Tensor::from_buffer",
                message: format!(
                    "a {} buffer cannot live on device {device}",
                    if host { "host" } else { "device" }
                ),
            });
        }
        let storage = match buffer {
            Buffer::Host(v) => Storage::new(v, category),
            b => Storage::from_buffer(b, device, category),
        };
        Ok(Self {
            storage: Arc::new(storage),
            shape,
        })
    }

    /// A tensor of `shape` on `device` that holds no elements and owns no memory (accounted as
    /// 0 bytes): every read is [`TensorError::NoData`]. The value of a graph-only node, which
    /// only its VJP is recorded for.
    ///
    /// # Errors
    /// [`TensorError::ShapeOverflow`] for an invalid shape.
    pub fn placeholder(
        shape: impl Into<Shape>,
        device: Device,
        category: MemoryCategory,
    ) -> Result<Self> {
        let shape = shape.into();
        let numel = shape.check("Tensor::placeholder")?;
        Self::from_buffer(Buffer::Placeholder(numel), shape, device, category)
    }

    /// Whether this tensor is a [`Tensor::placeholder`].
    pub fn is_placeholder(&self) -> bool {
        matches!(*self.buffer(), Buffer::Placeholder(_))
    }

    /// All elements equal to `value`, on `device`, allocated fallibly by its backend.
    ///
    /// # Errors
    /// As [`Tensor::try_full`]; [`TensorError::DeviceUnavailable`] for a device without backend.
    pub fn try_full_on(
        shape: impl Into<Shape>,
        value: f32,
        category: MemoryCategory,
        device: Device,
    ) -> Result<Self> {
        if device == Device::Cpu {
            return Self::try_full(shape, value, category);
        }
        let shape = shape.into();
        let numel = shape.check("Tensor::full")?;
        let buffer =
            crate::backend::for_device(device)?.alloc("Tensor::full", numel, Some(value))?;
        Self::from_buffer(buffer, shape, device, category)
    }

    /// A copy of `data` with the given shape, in a buffer taken from the buffer pool (where a
    /// dropped tensor's buffer goes: a loop that makes a tensor of the same size every step
    /// reuses one buffer instead of filling the pool).
    ///
    /// # Errors
    /// As [`Tensor::from_vec`]; [`TensorError::OutOfMemory`] when the buffer cannot be
    /// allocated.
    pub fn from_slice(
        data: &[f32],
        shape: impl Into<Shape>,
        category: MemoryCategory,
    ) -> Result<Self> {
        let shape = shape.into();
        check_len("Tensor::from_slice", &shape, data.len())?;
        let mut buffer = crate::pool::try_take("Tensor::from_slice", data.len())?;
        buffer.copy_from_slice(data);
        Ok(Self::from_vec_unchecked(buffer, shape, category))
    }

    /// A rank-0 tensor holding `value`.
    pub fn scalar(value: f32, category: MemoryCategory) -> Self {
        Self::from_vec_unchecked(vec![value], Shape::scalar(), category)
    }

    /// All elements equal to `value`, allocated fallibly.
    ///
    /// # Errors
    /// [`TensorError::ShapeOverflow`] for an invalid shape, [`TensorError::OutOfMemory`] when
    /// the allocation fails.
    pub fn try_full(shape: impl Into<Shape>, value: f32, category: MemoryCategory) -> Result<Self> {
        let shape = shape.into();
        let numel = shape.check("Tensor::full")?;
        let data = crate::alloc::try_filled_vec("Tensor::full", numel, value)?;
        Ok(Self::from_vec_unchecked(data, shape, category))
    }

    /// All zeros, allocated fallibly. Errors as [`Tensor::try_full`].
    ///
    /// # Errors
    /// As [`Tensor::try_full`].
    pub fn try_zeros(shape: impl Into<Shape>, category: MemoryCategory) -> Result<Self> {
        Self::try_full(shape, 0.0, category)
    }

    /// All ones, allocated fallibly.
    ///
    /// # Errors
    /// As [`Tensor::try_full`].
    pub fn try_ones(shape: impl Into<Shape>, category: MemoryCategory) -> Result<Self> {
        Self::try_full(shape, 1.0, category)
    }

    /// All elements equal to `value`: [`Tensor::try_full`] for sizes known to fit (use that one
    /// where a size comes from input).
    ///
    /// # Panics
    /// Where [`Tensor::try_full`] returns an error (a panic, not an abort).
    pub fn full(shape: impl Into<Shape>, value: f32, category: MemoryCategory) -> Self {
        Self::try_full(shape, value, category).unwrap_or_else(|e| panic!("{e}"))
    }

    /// All zeros (see [`Tensor::full`]).
    ///
    /// # Panics
    /// As [`Tensor::full`].
    pub fn zeros(shape: impl Into<Shape>, category: MemoryCategory) -> Self {
        Self::full(shape, 0.0, category)
    }

    /// All ones (see [`Tensor::full`]).
    ///
    /// # Panics
    /// As [`Tensor::full`].
    pub fn ones(shape: impl Into<Shape>, category: MemoryCategory) -> Self {
        Self::full(shape, 1.0, category)
    }

    /// Zeros with the same shape as `self`.
    pub fn zeros_like(&self, category: MemoryCategory) -> Self {
        Self::zeros(self.shape.clone(), category)
    }

    /// Normal samples with mean `mean` and standard deviation `std`, from [`Rng::new`]`(seed)`.
    ///
    /// # Panics
    /// As [`Tensor::full`].
    pub fn randn(
        shape: impl Into<Shape>,
        mean: f32,
        std: f32,
        seed: u64,
        category: MemoryCategory,
    ) -> Self {
        let mut rng = Rng::new(seed);
        Self::randn_with(shape, mean, std, &mut rng, category)
    }

    /// Normal samples drawn from an existing generator.
    ///
    /// # Panics
    /// As [`Tensor::full`] (see [`Tensor::try_randn_with`]).
    pub fn randn_with(
        shape: impl Into<Shape>,
        mean: f32,
        std: f32,
        rng: &mut Rng,
        category: MemoryCategory,
    ) -> Self {
        Self::try_randn_with(shape, mean, std, rng, category).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Normal samples drawn from an existing generator, allocated fallibly (before any sample
    /// is drawn, so a failure leaves `rng` untouched).
    ///
    /// # Errors
    /// As [`Tensor::try_full`].
    pub fn try_randn_with(
        shape: impl Into<Shape>,
        mean: f32,
        std: f32,
        rng: &mut Rng,
        category: MemoryCategory,
    ) -> Result<Self> {
        let shape = shape.into();
        let numel = shape.check("Tensor::randn")?;
        let mut data = crate::alloc::try_vec_with_capacity("Tensor::randn", numel)?;
        data.extend((0..numel).map(|_| (mean as f64 + std as f64 * rng.normal()) as f32));
        Ok(Self::from_vec_unchecked(data, shape, category))
    }

    /// Uniform samples in `[lo, hi)` drawn from an existing generator.
    ///
    /// # Panics
    /// As [`Tensor::full`] (see [`Tensor::try_rand_uniform_with`]).
    pub fn rand_uniform_with(
        shape: impl Into<Shape>,
        lo: f32,
        hi: f32,
        rng: &mut Rng,
        category: MemoryCategory,
    ) -> Self {
        Self::try_rand_uniform_with(shape, lo, hi, rng, category).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Uniform samples in `[lo, hi)` drawn from an existing generator, allocated fallibly
    /// (before any sample is drawn).
    ///
    /// # Errors
    /// As [`Tensor::try_full`].
    pub fn try_rand_uniform_with(
        shape: impl Into<Shape>,
        lo: f32,
        hi: f32,
        rng: &mut Rng,
        category: MemoryCategory,
    ) -> Result<Self> {
        let shape = shape.into();
        let numel = shape.check("Tensor::rand_uniform")?;
        let mut data = crate::alloc::try_vec_with_capacity("Tensor::rand_uniform", numel)?;
        data.extend((0..numel).map(|_| rng.uniform(lo, hi)));
        Ok(Self::from_vec_unchecked(data, shape, category))
    }

    /// Uniform samples in `[lo, hi)` from [`Rng::new`]`(seed)`.
    ///
    /// # Panics
    /// As [`Tensor::full`].
    pub fn rand_uniform(
        shape: impl Into<Shape>,
        lo: f32,
        hi: f32,
        seed: u64,
        category: MemoryCategory,
    ) -> Self {
        let mut rng = Rng::new(seed);
        Self::rand_uniform_with(shape, lo, hi, &mut rng, category)
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.numel()
    }

    /// The device the elements live on.
    pub fn device(&self) -> Device {
        self.storage.device()
    }

    /// The backend of this tensor's device.
    ///
    /// # Errors
    /// [`TensorError::DeviceUnavailable`] (a tensor exists only on a device with a backend, so
    /// this does not happen in practice).
    pub fn backend(&self) -> Result<&'static dyn crate::backend::Backend> {
        crate::backend::for_device(self.device())
    }

    /// The accounting category of the storage.
    pub fn category(&self) -> MemoryCategory {
        self.storage.category()
    }

    /// The storage version: bumped by every write and device transfer.
    pub fn version(&self) -> u64 {
        self.storage.version()
    }

    /// Whether two tensors share storage.
    pub fn same_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// Whether this handle is the only one to its storage (no clone, reshape or other tensor
    /// shares it), so writing through it cannot be observed elsewhere.
    pub fn is_exclusive(&self) -> bool {
        Arc::strong_count(&self.storage) == 1
    }

    /// The shared storage (for the crate's own modules).
    pub(crate) fn storage(&self) -> &Arc<Storage> {
        &self.storage
    }

    /// An identifier of the storage, stable while it lives.
    pub fn storage_id(&self) -> usize {
        Arc::as_ptr(&self.storage) as usize
    }

    /// Shared host access to the elements of a CPU tensor (a shared lock on the storage).
    ///
    /// # Errors
    /// [`TensorError::NotOnHost`] for a tensor on another device (use [`Tensor::to_host`]).
    pub fn read(&self) -> Result<HostRead<'_>> {
        self.storage.read()
    }

    /// Exclusive host access to the elements of a CPU tensor; bumps the version (so graphs that
    /// read this value become stale).
    ///
    /// # Errors
    /// [`TensorError::NotOnHost`] for a tensor on another device;
    /// [`TensorError::InvalidArgument`] for a tensor stored in 16 bits (read-only, see
    /// [`Tensor::to_half`]).
    pub fn write(&self) -> Result<HostWrite<'_>> {
        self.storage.write()
    }

    /// The buffer, whatever the device (for backends: a shared lock on the storage).
    pub fn buffer(&self) -> RwLockReadGuard<'_, Buffer> {
        self.storage.buffer()
    }

    /// The buffer for writing, whatever the device (for backends); bumps the version.
    pub fn buffer_mut(&self) -> RwLockWriteGuard<'_, Buffer> {
        self.storage.buffer_mut()
    }

    /// The elements copied into a new host `Vec`, from any device (the device's backend reads
    /// them back).
    ///
    /// # Errors
    /// [`TensorError::OutOfMemory`] when the host copy cannot be allocated; a device read-back
    /// error.
    pub fn to_host(&self) -> Result<Vec<f32>> {
        let buffer = self.buffer();
        match &*buffer {
            Buffer::Host(v) => {
                let mut out = crate::alloc::try_vec_with_capacity("Tensor::to_host", v.len())?;
                out.extend_from_slice(v);
                Ok(out)
            }
            Buffer::Half(..) | Buffer::Quantized(_) | Buffer::Device(_) => {
                self.backend()?.download("Tensor::to_host", &buffer)
            }
            Buffer::Placeholder(_) => Err(TensorError::NoData {
                op: "Tensor::to_host",
            }),
        }
    }

    /// The elements as a new host `Vec` ([`Tensor::to_host`] for tensors known to fit in host
    /// memory, as in tests).
    ///
    /// # Panics
    /// Where [`Tensor::to_host`] returns an error.
    pub fn to_vec(&self) -> Vec<f32> {
        self.to_host().unwrap_or_else(|e| panic!("{e}"))
    }

    /// The single element of a one-element tensor.
    ///
    /// # Errors
    /// [`TensorError::ShapeMismatch`] when the tensor has more than one element.
    pub fn item(&self) -> Result<f32> {
        if self.numel() != 1 {
            return Err(TensorError::ShapeMismatch {
                op: "Tensor::item",
                expected: vec![],
                got: self.dims().to_vec(),
            });
        }
        Ok(self.to_host()?[0])
    }

    /// The same storage viewed with another shape of equal element count.
    ///
    /// # Errors
    /// [`TensorError::ShapeOverflow`] for an invalid shape (`[2^63, 2]` of an empty tensor),
    /// [`TensorError::LengthMismatch`] when the element counts differ.
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Self> {
        let shape = shape.into();
        let numel = shape.check("Tensor::reshape")?;
        if numel != self.numel() {
            return Err(TensorError::LengthMismatch {
                op: "Tensor::reshape",
                shape: shape.dims().to_vec(),
                expected: numel,
                got: self.numel(),
            });
        }
        Ok(Self {
            storage: self.storage.clone(),
            shape,
        })
    }

    /// An independent copy on the same device with its own storage (version 0) in `category`.
    ///
    /// # Errors
    /// [`TensorError::OutOfMemory`] when the copy cannot be allocated.
    pub fn try_deep_clone(&self, category: MemoryCategory) -> Result<Self> {
        // The CPU backend copies into a pooled buffer: a fresh allocation of this size would
        // page-fault on every copy.
        self.backend()?.copy("Tensor::deep_clone", self, category)
    }

    /// [`Tensor::try_deep_clone`] for sizes known to fit.
    ///
    /// # Panics
    /// Where [`Tensor::try_deep_clone`] returns an error.
    pub fn deep_clone(&self, category: MemoryCategory) -> Self {
        self.try_deep_clone(category)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Overwrites the elements with `src` (same element count); bumps the version.
    ///
    /// # Errors
    /// [`TensorError::LengthMismatch`] when lengths differ.
    pub fn copy_from_slice(&self, src: &[f32]) -> Result<()> {
        if src.len() != self.numel() {
            return Err(TensorError::LengthMismatch {
                op: "Tensor::copy_from_slice",
                shape: self.dims().to_vec(),
                expected: self.numel(),
                got: src.len(),
            });
        }
        if self.device() == Device::Cpu {
            self.write()?.copy_from_slice(src);
        } else {
            let buffer = self.backend()?.upload("Tensor::copy_from_slice", src)?;
            self.storage.replace(buffer, self.device());
        }
        Ok(())
    }

    /// Moves this tensor's storage (shared by its clones and reshapes) to `device` in place: the
    /// elements are copied by the two backends, the accounted bytes move from one device's
    /// counters to the other's. A transfer bumps the version (graphs built before it become
    /// stale), even when the device is unchanged. A quantized tensor moves as its storage
    /// bytes, bit for bit, both ways (CPU → GPU → CPU gives back the same bytes); it is never
    /// dequantized on the way.
    ///
    /// # Errors
    /// [`TensorError::DeviceUnavailable`] when the device has no backend in this build;
    /// [`TensorError::OutOfMemory`] when either copy cannot be allocated (the tensor is then
    /// left where it was); [`TensorError::InvalidArgument`] for a tensor stored in 16 bits
    /// moving off the CPU (16-bit storage lives on the CPU only), or a quantized one moving to
    /// a device whose backend keeps no quantized buffers
    /// ([`crate::backend::Backend::upload_quantized`]).
    pub fn transfer_to(&mut self, device: Device) -> Result<()> {
        let target = crate::backend::for_device(device)?;
        let from = self.device();
        if from == device {
            self.storage.bump_version();
            return Ok(());
        }
        if let Some(dtype) = self.half_dtype() {
            return Err(TensorError::InvalidArgument {
                op: "Tensor::transfer_to",
                message: format!(
                    "a tensor stored in {} lives on the CPU only; device {device} computes on \
                     float32 weights: convert the weights back to float32 before moving them",
                    dtype.name()
                ),
            });
        }
        if self.quant_format().is_some() {
            // The quantized bytes move as they are (never dequantized on the way).
            let op = "Tensor::transfer_to";
            let buffer = {
                let guard = self.buffer();
                match (&*guard, device) {
                    (Buffer::Quantized(q), _) => target.upload_quantized(op, q)?,
                    (other, Device::Cpu) => {
                        Buffer::Quantized(self.backend()?.download_quantized(op, other)?)
                    }
                    (other, _) => {
                        let q = self.backend()?.download_quantized(op, other)?;
                        target.upload_quantized(op, &q)?
                    }
                }
            };
            self.storage.replace(buffer, device);
            return Ok(());
        }
        let host = self.to_host()?;
        let buffer = match device {
            Device::Cpu => Buffer::Host(host),
            _ => target.upload("Tensor::transfer_to", &host)?,
        };
        self.storage.replace(buffer, device);
        Ok(())
    }

    /// The 16-bit format the elements are stored in, or `None` for f32 (every tensor but one
    /// made by [`Tensor::to_half`]).
    pub fn half_dtype(&self) -> Option<crate::HalfDtype> {
        match &*self.buffer() {
            Buffer::Half(dtype, _) => Some(*dtype),
            _ => None,
        }
    }

    /// The block format the elements are stored in, on any device, or `None` for a tensor
    /// that is not quantized (see [`Tensor::to_quantized`]).
    pub fn quant_format(&self) -> Option<QuantFormat> {
        match &*self.buffer() {
            Buffer::Quantized(q) => Some(q.format),
            Buffer::Device(b) => b.quant_format(),
            _ => None,
        }
    }

    /// Whether the elements are stored in a read-only compressed format (16-bit or
    /// block-quantized, on any device) that reads convert to f32.
    pub fn is_compressed(&self) -> bool {
        match &*self.buffer() {
            Buffer::Half(..) | Buffer::Quantized(_) => true,
            Buffer::Device(b) => b.quant_format().is_some(),
            Buffer::Host(_) | Buffer::Placeholder(_) => false,
        }
    }

    /// A new CPU tensor of the same shape and category holding the elements quantized to
    /// `format` (read-only: reads dequantize; writes are errors). The tensor must be a matrix
    /// `[rows, cols]` whose rows are whole blocks of the format, so a range of rows is a range
    /// of blocks.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] for a tensor that is not a matrix with `cols` a
    /// multiple of the block size, or holding a non-finite value; [`TensorError::NotOnHost`]
    /// for a tensor on another device; out of memory.
    pub fn to_quantized(&self, format: QuantFormat) -> Result<Tensor> {
        let op = "Tensor::to_quantized";
        check_quantizable(op, format, self.dims())?;
        let values = self.read()?;
        let bytes = riftco_kernels::quant::quantize(format, &values).map_err(|e| {
            TensorError::InvalidArgument {
                op,
                message: e.to_string(),
            }
        })?;
        drop(values);
        Self::from_quantized_bytes(format, bytes, self.shape.clone(), self.category())
    }

    /// A CPU tensor of `shape` over `bytes` in `format` (a matrix whose rows are whole blocks;
    /// the bytes as [`riftco_kernels::quant::format`] lays them out, e.g. a GGUF tensor's data).
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] for a shape that is not such a matrix;
    /// [`TensorError::LengthMismatch`] when `bytes` is not the format's length for the shape.
    pub fn from_quantized_bytes(
        format: QuantFormat,
        mut bytes: Vec<u8>,
        shape: impl Into<Shape>,
        category: MemoryCategory,
    ) -> Result<Self> {
        let op = "Tensor::from_quantized_bytes";
        let shape = shape.into();
        check_quantizable(op, format, shape.dims())?;
        let numel = shape.numel();
        let expected = format.storage_bytes(numel);
        if expected != Some(bytes.len()) {
            return Err(TensorError::LengthMismatch {
                op,
                shape: shape.dims().to_vec(),
                expected: expected.unwrap_or(usize::MAX),
                got: bytes.len(),
            });
        }
        bytes.shrink_to_fit();
        let q = QuantizedBytes {
            format,
            bytes,
            numel,
        };
        let storage = Storage::from_buffer(Buffer::Quantized(q), Device::Cpu, category);
        Ok(Self {
            storage: Arc::new(storage),
            shape,
        })
    }

    /// A new CPU tensor of the same shape and category holding the elements rounded to `dtype`
    /// (nearest, ties to even) in 16-bit storage: half the bytes, read-only (reads upcast the
    /// elements to f32 exactly; writes are errors).
    ///
    /// # Errors
    /// [`TensorError::NotOnHost`] for a tensor on another device;
    /// [`TensorError::InvalidArgument`] naming the first finite element that the format cannot
    /// hold (float16 beyond 65504: it would become infinite); out of memory.
    pub fn to_half(&self, dtype: crate::HalfDtype) -> Result<Tensor> {
        let values = self.read()?;
        let mut bits: Vec<u16> =
            crate::alloc::try_vec_with_capacity("Tensor::to_half", values.len())?;
        bits.extend(values.iter().map(|&x| dtype.from_f32(x)));
        if let Some(i) = first_overflow(&values, &bits, dtype) {
            return Err(TensorError::InvalidArgument {
                op: "Tensor::to_half",
                message: format!(
                    "element {i} = {} is finite but beyond the range of {} (it would become \
                     infinite); keep this tensor in float32, or use bfloat16 (float32's range)",
                    values[i],
                    dtype.name()
                ),
            });
        }
        drop(values);
        let storage = Storage::from_buffer(Buffer::Half(dtype, bits), Device::Cpu, self.category());
        Ok(Self {
            storage: Arc::new(storage),
            shape: self.shape.clone(),
        })
    }

    /// A CPU tensor of `shape` over 16-bit `bits` in `dtype` (see [`Tensor::to_half`]).
    ///
    /// # Errors
    /// [`TensorError::ShapeOverflow`] for an invalid shape, [`TensorError::LengthMismatch`] when
    /// `bits.len()` is not the shape's element count.
    pub fn from_half_bits(
        dtype: crate::HalfDtype,
        mut bits: Vec<u16>,
        shape: impl Into<Shape>,
        category: MemoryCategory,
    ) -> Result<Self> {
        let shape = shape.into();
        if Some(bits.len()) != shape.checked_numel() {
            return Err(TensorError::LengthMismatch {
                op: "Tensor::from_half_bits",
                shape: shape.dims().to_vec(),
                expected: shape.checked_numel().unwrap_or(usize::MAX),
                got: bits.len(),
            });
        }
        bits.shrink_to_fit();
        let storage = Storage::from_buffer(Buffer::Half(dtype, bits), Device::Cpu, category);
        Ok(Self {
            storage: Arc::new(storage),
            shape,
        })
    }

    /// A new f32 tensor on the same device, of the same shape and category, holding the
    /// elements (an upcast copy of a 16-bit tensor, a dequantized copy of a quantized one, a
    /// plain copy of an f32 one; on a device other than the CPU, its backend's
    /// [`crate::backend::Backend::copy`], which dequantizes a quantized tensor there).
    ///
    /// # Errors
    /// Out of memory; the device backend's errors.
    pub fn to_float32(&self) -> Result<Tensor> {
        if self.device() != Device::Cpu {
            return self.try_deep_clone(self.category());
        }
        let mut data: Vec<f32> =
            crate::alloc::try_vec_with_capacity("Tensor::to_float32", self.numel())?;
        data.extend_from_slice(&self.read()?);
        Ok(Self::from_vec_unchecked(
            data,
            self.shape.clone(),
            self.category(),
        ))
    }

    /// Checks that the shape equals `expected`.
    ///
    /// # Errors
    /// [`TensorError::ShapeMismatch`] naming `op`.
    pub fn expect_shape(&self, op: &'static str, expected: &[usize]) -> Result<()> {
        if self.dims() != expected {
            return Err(TensorError::ShapeMismatch {
                op,
                expected: expected.to_vec(),
                got: self.dims().to_vec(),
            });
        }
        Ok(())
    }
}

/// Checks that `dims` is a matrix whose rows are whole blocks of `format`.
fn check_quantizable(op: &'static str, format: QuantFormat, dims: &[usize]) -> Result<()> {
    let block = format.block_elements();
    match dims {
        [rows, cols] if cols % block == 0 && rows.checked_mul(*cols).is_some() => Ok(()),
        _ => Err(TensorError::InvalidArgument {
            op,
            message: format!(
                "a tensor of shape {dims:?} cannot be stored in {format}: {format} keeps \
                 matrices [rows, cols] whose rows are whole blocks of {block} elements (cols a \
                 multiple of {block})"
            ),
        }),
    }
}

/// The index of the first finite value of `values` whose 16-bit rounding in `bits` is not finite
/// (float16 past 65504), if any.
pub fn first_overflow(values: &[f32], bits: &[u16], dtype: crate::HalfDtype) -> Option<usize> {
    values
        .iter()
        .zip(bits)
        .position(|(x, &b)| x.is_finite() && !dtype.to_f32(b).is_finite())
}
