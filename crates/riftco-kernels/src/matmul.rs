//! Matrix products through the `gemm` crate's kernels, at the SIMD level riftco selects
//! ([`crate::simd::arch`]; see `gemm_level`).
//!
//! `C[m, n] (+)= op(A)[m, k] · op(B)[k, n]`, where `op(A) = A` is stored `[m, k]` row-major and
//! `op(A) = Aᵀ` means `A` is stored `[k, m]`; likewise for `B`. These are the four variants the
//! backward passes need (`dA = dC·Bᵀ`, `dB = Aᵀ·dC`). Work runs on the kernel thread pool; `gemm`
//! splits the output into blocks and reduces each block's `k` axis in a fixed order, so results
//! do not depend on the thread count. A one-row product against a weight stored `[n, k]` (a linear
//! layer on one token, the decode shape) takes a matrix-vector path instead (`matvec`): one dot
//! product per contiguous row, so the weight is streamed once.

use gemm_common::Parallelism;

use crate::gemm_level::{self, Product};
use crate::matvec::matvec_rows;

/// Sizes and transposition flags of one product `C[m, n] (+)= op(A)[m, k] · op(B)[k, n]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulSpec {
    /// Rows of `C` and of `op(A)`.
    pub m: usize,
    /// Shared (reduced) dimension.
    pub k: usize,
    /// Columns of `C` and of `op(B)`.
    pub n: usize,
    /// `A` is stored `[k, m]` and used transposed.
    pub trans_a: bool,
    /// `B` is stored `[n, k]` and used transposed.
    pub trans_b: bool,
    /// Add into `C` instead of overwriting it.
    pub accumulate: bool,
}

impl MatmulSpec {
    /// `C[m, n] = A[m, k] · B[k, n]`, overwriting `C`.
    pub fn new(m: usize, k: usize, n: usize) -> Self {
        Self {
            m,
            k,
            n,
            trans_a: false,
            trans_b: false,
            accumulate: false,
        }
    }

    /// Use `A` transposed (stored `[k, m]`).
    pub fn trans_a(mut self, t: bool) -> Self {
        self.trans_a = t;
        self
    }

    /// Use `B` transposed (stored `[n, k]`).
    pub fn trans_b(mut self, t: bool) -> Self {
        self.trans_b = t;
        self
    }

    /// Add into `C` instead of overwriting it.
    pub fn accumulate(mut self, acc: bool) -> Self {
        self.accumulate = acc;
        self
    }
}

/// `c (+)= op(a) · op(b)` for one product.
///
/// # Panics
/// When a slice length disagrees with the spec (`a.len() != m*k`, `b.len() != k*n`,
/// `c.len() != m*n`). Callers (the tensor layer) validate shapes and return errors first.
pub fn matmul(spec: MatmulSpec, a: &[f32], b: &[f32], c: &mut [f32]) {
    let parallelism = parallelism_for(spec);
    crate::threading::thread_pool().install(|| gemm_checked("matmul", spec, a, b, c, parallelism));
}

/// The kernel threads of one product: small products are faster on one thread (rayon's
/// fork/join costs more than they do).
fn parallelism_for(spec: MatmulSpec) -> Parallelism {
    let MatmulSpec { m, k, n, .. } = spec;
    let threads = crate::threading::num_threads();
    if threads > 1 && m * n * k >= 64 * 64 * 64 {
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    }
}

/// Row strides (leading dimensions) of the three stored matrices of a product: the number of
/// elements from one stored row to the next (`A` stored `[m, k]`, or `[k, m]` when transposed;
/// likewise `B`; `C` stored `[m, n]`). [`Strides::packed`] gives the contiguous ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strides {
    /// Row stride of the stored `A`.
    pub a: usize,
    /// Row stride of the stored `B`.
    pub b: usize,
    /// Row stride of `C`.
    pub c: usize,
}

impl Strides {
    /// The strides of contiguous operands of `spec`.
    pub fn packed(spec: MatmulSpec) -> Self {
        let MatmulSpec { m, k, n, .. } = spec;
        Self {
            a: if spec.trans_a { m } else { k },
            b: if spec.trans_b { k } else { n },
            c: n,
        }
    }
}

/// [`matmul`] on operands that are blocks of columns of wider row-major matrices: each stored
/// matrix's rows are `strides` elements apart (at least its row length), so a product can read
/// or write a column range of a larger matrix in place instead of through a copy. The results
/// are bitwise those of [`matmul`] on contiguous copies of the same operands (the product's
/// blocking depends on `m`, `k` and `n` only).
///
/// # Panics
/// When a stride is shorter than its stored row or a slice is too short for its rows.
pub fn matmul_strided(spec: MatmulSpec, a: &[f32], b: &[f32], c: &mut [f32], strides: Strides) {
    let parallelism = parallelism_for(spec);
    crate::threading::thread_pool()
        .install(|| gemm_run("matmul_strided", spec, a, b, c, strides, parallelism));
}

