// Deterministic row sums: x is [rows, cols] row-major, out is [rows, blocks] with
// blocks = ceil(cols / 512); out[r, j] = the sum of x[r, 512 j .. 512 j + 512] in a fixed tree
// order. Thread t loads elements 512 j + t and 512 j + t + 256 (0 past the row's end: bounds
// check) and adds them; the 256 partial sums are then halved pairwise (s[t] += s[t + w] for
// w = 128, 64, ..., 1). The host repeats the pass on `out` until one column is left, so the
// result depends only on `cols`, never on scheduling (no atomics on floats).
// Grid: x = block index j, y = row r (the host keeps rows within the 65535 grid limit).

struct Params {
    rows: u32,
    cols: u32,
    blocks: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> params: Params;

const WG: u32 = 256u;
var<workgroup> partial: array<f32, 256>;

@compute @workgroup_size(256)
fn sum_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let j = wid.x;
    let r = wid.y;
    var acc = 0.0;
    if (r < params.rows && j < params.blocks) {
        let base = r * params.cols;
        let c0 = j * 2u * WG + t;
        let c1 = c0 + WG;
        var v0 = 0.0;
        var v1 = 0.0;
        if (c0 < params.cols) {
            v0 = x[base + c0];
        }
        if (c1 < params.cols) {
            v1 = x[base + c1];
        }
        acc = v0 + v1;
    }
    partial[t] = acc;
    workgroupBarrier();
    for (var w = WG / 2u; w > 0u; w = w / 2u) {
        if (t < w) {
            partial[t] = partial[t] + partial[t + w];
        }
        workgroupBarrier();
    }
    if (t == 0u && r < params.rows && j < params.blocks) {
        out[r * params.blocks + j] = partial[0];
    }
}
