//! The tensor type.

use crate::memory::MemoryCategory;
use crate::random::Rng;
use crate::storage::Storage;
use crate::{Device, Result, Shape, TensorError};
use std::sync::{Arc, RwLockReadGuard, RwLockWriteGuard};

/// A contiguous, row-major `f32` tensor.
///
/// Cloning a `Tensor` is cheap and shares storage (and therefore the version counter); use
/// [`Tensor::deep_clone`] for an independent copy. Reading takes a shared lock on the storage,
/// writing an exclusive one and bumps the version.
#[derive(Clone, Debug)]
pub struct Tensor {
    storage: Arc<Storage>,
    shape: Shape,
    device: Device,
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
        let numel = shape.check("Tensor::from_vec")?;
        if data.len() != numel {
            return Err(TensorError::LengthMismatch {
                op: "Tensor::from_vec",
                shape: shape.dims().to_vec(),
                expected: numel,
                got: data.len(),
            });
        }
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
            device: Device::Cpu,
        }
    }

    /// A copy of `data` with the given shape.
    ///
    /// # Errors
    /// As [`Tensor::from_vec`].
    pub fn from_slice(
        data: &[f32],
        shape: impl Into<Shape>,
        category: MemoryCategory,
    ) -> Result<Self> {
        Self::from_vec(data.to_vec(), shape, category)
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

    /// The device.
    pub fn device(&self) -> Device {
        self.device
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

    /// An identifier of the storage, stable while it lives.
    pub fn storage_id(&self) -> usize {
        Arc::as_ptr(&self.storage) as usize
    }

    /// Shared read access to the elements.
    pub fn read(&self) -> RwLockReadGuard<'_, Vec<f32>> {
        self.storage.read()
    }

    /// Exclusive write access to the elements; bumps the version (so graphs that read this
    /// value become stale).
    pub fn write(&self) -> RwLockWriteGuard<'_, Vec<f32>> {
        self.storage.write()
    }

    /// The elements as a new `Vec`.
    pub fn to_vec(&self) -> Vec<f32> {
        self.read().clone()
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
        Ok(self.read()[0])
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
            device: self.device,
        })
    }

    /// An independent copy with its own storage (version 0) in `category`.
    pub fn deep_clone(&self, category: MemoryCategory) -> Self {
        // A pooled buffer: a fresh allocation of this size would page-fault on every copy.
        let mut data = crate::pool::take(self.numel());
        data.copy_from_slice(&self.read());
        Self::from_vec_unchecked(data, self.shape.clone(), category)
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
        self.write().copy_from_slice(src);
        Ok(())
    }

    /// Moves this tensor's storage to `device` in place. A transfer bumps the version (graphs
    /// built before it become stale), even when the device is unchanged.
    ///
    /// # Errors
    /// [`TensorError::DeviceUnavailable`] when the device is not available in this build.
    pub fn transfer_to(&mut self, device: Device) -> Result<()> {
        device.check_available()?;
        self.storage.bump_version();
        self.device = device;
        Ok(())
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
