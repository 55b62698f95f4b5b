// Deterministic row reductions: x is [rows, cols] row-major, out is [rows, blocks] with
// blocks = ceil(cols / 512); out[r, j] = the sum (op 0) or the max (op 1; NaN if any value is
// NaN) of x[r, 512 j .. 512 j + 512] in a fixed tree order. Thread t loads elements
// 512 j + t and 512 j + t + 256 (the identity past the row's end: bounds check) and combines
// them; the 256 partials are then halved pairwise (s[t] = s[t] op s[t + w] for
// w = 128, 64, ..., 1). The host repeats the pass on `out` until one column is left, so the
// result depends only on `cols`, never on scheduling (no atomics on floats), and no
// invocation loops more than 8 times (some drivers, llvmpipe among them, cut long loops).
// Grid: x = block index j (<= 65535), row r = y + z * num_workgroups.y (rows beyond 65535
// spread over z).

struct Params {
    rows: u32,
    cols: u32,
    blocks: u32,
    op: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> params: Params;

const WG: u32 = 256u;
var<workgroup> partial: array<f32, 256>;

fn is_nan(v: f32) -> bool {
    // Through the bits: a compiler may assume `v != v` is false.
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

fn identity() -> f32 {
    if (params.op == 1u) {
        return bitcast<f32>(0xff800000u);
    }
    return 0.0;
}

fn combine(a: f32, b: f32) -> f32 {
    if (params.op == 0u) {
        return a + b;
    }
    if (is_nan(a) || is_nan(b)) {
        return bitcast<f32>(0x7fc00000u);
    }
    return max(a, b);
}

@compute @workgroup_size(256)
fn sum_rows(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let j = wid.x;
    let r = wid.y + wid.z * nwg.y;
    let live = r < params.rows && j < params.blocks;
    var acc = identity();
    if (live) {
        let base = r * params.cols;
        let c0 = j * 2u * WG + t;
        let c1 = c0 + WG;
        var v0 = identity();
        var v1 = identity();
        if (c0 < params.cols) {
            v0 = x[base + c0];
        }
        if (c1 < params.cols) {
            v1 = x[base + c1];
        }
        acc = combine(v0, v1);
    }
    partial[t] = acc;
    workgroupBarrier();
    for (var w = WG / 2u; w > 0u; w = w / 2u) {
        if (t < w) {
            partial[t] = combine(partial[t], partial[t + w]);
        }
        workgroupBarrier();
    }
    if (t == 0u && live) {
        out[r * params.blocks + j] = partial[0];
    }
}
