// Quantized frozen weights: dequantization of a range of whole blocks and the fused mat-vec
// product of decoding, the GPU twins of riftco-kernels' quant::{dequantize_range, matvec}.
//
// `data` holds the tensor's storage bytes exactly as the CPU keeps them (the GGML blocks of
// llama.cpp's ggml-common.h, or NF4 with double-quantized absmax, layouts in
// riftco-kernels/src/quant/format.rs), little endian, padded with zero bytes to whole u32
// words; WGSL has no 8-bit type, so every byte is read from its word with shifts (blocks of
// 18, 22, 34, 210 ... bytes start anywhere in a word). For NF4, the 16 code values and the 256
// values of the absmax's dynamic map follow as f32 bits from word `params.tables` on (the host
// takes them from the CPU kernels' tables, so both read the same numbers).
//
// Values are bitwise those of the CPU for finite block scales on an adapter that rounds f32
// addition and multiplication to nearest-even (Vulkan and Metal devices do; Mesa's llvmpipe is
// tested). The WGSL specification itself promises less: an inexact result may be either
// neighbouring f32, subnormal floats may be flushed, and `a * b + c` may be contracted. So:
// - f16 scales are widened with integer operations, exact for subnormal f16 too (never through
//   unpack2x16float, a float conversion an implementation may flush);
// - every product is exact: an f16 scale has at most 11 significant bits and the integers it
//   is multiplied by at most 12 together (Q6_K: a group scale in -128..127 times a quant in
//   -32..31, 7 + 5 bits; Q8_0: a quant of 7), within f32's 24 and far from overflow, so
//   neither the rounding mode nor a contraction of the addition after it into a fused
//   multiply-add can change it; every GGML value is a multiple of 2^-24, so no subnormal f32
//   arises; the one rounding left is the final `+ m` / `- dmin * m`, in the CPU's order;
// - NF4's `dynamic[q] * scale + offset` is not exact: the product goes through `fence`, an
//   integer xor with a uniform that is always 0, so that it cannot be contracted.
// A non-finite f16 scale (no quantizer writes one) gives values WGSL leaves unspecified.
//
// Entry points, one pair per format (the format is a constant argument, folded once the
// driver inlines the functions): dequantize_<format> writes out[t] = value(first + t) for
// t < count, one invocation per element on a 2-D grid of 256-wide workgroups;
// matvec_<format> writes out[r] = sum_c value(r * cols + c) * x[c] for r < count, one
// workgroup of 64 per row (grid x = row, y = row / 65535 overflow): thread t walks columns
// t, t + 64, ... in order and the 64 partials are added in a fixed tree, so the result is
// deterministic (not bitwise the CPU's sequential sum); gather_<format> writes
// out[t] = value(rows[t / width] * cols + first + t % width) for t < count: `width` columns
// from column `first` of each listed row, in list order (embedding lookups of a quantized
// table, and blocks of whole columns for the product dY · W), one invocation per element.

