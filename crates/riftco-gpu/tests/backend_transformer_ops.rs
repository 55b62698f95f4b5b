//! The transformer ops of the GPU backend (`riftco_gpu::GpuBackend` through the tensor crate's
//! `Backend` trait) vs `CpuBackend` on the same tensors, with the kernel tolerances of
//! `docs/metal.md`:
//! - SiLU / SwiGLU and their VJPs, RoPE: 1e-5 of `max(|y|, 1)` (different `exp`
//!   approximations; results cross 0);
//! - RMSNorm `y`, `rstd`, row softmax, causal softmax, cross-entropy loss and `lse`: 1e-5
//!   relative (row sums in a fixed tree); masked attention entries exactly 0;
//! - RMSNorm `dx`, `dweight`: 1e-4 of `max(|y|, 1)`; softmax VJPs 1e-4 of `max(|y|, 1e-3)`;
//! - cross-entropy VJP: 1e-5 of `max(|y|, grad/rows)`;
//! - dropout, embedding and its VJP: bitwise;
//! - Adam (3 steps): 1e-5 of `max(|y|, floor)`, floors param 1e-3, m 1e-2, v relative.
//!
//! Plus the bad inputs: the kernels' shape errors come back as `InvalidArgument` naming the
//! values.

mod common;

use common::{assert_close, backend_or_skip, values};
use riftco_kernels::philox::DropoutMask;
use riftco_tensor::backend::{
    self, cpu::CpuBackend, AdamHyper, AttentionDims, AttentionLayout, Backend, RopeTable,
};
use riftco_tensor::{Device, MemoryCategory as C, Tensor, TensorError};

fn host(v: Vec<f32>, dims: &[usize]) -> Tensor {
    Tensor::from_vec(v, dims.to_vec(), C::Workspace).unwrap()
}

fn on(t: &Tensor, device: Device) -> Tensor {
    let mut t = t.deep_clone(C::Workspace);
    t.transfer_to(device).unwrap();
    t
}

fn gpu(device: Device) -> &'static dyn Backend {
    backend::for_device(device).unwrap()
}

fn rand(dims: &[usize], seed: u32, lo: f32, hi: f32) -> Tensor {
    let n = dims.iter().product();
    host(values(n, seed, lo, hi), dims)
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec().iter().map(|v| v.to_bits()).collect()
}

/// Asserts that `got` (on the GPU) has `want`'s shape and values within `rel · max(|w|, floor)`.
fn close(what: &str, got: &Tensor, want: &Tensor, rel: f32, floor: f32) {
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    assert_close(what, &got.to_vec(), &want.to_vec(), rel, floor);
}

