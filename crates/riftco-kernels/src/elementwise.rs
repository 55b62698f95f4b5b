//! Element-wise kernels: add, mul, scale, accumulate, SiLU and SwiGLU, forward and backward.
//!
//! All slices of one call must have the same length (checked with `assert_eq!`; the tensor layer
//! validates shapes first and returns errors).

/// `out[i] = a[i] + b[i]`.
pub fn add(a: &[f32], b: &[f32], out: &mut [f32]) {
    assert_eq!(a.len(), b.len(), "add: input lengths");
    assert_eq!(a.len(), out.len(), "add: output length");
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
}

/// `dst[i] += src[i]` (gradient accumulation).
pub fn add_assign(dst: &mut [f32], src: &[f32]) {
    assert_eq!(dst.len(), src.len(), "add_assign: lengths");
    for (d, &s) in dst.iter_mut().zip(src) {
        *d += s;
    }
}

/// `out[i] = a[i] * b[i]`.
pub fn mul(a: &[f32], b: &[f32], out: &mut [f32]) {
    assert_eq!(a.len(), b.len(), "mul: input lengths");
    assert_eq!(a.len(), out.len(), "mul: output length");
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = x * y;
    }
}

/// `out[i] = alpha * a[i]`.
pub fn scale(a: &[f32], alpha: f32, out: &mut [f32]) {
    assert_eq!(a.len(), out.len(), "scale: lengths");
    for (o, &x) in out.iter_mut().zip(a) {
        *o = alpha * x;
    }
}

/// `dst[i] += alpha * src[i]`.
pub fn axpy(alpha: f32, src: &[f32], dst: &mut [f32]) {
    assert_eq!(dst.len(), src.len(), "axpy: lengths");
    for (d, &s) in dst.iter_mut().zip(src) {
        *d += alpha * s;
    }
}

#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// SiLU (swish), `out[i] = x[i] · σ(x[i])` (Elfwing et al. 2018, eq. 4).
pub fn silu(x: &[f32], out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "silu: lengths");
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v * sigmoid(v);
    }
}

/// VJP of SiLU: `dx[i] = dy[i] · σ(x)(1 + x(1 − σ(x)))`.
pub fn silu_backward(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    assert_eq!(x.len(), dy.len(), "silu_backward: lengths");
    assert_eq!(x.len(), dx.len(), "silu_backward: output length");
    for ((d, &v), &g) in dx.iter_mut().zip(x).zip(dy) {
        let s = sigmoid(v);
        *d = g * s * (1.0 + v * (1.0 - s));
    }
}

/// SwiGLU gate, `out[i] = SiLU(gate[i]) · up[i]` (Shazeer 2020, "GLU Variants Improve
/// Transformer", eq. 6).
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert_eq!(gate.len(), up.len(), "swiglu: input lengths");
    assert_eq!(gate.len(), out.len(), "swiglu: output length");
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g * sigmoid(g) * u;
    }
}

/// VJP of SwiGLU: `dgate = dy · up · SiLU'(gate)`, `dup = dy · SiLU(gate)`.
pub fn swiglu_backward(gate: &[f32], up: &[f32], dy: &[f32], dgate: &mut [f32], dup: &mut [f32]) {
    let n = gate.len();
    assert!(
        up.len() == n && dy.len() == n && dgate.len() == n && dup.len() == n,
        "swiglu_backward: lengths"
    );
    for i in 0..n {
        let g = gate[i];
        let s = sigmoid(g);
        dup[i] = dy[i] * g * s;
        dgate[i] = dy[i] * up[i] * s * (1.0 + g * (1.0 - s));
    }
}