/// Validates lengths, handles empty products, and runs one `gemm` call with `parallelism`.
fn gemm_checked(
    op: &'static str,
    spec: MatmulSpec,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    parallelism: Parallelism,
) {
    let MatmulSpec { m, k, n, .. } = spec;
    assert_eq!(a.len(), m * k, "{op}: lhs length");
    assert_eq!(b.len(), k * n, "{op}: rhs length");
    assert_eq!(c.len(), m * n, "{op}: dst length");
    gemm_run(op, spec, a, b, c, Strides::packed(spec), parallelism);
}

/// The elements a stored `[rows, cols]` matrix with row stride `ld` spans (0 when empty).
fn span(rows: usize, cols: usize, ld: usize) -> usize {
    match rows == 0 || cols == 0 {
        true => 0,
        false => (rows - 1) * ld + cols,
    }
}

/// Checks the strided extents, handles empty products, and runs one `gemm` call.
fn gemm_run(
    op: &'static str,
    spec: MatmulSpec,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    ld: Strides,
    parallelism: Parallelism,
) {
    let MatmulSpec { m, k, n, .. } = spec;
    let (a_rows, a_cols) = if spec.trans_a { (k, m) } else { (m, k) };
    let (b_rows, b_cols) = if spec.trans_b { (n, k) } else { (k, n) };
    assert!(
        ld.a >= a_cols && ld.b >= b_cols && ld.c >= n,
        "{op}: row stride shorter than a row"
    );
    assert!(a.len() >= span(a_rows, a_cols, ld.a), "{op}: lhs length");
    assert!(b.len() >= span(b_rows, b_cols, ld.b), "{op}: rhs length");
    assert!(c.len() >= span(m, n, ld.c), "{op}: dst length");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !spec.accumulate {
            for row in 0..m {
                c[row * ld.c..row * ld.c + n].fill(0.0);
            }
        }
        return;
    }
    if m == 1 && !spec.trans_a && spec.trans_b {
        // One row against a weight stored [n, k]: the decode shape, memory-bound. A dot product
        // per contiguous row of B streams it once (GEMM would pack it first).
        let parallel = !matches!(parallelism, Parallelism::None);
        matvec_rows(&a[..k], b, ld.b, &mut c[..n], spec.accumulate, parallel);
        return;
    }
    // Row-major A[m,k]: column stride 1, row stride lda. Transposed (stored [k,m]): cs = lda,
    // rs = 1.
    let (a_cs, a_rs) = if spec.trans_a {
        (ld.a as isize, 1)
    } else {
        (1, ld.a as isize)
    };
    let (b_cs, b_rs) = if spec.trans_b {
        (ld.b as isize, 1)
    } else {
        (1, ld.b as isize)
    };
    // SAFETY: the asserts above guarantee every strided access stays inside its slice: each
    // stored matrix's last row starts at (rows - 1) * ld and holds cols elements.
    unsafe {
        gemm_level::gemm(
            Product {
                m,
                n,
                k,
                dst: c.as_mut_ptr(),
                dst_cs: 1,
                dst_rs: ld.c as isize,
                read_dst: spec.accumulate,
                lhs: a.as_ptr(),
                lhs_cs: a_cs,
                lhs_rs: a_rs,
                rhs: b.as_ptr(),
                rhs_cs: b_cs,
                rhs_rs: b_rs,
                alpha: if spec.accumulate { 1.0 } else { 0.0 },
                beta: 1.0,
            },
            parallelism,
        );
    }
}

/// `batch` independent products on contiguous stacks: `a` holds `batch` matrices of `m*k`
/// elements, `b` of `k*n`, `c` of `m*n`. Batches run in parallel, each product single-threaded,
/// so results are bitwise independent of the thread count.
///
/// # Panics
/// When a slice length is not `batch` times the per-matrix size.
pub fn batched_matmul(batch: usize, spec: MatmulSpec, a: &[f32], b: &[f32], c: &mut [f32]) {
    use rayon::prelude::*;
    let (sa, sb, sc) = (spec.m * spec.k, spec.k * spec.n, spec.m * spec.n);
    assert_eq!(a.len(), batch * sa, "batched_matmul: lhs length");
    assert_eq!(b.len(), batch * sb, "batched_matmul: rhs length");
    assert_eq!(c.len(), batch * sc, "batched_matmul: dst length");
    if batch == 0 || sc == 0 {
        return;
    }
    let run_one = |i: usize, c_i: &mut [f32]| {
        let a_i = &a[i * sa..(i + 1) * sa];
        let b_i = &b[i * sb..(i + 1) * sb];
        matmul_serial(spec, a_i, b_i, c_i);
    };
    crate::threading::thread_pool().install(|| {
        c.par_chunks_mut(sc)
            .enumerate()
            .for_each(|(i, c_i)| run_one(i, c_i));
    });
}

/// One product on the calling thread only (no rayon): for callers that already parallelise
/// over independent products, such as attention tiles.
///
/// # Panics
/// When a slice length disagrees with the spec.
pub fn matmul_serial(spec: MatmulSpec, a: &[f32], b: &[f32], c: &mut [f32]) {
    gemm_checked("matmul_serial", spec, a, b, c, Parallelism::None);
}
