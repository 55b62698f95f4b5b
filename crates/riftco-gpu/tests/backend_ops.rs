//! Every implemented method of the GPU backend (`riftco_gpu::GpuBackend`, through the tensor
//! crate's `Backend` trait) vs `CpuBackend` on the same inputs. Tolerances:
//! - bitwise: alloc/fill, upload/download, copy, copy_range, add, mul, scale, add_assign,
//!   the broadcasting binary ops except `Div`, reduce-Max, transpose_0213, gather/scatter
//!   (including accumulating scatters, which add in the view's row-major order on both);
//! - 1e-5 relative (of `max(|y|, 1)` where the result crosses 0, as the kernel tests): the
//!   maps (`unary`, `unary_backward`), `axpy` (an FMA may be fused on either side), `Div`
//!   (WGSL's f32 division is 2.5 ulp, not correctly rounded);
//! - 1e-4 where the reduction order differs: `sum` (the GPU's fixed tree of 512-value blocks in
//!   f32 vs the CPU's index-order f64 sum), reduce-Sum (row-major f32 per output vs f64), and
//!   matmul (k ascending per output vs gemm's blocking; 1e-4 of `Σ_k |a_ik · b_kj|`).
//!
//! Sizes: 1, odd, non-multiples of the 16-wide matmul tile and of the 256-wide workgroups,
//! broadcasting shapes with size-1 axes and rank differences, every `MatmulSpec` transpose.

mod common;

use common::{assert_close, backend_or_skip, values, SIZES};
use riftco_tensor::backend::{
    self, cpu::CpuBackend, Backend, BinaryOp, MatmulSpec, ReduceOp, StridedView, UnaryOp,
};
use riftco_tensor::{Device, MemoryCategory as C, Shape, Tensor};

fn host(v: Vec<f32>, dims: &[usize]) -> Tensor {
    Tensor::from_vec(v, dims.to_vec(), C::Workspace).unwrap()
}

fn on(t: &Tensor, device: Device) -> Tensor {
    let mut t = t.deep_clone(C::Workspace);
    t.transfer_to(device).unwrap();
    t
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec().iter().map(|v| v.to_bits()).collect()
}

fn gpu(device: Device) -> &'static dyn Backend {
    backend::for_device(device).unwrap()
}

fn rand(dims: &[usize], seed: u32) -> Tensor {
    let n = dims.iter().product();
    host(values(n, seed, -2.0, 2.0), dims)
}

#[test]
fn memory_and_transfers_round_trip_bitwise() {
    let Some(dev) = backend_or_skip("memory_and_transfers_round_trip_bitwise") else {
        return;
    };
    let g = gpu(dev);
    for n in SIZES.into_iter().chain([0, 1000]) {
        let data = values(n, 3, -5.0, 5.0);
        let buf = g.upload("test", &data).unwrap();
        assert_eq!(g.download("test", &buf).unwrap(), data, "n = {n}");
        for fill in [0.0, -0.0, 1.5, f32::NEG_INFINITY] {
            let b = g.alloc("test", n, Some(fill)).unwrap();
            let got = g.download("test", &b).unwrap();
            assert!(
                got.iter().all(|v| v.to_bits() == fill.to_bits()),
                "fill {fill}"
            );
        }
        assert_eq!(g.alloc("test", n, None).unwrap().len(), n);
    }
    // A transfer bumps the version and keeps the values.
    let mut t = rand(&[3, 5], 4);
    let want = bits(&t);
    let v0 = t.version();
    t.transfer_to(dev).unwrap();
    assert_eq!(t.device(), dev);
    assert!(t.version() > v0);
    assert!(t.read().is_err(), "host access to a GPU tensor must fail");
    assert_eq!(bits(&t), want);
    t.transfer_to(Device::Cpu).unwrap();
    assert_eq!(bits(&t), want);
}

