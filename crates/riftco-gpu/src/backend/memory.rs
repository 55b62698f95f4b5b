//! Memory and transfers of the GPU backend: allocation (filled by a kernel), host↔device
//! copies (an upload is recorded in the pending command stream; a download submits it and
//! waits, the one place the backend synchronises), device copies.

use riftco_tensor::storage::Buffer;
use riftco_tensor::{MemoryCategory, Result, Tensor};

use super::GpuBackend;
use crate::kernels;
use crate::GpuBuffer;

fn wrap(b: GpuBuffer) -> Buffer {
    Buffer::Device(Box::new(b))
}

pub(super) fn alloc(
    g: &GpuBackend,
    op: &'static str,
    n: usize,
    fill: Option<f32>,
) -> Result<Buffer> {
    let buf = match fill {
        Some(v) => kernels::fill(&g.ctx, n, v),
        None => g.ctx.alloc(n),
    };
    buf.map(wrap).map_err(g.err(op))
}

pub(super) fn upload(g: &GpuBackend, op: &'static str, data: &[f32]) -> Result<Buffer> {
    g.ctx.upload(data).map(wrap).map_err(g.err(op))
}

pub(super) fn download(g: &GpuBackend, op: &'static str, buffer: &Buffer) -> Result<Vec<f32>> {
    match buffer {
        Buffer::Device(b) => match b.as_any().downcast_ref::<GpuBuffer>() {
            Some(gb) => g.ctx.download(gb).map_err(g.err(op)),
            None => Err(g.foreign(op, buffer)),
        },
        _ => Err(g.foreign(op, buffer)),
    }
}

pub(super) fn copy(
    g: &GpuBackend,
    op: &'static str,
    src: &Tensor,
    c: MemoryCategory,
) -> Result<Tensor> {
    let r = g.read(op, &[src])?;
    let out = kernels::copy(&g.ctx, r.get(0)).map_err(g.err(op))?;
    g.tensor(out, src.shape().clone(), c)
}

pub(super) fn copy_range(
    g: &GpuBackend,
    op: &'static str,
    dst: &Tensor,
    dst_offset: usize,
    src: &Tensor,
    src_offset: usize,
    len: usize,
) -> Result<()> {
    // The CPU backend's range errors, before anything is recorded.
    let bad =
        |what: &'static str, offset: usize, n: usize| riftco_tensor::TensorError::IndexOutOfRange {
            op,
            what,
            index: offset.saturating_add(len),
            bound: n + 1,
        };
    if src_offset.checked_add(len).is_none_or(|e| e > src.numel()) {
        return Err(bad("source end", src_offset, src.numel()));
    }
    if dst_offset.checked_add(len).is_none_or(|e| e > dst.numel()) {
        return Err(bad("destination end", dst_offset, dst.numel()));
    }
    // `in_place` copies a source sharing the destination's storage first, so the ranges may
    // overlap.
    g.in_place(op, dst, src, |s, d| {
        kernels::copy_range(&g.ctx, s, src_offset, d, dst_offset, len)
    })
}
