//! Strided views of a contiguous buffer: [`gather_strided`] copies a view into a contiguous
//! buffer, [`scatter_strided`] writes (or adds) a contiguous buffer into a view. Together they
//! express permutations of axes, basic slicing with steps (negative included), integer indexing
//! and the slots of a concatenation, and each other's VJP.

/// A view of a contiguous buffer: element `(i0, .., ik)` (row-major over `dims`) is the
/// buffer element `offset + Σ_j i_j · strides[j]`. Strides may be negative (reversed axes) or
/// zero.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct StridedView {
    /// The view's dimensions, outermost first.
    pub dims: Vec<usize>,
    /// The buffer step of each axis, in elements (one per dimension).
    pub strides: Vec<isize>,
    /// The buffer index of element `(0, .., 0)`.
    pub offset: usize,
}

impl StridedView {
    /// The contiguous row-major view of `dims` (strides `[.., dims[k-1], 1]`, offset 0).
    pub fn contiguous(dims: &[usize]) -> Self {
        let mut strides = vec![0isize; dims.len()];
        let mut step: isize = 1;
        for (s, &d) in strides.iter_mut().zip(dims).rev() {
            *s = step;
            step = step.saturating_mul(d.max(1) as isize);
        }
        StridedView {
            dims: dims.to_vec(),
            strides,
            offset: 0,
        }
    }

    /// The number of elements of the view (`None` when the product overflows `usize`).
    pub fn numel(&self) -> Option<usize> {
        self.dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
    }

    /// Why the view does not lie inside a buffer of `len` elements (`None` when it does): the
    /// dimensions and strides differ in count, or the lowest or highest element it addresses
    /// is outside `0..len`. An empty view (a zero dimension) lies inside any buffer.
    pub fn check(&self, len: usize) -> Option<String> {
        if self.dims.len() != self.strides.len() {
            return Some(format!(
                "view of dims {:?} has {} strides {:?}; expected one per dimension",
                self.dims,
                self.strides.len(),
                self.strides
            ));
        }
        if self.dims.contains(&0) {
            return None;
        }
        // i128: (d − 1)·stride summed over at most a few axes cannot overflow it.
        let (mut lo, mut hi) = (self.offset as i128, self.offset as i128);
        for (&d, &s) in self.dims.iter().zip(&self.strides) {
            let span = (d as i128 - 1) * s as i128;
            if span < 0 {
                lo += span;
            } else {
                hi += span;
            }
        }
        if lo < 0 || hi >= len as i128 {
            return Some(format!(
                "view of dims {:?}, strides {:?}, offset {} addresses elements {lo}..={hi}, \
                 outside a buffer of {len} elements",
                self.dims, self.strides, self.offset
            ));
        }
        None
    }

    /// Calls `f(k, index)` for the `k`-th element of the view (row-major) and its buffer index.
    /// The view must lie inside the buffer ([`StridedView::check`]).
    fn for_each(&self, mut f: impl FnMut(usize, usize)) {
        let rank = self.dims.len();
        if self.dims.contains(&0) {
            return;
        }
        if rank == 0 {
            f(0, self.offset);
            return;
        }
        let last = self.dims[rank - 1];
        let last_stride = self.strides[rank - 1];
        let mut idx = vec![0usize; rank - 1];
        let mut base = self.offset as isize;
        let mut k = 0;
        loop {
            let mut p = base;
            for _ in 0..last {
                f(k, p as usize);
                k += 1;
                p += last_stride;
            }
            // Advance the odometer over the outer axes.
            let mut axis = rank - 1;
            loop {
                if axis == 0 {
                    return;
                }
                axis -= 1;
                idx[axis] += 1;
                base += self.strides[axis];
                if idx[axis] < self.dims[axis] {
                    break;
                }
                base -= self.strides[axis] * self.dims[axis] as isize;
                idx[axis] = 0;
            }
        }
    }
}