#[test]
fn silu_and_swiglu_and_their_vjps_match_the_cpu() {
    let Some(dev) = backend_or_skip("silu_and_swiglu_and_their_vjps_match_the_cpu") else {
        return;
    };
    let (g, cpu) = (gpu(dev), CpuBackend);
    for (i, dims) in [vec![1], vec![7], vec![3, 5], vec![257]].iter().enumerate() {
        let s = i as u32 * 10;
        let (x, up, dy) = (
            rand(dims, s, -6.0, 6.0),
            rand(dims, s + 1, -2.0, 2.0),
            rand(dims, s + 2, -2.0, 2.0),
        );
        let (gx, gup, gdy) = (on(&x, dev), on(&up, dev), on(&dy, dev));
        close(
            "silu",
            &g.silu("t", &gx, C::Workspace).unwrap(),
            &cpu.silu("t", &x, C::Workspace).unwrap(),
            1e-5,
            1.0,
        );
        close(
            "silu_backward",
            &g.silu_backward("t", &gx, &gdy, C::Workspace).unwrap(),
            &cpu.silu_backward("t", &x, &dy, C::Workspace).unwrap(),
            1e-5,
            1.0,
        );
        close(
            "swiglu",
            &g.swiglu("t", &gx, &gup, C::Workspace).unwrap(),
            &cpu.swiglu("t", &x, &up, C::Workspace).unwrap(),
            1e-5,
            1.0,
        );
        let (dg, du) = g
            .swiglu_backward("t", &gx, &gup, &gdy, C::Workspace)
            .unwrap();
        let (wg, wu) = cpu
            .swiglu_backward("t", &x, &up, &dy, C::Workspace)
            .unwrap();
        close("swiglu_backward dgate", &dg, &wg, 1e-5, 1.0);
        close("swiglu_backward dup", &du, &wu, 1e-5, 1.0);
        // In place: `dy` becomes d gate, the returned tensor is d up.
        let gdy2 = on(&dy, dev);
        let du2 = g
            .swiglu_backward_in_place("t", &gx, &gup, &gdy2, C::Workspace)
            .unwrap();
        close("swiglu_backward_in_place dgate", &gdy2, &wg, 1e-5, 1.0);
        close("swiglu_backward_in_place dup", &du2, &wu, 1e-5, 1.0);
    }
    let short = on(&rand(&[3], 1, -1.0, 1.0), dev);
    let long = on(&rand(&[4], 2, -1.0, 1.0), dev);
    let e = g.swiglu("t", &long, &short, C::Workspace).unwrap_err();
    assert!(matches!(e, TensorError::InvalidArgument { .. }), "{e}");
    let e = g
        .swiglu_backward_in_place("t", &long, &long, &short, C::Workspace)
        .unwrap_err();
    assert!(matches!(e, TensorError::LengthMismatch { .. }), "{e}");
    let e = g
        .swiglu_backward_in_place("t", &long, &long, &long, C::Workspace)
        .unwrap_err();
    assert!(matches!(e, TensorError::InvalidArgument { .. }), "{e}");
}

#[test]
fn rms_norm_and_its_vjp_match_the_cpu() {
    let Some(dev) = backend_or_skip("rms_norm_and_its_vjp_match_the_cpu") else {
        return;
    };
    let (g, cpu) = (gpu(dev), CpuBackend);
    for (i, (rows, d)) in [(1, 1), (3, 7), (2, 65), (5, 257)].into_iter().enumerate() {
        let s = i as u32 * 10;
        let x = rand(&[rows, d], s, -2.0, 2.0);
        let w = rand(&[d], s + 1, 0.5, 1.5);
        let dy = rand(&[rows, d], s + 2, -1.0, 1.0);
        let (gx, gw, gdy) = (on(&x, dev), on(&w, dev), on(&dy, dev));
        let (y, rstd) = g.rms_norm("t", &gx, &gw, 1e-5, C::Workspace).unwrap();
        let (wy, wrstd) = cpu.rms_norm("t", &x, &w, 1e-5, C::Workspace).unwrap();
        close("rms_norm y", &y, &wy, 1e-5, 1e-6);
        close("rms_norm rstd", &rstd, &wrstd, 1e-5, 1e-6);
        let (dx, dw) = g
            .rms_norm_backward("t", &gx, &gw, &rstd, &gdy, true, C::Workspace)
            .unwrap();
        let (wdx, wdw) = cpu
            .rms_norm_backward("t", &x, &w, &wrstd, &dy, true, C::Workspace)
            .unwrap();
        close("rms_norm dx", &dx, &wdx, 1e-4, 1.0);
        close("rms_norm dweight", &dw.unwrap(), &wdw.unwrap(), 1e-4, 1.0);
        let (dx2, none) = g
            .rms_norm_backward("t", &gx, &gw, &rstd, &gdy, false, C::Workspace)
            .unwrap();
        assert!(none.is_none(), "no dweight without weight_grad");
        assert_eq!(bits(&dx2), bits(&dx), "dx does not depend on weight_grad");
    }
    let x = on(&rand(&[2, 5], 1, -1.0, 1.0), dev);
    let w = on(&rand(&[3], 2, -1.0, 1.0), dev);
    let e = g.rms_norm("t", &x, &w, 1e-5, C::Workspace).unwrap_err();
    assert!(e.to_string().contains("cols = 3"), "{e}");
}

