// RMSNorm over the last axis of x: [rows, cols] (Zhang & Sennrich 2019, eq. 4), the GPU twin of
// riftco-kernels' norm::{rms_norm, rms_norm_backward}:
//   rms_norm:          rstd[r] = 1 / sqrt(mean_c x[r, c]^2 + eps), y = x * rstd[r] * weight
//   rms_norm_backward: dx = rstd (w dy) - x rstd^3 / cols * sum_c x w dy
//   rms_norm_dweight:  dweight[c] = sum_r dy[r, c] x[r, c] rstd[r], rows summed in blocks of
//                      `block_rows` (partials added in block order, as the CPU kernel does)
// The two row kernels run one workgroup per row (grid x = row, y = row / 65535 overflow); thread
// t walks columns t, t + 256, ... in order and the 256 partials are combined in a fixed tree, so
// results are deterministic. rms_norm_dweight runs one invocation per column.

struct Params {
    rows: u32,
    cols: u32,
    eps: f32,
    block_rows: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> weight: array<f32>;
@group(0) @binding(2) var<storage, read> rstd_in: array<f32>;
@group(0) @binding(3) var<storage, read> dy: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<storage, read_write> rstd_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> dx: array<f32>;
@group(0) @binding(7) var<storage, read_write> dweight: array<f32>;
@group(0) @binding(8) var<uniform> params: Params;

const WG: u32 = 256u;
var<workgroup> scratch: array<f32, 256>;

// Tree sum of the workgroup's `v` (called in uniform control flow by every thread).
fn workgroup_sum(t: u32, v: f32) -> f32 {
    scratch[t] = v;
    workgroupBarrier();
    for (var w = WG / 2u; w > 0u; w = w / 2u) {
        if (t < w) {
            scratch[t] = scratch[t] + scratch[t + w];
        }
        workgroupBarrier();
    }
    let total = scratch[0];
    workgroupBarrier();
    return total;
}

@compute @workgroup_size(256)
fn rms_norm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let r = wid.x + wid.y * nwg.x;
    // `r` is uniform across the workgroup: every thread takes the same branches.
    let live = r < params.rows;
    let base = r * params.cols;
    var ss = 0.0;
    if (live) {
        for (var c = t; c < params.cols; c = c + WG) {
            let v = x[base + c];
            ss = ss + v * v;
        }
    }
    let total = workgroup_sum(t, ss);
    if (!live) {
        return;
    }
    let inv = 1.0 / sqrt(total / f32(params.cols) + params.eps);
    if (t == 0u) {
        rstd_out[r] = inv;
    }
    for (var c = t; c < params.cols; c = c + WG) {
        y[base + c] = x[base + c] * inv * weight[c];
    }
}

@compute @workgroup_size(256)
fn rms_norm_backward(
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
            acc = acc + x[base + c] * (dy[base + c] * weight[c]);
        }
    }
    let d = workgroup_sum(t, acc);
    if (!live) {
        return;
    }
    let inv = rstd_in[r];
    let coef = d * inv * inv * inv / f32(params.cols);
    for (var c = t; c < params.cols; c = c + WG) {
        dx[base + c] = inv * (weight[c] * dy[base + c]) - x[base + c] * coef;
    }
}

@compute @workgroup_size(256)
fn rms_norm_dweight(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let c = gid.x + gid.y * nwg.x * WG;
    if (c >= params.cols) {
        return;
    }
    var total = 0.0;
    for (var r0 = 0u; r0 < params.rows; r0 = r0 + params.block_rows) {
        let r1 = min(r0 + params.block_rows, params.rows);
        var partial = 0.0;
        for (var r = r0; r < r1; r = r + 1u) {
            let i = r * params.cols + c;
            partial = partial + dy[i] * x[i] * rstd_in[r];
        }
        total = total + partial;
    }
    dweight[c] = total;
}