struct Params {
    // dequantize: elements written; matvec: rows.
    count: u32,
    // dequantize: the first element (a block boundary); gather: the first column; matvec: 0.
    first: u32,
    // Elements of the whole tensor (NF4's sections are placed by it).
    numel: u32,
    // matvec, gather: elements per row of the tensor (whole blocks); dequantize: 0.
    cols: u32,
    // NF4: the word where the code values and the dynamic map start.
    tables: u32,
    // Always 0; the compiler cannot know it (see `fence`).
    zero: u32,
    // gather: the columns taken from each row (whole blocks, > 0); otherwise 0.
    width: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> data: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;
// gather: the rows to read, each < numel / cols (checked on the host).
@group(0) @binding(4) var<storage, read> rows: array<u32>;

const WG: u32 = 256u;
const WG_ROW: u32 = 64u;

const Q4_0: u32 = 0u;
const Q4_1: u32 = 1u;
const Q5_0: u32 = 2u;
const Q5_1: u32 = 3u;
const Q8_0: u32 = 4u;
const Q2_K: u32 = 5u;
const Q3_K: u32 = 6u;
const Q4_K: u32 = 7u;
const Q5_K: u32 = 8u;
const Q6_K: u32 = 9u;
const NF4: u32 = 10u;

// ---- bytes --------------------------------------------------------------------------------

fn byte_at(at: u32) -> u32 {
    return (data[at >> 2u] >> ((at & 3u) << 3u)) & 0xffu;
}

fn u16_at(at: u32) -> u32 {
    return byte_at(at) | (byte_at(at + 1u) << 8u);
}

fn u32_at(at: u32) -> u32 {
    return u16_at(at) | (u16_at(at + 2u) << 16u);
}

// The byte as a signed 8-bit integer.
fn i8_at(at: u32) -> i32 {
    return bitcast<i32>(byte_at(at) << 24u) >> 24u;
}

// IEEE binary16 bits widened to f32 exactly, with integer operations only.
fn f16_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 31u) {
        // Infinity, or a NaN with its payload and the quiet bit.
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u) | select(0u, 0x400000u, m != 0u));
    }
    if (e != 0u) {
        return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
    }
    if (m == 0u) {
        return bitcast<f32>(sign);
    }
    // Subnormal: m * 2^-24 = 2^(p - 24) * (m / 2^p), p the leading bit of m.
    let p = firstLeadingBit(m);
    return bitcast<f32>(sign | ((p + 103u) << 23u) | ((m << (23u - p)) & 0x7fffffu));
}

fn f16_at(at: u32) -> f32 {
    return f16_to_f32(u16_at(at));
}

fn f32_at(at: u32) -> f32 {
    return bitcast<f32>(u32_at(at));
}

// `v` unchanged, through an operation the compiler cannot see through: a product fenced this
// way is rounded on its own before the addition that follows.
fn fence(v: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(v) ^ params.zero);
}

// ---- the 32-element blocks (legacy.rs): element j < 16 is the low nibble of byte j, j + 16
// the high nibble; the 5-bit formats take bit j of qh as bit 4 of element j. ----------------

// The 4-bit quant of element j of a block whose nibbles start at byte `qs`.
fn nibble(qs: u32, j: u32) -> u32 {
    return (byte_at(qs + (j & 15u)) >> ((j >> 4u) << 2u)) & 0xfu;
}

// {d: f16, qs: [u8; 16]}: d * (q - 8).
fn q4_0(i: u32) -> f32 {
    let o = (i / 32u) * 18u;
    let j = i % 32u;
    return f16_at(o) * f32(i32(nibble(o + 2u, j)) - 8);
}

// {d: f16, m: f16, qs: [u8; 16]}: d * q + m.
fn q4_1(i: u32) -> f32 {
    let o = (i / 32u) * 20u;
    let j = i % 32u;
    return f16_at(o) * f32(nibble(o + 4u, j)) + f16_at(o + 2u);
}

// {d: f16, qh: u32, qs: [u8; 16]}: d * (q - 16).
fn q5_0(i: u32) -> f32 {
    let o = (i / 32u) * 22u;
    let j = i % 32u;
    let q = nibble(o + 6u, j) | (((u32_at(o + 2u) >> j) & 1u) << 4u);
    return f16_at(o) * f32(i32(q) - 16);
}

// {d: f16, m: f16, qh: u32, qs: [u8; 16]}: d * q + m.
fn q5_1(i: u32) -> f32 {
    let o = (i / 32u) * 24u;
    let j = i % 32u;
    let q = nibble(o + 8u, j) | (((u32_at(o + 4u) >> j) & 1u) << 4u);
    return f16_at(o) * f32(q) + f16_at(o + 2u);
}

// {d: f16, qs: [i8; 32]}: q * d.
fn q8_0(i: u32) -> f32 {
    let o = (i / 32u) * 34u;
    return f32(i8_at(o + 2u + i % 32u)) * f16_at(o);
}

