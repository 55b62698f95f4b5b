//! A test backend on [`Device::PrivateUse1`]: buffers of `u32` bit patterns ([`MirrorBuffer`]),
//! kernels that copy their operands to the host, run [`CpuBackend`] and copy the results back.
//!
//! It exists to prove the device seam: host access to its tensors
//! ([`Tensor::read`]) is an error, so an op that bypassed [`Backend`] fails on it, and one that
//! goes through it gives bitwise the CPU's result. [`kernel_calls`] counts the calls.
//! Register it with [`install`].
//!
//! Its host copies are real CPU tensors: while a kernel runs, the operands' and results' bytes
//! are counted in the CPU's memory counters too (workspace for operands, the result's category
//! for results), so CPU peaks measured around mirror work include them. Its tensors themselves
//! are counted on [`Device::PrivateUse1`] only.

use super::cpu::CpuBackend;
use super::{
    AdamHyper, AttentionDims, AttentionLayout, Backend, BinaryOp, DropoutMask, LossAndGradients,
    MatmulSpec, Pair, ReduceOp, RopeTable, StridedView, UnaryOp,
};
use crate::storage::{Buffer, DeviceBuffer};
use crate::{Device, MemoryCategory, Result, Shape, Tensor, TensorError};
use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};

static KERNEL_CALLS: AtomicUsize = AtomicUsize::new(0);

/// Kernel calls (every trait method except memory and transfers) made on the mirror backend
/// since the process started.
pub fn kernel_calls() -> usize {
    KERNEL_CALLS.load(Ordering::Relaxed)
}

/// Registers [`MirrorBackend`] for [`Device::PrivateUse1`] (once; later calls do nothing).
pub fn install() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        // Only the CPU's registration can be refused.
        let _ = super::register(Box::new(MirrorBackend));
    });
}

/// The elements as `f32` bit patterns: a buffer type no CPU kernel can read.
#[derive(Debug)]
pub struct MirrorBuffer(Vec<u32>);

impl DeviceBuffer for MirrorBuffer {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// The mirror backend (see the [module documentation](self)).
#[derive(Clone, Copy, Debug, Default)]
pub struct MirrorBackend;

fn foreign(op: &'static str) -> TensorError {
    TensorError::InvalidArgument {
        op,
        message: "not a buffer of the mirror backend".into(),
    }
}

impl MirrorBackend {
    /// A host copy of a mirror tensor (workspace memory).
    fn host(&self, op: &'static str, t: &Tensor) -> Result<Tensor> {
        let data = self.download(op, &t.buffer())?;
        Tensor::from_vec(data, t.shape().clone(), MemoryCategory::Workspace)
    }

    /// A mirror tensor holding a host tensor's elements, in the host tensor's category.
    fn dev(&self, op: &'static str, t: Tensor) -> Result<Tensor> {
        let buffer = self.upload(op, &t.read()?)?;
        Tensor::from_buffer(buffer, t.shape().clone(), Device::PrivateUse1, t.category())
    }

    /// One kernel call: host copies of `inputs`, the CPU kernel `f` on them, its results
    /// uploaded.
    fn run<R: Results>(
        &self,
        op: &'static str,
        inputs: &[&Tensor],
        f: impl FnOnce(&[Tensor]) -> Result<R>,
    ) -> Result<R> {
        KERNEL_CALLS.fetch_add(1, Ordering::Relaxed);
        let hosts = inputs
            .iter()
            .map(|t| self.host(op, t))
            .collect::<Result<Vec<_>>>()?;
        f(&hosts)?.upload(self, op)
    }

