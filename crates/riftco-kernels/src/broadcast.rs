//! Binary element-wise ops with NumPy broadcasting, [`BinaryOp`].
//!
//! Shapes are right-aligned; an operand's axis of size 1 (or a missing leading axis) stretches
//! to the output's: the kernel walks the operand with stride 0 along it. Inputs of the output's
//! shape take the contiguous path (SIMD add and mul of [`crate::elementwise`]). Every output
//! element depends only on its two operand elements, so large outputs are split into fixed row
//! ranges over the kernel pool and the result does not depend on the thread count.

use rayon::prelude::*;

use crate::par;

/// A binary element-wise op. The comparisons give `1.0` where they hold and `0.0` elsewhere
/// (IEEE semantics: every comparison with NaN is false except `Ne`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a − b`.
    Sub,
    /// `a · b`.
    Mul,
    /// `a / b`.
    Div,
    /// `a < b`.
    Lt,
    /// `a <= b`.
    Le,
    /// `a > b`.
    Gt,
    /// `a >= b`.
    Ge,
    /// `a == b`.
    Eq,
    /// `a != b`.
    Ne,
}

impl BinaryOp {
    /// Whether the op is a comparison (a non-differentiable `0/1` result).
    pub fn is_comparison(self) -> bool {
        !matches!(
            self,
            BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div
        )
    }

    /// `a op b` for one pair of elements.
    #[inline(always)]
    pub fn apply(self, a: f32, b: f32) -> f32 {
        let flag = |c: bool| if c { 1.0 } else { 0.0 };
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Lt => flag(a < b),
            BinaryOp::Le => flag(a <= b),
            BinaryOp::Gt => flag(a > b),
            BinaryOp::Ge => flag(a >= b),
            BinaryOp::Eq => flag(a == b),
            BinaryOp::Ne => flag(a != b),
        }
    }
}

/// The broadcast shape of `a` and `b` (NumPy rules), or `None` when an axis pair differs and
/// neither is 1.
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let at = |d: &[usize], i: usize| (i + d.len()).checked_sub(rank).map_or(1, |j| d[j]);
    (0..rank)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// Whether `operand` broadcasts to `out` (right-aligned, each axis equal or 1, rank <= out's).
pub fn broadcasts_to(operand: &[usize], out: &[usize]) -> bool {
    operand.len() <= out.len()
        && operand
            .iter()
            .rev()
            .zip(out.iter().rev())
            .all(|(&d, &o)| d == o || d == 1)
}

/// Row-major strides of `dims` seen in the `rank`-axis output space: 0 on missing and
/// stretched (size-1) axes.
fn broadcast_strides(dims: &[usize], out: &[usize]) -> Vec<usize> {
    let rank = out.len();
    let mut strides = vec![0; rank];
    let mut s = 1;
    for (k, &d) in dims.iter().enumerate().rev() {
        let axis = rank - dims.len() + k;
        strides[axis] = if d == 1 { 0 } else { s };
        s *= d;
    }
    strides
}

/// `out = a op b` with `a [a_dims]` and `b [b_dims]` broadcast to `out [out_dims]`.
///
/// # Panics
/// When a slice's length disagrees with its dims or an operand does not broadcast to
/// `out_dims` (the tensor layer checks both and returns errors).
pub fn binary(
    kind: BinaryOp,
    a: &[f32],
    a_dims: &[usize],
    b: &[f32],
    b_dims: &[usize],
    out_dims: &[usize],
    out: &mut [f32],
) {
    let numel = |d: &[usize]| d.iter().product::<usize>();
    assert_eq!(a.len(), numel(a_dims), "binary: a's length");
    assert_eq!(b.len(), numel(b_dims), "binary: b's length");
    assert_eq!(out.len(), numel(out_dims), "binary: output length");
    assert!(
        broadcasts_to(a_dims, out_dims) && broadcasts_to(b_dims, out_dims),
        "binary: {a_dims:?} and {b_dims:?} do not broadcast to {out_dims:?}"
    );
    if out.is_empty() {
        return;
    }
    if a.len() == out.len() && b.len() == out.len() {
        // Same shape (up to size-1 axes): the contiguous path.
        match kind {
            BinaryOp::Add => crate::elementwise::add(a, b, out),
            BinaryOp::Mul => crate::elementwise::mul(a, b, out),
            _ => contiguous(kind, a, b, out),
        }
        return;
    }
    match kind {
        BinaryOp::Add => walk(|x, y| x + y, a, a_dims, b, b_dims, out_dims, out),
        BinaryOp::Sub => walk(|x, y| x - y, a, a_dims, b, b_dims, out_dims, out),
        BinaryOp::Mul => walk(|x, y| x * y, a, a_dims, b, b_dims, out_dims, out),
        BinaryOp::Div => walk(|x, y| x / y, a, a_dims, b, b_dims, out_dims, out),
        k => walk(
            move |x, y| k.apply(x, y),
            a,
            a_dims,
            b,
            b_dims,
            out_dims,
            out,
        ),
    }
}