// ---- the 256-element super-blocks (k_quants.rs); element i of a block is 128 g + 32 s + l
// (g = i / 128, s = (i / 32) % 4, l = i % 32). -------------------------------------------------

// {scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16}: (d * sc) * q - dmin * m.
fn q2_k(i: u32) -> f32 {
    let o = (i / 256u) * 84u;
    let e = i % 256u;
    let g = e / 128u;
    let s = (e / 32u) % 4u;
    let l = e % 32u;
    let q = (byte_at(o + 16u + 32u * g + l) >> (2u * s)) & 3u;
    let sc = byte_at(o + e / 16u);
    let dl = f16_at(o + 80u) * f32(sc & 0xfu);
    let ml = f16_at(o + 82u) * f32(sc >> 4u);
    return dl * f32(q) - ml;
}

// {hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16}: (d * (sc - 32)) * q, q the 2 low
// bits of qs minus 4 where the hmask bit is clear; scale k's low 4 bits are nibble k / 8 of
// byte k % 8, its high 2 bits are bits 2 (k / 4) of byte 8 + k % 4.
fn q3_k(i: u32) -> f32 {
    let o = (i / 256u) * 110u;
    let e = i % 256u;
    let g = e / 128u;
    let s = (e / 32u) % 4u;
    let l = e % 32u;
    let k = e / 16u;
    let low_sc = (byte_at(o + 96u + k % 8u) >> (4u * (k / 8u))) & 0xfu;
    let high_sc = (byte_at(o + 104u + k % 4u) >> (2u * (k / 4u))) & 3u;
    let sc = i32(low_sc | (high_sc << 4u)) - 32;
    let low = i32((byte_at(o + 32u + 32u * g + l) >> (2u * s)) & 3u);
    let high = i32(((byte_at(o + l) >> (e / 32u)) & 1u) ^ 1u);
    let dl = f16_at(o + 108u) * f32(sc);
    return dl * f32(low - (high << 2u));
}

// Scale and minimum (6 bits each) of group j of a Q4_K / Q5_K block whose 12 packed bytes
// start at `p` (get_scale_min_k4 of ggml-quants.c).
fn scale_min_k4(p: u32, j: u32) -> vec2<u32> {
    if (j < 4u) {
        return vec2<u32>(byte_at(p + j) & 63u, byte_at(p + j + 4u) & 63u);
    }
    let k = j - 4u;
    let md = byte_at(p + 8u + k);
    let sc = (md & 0xfu) | ((byte_at(p + k) >> 2u) & 0x30u);
    let mn = (md >> 4u) | ((byte_at(p + 4u + k) >> 2u) & 0x30u);
    return vec2<u32>(sc, mn);
}

// {d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]}: (d * sc) * q - dmin * m; group
// j = e / 32 is nibble j % 2 of qs[32 (j / 2) ..].
fn q4_k(i: u32) -> f32 {
    let o = (i / 256u) * 144u;
    let e = i % 256u;
    let j = e / 32u;
    let l = e % 32u;
    let sm = scale_min_k4(o + 4u, j);
    let q = (byte_at(o + 16u + 32u * (j / 2u) + l) >> (4u * (j % 2u))) & 0xfu;
    let dl = f16_at(o) * f32(sm.x);
    let ml = f16_at(o + 2u) * f32(sm.y);
    return dl * f32(q) - ml;
}

// {d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]}: Q4_K's nibbles with bit
// j of qh[l] as bit 4.
fn q5_k(i: u32) -> f32 {
    let o = (i / 256u) * 176u;
    let e = i % 256u;
    let j = e / 32u;
    let l = e % 32u;
    let sm = scale_min_k4(o + 4u, j);
    let low = (byte_at(o + 48u + 32u * (j / 2u) + l) >> (4u * (j % 2u))) & 0xfu;
    let high = (byte_at(o + 16u + l) >> j) & 1u;
    let dl = f16_at(o) * f32(sm.x);
    let ml = f16_at(o + 2u) * f32(sm.y);
    return dl * f32(low | (high << 4u)) - ml;
}

