//! Reductions over many elements vs the CPU kernel: sizes around the old per-invocation loop
//! of `reduce_axes` (one invocation summed all reduced elements, and llvmpipe cuts an
//! invocation's loops after 65535 back edges, so sums of ones stopped at 21845 / 16383) and the
//! 65535-workgroup limit of one grid dimension. Sums: 1e-4 relative (block tree order vs the
//! CPU's f64), inputs in [0, 1); max: exact.

mod common;

use common::{assert_close, gpu_or_skip, values};
use riftco_gpu::kernels;
use riftco_kernels::attention::{flash_attention_backward, flash_attention_forward, AttentionDims};
use riftco_kernels::matmul::MatmulSpec;
use riftco_kernels::reduce::{reduce, ReduceOp};

/// `x` of `dims` reduced to `out_dims` on the GPU and on the CPU.
fn both(
    ctx: &riftco_gpu::GpuContext,
    kind: ReduceOp,
    x: &[f32],
    dims: &[usize],
    out_dims: &[usize],
) -> (Vec<f32>, Vec<f32>) {
    let n: usize = out_dims.iter().product();
    let mut want = vec![0.0; n];
    reduce(kind, x, dims, out_dims, &mut want);
    let gx = ctx.upload(x).unwrap();
    let got = kernels::reduce_axes(ctx, kind, &gx, dims, out_dims).unwrap();
    (ctx.download(&got).unwrap(), want)
}

#[test]
fn full_sums_of_long_vectors_match_the_cpu() {
    let Some(ctx) = gpu_or_skip("full_sums_of_long_vectors_match_the_cpu") else {
        return;
    };
    for n in [21_845, 21_846, 65_536, (1 << 20) + 3] {
        let ones = vec![1.0; n];
        let (got, want) = both(&ctx, ReduceOp::Sum, &ones, &[n], &[1]);
        assert_eq!(got, want, "sum of {n} ones");
        let x = values(n, 7, 0.0, 1.0);
        let (got, want) = both(&ctx, ReduceOp::Sum, &x, &[n], &[1]);
        assert_close(&format!("sum n={n}"), &got, &want, 1e-4, 1.0);
        let (got, want) = both(&ctx, ReduceOp::Max, &x, &[n], &[1]);
        assert_eq!(got, want, "max n={n}");
        let g = ctx.download(&kernels::sum(&ctx, &ctx.upload(&ones).unwrap()).unwrap());
        assert_eq!(g.unwrap(), vec![n as f32], "kernels::sum of {n} ones");
    }
}

#[test]
fn axis_sums_of_wide_and_tall_matrices_match_the_cpu() {
    let Some(ctx) = gpu_or_skip("axis_sums_of_wide_and_tall_matrices_match_the_cpu") else {
        return;
    };
    let cases: [(&[usize], &[usize]); 6] = [
        (&[200, 200], &[1, 1]),
        (&[2, 16_385], &[2, 1]),
        (&[16_385, 2], &[1, 2]),
        (&[20_000, 4], &[1, 4]),
        (&[16_385, 2], &[16_385, 1]),
        (&[3, 70_000, 2], &[3, 1, 2]),
    ];
    for (dims, out_dims) in cases {
        let n: usize = dims.iter().product();
        let ones = vec![1.0; n];
        let (got, want) = both(&ctx, ReduceOp::Sum, &ones, dims, out_dims);
        assert_eq!(got, want, "ones {dims:?} → {out_dims:?}");
        let x = values(n, 3, 0.0, 1.0);
        let (got, want) = both(&ctx, ReduceOp::Sum, &x, dims, out_dims);
        assert_close(
            &format!("sum {dims:?} → {out_dims:?}"),
            &got,
            &want,
            1e-4,
            1.0,
        );
        let (got, want) = both(&ctx, ReduceOp::Max, &x, dims, out_dims);
        assert_eq!(got, want, "max {dims:?} → {out_dims:?}");
    }
}

#[test]
fn row_sums_beyond_65535_rows_match_the_cpu() {
    let Some(ctx) = gpu_or_skip("row_sums_beyond_65535_rows_match_the_cpu") else {
        return;
    };
    let (rows, cols) = (70_001, 3);
    let x = values(rows * cols, 5, 0.0, 1.0);
    let (got, want) = both(&ctx, ReduceOp::Sum, &x, &[rows, cols], &[rows, 1]);
    assert_close("sum_rows 70001 rows", &got, &want, 1e-4, 1.0);
    let g = kernels::sum_rows(&ctx, &ctx.upload(&x).unwrap(), rows, cols).unwrap();
    assert_close(
        "kernels::sum_rows",
        &ctx.download(&g).unwrap(),
        &want,
        1e-4,
        1.0,
    );
}