    /// One in-place kernel call: host copies of `dsts` and `inputs`, the CPU kernel `f` on them,
    /// the destinations' new elements written back (bumping their versions).
    fn run_in_place(
        &self,
        op: &'static str,
        dsts: &[&Tensor],
        inputs: &[&Tensor],
        f: impl FnOnce(&[Tensor], &[Tensor]) -> Result<()>,
    ) -> Result<()> {
        KERNEL_CALLS.fetch_add(1, Ordering::Relaxed);
        let host = |ts: &[&Tensor]| {
            ts.iter()
                .map(|t| self.host(op, t))
                .collect::<Result<Vec<_>>>()
        };
        let (hd, hi) = (host(dsts)?, host(inputs)?);
        f(&hd, &hi)?;
        for (dst, src) in dsts.iter().zip(&hd) {
            let bits = src.read()?.iter().map(|v| v.to_bits()).collect();
            let mut guard = dst.buffer_mut();
            match guard.as_mut() {
                Some(b) => *b = MirrorBuffer(bits),
                None => return Err(foreign(op)),
            }
        }
        Ok(())
    }
}

/// Kernel results a [`MirrorBackend`] uploads (a tensor, a pair, ...).
trait Results: Sized {
    fn upload(self, m: &MirrorBackend, op: &'static str) -> Result<Self>;
}

impl Results for Tensor {
    fn upload(self, m: &MirrorBackend, op: &'static str) -> Result<Self> {
        m.dev(op, self)
    }
}

impl Results for (Tensor, Tensor) {
    fn upload(self, m: &MirrorBackend, op: &'static str) -> Result<Self> {
        Ok((m.dev(op, self.0)?, m.dev(op, self.1)?))
    }
}

impl Results for (Tensor, Option<Tensor>) {
    fn upload(self, m: &MirrorBackend, op: &'static str) -> Result<Self> {
        Ok((
            m.dev(op, self.0)?,
            self.1.map(|t| m.dev(op, t)).transpose()?,
        ))
    }
}

impl Results for LossAndGradients {
    fn upload(self, m: &MirrorBackend, op: &'static str) -> Result<Self> {
        let dev = |t: Option<Tensor>| t.map(|t| m.dev(op, t)).transpose();
        Ok(LossAndGradients {
            loss: m.dev(op, self.loss)?,
            d_first: dev(self.d_first)?,
            d_second: dev(self.d_second)?,
        })
    }
}

impl Results for (Tensor, Tensor, Tensor) {
    fn upload(self, m: &MirrorBackend, op: &'static str) -> Result<Self> {
        Ok((m.dev(op, self.0)?, m.dev(op, self.1)?, m.dev(op, self.2)?))
    }
}

trait MirrorAccess {
    fn as_mut(&mut self) -> Option<&mut MirrorBuffer>;
}

impl MirrorAccess for Buffer {
    fn as_mut(&mut self) -> Option<&mut MirrorBuffer> {
        match self {
            Buffer::Device(b) => b.as_any_mut().downcast_mut(),
            Buffer::Host(_) | Buffer::Half(..) | Buffer::Quantized(_) | Buffer::Placeholder(_) => {
                None
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
impl Backend for MirrorBackend {
    fn device(&self) -> Device {
        Device::PrivateUse1
    }

    fn alloc(&self, op: &'static str, numel: usize, fill: Option<f32>) -> Result<Buffer> {
        let bits = fill.unwrap_or(f32::NAN).to_bits();
        let v = crate::alloc::try_vec_with_capacity(op, numel).map(|mut v: Vec<u32>| {
            v.resize(numel, bits);
            v
        })?;
        Ok(Buffer::Device(Box::new(MirrorBuffer(v))))
    }

    fn upload(&self, op: &'static str, data: &[f32]) -> Result<Buffer> {
        let mut v: Vec<u32> = crate::alloc::try_vec_with_capacity(op, data.len())?;
        v.extend(data.iter().map(|x| x.to_bits()));
        Ok(Buffer::Device(Box::new(MirrorBuffer(v))))
    }

    fn download(&self, op: &'static str, buffer: &Buffer) -> Result<Vec<f32>> {
        let b = match buffer {
            Buffer::Device(b) => b,
            Buffer::Placeholder(_) => return Err(TensorError::NoData { op }),
            Buffer::Host(_) | Buffer::Half(..) | Buffer::Quantized(_) => return Err(foreign(op)),
        };
        let m: &MirrorBuffer = b.as_any().downcast_ref().ok_or_else(|| foreign(op))?;
        let mut out = crate::alloc::try_vec_with_capacity(op, m.0.len())?;
        out.extend(m.0.iter().map(|&b| f32::from_bits(b)));
        Ok(out)
    }

    fn copy(&self, op: &'static str, src: &Tensor, c: MemoryCategory) -> Result<Tensor> {
        let data = self.download(op, &src.buffer())?;
        let buffer = self.upload(op, &data)?;
        Tensor::from_buffer(buffer, src.shape().clone(), Device::PrivateUse1, c)
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
        self.run_in_place(op, &[dst], &[src], |d, s| {
            CpuBackend.copy_range(op, &d[0], dst_offset, &s[0], src_offset, len)
        })
    }

    fn add(&self, op: &'static str, a: &Tensor, b: &Tensor, c: MemoryCategory) -> Result<Tensor> {
        self.run(op, &[a, b], |h| CpuBackend.add(op, &h[0], &h[1], c))
    }

    fn mul(&self, op: &'static str, a: &Tensor, b: &Tensor, c: MemoryCategory) -> Result<Tensor> {
        self.run(op, &[a, b], |h| CpuBackend.mul(op, &h[0], &h[1], c))
    }

    fn scale(&self, op: &'static str, x: &Tensor, alpha: f32, c: MemoryCategory) -> Result<Tensor> {
        self.run(op, &[x], |h| CpuBackend.scale(op, &h[0], alpha, c))
    }

    fn add_assign(&self, op: &'static str, dst: &Tensor, src: &Tensor) -> Result<()> {
        self.run_in_place(op, &[dst], &[src], |d, s| {
            CpuBackend.add_assign(op, &d[0], &s[0])
        })
    }

    fn axpy(&self, op: &'static str, alpha: f32, x: &Tensor, dst: &Tensor) -> Result<()> {
        self.run_in_place(op, &[dst], &[x], |d, s| {
            CpuBackend.axpy(op, alpha, &s[0], &d[0])
        })
    }

    fn sum(&self, op: &'static str, x: &Tensor, c: MemoryCategory) -> Result<Tensor> {
        self.run(op, &[x], |h| CpuBackend.sum(op, &h[0], c))
    }

    fn unary(
        &self,
        op: &'static str,
        kind: UnaryOp,
        x: &Tensor,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        self.run(op, &[x], |h| CpuBackend.unary(op, kind, &h[0], c))
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
        self.run(op, &[x, y, dy], |h| {
            CpuBackend.unary_backward(op, kind, &h[0], &h[1], &h[2], c)
        })
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
        self.run(op, &[a, b], |h| {
            CpuBackend.binary(op, kind, &h[0], &h[1], out_shape, c)
        })
    }

    fn reduce(
        &self,
        op: &'static str,
        kind: ReduceOp,
        x: &Tensor,
        out_shape: Shape,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        self.run(op, &[x], |h| {
            CpuBackend.reduce(op, kind, &h[0], out_shape, c)
        })
    }

    fn silu(&self, op: &'static str, x: &Tensor, c: MemoryCategory) -> Result<Tensor> {
        self.run(op, &[x], |h| CpuBackend.silu(op, &h[0], c))
    }

    fn silu_backward(
        &self,
        op: &'static str,
        x: &Tensor,
        g: &Tensor,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        self.run(op, &[x, g], |h| {
            CpuBackend.silu_backward(op, &h[0], &h[1], c)
        })
    }

    fn swiglu(
        &self,
        op: &'static str,
        gate: &Tensor,
        up: &Tensor,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        self.run(op, &[gate, up], |h| CpuBackend.swiglu(op, &h[0], &h[1], c))
    }

    fn swiglu_backward(
        &self,
        op: &'static str,
        gate: &Tensor,
        up: &Tensor,
        g: &Tensor,
        c: MemoryCategory,
    ) -> Result<Pair> {
        self.run(op, &[gate, up, g], |h| {
            CpuBackend.swiglu_backward(op, &h[0], &h[1], &h[2], c)
        })
    }

    fn swiglu_backward_in_place(
        &self,
        op: &'static str,
        gate: &Tensor,
        up: &Tensor,
        g: &Tensor,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        super::check_in_place_target(op, g, &[gate, up])?;
        let mut du = None;
        self.run_in_place(op, &[g], &[gate, up], |d, s| {
            du = Some(CpuBackend.swiglu_backward_in_place(op, &s[0], &s[1], &d[0], c)?);
            Ok(())
        })?;
        match du {
            Some(du) => self.dev(op, du),
            None => Err(foreign(op)),
        }
    }

    fn rms_norm(
        &self,
        op: &'static str,
        x: &Tensor,
        weight: &Tensor,
        eps: f32,
        c: MemoryCategory,
    ) -> Result<Pair> {
        self.run(op, &[x, weight], |h| {
            CpuBackend.rms_norm(op, &h[0], &h[1], eps, c)
        })
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
        self.run(op, &[x, weight, rstd, g], |h| {
            CpuBackend.rms_norm_backward(op, &h[0], &h[1], &h[2], &h[3], weight_grad, c)
        })
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
        self.run(op, &[x], |h| {
            CpuBackend.rope(op, &h[0], table, seq, heads, start_pos, inverse, c)
        })
    }

    fn softmax(
        &self,
        op: &'static str,
        x: &Tensor,
        cols: usize,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        self.run(op, &[x], |h| CpuBackend.softmax(op, &h[0], cols, c))
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
        self.run(op, &[y, g], |h| {
            CpuBackend.softmax_backward(op, &h[0], &h[1], cols, scale, c)
        })
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
        self.run(op, &[scores], |h| {
            CpuBackend.causal_softmax(op, &h[0], dims, scale, causal, c)
        })
    }

    fn dropout(
        &self,
        op: &'static str,
        x: &Tensor,
        mask: &DropoutMask,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        self.run(op, &[x], |h| CpuBackend.dropout(op, &h[0], mask, c))
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
        self.run(op, &[a, b], |h| {
            CpuBackend.matmul(op, spec, &h[0], &h[1], shape, c)
        })
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
        self.run(op, &[a, b], |h| {
            CpuBackend.batched_matmul(op, batch, spec, &h[0], &h[1], shape, c)
        })
    }

    fn transpose_0213(
        &self,
        op: &'static str,
        x: &Tensor,
        dims: [usize; 4],
        c: MemoryCategory,
    ) -> Result<Tensor> {
        self.run(op, &[x], |h| CpuBackend.transpose_0213(op, &h[0], dims, c))
    }

    fn gather_strided(
        &self,
        op: &'static str,
        x: &Tensor,
        view: &StridedView,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        self.run(op, &[x], |h| CpuBackend.gather_strided(op, &h[0], view, c))
    }

    fn scatter_strided(
        &self,
        op: &'static str,
        dst: &Tensor,
        src: &Tensor,
        view: &StridedView,
        accumulate: bool,
    ) -> Result<()> {
        self.run_in_place(op, &[dst], &[src], |d, s| {
            CpuBackend.scatter_strided(op, &d[0], &s[0], view, accumulate)
        })
    }

    fn embedding(
        &self,
        op: &'static str,
        table: &Tensor,
        ids: &[u32],
        c: MemoryCategory,
    ) -> Result<Tensor> {
        self.run(op, &[table], |h| CpuBackend.embedding(op, &h[0], ids, c))
    }

    fn embedding_backward(
        &self,
        op: &'static str,
        ids: &[u32],
        g: &Tensor,
        vocab: usize,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        self.run(op, &[g], |h| {
            CpuBackend.embedding_backward(op, ids, &h[0], vocab, c)
        })
    }

    fn cross_entropy(
        &self,
        op: &'static str,
        logits: &Tensor,
        targets: &[u32],
        c: MemoryCategory,
    ) -> Result<Pair> {
        self.run(op, &[logits], |h| {
            CpuBackend.cross_entropy(op, &h[0], targets, c)
        })
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
        self.run(op, &[logits, lse, g], |h| {
            CpuBackend.cross_entropy_backward(op, &h[0], targets, &h[1], &h[2], c)
        })
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
        self.run(op, &[x, w], |h| {
            CpuBackend.linear_cross_entropy(op, &h[0], &h[1], targets, chunk_rows, want_grads, c)
        })
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
        self.run(op, &[q, k, v], |h| {
            CpuBackend.flash_attention_forward(
                op, &h[0], &h[1], &h[2], dims, layout, scale, causal, dropout, c,
            )
        })
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
        self.run(op, &[q, k, v, out, lse, g], |h| {
            CpuBackend.flash_attention_backward(
                op, &h[0], &h[1], &h[2], &h[3], &h[4], &h[5], dims, layout, scale, causal, dropout,
                c,
            )
        })
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
        self.run_in_place(op, &[param, m, v], &[grad], |d, g| {
            CpuBackend.adam_update(op, &d[0], &g[0], &d[1], &d[2], step, hyper)
        })
    }
}
