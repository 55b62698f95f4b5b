// SiLU and SwiGLU with their VJPs, element-wise on f32 buffers of one length `n` (the GPU twins
// of riftco-kernels' elementwise::{silu, silu_backward, swiglu, swiglu_backward}):
//   silu:            out0 = x * sigmoid(x)                          (Elfwing et al. 2018, eq. 4)
//   silu_backward:   out0 = dy * sigmoid(x) * (1 + x * (1 - sigmoid(x)))
//   swiglu:          out0 = silu(gate) * up                          (Shazeer 2020, eq. 6)
//   swiglu_backward: out0 = dgate = dy * up * silu'(gate), out1 = dup = dy * silu(gate)
//   swiglu_backward_in_place: the same with dy read from out0 and dgate written over it
// sigmoid(x) = 1 / (1 + exp(-x)), the CPU kernels' form. One invocation per element on a 2-D
// grid (x up to 65535 workgroups); invocations past `n` return.

struct Params {
    n: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read> c: array<f32>;
@group(0) @binding(3) var<storage, read_write> out0: array<f32>;
@group(0) @binding(4) var<storage, read_write> out1: array<f32>;
@group(0) @binding(5) var<uniform> params: Params;

const WG: u32 = 256u;

fn flat_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

fn sigmoid(v: f32) -> f32 {
    return 1.0 / (1.0 + exp(-v));
}

// SiLU'(v) = sigmoid(v) (1 + v (1 - sigmoid(v))).
fn silu_grad(v: f32) -> f32 {
    let s = sigmoid(v);
    return s * (v * (1.0 - s) + 1.0);
}

// (dgate, dup) of SwiGLU at gate g, up u, upstream gradient d.
fn swiglu_grads(g: f32, u: f32, d: f32) -> vec2<f32> {
    let s = sigmoid(g);
    return vec2<f32>(d * u * (s * (g * (1.0 - s) + 1.0)), d * (g * s));
}

// silu: a = x.
@compute @workgroup_size(256)
fn silu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    out0[i] = a[i] * sigmoid(a[i]);
}

// silu_backward: a = x, b = dy.
@compute @workgroup_size(256)
fn silu_backward(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    out0[i] = b[i] * silu_grad(a[i]);
}

// swiglu: a = gate, b = up.
@compute @workgroup_size(256)
fn swiglu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    let g = a[i];
    out0[i] = g * sigmoid(g) * b[i];
}

// swiglu_backward: a = gate, b = up, c = dy; out0 = dgate, out1 = dup.
@compute @workgroup_size(256)
fn swiglu_backward(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    let grads = swiglu_grads(a[i], b[i], c[i]);
    out0[i] = grads.x;
    out1[i] = grads.y;
}

// swiglu_backward_in_place: a = gate, b = up, out0 = dy on entry and dgate on return,
// out1 = dup (each invocation reads its element of out0 before writing it).
@compute @workgroup_size(256)
fn swiglu_backward_in_place(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    let grads = swiglu_grads(a[i], b[i], out0[i]);
    out0[i] = grads.x;
    out1[i] = grads.y;
}
