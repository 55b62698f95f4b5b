// Row softmax: x and y are [rows, cols] row-major; y[r, :] = exp(x[r, :] - m) / s with
// m = max over the row and s = sum of exp(x[r, c] - m) (the max-subtracted form of
// riftco-kernels' softmax_rows). One workgroup per row (grid x = row, y = row / 65535 overflow);
// thread t walks columns t, t + 256, ... in order, then the 256 partials are combined in a fixed
// tree order, so the result is deterministic. Columns past `cols` are never touched.

struct Params {
    rows: u32,
    cols: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> params: Params;

const WG: u32 = 256u;
var<workgroup> scratch: array<f32, 256>;

fn neg_inf() -> f32 {
    return bitcast<f32>(0xff800000u);
}

@compute @workgroup_size(256)
fn softmax_rows(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let r = wid.x + wid.y * nwg.x;
    // `r` is uniform across the workgroup, so every thread takes the same branch and the
    // barriers below stay in uniform control flow.
    let live = r < params.rows;
    let base = r * params.cols;

    var m = neg_inf();
    if (live) {
        for (var c = t; c < params.cols; c = c + WG) {
            m = max(m, x[base + c]);
        }
    }
    scratch[t] = m;
    workgroupBarrier();
    for (var w = WG / 2u; w > 0u; w = w / 2u) {
        if (t < w) {
            scratch[t] = max(scratch[t], scratch[t + w]);
        }
        workgroupBarrier();
    }
    let row_max = scratch[0];
    workgroupBarrier();

    var s = 0.0;
    if (live) {
        for (var c = t; c < params.cols; c = c + WG) {
            s = s + exp(x[base + c] - row_max);
        }
    }
    scratch[t] = s;
    workgroupBarrier();
    for (var w = WG / 2u; w > 0u; w = w / 2u) {
        if (t < w) {
            scratch[t] = scratch[t] + scratch[t + w];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / scratch[0];

    if (live) {
        for (var c = t; c < params.cols; c = c + WG) {
            y[base + c] = exp(x[base + c] - row_max) * inv;
        }
    }
}
