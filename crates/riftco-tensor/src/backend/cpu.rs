//! The CPU backend: host memory from [`crate::pool`], the SIMD kernels of `riftco-kernels`.

use super::{
    check_dropout, check_view, AdamHyper, AttentionDims, AttentionLayout, Backend, BinaryOp,
    DropoutMask, LossAndGradients, MatmulSpec, Pair, ReduceOp, RopeTable, StridedView, UnaryOp,
};
use crate::storage::Buffer;
use crate::{pool, Device, MemoryCategory, Result, Shape, Tensor, TensorError};
use riftco_kernels as k;

/// Host memory and the CPU kernels (the backend of [`Device::Cpu`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

fn out(data: Vec<f32>, shape: Shape, c: MemoryCategory) -> Tensor {
    Tensor::from_vec_unchecked(data, shape, c)
}

fn buf(op: &'static str, n: usize) -> Result<Vec<f32>> {
    pool::try_take(op, n)
}

fn zeroed(op: &'static str, n: usize) -> Result<Vec<f32>> {
    pool::try_take_zeroed(op, n)
}

/// `[]` (a rank-0 shape).
fn scalar() -> Shape {
    Shape::scalar()
}

#[allow(clippy::too_many_arguments)]
impl Backend for CpuBackend {
    fn device(&self) -> Device {
        Device::Cpu
    }

    fn cached_bytes(&self) -> usize {
        pool::cached_bytes()
    }

    fn alloc(&self, op: &'static str, numel: usize, fill: Option<f32>) -> Result<Buffer> {
        Ok(Buffer::Host(match fill {
            None => buf(op, numel)?,
            Some(v) if v == 0.0 && v.is_sign_positive() => zeroed(op, numel)?,
            Some(v) => crate::alloc::try_filled_vec(op, numel, v)?,
        }))
    }

    fn upload(&self, op: &'static str, data: &[f32]) -> Result<Buffer> {
        let mut v = buf(op, data.len())?;
        v.copy_from_slice(data);
        Ok(Buffer::Host(v))
    }

    fn download(&self, op: &'static str, buffer: &Buffer) -> Result<Vec<f32>> {
        match buffer {
            Buffer::Host(v) => {
                let mut out = crate::alloc::try_vec_with_capacity(op, v.len())?;
                out.extend_from_slice(v);
                Ok(out)
            }
            Buffer::Half(dtype, bits) => {
                let mut out = crate::alloc::try_vec_with_capacity(op, bits.len())?;
                out.extend(bits.iter().map(|&b| dtype.to_f32(b)));
                Ok(out)
            }
            Buffer::Quantized(q) => {
                let mut out = buf(op, q.numel)?;
                q.dequantize_range(op, 0, &mut out)?;
                Ok(out)
            }
            Buffer::Device(_) => Err(TensorError::InvalidArgument {
                op,
                message: "the CPU backend cannot read a device buffer".into(),
            }),
            Buffer::Placeholder(_) => Err(TensorError::NoData { op }),
        }
    }

    fn upload_quantized(&self, op: &'static str, q: &crate::QuantizedBytes) -> Result<Buffer> {
        Ok(Buffer::Quantized(copy_quantized(op, q)?))
    }

    fn download_quantized(
        &self,
        op: &'static str,
        buffer: &Buffer,
    ) -> Result<crate::QuantizedBytes> {
        match buffer {
            Buffer::Quantized(q) => copy_quantized(op, q),
            Buffer::Placeholder(_) => Err(TensorError::NoData { op }),
            _ => Err(TensorError::InvalidArgument {
                op,
                message: "the buffer does not hold a quantized tensor".into(),
            }),
        }
    }

    fn copy(&self, op: &'static str, src: &Tensor, c: MemoryCategory) -> Result<Tensor> {
        let mut data = buf(op, src.numel())?;
        data.copy_from_slice(&src.read()?);
        Ok(out(data, src.shape().clone(), c))
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
        let bad = |what: &'static str, offset: usize, n: usize| TensorError::IndexOutOfRange {
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
        if dst.same_storage(src) {
            let mut w = dst.write()?;
            w.copy_within(src_offset..src_offset + len, dst_offset);
            return Ok(());
        }
        let s = src.read()?;
        dst.write()?[dst_offset..dst_offset + len]
            .copy_from_slice(&s[src_offset..src_offset + len]);
        Ok(())
    }