// {ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16}: (d * sc) * (q - 32); element
// 128 g + 64 h + k takes nibble h of ql[64 g + k], and bits 2 s of qh[32 g + l] as bits 4, 5.
fn q6_k(i: u32) -> f32 {
    let o = (i / 256u) * 210u;
    let e = i % 256u;
    let g = e / 128u;
    let h = (e / 64u) % 2u;
    let k = e % 64u;
    let s = (e / 32u) % 4u;
    let l = e % 32u;
    let low = (byte_at(o + 64u * g + k) >> (4u * h)) & 0xfu;
    let high = (byte_at(o + 128u + 32u * g + l) >> (2u * s)) & 3u;
    let dl = f16_at(o + 208u) * f32(i8_at(o + 192u + e / 16u));
    return dl * f32(i32(low | (high << 4u)) - 32);
}

// ---- NF4 (nf4.rs): codes (element 2k in the high nibble of byte k), then one absmax code per
// 64-element block, one f32 scale per 256 blocks, one f32 offset; a value is
// NF4[code] * (dynamic[qabsmax] * scale + offset). ------------------------------------------

fn nf4(i: u32) -> f32 {
    let n = params.numel;
    let blocks = n / 64u;
    let groups = (blocks + 255u) / 256u;
    let b = i / 64u;
    let qabsmax = byte_at(n / 2u + b);
    let scale = f32_at(n / 2u + blocks + 4u * (b / 256u));
    let offset = f32_at(n / 2u + blocks + 4u * groups);
    let dynamic = bitcast<f32>(data[params.tables + 16u + qabsmax]);
    let absmax = fence(dynamic * scale) + offset;
    let code = (byte_at(i / 2u) >> (4u * (1u - (i % 2u)))) & 0xfu;
    return bitcast<f32>(data[params.tables + code]) * absmax;
}

// ---- entry points -------------------------------------------------------------------------

// Element i of the tensor in `format` (folded to one case once inlined).
fn value(format: u32, i: u32) -> f32 {
    switch (format) {
        case 0u: { return q4_0(i); }
        case 1u: { return q4_1(i); }
        case 2u: { return q5_0(i); }
        case 3u: { return q5_1(i); }
        case 4u: { return q8_0(i); }
        case 5u: { return q2_k(i); }
        case 6u: { return q3_k(i); }
        case 7u: { return q4_k(i); }
        case 8u: { return q5_k(i); }
        case 9u: { return q6_k(i); }
        default: { return nf4(i); }
    }
}

fn dequantize(format: u32, gid: vec3<u32>, nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * WG;
    if (t >= params.count) {
        return;
    }
    out[t] = value(format, params.first + t);
}

fn gather(format: u32, gid: vec3<u32>, nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * WG;
    if (t >= params.count) {
        return;
    }
    let i = t / params.width;
    let c = t - i * params.width;
    out[t] = value(format, rows[i] * params.cols + params.first + c);
}

var<workgroup> partial: array<f32, 64>;

fn matvec(format: u32, wid: vec3<u32>, nwg: vec3<u32>, t: u32) {
    let r = wid.x + wid.y * nwg.x;
    // `r` is uniform across the workgroup: every thread takes the same branches.
    let live = r < params.count;
    var acc = 0.0;
    if (live) {
        let base = r * params.cols;
        for (var c = t; c < params.cols; c = c + WG_ROW) {
            acc = acc + value(format, base + c) * x[c];
        }
    }
    partial[t] = acc;
    workgroupBarrier();
    for (var w = WG_ROW / 2u; w > 0u; w = w / 2u) {
        if (t < w) {
            partial[t] = partial[t] + partial[t + w];
        }
        workgroupBarrier();
    }
    if (live && t == 0u) {
        out[r] = partial[0];
    }
}