fn contiguous(kind: BinaryOp, a: &[f32], b: &[f32], out: &mut [f32]) {
    let serial = |a: &[f32], b: &[f32], out: &mut [f32]| match kind {
        BinaryOp::Sub => out
            .iter_mut()
            .zip(a.iter().zip(b))
            .for_each(|(o, (&x, &y))| *o = x - y),
        BinaryOp::Div => out
            .iter_mut()
            .zip(a.iter().zip(b))
            .for_each(|(o, (&x, &y))| *o = x / y),
        k => out
            .iter_mut()
            .zip(a.iter().zip(b))
            .for_each(|(o, (&x, &y))| *o = k.apply(x, y)),
    };
    match par::elements_per_task(out.len()) {
        None => serial(a, b, out),
        Some(n) => par::install(|| {
            out.par_chunks_mut(n)
                .zip(a.par_chunks(n).zip(b.par_chunks(n)))
                .for_each(|(o, (a, b))| serial(a, b, o));
        }),
    }
}

/// The strided walk: rows of the output's last axis, each operand read at its broadcast
/// strides.
#[allow(clippy::too_many_arguments)]
fn walk(
    f: impl Fn(f32, f32) -> f32 + Sync,
    a: &[f32],
    a_dims: &[usize],
    b: &[f32],
    b_dims: &[usize],
    out_dims: &[usize],
    out: &mut [f32],
) {
    let rank = out_dims.len();
    let (sa, sb) = (
        broadcast_strides(a_dims, out_dims),
        broadcast_strides(b_dims, out_dims),
    );
    let cols = out_dims[rank - 1];
    let (ca, cb) = (sa[rank - 1], sb[rank - 1]);
    // The operands' offsets of the first element of output row `r`.
    let offsets = |r: usize| {
        let (mut rem, mut oa, mut ob) = (r, 0, 0);
        for axis in (0..rank - 1).rev() {
            let i = rem % out_dims[axis];
            rem /= out_dims[axis];
            oa += i * sa[axis];
            ob += i * sb[axis];
        }
        (oa, ob)
    };
    let rows_of = |first_row: usize, chunk: &mut [f32]| {
        for (k, row) in chunk.chunks_exact_mut(cols).enumerate() {
            let (oa, ob) = offsets(first_row + k);
            match (ca, cb) {
                (1, 1) => row
                    .iter_mut()
                    .zip(a[oa..oa + cols].iter().zip(&b[ob..ob + cols]))
                    .for_each(|(o, (&x, &y))| *o = f(x, y)),
                (1, _) => {
                    let y = b[ob];
                    row.iter_mut()
                        .zip(&a[oa..oa + cols])
                        .for_each(|(o, &x)| *o = f(x, y));
                }
                (_, 1) => {
                    let x = a[oa];
                    row.iter_mut()
                        .zip(&b[ob..ob + cols])
                        .for_each(|(o, &y)| *o = f(x, y));
                }
                _ => row.fill(f(a[oa], b[ob])),
            }
        }
    };
    match par::rows_per_task(out.len() / cols, cols) {
        None => rows_of(0, out),
        Some(rows) => par::install(|| {
            out.par_chunks_mut(rows * cols)
                .enumerate()
                .for_each(|(t, chunk)| rows_of(t * rows, chunk));
        }),
    }
}
