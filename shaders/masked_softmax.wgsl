// Causal (masked, scaled) row softmax and the softmax VJP, the GPU twins of riftco-kernels'
// attention::causal_softmax_rows and softmax::softmax_rows_backward. Rows are [rows, cols];
// for attention, rows = batch * n_heads * seq_q, cols = seq_k, and row r is query i = r % seq_q.
//   causal_softmax_rows: y[r, :n] = softmax(scale * x[r, :n]), y[r, n:] = 0, where
//       n = seq_k when not causal, else the keys query i may attend: j <= i + seq_k - seq_q
//       (queries are the last seq_q positions); a row with n = 0 is all 0.
//   softmax_backward: dx = scale * (y * (dy - sum_c dy[c] y[c])) (scale = 1 for plain softmax;
//       masked entries have y = 0 and get dx = 0).
// One workgroup per row (grid x = row, y = row / 65535 overflow); thread t walks columns t,
// t + 256, ... in order and the 256 partials are combined in a fixed tree (deterministic).

struct Params {
    rows: u32,
    cols: u32,
    seq_q: u32,
    causal: u32,
    scale: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> dy: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

const WG: u32 = 256u;
var<workgroup> scratch: array<f32, 256>;

fn neg_inf() -> f32 {
    return bitcast<f32>(0xff800000u);
}

// Number of keys row r may attend.
fn allowed(r: u32) -> u32 {
    if (params.causal == 0u) {
        return params.cols;
    }
    let i = r % params.seq_q;
    let reach = i + 1u + params.cols;
    if (reach <= params.seq_q) {
        return 0u;
    }
    return min(reach - params.seq_q, params.cols);
}

fn tree_max(t: u32, v: f32) -> f32 {
    scratch[t] = v;
    workgroupBarrier();
    for (var w = WG / 2u; w > 0u; w = w / 2u) {
        if (t < w) {
            scratch[t] = max(scratch[t], scratch[t + w]);
        }
        workgroupBarrier();
    }
    let m = scratch[0];
    workgroupBarrier();
    return m;
}

fn tree_sum(t: u32, v: f32) -> f32 {
    scratch[t] = v;
    workgroupBarrier();
    for (var w = WG / 2u; w > 0u; w = w / 2u) {
        if (t < w) {
            scratch[t] = scratch[t] + scratch[t + w];
        }
        workgroupBarrier();
    }
    let s = scratch[0];
    workgroupBarrier();
    return s;
}

@compute @workgroup_size(256)
fn causal_softmax_rows(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let r = wid.x + wid.y * nwg.x;
    // `r` is uniform across the workgroup: every thread takes the same branches.
    let live = r < params.rows;
    let base = r * params.cols;
    var n = 0u;
    if (live) {
        n = allowed(r);
    }
    var m = neg_inf();
    for (var c = t; c < n; c = c + WG) {
        m = max(m, params.scale * x[base + c]);
    }
    let row_max = tree_max(t, m);
    var s = 0.0;
    for (var c = t; c < n; c = c + WG) {
        s = s + exp(params.scale * x[base + c] - row_max);
    }
    let inv = 1.0 / tree_sum(t, s);
    if (!live) {
        return;
    }
    for (var c = t; c < params.cols; c = c + WG) {
        if (c < n) {
            out[base + c] = exp(params.scale * x[base + c] - row_max) * inv;
        } else {
            out[base + c] = 0.0;
        }
    }
}

// x holds y (the softmax output).
@compute @workgroup_size(256)
fn softmax_backward(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let r = wid.x + wid.y * nwg.x;
    let live = r < params.rows;
    let base = r * params.cols;
    var acc = 0.0;
    if (live) {
        for (var c = t; c < params.cols; c = c + WG) {
            acc = acc + dy[base + c] * x[base + c];
        }
    }
    let dot = tree_sum(t, acc);
    if (!live) {
        return;
    }
    for (var c = t; c < params.cols; c = c + WG) {
        out[base + c] = params.scale * (x[base + c] * (dy[base + c] - dot));
    }
}
