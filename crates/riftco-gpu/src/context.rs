//! [`GpuContext`]: one opened device with its queue, buffer pool, pipeline cache and the
//! pending command encoder that batches kernels until a value is read back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use wgpu::util::DeviceExt;

use crate::device::{pick_adapter, summarize, GpuKind};
use crate::error::{AdapterSummary, GpuError, Result};
use crate::pipelines::PipelineCache;
use crate::pool::{bucket_bytes, GpuBuffer, MemoryStats, Pool};

/// Dispatches recorded before the pending encoder is submitted on its own (without waiting),
/// so that a long run of kernels with no read-back keeps a bounded command buffer.
pub const FLUSH_EVERY: u64 = 1024;

/// Mesa's llvmpipe ends a shader invocation after 65535 iterations of its loops, all loops
/// together (seen here: a sum over 70000 elements in one invocation stopped after 21845 of a
/// 3-back-edge loop, 65535 / 3), without any error.
pub const LLVMPIPE_LOOP_LIMIT: usize = 65_535;

/// Counters of the command stream (for tests and diagnostics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Kernel dispatches recorded.
    pub dispatches: u64,
    /// Queue submissions (one per flush of a non-empty pending encoder).
    pub submits: u64,
    /// Waits for the GPU (one per download).
    pub waits: u64,
}