#[test]
fn rope_forward_and_inverse_match_the_cpu() {
    let Some(dev) = backend_or_skip("rope_forward_and_inverse_match_the_cpu") else {
        return;
    };
    let (g, cpu) = (gpu(dev), CpuBackend);
    let table = RopeTable::new(16, 8, 10_000.0);
    for (batch, seq, heads, start) in [(1, 1, 1, 0), (2, 3, 2, 5), (1, 7, 3, 9)] {
        let x = rand(&[batch, seq, heads, 8], seq as u32, -2.0, 2.0);
        let gx = on(&x, dev);
        for inverse in [false, true] {
            close(
                &format!("rope b{batch} s{seq} h{heads} start {start} inverse {inverse}"),
                &g.rope("t", &gx, &table, seq, heads, start, inverse, C::Workspace)
                    .unwrap(),
                &cpu.rope("t", &x, &table, seq, heads, start, inverse, C::Workspace)
                    .unwrap(),
                1e-5,
                1.0,
            );
        }
    }
    let x = on(&rand(&[1, 4, 1, 8], 1, -1.0, 1.0), dev);
    let e = g
        .rope("t", &x, &table, 4, 1, 14, false, C::Workspace)
        .unwrap_err();
    assert!(matches!(e, TensorError::InvalidArgument { .. }), "{e}");
}

#[test]
fn softmax_causal_softmax_and_the_vjp_match_the_cpu() {
    let Some(dev) = backend_or_skip("softmax_causal_softmax_and_the_vjp_match_the_cpu") else {
        return;
    };
    let (g, cpu) = (gpu(dev), CpuBackend);
    for (rows, cols) in [(1, 1), (3, 7), (2, 257)] {
        let x = rand(&[rows, cols], cols as u32, -4.0, 4.0);
        let dy = rand(&[rows, cols], cols as u32 + 1, -1.0, 1.0);
        let y = g.softmax("t", &on(&x, dev), cols, C::Workspace).unwrap();
        let wy = cpu.softmax("t", &x, cols, C::Workspace).unwrap();
        close("softmax", &y, &wy, 1e-5, 1e-6);
        for scale in [1.0, 0.35] {
            close(
                &format!("softmax_backward scale {scale}"),
                &g.softmax_backward("t", &y, &on(&dy, dev), cols, scale, C::Workspace)
                    .unwrap(),
                &cpu.softmax_backward("t", &wy, &dy, cols, scale, C::Workspace)
                    .unwrap(),
                1e-4,
                1e-3,
            );
        }
    }
    for (seq_q, seq_k) in [(3, 3), (2, 5), (5, 3)] {
        let dims = AttentionDims {
            batch: 2,
            n_heads: 2,
            n_kv_heads: 2,
            seq_q,
            seq_k,
            d_head: 4,
        };
        let s = rand(&[2, 2, seq_q, seq_k], seq_k as u32, -3.0, 3.0);
        for causal in [false, true] {
            let got = g
                .causal_softmax("t", &on(&s, dev), dims, 0.5, causal, C::Workspace)
                .unwrap();
            let want = cpu
                .causal_softmax("t", &s, dims, 0.5, causal, C::Workspace)
                .unwrap();
            close(
                &format!("causal_softmax {seq_q}x{seq_k} causal {causal}"),
                &got,
                &want,
                1e-5,
                1e-6,
            );
            for (a, b) in got.to_vec().iter().zip(want.to_vec()) {
                assert_eq!(*a == 0.0, b == 0.0, "masked entries are exactly 0 on both");
            }
        }
    }
    let e = g
        .softmax("t", &on(&rand(&[2, 3], 1, 0.0, 1.0), dev), 4, C::Workspace)
        .unwrap_err();
    assert!(e.to_string().contains("cols = 4"), "{e}");
}