#[test]
fn copies_match_the_cpu_bitwise() {
    let Some(dev) = backend_or_skip("copies_match_the_cpu_bitwise") else {
        return;
    };
    let g = gpu(dev);
    let src = rand(&[257], 5);
    let gs = on(&src, dev);
    assert_eq!(bits(&g.copy("t", &gs, C::Activation).unwrap()), bits(&src));
    for (dst_off, src_off, len) in [(0, 0, 257), (3, 10, 1), (100, 0, 63), (0, 200, 57)] {
        let dst = rand(&[257], 6);
        let gd = on(&dst, dev);
        CpuBackend
            .copy_range("t", &dst, dst_off, &src, src_off, len)
            .unwrap();
        let v = gd.version();
        g.copy_range("t", &gd, dst_off, &gs, src_off, len).unwrap();
        assert!(
            gd.version() > v,
            "copy_range bumps the destination's version"
        );
        assert_eq!(bits(&gd), bits(&dst), "{dst_off} {src_off} {len}");
    }
    // Overlapping ranges of one storage (memmove semantics on both).
    let a = rand(&[65], 7);
    let ga = on(&a, dev);
    CpuBackend.copy_range("t", &a, 5, &a, 0, 50).unwrap();
    g.copy_range("t", &ga, 5, &ga, 0, 50).unwrap();
    assert_eq!(bits(&ga), bits(&a));
    // Out-of-range is the CPU's error, nothing recorded.
    let e = g.copy_range("t", &ga, 60, &gs, 0, 10).unwrap_err();
    assert_eq!(
        e,
        CpuBackend.copy_range("t", &a, 60, &src, 0, 10).unwrap_err()
    );
}

#[test]
fn elementwise_and_in_place_ops_match_the_cpu() {
    let Some(dev) = backend_or_skip("elementwise_and_in_place_ops_match_the_cpu") else {
        return;
    };
    let g = gpu(dev);
    for n in SIZES.into_iter().chain([1000]) {
        let (a, b) = (rand(&[n], 8), rand(&[n], 9));
        let (ga, gb) = (on(&a, dev), on(&b, dev));
        let pairs = [
            (
                CpuBackend.add("t", &a, &b, C::Activation),
                g.add("t", &ga, &gb, C::Activation),
            ),
            (
                CpuBackend.mul("t", &a, &b, C::Activation),
                g.mul("t", &ga, &gb, C::Activation),
            ),
            (
                CpuBackend.scale("t", &a, -0.75, C::Activation),
                g.scale("t", &ga, -0.75, C::Activation),
            ),
        ];
        for (i, (want, got)) in pairs.into_iter().enumerate() {
            let got = got.unwrap();
            assert_eq!(got.device(), dev);
            assert_eq!(bits(&got), bits(&want.unwrap()), "op {i}, n = {n}");
        }
        // add_assign (bitwise, also `x += x`), axpy (1e-5).
        let (d, gd) = (a.deep_clone(C::Workspace), on(&a, dev));
        CpuBackend.add_assign("t", &d, &b).unwrap();
        g.add_assign("t", &gd, &gb).unwrap();
        assert_eq!(bits(&gd), bits(&d), "add_assign n = {n}");
        CpuBackend.add_assign("t", &d, &d).unwrap();
        g.add_assign("t", &gd, &gd).unwrap();
        assert_eq!(bits(&gd), bits(&d), "x += x, n = {n}");
        CpuBackend.axpy("t", 0.3, &b, &d).unwrap();
        g.axpy("t", 0.3, &gb, &gd).unwrap();
        assert_close("axpy", &gd.to_vec(), &d.to_vec(), 1e-5, 1.0);
        // sum: 1e-4 (reduction order differs), inputs in [0, 1) so no cancellation hides it.
        let p = host(values(n, 10, 0.0, 1.0), &[n]);
        let want = CpuBackend.sum("t", &p, C::Activation).unwrap();
        let got = g.sum("t", &on(&p, dev), C::Activation).unwrap();
        assert_eq!(got.dims(), want.dims());
        assert_close("sum", &got.to_vec(), &want.to_vec(), 1e-4, 1e-6);
    }
}

const MAPS: [UnaryOp; 14] = [
    UnaryOp::Neg,
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Relu,
    UnaryOp::Gelu,
    UnaryOp::GeluTanh,
    UnaryOp::PowScalar(3.0),
    UnaryOp::AddScalar(0.5),
    UnaryOp::MulScalar(-1.5),
    UnaryOp::DivScalar(3.0),
    UnaryOp::RSubScalar(2.0),
    UnaryOp::RDivScalar(2.0),
];

