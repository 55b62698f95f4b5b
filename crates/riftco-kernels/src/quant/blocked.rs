//! Products against a block-quantized weight: the weight is dequantized into a transient f32
//! workspace one block of rows (or, for `dY · W`, one block of columns) at a time, and each
//! block's product runs through the same GEMM as an f32 weight, so no op holds a whole f32
//! copy of a large weight.
//!
//! A block spans at most [`WORKSPACE_ELEMENTS`] f32 values. A weight that fits in one block (all
//! of SmolLM2-135M's projections) is dequantized whole and multiplied by exactly the call an f32
//! weight gets, so the result is bitwise that of the f32 model holding the dequantized values. A
//! larger weight is split along the output columns only (never along the reduced axis `k`): each
//! output element is still one reduction over the whole of `k`, computed by `gemm` with a
//! blocking chosen from the block's `(m, k, n)`; the split changes which kernel tiles an element
//! falls in, not the order of its sum in the cases measured (see the tests), and otherwise stays
//! within GEMM's own rounding bound.

use rayon::prelude::*;

use super::format::QuantFormat;
use super::QuantError;
use crate::matmul::{matmul_strided, MatmulSpec, Strides};

/// Elements of f32 workspace a product against a quantized weight uses at most (4 MiB), unless
/// one row (or one block of columns) of the weight is longer.
pub const WORKSPACE_ELEMENTS: usize = 1 << 20;

/// A quantized matrix `[rows, cols]` stored row-major in `bytes`.
#[derive(Clone, Copy, Debug)]
pub struct QuantMatrix<'a> {
    /// The block format.
    pub format: QuantFormat,
    /// The bytes ([`QuantFormat::storage_bytes`] of `rows * cols`).
    pub bytes: &'a [u8],
    /// Rows.
    pub rows: usize,
    /// Columns (a multiple of the format's block).
    pub cols: usize,
}

impl QuantMatrix<'_> {
    /// Dequantizes rows `r0 .. r0 + out.len() / cols` into `out`, rows in parallel.
    pub fn dequantize_rows(&self, r0: usize, out: &mut [f32]) -> Result<(), QuantError> {
        let cols = self.cols;
        let n_rows = out.len().checked_div(cols).unwrap_or(0);
        self.check(
            r0 * cols,
            out.len(),
            n_rows * cols == out.len() && r0 + n_rows <= self.rows,
        )?;
        crate::threading::thread_pool().install(|| {
            out.par_chunks_mut(cols).enumerate().for_each(|(i, row)| {
                super::matvec::dequantize_row_blocks(
                    self.format,
                    self.bytes,
                    self.rows,
                    cols,
                    r0 + i,
                    0,
                    row,
                );
            });
        });
        Ok(())
    }

    /// Dequantizes columns `c0 .. c0 + width` of every row into `out` (`[rows, width]`), rows in
    /// parallel; `c0` and `width` are whole blocks.
    pub fn dequantize_columns(
        &self,
        c0: usize,
        width: usize,
        out: &mut [f32],
    ) -> Result<(), QuantError> {
        let block = self.format.block_elements();
        let fits = c0 % block == 0
            && width % block == 0
            && c0 + width <= self.cols
            && out.len() == self.rows * width;
        self.check(c0, width, fits)?;
        if width == 0 {
            return Ok(());
        }
        crate::threading::thread_pool().install(|| {
            out.par_chunks_mut(width).enumerate().for_each(|(r, row)| {
                super::matvec::dequantize_row_blocks(
                    self.format,
                    self.bytes,
                    self.rows,
                    self.cols,
                    r,
                    c0 / block,
                    row,
                );
            });
        });
        Ok(())
    }

    /// The error of a range that is not whole blocks inside the matrix, or of bytes of the
    /// wrong length, unless `fits` and the bytes and shape agree.
    fn check(&self, start: usize, len: usize, fits: bool) -> Result<(), QuantError> {
        let numel = self.rows.checked_mul(self.cols);
        let ok = fits
            && self.cols % self.format.block_elements() == 0
            && numel.and_then(|n| self.format.storage_bytes(n)) == Some(self.bytes.len());
        match ok {
            true => Ok(()),
            false => Err(QuantError::Range {
                format: self.format,
                bytes: self.bytes.len(),
                numel: numel.unwrap_or(usize::MAX),
                start,
                len,
            }),
        }
    }
}

/// The workspace (f32 elements) [`matmul_quantized`] needs for `spec` against `w`.
pub fn workspace_len(spec: MatmulSpec, w: &QuantMatrix<'_>) -> usize {
    if spec.m == 1 && spec.trans_b {
        return 0;
    }
    match spec.trans_b {
        true => rows_per_block(w) * w.cols,
        false => columns_per_block(w) * w.rows,
    }
}

