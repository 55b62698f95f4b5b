//! Single-threaded matrix products on strided views, for kernels (attention) whose tiles are rows
//! of a larger tensor: `gemm` reads and writes through arbitrary row and column strides, so a
//! head's rows inside a `[batch, seq, heads, d_head]` tensor need no gather or transpose.

/// A read-only matrix view: element `(i, j)` is `data[offset + i·row_stride + j·col_stride]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MatRef<'a> {
    pub data: &'a [f32],
    pub offset: usize,
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

impl<'a> MatRef<'a> {
    /// Rows `offset + i·row_stride` of `cols` contiguous elements each.
    pub fn rows(
        data: &'a [f32],
        offset: usize,
        rows: usize,
        cols: usize,
        row_stride: usize,
    ) -> Self {
        Self {
            data,
            offset,
            rows,
            cols,
            row_stride,
            col_stride: 1,
        }
    }

    /// The transpose of this view (no data moves).
    pub fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    /// Asserts that every element of the view lies inside `data`.
    fn check(&self, what: &str) {
        if self.rows > 0 && self.cols > 0 {
            let last =
                self.offset + (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride;
            assert!(
                last < self.data.len(),
                "strided gemm: {what} view out of bounds"
            );
        }
    }
}

/// A pointer to the start of an `f32` buffer of `len` elements that several tasks write through,
/// each to its own, disjoint set of elements.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SharedMut {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: `SharedMut` is only a pointer; every writer goes through `gemm_into_shared` or
// `write_row`, whose callers guarantee that concurrent tasks write disjoint elements.
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

impl SharedMut {
    pub fn new(buf: &mut [f32]) -> Self {
        Self {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
        }
    }

    /// Copies `src` to elements `offset..offset + src.len()`.
    ///
    /// # Safety
    /// No other task may read or write those elements concurrently, and the buffer must outlive
    /// the call.
    pub unsafe fn write_row(&self, offset: usize, src: &[f32]) {
        assert!(offset + src.len() <= self.len, "write_row out of bounds");
        // SAFETY: in bounds (asserted); exclusive access to these elements is the caller's
        // promise. An element loop rather than `copy_nonoverlapping`: rows are short (d_head)
        // and a `memmove` call per row cost more than the copy.
        for (i, &x) in src.iter().enumerate() {
            unsafe { self.ptr.add(offset + i).write(x) };
        }
    }
}

/// `C (+)= A · B` on the calling thread, `C` being `a.rows × b.cols` at `c_offset` with row
/// stride `c_row_stride` (columns contiguous) inside `c`.
///
/// # Safety
/// No other task may read or write the elements of `C` concurrently, and `c`'s buffer must
/// outlive the call. `C` must not overlap `a` or `b` (they are shared borrows, so it cannot
/// unless the caller aliases the buffer behind `c`).
pub(crate) unsafe fn gemm_into_shared(
    c: SharedMut,
    c_offset: usize,
    c_row_stride: usize,
    accumulate: bool,
    a: MatRef<'_>,
    b: MatRef<'_>,
) {
    assert_eq!(a.cols, b.rows, "strided gemm: inner dimensions");
    a.check("lhs");
    b.check("rhs");
    let (m, n, k) = (a.rows, b.cols, a.cols);
    if m == 0 || n == 0 {
        return;
    }
    let last = c_offset + (m - 1) * c_row_stride + (n - 1);
    assert!(last < c.len, "strided gemm: dst view out of bounds");
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                // SAFETY: row i of C is in bounds (checked above); exclusive by the contract.
                unsafe { std::ptr::write_bytes(c.ptr.add(c_offset + i * c_row_stride), 0, n) };
            }
        }
        return;
    }
    // SAFETY: all three views were bounds-checked above; `gemm` reads A and B through shared
    // borrows and writes only the m×n elements of C, which the caller owns exclusively.
    unsafe {
        crate::gemm_level::gemm(
            crate::gemm_level::Product {
                m,
                n,
                k,
                dst: c.ptr.add(c_offset),
                dst_cs: 1,
                dst_rs: c_row_stride as isize,
                read_dst: accumulate,
                lhs: a.data.as_ptr().add(a.offset),
                lhs_cs: a.col_stride as isize,
                lhs_rs: a.row_stride as isize,
                rhs: b.data.as_ptr().add(b.offset),
                rhs_cs: b.col_stride as isize,
                rhs_rs: b.row_stride as isize,
                alpha: if accumulate { 1.0 } else { 0.0 },
                beta: 1.0,
            },
            gemm_common::Parallelism::None,
        );
    }
}

/// `c (+)= A · B` for a contiguous, exclusively borrowed `c` (`a.rows × b.cols`, row stride
/// `b.cols`).
pub(crate) fn gemm_into(c: &mut [f32], accumulate: bool, a: MatRef<'_>, b: MatRef<'_>) {
    assert_eq!(c.len(), a.rows * b.cols, "strided gemm: dst length");
    let n = b.cols;
    // SAFETY: `c` is exclusively borrowed for the call, so no other task touches it, and it
    // cannot overlap the shared borrows behind `a` and `b`.
    unsafe { gemm_into_shared(SharedMut::new(c), 0, n, accumulate, a, b) }
}
