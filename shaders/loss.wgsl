// Softmax cross-entropy with logits, the GPU twin of riftco-kernels' loss::{cross_entropy,
// cross_entropy_backward}: logits [rows, vocab], targets [rows] (u32, checked < vocab on the
// host), loss_r = lse_r - logits[r, t_r] with lse_r = max_r + log sum_c exp(logits[r, c] - max_r)
// (-inf for a row that is all -inf).
//   cross_entropy_rows: lse[r] and the row losses, one workgroup per row (thread t walks
//       columns t, t + 256, ...; the 256 partials combine in a fixed tree: deterministic).
//   cross_entropy_backward: dlogits[r, c] = exp(logits[r, c] - lse[r]) * scale
//       - (c == t_r ? scale : 0), scale = params.scale * grad_in[0] (the host's grad / rows
//       times 1, or the host's 1 / rows times the upstream scalar on the device); one
//       invocation per element.

struct Params {
    rows: u32,
    vocab: u32,
    scale: f32,
    _pad0: u32,
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read> targets: array<u32>;
@group(0) @binding(2) var<storage, read> lse_in: array<f32>;
@group(0) @binding(4) var<storage, read_write> lse_out: array<f32>;
@group(0) @binding(5) var<storage, read_write> row_loss_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;
@group(0) @binding(7) var<uniform> params: Params;
@group(0) @binding(8) var<storage, read> grad_in: array<f32>;

const WG: u32 = 256u;
var<workgroup> scratch: array<f32, 256>;

fn neg_inf() -> f32 {
    return bitcast<f32>(0xff800000u);
}

@compute @workgroup_size(256)
fn cross_entropy_rows(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let r = wid.x + wid.y * nwg.x;
    // `r` is uniform across the workgroup: every thread takes the same branches.
    let live = r < params.rows;
    let base = r * params.vocab;
    var m = neg_inf();
    if (live) {
        for (var c = t; c < params.vocab; c = c + WG) {
            m = max(m, logits[base + c]);
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
    if (live && row_max != neg_inf()) {
        for (var c = t; c < params.vocab; c = c + WG) {
            s = s + exp(logits[base + c] - row_max);
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
    if (!live || t != 0u) {
        return;
    }
    var lse = neg_inf();
    if (row_max != neg_inf()) {
        lse = row_max + log(scratch[0]);
    }
    lse_out[r] = lse;
    row_loss_out[r] = lse - logits[base + targets[r]];
}

@compute @workgroup_size(256)
fn cross_entropy_backward(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= params.rows * params.vocab) {
        return;
    }
    let r = e / params.vocab;
    let c = e % params.vocab;
    let scale = params.scale * grad_in[0];
    var d = exp(logits[e] - lse_in[r]) * scale;
    if (c == targets[r]) {
        d = d - scale;
    }
    out[e] = d;
}