/// `out[k] = x[index of element k of view]` (a contiguous copy of the view).
///
/// # Panics
/// When the view does not lie inside `x` ([`StridedView::check`]) or `out` does not hold
/// exactly the view's elements: callers validate first.
pub fn gather_strided(x: &[f32], view: &StridedView, out: &mut [f32]) {
    assert!(
        view.check(x.len()).is_none(),
        "gather_strided: view outside x"
    );
    assert_eq!(
        Some(out.len()),
        view.numel(),
        "gather_strided: output length"
    );
    view.for_each(|k, i| out[k] = x[i]);
}

/// `dst[index of element k of view] = src[k]` (or `+=` with `accumulate`), in row-major order
/// of the view (so a view that addresses an element twice is deterministic: the last write
/// wins, or every addition is made in order).
///
/// # Panics
/// When the view does not lie inside `dst` or `src` does not hold exactly the view's elements:
/// callers validate first.
pub fn scatter_strided(dst: &mut [f32], src: &[f32], view: &StridedView, accumulate: bool) {
    assert!(
        view.check(dst.len()).is_none(),
        "scatter_strided: view outside dst"
    );
    assert_eq!(
        Some(src.len()),
        view.numel(),
        "scatter_strided: source length"
    );
    if accumulate {
        view.for_each(|k, i| dst[i] += src[k]);
    } else {
        view.for_each(|k, i| dst[i] = src[k]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iota(n: usize) -> Vec<f32> {
        (0..n).map(|i| i as f32).collect()
    }

    #[test]
    fn contiguous_view_is_the_identity() {
        let x = iota(24);
        let v = StridedView::contiguous(&[2, 3, 4]);
        let mut out = vec![0.0; 24];
        gather_strided(&x, &v, &mut out);
        assert_eq!(out, x);
    }

    #[test]
    fn permuted_strides_transpose() {
        // x [2, 3] → x^T [3, 2]
        let x = iota(6);
        let v = StridedView {
            dims: vec![3, 2],
            strides: vec![1, 3],
            offset: 0,
        };
        let mut out = vec![0.0; 6];
        gather_strided(&x, &v, &mut out);
        assert_eq!(out, vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    }

    #[test]
    fn negative_steps_reverse_and_rank_zero_reads_one_element() {
        let x = iota(5);
        let v = StridedView {
            dims: vec![3],
            strides: vec![-2],
            offset: 4,
        };
        let mut out = vec![0.0; 3];
        gather_strided(&x, &v, &mut out);
        assert_eq!(out, vec![4.0, 2.0, 0.0]);
        let v = StridedView {
            dims: vec![],
            strides: vec![],
            offset: 3,
        };
        let mut one = vec![0.0; 1];
        gather_strided(&x, &v, &mut one);
        assert_eq!(one, vec![3.0]);
    }

    #[test]
    fn check_rejects_views_outside_the_buffer_and_accepts_empty_ones() {
        let v = StridedView {
            dims: vec![3],
            strides: vec![-2],
            offset: 3,
        };
        assert!(v.check(5).unwrap().contains("-1..=3"));
        let v = StridedView {
            dims: vec![2, 3],
            strides: vec![3, 1],
            offset: 1,
        };
        assert!(v.check(6).is_some());
        assert!(v.check(7).is_none());
        let empty = StridedView {
            dims: vec![0, 3],
            strides: vec![100, 100],
            offset: 1000,
        };
        assert!(empty.check(1).is_none());
        let bad = StridedView {
            dims: vec![2],
            strides: vec![],
            offset: 0,
        };
        assert!(bad.check(10).unwrap().contains("one per dimension"));
    }

    #[test]
    fn scatter_writes_and_accumulates_into_the_view() {
        let mut dst = vec![1.0; 6];
        let v = StridedView {
            dims: vec![2],
            strides: vec![3],
            offset: 1,
        };
        scatter_strided(&mut dst, &[5.0, 7.0], &v, false);
        assert_eq!(dst, vec![1.0, 5.0, 1.0, 1.0, 7.0, 1.0]);
        scatter_strided(&mut dst, &[5.0, 7.0], &v, true);
        assert_eq!(dst, vec![1.0, 10.0, 1.0, 1.0, 14.0, 1.0]);
    }
}