/// Rows of `W` per block: the weight split into equal blocks of at most
/// [`WORKSPACE_ELEMENTS`], each a multiple of 64 rows (so no block is a thin remainder: GEMM
/// picks its kernels from the block's shape).
fn rows_per_block(w: &QuantMatrix<'_>) -> usize {
    row_block(w.rows, w.cols)
}

fn columns_per_block(w: &QuantMatrix<'_>) -> usize {
    column_block(w.format, w.rows, w.cols)
}

/// Rows per block of a `[rows, cols]` quantized weight in the products `A · Wᵀ`
/// ([`matmul_quantized`] with `trans_b`): all of them when the weight fits in
/// [`WORKSPACE_ELEMENTS`] f32 values (it is then dequantized whole); otherwise equal blocks of
/// at most that many elements, each a multiple of 64 rows (or 64 rows when one row alone
/// nearly fills it). Other backends (the GPU's) block the same way.
pub fn row_block(rows: usize, cols: usize) -> usize {
    let most = (WORKSPACE_ELEMENTS / cols.max(1)).max(1);
    if rows <= most {
        return rows.max(1);
    }
    let blocks = rows.div_ceil(most);
    let even = rows.div_ceil(blocks);
    (even.div_ceil(64) * 64).min(most.max(64))
}

/// Columns per block of a `[rows, cols]` quantized weight in the products `A · W`
/// ([`matmul_quantized`] without `trans_b`, the input gradient `dY · W`): whole blocks of
/// `format`, as many as fit in [`WORKSPACE_ELEMENTS`] f32 values over all `rows` (at least
/// one block), at most `cols`.
pub fn column_block(format: QuantFormat, rows: usize, cols: usize) -> usize {
    let block = format.block_elements();
    let blocks = (WORKSPACE_ELEMENTS / rows.max(1) / block).max(1);
    (blocks * block).min(cols)
}

/// `C[m, n] (+)= A[m, k] · op(W)` for a quantized weight `W` stored `[rows, cols]`:
/// `op(W) = Wᵀ` (`spec.trans_b`, `W` is `[n, k]`: a linear layer's forward, `x · Wᵀ`) or `W`
/// (`W` is `[k, n]`: the input gradient `dY · W`). `A` is not transposed. One-row products
/// with `Wᵀ` (decoding) take the fused mat-vec [`super::matvec`]; the others dequantize a
/// block of `W` at a time into `workspace` ([`workspace_len`] elements).
///
/// # Errors
/// [`QuantError::Range`] when the weight's bytes do not match its shape.
///
/// # Panics
/// When the spec's sizes disagree with the slices or the weight (callers validate shapes), or
/// `spec.trans_a` is set.
pub fn matmul_quantized(
    spec: MatmulSpec,
    a: &[f32],
    w: &QuantMatrix<'_>,
    c: &mut [f32],
    workspace: &mut [f32],
) -> Result<(), QuantError> {
    let MatmulSpec { m, k, n, .. } = spec;
    assert!(!spec.trans_a, "matmul_quantized: A transposed");
    let (w_rows, w_cols) = if spec.trans_b { (n, k) } else { (k, n) };
    assert!(
        w.rows == w_rows && w.cols == w_cols,
        "matmul_quantized: W shape"
    );
    assert!(
        a.len() == m * k && c.len() == m * n,
        "matmul_quantized: lengths"
    );
    assert!(
        workspace.len() >= workspace_len(spec, w),
        "matmul_quantized: workspace"
    );
    if m == 0 || n == 0 {
        return Ok(());
    }
    if m == 1 && spec.trans_b {
        return match spec.accumulate {
            false => super::matvec(w.format, w.bytes, a, c),
            true => {
                let mut y = vec![0.0f32; n];
                super::matvec(w.format, w.bytes, a, &mut y)?;
                c.iter_mut().zip(y).for_each(|(c, y)| *c += y);
                Ok(())
            }
        };
    }
    if spec.trans_b {
        // C[:, r0..r0+nr] (+)= A · W[r0..r0+nr, :]ᵀ
        let per = rows_per_block(w);
        let mut r0 = 0;
        while r0 < n {
            let nr = per.min(n - r0);
            let ws = &mut workspace[..nr * k];
            w.dequantize_rows(r0, ws)?;
            let block = MatmulSpec { n: nr, ..spec };
            let strides = Strides { a: k, b: k, c: n };
            matmul_strided(block, a, ws, &mut c[r0..], strides);
            r0 += nr;
        }
    } else {
        // C[:, c0..c0+nc] (+)= A · W[:, c0..c0+nc]
        let per = columns_per_block(w);
        let mut c0 = 0;
        while c0 < n {
            let nc = per.min(n - c0);
            let ws = &mut workspace[..k * nc];
            w.dequantize_columns(c0, nc, ws)?;
            let block = MatmulSpec { n: nc, ..spec };
            let strides = Strides { a: k, b: nc, c: n };
            matmul_strided(block, a, ws, &mut c[c0..], strides);
            c0 += nc;
        }
    }
    Ok(())
}