#[test]
fn maps_and_their_vjps_match_the_cpu_within_1e_5() {
    let Some(dev) = backend_or_skip("maps_and_their_vjps_match_the_cpu_within_1e_5") else {
        return;
    };
    let g = gpu(dev);
    for n in SIZES {
        // Away from 0 so that Log and the reciprocal maps stay finite.
        let x: Vec<f32> = values(n, 11, 0.1, 2.0);
        let sign: Vec<f32> = values(n, 12, -1.0, 1.0);
        let x: Vec<f32> = x.iter().zip(&sign).map(|(v, s)| v.copysign(*s)).collect();
        let x = host(x, &[n]);
        let dy = rand(&[n], 13);
        let (gx, gdy) = (on(&x, dev), on(&dy, dev));
        for kind in MAPS {
            let xx = if kind == UnaryOp::Log {
                CpuBackend
                    .unary("t", UnaryOp::PowScalar(2.0), &x, C::Workspace)
                    .unwrap()
            } else {
                x.deep_clone(C::Workspace)
            };
            let gxx = on(&xx, dev);
            let y = CpuBackend.unary("t", kind, &xx, C::Activation).unwrap();
            let gy = g.unary("t", kind, &gxx, C::Activation).unwrap();
            assert_close(&format!("{kind:?}"), &gy.to_vec(), &y.to_vec(), 1e-5, 1.0);
            // The VJP on the same (CPU) forward output, so only the backward map is compared.
            let gy_cpu = on(&y, dev);
            let dx = CpuBackend
                .unary_backward("t", kind, &xx, &y, &dy, C::Gradient)
                .unwrap();
            let gdx = g
                .unary_backward("t", kind, &gxx, &gy_cpu, &gdy, C::Gradient)
                .unwrap();
            assert_close(
                &format!("d{kind:?}"),
                &gdx.to_vec(),
                &dx.to_vec(),
                1e-5,
                1.0,
            );
        }
        let _ = gx;
    }
}

#[test]
fn broadcasting_binary_matches_the_cpu() {
    let Some(dev) = backend_or_skip("broadcasting_binary_matches_the_cpu") else {
        return;
    };
    let g = gpu(dev);
    let pairs: &[(&[usize], &[usize])] = &[
        (&[7], &[7]),
        (&[3, 5], &[5]),
        (&[5], &[3, 5]),
        (&[3, 1], &[1, 17]),
        (&[2, 1, 3], &[4, 1]),
        (&[], &[2, 3]),
        (&[2, 3], &[]),
        (&[], &[]),
        (&[1], &[2, 1, 1]),
        (&[2, 3, 1, 5], &[3, 4, 1]),
    ];
    let kinds = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Gt,
        BinaryOp::Ge,
        BinaryOp::Eq,
        BinaryOp::Ne,
    ];
    for (i, &(sa, sb)) in pairs.iter().enumerate() {
        let out = Shape::from(backend::broadcast_shape(sa, sb).unwrap());
        let a = rand(sa, 20 + i as u32);
        // Quantised so that Eq / Ne / Le see equal pairs.
        let b = rand(sb, 40 + i as u32);
        let b = host(
            b.to_vec()
                .iter()
                .map(|v| (v * 2.0).round() / 2.0 + 0.25)
                .collect(),
            sb,
        );
        let a = host(
            a.to_vec()
                .iter()
                .map(|v| (v * 2.0).round() / 2.0 + 0.25)
                .collect(),
            sa,
        );
        let (ga, gb) = (on(&a, dev), on(&b, dev));
        for kind in kinds {
            let want = CpuBackend
                .binary("t", kind, &a, &b, out.clone(), C::Activation)
                .unwrap();
            let got = g
                .binary("t", kind, &ga, &gb, out.clone(), C::Activation)
                .unwrap();
            assert_eq!(got.dims(), want.dims());
            if kind == BinaryOp::Div {
                assert_close("div", &got.to_vec(), &want.to_vec(), 1e-5, 1e-6);
            } else {
                assert_eq!(bits(&got), bits(&want), "{kind:?} {sa:?} {sb:?}");
            }
        }
    }
    // An operand that does not broadcast: the CPU's error.
    let (a, b) = (rand(&[3, 4], 1), rand(&[5], 2));
    let e = g
        .binary(
            "t",
            BinaryOp::Add,
            &on(&a, dev),
            &on(&b, dev),
            Shape::from([3, 4]),
            C::Workspace,
        )
        .unwrap_err();
    let want = CpuBackend
        .binary(
            "t",
            BinaryOp::Add,
            &a,
            &b,
            Shape::from([3, 4]),
            C::Workspace,
        )
        .unwrap_err();
    assert_eq!(e, want);
}

