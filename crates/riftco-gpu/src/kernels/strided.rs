//! Index-mapping kernels (`shaders/strided.wgsl`) and buffer copies: the GPU twins of the CPU
//! backend's fill, `copy_range`, `add_assign` / `axpy`, the broadcasting
//! `riftco_kernels::broadcast::binary`, the keepdims `riftco_kernels::reduce::reduce` (a
//! gather, then [`super::reduce_rows`]) and the strided gather / scatter of `riftco_kernels::gather`.
//!
//! Shapes and strides travel in a small `u32` storage buffer (see the shader). Element counts
//! and buffer indices must fit the shaders' 32-bit arithmetic (signed for strided views);
//! larger sizes are a [`GpuError::Shape`], never a wrapped index.

use riftco_kernels::broadcast::BinaryOp;
use riftco_kernels::reduce::ReduceOp;

use super::shape::within_loop_limit;
use super::{dispatch_at, expect_len, grid_1d, to_u32};
use crate::error::{GpuError, Result};
use crate::pipelines::{Family, Kernel};
use crate::pool::GpuBuffer;
use crate::GpuContext;

/// The shader's code of `op` (the `case` labels of `binary_op` in `shaders/strided.wgsl`).
pub fn binary_code(op: BinaryOp) -> u32 {
    match op {
        BinaryOp::Add => 0,
        BinaryOp::Sub => 1,
        BinaryOp::Mul => 2,
        BinaryOp::Div => 3,
        BinaryOp::Lt => 4,
        BinaryOp::Le => 5,
        BinaryOp::Gt => 6,
        BinaryOp::Ge => 7,
        BinaryOp::Eq => 8,
        BinaryOp::Ne => 9,
    }
}

/// The uniform words of `shaders/strided.wgsl`'s `Params`.
struct Params {
    n: u32,
    alpha: f32,
    op: u32,
    rank: u32,
    extra: u32,
    flags: u32,
}