#[test]
fn max_propagates_nan_and_is_minus_infinity_over_nothing() {
    let Some(ctx) = gpu_or_skip("max_propagates_nan_and_is_minus_infinity_over_nothing") else {
        return;
    };
    let mut x = values(30_000, 9, -1.0, 1.0);
    x[29_000] = f32::NAN;
    let (got, _) = both(&ctx, ReduceOp::Max, &x, &[30_000], &[1]);
    assert!(got[0].is_nan(), "max with a NaN: {got:?}");
    let (got, _) = both(&ctx, ReduceOp::Max, &[], &[2, 0], &[2, 1]);
    assert_eq!(got, vec![f32::NEG_INFINITY; 2]);
    let (got, _) = both(&ctx, ReduceOp::Sum, &[], &[2, 0], &[2, 1]);
    assert_eq!(got, vec![0.0; 2]);
}

/// `f` on an input whose one shader invocation loops `loops` times: on an adapter that cuts
/// invocations short (llvmpipe) past its limit a `GpuError::Shape` naming the adapter and
/// `what`, never a silently short result; otherwise (under the limit, or a hardware GPU) the
/// result, which the caller checks against the CPU.
fn under_loop_limit<T>(
    ctx: &riftco_gpu::GpuContext,
    loops: usize,
    what: &str,
    f: impl FnOnce() -> riftco_gpu::Result<T>,
) -> Option<T> {
    match ctx.loop_iteration_limit() {
        Some(limit) if loops > limit => {
            let e = f().err().expect("an error past the loop limit").to_string();
            assert!(e.contains("llvmpipe") && e.contains(what), "{e}");
            assert!(e.contains(&loops.to_string()), "{e}");
            None
        }
        _ => Some(f().unwrap()),
    }
}

