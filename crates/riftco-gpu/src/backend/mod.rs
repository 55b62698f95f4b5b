//! The GPU as a riftco device: [`GpuBackend`] implements `riftco_tensor::backend::Backend` on
//! one [`GpuContext`], with [`GpuBuffer`] as the storage's device buffer, and [`install`]
//! registers it for [`Device::Vulkan`] or [`Device::Metal`] (the adapter's backend).
//!
//! Every kernel records into the context's pending command stream; nothing waits for the GPU
//! until a value is read on the host ([`Backend::download`], e.g. `Tensor::to_host`). Outputs
//! are new pooled buffers accounted by the storage under `(device, category)`.
//!
//! Implemented: memory and transfers, copies, element-wise and broadcasting maps and their
//! VJPs, sums and keepdims reductions, matrix products (every `MatmulSpec` transpose), the
//! `[0, 2, 1, 3]` transpose, strided gather / scatter, and the transformer ops (SiLU /
//! SwiGLU, RMSNorm, RoPE, softmax and its VJP, causal softmax, dropout, embedding,
//! cross-entropy, each with its VJP; Adam / AdamW), one kernel of `crate::kernels` each.
//! FlashAttention-2 forward / backward (either layout, with or without dropout). No method
//! falls back to the CPU.
//!
//! Quantized frozen weights (`quantized`): a tensor stored in a block format lives here as its
//! bytes ([`crate::kernels::GpuQuantized`]); the products against it, embedding lookups and the
//! LM head read it dequantized a block at a time, as the CPU backend does, and every other op
//! given one is an error naming its format.

mod attention;
mod linalg;
mod maps;
mod memory;
mod optim;
mod quantized;
mod rope_cache;
mod transformer;

pub use rope_cache::ROPE_CACHE_ENTRIES;

use std::sync::{Arc, Mutex, RwLockReadGuard};

use riftco_tensor::backend::{
    AdamHyper, AttentionDims, AttentionLayout, Backend, BinaryOp, DropoutMask, LossAndGradients,
    MatmulSpec, Pair, ReduceOp, RopeTable, StridedView, UnaryOp,
};
use riftco_tensor::storage::{Buffer, DeviceBuffer};
use riftco_tensor::{Device, MemoryCategory, QuantizedBytes, Result, Shape, Tensor, TensorError};

use crate::{GpuBuffer, GpuContext, GpuError, GpuKind};