#[test]
fn axis_reductions_match_the_cpu() {
    let Some(dev) = backend_or_skip("axis_reductions_match_the_cpu") else {
        return;
    };
    let g = gpu(dev);
    let cases: &[(&[usize], &[usize])] = &[
        (&[7], &[1]),
        (&[1], &[1]),
        (&[3, 5], &[1, 5]),
        (&[3, 5], &[3, 1]),
        (&[3, 5], &[1, 1]),
        (&[2, 3, 17], &[2, 1, 17]),
        (&[2, 3, 17], &[1, 3, 1]),
        (&[4, 1, 65], &[1, 1, 65]),
        (&[2, 3], &[2, 3]),
    ];
    for (i, &(dims, out)) in cases.iter().enumerate() {
        let x = rand(dims, 60 + i as u32);
        let gx = on(&x, dev);
        for kind in [ReduceOp::Sum, ReduceOp::Max] {
            let want = CpuBackend
                .reduce("t", kind, &x, Shape::from(out.to_vec()), C::Activation)
                .unwrap();
            let got = g
                .reduce("t", kind, &gx, Shape::from(out.to_vec()), C::Activation)
                .unwrap();
            assert_eq!(got.dims(), want.dims());
            match kind {
                // f32 row-major vs the CPU's f64: 1e-4 of max(|y|, 1) (inputs of both signs).
                ReduceOp::Sum => assert_close("sum", &got.to_vec(), &want.to_vec(), 1e-4, 1.0),
                ReduceOp::Max => assert_eq!(bits(&got), bits(&want), "max {dims:?}→{out:?}"),
            }
        }
    }
    // NaN propagates through Max as on the CPU.
    let x = host(vec![1.0, f32::NAN, 3.0, 2.0], &[2, 2]);
    let got = g
        .reduce(
            "t",
            ReduceOp::Max,
            &on(&x, dev),
            Shape::from([2, 1]),
            C::Workspace,
        )
        .unwrap()
        .to_vec();
    assert!(got[0].is_nan() && got[1] == 3.0, "{got:?}");
}

/// `|got − want| ≤ 1e-4 · Σ_k |a_ik b_kj|` per output (the dot-product error bound).
fn check_matmul(got: &[f32], want: &[f32], bound: &[f32], what: &str) {
    for (i, ((g, w), b)) in got.iter().zip(want).zip(bound).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * b.max(1e-6),
            "{what}[{i}]: gpu {g} vs cpu {w} (bound {b})"
        );
    }
}

#[test]
fn every_matmul_spec_matches_the_cpu_within_1e_4() {
    let Some(dev) = backend_or_skip("every_matmul_spec_matches_the_cpu_within_1e_4") else {
        return;
    };
    let g = gpu(dev);
    for (m, k, n) in [(1, 1, 1), (7, 5, 3), (17, 16, 33), (16, 1, 2)] {
        for batch in [1, 3] {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let spec = MatmulSpec::new(m, k, n).trans_a(ta).trans_b(tb);
                let a_dims = if ta { [batch, k, m] } else { [batch, m, k] };
                let b_dims = if tb { [batch, n, k] } else { [batch, k, n] };
                let (a, b) = (rand(&a_dims, 70), rand(&b_dims, 71));
                let out = Shape::from([batch, m, n]);
                let (want, got) = if batch == 1 {
                    (
                        CpuBackend.matmul("t", spec, &a, &b, out.clone(), C::Activation),
                        g.matmul(
                            "t",
                            spec,
                            &on(&a, dev),
                            &on(&b, dev),
                            out.clone(),
                            C::Activation,
                        ),
                    )
                } else {
                    (
                        CpuBackend.batched_matmul(
                            "t",
                            batch,
                            spec,
                            &a,
                            &b,
                            out.clone(),
                            C::Activation,
                        ),
                        g.batched_matmul(
                            "t",
                            batch,
                            spec,
                            &on(&a, dev),
                            &on(&b, dev),
                            out.clone(),
                            C::Activation,
                        ),
                    )
                };
                // The bound: the same product on |a|, |b|.
                let abs =
                    |t: &Tensor, d: &[usize]| host(t.to_vec().iter().map(|v| v.abs()).collect(), d);
                let bound = CpuBackend
                    .batched_matmul(
                        "t",
                        batch,
                        spec,
                        &abs(&a, &a_dims),
                        &abs(&b, &b_dims),
                        out,
                        C::Workspace,
                    )
                    .unwrap();
                let what = format!("matmul {m}x{k}x{n} batch {batch} ta {ta} tb {tb}");
                check_matmul(
                    &got.unwrap().to_vec(),
                    &want.unwrap().to_vec(),
                    &bound.to_vec(),
                    &what,
                );
            }
        }
    }
}