    fn add(&self, op: &'static str, a: &Tensor, b: &Tensor, c: MemoryCategory) -> Result<Tensor> {
        let mut o = buf(op, a.numel())?;
        k::elementwise::add(&a.read()?, &b.read()?, &mut o);
        Ok(out(o, a.shape().clone(), c))
    }

    fn mul(&self, op: &'static str, a: &Tensor, b: &Tensor, c: MemoryCategory) -> Result<Tensor> {
        let mut o = buf(op, a.numel())?;
        k::elementwise::mul(&a.read()?, &b.read()?, &mut o);
        Ok(out(o, a.shape().clone(), c))
    }

    fn scale(&self, op: &'static str, x: &Tensor, alpha: f32, c: MemoryCategory) -> Result<Tensor> {
        let mut o = buf(op, x.numel())?;
        k::elementwise::scale(&x.read()?, alpha, &mut o);
        Ok(out(o, x.shape().clone(), c))
    }

    fn add_assign(&self, _op: &'static str, dst: &Tensor, src: &Tensor) -> Result<()> {
        if dst.same_storage(src) {
            // `x += x`: one lock, doubled in place (the kernel's `a + a`, bit for bit).
            let mut w = dst.write()?;
            for v in w.iter_mut() {
                *v += *v;
            }
            return Ok(());
        }
        let s = src.read()?;
        k::elementwise::add_assign(&mut dst.write()?, &s);
        Ok(())
    }

    fn axpy(&self, _op: &'static str, alpha: f32, x: &Tensor, dst: &Tensor) -> Result<()> {
        let s = x.read()?;
        k::elementwise::axpy(alpha, &s, &mut dst.write()?);
        Ok(())
    }

    fn sum(&self, _op: &'static str, x: &Tensor, c: MemoryCategory) -> Result<Tensor> {
        let total: f64 = x.read()?.iter().map(|&v| v as f64).sum();
        Ok(out(vec![total as f32], scalar(), c))
    }

    fn unary(
        &self,
        op: &'static str,
        kind: UnaryOp,
        x: &Tensor,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        let mut o = buf(op, x.numel())?;
        k::map::unary(kind, &x.read()?, &mut o);
        Ok(out(o, x.shape().clone(), c))
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
        let n = dy.numel();
        if x.numel() != n || y.numel() != n {
            return Err(TensorError::LengthMismatch {
                op,
                shape: dy.dims().to_vec(),
                expected: n,
                got: if x.numel() != n { x.numel() } else { y.numel() },
            });
        }
        let mut o = buf(op, n)?;
        k::map::unary_backward(kind, &x.read()?, &y.read()?, &dy.read()?, &mut o);
        Ok(out(o, dy.shape().clone(), c))
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
        use k::broadcast::broadcasts_to;
        for t in [a, b] {
            if !broadcasts_to(t.dims(), out_shape.dims()) {
                return Err(TensorError::ShapeMismatch {
                    op,
                    expected: out_shape.dims().to_vec(),
                    got: t.dims().to_vec(),
                });
            }
        }
        let mut o = buf(op, out_shape.numel())?;
        k::broadcast::binary(
            kind,
            &a.read()?,
            a.dims(),
            &b.read()?,
            b.dims(),
            out_shape.dims(),
            &mut o,
        );
        Ok(out(o, out_shape, c))
    }

    fn reduce(
        &self,
        op: &'static str,
        kind: ReduceOp,
        x: &Tensor,
        out_shape: Shape,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        if !k::reduce::is_reduction_of(x.dims(), out_shape.dims()) {
            return Err(TensorError::ShapeMismatch {
                op,
                expected: x.dims().to_vec(),
                got: out_shape.dims().to_vec(),
            });
        }
        let mut o = buf(op, out_shape.numel())?;
        k::reduce::reduce(kind, &x.read()?, x.dims(), out_shape.dims(), &mut o);
        Ok(out(o, out_shape, c))
    }

