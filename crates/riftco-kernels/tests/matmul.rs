//! GEMM (all four transposition variants, accumulate, batched, serial) against a naive f64
//! product. Bound: each output is a dot product of `k` terms summed in f32 (with FMA), so
//! `|err| <= (k + 2)·U·Σ_p |a_ip b_pj|` (+ `U|c|` when accumulating).

mod common;

use common::{vec_from_seed, U};
use proptest::prelude::*;
use riftco_kernels::matmul::{batched_matmul, matmul, matmul_serial, MatmulSpec};

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
