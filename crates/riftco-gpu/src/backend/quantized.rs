//! Quantized frozen weights in the GPU backend: a tensor stored in a block format
//! ([`QuantFormat`]) lives on the device as its storage bytes ([`GpuQuantized`], uploaded and
//! read back bit for bit by `Tensor::transfer_to`), accounted as those bytes, and read
//! dequantized only by the ops that take a frozen weight:
//!
//! - the products `x · Wᵀ` (a linear layer's forward) and `dY · W` (its input gradient), with
//!   `W` dequantized into an f32 workspace blocked as the CPU blocks it
//!   (`riftco_kernels::quant::blocked::{row_block, column_block}`: the whole weight when it
//!   fits in `WORKSPACE_ELEMENTS` f32 values, 4 MiB; otherwise blocks of rows, resp. whole
//!   columns, of at most that size), each block multiplied by the same tiled matmul as an f32
//!   weight. That kernel sums `k` in increasing order per output element whatever the block,
//!   so the product is bitwise the GPU's product against an f32 weight holding the dequantized
//!   values (which are bitwise the CPU's, see [`crate::kernels::dequantize`]);
//! - the one-row product `x · Wᵀ` of decoding, through the fused
//!   [`crate::kernels::quantized_matvec`] (no dequantized copy; its summation order differs
//!   from the tiled matmul's, within the bound documented there);
//! - embedding lookups: only the rows looked up are dequantized
//!   ([`crate::kernels::gather_rows`]), bitwise the CPU's rows;
//! - the LM head (`linear_cross_entropy`): the backend's chunked composition, whose products
//!   against `W` are the blocked ones above, so no more than one block of the head exists in
//!   f32 at a time. The gradient of a quantized `W` is an error (read-only), as on the CPU.
//!
//! Every dequantized block is a tensor of the workspace category while it lives. Any other op
//! given a quantized tensor fails with an error naming the format (see
//! [`GpuBackend::foreign`]).

use riftco_kernels::quant::blocked::{column_block, row_block};
use riftco_tensor::backend::{composed, LossAndGradients, MatmulSpec};
use riftco_tensor::storage::{Buffer, DeviceBuffer};
use riftco_tensor::TensorError;
use riftco_tensor::{MemoryCategory, QuantFormat, QuantizedBytes, Result, Shape, Tensor};

use super::GpuBackend;
use crate::kernels::{self, GpuQuantized};
use crate::GpuBuffer;