impl DeviceBuffer for GpuBuffer {
    fn len(&self) -> usize {
        GpuBuffer::len(self)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// The riftco device of an adapter's wgpu backend: Metal for Metal, Vulkan otherwise.
pub fn device_of(ctx: &GpuContext) -> Device {
    if ctx.adapter().backend.eq_ignore_ascii_case("metal") {
        Device::Metal
    } else {
        Device::Vulkan
    }
}

/// The backend of one opened GPU (see the [module documentation](self)).
#[derive(Debug)]
pub struct GpuBackend {
    ctx: Arc<GpuContext>,
    device: Device,
    /// The device copies of the RoPE tables seen last ([`ROPE_CACHE_ENTRIES`] at most).
    rope_tables: rope_cache::RopeCache,
}

type Installed = Vec<(Device, Arc<GpuContext>)>;

static INSTALLED: Mutex<Installed> = Mutex::new(Vec::new());

/// Opens the best adapter of `kind` (once per riftco device; later calls return the device
/// already open) and registers its [`GpuBackend`]. Returns the device (`Metal` or `Vulkan`)
/// and the context, for diagnostics (adapter, batching and pool counters).
///
/// # Errors
/// [`TensorError::DeviceUnavailable`] naming what was looked for and every adapter found
/// when none of `kind` exists (or it refuses a device); for [`GpuKind::Any`] ("gpu") the
/// same as [`TensorError::GpuUnavailable`] (see [`install_error`]).
pub fn install(kind: GpuKind) -> Result<(Device, Arc<GpuContext>)> {
    let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
    let wanted: &[Device] = match kind {
        GpuKind::Any => &Device::GPUS,
        GpuKind::Vulkan => &[Device::Vulkan],
        GpuKind::Metal => &[Device::Metal],
    };
    for d in wanted {
        if let Some((dev, ctx)) = installed.iter().find(|(x, _)| x == d) {
            return Ok((*dev, Arc::clone(ctx)));
        }
    }
    let want_device = match kind {
        GpuKind::Metal => Device::Metal,
        GpuKind::Vulkan => Device::Vulkan,
        GpuKind::Any if cfg!(target_os = "macos") => Device::Metal,
        GpuKind::Any => Device::Vulkan,
    };
    let ctx = GpuContext::open(kind).map_err(|e| install_error(kind, want_device, e))?;
    let ctx = Arc::new(ctx);
    let device = device_of(&ctx);
    riftco_tensor::backend::register(Box::new(GpuBackend {
        ctx: Arc::clone(&ctx),
        device,
        rope_tables: Default::default(),
    }))?;
    installed.push((device, Arc::clone(&ctx)));
    Ok((device, ctx))
}

/// The error of [`install`] when opening `kind` failed with `e`: as [`to_tensor_error`] on
/// `device`, except that an unavailable `"gpu"` ([`GpuKind::Any`]) is
/// [`TensorError::GpuUnavailable`], named as the user asked rather than as the backend tried.
pub fn install_error(kind: GpuKind, device: Device, e: GpuError) -> TensorError {
    match (kind, to_tensor_error("riftco_gpu::install", device, e)) {
        (GpuKind::Any, TensorError::DeviceUnavailable { reason, .. }) => {
            TensorError::GpuUnavailable { reason }
        }
        (_, other) => other,
    }
}

/// [`install`] for a riftco device (`Vulkan` or `Metal`).
///
/// # Errors
/// [`TensorError::InvalidArgument`] for a device that is not a GPU; as [`install`].
pub fn install_device(device: Device) -> Result<Arc<GpuContext>> {
    let kind = match device {
        Device::Vulkan => GpuKind::Vulkan,
        Device::Metal => GpuKind::Metal,
        other => {
            return Err(TensorError::InvalidArgument {
                op: "riftco_gpu::install_device",
                message: format!("{other} is not a GPU device; expected \"vulkan\" or \"metal\""),
            })
        }
    };
    install(kind).map(|(_, ctx)| ctx)
}

/// A [`GpuError`] as the tensor layer's error for `op` on `device`.
pub fn to_tensor_error(op: &'static str, device: Device, e: GpuError) -> TensorError {
    match e {
        GpuError::UnknownDevice { .. }
        | GpuError::Shape { .. }
        | GpuError::ForeignBuffer { .. } => TensorError::InvalidArgument {
            op,
            message: e.to_string(),
        },
        GpuError::DeviceUnavailable { .. } | GpuError::DeviceRequest { .. } => {
            TensorError::DeviceUnavailable {
                device,
                reason: e.to_string(),
            }
        }
        GpuError::BufferTooLarge { bytes, limit, .. } => {
            TensorError::BufferTooLarge { op, bytes, limit }
        }
        _ => TensorError::DeviceFailure {
            op,
            device,
            message: e.to_string(),
        },
    }
}

/// The operands' GPU buffers under read guards.
pub(crate) struct Reads<'a> {
    guards: Vec<RwLockReadGuard<'a, Buffer>>,
}

impl Reads<'_> {
    /// The `i`-th operand's buffer (checked to be a [`GpuBuffer`] when the guards were taken).
    pub(crate) fn get(&self, i: usize) -> &GpuBuffer {
        match &*self.guards[i] {
            Buffer::Device(b) => b
                .as_any()
                .downcast_ref()
                .unwrap_or_else(|| unreachable!("checked in GpuBackend::read")),
            _ => unreachable!("checked in GpuBackend::read"),
        }
    }
}

impl GpuBackend {
    /// The context.
    pub fn context(&self) -> &GpuContext {
        &self.ctx
    }