#[test]
fn layout_ops_match_the_cpu_bitwise() {
    let Some(dev) = backend_or_skip("layout_ops_match_the_cpu_bitwise") else {
        return;
    };
    let g = gpu(dev);
    for dims in [[1, 1, 1, 1], [2, 3, 5, 7], [1, 17, 2, 3]] {
        let x = rand(&dims, 80);
        let want = CpuBackend
            .transpose_0213("t", &x, dims, C::Activation)
            .unwrap();
        let got = g
            .transpose_0213("t", &on(&x, dev), dims, C::Activation)
            .unwrap();
        assert_eq!(got.dims(), want.dims());
        assert_eq!(bits(&got), bits(&want), "transpose {dims:?}");
    }
    let x = rand(&[4, 6], 81);
    let gx = on(&x, dev);
    let views = [
        StridedView::contiguous(&[4, 6]),
        // A permutation, a stepped slice, negative strides, an integer index.
        StridedView {
            dims: vec![6, 4],
            strides: vec![1, 6],
            offset: 0,
        },
        StridedView {
            dims: vec![2, 3],
            strides: vec![12, 2],
            offset: 1,
        },
        StridedView {
            dims: vec![4, 6],
            strides: vec![-6, -1],
            offset: 23,
        },
        StridedView {
            dims: vec![6],
            strides: vec![1],
            offset: 12,
        },
        StridedView {
            dims: vec![],
            strides: vec![],
            offset: 5,
        },
    ];
    for view in &views {
        let want = CpuBackend
            .gather_strided("t", &x, view, C::Activation)
            .unwrap();
        let got = g.gather_strided("t", &gx, view, C::Activation).unwrap();
        assert_eq!(got.dims(), want.dims());
        assert_eq!(bits(&got), bits(&want), "gather {view:?}");
        for accumulate in [false, true] {
            let src = rand(&view.dims, 82);
            let dst = rand(&[4, 6], 83);
            let gd = on(&dst, dev);
            CpuBackend
                .scatter_strided("t", &dst, &src, view, accumulate)
                .unwrap();
            let v = gd.version();
            g.scatter_strided("t", &gd, &on(&src, dev), view, accumulate)
                .unwrap();
            assert!(gd.version() > v);
            assert_eq!(
                bits(&gd),
                bits(&dst),
                "scatter {view:?} accumulate {accumulate}"
            );
        }
    }
    // A view that addresses positions several times (stride 0): accumulated in order.
    let view = StridedView {
        dims: vec![3, 4],
        strides: vec![0, 1],
        offset: 2,
    };
    let src = rand(&[3, 4], 84);
    let dst = rand(&[4, 6], 85);
    let gd = on(&dst, dev);
    CpuBackend
        .scatter_strided("t", &dst, &src, &view, true)
        .unwrap();
    g.scatter_strided("t", &gd, &on(&src, dev), &view, true)
        .unwrap();
    assert_eq!(bits(&gd), bits(&dst));
    // A view outside the tensor: the CPU's error.
    let bad = StridedView {
        dims: vec![5],
        strides: vec![6],
        offset: 0,
    };
    assert_eq!(
        g.gather_strided("t", &gx, &bad, C::Workspace).unwrap_err(),
        CpuBackend
            .gather_strided("t", &x, &bad, C::Workspace)
            .unwrap_err()
    );
}

/// Threads sharing the one context: each uploads, computes and reads back its own values.
/// Kernels from several threads interleave in the pending command stream and pooled buffers
/// move between threads; every result must still be its thread's (submissions keep the order
/// of recording).
#[test]
fn threads_sharing_the_context_get_their_own_results() {
    let Some(dev) = backend_or_skip("threads_sharing_the_context_get_their_own_results") else {
        return;
    };
    let g = gpu(dev);
    std::thread::scope(|s| {
        for t in 0..4u32 {
            s.spawn(move || {
                for i in 0..25u32 {
                    let n = 1 + (t * 97 + i * 31) as usize % 300;
                    let (a, b) = (rand(&[n], t * 1000 + i), rand(&[n], t * 1000 + i + 500));
                    let want = CpuBackend.mul("t", &a, &b, C::Workspace).unwrap();
                    let got = g
                        .mul("t", &on(&a, dev), &on(&b, dev), C::Workspace)
                        .unwrap();
                    assert_eq!(bits(&got), bits(&want), "thread {t} iteration {i}");
                }
            });
        }
    });
}
