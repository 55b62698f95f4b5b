//! Element-wise kernels: add, mul, scale, accumulate, SiLU and SwiGLU, forward and backward.
//!
//! All slices of one call must have the same length (checked with `assert_eq!`; the tensor layer
//! validates shapes first and returns errors). Each kernel runs at the SIMD level chosen by
//! [`crate::simd::arch`]; large inputs are split into fixed element ranges over the kernel pool
//! (no reduction is involved, so results do not depend on the thread count).

use pulp::Simd;
use rayon::prelude::*;

use crate::par;
use crate::simd::{arch, map1, map2, sigmoid_f32s, simd_op};

/// Applies a serial kernel on `(a, b, out)` triples, over fixed ranges in parallel when large.
fn run2(a: &[f32], b: &[f32], out: &mut [f32], kernel: impl Fn(&[f32], &[f32], &mut [f32]) + Sync) {
    match par::elements_per_task(out.len()) {
        None => kernel(a, b, out),
        Some(n) => par::install(|| {
            out.par_chunks_mut(n)
                .zip(a.par_chunks(n))
                .zip(b.par_chunks(n))
                .for_each(|((o, a), b)| kernel(a, b, o));
        }),
    }
}

/// Applies a serial kernel on `(a, out)` pairs, over fixed ranges in parallel when large.
fn run1(a: &[f32], out: &mut [f32], kernel: impl Fn(&[f32], &mut [f32]) + Sync) {
    match par::elements_per_task(out.len()) {
        None => kernel(a, out),
        Some(n) => par::install(|| {
            out.par_chunks_mut(n)
                .zip(a.par_chunks(n))
                .for_each(|(o, a)| kernel(a, o));
        }),
    }
}

simd_op!(AddOp<'a> { a: &'a [f32], b: &'a [f32], out: &'a mut [f32] } -> () =
    |s| map2!(S, s, a, b, out, |x, y| s.add_f32s(x, y)));
simd_op!(MulOp<'a> { a: &'a [f32], b: &'a [f32], out: &'a mut [f32] } -> () =
    |s| map2!(S, s, a, b, out, |x, y| s.mul_f32s(x, y)));
simd_op!(ScaleOp<'a> { a: &'a [f32], alpha: f32, out: &'a mut [f32] } -> () =
    |s| map1!(S, s, a, out, |x| s.mul_f32s(s.splat_f32s(alpha), x)));
simd_op!(AxpyOp<'a> { alpha: f32, src: &'a [f32], dst: &'a mut [f32] } -> () = |s| {
    let (dv, dt) = S::as_mut_simd_f32s(dst);
    let (sv, st) = S::as_simd_f32s(src);
    let al = s.splat_f32s(alpha);
    for (d, &x) in dv.iter_mut().zip(sv) {
        *d = s.mul_add_e_f32s(al, x, *d);
    }
    if !st.is_empty() {
        let r = s.mul_add_e_f32s(al, s.partial_load_f32s(st), s.partial_load_f32s(dt));
        s.partial_store_f32s(dt, r);
    }
});
simd_op!(SiluOp<'a> { x: &'a [f32], out: &'a mut [f32] } -> () = |s| map1!(S, s, x, out, |v| silu_v(s, v)));
simd_op!(SiluBwdOp<'a> { x: &'a [f32], dy: &'a [f32], dx: &'a mut [f32] } -> () =
    |s| map2!(S, s, x, dy, dx, |v, g| silu_backward_v(s, v, g)));
simd_op!(SwigluOp<'a> { gate: &'a [f32], up: &'a [f32], out: &'a mut [f32] } -> () =
    |s| map2!(S, s, gate, up, out, |g, u| swiglu_v(s, g, u)));
simd_op!(SwigluBwdInPlaceOp<'a> {
    gate: &'a [f32], up: &'a [f32], dy_dgate: &'a mut [f32], dup: &'a mut [f32]
} -> () = |s| swiglu_backward_in_place_impl(s, gate, up, dy_dgate, dup));

// The per-vector bodies are `#[inline(always)]` functions rather than closures: a closure that
// LLVM declines to inline is compiled without the caller's target features, which makes every
// SIMD operation in it a call (measured: swiglu at 0.5 GB/s instead of memory speed).

#[inline(always)]
fn silu_v<S: Simd>(s: S, v: S::f32s) -> S::f32s {
    s.mul_f32s(v, sigmoid_f32s(s, v))
}

#[inline(always)]
fn silu_backward_v<S: Simd>(s: S, v: S::f32s, g: S::f32s) -> S::f32s {
    s.mul_f32s(g, silu_grad(s, v))
}

#[inline(always)]
fn swiglu_v<S: Simd>(s: S, g: S::f32s, u: S::f32s) -> S::f32s {
    s.mul_f32s(silu_v(s, g), u)
}

#[inline(always)]
fn swiglu_backward_v<S: Simd>(s: S, g: S::f32s, u: S::f32s, d: S::f32s) -> (S::f32s, S::f32s) {
    let one = s.splat_f32s(1.0);
    let sg = sigmoid_f32s(s, g);
    let silu = s.mul_f32s(g, sg);
    let dsilu = s.mul_f32s(sg, s.mul_add_e_f32s(g, s.sub_f32s(one, sg), one));
    (s.mul_f32s(s.mul_f32s(d, u), dsilu), s.mul_f32s(d, silu))
}

/// `SiLU'(x) = σ(x)(1 + x(1 − σ(x)))`.
#[inline(always)]
fn silu_grad<S: Simd>(s: S, v: S::f32s) -> S::f32s {
    let one = s.splat_f32s(1.0);
    let sg = sigmoid_f32s(s, v);
    s.mul_f32s(sg, s.mul_add_e_f32s(v, s.sub_f32s(one, sg), one))
}

