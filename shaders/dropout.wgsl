// Philox4x32-10 (Salmon, Moraes, Dror, Shaw 2011, "Parallel Random Numbers: As Easy as 1, 2, 3",
// section 4.3) and the dropout mask it defines, bit for bit the contract of riftco-kernels'
// philox::DropoutMask: element e uses Philox block n = offset + e / 4 (wrapping in 64 bits) with
// counter [n lo, n hi, stream0, stream1] and key `key`, output word e % 4 = x; it is kept iff
// f32(x >> 8) * 2^-24 >= p, and kept elements are multiplied by scale = 1 / (1 - p) (computed in
// f32 on the host), dropped ones are exactly +0.
// The rounds (philox4x32_10) are those of philox.wgsl, prepended to this file when the pipeline
// is built.
//   philox_blocks: out[4 b + w] = word w of philox4x32_10(counters[b], keys[b]) (u32 bits).
//   dropout:       out[e] = keep(e) ? x[e] * scale : 0.
// One invocation per block or element on a 2-D grid; invocations past the end return.

struct Params {
    n: u32,
    p: f32,
    scale: f32,
    offset_lo: u32,
    offset_hi: u32,
    stream0: u32,
    stream1: u32,
    key0: u32,
    key1: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> counters: array<u32>;
@group(0) @binding(2) var<storage, read> keys: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> words: array<u32>;
@group(0) @binding(5) var<uniform> params: Params;

const WG: u32 = 256u;

@compute @workgroup_size(256)
fn philox_blocks(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let b = gid.x + gid.y * nwg.x * WG;
    if (b >= params.n) {
        return;
    }
    let counter = vec4<u32>(counters[4u * b], counters[4u * b + 1u], counters[4u * b + 2u], counters[4u * b + 3u]);
    let key = vec2<u32>(keys[2u * b], keys[2u * b + 1u]);
    let w = philox4x32_10(counter, key);
    words[4u * b] = w.x;
    words[4u * b + 1u] = w.y;
    words[4u * b + 2u] = w.z;
    words[4u * b + 3u] = w.w;
}

@compute @workgroup_size(256)
fn dropout(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= params.n) {
        return;
    }
    // n = offset + e / 4 in 64 bits (e / 4 < 2^30: no high word of its own).
    let lo = params.offset_lo + e / 4u;
    let carry = select(0u, 1u, lo < params.offset_lo);
    let hi = params.offset_hi + carry;
    let block = philox4x32_10(
        vec4<u32>(lo, hi, params.stream0, params.stream1),
        vec2<u32>(params.key0, params.key1),
    );
    let word = block[e % 4u];
    let keep = f32(word >> 8u) * (1.0 / 16777216.0) >= params.p;
    out[e] = select(0.0, x[e] * params.scale, keep);
}
