//! A `[vocab, d_model]` weight read one slice of vocabulary rows at a time, each slice once: the
//! LM head + mean cross-entropy with an online logsumexp
//! ([`riftco_kernels::linear_loss::sliced`]) and the embedding lookup. For a caller that never
//! holds the whole weight (a tied embedding sharded over data-parallel processes, gathered a
//! slice at a time). Host tensors only: slices in f32, 16-bit or block-quantized storage.

use crate::storage::Buffer;
use crate::{Device, MemoryCategory, Result, Tensor, TensorError};
use riftco_kernels::linear_loss::sliced::{
    sliced_cols_for, sliced_workspace_len, DxBuffers, SlicedLinearCrossEntropy,
};
use riftco_kernels::linear_loss::HeadWeight;

/// Calls `run` with `w [n, d]`'s rows as the kernels read them (an f32 slice, or an upcast /
/// dequantization a block of rows at a time).
fn with_rows<R>(op: &'static str, w: &Tensor, run: impl FnOnce(HeadWeight<'_>) -> R) -> Result<R> {
    if w.device() != Device::Cpu {
        return Err(TensorError::NotOnHost {
            op,
            device: w.device(),
        });
    }
    let (n, d) = match w.dims() {
        [n, d] if *n > 0 && *d > 0 => (*n, *d),
        other => {
            return Err(TensorError::InvalidArgument {
                op,
                message: format!(
                    "a slice of the weight must be [rows >= 1, d_model >= 1]; got {other:?}"
                ),
            })
        }
    };
    let guard = w.buffer();
    match &*guard {
        Buffer::Host(v) => Ok(run(HeadWeight::F32(v))),
        Buffer::Half(dtype, bits) => {
            let fill = |r0: usize, out: &mut [f32]| dtype.upcast(&bits[r0 * d..], out);
            Ok(run(HeadWeight::Converted {
                vocab: n,
                fill: &fill,
            }))
        }
        Buffer::Quantized(q) => {
            let fill = |r0: usize, out: &mut [f32]| {
                // Rows are whole blocks (checked when the tensor was made), so this holds.
                let _ = q.dequantize_range(op, r0 * d, out);
            };
            Ok(run(HeadWeight::Converted {
                vocab: n,
                fill: &fill,
            }))
        }
        Buffer::Placeholder(_) => Err(TensorError::NoData { op }),
        Buffer::Device(_) => Err(TensorError::NotOnHost {
            op,
            device: w.device(),
        }),
    }
}

/// The LM head + mean cross-entropy of hidden states `x [rows, d_model]` against `targets`,
/// over a head of `vocab` rows given in order by [`SlicedHeadLoss::absorb`]: the loss and
/// (when asked) `∂loss/∂x` for an upstream gradient of 1, in one pass over the slices. The
/// workspace (logits of a pass, counted as workspace) stays within a byte budget; `dx` and the
/// target rows of the head take `2 · rows · d_model` f32 more (gradient and workspace).
#[derive(Debug)]
pub struct SlicedHeadLoss {
    op: &'static str,
    x: Tensor,
    targets: Vec<u32>,
    state: SlicedLinearCrossEntropy,
    cols: usize,
    workspace: Tensor,
    dx: Option<(Tensor, Tensor)>,
}

impl SlicedHeadLoss {
    /// The state before the first slice, for slices of at most `slice_rows` rows (the
    /// workspace holds no more columns than that). `targets` must be `< vocab` (callers
    /// validate).
    ///
    /// # Errors
    /// [`TensorError::NotOnHost`] for `x` on a device; [`TensorError::InvalidArgument`] for `x`
    /// not `[targets.len() >= 1, d_model >= 1]` or a `vocab` of 0; out of memory.
    pub fn new(
        op: &'static str,
        x: &Tensor,
        targets: &[u32],
        vocab: usize,
        slice_rows: usize,
        workspace_bytes: u64,
        with_dx: bool,
    ) -> Result<Self> {
        if x.device() != Device::Cpu {
            return Err(TensorError::NotOnHost {
                op,
                device: x.device(),
            });
        }
        let (rows, d) = match x.dims() {
            [r, d] if *r == targets.len() && *r > 0 && *d > 0 && vocab > 0 => (*r, *d),
            other => {
                return Err(TensorError::InvalidArgument {
                    op,
                    message: format!(
                        "hidden states must be [rows = {} targets, d_model >= 1] over a \
                         vocabulary of at least 1 row; got {other:?} and a vocabulary of {vocab}",
                        targets.len()
                    ),
                })
            }
        };
        let cols = sliced_cols_for(workspace_bytes, rows, d, with_dx, slice_rows.min(vocab));
        let ws_len = sliced_workspace_len(rows, d, cols, with_dx);
        let workspace = Tensor::try_zeros([ws_len], MemoryCategory::Workspace)?;
        let dx = match with_dx {
            true => Some((
                Tensor::try_zeros([rows, d], MemoryCategory::Gradient)?,
                Tensor::try_zeros([rows, d], MemoryCategory::Workspace)?,
            )),
            false => None,
        };
        Ok(Self {
            op,
            x: x.clone(),
            targets: targets.to_vec(),
            state: SlicedLinearCrossEntropy::new(rows, d, vocab, with_dx),
            cols,
            workspace,
            dx,
        })
    }

