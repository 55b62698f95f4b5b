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
use super::{AdamHyper, AttentionDims, AttentionLayout, Backend, MatmulSpec, Pair, RopeTable};
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
    fn count(&self) {
        KERNEL_CALLS.fetch_add(1, Ordering::Relaxed);
    }

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

    fn dev2(&self, op: &'static str, (a, b): Pair) -> Result<Pair> {
        Ok((self.dev(op, a)?, self.dev(op, b)?))
    }

    /// Writes the elements of host tensor `src` back into mirror tensor `dst` (bumps its version).
    fn write_back(&self, op: &'static str, dst: &Tensor, src: &Tensor) -> Result<()> {
        let bits = src.read()?.iter().map(|v| v.to_bits()).collect();
        let mut guard = dst.buffer_mut();
        match guard.as_mut() {
            Some(b) => {
                *b = MirrorBuffer(bits);
                Ok(())
            }
            None => Err(foreign(op)),
        }
    }
}

trait MirrorAccess {
    fn as_mut(&mut self) -> Option<&mut MirrorBuffer>;
}

impl MirrorAccess for Buffer {
    fn as_mut(&mut self) -> Option<&mut MirrorBuffer> {
        match self {
            Buffer::Device(b) => b.as_any_mut().downcast_mut(),
            Buffer::Host(_) => None,
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
        let Buffer::Device(b) = buffer else {
            return Err(foreign(op));
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
        self.count();
        let (hd, hs) = (self.host(op, dst)?, self.host(op, src)?);
        CpuBackend.copy_range(op, &hd, dst_offset, &hs, src_offset, len)?;
        self.write_back(op, dst, &hd)
    }

    fn add(&self, op: &'static str, a: &Tensor, b: &Tensor, c: MemoryCategory) -> Result<Tensor> {
        self.count();
        let r = CpuBackend.add(op, &self.host(op, a)?, &self.host(op, b)?, c)?;
        self.dev(op, r)
    }

    fn mul(&self, op: &'static str, a: &Tensor, b: &Tensor, c: MemoryCategory) -> Result<Tensor> {
        self.count();
        let r = CpuBackend.mul(op, &self.host(op, a)?, &self.host(op, b)?, c)?;
        self.dev(op, r)
    }

    fn scale(&self, op: &'static str, x: &Tensor, alpha: f32, c: MemoryCategory) -> Result<Tensor> {
        self.count();
        let r = CpuBackend.scale(op, &self.host(op, x)?, alpha, c)?;
        self.dev(op, r)
    }

    fn add_assign(&self, op: &'static str, dst: &Tensor, src: &Tensor) -> Result<()> {
        self.count();
        let (hd, hs) = (self.host(op, dst)?, self.host(op, src)?);
        CpuBackend.add_assign(op, &hd, &hs)?;
        self.write_back(op, dst, &hd)
    }

    fn axpy(&self, op: &'static str, alpha: f32, x: &Tensor, dst: &Tensor) -> Result<()> {
        self.count();
        let (hd, hx) = (self.host(op, dst)?, self.host(op, x)?);
        CpuBackend.axpy(op, alpha, &hx, &hd)?;
        self.write_back(op, dst, &hd)
    }

    fn sum(&self, op: &'static str, x: &Tensor, c: MemoryCategory) -> Result<Tensor> {
        self.count();
        let r = CpuBackend.sum(op, &self.host(op, x)?, c)?;
        self.dev(op, r)
    }

    fn silu(&self, op: &'static str, x: &Tensor, c: MemoryCategory) -> Result<Tensor> {
        self.count();
        let r = CpuBackend.silu(op, &self.host(op, x)?, c)?;
        self.dev(op, r)
    }

    fn silu_backward(
        &self,
        op: &'static str,
        x: &Tensor,
        g: &Tensor,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        self.count();
        let r = CpuBackend.silu_backward(op, &self.host(op, x)?, &self.host(op, g)?, c)?;
        self.dev(op, r)
    }

    fn swiglu(
        &self,
        op: &'static str,
        gate: &Tensor,
        up: &Tensor,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        self.count();
        let r = CpuBackend.swiglu(op, &self.host(op, gate)?, &self.host(op, up)?, c)?;
        self.dev(op, r)
    }

    fn swiglu_backward(
        &self,
        op: &'static str,
        gate: &Tensor,
        up: &Tensor,
        g: &Tensor,
        c: MemoryCategory,
    ) -> Result<Pair> {
        self.count();
        let (hg, hu, hgr) = (self.host(op, gate)?, self.host(op, up)?, self.host(op, g)?);
        let r = CpuBackend.swiglu_backward(op, &hg, &hu, &hgr, c)?;
        self.dev2(op, r)
    }

    fn rms_norm(
        &self,
        op: &'static str,
        x: &Tensor,
        weight: &Tensor,
        eps: f32,
        c: MemoryCategory,
    ) -> Result<Pair> {
        self.count();
        let r = CpuBackend.rms_norm(op, &self.host(op, x)?, &self.host(op, weight)?, eps, c)?;
        self.dev2(op, r)
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
        self.count();
        let (hx, hw) = (self.host(op, x)?, self.host(op, weight)?);
        let (hr, hg) = (self.host(op, rstd)?, self.host(op, g)?);
        let (dx, dw) = CpuBackend.rms_norm_backward(op, &hx, &hw, &hr, &hg, weight_grad, c)?;
        Ok((
            self.dev(op, dx)?,
            dw.map(|dw| self.dev(op, dw)).transpose()?,
        ))
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
        self.count();
        let hx = self.host(op, x)?;
        let r = CpuBackend.rope(op, &hx, table, seq, heads, start_pos, inverse, c)?;
        self.dev(op, r)
    }

    fn softmax(
        &self,
        op: &'static str,
        x: &Tensor,
        cols: usize,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        self.count();
        let r = CpuBackend.softmax(op, &self.host(op, x)?, cols, c)?;
        self.dev(op, r)
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
        self.count();
        let (hy, hg) = (self.host(op, y)?, self.host(op, g)?);
        let r = CpuBackend.softmax_backward(op, &hy, &hg, cols, scale, c)?;
        self.dev(op, r)
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
        self.count();
        let r = CpuBackend.causal_softmax(op, &self.host(op, scores)?, dims, scale, causal, c)?;
        self.dev(op, r)
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
        self.count();
        let (ha, hb) = (self.host(op, a)?, self.host(op, b)?);
        let r = CpuBackend.matmul(op, spec, &ha, &hb, shape, c)?;
        self.dev(op, r)
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
        self.count();
        let (ha, hb) = (self.host(op, a)?, self.host(op, b)?);
        let r = CpuBackend.batched_matmul(op, batch, spec, &ha, &hb, shape, c)?;
        self.dev(op, r)
    }

    fn transpose_0213(
        &self,
        op: &'static str,
        x: &Tensor,
        dims: [usize; 4],
        c: MemoryCategory,
    ) -> Result<Tensor> {
        self.count();
        let r = CpuBackend.transpose_0213(op, &self.host(op, x)?, dims, c)?;
        self.dev(op, r)
    }

    fn embedding(
        &self,
        op: &'static str,
        table: &Tensor,
        ids: &[u32],
        c: MemoryCategory,
    ) -> Result<Tensor> {
        self.count();
        let r = CpuBackend.embedding(op, &self.host(op, table)?, ids, c)?;
        self.dev(op, r)
    }

    fn embedding_backward(
        &self,
        op: &'static str,
        ids: &[u32],
        g: &Tensor,
        vocab: usize,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        self.count();
        let r = CpuBackend.embedding_backward(op, ids, &self.host(op, g)?, vocab, c)?;
        self.dev(op, r)
    }

    fn cross_entropy(
        &self,
        op: &'static str,
        logits: &Tensor,
        targets: &[u32],
        c: MemoryCategory,
    ) -> Result<Pair> {
        self.count();
        let r = CpuBackend.cross_entropy(op, &self.host(op, logits)?, targets, c)?;
        self.dev2(op, r)
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
        self.count();
        let (hl, hs, hg) = (
            self.host(op, logits)?,
            self.host(op, lse)?,
            self.host(op, g)?,
        );
        let r = CpuBackend.cross_entropy_backward(op, &hl, targets, &hs, &hg, c)?;
        self.dev(op, r)
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
        c: MemoryCategory,
    ) -> Result<Pair> {
        self.count();
        let (hq, hk, hv) = (self.host(op, q)?, self.host(op, k)?, self.host(op, v)?);
        let r = CpuBackend
            .flash_attention_forward(op, &hq, &hk, &hv, dims, layout, scale, causal, c)?;
        self.dev2(op, r)
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
        c: MemoryCategory,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        self.count();
        let (hq, hk, hv) = (self.host(op, q)?, self.host(op, k)?, self.host(op, v)?);
        let (ho, hl, hg) = (self.host(op, out)?, self.host(op, lse)?, self.host(op, g)?);
        let (dq, dk, dv) = CpuBackend.flash_attention_backward(
            op, &hq, &hk, &hv, &ho, &hl, &hg, dims, layout, scale, causal, c,
        )?;
        Ok((self.dev(op, dq)?, self.dev(op, dk)?, self.dev(op, dv)?))
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
        self.count();
        let (hp, hg) = (self.host(op, param)?, self.host(op, grad)?);
        let (hm, hv) = (self.host(op, m)?, self.host(op, v)?);
        CpuBackend.adam_update(op, &hp, &hg, &hm, &hv, step, hyper)?;
        self.write_back(op, param, &hp)?;
        self.write_back(op, m, &hm)?;
        self.write_back(op, v, &hv)
    }
}
