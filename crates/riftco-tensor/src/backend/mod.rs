//! The device seam: one trait, [`Backend`], covers every kernel family the differentiable ops,
//! the optimizer and decoding use, on tensors of one device. Ops never touch host slices: they
//! ask [`backend_of`] for the backend of their operands' device (a
//! [`TensorError::DeviceMismatch`] when operands disagree) and call it.
//!
//! - [`cpu::CpuBackend`]: host memory and the SIMD kernels of `riftco-kernels` (always
//!   registered for [`Device::Cpu`]).
//! - [`mirror::MirrorBackend`]: a test backend on [`Device::PrivateUse1`] that keeps its buffers
//!   in another type (`u32` bit patterns) and runs the CPU kernels on copies; a training step on
//!   it gives bitwise the CPU's results, which shows that nothing bypasses the trait.
//!
//! A new device implements [`Backend`] (and [`crate::storage::DeviceBuffer`] for its buffers)
//! and is registered with [`register`]; a new kernel family is one trait method, implemented by
//! every backend.
//!
//! Conventions: every method allocates its outputs on its own device in the given memory
//! category; `op` names the caller in errors. Shapes are validated by the callers (the ops);
//! a backend may assume consistent lengths and returns [`TensorError::LengthMismatch`] rather
//! than panicking where they are not.

pub mod composed;
pub mod cpu;
pub mod mirror;

use crate::storage::Buffer;
use crate::{Device, MemoryCategory, QuantFormat, Result, Shape, Tensor, TensorError};
pub use riftco_kernels::attention::{AttentionDims, AttentionLayout};
pub use riftco_kernels::broadcast::broadcast_shape;
pub use riftco_kernels::philox::DropoutMask;
pub use riftco_kernels::rope::RopeTable;
pub use riftco_kernels::StridedView;
pub use riftco_kernels::{AdamHyper, BinaryOp, MatmulSpec, ReduceOp, UnaryOp};
use std::fmt;
use std::sync::RwLock;

/// A pair of output tensors.
pub type Pair = (Tensor, Tensor);

/// A scalar loss and, where asked for, the loss's gradients with respect to two operands (see
/// [`Backend::linear_cross_entropy`]).
#[derive(Debug)]
pub struct LossAndGradients {
    /// The loss, `[]`.
    pub loss: Tensor,
    /// The gradient with respect to the first operand.
    pub d_first: Option<Tensor>,
    /// The gradient with respect to the second operand.
    pub d_second: Option<Tensor>,
}

/// The kernels of one device (see the [module documentation](self)).
#[allow(clippy::too_many_arguments)]
pub trait Backend: Send + Sync + fmt::Debug {
    /// The device whose tensors this backend computes on.
    fn device(&self) -> Device;

    /// Bytes of freed buffers this backend's pool keeps for reuse (in no memory category).
    fn cached_bytes(&self) -> usize {
        0
    }

    /// Blocks until every operation issued on this device so far has finished, like
    /// `torch.cuda.synchronize()` or MLX's `mx.synchronize()`. A backend that computes when
    /// called (the CPU's) has nothing to wait for; a GPU backend that batches commands submits
    /// them and waits. A wall-clock timing of device work must end with it.
    ///
    /// # Errors
    /// [`TensorError::DeviceFailure`] (or the backend's own error) when the device reports a
    /// failure of queued work.
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    // ---- memory and transfers -------------------------------------------------------------

