//! Kernels: each validates its sizes on the host, allocates its output from the pool and
//! records one compute pass (or a few) into the context's pending encoder. Nothing here waits
//! for the GPU; [`crate::GpuContext::download`] does.
//!
//! All buffers are f32, row-major, contiguous. Shapes are given by the caller as element counts
//! (`rows`, `cols`, `m`, `k`, `n`); a buffer whose length disagrees is a [`GpuError::Shape`]
//! naming both numbers.

mod elementwise;
mod matmul;
mod reduce;
mod softmax;
mod strided;
mod unary;
mod unary_backward;

pub use elementwise::{add, mul, scale};
pub use matmul::{batched_matmul, matmul, matmul_into};
pub use reduce::{reduce_rows, sum, sum_rows, SUM_BLOCK};
pub use softmax::softmax_rows;
pub use strided::{
    axpy, binary, binary_code, copy, copy_range, fill, gather, reduce_axes, scatter,
};
pub use unary::{unary, unary_code};
pub use unary_backward::unary_backward;

use crate::error::{GpuError, Result};
use crate::pipelines::Kernel;
use crate::pool::GpuBuffer;
use crate::GpuContext;

/// Invocations per workgroup of the 1-D kernels (elementwise, unary).
pub(crate) const WG_1D: u32 = 256;
/// The most workgroups along one grid dimension (WebGPU's default limit).
pub(crate) const MAX_GROUPS: u32 = 65_535;

/// Little-endian bytes of 32-bit parameter words (a WGSL uniform struct of u32/f32 fields).
pub(crate) fn words(w: &[u32]) -> Vec<u8> {
    w.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A count as u32 (the shaders index with u32).
pub(crate) fn to_u32(op: &'static str, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| GpuError::Shape {
        op,
        message: format!("{what} = {v} exceeds the 32-bit index range of the shaders"),
    })
}

/// The 2-D grid of a 1-D kernel over `n` elements: `x · y` workgroups of [`WG_1D`], `x` at
/// most [`MAX_GROUPS`] (the shader flattens `gid.x + gid.y · x · 256`).
pub(crate) fn grid_1d(op: &'static str, n: usize) -> Result<[u32; 3]> {
    let groups = n.div_ceil(WG_1D as usize).max(1);
    let x = groups.min(MAX_GROUPS as usize);
    let y = groups.div_ceil(x);
    if y > MAX_GROUPS as usize {
        return Err(GpuError::Shape {
            op,
            message: format!("{n} elements exceed one dispatch ({MAX_GROUPS}² workgroups)"),
        });
    }
    Ok([x as u32, y as u32, 1])
}

/// `len` must equal `expected` (`what` names the operand).
pub(crate) fn expect_len(
    op: &'static str,
    what: &str,
    buf: &GpuBuffer,
    expected: usize,
) -> Result<()> {
    if buf.len() != expected {
        return Err(GpuError::Shape {
            op,
            message: format!("{what} has {} values, expected {expected}", buf.len()),
        });
    }
    Ok(())
}

/// Record one dispatch of `kernel`: `storage` bound at bindings `0..storage.len()` (the last
/// one is written), `params` as a uniform at binding `storage.len()`.
///
/// # Errors
/// As [`dispatch_at`].
pub(crate) fn dispatch(
    ctx: &GpuContext,
    kernel: Kernel,
    storage: &[&GpuBuffer],
    params: &[u8],
    groups: [u32; 3],
) -> Result<()> {
    let numbered: Vec<(u32, &GpuBuffer)> = storage
        .iter()
        .enumerate()
        .map(|(i, b)| (i as u32, *b))
        .collect();
    dispatch_at(ctx, kernel, &numbered, storage.len() as u32, params, groups)
}

/// Record one dispatch of `kernel` with explicit binding numbers: each `(binding, buffer)` of
/// `storage` (the last one is written) and `params` as a uniform at `params_binding`.
///
/// # Errors
/// [`GpuError::ForeignBuffer`] for a buffer of another context; [`GpuError::Shape`] when the
/// written buffer is also an input (no aliasing within one dispatch); wgpu errors caught in
/// the scope.
pub(crate) fn dispatch_at(
    ctx: &GpuContext,
    kernel: Kernel,
    storage: &[(u32, &GpuBuffer)],
    params_binding: u32,
    params: &[u8],
    groups: [u32; 3],
) -> Result<()> {
    for (binding, b) in storage {
        ctx.check_owner(kernel.entry, &format!("the buffer at binding {binding}"), b)?;
    }
    if let Some(((_, out), inputs)) = storage.split_last() {
        if inputs.iter().any(|(_, b)| b.raw() == out.raw()) {
            return Err(GpuError::Shape {
                op: kernel.entry,
                message: "the output buffer is also an input".to_owned(),
            });
        }
    }
    let uniform = ctx.uniform(params)?;
    ctx.scoped(
        || {
            format!(
                "dispatching {} of {}",
                kernel.entry,
                kernel.family.file_name()
            )
        },
        || {
            let device = ctx.device();
            let pipeline = ctx.pipelines.get(device, kernel);
            let layout = pipeline.get_bind_group_layout(0);
            let mut entries: Vec<wgpu::BindGroupEntry<'_>> = storage
                .iter()
                .map(|(binding, b)| wgpu::BindGroupEntry {
                    binding: *binding,
                    resource: b.binding(),
                })
                .collect();
            entries.push(wgpu::BindGroupEntry {
                binding: params_binding,
                resource: uniform.as_entire_binding(),
            });
            let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(kernel.entry),
                layout: &layout,
                entries: &entries,
            });
            ctx.record(|enc| {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some(kernel.entry),
                    timestamp_writes: None,
                });
                pass.set_pipeline(&pipeline);
                pass.set_bind_group(0, &bind_group, &[]);
                pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
            });
        },
    )?;
    ctx.count_dispatch()
}

// Transformer ops (one file per family), beside the foundation's kernels above.
mod activation;
mod adam;
mod embedding;
mod loss;
mod masked_softmax;
mod rms_norm;
mod rope;
mod shape;

pub use activation::{silu, silu_backward, swiglu, swiglu_backward, swiglu_backward_in_place};
pub use adam::adam_update;
pub use embedding::{embedding, embedding_backward};
pub use loss::{cross_entropy, cross_entropy_backward, cross_entropy_backward_by};
pub use masked_softmax::{
    causal_softmax_rows, causal_softmax_rows_backward, softmax_rows_backward,
};
pub use rms_norm::{rms_norm, rms_norm_backward};
pub use rope::{rope, GpuRopeTable};
mod flash_attention;
pub use flash_attention::{
    flash_attention_backward, flash_attention_backward_with_dropout, flash_attention_forward,
    flash_attention_forward_with_dropout, FLASH_MAX_D_HEAD,
};
mod dropout;
pub use dropout::{dropout, philox4x32_10_blocks};
mod dequantize;
pub use dequantize::{
    dequantize, dequantize_into, gather_rows, quantized_entry_points, quantized_matvec,
    GpuQuantized,
};