#[test]
fn dropout_and_embedding_are_bitwise_the_cpu() {
    let Some(dev) = backend_or_skip("dropout_and_embedding_are_bitwise_the_cpu") else {
        return;
    };
    let (g, cpu) = (gpu(dev), CpuBackend);
    let x = rand(&[3, 65], 4, -2.0, 2.0);
    for p in [0.0, 0.1, 0.5] {
        let mask = DropoutMask {
            p,
            key: [7, 11],
            stream: [3, 0],
            offset: 5,
        };
        let got = g.dropout("t", &on(&x, dev), &mask, C::Workspace).unwrap();
        let want = cpu.dropout("t", &x, &mask, C::Workspace).unwrap();
        assert_eq!(got.dims(), want.dims());
        assert_eq!(bits(&got), bits(&want), "dropout p = {p}");
    }
    let bad = DropoutMask {
        p: 1.0,
        key: [0, 0],
        stream: [0, 0],
        offset: 0,
    };
    let e = g
        .dropout("t", &on(&x, dev), &bad, C::Workspace)
        .unwrap_err();
    assert!(e.to_string().contains('1'), "{e}");

    let (vocab, d) = (11, 5);
    let table = rand(&[vocab, d], 9, -1.0, 1.0);
    let ids = [3u32, 0, 10, 3, 3, 7, 0];
    let got = g
        .embedding("t", &on(&table, dev), &ids, C::Workspace)
        .unwrap();
    let want = cpu.embedding("t", &table, &ids, C::Workspace).unwrap();
    assert_eq!(got.dims(), want.dims());
    assert_eq!(bits(&got), bits(&want), "embedding");
    let dy = rand(&[ids.len(), d], 10, -1.0, 1.0);
    let got = g
        .embedding_backward("t", &ids, &on(&dy, dev), vocab, C::Workspace)
        .unwrap();
    let want = cpu
        .embedding_backward("t", &ids, &dy, vocab, C::Workspace)
        .unwrap();
    assert_eq!(got.dims(), want.dims());
    assert_eq!(bits(&got), bits(&want), "embedding_backward");
    let e = g
        .embedding("t", &on(&table, dev), &[1, 11], C::Workspace)
        .unwrap_err();
    assert!(e.to_string().contains("11"), "{e}");
    let e = g
        .embedding("t", &on(&rand(&[4], 1, 0.0, 1.0), dev), &[0], C::Workspace)
        .unwrap_err();
    assert!(e.to_string().contains("[vocab, d]"), "{e}");
}

#[test]
fn cross_entropy_and_its_vjp_match_the_cpu() {
    let Some(dev) = backend_or_skip("cross_entropy_and_its_vjp_match_the_cpu") else {
        return;
    };
    let (g, cpu) = (gpu(dev), CpuBackend);
    for (rows, vocab) in [(1, 1), (3, 7), (4, 257)] {
        let logits = rand(&[rows, vocab], vocab as u32, -5.0, 5.0);
        let targets: Vec<u32> = (0..rows).map(|r| ((r * 5 + 2) % vocab) as u32).collect();
        let gl = on(&logits, dev);
        let (loss, lse) = g.cross_entropy("t", &gl, &targets, C::Workspace).unwrap();
        let (wloss, wlse) = cpu
            .cross_entropy("t", &logits, &targets, C::Workspace)
            .unwrap();
        close("cross_entropy loss", &loss, &wloss, 1e-5, 1e-6);
        close("cross_entropy lse", &lse, &wlse, 1e-5, 1e-6);
        for grad in [1.0f32, 0.5, -3.0] {
            let gv = host(vec![grad], &[]);
            let got = g
                .cross_entropy_backward("t", &gl, &targets, &lse, &on(&gv, dev), C::Workspace)
                .unwrap();
            let want = cpu
                .cross_entropy_backward("t", &logits, &targets, &wlse, &gv, C::Workspace)
                .unwrap();
            close(
                &format!("cross_entropy_backward {rows}x{vocab} grad {grad}"),
                &got,
                &want,
                1e-5,
                grad.abs() / rows as f32,
            );
        }
    }
    let logits = on(&rand(&[2, 4], 1, -1.0, 1.0), dev);
    let e = g
        .cross_entropy("t", &logits, &[0, 4], C::Workspace)
        .unwrap_err();
    assert!(e.to_string().contains('4'), "{e}");
}