/// What the device-lost callback and the uncaptured-error handler saw.
#[derive(Default)]
struct Health {
    lost: Mutex<Option<String>>,
    uncaptured: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An opened GPU: wgpu device + queue of one adapter.
///
/// Kernels (see [`crate::kernels`]) record compute passes into one pending command encoder;
/// nothing waits for the GPU until [`GpuContext::download`] submits the pending work and waits
/// for it (a long run of kernels is submitted every [`FLUSH_EVERY`] dispatches, still without
/// waiting). `Send + Sync`: the pending encoder and the caches sit behind mutexes.
pub struct GpuContext {
    kind: GpuKind,
    adapter: AdapterSummary,
    /// [`GpuContext::loop_iteration_limit`], from the adapter once at open.
    loop_limit: Option<usize>,
    device: wgpu::Device,
    queue: wgpu::Queue,
    limits: wgpu::Limits,
    pool: Arc<Pool>,
    pub(crate) pipelines: PipelineCache,
    pending: Mutex<Option<wgpu::CommandEncoder>>,
    dispatches: AtomicU64,
    submits: AtomicU64,
    waits: AtomicU64,
    health: Arc<Health>,
}

/// The smallest allocation of [`GpuContext::alloc_exact`], in bytes.
pub const MIN_EXACT_BYTES: u64 = 16;

impl GpuContext {
    /// Open the best adapter of `kind` headless (no surface) and create its device and queue.
    ///
    /// # Errors
    /// [`GpuError::DeviceUnavailable`] naming `kind` and every adapter found when none of
    /// `kind` exists; [`GpuError::DeviceRequest`] when the adapter refuses a device.
    pub fn open(kind: GpuKind) -> Result<Self> {
        let (_instance, adapter) = pick_adapter(kind)?;
        let summary = summarize(&adapter.get_info());
        // The adapter's own limits: storage buffers as large as the device allows.
        let limits = adapter.limits();
        let desc = wgpu::DeviceDescriptor {
            label: Some("riftco"),
            required_features: wgpu::Features::empty(),
            required_limits: limits.clone(),
            ..Default::default()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc)).map_err(|e| {
            GpuError::DeviceRequest {
                adapter: summary.clone(),
                message: e.to_string(),
            }
        })?;
        let health = Arc::new(Health::default());
        {
            let h = Arc::clone(&health);
            device.set_device_lost_callback(move |reason, message| {
                let why = if message.is_empty() {
                    format!("{reason:?}")
                } else {
                    format!("{reason:?}: {message}")
                };
                *lock(&h.lost) = Some(why);
            });
            // wgpu's default handler panics; errors outside a scope are kept and reported by
            // the next operation instead.
            let h = Arc::clone(&health);
            device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                lock(&h.uncaptured).get_or_insert_with(|| e.to_string());
            }));
        }
        let llvmpipe = [&summary.name, &summary.driver]
            .iter()
            .any(|s| s.to_ascii_lowercase().contains("llvmpipe"));
        Ok(Self {
            kind,
            pool: Arc::new(Pool::new(summary.to_string())),
            loop_limit: llvmpipe.then_some(LLVMPIPE_LOOP_LIMIT),
            adapter: summary,
            device,
            queue,
            limits,
            pipelines: PipelineCache::default(),
            pending: Mutex::new(None),
            dispatches: AtomicU64::new(0),
            submits: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            health,
        })
    }

    /// Open the device named `name` (`"gpu"`, `"vulkan"`, `"metal"`).
    ///
    /// # Errors
    /// [`GpuError::UnknownDevice`] for another name, else as [`GpuContext::open`].
    pub fn open_named(name: &str) -> Result<Self> {
        Self::open(name.parse()?)
    }

    /// The kind this context was opened with.
    pub fn kind(&self) -> GpuKind {
        self.kind
    }

    /// The adapter in use (name, backend, device type, driver).
    pub fn adapter(&self) -> &AdapterSummary {
        &self.adapter
    }

    /// Loop iterations (back edges, all loops together) one shader invocation may run before
    /// the driver silently ends it: [`LLVMPIPE_LOOP_LIMIT`] on Mesa's llvmpipe, `None` on
    /// adapters with no such cut-off known. Kernels that loop once per element of a reduction
    /// check their count against it and return an error instead of a silently short result.
    pub fn loop_iteration_limit(&self) -> Option<usize> {
        self.loop_limit
    }

    /// The wgpu device (for kernels of this crate).
    pub(crate) fn device(&self) -> &wgpu::Device {
        &self.device
    }

    /// Byte accounting of this context's buffers.
    pub fn memory(&self) -> MemoryStats {
        self.pool.lock().stats
    }

    /// Free the pool's cached buffers; returns the bytes released.
    pub fn trim_pool(&self) -> u64 {
        self.pool.trim()
    }

    /// Counters of dispatches, submissions and waits so far.
    pub fn batch_stats(&self) -> BatchStats {
        BatchStats {
            dispatches: self.dispatches.load(Ordering::Relaxed),
            submits: self.submits.load(Ordering::Relaxed),
            waits: self.waits.load(Ordering::Relaxed),
        }
    }

    /// Compute pipelines compiled so far (each kernel once per context).
    pub fn pipelines_compiled(&self) -> usize {
        self.pipelines.len()
    }

    /// Destroy the device now (its memory is released without waiting for drops); every later
    /// operation on this context returns [`GpuError::DeviceLost`] (or the wgpu error of using a
    /// destroyed device), never a panic. Also how the device-lost path is tested.
    pub fn destroy(&self) {
        lock(&self.pending).take();
        self.device.destroy();
    }

    /// [`GpuError::ForeignBuffer`] unless `buf` was created by this context.
    pub(crate) fn check_owner(&self, op: &'static str, what: &str, buf: &GpuBuffer) -> Result<()> {
        if buf.belongs_to(&self.pool) {
            return Ok(());
        }
        Err(GpuError::ForeignBuffer {
            op,
            what: what.to_owned(),
            owner: buf.owner().to_owned(),
            this: self.adapter.to_string(),
        })
    }

    /// Fail when the device was lost or an error escaped every scope.
    fn check_health(&self) -> Result<()> {
        if let Some(message) = lock(&self.health.lost).clone() {
            return Err(GpuError::DeviceLost { message });
        }
        if let Some(message) = lock(&self.health.uncaptured).take() {
            return Err(GpuError::Wgpu {
                during: "an earlier operation".to_owned(),
                message,
            });
        }
        Ok(())
    }

    /// Run `f` inside out-of-memory and validation error scopes; an error caught there (or a
    /// lost device) becomes a [`GpuError`] naming `during`.
    pub(crate) fn scoped<T>(
        &self,
        during: impl Fn() -> String,
        f: impl FnOnce() -> T,
    ) -> Result<T> {
        self.check_health()?;
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let out = f();
        let v = pollster::block_on(validation.pop());
        let o = pollster::block_on(oom.pop());
        if let Some(e) = o {
            return Err(GpuError::OutOfMemory {
                during: during(),
                message: e.to_string(),
            });
        }
        if let Some(e) = v {
            return Err(GpuError::Wgpu {
                during: during(),
                message: e.to_string(),
            });
        }
        self.check_health()?;
        Ok(out)
    }

    /// The largest buffer this device allows, in bytes: the smaller of the adapter's
    /// `max_buffer_size` and `max_storage_buffer_binding_size` (requested in full when the
    /// device was opened). A limit on one buffer, not the free memory.
    pub fn max_buffer_bytes(&self) -> u64 {
        self.limits
            .max_buffer_size
            .min(self.limits.max_storage_buffer_binding_size)
    }

    fn check_size(&self, what: &'static str, bytes: u64) -> Result<()> {
        let limit = self.max_buffer_bytes();
        if bytes > limit {
            return Err(GpuError::BufferTooLarge { what, bytes, limit });
        }
        Ok(())
    }

    /// A buffer of `len` f32 values with unspecified contents (from the pool when a buffer of
    /// the same bucket was freed).
    ///
    /// # Errors
    /// [`GpuError::BufferTooLarge`] above the device's storage-buffer limit,
    /// [`GpuError::OutOfMemory`] when the device cannot allocate it.
    pub fn alloc(&self, len: usize) -> Result<GpuBuffer> {
        self.check_size("storage buffer", (len as u64).saturating_mul(4))?;
        // A bucket past the limit is the limit itself (the buffer is then exactly as large as
        // the device allows and still holds `len` values).
        let bucket = bucket_bytes(len).min(self.max_buffer_bytes());
        self.alloc_bucket(len, bucket)
    }

    /// A buffer of `len` f32 values allocated at its own size (`4 · len` bytes, at least
    /// [`MIN_EXACT_BYTES`]), not rounded up to a size class: for long-lived data such as
    /// quantized weights, whose sizes are rarely powers of two (rounding would hold up to
    /// twice their bytes). Dropped, it is kept by the pool under its own size, for a request of
    /// exactly that size.
    ///
    /// # Errors
    /// As [`GpuContext::alloc`].
    pub fn alloc_exact(&self, len: usize) -> Result<GpuBuffer> {
        let bytes = (len as u64).saturating_mul(4);
        self.check_size("storage buffer", bytes)?;
        self.alloc_bucket(len, bytes.max(MIN_EXACT_BYTES))
    }

    /// A buffer of `len` values in an allocation of `bucket` bytes (`>= 4 · len`), from the
    /// pool when one of that size was freed.
    fn alloc_bucket(&self, len: usize, bucket: u64) -> Result<GpuBuffer> {
        if let Some(buf) = self.pool.take(bucket) {
            return Ok(GpuBuffer::new(buf, len, bucket, Arc::clone(&self.pool)));
        }
        let buf = self.scoped(
            || format!("allocating a storage buffer of {bucket} bytes"),
            || {
                self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("riftco f32"),
                    size: bucket,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            },
        )?;
        self.pool.created(bucket);
        Ok(GpuBuffer::new(buf, len, bucket, Arc::clone(&self.pool)))
    }

    /// A new buffer holding `data` (the copy is recorded in the pending command stream, so it
    /// is ordered with the kernels around it; nothing is submitted).
    ///
    /// # Errors
    /// As [`GpuContext::alloc`].
    pub fn upload(&self, data: &[f32]) -> Result<GpuBuffer> {
        let buf = self.alloc(data.len())?;
        self.write(&buf, data)?;
        Ok(buf)
    }

    /// Overwrite the values of `buf` with `data` (recorded in order with pending kernels).
    ///
    /// # Errors
    /// [`GpuError::Shape`] when `data.len() != buf.len()`; [`GpuError::ForeignBuffer`] for a
    /// buffer of another context; out of memory for the staging copy.
    pub fn write(&self, buf: &GpuBuffer, data: &[f32]) -> Result<()> {
        self.check_owner("write", "the buffer", buf)?;
        if data.len() != buf.len() {
            return Err(GpuError::Shape {
                op: "write",
                message: format!("{} values for a buffer of {} values", data.len(), buf.len()),
            });
        }
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.write_bytes(buf, &bytes)
    }

    /// Overwrite the first `bytes.len()` bytes of `buf` with `bytes` (a whole number of 4-byte
    /// words, at most [`GpuBuffer::bytes`]; the caller checks both), recorded in order with
    /// pending kernels: how data that is not f32 (token ids, quantized blocks) reaches a
    /// buffer.
    pub(crate) fn write_bytes(&self, buf: &GpuBuffer, bytes: &[u8]) -> Result<()> {
        self.check_owner("write", "the buffer", buf)?;
        if bytes.is_empty() {
            return Ok(());
        }
        let size = bytes.len() as u64;
        let staging = self.scoped(
            || format!("staging an upload of {} bytes", bytes.len()),
            || {
                self.device
                    .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                        label: Some("riftco upload"),
                        contents: bytes,
                        usage: wgpu::BufferUsages::COPY_SRC,
                    })
            },
        )?;
        self.record(|enc| enc.copy_buffer_to_buffer(&staging, 0, buf.raw(), 0, size));
        Ok(())
    }

    /// Record into the pending encoder (created on first use).
    pub(crate) fn record<T>(&self, f: impl FnOnce(&mut wgpu::CommandEncoder) -> T) -> T {
        let mut pending = lock(&self.pending);
        let enc = pending.get_or_insert_with(|| {
            self.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("riftco batch"),
                })
        });
        f(enc)
    }

    /// Count one recorded dispatch; every [`FLUSH_EVERY`] dispatches the pending encoder is
    /// submitted (not waited for).
    ///
    /// # Errors
    /// As [`GpuContext::flush`].
    pub(crate) fn count_dispatch(&self) -> Result<()> {
        let n = self.dispatches.fetch_add(1, Ordering::Relaxed) + 1;
        if n % FLUSH_EVERY == 0 {
            self.flush()?;
        }
        Ok(())
    }

    /// A uniform buffer holding `bytes` (kernel parameters).
    pub(crate) fn uniform(&self, bytes: &[u8]) -> Result<wgpu::Buffer> {
        self.scoped(
            || "creating a parameter buffer".to_owned(),
            || {
                self.device
                    .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                        label: Some("riftco params"),
                        contents: bytes,
                        usage: wgpu::BufferUsages::UNIFORM,
                    })
            },
        )
    }

    /// Submit the pending encoder, if any, without waiting for the GPU.
    ///
    /// # Errors
    /// [`GpuError::Wgpu`] when a recorded command was invalid; device lost.
    pub fn flush(&self) -> Result<()> {
        // The pending lock is held through the submission: another thread must not record
        // into (and submit) a newer encoder before this one is submitted, or the queue would
        // run its commands first (a pooled buffer reused by that thread would be read or
        // written out of order).
        let mut pending = lock(&self.pending);
        let Some(enc) = pending.take() else {
            drop(pending);
            return self.check_health();
        };
        self.scoped(
            || "submitting the recorded kernels".to_owned(),
            || {
                self.queue.submit([enc.finish()]);
            },
        )?;
        drop(pending);
        self.submits.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Block until all submitted work has finished.
    ///
    /// # Errors
    /// [`GpuError::Readback`] when the wait fails; device lost.
    pub fn wait(&self) -> Result<()> {
        self.waits.fetch_add(1, Ordering::Relaxed);
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Readback {
                message: e.to_string(),
            })?;
        self.check_health()
    }

    /// The values of `buf`: records a copy into a MAP_READ staging buffer, submits everything
    /// pending, waits for the GPU and maps the staging buffer.
    ///
    /// # Errors
    /// [`GpuError::Readback`] when mapping fails; [`GpuError::ForeignBuffer`] for a buffer of
    /// another context; validation errors of pending kernels; device lost. Never panics.
    pub fn download(&self, buf: &GpuBuffer) -> Result<Vec<f32>> {
        self.read_back(buf, |view| {
            view.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        })
    }

    /// The bytes of `buf` (`4 · buf.len()` of them, as stored), read back as
    /// [`GpuContext::download`] does.
    ///
    /// # Errors
    /// As [`GpuContext::download`].
    pub(crate) fn download_bytes(&self, buf: &GpuBuffer) -> Result<Vec<u8>> {
        self.read_back(buf, |view| view.to_vec())
    }

    /// `read` of the `4 · buf.len()` bytes of `buf`, mapped after everything pending ran.
    fn read_back<T: Default>(&self, buf: &GpuBuffer, read: impl FnOnce(&[u8]) -> T) -> Result<T> {
        self.check_owner("download", "the buffer", buf)?;
        if buf.is_empty() {
            self.flush()?;
            return Ok(T::default());
        }
        let bytes = buf.bytes();
        let staging = self.scoped(
            || format!("allocating a read-back buffer of {bytes} bytes"),
            || {
                self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("riftco readback"),
                    size: bytes,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            },
        )?;
        self.record(|enc| enc.copy_buffer_to_buffer(buf.raw(), 0, &staging, 0, bytes));
        self.flush()?;
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            // The receiver lives until recv below returns.
            let _ = tx.send(r);
        });
        self.wait()?;
        let mapped = rx
            .recv()
            .map_err(|_| GpuError::Readback {
                message: "the map callback never ran".to_owned(),
            })?
            .map_err(|e| GpuError::Readback {
                message: e.to_string(),
            });
        mapped?;
        let out = {
            let view = staging
                .get_mapped_range(..)
                .map_err(|e| GpuError::Readback {
                    message: e.to_string(),
                })?;
            read(&view[..4 * buf.len()])
        };
        staging.unmap();
        Ok(out)
    }
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuContext")
            .field("kind", &self.kind)
            .field("adapter", &self.adapter)
            .finish_non_exhaustive()
    }
}
