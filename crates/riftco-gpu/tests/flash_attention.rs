//! FlashAttention-2 forward and backward on the GPU vs the CPU kernels
//! (`riftco_kernels::attention::flash_attention_{forward,backward}`), causal and not, on edge
//! shapes (one query and key, `seq_q` < / = / > `seq_k`, odd `d_head`, several batches and
//! heads). Grouped-query attention (`n_kv_heads < n_heads`) is compared with the CPU kernel run
//! on K/V repeated per group, its dK/dV summed per group here. The CPU backward is itself
//! checked against central finite differences in f64
//! (`crates/riftco-kernels/tests/attention.rs::gradients_match_finite_differences`), so the
//! GPU backward is checked against finite differences through it. Determinism: two runs of the
//! backward are bitwise equal. Bad input: shape errors naming the values.
//!
//! Tolerance: 1e-4 of `max(|cpu|, 1e-2)`: the reduction orders differ (the GPU walks keys one
//! at a time with a rescale per key, the CPU in tiles of 64/256 with gemm; dK/dV sum queries
//! and group heads in another order), and outputs and gradients cross 0.

mod common;

use common::checks::assert_shape_error;
use common::{assert_close, gpu_or_skip, values};
use riftco_gpu::kernels;
use riftco_kernels::attention::{flash_attention_backward, flash_attention_forward, AttentionDims};

/// `x` `[batch, n_kv, seq, d]` with each KV head repeated `group` times: `[batch, n_kv·group, seq, d]`.
fn repeat_kv(x: &[f32], batch: usize, n_kv: usize, group: usize) -> Vec<f32> {
    let head = x.len() / (batch * n_kv);
    let mut out = Vec::with_capacity(x.len() * group);
    for b in 0..batch {
        for h in 0..n_kv {
            let src = &x[(b * n_kv + h) * head..(b * n_kv + h + 1) * head];
            for _ in 0..group {
                out.extend_from_slice(src);
            }
        }
    }
    out
}

/// The inverse of [`repeat_kv`] for gradients: each group's heads summed in increasing order.
fn sum_groups(x: &[f32], batch: usize, n_kv: usize, group: usize) -> Vec<f32> {
    let head = x.len() / (batch * n_kv * group);
    let mut out = vec![0.0; batch * n_kv * head];
    for b in 0..batch {
        for h in 0..n_kv {
            let dst = &mut out[(b * n_kv + h) * head..(b * n_kv + h + 1) * head];
            for g in 0..group {
                let src = ((b * n_kv + h) * group + g) * head;
                for (o, s) in dst.iter_mut().zip(&x[src..src + head]) {
                    *o += s;
                }
            }
        }
    }
    out
}

#[test]
fn forward_and_backward_match_the_cpu_with_grouped_kv_heads() {
    let Some(ctx) = gpu_or_skip("forward_and_backward_match_the_cpu_with_grouped_kv_heads") else {
        return;
    };
    // (batch, n_heads, n_kv_heads, seq_q, seq_k, d_head)
    for (b, h, kvh, sq, sk, d) in [
        (1, 1, 1, 1, 1, 1),
        (1, 2, 2, 5, 5, 4),
        (2, 4, 2, 7, 9, 3),
        (1, 3, 1, 9, 4, 8),
        (1, 4, 1, 17, 17, 16),
        (2, 2, 1, 3, 70, 5),
    ] {
        let group = h / kvh;
        let dims = AttentionDims {
            batch: b,
            n_heads: h,
            n_kv_heads: h,
            seq_q: sq,
            seq_k: sk,
            d_head: d,
        };
        // The CPU reference runs on K/V repeated per group (n_kv_heads = n_heads); the GPU
        // kernel reads the grouped K/V.
        let gpu_dims = AttentionDims {
            n_kv_heads: kvh,
            ..dims
        };
        let q = values(b * h * sq * d, 131, -1.0, 1.0);
        let k = values(b * kvh * sk * d, 132, -1.0, 1.0);
        let v = values(b * kvh * sk * d, 133, -1.0, 1.0);
        let dout = values(b * h * sq * d, 134, -1.0, 1.0);
        let (k_rep, v_rep) = (repeat_kv(&k, b, kvh, group), repeat_kv(&v, b, kvh, group));
        let scale = 1.0 / (d as f32).sqrt();
        let (gq, gk, gv, gdo) = (
            ctx.upload(&q).unwrap(),
            ctx.upload(&k).unwrap(),
            ctx.upload(&v).unwrap(),
            ctx.upload(&dout).unwrap(),
        );
        for causal in [false, true] {
            let what = format!("b={b} h={h} kvh={kvh} sq={sq} sk={sk} d={d} causal={causal}");
            let (mut out, mut lse) = (vec![0.0; q.len()], vec![0.0; b * h * sq]);
            flash_attention_forward(&q, &k_rep, &v_rep, dims, scale, causal, &mut out, &mut lse);
            let (go, glse) =
                kernels::flash_attention_forward(&ctx, &gq, &gk, &gv, gpu_dims, scale, causal)
                    .unwrap();
            assert_close(
                &format!("out {what}"),
                &ctx.download(&go).unwrap(),
                &out,
                1e-4,
                1e-2,
            );
            assert_close(
                &format!("lse {what}"),
                &ctx.download(&glse).unwrap(),
                &lse,
                1e-4,
                1e-2,
            );

            let (mut dq, mut dk, mut dv) = (
                vec![0.0; q.len()],
                vec![0.0; k_rep.len()],
                vec![0.0; v_rep.len()],
            );
            flash_attention_backward(
                &q, &k_rep, &v_rep, &out, &lse, &dout, dims, scale, causal, &mut dq, &mut dk,
                &mut dv,
            );
            let (dk, dv) = (
                sum_groups(&dk, b, kvh, group),
                sum_groups(&dv, b, kvh, group),
            );
            let grads = |ctx: &riftco_gpu::GpuContext| {
                let (a, b_, c) = kernels::flash_attention_backward(
                    ctx, &gq, &gk, &gv, &go, &glse, &gdo, gpu_dims, scale, causal,
                )
                .unwrap();
                (
                    ctx.download(&a).unwrap(),
                    ctx.download(&b_).unwrap(),
                    ctx.download(&c).unwrap(),
                )
            };
            let (gdq, gdk, gdv) = grads(&ctx);
            assert_close(&format!("dq {what}"), &gdq, &dq, 1e-4, 1e-2);
            assert_close(&format!("dk {what}"), &gdk, &dk, 1e-4, 1e-2);
            assert_close(&format!("dv {what}"), &gdv, &dv, 1e-4, 1e-2);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let (again_q, again_k, again_v) = grads(&ctx);
            assert_eq!(bits(&again_q), bits(&gdq), "dq run to run {what}");
            assert_eq!(bits(&again_k), bits(&gdk), "dk run to run {what}");
            assert_eq!(bits(&again_v), bits(&gdv), "dv run to run {what}");
        }
    }
}

