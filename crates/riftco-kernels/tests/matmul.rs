//! GEMM (all four transposition variants, accumulate, batched, serial) against a naive f64
//! product. Bound: each output is a dot product of `k` terms summed in f32 (with FMA), so
//! `|err| <= (k + 2)·U·Σ_p |a_ip b_pj|` (+ `U|c|` when accumulating).

mod common;

use common::{vec_from_seed, U};
use proptest::prelude::*;
use riftco_kernels::matmul::{
    batched_matmul, matmul, matmul_serial, matmul_strided, MatmulSpec, Strides,
};

fn reference(spec: MatmulSpec, a: &[f32], b: &[f32], c0: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let MatmulSpec { m, k, n, .. } = spec;
    let at = |i: usize, p: usize| if spec.trans_a { a[p * m + i] } else { a[i * k + p] } as f64;
    let bt = |p: usize, j: usize| if spec.trans_b { b[j * k + p] } else { b[p * n + j] } as f64;
    let mut want = vec![0.0; m * n];
    let mut tol = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut sa) = (0.0, 0.0);
            for p in 0..k {
                s += at(i, p) * bt(p, j);
                sa += (at(i, p) * bt(p, j)).abs();
            }
            let c = if spec.accumulate {
                c0[i * n + j] as f64
            } else {
                0.0
            };
            want[i * n + j] = s + c;
            tol[i * n + j] = (k + 2) as f64 * U * (sa + c.abs()) + 1e-30;
        }
    }
    (want, tol)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn matmul_variants(m in 1usize..40, k in 0usize..70, n in 1usize..40,
                       ta in any::<bool>(), tb in any::<bool>(), acc in any::<bool>(), seed in any::<u64>()) {
        let spec = MatmulSpec::new(m, k, n).trans_a(ta).trans_b(tb).accumulate(acc);
        let a = vec_from_seed(m * k, seed, 1.0);
        let b = vec_from_seed(k * n, seed ^ 1, 1.0);
        let c0 = vec_from_seed(m * n, seed ^ 2, 1.0);
        let (want, tol) = reference(spec, &a, &b, &c0);
        let mut c = c0.clone();
        matmul(spec, &a, &b, &mut c);
        common::assert_close("matmul", &c, &want, |i| tol[i]);
        let mut c = c0.clone();
        matmul_serial(spec, &a, &b, &mut c);
        common::assert_close("matmul_serial", &c, &want, |i| tol[i]);
    }

    #[test]
    fn batched(batch in 1usize..5, m in 1usize..20, k in 1usize..20, n in 1usize..20,
               ta in any::<bool>(), tb in any::<bool>(), acc in any::<bool>(), seed in any::<u64>()) {
        let spec = MatmulSpec::new(m, k, n).trans_a(ta).trans_b(tb).accumulate(acc);
        let a = vec_from_seed(batch * m * k, seed, 1.0);
        let b = vec_from_seed(batch * k * n, seed ^ 1, 1.0);
        let c0 = vec_from_seed(batch * m * n, seed ^ 2, 1.0);
        let mut c = c0.clone();
        batched_matmul(batch, spec, &a, &b, &mut c);
        for i in 0..batch {
            let (want, tol) = reference(spec, &a[i * m * k..(i + 1) * m * k], &b[i * k * n..(i + 1) * k * n], &c0[i * m * n..(i + 1) * m * n]);
            common::assert_close("batched_matmul", &c[i * m * n..(i + 1) * m * n], &want, |j| tol[j]);
        }
    }
}

/// A large product that takes gemm's multi-threaded, AVX-512 path.
#[test]
fn large_square_all_variants() {
    let (m, k, n) = (200, 300, 150);
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let spec = MatmulSpec::new(m, k, n)
            .trans_a(ta)
            .trans_b(tb)
            .accumulate(true);
        let a = vec_from_seed(m * k, 11, 1.0);
        let b = vec_from_seed(k * n, 12, 1.0);
        let c0 = vec_from_seed(m * n, 13, 1.0);
        let (want, tol) = reference(spec, &a, &b, &c0);
        let mut c = c0.clone();
        matmul(spec, &a, &b, &mut c);
        common::assert_close("matmul.large", &c, &want, |i| tol[i]);
    }
}

/// Strided operands (column blocks of wider matrices, read and written in place) give the bits
/// of the contiguous product, in every transposition variant, and leave the other columns of a
/// strided output untouched.
#[test]
fn strided_operands_give_the_contiguous_products_bits() {
    let (m, k, n, pad) = (70, 33, 90, 7);
    for (trans_a, trans_b, accumulate) in [
        (false, false, false),
        (false, true, false),
        (true, false, true),
        (true, true, true),
    ] {
        let spec = MatmulSpec::new(m, k, n)
            .trans_a(trans_a)
            .trans_b(trans_b)
            .accumulate(accumulate);
        let (a, b, c0) = (
            vec_from_seed(m * k, 1, 1.0),
            vec_from_seed(k * n, 2, 1.0),
            vec_from_seed(m * n, 3, 1.0),
        );
        let mut want = c0.clone();
        matmul(spec, &a, &b, &mut want);
        // Each stored matrix as the columns pad.. of a matrix `pad + cols + 3` wide.
        let widen = |v: &[f32], cols: usize| -> (Vec<f32>, usize) {
            let ld = pad + cols + 3;
            let rows = v.len() / cols;
            let mut w = vec![f32::NAN; rows * ld];
            for r in 0..rows {
                w[r * ld + pad..r * ld + pad + cols].copy_from_slice(&v[r * cols..(r + 1) * cols]);
            }
            (w, ld)
        };
        let (wa, lda) = widen(&a, if trans_a { m } else { k });
        let (wb, ldb) = widen(&b, if trans_b { k } else { n });
        let (mut wc, ldc) = widen(&c0, n);
        let strides = Strides {
            a: lda,
            b: ldb,
            c: ldc,
        };
        matmul_strided(spec, &wa[pad..], &wb[pad..], &mut wc[pad..], strides);
        for i in 0..m {
            let row = &wc[i * ldc..(i + 1) * ldc];
            assert!(row[..pad].iter().chain(&row[pad + n..]).all(|v| v.is_nan()));
            let got: Vec<u32> = row[pad..pad + n].iter().map(|v| v.to_bits()).collect();
            let exp: Vec<u32> = want[i * n..(i + 1) * n]
                .iter()
                .map(|v| v.to_bits())
                .collect();
            assert_eq!(got, exp, "{spec:?} row {i}");
        }
    }
}