#[test]
fn adam_three_steps_match_the_cpu() {
    let Some(dev) = backend_or_skip("adam_three_steps_match_the_cpu") else {
        return;
    };
    let (g, cpu) = (gpu(dev), CpuBackend);
    let hypers = [
        AdamHyper::default(),
        AdamHyper {
            lr: 1e-2,
            weight_decay: 0.1,
            ..AdamHyper::default()
        },
        AdamHyper {
            lr: 1e-2,
            weight_decay: 0.1,
            decoupled: true,
            ..AdamHyper::default()
        },
    ];
    for (i, h) in hypers.into_iter().enumerate() {
        let n = [7, 65, 257][i];
        let p = rand(&[n], 1, -1.0, 1.0);
        let (m, v) = (host(vec![0.0; n], &[n]), host(vec![0.0; n], &[n]));
        let (gp, gm, gv) = (on(&p, dev), on(&m, dev), on(&v, dev));
        for step in 1..=3u64 {
            let grad = rand(&[n], 10 + step as u32, -1.0, 1.0);
            let v0 = gp.version();
            g.adam_update("t", &gp, &on(&grad, dev), &gm, &gv, step, h)
                .unwrap();
            assert!(
                gp.version() > v0,
                "the update bumps the parameter's version"
            );
            cpu.adam_update("t", &p, &grad, &m, &v, step, h).unwrap();
        }
        close(&format!("adam param {h:?}"), &gp, &p, 1e-5, 1e-3);
        close(&format!("adam m {h:?}"), &gm, &m, 1e-5, 1e-2);
        close(&format!("adam v {h:?}"), &gv, &v, 1e-5, 1e-30);
    }
    let p = on(&rand(&[4], 1, -1.0, 1.0), dev);
    let grad = on(&rand(&[4], 2, -1.0, 1.0), dev);
    let m = on(&host(vec![0.0; 4], &[4]), dev);
    let e = g
        .adam_update("t", &p, &grad, &m, &m, 1, AdamHyper::default())
        .unwrap_err();
    assert!(e.to_string().contains("m and v share"), "{e}");
    let e = g
        .adam_update(
            "t",
            &p,
            &grad,
            &m,
            &on(&host(vec![0.0; 4], &[4]), dev),
            0,
            AdamHyper::default(),
        )
        .unwrap_err();
    assert!(matches!(e, TensorError::InvalidArgument { .. }), "{e}");
}