    pub(crate) fn err(&self, op: &'static str) -> impl Fn(GpuError) -> TensorError + '_ {
        move |e| to_tensor_error(op, self.device, e)
    }

    /// The error for a buffer that is not one of this backend's.
    pub(crate) fn foreign(&self, op: &'static str, buffer: &Buffer) -> TensorError {
        if let Some(q) = quantized::as_quantized(buffer) {
            return TensorError::InvalidArgument {
                op,
                message: format!(
                    "the tensor is stored quantized ({}) on {}: only the products against it \
                     (x · Wᵀ, dY · W), embedding lookups and the LM head read it (dequantized a \
                     block at a time); convert it to float32 first \
                     (set_frozen_weights_dtype(\"float32\"), or Tensor::to_float32) for this op",
                    q.format(),
                    self.device
                ),
            };
        }
        match buffer {
            Buffer::Placeholder(_) => TensorError::NoData { op },
            _ => TensorError::InvalidArgument {
                op,
                message: format!("not a buffer of the {} GPU backend", self.device),
            },
        }
    }

    /// Read guards over the buffers of `tensors`, each checked to be a [`GpuBuffer`].
    pub(crate) fn read<'a>(&self, op: &'static str, tensors: &[&'a Tensor]) -> Result<Reads<'a>> {
        let mut guards = Vec::with_capacity(tensors.len());
        for t in tensors {
            let g = t.buffer();
            let ok = matches!(&*g, Buffer::Device(b) if b.as_any().is::<GpuBuffer>());
            if !ok {
                return Err(self.foreign(op, &g));
            }
            guards.push(g);
        }
        Ok(Reads { guards })
    }

    /// A tensor of `shape` over the new buffer `buf` in category `c`.
    pub(crate) fn tensor(&self, buf: GpuBuffer, shape: Shape, c: MemoryCategory) -> Result<Tensor> {
        Tensor::from_buffer(Buffer::Device(Box::new(buf)), shape, self.device, c)
    }

    /// Runs `f` on the GPU buffer of `dst` under its write guard (bumping its version), with
    /// `src`'s buffer: a copy of it first when `src` shares `dst`'s storage (a kernel cannot
    /// read and write one buffer).
    pub(crate) fn in_place(
        &self,
        op: &'static str,
        dst: &Tensor,
        src: &Tensor,
        f: impl FnOnce(&GpuBuffer, &GpuBuffer) -> std::result::Result<(), GpuError>,
    ) -> Result<()> {
        let copy;
        let reads;
        let src_buf: &GpuBuffer = if dst.same_storage(src) {
            let r = self.read(op, &[src])?;
            copy = crate::kernels::copy(&self.ctx, r.get(0)).map_err(self.err(op))?;
            &copy
        } else {
            reads = self.read(op, &[src])?;
            reads.get(0)
        };
        let guard = dst.buffer_mut();
        f(src_buf, self.own_buffer(op, &guard)?).map_err(self.err(op))
    }

    /// The GPU buffer under a tensor's write guard ([`Tensor::buffer_mut`], which bumps its
    /// version), to be written by a kernel while the guard is held.
    pub(crate) fn own_buffer<'a>(
        &self,
        op: &'static str,
        guard: &'a Buffer,
    ) -> Result<&'a GpuBuffer> {
        match guard {
            Buffer::Device(b) => b
                .as_any()
                .downcast_ref()
                .ok_or_else(|| self.foreign(op, guard)),
            other => Err(self.foreign(op, other)),
        }
    }
}

#[allow(clippy::too_many_arguments)]
impl Backend for GpuBackend {
    fn device(&self) -> Device {
        self.device
    }

    fn cached_bytes(&self) -> usize {
        usize::try_from(self.ctx.memory().cached_bytes).unwrap_or(usize::MAX)
    }

    fn synchronize(&self) -> Result<()> {
        let op = "synchronize";
        self.ctx.flush().map_err(self.err(op))?;
        self.ctx.wait().map_err(self.err(op))
    }

    fn alloc(&self, op: &'static str, numel: usize, fill: Option<f32>) -> Result<Buffer> {
        memory::alloc(self, op, numel, fill)
    }

    fn upload(&self, op: &'static str, data: &[f32]) -> Result<Buffer> {
        memory::upload(self, op, data)
    }

    fn download(&self, op: &'static str, buffer: &Buffer) -> Result<Vec<f32>> {
        if quantized::as_quantized(buffer).is_some() {
            return quantized::download_values(self, op, buffer);
        }
        memory::download(self, op, buffer)
    }

    fn upload_quantized(&self, op: &'static str, q: &QuantizedBytes) -> Result<Buffer> {
        quantized::upload(self, op, q)
    }

    fn download_quantized(&self, op: &'static str, buffer: &Buffer) -> Result<QuantizedBytes> {
        quantized::download(self, op, buffer)
    }

    fn copy(&self, op: &'static str, src: &Tensor, c: MemoryCategory) -> Result<Tensor> {
        if let Some(q) = quantized::as_quantized(&src.buffer()) {
            return quantized::copy(self, op, q, src.shape().clone(), c);
        }
        memory::copy(self, op, src, c)
    }

    fn copy_range(
        &self,
        op: &'static str,
        dst: &Tensor,
        dst_offset: usize,
        src: &Tensor,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        memory::copy_range(self, op, dst, dst_offset, src, src_offset, len)
    }