    /// A buffer of `numel` elements on this device: every element `value`, or unspecified
    /// contents (a kernel overwrites all of them) with `None`.
    ///
    /// # Errors
    /// [`TensorError::OutOfMemory`] naming `op`.
    fn alloc(&self, op: &'static str, numel: usize, fill: Option<f32>) -> Result<Buffer>;

    /// A buffer on this device holding a copy of the host elements `data`.
    ///
    /// # Errors
    /// [`TensorError::OutOfMemory`] naming `op`.
    fn upload(&self, op: &'static str, data: &[f32]) -> Result<Buffer>;

    /// The elements of `buffer` (one of this backend's) copied to host memory.
    ///
    /// # Errors
    /// [`TensorError::OutOfMemory`]; [`TensorError::InvalidArgument`] for a buffer of another
    /// backend.
    fn download(&self, op: &'static str, buffer: &Buffer) -> Result<Vec<f32>>;

    /// A buffer on this device holding the quantized tensor `q` as it is stored (its bytes,
    /// not dequantized values): [`Tensor::transfer_to`] of a quantized tensor. The backend's
    /// products against it (`x · Wᵀ`, `dY · W`), embedding lookups and LM head read it
    /// dequantized; it is read-only.
    ///
    /// The default refuses: [`TensorError::InvalidArgument`] naming `op`, the device and the
    /// format (a backend that keeps no quantized buffers).
    ///
    /// # Errors
    /// As above; [`TensorError::OutOfMemory`] naming `op` where the backend supports it.
    fn upload_quantized(&self, op: &'static str, q: &crate::QuantizedBytes) -> Result<Buffer> {
        Err(no_quantized_buffers(op, self.device(), q.format))
    }

    /// The quantized bytes of `buffer` (one of this backend's holding a quantized tensor, as
    /// [`Backend::upload_quantized`] made it), copied to host memory bit for bit.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] for a buffer that is not a quantized one of this
    /// backend (the default: every buffer); [`TensorError::OutOfMemory`]; read-back errors.
    fn download_quantized(
        &self,
        op: &'static str,
        buffer: &Buffer,
    ) -> Result<crate::QuantizedBytes> {
        let _ = buffer;
        Err(TensorError::InvalidArgument {
            op,
            message: format!(
                "device {} keeps no quantized buffers to read back",
                self.device()
            ),
        })
    }

    /// An independent copy of `src` (same shape and device) in `category`.
    fn copy(&self, op: &'static str, src: &Tensor, category: MemoryCategory) -> Result<Tensor>;

    /// Copies `len` elements of `src` from element `src_offset` into `dst` from element
    /// `dst_offset` (in place; bumps `dst`'s version). Callers check the ranges.
    fn copy_range(
        &self,
        op: &'static str,
        dst: &Tensor,
        dst_offset: usize,
        src: &Tensor,
        src_offset: usize,
        len: usize,
    ) -> Result<()>;

    // ---- element-wise and reductions ------------------------------------------------------

    /// `a + b` (same lengths), shape of `a`.
    fn add(&self, op: &'static str, a: &Tensor, b: &Tensor, c: MemoryCategory) -> Result<Tensor>;
    /// `a ⊙ b`.
    fn mul(&self, op: &'static str, a: &Tensor, b: &Tensor, c: MemoryCategory) -> Result<Tensor>;
    /// `alpha · x`.
    fn scale(&self, op: &'static str, x: &Tensor, alpha: f32, c: MemoryCategory) -> Result<Tensor>;
    /// `dst += src` in place (bumps `dst`'s version).
    fn add_assign(&self, op: &'static str, dst: &Tensor, src: &Tensor) -> Result<()>;
    /// `dst += alpha · x` in place (bumps `dst`'s version).
    fn axpy(&self, op: &'static str, alpha: f32, x: &Tensor, dst: &Tensor) -> Result<()>;
    /// The sum of all elements (accumulated in f64 in index order) as a rank-0 tensor.
    fn sum(&self, op: &'static str, x: &Tensor, c: MemoryCategory) -> Result<Tensor>;

    // ---- general maps, broadcasting and axis reductions -----------------------------------

    /// `f(x)` element-wise for the map `kind` (same shape as `x`).
    fn unary(
        &self,
        op: &'static str,
        kind: UnaryOp,
        x: &Tensor,
        c: MemoryCategory,
    ) -> Result<Tensor>;
    /// `dy · f'(x)` of [`Backend::unary`], given its input `x` and output `y` (same shape).
    fn unary_backward(
        &self,
        op: &'static str,
        kind: UnaryOp,
        x: &Tensor,
        y: &Tensor,
        dy: &Tensor,
        c: MemoryCategory,
    ) -> Result<Tensor>;
    /// `a kind b` with NumPy broadcasting to `out_shape` (each operand right-aligned, every axis
    /// equal to `out_shape`'s or 1; callers check). Comparisons give `1.0` / `0.0`.
    fn binary(
        &self,
        op: &'static str,
        kind: BinaryOp,
        a: &Tensor,
        b: &Tensor,
        out_shape: Shape,
        c: MemoryCategory,
    ) -> Result<Tensor>;
    /// `x` reduced to `out_shape` (same rank, each axis equal to `x`'s or 1: the keepdims
    /// shape; callers check), in row-major order per output element (sums in `f64`).
    fn reduce(
        &self,
        op: &'static str,
        kind: ReduceOp,
        x: &Tensor,
        out_shape: Shape,
        c: MemoryCategory,
    ) -> Result<Tensor>;

    // ---- SiLU / SwiGLU --------------------------------------------------------------------

    /// `x · σ(x)`.
    fn silu(&self, op: &'static str, x: &Tensor, c: MemoryCategory) -> Result<Tensor>;
    /// `g · σ(x)(1 + x(1 − σ(x)))`.
    fn silu_backward(
        &self,
        op: &'static str,
        x: &Tensor,
        g: &Tensor,
        c: MemoryCategory,
    ) -> Result<Tensor>;
    /// `SiLU(gate) ⊙ up`.
    fn swiglu(
        &self,
        op: &'static str,
        gate: &Tensor,
        up: &Tensor,
        c: MemoryCategory,
    ) -> Result<Tensor>;
    /// `(d gate, d up)` of [`Backend::swiglu`] for upstream `g`.
    fn swiglu_backward(
        &self,
        op: &'static str,
        gate: &Tensor,
        up: &Tensor,
        g: &Tensor,
        c: MemoryCategory,
    ) -> Result<Pair>;
    /// [`Backend::swiglu_backward`] writing `d gate` over `g` (bitwise the same values) and
    /// returning `d up` (category `c`): for a gradient only the caller holds, one buffer less.
    /// `g` must share no storage with `gate` or `up` (`InvalidArgument` otherwise).
    fn swiglu_backward_in_place(
        &self,
        op: &'static str,
        gate: &Tensor,
        up: &Tensor,
        g: &Tensor,
        c: MemoryCategory,
    ) -> Result<Tensor>;

    // ---- RMSNorm --------------------------------------------------------------------------

    /// RMSNorm over the last axis of `x` (`weight [d]`): `(y, rstd [rows])`.
    fn rms_norm(
        &self,
        op: &'static str,
        x: &Tensor,
        weight: &Tensor,
        eps: f32,
        c: MemoryCategory,
    ) -> Result<Pair>;
    /// `(dx, dweight)` of RMSNorm; `dweight` only with `weight_grad`.
    fn rms_norm_backward(
        &self,
        op: &'static str,
        x: &Tensor,
        weight: &Tensor,
        rstd: &Tensor,
        g: &Tensor,
        weight_grad: bool,
        c: MemoryCategory,
    ) -> Result<(Tensor, Option<Tensor>)>;

    // ---- RoPE -----------------------------------------------------------------------------

    /// Rotary embedding of `x [batch, seq, heads, d_head]` at positions `start_pos..`; with
    /// `inverse` the opposite rotation (its VJP).
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
    ) -> Result<Tensor>;

    // ---- softmax --------------------------------------------------------------------------

    /// Softmax of each row of `cols` elements.
    fn softmax(
        &self,
        op: &'static str,
        x: &Tensor,
        cols: usize,
        c: MemoryCategory,
    ) -> Result<Tensor>;
    /// `scale · (softmax VJP)` given the forward output `y` and upstream `g` (rows of `cols`).
    fn softmax_backward(
        &self,
        op: &'static str,
        y: &Tensor,
        g: &Tensor,
        cols: usize,
        scale: f32,
        c: MemoryCategory,
    ) -> Result<Tensor>;
    /// Scaled (optionally causal) softmax of attention scores `[.., seq_q, seq_k]`.
    fn causal_softmax(
        &self,
        op: &'static str,
        scores: &Tensor,
        dims: AttentionDims,
        scale: f32,
        causal: bool,
        c: MemoryCategory,
    ) -> Result<Tensor>;

    // ---- dropout --------------------------------------------------------------------------

    /// Dropout with the counter-based `mask` over the linear element index of `x`:
    /// `x[e] / (1 − p)` where the mask keeps `e`, exactly 0 elsewhere (same shape as `x`; the
    /// VJP is the same map applied to the upstream gradient). `mask.p` must be finite and in
    /// `[0, 1)`.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] naming `op` and `p` for any other `p`.
    fn dropout(
        &self,
        op: &'static str,
        x: &Tensor,
        mask: &DropoutMask,
        c: MemoryCategory,
    ) -> Result<Tensor>;

    // ---- matrix products and layout -------------------------------------------------------

    /// `op(A) · op(B)` of `spec`, output of `shape`.
    fn matmul(
        &self,
        op: &'static str,
        spec: MatmulSpec,
        a: &Tensor,
        b: &Tensor,
        shape: Shape,
        c: MemoryCategory,
    ) -> Result<Tensor>;
    /// `batch` independent products of `spec`, output of `shape`.
    fn batched_matmul(
        &self,
        op: &'static str,
        batch: usize,
        spec: MatmulSpec,
        a: &Tensor,
        b: &Tensor,
        shape: Shape,
        c: MemoryCategory,
    ) -> Result<Tensor>;
    /// Swaps axes 1 and 2 of `x` of dimensions `dims`.
    fn transpose_0213(
        &self,
        op: &'static str,
        x: &Tensor,
        dims: [usize; 4],
        c: MemoryCategory,
    ) -> Result<Tensor>;

    // ---- strided views (layout ops) -------------------------------------------------------

    /// A contiguous copy of `view` of `x` (see [`StridedView`]): output of shape `view.dims`,
    /// element `(i0, .., ik) = x[view.offset + Σ i_j · view.strides[j]]`. Permutations of axes,
    /// basic slicing with steps, integer indexing and the VJP of a concatenation.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] naming `op` when the view does not lie inside `x`
    /// (checked with [`check_view`]); [`TensorError::ShapeOverflow`] for dims too large.
    fn gather_strided(
        &self,
        op: &'static str,
        x: &Tensor,
        view: &StridedView,
        c: MemoryCategory,
    ) -> Result<Tensor>;
    /// Writes the contiguous `src` into `view` of `dst` (adds it with `accumulate`), in place
    /// on `dst`'s buffer, in the view's row-major order (bumps `dst`'s version). The VJP of
    /// indexing (scatter into zeros) and the forward of a concatenation (each input into its
    /// slot).
    ///
    /// # Errors
    /// As [`Backend::gather_strided`] for a view outside `dst`; [`TensorError::LengthMismatch`]
    /// when `src` does not hold exactly the view's elements.
    fn scatter_strided(
        &self,
        op: &'static str,
        dst: &Tensor,
        src: &Tensor,
        view: &StridedView,
        accumulate: bool,
    ) -> Result<()>;

    // ---- embedding and loss ---------------------------------------------------------------

    /// Rows `ids` of `table [vocab, d]`: `[ids.len(), d]`.
    fn embedding(
        &self,
        op: &'static str,
        table: &Tensor,
        ids: &[u32],
        c: MemoryCategory,
    ) -> Result<Tensor>;
    /// The table gradient `[vocab, d]` (zeros plus each row of `g` added at its id, in order).
    fn embedding_backward(
        &self,
        op: &'static str,
        ids: &[u32],
        g: &Tensor,
        vocab: usize,
        c: MemoryCategory,
    ) -> Result<Tensor>;
    /// Mean cross-entropy of `logits [rows, vocab]` against `targets`: `(loss [], lse [rows])`.
    fn cross_entropy(
        &self,
        op: &'static str,
        logits: &Tensor,
        targets: &[u32],
        c: MemoryCategory,
    ) -> Result<Pair>;
    /// `dlogits` of the mean cross-entropy for the upstream scalar `g`.
    fn cross_entropy_backward(
        &self,
        op: &'static str,
        logits: &Tensor,
        targets: &[u32],
        lse: &Tensor,
        g: &Tensor,
        c: MemoryCategory,
    ) -> Result<Tensor>;

    /// The LM head and the mean cross-entropy fused over `x [rows, d]` and `w [vocab, d]`,
    /// computed `chunk_rows` rows at a time so that the `[rows, vocab]` logits and their
    /// gradient exist one chunk at a time (workspace memory): the loss `[]` (category `c`) and,
    /// for each `want_grads` (`[dx, dW]`) that is set, the loss's gradient `dx [rows, d]` /
    /// `dW [vocab, d]` for an upstream gradient of 1 (category gradient). See
    /// `riftco_kernels::linear_loss` for the math and its rounding.
    ///
    /// The default composes the other methods chunk by chunk ([`composed::linear_cross_entropy`]);
    /// the CPU's runs the fused kernel.
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
        composed::linear_cross_entropy(self, op, x, w, targets, chunk_rows, want_grads, c)
    }

    // ---- attention ------------------------------------------------------------------------

    /// FlashAttention-2 forward (Dao 2023, Algorithm 1): `(out, lse [batch, heads, seq_q])`.
    /// With `dropout`, `out = (P ⊙ M / (1 − p)) V` for the mask over the index space
    /// `[batch, heads, seq_q, seq_k]` (row-major, in either layout); `lse` is without dropout.
    /// `k` and `v` have `dims.n_kv_heads` heads (grouped-query attention: query head `h` reads
    /// key/value head `h / (n_heads / n_kv_heads)`, by index; callers validate that
    /// `n_kv_heads` divides `n_heads`). The backward returns `dk`, `dv` of `k`'s and `v`'s
    /// shapes, summed over each group's query heads in a fixed order.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] naming `op` and `p` for a `p` not finite in `[0, 1)`.
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
    ) -> Result<Pair>;
    /// FlashAttention-2 backward (Dao 2023, Algorithm 2): `(dq, dk, dv)`, for the forward's
    /// `out` and `lse` computed with the same `dropout` mask (regenerated, never stored).
    ///
    /// # Errors
    /// As [`Backend::flash_attention_forward`].
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
    ) -> Result<(Tensor, Tensor, Tensor)>;

    // ---- optimizer ------------------------------------------------------------------------

    /// One Adam/AdamW update at 1-based `step`, in place on `param`, `m` and `v` (bumps their
    /// versions).
    fn adam_update(
        &self,
        op: &'static str,
        param: &Tensor,
        grad: &Tensor,
        m: &Tensor,
        v: &Tensor,
        step: u64,
        hyper: AdamHyper,
    ) -> Result<()>;
}

/// The error of a backend without quantized buffers asked to hold a `format` tensor.
pub fn no_quantized_buffers(op: &'static str, device: Device, format: QuantFormat) -> TensorError {
    TensorError::InvalidArgument {
        op,
        message: format!(
            "device {device} cannot hold a tensor stored quantized ({format}): its backend \
             keeps float32 buffers only; dequantize the weights to float32 first \
             (set_frozen_weights_dtype(\"float32\")), or keep them quantized on the CPU or a \
             GPU device"
        ),
    }
}

/// `Ok` when `mask` (if any) has a drop probability finite and in `[0, 1)`.
///
/// # Errors
/// [`TensorError::InvalidArgument`] naming `op` and the value of `p`.
pub fn check_dropout(op: &'static str, mask: Option<&DropoutMask>) -> Result<()> {
    match mask {
        Some(m) if !DropoutMask::is_valid_p(m.p) => Err(TensorError::InvalidArgument {
            op,
            message: format!(
                "dropout probability p = {} is invalid: expected a finite p with 0 <= p < 1",
                m.p
            ),
        }),
        _ => Ok(()),
    }
}

/// `Ok` when `target`, which an in-place kernel overwrites while reading `inputs`, shares
/// storage with none of them and has as many elements as each.
///
/// # Errors
/// [`TensorError::InvalidArgument`] naming `op` when storage is shared;
/// [`TensorError::LengthMismatch`] when the element counts differ.
pub fn check_in_place_target(op: &'static str, target: &Tensor, inputs: &[&Tensor]) -> Result<()> {
    for t in inputs {
        if t.same_storage(target) {
            return Err(TensorError::InvalidArgument {
                op,
                message: "the tensor written in place shares its storage with an input".into(),
            });
        }
        if t.numel() != target.numel() {
            return Err(TensorError::LengthMismatch {
                op,
                shape: t.dims().to_vec(),
                expected: target.numel(),
                got: t.numel(),
            });
        }
    }
    Ok(())
}

/// `Ok` when `view` lies inside a tensor of `len` elements (every element it addresses is in
/// `0..len`, one stride per dimension) and its dims form a valid shape; returns that shape.
///
/// # Errors
/// [`TensorError::InvalidArgument`] naming `op`, the view and `len`;
/// [`TensorError::ShapeOverflow`].
pub fn check_view(op: &'static str, view: &StridedView, len: usize) -> Result<Shape> {
    if let Some(message) = view.check(len) {
        return Err(TensorError::InvalidArgument { op, message });
    }
    Shape::try_new(op, view.dims.clone())
}

static REGISTERED: RwLock<Vec<(Device, &'static dyn Backend)>> = RwLock::new(Vec::new());

/// Registers `backend` for its device (replacing an earlier registration; the CPU's cannot be
/// replaced). Backends live for the rest of the process.
///
/// # Errors
/// [`TensorError::InvalidArgument`] for a backend whose device is [`Device::Cpu`].
pub fn register(backend: Box<dyn Backend>) -> Result<&'static dyn Backend> {
    let device = backend.device();
    if device == Device::Cpu {
        return Err(TensorError::InvalidArgument {
            op: "backend::register",
            message: "the CPU backend is built in and cannot be replaced".into(),
        });
    }
    let backend: &'static dyn Backend = Box::leak(backend);
    let mut list = REGISTERED.write().unwrap_or_else(|e| e.into_inner());
    list.retain(|(d, _)| *d != device);
    list.push((device, backend));
    Ok(backend)
}

/// The backend of `device`.
///
/// # Errors
/// [`TensorError::DeviceUnavailable`] when no backend is registered for it (a GPU device until
/// `riftco_gpu::install` opened it; the message says how to register one).
pub fn for_device(device: Device) -> Result<&'static dyn Backend> {
    if device == Device::Cpu {
        return Ok(&cpu::CpuBackend);
    }
    let list = REGISTERED.read().unwrap_or_else(|e| e.into_inner());
    if let Some((_, b)) = list.iter().find(|(d, _)| *d == device) {
        return Ok(*b);
    }
    drop(list);
    let reason = match device {
        // Returned above; kept for an exhaustive match.
        Device::Cpu => "the CPU backend is built in".to_owned(),
        Device::PrivateUse1 => {
            "no backend is registered for it (Rust: riftco_tensor::backend::register; \
             the mirror test backend: riftco_tensor::backend::mirror::install, from \
             Python riftco._native._install_mirror_backend())"
                .to_owned()
        }
        Device::Metal if !cfg!(target_os = "macos") => "Metal exists only on macOS (wgpu's Metal \
             backend); on this platform use \"vulkan\" or \"cpu\""
            .to_owned(),
        Device::Metal | Device::Vulkan => format!(
            "the GPU backend is not open for it (Rust: riftco_gpu::install; moving a model there \
             with DecoderOnlyTransformer::to_device opens it); it needs a {} adapter",
            device.name()
        ),
    };
    Err(TensorError::DeviceUnavailable { device, reason })
}

/// Blocks until every operation issued on `device` so far has finished
/// ([`Backend::synchronize`]).
///
/// # Errors
/// [`TensorError::DeviceUnavailable`] as [`for_device`]; the backend's errors.
pub fn synchronize(device: Device) -> Result<()> {
    for_device(device)?.synchronize()
}

/// The devices with a registered backend (not the CPU's, which always exists), in
/// registration order.
pub fn registered_devices() -> Vec<Device> {
    let list = REGISTERED.read().unwrap_or_else(|e| e.into_inner());
    list.iter().map(|(d, _)| *d).collect()
}

/// The backend of the device all `tensors` live on.
///
/// # Errors
/// [`TensorError::DeviceMismatch`] naming `op` and the first two devices that differ;
/// [`TensorError::DeviceUnavailable`] as [`for_device`].
pub fn backend_of(op: &'static str, tensors: &[&Tensor]) -> Result<&'static dyn Backend> {
    backend_of_devices(op, tensors.iter().map(|t| t.device()))
}

/// [`backend_of`] for the devices of some operands (no slice of tensors needs to be built).
///
/// # Errors
/// As [`backend_of`].
pub fn backend_of_devices(
    op: &'static str,
    devices: impl IntoIterator<Item = Device>,
) -> Result<&'static dyn Backend> {
    let mut devices = devices.into_iter();
    let device = devices.next().unwrap_or(Device::Cpu);
    if let Some(other) = devices.find(|d| *d != device) {
        return Err(TensorError::DeviceMismatch {
            op,
            lhs: device,
            rhs: other,
        });
    }
    for_device(device)
}