    fn silu(&self, op: &'static str, x: &Tensor, c: MemoryCategory) -> Result<Tensor> {
        let mut o = buf(op, x.numel())?;
        k::elementwise::silu(&x.read()?, &mut o);
        Ok(out(o, x.shape().clone(), c))
    }

    fn silu_backward(
        &self,
        op: &'static str,
        x: &Tensor,
        g: &Tensor,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        let mut o = buf(op, g.numel())?;
        k::elementwise::silu_backward(&x.read()?, &g.read()?, &mut o);
        Ok(out(o, g.shape().clone(), c))
    }

    fn swiglu(
        &self,
        op: &'static str,
        gate: &Tensor,
        up: &Tensor,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        let mut o = buf(op, gate.numel())?;
        k::elementwise::swiglu(&gate.read()?, &up.read()?, &mut o);
        Ok(out(o, gate.shape().clone(), c))
    }

    fn swiglu_backward(
        &self,
        op: &'static str,
        gate: &Tensor,
        up: &Tensor,
        g: &Tensor,
        c: MemoryCategory,
    ) -> Result<Pair> {
        let n = g.numel();
        let (mut dg, mut du) = (buf(op, n)?, buf(op, n)?);
        k::elementwise::swiglu_backward(&gate.read()?, &up.read()?, &g.read()?, &mut dg, &mut du);
        Ok((out(dg, g.shape().clone(), c), out(du, g.shape().clone(), c)))
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
        let mut du = buf(op, g.numel())?;
        let (gate, up) = (gate.read()?, up.read()?);
        k::elementwise::swiglu_backward_in_place(&gate, &up, &mut g.write()?, &mut du);
        Ok(out(du, g.shape().clone(), c))
    }