    fn add(&self, op: &'static str, a: &Tensor, b: &Tensor, c: MemoryCategory) -> Result<Tensor> {
        maps::same_shape(self, op, crate::kernels::add, a, b, c)
    }

    fn mul(&self, op: &'static str, a: &Tensor, b: &Tensor, c: MemoryCategory) -> Result<Tensor> {
        maps::same_shape(self, op, crate::kernels::mul, a, b, c)
    }

    fn scale(&self, op: &'static str, x: &Tensor, alpha: f32, c: MemoryCategory) -> Result<Tensor> {
        maps::scale(self, op, x, alpha, c)
    }

    fn add_assign(&self, op: &'static str, dst: &Tensor, src: &Tensor) -> Result<()> {
        maps::axpy(self, op, None, src, dst)
    }

    fn axpy(&self, op: &'static str, alpha: f32, x: &Tensor, dst: &Tensor) -> Result<()> {
        maps::axpy(self, op, Some(alpha), x, dst)
    }

    fn sum(&self, op: &'static str, x: &Tensor, c: MemoryCategory) -> Result<Tensor> {
        maps::sum(self, op, x, c)
    }

    fn unary(
        &self,
        op: &'static str,
        kind: UnaryOp,
        x: &Tensor,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        maps::unary(self, op, kind, x, c)
    }

    fn unary_backward(
        &self,
        op: &'static str,
        kind: UnaryOp,
        x: &Tensor,
        y: &Tensor,
        dy: &Tensor,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        maps::unary_backward(self, op, kind, x, y, dy, c)
    }

    fn binary(
        &self,
        op: &'static str,
        kind: BinaryOp,
        a: &Tensor,
        b: &Tensor,
        out_shape: Shape,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        maps::binary(self, op, kind, a, b, out_shape, c)
    }

    fn reduce(
        &self,
        op: &'static str,
        kind: ReduceOp,
        x: &Tensor,
        out_shape: Shape,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        maps::reduce(self, op, kind, x, out_shape, c)
    }

    fn silu(&self, op: &'static str, x: &Tensor, c: MemoryCategory) -> Result<Tensor> {
        transformer::silu(self, op, x, c)
    }

    fn silu_backward(
        &self,
        op: &'static str,
        x: &Tensor,
        g: &Tensor,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        transformer::silu_backward(self, op, x, g, c)
    }

    fn swiglu(
        &self,
        op: &'static str,
        gate: &Tensor,
        up: &Tensor,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        transformer::swiglu(self, op, gate, up, c)
    }

    fn swiglu_backward(
        &self,
        op: &'static str,
        gate: &Tensor,
        up: &Tensor,
        g: &Tensor,
        c: MemoryCategory,
    ) -> Result<Pair> {
        transformer::swiglu_backward(self, op, gate, up, g, c)
    }

    fn swiglu_backward_in_place(
        &self,
        op: &'static str,
        gate: &Tensor,
        up: &Tensor,
        g: &Tensor,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        transformer::swiglu_backward_in_place(self, op, gate, up, g, c)
    }

    fn rms_norm(
        &self,
        op: &'static str,
        x: &Tensor,
        weight: &Tensor,
        eps: f32,
        c: MemoryCategory,
    ) -> Result<Pair> {
        transformer::rms_norm(self, op, x, weight, eps, c)
    }

    fn rms_norm_backward(
        &self,
        op: &'static str,
        x: &Tensor,
        weight: &Tensor,
        rstd: &Tensor,
        g: &Tensor,
        weight_grad: bool,
        c: MemoryCategory,
    ) -> Result<(Tensor, Option<Tensor>)> {
        transformer::rms_norm_backward(self, op, x, weight, rstd, g, weight_grad, c)
    }

    fn rope(
        &self,
        op: &'static str,
        x: &Tensor,
        table: &RopeTable,
        seq: usize,
        heads: usize,
        start_pos: usize,
        inverse: bool,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        transformer::rope(self, op, x, table, seq, heads, start_pos, inverse, c)
    }

    fn softmax(
        &self,
        op: &'static str,
        x: &Tensor,
        cols: usize,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        transformer::softmax(self, op, x, cols, c)
    }

    fn softmax_backward(
        &self,
        op: &'static str,
        y: &Tensor,
        g: &Tensor,
        cols: usize,
        scale: f32,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        transformer::softmax_backward(self, op, y, g, cols, scale, c)
    }