#[test]
fn per_output_loops_past_the_adapters_limit_are_errors_not_short_results() {
    let Some(ctx) = gpu_or_skip("per_output_loops_past_the_adapters_limit") else {
        return;
    };
    if let Some(limit) = ctx.loop_iteration_limit() {
        assert_eq!(limit, riftco_gpu::LLVMPIPE_LOOP_LIMIT);
    }
    // RMSNorm's weight gradient: rows + 2 · ceil(rows / 32) + 1 loop-header executions per
    // column. 60000 rows fit the limit (63751), 70000 do not (on llvmpipe 61681 rows are
    // summed and the rest silently dropped).
    let cols = 2;
    let w = [0.7f32, -1.3];
    for rows in [60_000usize, 70_000] {
        let x = values(rows * cols, 11, -1.0, 1.0);
        let dy = values(rows * cols, 12, -1.0, 1.0);
        let (mut y, mut rstd) = (vec![0.0; x.len()], vec![0.0; rows]);
        riftco_kernels::norm::rms_norm(&x, &w, 1e-5, &mut y, &mut rstd);
        let (mut dx, mut dweight) = (vec![0.0; x.len()], vec![0.0; cols]);
        riftco_kernels::norm::rms_norm_backward(&x, &w, &rstd, &dy, &mut dx, Some(&mut dweight));
        let loops = rows + 2 * rows.div_ceil(32) + 1;
        let (gx, gw, gr, gdy) = (
            ctx.upload(&x).unwrap(),
            ctx.upload(&w).unwrap(),
            ctx.upload(&rstd).unwrap(),
            ctx.upload(&dy).unwrap(),
        );
        let got = under_loop_limit(&ctx, loops, &format!("{rows} rows"), || {
            kernels::rms_norm_backward(&ctx, &gx, &gw, &gr, &gdy)
        });
        if let Some((_, gdw)) = got {
            let gdw = ctx.download(&gdw).unwrap();
            assert_close(
                &format!("dweight over {rows} rows"),
                &gdw,
                &dweight,
                1e-4,
                1.0,
            );
        }
    }
    // The embedding VJP: one invocation per table entry loops over the positions of its id.
    let d = 2;
    for count in [65_000usize, 70_000] {
        let mut ids = vec![3u32; count];
        ids.push(1);
        let dy = values(ids.len() * d, 13, -1.0, 1.0);
        let mut want = vec![0.0; 5 * d];
        riftco_kernels::embedding::embedding_backward(&ids, &dy, d, &mut want);
        let gdy = ctx.upload(&dy).unwrap();
        let got = under_loop_limit(
            &ctx,
            count + 1,
            &format!("token id 3 occurs {count} times"),
            || kernels::embedding_backward(&ctx, &ids, &gdy, d, 5),
        );
        if let Some(g) = got {
            assert_eq!(
                ctx.download(&g).unwrap(),
                want,
                "embedding VJP, {count} repeats"
            );
        }
    }
    // FlashAttention-2 (d_head 32, one head, non-causal): the forward walks seq_k keys per
    // query row (67 loop-header executions a key: 976 keys fit, 978 do not), the backward
    // seq_k keys per query and seq_q queries per key (100 a step: 654 fit, 656 do not).
    let d = 32;
    for (seq, backward) in [(976usize, false), (978, false), (654, true), (656, true)] {
        let dims = AttentionDims {
            batch: 1,
            n_heads: 1,
            n_kv_heads: 1,
            seq_q: seq,
            seq_k: seq,
            d_head: d,
        };
        let n = seq * d;
        let (q, k, v, dout) = (
            values(n, 21, -1.0, 1.0),
            values(n, 22, -1.0, 1.0),
            values(n, 23, -1.0, 1.0),
            values(n, 24, -1.0, 1.0),
        );
        let scale = 1.0 / (d as f32).sqrt();
        let (mut out, mut lse) = (vec![0.0; n], vec![0.0; seq]);
        flash_attention_forward(&q, &k, &v, dims, scale, false, &mut out, &mut lse);
        let up = |x: &[f32]| ctx.upload(x).unwrap();
        let (gq, gk, gv) = (up(&q), up(&k), up(&v));
        if !backward {
            let loops = seq * (2 * d + 3) + 3 * (d + 1) + 1;
            let got = under_loop_limit(&ctx, loops, &format!("{seq} keys"), || {
                kernels::flash_attention_forward(&ctx, &gq, &gk, &gv, dims, scale, false)
            });
            if let Some((go, _)) = got {
                let go = ctx.download(&go).unwrap();
                assert_close(&format!("flash out, {seq} keys"), &go, &out, 1e-4, 1e-2);
            }
            continue;
        }
        let (mut dq, mut dk, mut dv) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        flash_attention_backward(
            &q, &k, &v, &out, &lse, &dout, dims, scale, false, &mut dq, &mut dk, &mut dv,
        );
        let (go, glse, gdo) = (up(&out), up(&lse), up(&dout));
        let loops = seq * (3 * d + 4) + 1 + 2 * (d + 1) + 1;
        let got = under_loop_limit(&ctx, loops, &format!("{seq} keys"), || {
            kernels::flash_attention_backward(
                &ctx, &gq, &gk, &gv, &go, &glse, &gdo, dims, scale, false,
            )
        });
        if let Some((a, b, c)) = got {
            for (what, g, want) in [("dq", a, &dq), ("dk", b, &dk), ("dv", c, &dv)] {
                let g = ctx.download(&g).unwrap();
                assert_close(&format!("flash {what}, {seq} keys"), &g, want, 1e-4, 1e-2);
            }
        }
    }
    // A matmul walks k in tiles of 16 (k + 2 · ceil(k / 16) + 1): k = 58000 fits, 60000 not.
    for k in [58_000usize, 60_000] {
        let (a, b) = (values(k, 25, -1.0, 1.0), values(k, 26, -1.0, 1.0));
        let want: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum();
        let (ga, gb) = (ctx.upload(&a).unwrap(), ctx.upload(&b).unwrap());
        let spec = MatmulSpec::new(1, k, 1);
        let got = under_loop_limit(
            &ctx,
            k + 2 * k.div_ceil(16) + 1,
            &format!("k = {k}"),
            || kernels::matmul(&ctx, spec, &ga, &gb),
        );
        if let Some(g) = got {
            let g = ctx.download(&g).unwrap();
            let scale: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| f64::from((x * y).abs()))
                .sum();
            assert!(
                (f64::from(g[0]) - want).abs() <= 1e-4 * scale,
                "k = {k}: {g:?} vs {want}"
            );
        }
    }
    // A scatter through a view addressing one element n times runs in one invocation, in
    // order (n · (rank + 2) + 1 loop-header executions): 20000 fit, 30000 do not (llvmpipe
    // stops after 21845 of them).
    for n in [20_000usize, 30_000] {
        let src = values(n, 14, 0.0, 1.0);
        let want = src.iter().fold(0.0f32, |acc, v| acc + v);
        let (gsrc, gdst) = (ctx.upload(&src).unwrap(), ctx.upload(&[0.0]).unwrap());
        let got = under_loop_limit(&ctx, 3 * n + 1, "addressing an element twice", || {
            kernels::scatter(&ctx, &gdst, &gsrc, &[n], &[0], 0, true)
        });
        if got.is_some() {
            assert_eq!(
                ctx.download(&gdst).unwrap(),
                [want],
                "scatter-add of {n} values"
            );
        }
    }
}
