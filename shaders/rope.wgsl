// Rotary position embedding (Su et al. 2021, RoFormer, eq. 34) with the rotate-half pairing of
// LLaMA / Hugging Face, the GPU twin of riftco-kernels' rope::rope. x and out are
// [tokens, n_heads, d_head] (tokens = batch * seq_len); the token at sequence index s gets
// position p = start_pos + s. With h = d_head / 2 and (c, s) = (cos, sign * sin)[p, i]:
//   out[i]     = x[i] c - x[i + h] s
//   out[i + h] = x[i + h] c + x[i] s
// sign = -1 rotates by -p theta_i, the VJP. cos and sin are the host table [max_positions, h].
// One invocation per (token, head, i < h) pair on a 2-D grid; invocations past `pairs` return.

struct Params {
    pairs: u32,
    half: u32,
    n_heads: u32,
    seq_len: u32,
    start_pos: u32,
    sign: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> cos_table: array<f32>;
@group(0) @binding(2) var<storage, read> sin_table: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;

const WG: u32 = 256u;

@compute @workgroup_size(256)
fn rope(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let q = gid.x + gid.y * nwg.x * WG;
    if (q >= params.pairs) {
        return;
    }
    let h = params.half;
    let i = q % h;
    let head_row = q / h;
    let token = head_row / params.n_heads;
    let p = params.start_pos + token % params.seq_len;
    let c = cos_table[p * h + i];
    let s = params.sign * sin_table[p * h + i];
    let base = head_row * 2u * h;
    let x1 = x[base + i];
    let x2 = x[base + i + h];
    out[base + i] = x1 * c - x2 * s;
    out[base + i + h] = x2 * c + x1 * s;
}