    fn rms_norm(
        &self,
        op: &'static str,
        x: &Tensor,
        weight: &Tensor,
        eps: f32,
        c: MemoryCategory,
    ) -> Result<Pair> {
        let d = weight.numel();
        let rows = x.numel() / d.max(1);
        let mut y = buf(op, rows * d)?;
        let mut rstd = buf(op, rows)?;
        k::norm::rms_norm(&x.read()?, &weight.read()?, eps, &mut y, &mut rstd);
        Ok((
            out(y, x.shape().clone(), c),
            out(rstd, Shape::from([rows]), c),
        ))
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
        let d = weight.numel();
        let mut dx = buf(op, g.numel())?;
        let mut dw = weight_grad.then(|| zeroed(op, d)).transpose()?;
        k::norm::rms_norm_backward(
            &x.read()?,
            &weight.read()?,
            &rstd.read()?,
            &g.read()?,
            &mut dx,
            dw.as_deref_mut(),
        );
        Ok((
            out(dx, g.shape().clone(), c),
            dw.map(|dw| out(dw, Shape::from([d]), c)),
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
        let mut o = buf(op, x.numel())?;
        k::rope::rope(table, &x.read()?, seq, heads, start_pos, inverse, &mut o);
        Ok(out(o, x.shape().clone(), c))
    }

    fn softmax(
        &self,
        op: &'static str,
        x: &Tensor,
        cols: usize,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        let mut o = buf(op, x.numel())?;
        k::softmax::softmax_rows(&x.read()?, cols, &mut o);
        Ok(out(o, x.shape().clone(), c))
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
        let mut dx = buf(op, g.numel())?;
        k::softmax::softmax_rows_backward(&y.read()?, &g.read()?, cols, &mut dx);
        if scale != 1.0 {
            for v in dx.iter_mut() {
                *v *= scale;
            }
        }
        Ok(out(dx, g.shape().clone(), c))
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
        let mut o = buf(op, scores.numel())?;
        k::attention::causal_softmax_rows(&scores.read()?, dims, scale, causal, &mut o);
        Ok(out(o, scores.shape().clone(), c))
    }

    fn dropout(
        &self,
        op: &'static str,
        x: &Tensor,
        mask: &DropoutMask,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        check_dropout(op, Some(mask))?;
        let mut o = buf(op, x.numel())?;
        k::dropout(&x.read()?, &mut o, mask);
        Ok(out(o, x.shape().clone(), c))
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
        let mut o = buf(op, shape.numel())?;
        if let (Buffer::Quantized(q), false) = (&*b.buffer(), spec.trans_a) {
            // A quantized weight: dequantized a block at a time (or read by the fused mat-vec),
            // the block counted as workspace while it lives.
            let (rows, cols) = match spec.trans_b {
                true => (spec.n, spec.k),
                false => (spec.k, spec.n),
            };
            let w = k::quant::blocked::QuantMatrix {
                format: q.format,
                bytes: &q.bytes,
                rows,
                cols,
            };
            let ws_len = k::quant::blocked::workspace_len(spec, &w);
            let workspace = out(buf(op, ws_len)?, [ws_len].into(), MemoryCategory::Workspace);
            k::quant::blocked::matmul_quantized(
                spec,
                &a.read()?,
                &w,
                &mut o,
                &mut workspace.write()?,
            )
            .map_err(|e| TensorError::InvalidArgument {
                op,
                message: e.to_string(),
            })?;
            return Ok(out(o, shape, c));
        }
        k::matmul(spec, &a.read()?, &b.read()?, &mut o);
        Ok(out(o, shape, c))
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
        let mut o = buf(op, shape.numel())?;
        k::batched_matmul(batch, spec, &a.read()?, &b.read()?, &mut o);
        Ok(out(o, shape, c))
    }

    fn transpose_0213(
        &self,
        op: &'static str,
        x: &Tensor,
        dims: [usize; 4],
        c: MemoryCategory,
    ) -> Result<Tensor> {
        let mut o = buf(op, x.numel())?;
        k::layout::transpose_0213(&x.read()?, dims, &mut o);
        Ok(out(o, Shape::from([dims[0], dims[2], dims[1], dims[3]]), c))
    }

    fn gather_strided(
        &self,
        op: &'static str,
        x: &Tensor,
        view: &StridedView,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        let shape = check_view(op, view, x.numel())?;
        let mut o = buf(op, shape.numel())?;
        k::gather::gather_strided(&x.read()?, view, &mut o);
        Ok(out(o, shape, c))
    }

    fn scatter_strided(
        &self,
        op: &'static str,
        dst: &Tensor,
        src: &Tensor,
        view: &StridedView,
        accumulate: bool,
    ) -> Result<()> {
        let shape = check_view(op, view, dst.numel())?;
        if src.numel() != shape.numel() {
            return Err(TensorError::LengthMismatch {
                op,
                shape: shape.dims().to_vec(),
                expected: shape.numel(),
                got: src.numel(),
            });
        }
        if dst.same_storage(src) {
            // Read the source out first: the view may overlap the elements it reads.
            let s = src.read()?.to_vec();
            k::gather::scatter_strided(&mut dst.write()?, &s, view, accumulate);
            return Ok(());
        }
        let s = src.read()?;
        k::gather::scatter_strided(&mut dst.write()?, &s, view, accumulate);
        Ok(())
    }

    fn embedding(
        &self,
        op: &'static str,
        table: &Tensor,
        ids: &[u32],
        c: MemoryCategory,
    ) -> Result<Tensor> {
        let d = table.dims().get(1).copied().unwrap_or(0);
        let shape = Shape::try_new(op, [ids.len(), d])?;
        let mut o = buf(op, shape.numel())?;
        match table.half_dtype() {
            // A 16-bit table: only the rows looked up are upcast, never the whole table.
            Some(dtype) if d > 0 => {
                let guard = table.buffer();
                let Buffer::Half(_, bits) = &*guard else {
                    return Err(TensorError::NoData { op });
                };
                let vocab = bits.len() / d;
                for (row, &id) in o.chunks_exact_mut(d).zip(ids) {
                    let id = id as usize;
                    if id >= vocab {
                        return Err(TensorError::IndexOutOfRange {
                            op,
                            what: "token id",
                            index: id,
                            bound: vocab,
                        });
                    }
                    dtype.upcast(&bits[id * d..(id + 1) * d], row);
                }
            }
            _ if table.quant_format().is_some() && d > 0 => {
                // A quantized table: only the rows looked up are dequantized.
                let guard = table.buffer();
                let Buffer::Quantized(q) = &*guard else {
                    return Err(TensorError::NoData { op });
                };
                let vocab = q.numel / d;
                for (row, &id) in o.chunks_exact_mut(d).zip(ids) {
                    let id = id as usize;
                    if id >= vocab {
                        return Err(TensorError::IndexOutOfRange {
                            op,
                            what: "token id",
                            index: id,
                            bound: vocab,
                        });
                    }
                    q.dequantize_range(op, id * d, row)?;
                }
            }
            _ => k::embedding::embedding(&table.read()?, d, ids, &mut o),
        }
        Ok(out(o, shape, c))
    }

    fn embedding_backward(
        &self,
        op: &'static str,
        ids: &[u32],
        g: &Tensor,
        vocab: usize,
        c: MemoryCategory,
    ) -> Result<Tensor> {
        let d = g.dims().last().copied().unwrap_or(0);
        let shape = Shape::try_new(op, [vocab, d])?;
        let mut dt = zeroed(op, shape.numel())?;
        k::embedding::embedding_backward(ids, &g.read()?, d, &mut dt);
        Ok(out(dt, shape, c))
    }

    fn cross_entropy(
        &self,
        op: &'static str,
        logits: &Tensor,
        targets: &[u32],
        c: MemoryCategory,
    ) -> Result<Pair> {
        let vocab = logits.dims().last().copied().unwrap_or(0);
        let mut lse = buf(op, targets.len())?;
        let loss = k::loss::cross_entropy(&logits.read()?, targets, vocab, &mut lse);
        Ok((
            out(vec![loss], scalar(), c),
            out(lse, Shape::from([targets.len()]), c),
        ))
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
        let mut d = buf(op, logits.numel())?;
        let gv = g.read()?.first().copied().unwrap_or(0.0);
        k::loss::cross_entropy_backward(&logits.read()?, targets, &lse.read()?, gv, &mut d);
        Ok(out(d, logits.shape().clone(), c))
    }

    fn linear_cross_entropy(
        &self,
        op: &'static str,
        x: &Tensor,
        w: &Tensor,
        targets: &[u32],
        chunk_rows: usize,
        [want_dx, want_dw]: [bool; 2],
        c: MemoryCategory,
    ) -> Result<LossAndGradients> {
        let (rows, d, vocab) =
            super::composed::linear_cross_entropy_sizes(op, x, w, targets, chunk_rows)?;
        // The chunk's logits (then their gradient, in place) and logsumexp, with a block of
        // them and of a 16-bit W upcast, counted as workspace while they exist.
        let vocab_block = k::linear_loss::vocab_block_rows(d);
        let half = w.half_dtype();
        if let (Some(dtype), true) = (half, want_dw) {
            return Err(crate::storage::half_is_read_only(op, dtype));
        }
        let quant = w.quant_format();
        if let (Some(format), true) = (quant, want_dw) {
            return Err(crate::storage::quantized_is_read_only(op, format));
        }
        let converted = half.is_some() || quant.is_some();
        let ws_len =
            k::linear_loss::workspace_len(rows, vocab, d, chunk_rows, vocab_block, converted);
        let workspace = out(buf(op, ws_len)?, [ws_len].into(), MemoryCategory::Workspace);
        let mut dx = match want_dx {
            true => Some(buf(op, rows * d)?),
            false => None,
        };
        let mut dw = match want_dw {
            true => Some(buf(op, vocab * d)?),
            false => None,
        };
        let x = x.read()?;
        let mut ws = workspace.write()?;
        let mut run = |head: k::linear_loss::HeadWeight<'_>, ws: &mut [f32]| {
            k::linear_loss::linear_cross_entropy(
                k::linear_loss::LinearCrossEntropy {
                    x: &x,
                    w: head,
                    targets,
                    d_model: d,
                    chunk_rows,
                    vocab_block,
                },
                ws,
                dx.as_deref_mut(),
                dw.as_deref_mut(),
            )
        };
        let loss = match half {
            // A 16-bit W is upcast a block of rows at a time, never whole.
            Some(dtype) => {
                let guard = w.buffer();
                let Buffer::Half(_, bits) = &*guard else {
                    return Err(TensorError::NoData { op });
                };
                let fill = |v0: usize, out: &mut [f32]| dtype.upcast(&bits[v0 * d..], out);
                let head = k::linear_loss::HeadWeight::Converted { vocab, fill: &fill };
                run(head, &mut ws)
            }
            None if quant.is_some() => {
                // A quantized W is dequantized a block of rows at a time, never whole.
                let guard = w.buffer();
                let Buffer::Quantized(q) = &*guard else {
                    return Err(TensorError::NoData { op });
                };
                let fill = |v0: usize, out: &mut [f32]| {
                    // Rows are whole blocks (checked when the tensor was made), so this holds.
                    let _ = q.dequantize_range(op, v0 * d, out);
                };
                let head = k::linear_loss::HeadWeight::Converted { vocab, fill: &fill };
                run(head, &mut ws)
            }
            None => run(k::linear_loss::HeadWeight::F32(&w.read()?), &mut ws),
        };
        drop(ws);
        drop(workspace);
        let grad = MemoryCategory::Gradient;
        Ok(LossAndGradients {
            loss: out(vec![loss], scalar(), c),
            d_first: dx.map(|v| out(v, [rows, d].into(), grad)),
            d_second: dw.map(|v| out(v, [vocab, d].into(), grad)),
        })
    }

    fn flash_attention_forward(
        &self,
        op: &'static str,
        q: &Tensor,
        kt: &Tensor,
        v: &Tensor,
        dims: AttentionDims,
        layout: AttentionLayout,
        scale: f32,
        causal: bool,
        dropout: Option<&DropoutMask>,
        c: MemoryCategory,
    ) -> Result<Pair> {
        check_dropout(op, dropout)?;
        let mut o = buf(op, q.numel())?;
        let mut lse = buf(op, dims.batch * dims.n_heads * dims.seq_q)?;
        k::attention::flash_attention_forward_with_dropout(
            &q.read()?,
            &kt.read()?,
            &v.read()?,
            dims,
            layout,
            scale,
            causal,
            dropout,
            &mut o,
            &mut lse,
        );
        Ok((
            out(o, q.shape().clone(), c),
            out(lse, Shape::from([dims.batch, dims.n_heads, dims.seq_q]), c),
        ))
    }

    fn flash_attention_backward(
        &self,
        op: &'static str,
        q: &Tensor,
        kt: &Tensor,
        v: &Tensor,
        o: &Tensor,
        lse: &Tensor,
        g: &Tensor,
        dims: AttentionDims,
        layout: AttentionLayout,
        scale: f32,
        causal: bool,
        dropout: Option<&DropoutMask>,
        c: MemoryCategory,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        check_dropout(op, dropout)?;
        let (mut dq, mut dk, mut dv) = (
            buf(op, q.numel())?,
            buf(op, kt.numel())?,
            buf(op, v.numel())?,
        );
        k::attention::flash_attention_backward_with_dropout(
            &q.read()?,
            &kt.read()?,
            &v.read()?,
            &o.read()?,
            &lse.read()?,
            &g.read()?,
            dims,
            layout,
            scale,
            causal,
            dropout,
            &mut dq,
            &mut dk,
            &mut dv,
        );
        Ok((
            out(dq, q.shape().clone(), c),
            out(dk, kt.shape().clone(), c),
            out(dv, v.shape().clone(), c),
        ))
    }

    fn adam_update(
        &self,
        _op: &'static str,
        param: &Tensor,
        grad: &Tensor,
        m: &Tensor,
        v: &Tensor,
        step: u64,
        hyper: AdamHyper,
    ) -> Result<()> {
        let g = grad.read()?;
        k::adam_update(
            &mut param.write()?,
            &g,
            &mut m.write()?,
            &mut v.write()?,
            step,
            hyper,
        );
        Ok(())
    }
}

/// A copy of `q`, its bytes allocated fallibly.
fn copy_quantized(op: &'static str, q: &crate::QuantizedBytes) -> Result<crate::QuantizedBytes> {
    let mut bytes = crate::alloc::try_vec_with_capacity(op, q.bytes.len())?;
    bytes.extend_from_slice(&q.bytes);
    Ok(crate::QuantizedBytes {
        format: q.format,
        bytes,
        numel: q.numel,
    })
}