/// FlashAttention-2 forward (`out`, `lse`) and backward (`dq`, `dk`, `dv`), both layouts, causal
/// or not, `seq_q` below / equal to / above `seq_k`, without and with dropout: 1e-4 of
/// `max(|y|, 1e-2)` (keys one at a time on the GPU vs the CPU's tiles and gemm).
#[test]
fn flash_attention_forward_and_backward_match_the_cpu() {
    let Some(dev) = backend_or_skip("flash_attention_forward_and_backward_match_the_cpu") else {
        return;
    };
    let (g, cpu) = (gpu(dev), CpuBackend);
    let d_head = 4;
    // (seq_q, seq_k, n_heads, n_kv_heads): multi-head and grouped-query attention.
    let cases = [
        (3, 3, 2, 2),
        (2, 5, 2, 2),
        (5, 3, 2, 2),
        (3, 4, 4, 2),
        (4, 4, 4, 1),
    ];
    for (case, (seq_q, seq_k, h, kvh)) in cases.into_iter().enumerate() {
        let dims = AttentionDims {
            batch: 2,
            n_heads: h,
            n_kv_heads: kvh,
            seq_q,
            seq_k,
            d_head,
        };
        for layout in [AttentionLayout::BatchHeadSeq, AttentionLayout::BatchSeqHead] {
            let (qd, kd) = match layout {
                AttentionLayout::BatchHeadSeq => ([2, h, seq_q, d_head], [2, kvh, seq_k, d_head]),
                AttentionLayout::BatchSeqHead => ([2, seq_q, h, d_head], [2, seq_k, kvh, d_head]),
            };
            let s = case as u32 * 10;
            let q = rand(&qd, s, -1.0, 1.0);
            let k = rand(&kd, s + 1, -1.0, 1.0);
            let v = rand(&kd, s + 2, -1.0, 1.0);
            let dout = rand(&qd, s + 3, -1.0, 1.0);
            let (gq, gk, gv, gd) = (on(&q, dev), on(&k, dev), on(&v, dev), on(&dout, dev));
            let mask = DropoutMask {
                p: 0.25,
                key: [5, 9],
                stream: [1, 2],
                offset: 0,
            };
            for causal in [false, true] {
                for dropout in [None, Some(&mask)] {
                    let what = format!(
                        "{seq_q}x{seq_k} heads {h}/{kvh} {layout:?} causal {causal} dropout {}",
                        dropout.is_some()
                    );
                    let (o, lse) = g
                        .flash_attention_forward(
                            "t",
                            &gq,
                            &gk,
                            &gv,
                            dims,
                            layout,
                            0.5,
                            causal,
                            dropout,
                            C::Workspace,
                        )
                        .unwrap();
                    let (wo, wlse) = cpu
                        .flash_attention_forward(
                            "t",
                            &q,
                            &k,
                            &v,
                            dims,
                            layout,
                            0.5,
                            causal,
                            dropout,
                            C::Workspace,
                        )
                        .unwrap();
                    close(&format!("out {what}"), &o, &wo, 1e-4, 1e-2);
                    close(&format!("lse {what}"), &lse, &wlse, 1e-4, 1e-2);
                    let (dq, dk, dv) = g
                        .flash_attention_backward(
                            "t",
                            &gq,
                            &gk,
                            &gv,
                            &o,
                            &lse,
                            &gd,
                            dims,
                            layout,
                            0.5,
                            causal,
                            dropout,
                            C::Workspace,
                        )
                        .unwrap();
                    let (wdq, wdk, wdv) = cpu
                        .flash_attention_backward(
                            "t",
                            &q,
                            &k,
                            &v,
                            &wo,
                            &wlse,
                            &dout,
                            dims,
                            layout,
                            0.5,
                            causal,
                            dropout,
                            C::Workspace,
                        )
                        .unwrap();
                    close(&format!("dq {what}"), &dq, &wdq, 1e-4, 1e-2);
                    close(&format!("dk {what}"), &dk, &wdk, 1e-4, 1e-2);
                    close(&format!("dv {what}"), &dv, &wdv, 1e-4, 1e-2);
                }
            }
        }
    }
    let dims = AttentionDims {
        batch: 1,
        n_heads: 1,
        n_kv_heads: 1,
        seq_q: 2,
        seq_k: 2,
        d_head: 4,
    };
    let q = on(&rand(&[1, 1, 2, 4], 1, -1.0, 1.0), dev);
    let short = on(&rand(&[1, 1, 1, 4], 2, -1.0, 1.0), dev);
    let e = g
        .flash_attention_forward(
            "t",
            &q,
            &short,
            &short,
            dims,
            AttentionLayout::BatchHeadSeq,
            1.0,
            true,
            None,
            C::Workspace,
        )
        .unwrap_err();
    assert!(matches!(e, TensorError::InvalidArgument { .. }), "{e}");
    let bad = DropoutMask {
        p: f32::NAN,
        key: [0, 0],
        stream: [0, 0],
        offset: 0,
    };
    let e = g
        .flash_attention_forward(
            "t",
            &q,
            &q,
            &q,
            dims,
            AttentionLayout::BatchHeadSeq,
            1.0,
            true,
            Some(&bad),
            C::Workspace,
        )
        .unwrap_err();
    assert!(e.to_string().contains("NaN"), "{e}");
}
