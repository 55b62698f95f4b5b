//! Reductions over axes, [`ReduceOp`]: `x [dims]` to the keepdims shape `out_dims` (same rank,
//! each axis equal to `x`'s or 1), the sum and mean over axes and the VJP of broadcasting
//! (a gradient reduced to its operand's shape).
//!
//! The order is fixed: every output element accumulates its inputs in row-major index order
//! (sums in `f64`, rounded to `f32` once), so results are deterministic; the kernel runs on
//! the calling thread.

/// A reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// The sum (0 over an empty axis).
    Sum,
    /// The maximum (NaN if any element is NaN; `−inf` over an empty axis, which callers
    /// reject).
    Max,
}

/// Whether `out_dims` is a keepdims reduction shape of `dims`: same rank, each axis equal or 1.
pub fn is_reduction_of(dims: &[usize], out_dims: &[usize]) -> bool {
    dims.len() == out_dims.len() && dims.iter().zip(out_dims).all(|(&d, &o)| o == d || o == 1)
}

/// `out = reduce(x)` from `x [dims]` to `out [out_dims]` (see the module docs).
///
/// # Panics
/// When a slice's length disagrees with its dims or `out_dims` is not a reduction shape of
/// `dims` (the tensor layer checks both and returns errors).
pub fn reduce(kind: ReduceOp, x: &[f32], dims: &[usize], out_dims: &[usize], out: &mut [f32]) {
    assert!(
        is_reduction_of(dims, out_dims),
        "reduce: {dims:?} to {out_dims:?}"
    );
    assert_eq!(
        x.len(),
        dims.iter().product::<usize>(),
        "reduce: x's length"
    );
    assert_eq!(
        out.len(),
        out_dims.iter().product::<usize>(),
        "reduce: output length"
    );
    if out.is_empty() {
        return;
    }
    if x.len() == out.len() {
        out.copy_from_slice(x);
        return;
    }
    let rank = dims.len();
    // Row-major strides of the output, 0 on reduced axes.
    let mut ostride = vec![0; rank];
    let mut s = 1;
    for axis in (0..rank).rev() {
        ostride[axis] = if out_dims[axis] == 1 { 0 } else { s };
        s *= out_dims[axis];
    }
    let cols = dims[rank - 1];
    let inner_reduced = out_dims[rank - 1] == 1 && cols != 1;
    let row_offset = |r: usize| {
        let (mut rem, mut o) = (r, 0);
        for axis in (0..rank - 1).rev() {
            o += (rem % dims[axis]) * ostride[axis];
            rem /= dims[axis];
        }
        o
    };
    let rows = x.len().checked_div(cols).unwrap_or(0);
    match kind {
        ReduceOp::Sum => {
            let mut acc = vec![0.0f64; out.len()];
            for r in 0..rows {
                let o = row_offset(r);
                let row = &x[r * cols..(r + 1) * cols];
                if inner_reduced {
                    let mut t = acc[o];
                    for &v in row {
                        t += v as f64;
                    }
                    acc[o] = t;
                } else {
                    for (a, &v) in acc[o..o + cols].iter_mut().zip(row) {
                        *a += v as f64;
                    }
                }
            }
            for (o, a) in out.iter_mut().zip(acc) {
                *o = a as f32;
            }
        }
        ReduceOp::Max => {
            out.fill(f32::NEG_INFINITY);
            let step = |m: &mut f32, v: f32| {
                if !m.is_nan() && (v.is_nan() || v > *m) {
                    *m = v;
                }
            };
            for r in 0..rows {
                let o = row_offset(r);
                let row = &x[r * cols..(r + 1) * cols];
                if inner_reduced {
                    row.iter().for_each(|&v| step(&mut out[o], v));
                } else {
                    for (m, &v) in out[o..o + cols].iter_mut().zip(row) {
                        step(m, v);
                    }
                }
            }
        }
    }
}