#[inline(always)]
fn swiglu_backward_in_place_impl<S: Simd>(
    s: S,
    gate: &[f32],
    up: &[f32],
    dy_dgate: &mut [f32],
    dup: &mut [f32],
) {
    let (gv, gt) = S::as_simd_f32s(gate);
    let (uv, ut) = S::as_simd_f32s(up);
    let (dgv, dgt) = S::as_mut_simd_f32s(dy_dgate);
    let (duv, dut) = S::as_mut_simd_f32s(dup);
    for (((dg, du), &g), &u) in dgv.iter_mut().zip(duv).zip(gv).zip(uv) {
        (*dg, *du) = swiglu_backward_v(s, g, u, *dg);
    }
    if !gt.is_empty() {
        let (a, b) = swiglu_backward_v(
            s,
            s.partial_load_f32s(gt),
            s.partial_load_f32s(ut),
            s.partial_load_f32s(dgt),
        );
        s.partial_store_f32s(dgt, a);
        s.partial_store_f32s(dut, b);
    }
}

/// `out[i] = a[i] + b[i]`.
pub fn add(a: &[f32], b: &[f32], out: &mut [f32]) {
    assert_eq!(a.len(), b.len(), "add: input lengths");
    assert_eq!(a.len(), out.len(), "add: output length");
    run2(a, b, out, |a, b, out| arch().dispatch(AddOp { a, b, out }));
}

/// `dst[i] += src[i]` (gradient accumulation).
pub fn add_assign(dst: &mut [f32], src: &[f32]) {
    axpy(1.0, src, dst);
}

/// `out[i] = a[i] * b[i]`.
pub fn mul(a: &[f32], b: &[f32], out: &mut [f32]) {
    assert_eq!(a.len(), b.len(), "mul: input lengths");
    assert_eq!(a.len(), out.len(), "mul: output length");
    run2(a, b, out, |a, b, out| arch().dispatch(MulOp { a, b, out }));
}

/// `out[i] = alpha * a[i]`.
pub fn scale(a: &[f32], alpha: f32, out: &mut [f32]) {
    assert_eq!(a.len(), out.len(), "scale: lengths");
    run1(a, out, |a, out| arch().dispatch(ScaleOp { a, alpha, out }));
}

/// `dst[i] += alpha * src[i]` (fused multiply-add on SIMD paths; `alpha = 1` is exact).
pub fn axpy(alpha: f32, src: &[f32], dst: &mut [f32]) {
    assert_eq!(dst.len(), src.len(), "axpy: lengths");
    run1(src, dst, |src, dst| {
        arch().dispatch(AxpyOp { alpha, src, dst })
    });
}

/// SiLU (swish), `out[i] = x[i] · σ(x[i])` (Elfwing et al. 2018, eq. 4).
pub fn silu(x: &[f32], out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "silu: lengths");
    run1(x, out, |x, out| arch().dispatch(SiluOp { x, out }));
}

/// VJP of SiLU: `dx[i] = dy[i] · σ(x)(1 + x(1 − σ(x)))`.
pub fn silu_backward(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    assert_eq!(x.len(), dy.len(), "silu_backward: lengths");
    assert_eq!(x.len(), dx.len(), "silu_backward: output length");
    run2(x, dy, dx, |x, dy, dx| {
        arch().dispatch(SiluBwdOp { x, dy, dx })
    });
}

/// SwiGLU gate, `out[i] = SiLU(gate[i]) · up[i]` (Shazeer 2020, "GLU Variants Improve
/// Transformer", eq. 6).
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert_eq!(gate.len(), up.len(), "swiglu: input lengths");
    assert_eq!(gate.len(), out.len(), "swiglu: output length");
    run2(gate, up, out, |gate, up, out| {
        arch().dispatch(SwigluOp { gate, up, out })
    });
}

/// VJP of SwiGLU: `dgate = dy · up · SiLU'(gate)`, `dup = dy · SiLU(gate)` (`dy` copied into
/// `dgate`, then [`swiglu_backward_in_place`]).
pub fn swiglu_backward(gate: &[f32], up: &[f32], dy: &[f32], dgate: &mut [f32], dup: &mut [f32]) {
    assert_eq!(dy.len(), dgate.len(), "swiglu_backward: lengths");
    dgate.copy_from_slice(dy);
    swiglu_backward_in_place(gate, up, dgate, dup);
}

/// [`swiglu_backward`] writing `dgate` over `dy` (`dy_dgate` holds `dy` on entry, `dgate` on
/// return): the VJP of a gradient nobody else reads, one `[n]` buffer less.
pub fn swiglu_backward_in_place(gate: &[f32], up: &[f32], dy_dgate: &mut [f32], dup: &mut [f32]) {
    let n = gate.len();
    assert!(
        up.len() == n && dy_dgate.len() == n && dup.len() == n,
        "swiglu_backward_in_place: lengths"
    );
    let serial = |gate: &[f32], up: &[f32], dy_dgate: &mut [f32], dup: &mut [f32]| {
        arch().dispatch(SwigluBwdInPlaceOp {
            gate,
            up,
            dy_dgate,
            dup,
        })
    };
    match par::elements_per_task(n) {
        None => serial(gate, up, dy_dgate, dup),
        Some(t) => par::install(|| {
            dy_dgate
                .par_chunks_mut(t)
                .zip(dup.par_chunks_mut(t))
                .zip(gate.par_chunks(t))
                .zip(up.par_chunks(t))
                .for_each(|(((dg, du), g), u)| serial(g, u, dg, du));
        }),
    }
}
