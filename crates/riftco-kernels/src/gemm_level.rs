//! The `gemm` crate's f32 product, run at the SIMD level [`crate::simd::arch`] selects.
//!
//! `gemm::gemm` picks its own instruction set once per process (AVX-512 when the CPU has it),
//! whatever `RIFTCO_SIMD` or [`crate::simd::set_simd_level`] say, so a forced level would change
//! every kernel but the products, and an AVX2 host's products could not be reproduced on an
//! AVX-512 host. This module calls the same generic driver and the same microkernels
//! (`gemm_common::gemm::gemm_basic_generic` with `gemm_f32::microkernel::{scalar, fma,
//! avx512f, neon}`) that `gemm::gemm` dispatches to, with the level chosen here: the results are
//! bitwise `gemm::gemm`'s on a CPU whose best level is the one selected.

use gemm_common::gemm::gemm_basic_generic;
use gemm_common::Parallelism;

use crate::simd::SimdLevel;

/// One product in `gemm::gemm`'s calling convention (column and row strides of each operand,
/// in elements): `dst = alpha·dst + beta·lhs·rhs` when `read_dst`, else `beta·lhs·rhs`.
#[derive(Clone, Copy)]
pub(crate) struct Product {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub dst: *mut f32,
    pub dst_cs: isize,
    pub dst_rs: isize,
    pub read_dst: bool,
    pub lhs: *const f32,
    pub lhs_cs: isize,
    pub lhs_rs: isize,
    pub rhs: *const f32,
    pub rhs_cs: isize,
    pub rhs_rs: isize,
    pub alpha: f32,
    pub beta: f32,
}

/// Runs `p` at the level [`crate::simd::current_level`] selects.
///
/// # Safety
/// As `gemm::gemm`: every element the strides reach must be inside its allocation, `dst` must
/// not overlap `lhs` or `rhs`, and no other thread may touch `dst`'s elements during the call.
/// Strides must be non-negative (every caller in this crate passes row-major operands).
pub(crate) unsafe fn gemm(p: Product, parallelism: Parallelism) {
    debug_assert!(p.dst_cs >= 0 && p.dst_rs >= 0 && p.lhs_cs >= 0 && p.lhs_rs >= 0);
    debug_assert!(p.rhs_cs >= 0 && p.rhs_rs >= 0);
    // As gemm::gemm: the microkernels prefer a column-major destination, so a row-major one is
    // computed as the transposed product dstᵀ = rhsᵀ · lhsᵀ.
    let p = if p.dst_cs.abs() < p.dst_rs.abs() {
        Product {
            m: p.n,
            n: p.m,
            dst_cs: p.dst_rs,
            dst_rs: p.dst_cs,
            lhs: p.rhs,
            lhs_cs: p.rhs_rs,
            lhs_rs: p.rhs_cs,
            rhs: p.lhs,
            rhs_cs: p.lhs_rs,
            rhs_rs: p.lhs_cs,
            ..p
        }
    } else {
        p
    };
    let level = crate::simd::current_level();
    // SAFETY: forwarded from the caller; each level's kernels run only where `try_new` detected
    // its instruction set. A level whose gemm type is not detected falls to the next one below.
    unsafe {
        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
        {
            use gemm_f32::microkernel::{avx512f::f32 as v4, fma::f32 as v3};
            if level == SimdLevel::Avx512 {
                if let Some(simd) = gemm_common::simd::V4::try_new() {
                    return run::<
                        _,
                        16,
                        { v4::MR_DIV_N * 16 },
                        { v4::NR },
                        { v4::MR_DIV_N },
                        { v4::H_M },
                        { v4::H_N },
                    >(simd, p, &v4::UKR, &v4::H_UKR, parallelism);
                }
            }
            if matches!(level, SimdLevel::Avx512 | SimdLevel::Avx2) {
                if let Some(simd) = gemm_common::simd::V3::try_new() {
                    return run::<
                        _,
                        8,
                        { v3::MR_DIV_N * 8 },
                        { v3::NR },
                        { v3::MR_DIV_N },
                        { v3::H_M },
                        { v3::H_N },
                    >(simd, p, &v3::UKR, &v3::H_UKR, parallelism);
                }
            }
        }
        #[cfg(target_arch = "aarch64")]
        if level == SimdLevel::Neon {
            use gemm_f32::microkernel::neon::f32 as k;
            return run::<
                _,
                4,
                { k::MR_DIV_N * 4 },
                { k::NR },
                { k::MR_DIV_N },
                { k::H_M },
                { k::H_N },
            >(
                gemm_common::simd::Scalar,
                p,
                &k::UKR,
                &k::H_UKR,
                parallelism,
            );
        }
        use gemm_f32::microkernel::scalar::f32 as k;
        run::<_, 1, { k::MR_DIV_N }, { k::NR }, { k::MR_DIV_N }, { k::H_M }, { k::H_N }>(
            gemm_common::simd::Scalar,
            p,
            &k::UKR,
            &k::H_UKR,
            parallelism,
        )
    }
}

type Ukr = gemm_common::microkernel::MicroKernelFn<f32>;
type HUkr = gemm_common::microkernel::HMicroKernelFn<f32>;

/// `gemm_basic_generic` with one level's microkernels, as `gemm-f32`'s per-level entry points
/// call it.
#[allow(clippy::too_many_arguments)]
unsafe fn run<
    S: gemm_common::simd::MixedSimd<f32, f32, f32, f32>,
    const N: usize,
    const MR: usize,
    const NR: usize,
    const MR_DIV_N: usize,
    const H_M: usize,
    const H_N: usize,
>(
    simd: S,
    p: Product,
    ukr: &[[Ukr; NR]; MR_DIV_N],
    h_ukr: &[[HUkr; H_N]; H_M],
    parallelism: Parallelism,
) {
    // SAFETY: forwarded from `gemm`.
    unsafe {
        gemm_basic_generic::<S, f32, N, MR, NR, MR_DIV_N, H_M, H_N>(
            simd,
            p.m,
            p.n,
            p.k,
            p.dst,
            p.dst_cs,
            p.dst_rs,
            p.read_dst,
            p.lhs,
            p.lhs_cs,
            p.lhs_rs,
            p.rhs,
            p.rhs_cs,
            p.rhs_rs,
            p.alpha,
            p.beta,
            false,
            false,
            false,
            |a, b, c| a * b + c,
            ukr,
            h_ukr,
            false,
            parallelism,
        );
    }
}