@compute @workgroup_size(256)
fn dequantize_q4_0(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    dequantize(Q4_0, gid, nwg);
}

@compute @workgroup_size(256)
fn dequantize_q4_1(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    dequantize(Q4_1, gid, nwg);
}

@compute @workgroup_size(256)
fn dequantize_q5_0(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    dequantize(Q5_0, gid, nwg);
}

@compute @workgroup_size(256)
fn dequantize_q5_1(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    dequantize(Q5_1, gid, nwg);
}

@compute @workgroup_size(256)
fn dequantize_q8_0(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    dequantize(Q8_0, gid, nwg);
}

@compute @workgroup_size(256)
fn dequantize_q2_k(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    dequantize(Q2_K, gid, nwg);
}

@compute @workgroup_size(256)
fn dequantize_q3_k(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    dequantize(Q3_K, gid, nwg);
}

@compute @workgroup_size(256)
fn dequantize_q4_k(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    dequantize(Q4_K, gid, nwg);
}

@compute @workgroup_size(256)
fn dequantize_q5_k(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    dequantize(Q5_K, gid, nwg);
}

@compute @workgroup_size(256)
fn dequantize_q6_k(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    dequantize(Q6_K, gid, nwg);
}

@compute @workgroup_size(256)
fn dequantize_nf4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    dequantize(NF4, gid, nwg);
}

@compute @workgroup_size(256)
fn gather_q4_0(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    gather(Q4_0, gid, nwg);
}

@compute @workgroup_size(256)
fn gather_q4_1(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    gather(Q4_1, gid, nwg);
}

@compute @workgroup_size(256)
fn gather_q5_0(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    gather(Q5_0, gid, nwg);
}

@compute @workgroup_size(256)
fn gather_q5_1(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    gather(Q5_1, gid, nwg);
}

@compute @workgroup_size(256)
fn gather_q8_0(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    gather(Q8_0, gid, nwg);
}

@compute @workgroup_size(256)
fn gather_q2_k(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    gather(Q2_K, gid, nwg);
}

@compute @workgroup_size(256)
fn gather_q3_k(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    gather(Q3_K, gid, nwg);
}

@compute @workgroup_size(256)
fn gather_q4_k(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    gather(Q4_K, gid, nwg);
}

@compute @workgroup_size(256)
fn gather_q5_k(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    gather(Q5_K, gid, nwg);
}

@compute @workgroup_size(256)
fn gather_q6_k(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    gather(Q6_K, gid, nwg);
}

@compute @workgroup_size(256)
fn gather_nf4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    gather(NF4, gid, nwg);
}

@compute @workgroup_size(64)
fn matvec_q4_0(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    matvec(Q4_0, wid, nwg, t);
}

@compute @workgroup_size(64)
fn matvec_q4_1(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    matvec(Q4_1, wid, nwg, t);
}

@compute @workgroup_size(64)
fn matvec_q5_0(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    matvec(Q5_0, wid, nwg, t);
}

@compute @workgroup_size(64)
fn matvec_q5_1(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    matvec(Q5_1, wid, nwg, t);
}

@compute @workgroup_size(64)
fn matvec_q8_0(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    matvec(Q8_0, wid, nwg, t);
}

@compute @workgroup_size(64)
fn matvec_q2_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    matvec(Q2_K, wid, nwg, t);
}

@compute @workgroup_size(64)
fn matvec_q3_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    matvec(Q3_K, wid, nwg, t);
}

@compute @workgroup_size(64)
fn matvec_q4_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    matvec(Q4_K, wid, nwg, t);
}

@compute @workgroup_size(64)
fn matvec_q5_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    matvec(Q5_K, wid, nwg, t);
}

@compute @workgroup_size(64)
fn matvec_q6_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    matvec(Q6_K, wid, nwg, t);
}

@compute @workgroup_size(64)
fn matvec_nf4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    matvec(NF4, wid, nwg, t);
}