#[test]
fn bad_shapes_are_shape_errors() {
    let Some(ctx) = gpu_or_skip("bad_shapes_are_shape_errors") else {
        return;
    };
    let x = ctx.upload(&[0.0; 24]).unwrap();
    let dims = |n_heads, d_head| AttentionDims {
        batch: 1,
        n_heads,
        n_kv_heads: n_heads,
        seq_q: 3,
        seq_k: 4,
        d_head,
    };
    let fwd = |dm: AttentionDims, n_kv_heads, q: &riftco_gpu::GpuBuffer| {
        let dm = AttentionDims { n_kv_heads, ..dm };
        kernels::flash_attention_forward(&ctx, q, &x, &x, dm, 1.0, true)
    };
    assert_shape_error("n_kv_heads 0", fwd(dims(2, 4), 0, &x), &["n_kv_heads = 0"]);
    assert_shape_error(
        "group",
        fwd(dims(3, 4), 2, &x),
        &["n_heads = 3", "n_kv_heads = 2"],
    );
    assert_shape_error("d_head", fwd(dims(1, 200), 1, &x), &["d_head = 200", "128"]);
    assert_shape_error("k length", fwd(dims(2, 4), 2, &x), &["k has 24", "32"]);
    assert_shape_error("q length", fwd(dims(2, 3), 1, &x), &["q has 24", "18"]);
    let q = ctx.upload(&[0.0; 24]).unwrap();
    let huge = AttentionDims {
        batch: usize::MAX,
        n_heads: 2,
        n_kv_heads: 2,
        seq_q: 3,
        seq_k: 4,
        d_head: 4,
    };
    assert_shape_error("overflow", fwd(huge, 1, &q), &["overflows"]);
    let lse = ctx.upload(&[0.0; 5]).unwrap();
    let dm = AttentionDims {
        batch: 1,
        n_heads: 2,
        n_kv_heads: 2,
        seq_q: 3,
        seq_k: 3,
        d_head: 4,
    };
    assert_shape_error(
        "lse length",
        kernels::flash_attention_backward(&ctx, &x, &x, &x, &x, &lse, &x, dm, 1.0, true),
        &["lse", "5", "6"],
    );
}