impl Params {
    fn new(n: u32) -> Self {
        Self {
            n,
            alpha: 0.0,
            op: 0,
            rank: 0,
            extra: 0,
            flags: 0,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let w = [
            self.n,
            self.alpha.to_bits(),
            self.op,
            self.rank,
            self.extra,
            self.flags,
            0,
            0,
        ];
        super::words(&w)
    }
}

/// A buffer holding `words` as bit patterns (read as `array<u32>` by the shader; one word when
/// empty, since a binding cannot be empty).
fn meta(ctx: &GpuContext, words: &[u32]) -> Result<GpuBuffer> {
    let mut bits: Vec<f32> = words.iter().map(|&w| f32::from_bits(w)).collect();
    if bits.is_empty() {
        bits.push(0.0);
    }
    ctx.upload(&bits)
}

fn run(
    ctx: &GpuContext,
    entry: &'static str,
    storage: &[(u32, &GpuBuffer)],
    params: &Params,
    n: usize,
) -> Result<()> {
    let kernel = Kernel::new(Family::Strided, entry);
    dispatch_at(ctx, kernel, storage, 4, &params.bytes(), grid_1d(entry, n)?)
}

fn dims_u32(op: &'static str, dims: &[usize]) -> Result<Vec<u32>> {
    dims.iter().map(|&d| to_u32(op, "a dimension", d)).collect()
}

/// A buffer of `n` values, each `value`.
///
/// # Errors
/// [`GpuError::Shape`] above the 32-bit range; device errors.
pub fn fill(ctx: &GpuContext, n: usize, value: f32) -> Result<GpuBuffer> {
    let out = ctx.alloc(n)?;
    if n == 0 {
        return Ok(out);
    }
    let mut p = Params::new(to_u32("fill", "n", n)?);
    p.alpha = value;
    run(ctx, "fill", &[(3, &out)], &p, n)?;
    Ok(out)
}

/// `dst[i] += x[i]` (`alpha = None`) or `dst[i] += alpha · x[i]`, in place; `x`, `dst`: `[n]`,
/// distinct buffers.
///
/// # Errors
/// [`GpuError::Shape`] when the lengths differ or `x` is `dst`; device errors.
pub fn axpy(ctx: &GpuContext, alpha: Option<f32>, x: &GpuBuffer, dst: &GpuBuffer) -> Result<()> {
    let entry = if alpha.is_some() {
        "axpy"
    } else {
        "add_assign"
    };
    expect_len(entry, "x", x, dst.len())?;
    let n = dst.len();
    if n == 0 {
        return Ok(());
    }
    let mut p = Params::new(to_u32(entry, "n", n)?);
    p.alpha = alpha.unwrap_or(1.0);
    run(ctx, entry, &[(0, x), (3, dst)], &p, n)
}

/// Copies `len` values of `src` from `src_offset` to `dst` from `dst_offset` (recorded in the
/// pending command stream; `src` and `dst` may be the same buffer: then through a temporary).
///
/// # Errors
/// [`GpuError::Shape`] when a range leaves its buffer; device errors.
pub fn copy_range(
    ctx: &GpuContext,
    src: &GpuBuffer,
    src_offset: usize,
    dst: &GpuBuffer,
    dst_offset: usize,
    len: usize,
) -> Result<()> {
    ctx.check_owner("copy_range", "the source", src)?;
    ctx.check_owner("copy_range", "the destination", dst)?;
    for (what, offset, buf) in [
        ("source", src_offset, src),
        ("destination", dst_offset, dst),
    ] {
        if offset.checked_add(len).is_none_or(|e| e > buf.len()) {
            return Err(GpuError::Shape {
                op: "copy_range",
                message: format!(
                    "the {what} range {offset}..{offset}+{len} leaves a buffer of {} values",
                    buf.len()
                ),
            });
        }
    }
    if len == 0 {
        return Ok(());
    }
    if src.raw() == dst.raw() {
        let tmp = ctx.alloc(len)?;
        copy_range(ctx, src, src_offset, &tmp, 0, len)?;
        return copy_range(ctx, &tmp, 0, dst, dst_offset, len);
    }
    let bytes = |v: usize| v as u64 * 4;
    ctx.record(|enc| {
        enc.copy_buffer_to_buffer(
            src.raw(),
            bytes(src_offset),
            dst.raw(),
            bytes(dst_offset),
            bytes(len),
        )
    });
    Ok(())
}

/// A new buffer holding a copy of `src`.
///
/// # Errors
/// Device errors.
pub fn copy(ctx: &GpuContext, src: &GpuBuffer) -> Result<GpuBuffer> {
    let out = ctx.alloc(src.len())?;
    copy_range(ctx, src, 0, &out, 0, src.len())?;
    Ok(out)
}

/// Row-major strides of `dims` aligned to the right of `rank` axes, 0 on axes of size 1 and on
/// the missing leading axes (NumPy broadcasting).
fn broadcast_strides(dims: &[usize], rank: usize) -> Vec<u32> {
    let mut strides = vec![0u32; rank];
    let mut step = 1u64;
    for (k, &d) in dims.iter().enumerate().rev() {
        let axis = rank - dims.len() + k;
        strides[axis] = if d == 1 { 0 } else { step as u32 };
        step *= d as u64;
    }
    strides
}

fn numel(op: &'static str, dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| GpuError::Shape {
            op,
            message: format!("the shape {dims:?} overflows"),
        })
}

/// `out = a op b` with NumPy broadcasting: `a` of `a_dims`, `b` of `b_dims` (each right-aligned
/// to `out_dims`, every axis equal or 1), `out` of `out_dims`, all row-major f32.
///
/// # Errors
/// [`GpuError::Shape`] when a buffer disagrees with its dims or an operand does not broadcast
/// to `out_dims` (naming both); device errors.
pub fn binary(
    ctx: &GpuContext,
    op: BinaryOp,
    a: &GpuBuffer,
    a_dims: &[usize],
    b: &GpuBuffer,
    b_dims: &[usize],
    out_dims: &[usize],
) -> Result<GpuBuffer> {
    const OP: &str = "binary";
    let rank = out_dims.len();
    for (what, buf, dims) in [("a", a, a_dims), ("b", b, b_dims)] {
        expect_len(OP, what, buf, numel(OP, dims)?)?;
        if !riftco_kernels::broadcast::broadcasts_to(dims, out_dims) {
            return Err(GpuError::Shape {
                op: OP,
                message: format!("{what} of shape {dims:?} does not broadcast to {out_dims:?}"),
            });
        }
    }
    let n = numel(OP, out_dims)?;
    let out = ctx.alloc(n)?;
    if n == 0 {
        return Ok(out);
    }
    let mut words = dims_u32(OP, out_dims)?;
    to_u32(OP, "a", a.len())?;
    to_u32(OP, "b", b.len())?;
    words.extend(broadcast_strides(a_dims, rank));
    words.extend(broadcast_strides(b_dims, rank));
    let m = meta(ctx, &words)?;
    let mut p = Params::new(to_u32(OP, "n", n)?);
    p.op = binary_code(op);
    p.rank = rank as u32;
    run(ctx, OP, &[(0, a), (1, b), (2, &m), (3, &out)], &p, n)?;
    Ok(out)
}

