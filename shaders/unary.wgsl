// Element-wise maps y = f(x) of riftco-kernels' `UnaryOp` (same math, same op order):
// `params.op` selects the map (codes in crates/riftco-gpu/src/kernels/unary.rs), `params.c` is
// the scalar of the scalar maps. One invocation per element, bounds-checked against `n`.
//
// Where WGSL's built-ins are undefined or unsafe, the map is spelled out:
// - tanh: the argument is clamped to [-10, 10] (tanh is +-1 in f32 there) so that a backend whose
//   tanh goes through exp cannot overflow to NaN;
// - the exact GELU needs erf, which WGSL lacks: erfc(z) of Numerical Recipes (`erfcc`, a Chebyshev
//   fit with fractional error below 1.2e-7 everywhere), so that the small tail of
//   x * Phi(x) for negative x keeps its relative accuracy;
// - pow: x^1 = x, x^2 = x * x, x^0.5 = sqrt(x) (as the CPU kernel); otherwise integer powers of a
//   negative base take the sign of the parity, 0^p is 0 (p > 0), 1 (p = 0) or +inf (p < 0), and a
//   negative base with a fractional power is NaN, as C's powf.
// - log of a negative number is NaN and log(0) is -inf in IEEE terms; WGSL leaves both undefined,
//   so they are spelled out as well.

struct Params {
    n: u32,
    op: u32,
    c: f32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> params: Params;

const WG: u32 = 256u;
const SQRT_2_OVER_PI: f32 = 0.7978846;
const GELU_TANH_C: f32 = 0.044715;
const FRAC_1_SQRT_2: f32 = 0.70710677;

fn nan_f32() -> f32 {
    return bitcast<f32>(0x7fc00000u);
}

fn inf_f32() -> f32 {
    return bitcast<f32>(0x7f800000u);
}

fn safe_tanh(v: f32) -> f32 {
    return tanh(clamp(v, -10.0, 10.0));
}

// erfc(z) for z >= 0 (Numerical Recipes in C, 2nd ed., section 6.2, `erfcc`).
fn erfc_pos(z: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418
        + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587
        + t * (-0.82215223 + t * 0.17087277))))))));
    return t * exp(poly);
}

// Phi(x) = 0.5 * erfc(-x / sqrt(2)), the standard normal CDF.
fn normal_cdf(v: f32) -> f32 {
    let z = v * FRAC_1_SQRT_2;
    if (z >= 0.0) {
        return 1.0 - 0.5 * erfc_pos(z);
    }
    return 0.5 * erfc_pos(-z);
}

fn pow_scalar(v: f32, p: f32) -> f32 {
    if (p == 1.0) {
        return v;
    }
    if (p == 2.0) {
        return v * v;
    }
    if (p == 0.5) {
        return sqrt(v);
    }
    if (p == 0.0) {
        return 1.0;
    }
    if (v == 0.0) {
        if (p > 0.0) {
            return 0.0;
        }
        return inf_f32();
    }
    if (v < 0.0) {
        if (floor(p) != p) {
            return nan_f32();
        }
        let r = pow(-v, p);
        // Parity of an integer-valued p (f32 above 2^24 is always even).
        let half = p * 0.5;
        if (floor(half) != half) {
            return -r;
        }
        return r;
    }
    return pow(v, p);
}

fn safe_log(v: f32) -> f32 {
    if (v < 0.0) {
        return nan_f32();
    }
    if (v == 0.0) {
        return -inf_f32();
    }
    return log(v);
}

fn relu(v: f32) -> f32 {
    // NaN stays NaN (as PyTorch); -0.0 becomes +0.0.
    if (v > 0.0 || v != v) {
        return v;
    }
    return 0.0;
}

fn apply(op: u32, v: f32, c: f32) -> f32 {
    switch op {
        case 0u: { return -v; }
        case 1u: { return exp(v); }
        case 2u: { return safe_log(v); }
        case 3u: { return safe_tanh(v); }
        case 4u: { return 1.0 / (1.0 + exp(-v)); }
        case 5u: { return relu(v); }
        case 6u: { return v * normal_cdf(v); }
        case 7u: {
            let inner = SQRT_2_OVER_PI * (v + GELU_TANH_C * v * v * v);
            return 0.5 * v * (1.0 + safe_tanh(inner));
        }
        case 8u: { return pow_scalar(v, c); }
        case 9u: { return v + c; }
        case 10u: { return c * v; }
        case 11u: { return v / c; }
        case 12u: { return c - v; }
        case 13u: { return c / v; }
        default: { return nan_f32(); }
    }
}

@compute @workgroup_size(256)
fn unary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.n) {
        return;
    }
    y[i] = apply(params.op, x[i], params.c);
}

// ---- unary_backward: dx[i] = dy[i] * f'(x[i]) given x, the forward output y and dy ----------
// The same formulas, op order and op codes as riftco-kernels' `UnaryOp::backward`.

@group(0) @binding(3) var<storage, read> fwd_y: array<f32>;
@group(0) @binding(4) var<storage, read> dy: array<f32>;
@group(0) @binding(5) var<storage, read_write> dx: array<f32>;

const INV_SQRT_2PI: f32 = 0.3989423;

fn backward(op: u32, v: f32, out: f32, g: f32, c: f32) -> f32 {
    switch op {
        case 0u, 12u: { return -g; }
        case 1u: { return g * out; }
        case 2u: { return g / v; }
        case 3u: { return g * (1.0 - out * out); }
        case 4u: { return g * (out * (1.0 - out)); }
        case 5u: { return select(0.0, g, v > 0.0); }
        case 6u: {
            let pdf = exp(-0.5 * v * v) * INV_SQRT_2PI;
            return g * (normal_cdf(v) + v * pdf);
        }
        case 7u: {
            let v2 = v * v;
            let t = safe_tanh(SQRT_2_OVER_PI * (v + GELU_TANH_C * v2 * v));
            let dinner = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_TANH_C * v2);
            return g * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * dinner);
        }
        case 8u: {
            if (c == 0.0) {
                return 0.0;
            }
            return g * (c * pow_scalar(v, c - 1.0));
        }
        case 9u: { return g; }
        case 10u: { return g * c; }
        case 11u: { return g / c; }
        case 13u: { return -g * (out / v); }
        default: { return nan_f32(); }
    }
}

@compute @workgroup_size(256)
fn unary_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.n) {
        return;
    }
    dx[i] = backward(params.op, x[i], fwd_y[i], dy[i], params.c);
}