/// Dropout inside flash attention: forward and backward vs the CPU's `_with_dropout` kernels on
/// K/V repeated per group (the same mask over `[batch, n_heads, seq_q, seq_k]`), at offsets that
/// wrap the 64-bit block counter; `p = 0` is exactly the plain kernels; tolerance as above.
#[test]
fn dropout_inside_flash_attention_matches_the_cpu() {
    let Some(ctx) = gpu_or_skip("dropout_inside_flash_attention_matches_the_cpu") else {
        return;
    };
    use riftco_kernels::attention::{
        flash_attention_backward_with_dropout as cpu_bwd,
        flash_attention_forward_with_dropout as cpu_fwd, AttentionLayout,
    };
    use riftco_kernels::philox::DropoutMask;
    for (b, h, kvh, sq, sk, d, p, offset) in [
        (1, 2, 1, 5, 7, 4, 0.3, 0),
        (2, 4, 2, 9, 9, 3, 0.5, u64::MAX - 5),
        (1, 1, 1, 1, 1, 2, 0.1, 11),
    ] {
        let group = h / kvh;
        let dims = AttentionDims {
            batch: b,
            n_heads: h,
            n_kv_heads: h,
            seq_q: sq,
            seq_k: sk,
            d_head: d,
        };
        // The CPU reference runs on K/V repeated per group (n_kv_heads = n_heads); the GPU
        // kernel reads the grouped K/V.
        let gpu_dims = AttentionDims {
            n_kv_heads: kvh,
            ..dims
        };
        let mask = DropoutMask {
            p,
            key: [0xdead_beef, 7],
            stream: [1, 2],
            offset,
        };
        let q = values(b * h * sq * d, 151, -1.0, 1.0);
        let k = values(b * kvh * sk * d, 152, -1.0, 1.0);
        let v = values(b * kvh * sk * d, 153, -1.0, 1.0);
        let dout = values(b * h * sq * d, 154, -1.0, 1.0);
        let (k_rep, v_rep) = (repeat_kv(&k, b, kvh, group), repeat_kv(&v, b, kvh, group));
        let scale = 0.5;
        let (gq, gk, gv, gdo) = (
            ctx.upload(&q).unwrap(),
            ctx.upload(&k).unwrap(),
            ctx.upload(&v).unwrap(),
            ctx.upload(&dout).unwrap(),
        );
        for causal in [false, true] {
            let what = format!("b={b} h={h} kvh={kvh} sq={sq} sk={sk} p={p} causal={causal}");
            let layout = AttentionLayout::BatchHeadSeq;
            let (mut out, mut lse) = (vec![0.0; q.len()], vec![0.0; b * h * sq]);
            cpu_fwd(
                &q,
                &k_rep,
                &v_rep,
                dims,
                layout,
                scale,
                causal,
                Some(&mask),
                &mut out,
                &mut lse,
            );
            let (go, glse) = kernels::flash_attention_forward_with_dropout(
                &ctx,
                &gq,
                &gk,
                &gv,
                gpu_dims,
                scale,
                causal,
                Some(&mask),
            )
            .unwrap();
            assert_close(
                &format!("out {what}"),
                &ctx.download(&go).unwrap(),
                &out,
                1e-4,
                1e-2,
            );
            assert_close(
                &format!("lse {what}"),
                &ctx.download(&glse).unwrap(),
                &lse,
                1e-4,
                1e-2,
            );
            let (mut dq, mut dk, mut dv) = (
                vec![0.0; q.len()],
                vec![0.0; k_rep.len()],
                vec![0.0; v_rep.len()],
            );
            cpu_bwd(
                &q,
                &k_rep,
                &v_rep,
                &out,
                &lse,
                &dout,
                dims,
                layout,
                scale,
                causal,
                Some(&mask),
                &mut dq,
                &mut dk,
                &mut dv,
            );
            let (dk, dv) = (
                sum_groups(&dk, b, kvh, group),
                sum_groups(&dv, b, kvh, group),
            );
            let (gdq, gdk, gdv) = kernels::flash_attention_backward_with_dropout(
                &ctx,
                &gq,
                &gk,
                &gv,
                &go,
                &glse,
                &gdo,
                gpu_dims,
                scale,
                causal,
                Some(&mask),
            )
            .unwrap();
            assert_close(
                &format!("dq {what}"),
                &ctx.download(&gdq).unwrap(),
                &dq,
                1e-4,
                1e-2,
            );
            assert_close(
                &format!("dk {what}"),
                &ctx.download(&gdk).unwrap(),
                &dk,
                1e-4,
                1e-2,
            );
            assert_close(
                &format!("dv {what}"),
                &ctx.download(&gdv).unwrap(),
                &dv,
                1e-4,
                1e-2,
            );
        }
        // p = 0 is bitwise the kernel without dropout.
        let zero = DropoutMask { p: 0.0, ..mask };
        let with = kernels::flash_attention_forward_with_dropout(
            &ctx,
            &gq,
            &gk,
            &gv,
            gpu_dims,
            scale,
            true,
            Some(&zero),
        )
        .unwrap();
        let without =
            kernels::flash_attention_forward(&ctx, &gq, &gk, &gv, gpu_dims, scale, true).unwrap();
        assert_eq!(
            ctx.download(&with.0)
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>(),
            ctx.download(&without.0)
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>(),
            "p = 0"
        );
    }
    let dims = AttentionDims {
        batch: 1,
        n_heads: 1,
        n_kv_heads: 1,
        seq_q: 2,
        seq_k: 2,
        d_head: 2,
    };
    let x = ctx.upload(&[0.0; 4]).unwrap();
    let bad = DropoutMask {
        p: 1.0,
        key: [0, 0],
        stream: [0, 0],
        offset: 0,
    };
    assert_shape_error(
        "dropout p",
        kernels::flash_attention_forward_with_dropout(
            &ctx,
            &x,
            &x,
            &x,
            dims,
            1.0,
            true,
            Some(&bad),
        ),
        &["p = 1"],
    );
}