/// `x` of `dims` reduced to the keepdims shape `out_dims` (same rank, each axis equal or 1):
/// each output element is the sum (f32, in the fixed tree order of [`super::reduce_rows`];
/// the CPU sums in f64, so results agree to rounding) or the max (exact; NaN if any element is
/// NaN) of its reduced elements. The reduced axes are first moved last by a [`gather`] (unless
/// they already are), so no invocation loops over the reduced elements.
///
/// # Errors
/// [`GpuError::Shape`] when `out_dims` is not a reduction shape of `dims` or `x` disagrees
/// with `dims`; device errors.
pub fn reduce_axes(
    ctx: &GpuContext,
    kind: ReduceOp,
    x: &GpuBuffer,
    dims: &[usize],
    out_dims: &[usize],
) -> Result<GpuBuffer> {
    const OP: &str = "reduce_axes";
    if !riftco_kernels::reduce::is_reduction_of(dims, out_dims) {
        return Err(GpuError::Shape {
            op: OP,
            message: format!("{out_dims:?} is not a keepdims reduction of {dims:?}"),
        });
    }
    expect_len(OP, "x", x, numel(OP, dims)?)?;
    let n = numel(OP, out_dims)?;
    if n == 0 {
        return ctx.alloc(0);
    }
    // Kept axes first, reduced axes last (each in its order), so that every output element
    // is one row of a `[n, reduced]` matrix that the multi-pass row reduction takes.
    let (kept, red): (Vec<usize>, Vec<usize>) =
        (0..dims.len()).partition(|&k| out_dims[k] == dims[k]);
    let cols = numel(OP, &red.iter().map(|&k| dims[k]).collect::<Vec<_>>())?;
    let perm: Vec<usize> = kept.into_iter().chain(red).collect();
    let mut strides = vec![0isize; dims.len()];
    let mut step = 1usize;
    for k in (0..dims.len()).rev() {
        strides[k] = isize::try_from(step).unwrap_or(isize::MAX);
        step = step.saturating_mul(dims[k]);
    }
    let moved: Vec<usize> = perm.iter().copied().filter(|&k| dims[k] > 1).collect();
    let rows_major = if moved.windows(2).all(|w| w[0] < w[1]) {
        None
    } else {
        let pd: Vec<usize> = perm.iter().map(|&k| dims[k]).collect();
        let ps: Vec<isize> = perm.iter().map(|&k| strides[k]).collect();
        Some(gather(ctx, x, &pd, &ps, 0)?)
    };
    super::reduce::reduce_rows(ctx, kind, rows_major.as_ref().unwrap_or(x), n, cols)
}

/// A strided view: dims, signed strides and the offset of element `(0, .., 0)`, in elements.
fn view_words(op: &'static str, dims: &[usize], strides: &[isize]) -> Result<Vec<u32>> {
    let mut words = dims_u32(op, dims)?;
    for &s in strides {
        let s = i32::try_from(s).map_err(|_| GpuError::Shape {
            op,
            message: format!("stride {s} exceeds the 32-bit signed range of the shaders"),
        })?;
        words.push(s as u32);
    }
    Ok(words)
}

fn offset_u32(op: &'static str, offset: usize, len: usize) -> Result<u32> {
    if len > i32::MAX as usize {
        return Err(GpuError::Shape {
            op,
            message: format!("{len} values exceed the 32-bit signed index range of the shaders"),
        });
    }
    to_u32(op, "offset", offset)
}