impl DeviceBuffer for GpuQuantized {
    /// The tensor's element count (not the bytes held).
    fn len(&self) -> usize {
        self.numel()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
    fn quant_format(&self) -> Option<QuantFormat> {
        Some(self.format())
    }
    /// The storage bytes (`format.storage_bytes(numel)`), as a host quantized buffer counts;
    /// the device buffer holds at most 3 bytes of zero padding more (and NF4's tables, 1088
    /// bytes), allocated at its own size ([`crate::GpuContext::alloc_exact`]).
    fn accounted_bytes(&self) -> usize {
        self.storage_bytes()
    }
}

/// The quantized tensor under `buffer`, if it is one of this backend's kind.
pub(super) fn as_quantized(buffer: &Buffer) -> Option<&GpuQuantized> {
    match buffer {
        Buffer::Device(b) => b.as_any().downcast_ref(),
        _ => None,
    }
}

pub(super) fn upload(g: &GpuBackend, op: &'static str, q: &QuantizedBytes) -> Result<Buffer> {
    let gq = GpuQuantized::upload(&g.ctx, q.format, &q.bytes, q.numel).map_err(g.err(op))?;
    Ok(Buffer::Device(Box::new(gq)))
}

pub(super) fn download(
    g: &GpuBackend,
    op: &'static str,
    buffer: &Buffer,
) -> Result<QuantizedBytes> {
    let Some(q) = as_quantized(buffer) else {
        return Err(match buffer {
            Buffer::Placeholder(_) => TensorError::NoData { op },
            _ => TensorError::InvalidArgument {
                op,
                message: format!(
                    "the buffer does not hold a quantized tensor of the {} GPU backend",
                    g.device
                ),
            },
        });
    };
    Ok(QuantizedBytes {
        format: q.format(),
        bytes: q.download(&g.ctx).map_err(g.err(op))?,
        numel: q.numel(),
    })
}

/// The f32 values of a quantized tensor on the host: its bytes read back and dequantized on
/// the CPU (`Tensor::to_host`; bitwise what the GPU's dequantization gives).
pub(super) fn download_values(
    g: &GpuBackend,
    op: &'static str,
    buffer: &Buffer,
) -> Result<Vec<f32>> {
    let q = download(g, op, buffer)?;
    let mut out = riftco_tensor::alloc::try_vec_with_capacity(op, q.numel)?;
    out.resize(q.numel, 0.0);
    q.dequantize_range(op, 0, &mut out)?;
    Ok(out)
}

/// A dequantized f32 copy of the whole of `q` (`Backend::copy` of a quantized tensor, as the
/// CPU's copy dequantizes it).
pub(super) fn copy(
    g: &GpuBackend,
    op: &'static str,
    q: &GpuQuantized,
    shape: Shape,
    c: MemoryCategory,
) -> Result<Tensor> {
    let out = kernels::dequantize(&g.ctx, q, 0, q.numel()).map_err(g.err(op))?;
    g.tensor(out, shape, c)
}

/// A dequantized block as a workspace tensor (counted while it lives) and its buffer.
fn workspace(g: &GpuBackend, buf: GpuBuffer, len: usize) -> Result<Tensor> {
    g.tensor(buf, Shape::from([len]), MemoryCategory::Workspace)
}

/// `A · op(W)` for a quantized `W` (`b` of a `matmul`): see the [module documentation](self).
#[allow(clippy::too_many_arguments)]
pub(super) fn matmul(
    g: &GpuBackend,
    op: &'static str,
    spec: MatmulSpec,
    a: &Tensor,
    q: &GpuQuantized,
    shape: Shape,
    c: MemoryCategory,
) -> Result<Tensor> {
    let MatmulSpec { m, k, n, .. } = spec;
    // The weight is `[rows, cols]`: `[n, k]` for `x · Wᵀ`, `[k, n]` for `dY · W`.
    let (rows, cols) = if spec.trans_b { (n, k) } else { (k, n) };
    if spec.trans_a || Some(q.numel()) != rows.checked_mul(cols) {
        return Err(TensorError::InvalidArgument {
            op,
            message: format!(
                "a product against a weight stored quantized ({}, {} elements) takes A [m, k] \
                 untransposed and the weight as [n, k] (x · Wᵀ) or [k, n] (dY · W); got m = {m}, \
                 k = {k}, n = {n}, trans_a = {}, trans_b = {}",
                q.format(),
                q.numel(),
                spec.trans_a,
                spec.trans_b
            ),
        });
    }
    if Some(shape.numel()) != m.checked_mul(n) {
        return Err(TensorError::LengthMismatch {
            op,
            shape: shape.dims().to_vec(),
            expected: shape.numel(),
            got: m.saturating_mul(n),
        });
    }
    let spec = spec.accumulate(false);
    let ra = g.read(op, &[a])?;
    let x = ra.get(0);
    let ctx = &g.ctx;
    let err = g.err(op);
    if m == 0 || n == 0 || k == 0 {
        let out = kernels::fill(ctx, m * n, 0.0).map_err(&err)?;
        return g.tensor(out, shape, c);
    }
    if m == 1 && spec.trans_b {
        // Decoding's mat-vec: the quantized blocks read directly.
        let y = kernels::quantized_matvec(ctx, q, x).map_err(&err)?;
        return g.tensor(y, shape, c);
    }
    let per = match spec.trans_b {
        true => row_block(rows, cols),
        false => column_block(q.format(), rows, cols),
    };
    if per >= n {
        // The whole weight fits in one block: the f32 weight's own product.
        let w = kernels::dequantize(ctx, q, 0, q.numel()).map_err(&err)?;
        let w = workspace(g, w, q.numel())?;
        let rw = g.read(op, &[&w])?;
        let out = kernels::matmul(ctx, spec, x, rw.get(0)).map_err(&err)?;
        return g.tensor(out, shape, c);
    }
    let out = ctx.alloc(m * n).map_err(&err)?;
    // For `dY · W`: every row of `W`, from which a block of whole columns is taken.
    let all_rows: Vec<u32> = match spec.trans_b {
        true => Vec::new(),
        false => (0..rows as u32).collect(),
    };
    let mut j0 = 0;
    while j0 < n {
        let nj = per.min(n - j0);
        let block = match spec.trans_b {
            // W[j0 .. j0 + nj, :], `[nj, k]`.
            true => kernels::dequantize(ctx, q, j0 * cols, nj * cols),
            // W[:, j0 .. j0 + nj], `[k, nj]`.
            false => kernels::gather_rows(ctx, q, cols, &all_rows, j0, nj),
        }
        .map_err(&err)?;
        let block = workspace(g, block, nj * k)?;
        let rb = g.read(op, &[&block])?;
        let part =
            kernels::matmul(ctx, MatmulSpec { n: nj, ..spec }, x, rb.get(0)).map_err(&err)?;
        let part = workspace(g, part, m * nj)?;
        let rp = g.read(op, &[&part])?;
        // C[:, j0 .. j0 + nj] = the block's product.
        kernels::scatter(ctx, &out, rp.get(0), &[m, nj], &[n as isize, 1], j0, false)
            .map_err(&err)?;
        j0 += nj;
    }
    g.tensor(out, shape, c)
}

/// Rows `ids` of a quantized table `[vocab, d]`: only those rows are dequantized.
pub(super) fn embedding(
    g: &GpuBackend,
    op: &'static str,
    q: &GpuQuantized,
    d: usize,
    ids: &[u32],
    c: MemoryCategory,
) -> Result<Tensor> {
    let shape = Shape::try_new(op, [ids.len(), d])?;
    let vocab = q.numel().checked_div(d).unwrap_or(0);
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(TensorError::IndexOutOfRange {
            op,
            what: "token id",
            index: id as usize,
            bound: vocab,
        });
    }
    if shape.numel() == 0 {
        let out = g.ctx.alloc(0).map_err(g.err(op))?;
        return g.tensor(out, shape, c);
    }
    let out = kernels::gather_rows(&g.ctx, q, d, ids, 0, d).map_err(g.err(op))?;
    g.tensor(out, shape, c)
}

/// The LM head's chunked loss with a quantized `w`: the composition of the backend's own
/// kernels (its products against `w` are the blocked ones of [`matmul`]); the gradient of `w`
/// itself is refused, as on the CPU.
#[allow(clippy::too_many_arguments)]
pub(super) fn linear_cross_entropy(
    g: &GpuBackend,
    op: &'static str,
    x: &Tensor,
    w: &Tensor,
    targets: &[u32],
    chunk_rows: usize,
    want_grads: [bool; 2],
    c: MemoryCategory,
) -> Result<LossAndGradients> {
    if let (Some(format), true) = (w.quant_format(), want_grads[1]) {
        return Err(riftco_tensor::storage::quantized_is_read_only(op, format));
    }
    composed::linear_cross_entropy(g, op, x, w, targets, chunk_rows, want_grads, c)
}
