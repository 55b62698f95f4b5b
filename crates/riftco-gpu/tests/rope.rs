//! RoPE on the GPU vs `riftco_kernels::rope::rope` (forward and `inverse`, the VJP), on edge
//! shapes (d_head 2, odd `d_head/2`, several heads, batches, a `start_pos`), the VJP checked as
//! the adjoint of the forward in f64 (`⟨rope(x), r⟩ = ⟨x, rope⁻¹(r)⟩`, which holds exactly for
//! the VJP of a linear map, so it is the finite-difference check without a step size), and
//! bad input.
//!
//! Tolerance: 1e-5 of `max(|cpu|, 1)`: both sides multiply the same f32 `cos`/`sin` of the
//! CPU's table with the same operations (no reduction), but a shader compiler may contract
//! `a·c − b·s` into a fused multiply-add, and the results cross 0, so an absolute bound below 1.

mod common;

use common::checks::assert_shape_error;
use common::{assert_close, gpu_or_skip, values};
use riftco_gpu::kernels::{self, GpuRopeTable};
use riftco_kernels::rope::{rope as cpu_rope, RopeTable};

#[test]
fn rope_and_its_inverse_match_the_cpu() {
    let Some(ctx) = gpu_or_skip("rope_and_its_inverse_match_the_cpu") else {
        return;
    };
    // (batch, seq_len, n_heads, d_head, start_pos)
    for (batch, seq, heads, d, start) in [
        (1, 1, 1, 2, 0),
        (1, 5, 3, 6, 0),
        (2, 7, 2, 10, 3),
        (3, 4, 1, 64, 9),
        (1, 65, 4, 8, 0),
    ] {
        let table = RopeTable::new(80, d, 10_000.0);
        let gtable = GpuRopeTable::upload(&ctx, &table).unwrap();
        let n = batch * seq * heads * d;
        let x = values(n, 51, -3.0, 3.0);
        let gx = ctx.upload(&x).unwrap();
        for inverse in [false, true] {
            let mut want = vec![0.0; n];
            cpu_rope(&table, &x, seq, heads, start, inverse, &mut want);
            let got = kernels::rope(&ctx, &gtable, &gx, seq, heads, start, inverse).unwrap();
            assert_close(
                &format!("rope b={batch} s={seq} h={heads} d={d} p0={start} inverse={inverse}"),
                &ctx.download(&got).unwrap(),
                &want,
                1e-5,
                1.0,
            );
        }
    }
}

#[test]
fn the_inverse_is_the_adjoint_of_the_forward() {
    let Some(ctx) = gpu_or_skip("the_inverse_is_the_adjoint_of_the_forward") else {
        return;
    };
    let (seq, heads, d, start) = (5, 2, 6, 2);
    let table = GpuRopeTable::upload(&ctx, &RopeTable::new(16, d, 10_000.0)).unwrap();
    let n = 2 * seq * heads * d;
    let x = values(n, 61, -1.0, 1.0);
    let r = values(n, 62, -1.0, 1.0);
    let fx = kernels::rope(
        &ctx,
        &table,
        &ctx.upload(&x).unwrap(),
        seq,
        heads,
        start,
        false,
    );
    let br = kernels::rope(
        &ctx,
        &table,
        &ctx.upload(&r).unwrap(),
        seq,
        heads,
        start,
        true,
    );
    let (fx, br) = (
        ctx.download(&fx.unwrap()).unwrap(),
        ctx.download(&br.unwrap()).unwrap(),
    );
    let dot = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(p, q)| *p as f64 * *q as f64)
            .sum::<f64>()
    };
    let (lhs, rhs) = (dot(&fx, &r), dot(&x, &br));
    assert!(
        (lhs - rhs).abs() <= 1e-5 * lhs.abs().max(1.0),
        "⟨rope x, r⟩ {lhs} vs ⟨x, rope⁻¹ r⟩ {rhs}"
    );
    // And the inverse undoes the forward.
    let back = kernels::rope(
        &ctx,
        &table,
        &ctx.upload(&fx).unwrap(),
        seq,
        heads,
        start,
        true,
    );
    assert_close(
        "rope⁻¹(rope x)",
        &ctx.download(&back.unwrap()).unwrap(),
        &x,
        1e-5,
        1.0,
    );
}

#[test]
fn bad_shapes_are_shape_errors() {
    let Some(ctx) = gpu_or_skip("bad_shapes_are_shape_errors") else {
        return;
    };
    let table = GpuRopeTable::upload(&ctx, &RopeTable::new(8, 4, 10_000.0)).unwrap();
    let x = ctx.upload(&[1.0; 24]).unwrap();
    assert_shape_error(
        "seq_len 0",
        kernels::rope(&ctx, &table, &x, 0, 2, 0, false),
        &["seq_len"],
    );
    assert_shape_error(
        "n_heads 0",
        kernels::rope(&ctx, &table, &x, 3, 0, 0, false),
        &["n_heads"],
    );
    assert_shape_error(
        "not a multiple",
        kernels::rope(&ctx, &table, &x, 4, 2, 0, false),
        &["24", "4 · 2 · 4"],
    );
    assert_shape_error(
        "past the table",
        kernels::rope(&ctx, &table, &x, 3, 2, 6, false),
        &["6 + 3", "8"],
    );
    assert_shape_error(
        "overflowing start_pos",
        kernels::rope(&ctx, &table, &x, 3, 2, usize::MAX, false),
        &["exceed"],
    );
}