/// A contiguous copy of the view `(dims, strides, offset)` of `x`: element `(i0, .., ik)` is
/// `x[offset + Σ i_j · strides[j]]`. The caller has checked that the view lies inside `x`.
///
/// # Errors
/// [`GpuError::Shape`] for sizes beyond the shaders' 32-bit range; device errors.
pub fn gather(
    ctx: &GpuContext,
    x: &GpuBuffer,
    dims: &[usize],
    strides: &[isize],
    offset: usize,
) -> Result<GpuBuffer> {
    const OP: &str = "gather";
    let n = numel(OP, dims)?;
    let out = ctx.alloc(n)?;
    if n == 0 {
        return Ok(out);
    }
    let m = meta(ctx, &view_words(OP, dims, strides)?)?;
    let mut p = Params::new(to_u32(OP, "n", n)?);
    p.rank = dims.len() as u32;
    p.extra = offset_u32(OP, offset, x.len())?;
    run(ctx, OP, &[(0, x), (2, &m), (3, &out)], &p, n)?;
    Ok(out)
}

/// Whether the view addresses each of its elements' buffer positions once (then the scatter
/// runs in parallel): with the axes of size > 1 sorted by |stride|, each |stride| exceeds the
/// span of the axes inside it.
fn injective(dims: &[usize], strides: &[isize]) -> bool {
    let mut axes: Vec<(usize, usize)> = dims
        .iter()
        .zip(strides)
        .filter(|(&d, _)| d > 1)
        .map(|(&d, &s)| (s.unsigned_abs(), d))
        .collect();
    axes.sort_unstable();
    let mut span = 0usize;
    for (s, d) in axes {
        if s <= span {
            return false;
        }
        span = span.saturating_add(s.saturating_mul(d - 1));
    }
    true
}

/// Writes the contiguous `src` into the view `(dims, strides, offset)` of `dst` (adds with
/// `accumulate`), in place, in the view's row-major order (a view that addresses a position
/// twice is written by one invocation in that order; others in parallel). `src` and `dst` must
/// be distinct buffers; the caller has checked that the view lies inside `dst`.
///
/// # Errors
/// [`GpuError::Shape`] when `src` does not hold the view's elements; device errors.
pub fn scatter(
    ctx: &GpuContext,
    dst: &GpuBuffer,
    src: &GpuBuffer,
    dims: &[usize],
    strides: &[isize],
    offset: usize,
    accumulate: bool,
) -> Result<()> {
    const OP: &str = "scatter";
    let n = numel(OP, dims)?;
    expect_len(OP, "src", src, n)?;
    if n == 0 {
        return Ok(());
    }
    let m = meta(ctx, &view_words(OP, dims, strides)?)?;
    let mut p = Params::new(to_u32(OP, "n", n)?);
    p.rank = dims.len() as u32;
    p.extra = offset_u32(OP, offset, dst.len())?;
    let serial = !injective(dims, strides);
    if serial {
        // One invocation writes every element in order, each through a loop over the axes:
        // per element one iteration, the axes and their loop's exit test (measured on
        // llvmpipe: 21845 = 65535 / 3 elements of a rank-1 view), then the exit test.
        within_loop_limit(ctx, OP, || {
            let loops = n.saturating_mul(dims.len() + 2).saturating_add(1);
            let what = format!("a view addressing an element twice ({n} elements, in order)");
            (loops, what)
        })?;
    }
    p.flags = u32::from(accumulate) | (u32::from(serial) << 1);
    run(ctx, OP, &[(0, src), (2, &m), (3, dst)], &p, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn injectivity_of_views() {
        assert!(injective(&[2, 3], &[3, 1]));
        assert!(injective(&[3, 2], &[1, 3]));
        assert!(injective(&[4], &[-2]));
        assert!(!injective(&[2, 3], &[1, 1]));
        assert!(!injective(&[2], &[0]));
        assert!(injective(&[1, 5], &[0, 1]));
    }

    #[test]
    fn broadcast_strides_right_align() {
        assert_eq!(broadcast_strides(&[3, 1], 3), vec![0, 1, 0]);
        assert_eq!(broadcast_strides(&[2, 3, 4], 3), vec![12, 4, 1]);
        assert_eq!(broadcast_strides(&[], 2), vec![0, 0]);
    }
}
