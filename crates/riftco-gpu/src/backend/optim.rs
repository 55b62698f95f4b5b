//! Adam / AdamW of the GPU backend (`kernels::adam_update`), in place on the parameter and
//! both moments under their write guards (which bump their versions).

use riftco_tensor::backend::AdamHyper;
use riftco_tensor::storage::Buffer;
use riftco_tensor::{Result, Tensor, TensorError};

use super::GpuBackend;
use crate::{kernels, GpuBuffer};

#[allow(clippy::too_many_arguments)]
pub(super) fn adam_update(
    g: &GpuBackend,
    op: &'static str,
    param: &Tensor,
    grad: &Tensor,
    m: &Tensor,
    v: &Tensor,
    step: u64,
    hyper: AdamHyper,
) -> Result<()> {
    let named = [("param", param), ("m", m), ("v", v)];
    for (i, (a, ta)) in named.iter().enumerate() {
        for (b, tb) in &named[i + 1..] {
            if ta.same_storage(tb) {
                return Err(TensorError::InvalidArgument {
                    op,
                    message: format!("{a} and {b} share one buffer; expected three distinct ones"),
                });
            }
        }
    }
    // A gradient sharing a written buffer is read from a copy (a kernel cannot read and write
    // one buffer, and the write guard excludes the read guard).
    let copy;
    let reads;
    let grad_buf: &GpuBuffer = if named.iter().any(|(_, t)| t.same_storage(grad)) {
        let r = g.read(op, &[grad])?;
        copy = kernels::copy(&g.ctx, r.get(0)).map_err(g.err(op))?;
        &copy
    } else {
        reads = g.read(op, &[grad])?;
        reads.get(0)
    };
    let guards = [param.buffer_mut(), m.buffer_mut(), v.buffer_mut()];
    let mut bufs: Vec<&GpuBuffer> = Vec::with_capacity(3);
    for guard in &guards {
        match &**guard {
            Buffer::Device(b) => match b.as_any().downcast_ref::<GpuBuffer>() {
                Some(gb) => bufs.push(gb),
                None => return Err(g.foreign(op, guard)),
            },
            other => return Err(g.foreign(op, other)),
        }
    }
    kernels::adam_update(&g.ctx, bufs[0], grad_buf, bufs[1], bufs[2], step, hyper)
        .map_err(g.err(op))
}
