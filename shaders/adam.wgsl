// One Adam / AdamW update in place (Kingma & Ba 2015, Algorithm 1; Loshchilov & Hutter 2019,
// Algorithm 2), PyTorch's formulation with bias correction, the GPU twin of riftco-kernels'
// adam::adam_update, with its constants computed on the host exactly as the CPU does:
//   p <- p * decay;  g <- l2 * p + g
//   m <- beta1 * m + (1 - beta1) g;  v <- beta2 * v + (1 - beta2) g g
//   p <- p - step_size * m / (sqrt(v) * inv_bc2_sqrt + eps)
// with step_size = lr / (1 - beta1^t), inv_bc2_sqrt = 1 / sqrt(1 - beta2^t), and (l2, decay)
// = (0, 1) without weight decay, (wd, 1) for Adam, (0, 1 - lr wd) for AdamW. The multiply-adds
// are fma(), as the CPU kernel's fused multiply-adds on FMA hardware. One invocation per element.

struct Params {
    n: u32,
    step_size: f32,
    inv_bc2_sqrt: f32,
    beta1: f32,
    beta2: f32,
    one_minus_beta1: f32,
    one_minus_beta2: f32,
    eps: f32,
    l2: f32,
    decay: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> grad: array<f32>;
@group(0) @binding(1) var<storage, read_write> param: array<f32>;
@group(0) @binding(2) var<storage, read_write> m: array<f32>;
@group(0) @binding(3) var<storage, read_write> v: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;

const WG: u32 = 256u;

@compute @workgroup_size(256)
fn adam_update(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.n) {
        return;
    }
    let p = param[i] * params.decay;
    let g = fma(params.l2, p, grad[i]);
    let mm = fma(params.beta1, m[i], params.one_minus_beta1 * g);
    let vv = fma(params.beta2, v[i], params.one_minus_beta2 * g * g);
    let denom = fma(sqrt(vv), params.inv_bc2_sqrt, params.eps);
    param[i] = p - params.step_size * mm / denom;
    m[i] = mm;
    v[i] = vv;
}
