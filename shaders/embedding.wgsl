// Embedding gather and its deterministic VJP, the GPU twins of riftco-kernels'
// embedding::{embedding, embedding_backward}. table and dtable are [vocab, d]; ids, dy and out
// are [n_ids] and [n_ids, d].
//   embedding:          out[i, c] = table[ids[i], c], one invocation per output element.
//   embedding_backward: dtable[v, c] = sum over the positions i with ids[i] = v, in increasing
//       i, of dy[i, c]. The host groups the positions by id (a stable counting sort:
//       `positions[offsets[v] .. offsets[v + 1]]` are the i with ids[i] = v, increasing), and
//       one invocation per (v, c) adds its own positions in that order: no float atomics, the
//       CPU kernel's order, bitwise the same on every run.
// Both run on a 2-D grid (x up to 65535 workgroups); invocations past the end return.

struct Params {
    n: u32,
    d: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> table: array<f32>;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> dy: array<f32>;
@group(0) @binding(3) var<storage, read> offsets: array<u32>;
@group(0) @binding(4) var<storage, read> positions: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<uniform> params: Params;

const WG: u32 = 256u;

// n = n_ids * d.
@compute @workgroup_size(256)
fn embedding(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= params.n) {
        return;
    }
    let i = e / params.d;
    let c = e % params.d;
    out[e] = table[ids[i] * params.d + c];
}

// n = vocab * d.
@compute @workgroup_size(256)
fn embedding_backward(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= params.n) {
        return;
    }
    let v = e / params.d;
    let c = e % params.d;
    var acc = 0.0;
    for (var k = offsets[v]; k < offsets[v + 1u]; k = k + 1u) {
        acc = acc + dy[positions[k] * params.d + c];
    }
    out[e] = acc;
}