    /// Rows of the head absorbed so far: the next slice starts there.
    pub fn seen(&self) -> usize {
        self.state.seen()
    }

    /// Absorbs the next slice `w [n, d_model]` of the head (rows `seen()..seen() + n`).
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] for a slice of another width or one that goes past the
    /// vocabulary; [`TensorError::NotOnHost`] / [`TensorError::NoData`] for a slice on a device
    /// or released.
    pub fn absorb(&mut self, w: &Tensor) -> Result<()> {
        let op = self.op;
        let d = self.x.dims()[1];
        let vocab_left = self.vocab() - self.seen();
        match w.dims() {
            [n, wd] if *wd == d && (1..=vocab_left).contains(n) => {}
            other => {
                return Err(TensorError::InvalidArgument {
                    op,
                    message: format!(
                        "a slice of the head must be [1..={vocab_left} rows (rows {} of {} \
                         absorbed), d_model = {d}]; got {other:?}",
                        self.seen(),
                        self.vocab()
                    ),
                })
            }
        }
        let x = self.x.read()?;
        let mut ws = self.workspace.write()?;
        let mut dx_bufs = match &self.dx {
            Some((acc, rows)) => Some((acc.write()?, rows.write()?)),
            None => None,
        };
        let (state, targets, cols) = (&mut self.state, &self.targets, self.cols);
        with_rows(op, w, |head| {
            let bufs = dx_bufs.as_mut().map(|(a, t)| DxBuffers {
                acc: a,
                target_rows: t,
            });
            state.absorb(&x, targets, head, cols, &mut ws, bufs);
        })
    }

    fn vocab(&self) -> usize {
        self.state.vocab()
    }

    /// The loss (a scalar in `category`) and `dx [rows, d_model]` (gradient) when asked.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] before every row of the head was absorbed.
    pub fn finish(self, category: MemoryCategory) -> Result<(Tensor, Option<Tensor>)> {
        if self.seen() != self.vocab() {
            return Err(TensorError::InvalidArgument {
                op: self.op,
                message: format!(
                    "{} of the head's {} rows were absorbed: every slice is needed",
                    self.seen(),
                    self.vocab()
                ),
            });
        }
        drop(self.workspace);
        let loss = match &self.dx {
            Some((acc, rows)) => {
                let (mut a, mut t) = (acc.write()?, rows.write()?);
                self.state.finish(Some(DxBuffers {
                    acc: &mut a,
                    target_rows: &mut t,
                }))
            }
            None => self.state.finish(None),
        };
        Ok((Tensor::scalar(loss, category), self.dx.map(|(acc, _)| acc)))
    }
}

/// Writes into `out [tokens, d_model]` (f32, host) the rows of the tokens `ids` that fall in
/// the slice `w [n, d_model]` holding vocabulary rows `v0..v0 + n` (upcast or dequantized
/// exactly as a whole-weight lookup would); other rows of `out` are left alone.
///
/// # Errors
/// [`TensorError::InvalidArgument`] when the widths or `out`'s rows disagree;
/// [`TensorError::NotOnHost`] / [`TensorError::NoData`] for a tensor on a device or released.
pub fn embedding_rows_from_slice(
    op: &'static str,
    out: &Tensor,
    ids: &[u32],
    v0: usize,
    w: &Tensor,
) -> Result<()> {
    let d = out.dims().get(1).copied().unwrap_or(0);
    if out.dims() != [ids.len(), d] || w.dims().get(1) != Some(&d) {
        return Err(TensorError::InvalidArgument {
            op,
            message: format!(
                "the lookup's output {:?} must be [{} ids, d_model] and the slice {:?} [rows, \
                 d_model]",
                out.dims(),
                ids.len(),
                w.dims()
            ),
        });
    }
    let n = w.dims()[0];
    let mut o = out.write()?;
    with_rows(op, w, |head| {
        for (i, &t) in ids.iter().enumerate() {
            let t = t as usize;
            if !(v0..v0 + n).contains(&t) {
                continue;
            }
            let row = &mut o[i * d..(i + 1) * d];
            match head {
                HeadWeight::F32(v) => row.copy_from_slice(&v[(t - v0) * d..(t - v0 + 1) * d]),
                HeadWeight::Converted { fill, .. } => fill(t - v0, row),
            }
        }
    })
}