    fn causal_softmax(
        &self,
        op: &'static str,
        scores: &Tensor,
        dims: AttentionDims,
        scale: f32,
        causal: bool,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        transformer::causal_softmax(self, op, scores, dims, scale, causal, c)
    }

    fn dropout(
        &self,
        op: &'static str,
        x: &Tensor,
        mask: &DropoutMask,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        transformer::dropout(self, op, x, mask, c)
    }

    fn matmul(
        &self,
        op: &'static str,
        spec: MatmulSpec,
        a: &Tensor,
        b: &Tensor,
        shape: Shape,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        if let Some(q) = quantized::as_quantized(&b.buffer()) {
            return quantized::matmul(self, op, spec, a, q, shape, c);
        }
        linalg::batched_matmul(self, op, 1, spec, a, b, shape, c)
    }

    fn batched_matmul(
        &self,
        op: &'static str,
        batch: usize,
        spec: MatmulSpec,
        a: &Tensor,
        b: &Tensor,
        shape: Shape,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        linalg::batched_matmul(self, op, batch, spec, a, b, shape, c)
    }

    fn transpose_0213(
        &self,
        op: &'static str,
        x: &Tensor,
        dims: [usize; 4],
        c: MemoryCategory,
    ) -> Result<Tensor> {
        linalg::transpose_0213(self, op, x, dims, c)
    }

    fn gather_strided(
        &self,
        op: &'static str,
        x: &Tensor,
        view: &StridedView,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        linalg::gather_strided(self, op, x, view, c)
    }

    fn scatter_strided(
        &self,
        op: &'static str,
        dst: &Tensor,
        src: &Tensor,
        view: &StridedView,
        accumulate: bool,
    ) -> Result<()> {
        linalg::scatter_strided(self, op, dst, src, view, accumulate)
    }

    fn embedding(
        &self,
        op: &'static str,
        table: &Tensor,
        ids: &[u32],
        c: MemoryCategory,
    ) -> Result<Tensor> {
        if let Some(q) = quantized::as_quantized(&table.buffer()) {
            let d = table.dims().get(1).copied().unwrap_or(0);
            return quantized::embedding(self, op, q, d, ids, c);
        }
        transformer::embedding(self, op, table, ids, c)
    }

    fn embedding_backward(
        &self,
        op: &'static str,
        ids: &[u32],
        g: &Tensor,
        vocab: usize,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        transformer::embedding_backward(self, op, ids, g, vocab, c)
    }

    fn cross_entropy(
        &self,
        op: &'static str,
        logits: &Tensor,
        targets: &[u32],
        c: MemoryCategory,
    ) -> Result<Pair> {
        transformer::cross_entropy(self, op, logits, targets, c)
    }

    fn cross_entropy_backward(
        &self,
        op: &'static str,
        logits: &Tensor,
        targets: &[u32],
        lse: &Tensor,
        g: &Tensor,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        transformer::cross_entropy_backward(self, op, logits, targets, lse, g, c)
    }

    fn linear_cross_entropy(
        &self,
        op: &'static str,
        x: &Tensor,
        w: &Tensor,
        targets: &[u32],
        chunk_rows: usize,
        want_grads: [bool; 2],
        c: MemoryCategory,
    ) -> Result<LossAndGradients> {
        quantized::linear_cross_entropy(self, op, x, w, targets, chunk_rows, want_grads, c)
    }

    fn flash_attention_forward(
        &self,
        op: &'static str,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        dims: AttentionDims,
        layout: AttentionLayout,
        scale: f32,
        causal: bool,
        dropout: Option<&DropoutMask>,
        c: MemoryCategory,
    ) -> Result<Pair> {
        attention::forward(self, op, q, k, v, dims, layout, scale, causal, dropout, c)
    }

    fn flash_attention_backward(
        &self,
        op: &'static str,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        lse: &Tensor,
        g: &Tensor,
        dims: AttentionDims,
        layout: AttentionLayout,
        scale: f32,
        causal: bool,
        dropout: Option<&DropoutMask>,
        c: MemoryCategory,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        attention::backward(
            self, op, q, k, v, out, lse, g, dims, layout, scale, causal, dropout, c,
        )
    }

    fn adam_update(
        &self,
        op: &'static str,
        param: &Tensor,
        grad: &Tensor,
        m: &Tensor,
        v: &Tensor,
        step: u64,
        hyper: AdamHyper,
    ) -> Result<()> {
        optim::adam_update(self, op, param, grad, m, v, step, hyper)
    }
}
