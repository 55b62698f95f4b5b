// Scaled dot-product attention without the [seq_q, seq_k] score matrix, in the algorithm of
// FlashAttention-2 (Dao 2023, Algorithms 1 and 2) with key tiles of one key: the forward keeps
// a running max m and sum l per query row (online softmax) and stores only the output and the
// row logsumexp lse = m + log l; the backward rematerialises P = exp(scale q k^T - lse) from Q, K
// and lse, with D = rowsum(dO * O). The GPU twin of riftco-kernels' attention::
// flash_attention_{forward,backward} (layout [batch, heads, seq, d_head]), with grouped-query
// attention: q, out, dout, dq have n_heads heads, k, v, dk, dv have n_kv_heads, and query head h
// reads KV head h / (n_heads / n_kv_heads).
// Causal mask: query i may attend key j iff j <= i + (seq_k - seq_q); a query with no allowed
// key gets output 0, lse -inf and zero gradients.
// Parallelism and determinism (no float atomics): flash_forward, flash_delta and flash_dq run one
// invocation per query row; flash_dkv one invocation per (batch, KV head, key), which walks the
// group's query heads in increasing order and, inside, the queries in increasing order, so dK and
// dV are summed over the group in a fixed order. d_head is at most MAX_D (checked on the host).
// Dropout on the attention probabilities (Dao et al. 2022, FlashAttention, Appendix B), when
// params.dropout = 1: out = (P * Z) V with Z = M / (1 - p), M the keep mask of riftco-kernels'
// philox::DropoutMask over the index space [batch, n_heads, seq_q, seq_k] (element
// e = row * seq_k + j, row = (b * n_heads + h) * seq_q + i), regenerated in every pass, never
// stored; lse is that of P without dropout. Backward: dV = (P * Z)^T dO, dP = (dO V^T) * Z,
// dS = P * (dP - D) with D = rowsum(dO * O) of the dropped output. With params.dropout = 0,
// Z = 1 and every product by it is exact.

struct Params {
    batch: u32,
    n_heads: u32,
    n_kv_heads: u32,
    seq_q: u32,
    seq_k: u32,
    d_head: u32,
    causal: u32,
    scale: f32,
    dropout: u32,
    p: f32,
    z_scale: f32,
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

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read> o_in: array<f32>;
@group(0) @binding(4) var<storage, read> lse_in: array<f32>;
@group(0) @binding(5) var<storage, read> dout: array<f32>;
@group(0) @binding(6) var<storage, read> delta_in: array<f32>;
@group(0) @binding(7) var<storage, read_write> out: array<f32>;
@group(0) @binding(8) var<storage, read_write> lse_out: array<f32>;
@group(0) @binding(9) var<storage, read_write> delta_out: array<f32>;
@group(0) @binding(10) var<storage, read_write> dq: array<f32>;
@group(0) @binding(11) var<storage, read_write> dk: array<f32>;
@group(0) @binding(12) var<storage, read_write> dv: array<f32>;
@group(0) @binding(13) var<uniform> params: Params;

const WG: u32 = 64u;
const MAX_D: u32 = 128u;

fn neg_inf() -> f32 {
    return bitcast<f32>(0xff800000u);
}

fn flat_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

// Z of probability (row, j): 1 without dropout, else z_scale where kept and 0 where dropped.
// philox4x32_10 is philox.wgsl's, prepended to this file when the pipeline is built.
fn z(row: u32, j: u32) -> f32 {
    if (params.dropout == 0u) {
        return 1.0;
    }
    let e = row * params.seq_k + j;
    let lo = params.offset_lo + e / 4u;
    let hi = params.offset_hi + select(0u, 1u, lo < params.offset_lo);
    let block = philox4x32_10(
        vec4<u32>(lo, hi, params.stream0, params.stream1),
        vec2<u32>(params.key0, params.key1),
    );
    let keep = f32(block[e % 4u] >> 8u) * (1.0 / 16777216.0) >= params.p;
    return select(0.0, params.z_scale, keep);
}

// Keys query i may attend.
fn allowed(i: u32) -> u32 {
    if (params.causal == 0u) {
        return params.seq_k;
    }
    let reach = i + 1u + params.seq_k;
    if (reach <= params.seq_q) {
        return 0u;
    }
    return min(reach - params.seq_q, params.seq_k);
}

// First element of KV row j of the KV head that query head bh (= b * n_heads + h) reads.
fn kv_row(bh: u32, j: u32) -> u32 {
    let b = bh / params.n_heads;
    let h = bh % params.n_heads;
    let kvh = h / (params.n_heads / params.n_kv_heads);
    return ((b * params.n_kv_heads + kvh) * params.seq_k + j) * params.d_head;
}

// scale * q[qi, :] . k[kj, :] (qi, kj: first elements of the rows).
fn score(qi: u32, kj: u32) -> f32 {
    var s = 0.0;
    for (var c = 0u; c < params.d_head; c = c + 1u) {
        s = s + q[qi + c] * k[kj + c];
    }
    return params.scale * s;
}

@compute @workgroup_size(64)
fn flash_forward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = flat_index(gid, nwg);
    if (row >= params.batch * params.n_heads * params.seq_q) {
        return;
    }
    let d = params.d_head;
    let bh = row / params.seq_q;
    let qi = row * d;
    let n = allowed(row % params.seq_q);
    var acc: array<f32, MAX_D>;
    for (var c = 0u; c < d; c = c + 1u) {
        acc[c] = 0.0;
    }
    var m = neg_inf();
    var l = 0.0;
    for (var j = 0u; j < n; j = j + 1u) {
        let kj = kv_row(bh, j);
        let s = score(qi, kj);
        let m_new = max(m, s);
        let alpha = exp(m - m_new);
        let p = exp(s - m_new);
        l = l * alpha + p;
        let pz = p * z(row, j);
        for (var c = 0u; c < d; c = c + 1u) {
            acc[c] = acc[c] * alpha + pz * v[kj + c];
        }
        m = m_new;
    }
    if (n == 0u) {
        for (var c = 0u; c < d; c = c + 1u) {
            out[qi + c] = 0.0;
        }
        lse_out[row] = neg_inf();
        return;
    }
    let inv = 1.0 / l;
    for (var c = 0u; c < d; c = c + 1u) {
        out[qi + c] = acc[c] * inv;
    }
    lse_out[row] = m + log(l);
}

// delta[row] = sum_c dout[row, c] * out[row, c].
@compute @workgroup_size(64)
fn flash_delta(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = flat_index(gid, nwg);
    if (row >= params.batch * params.n_heads * params.seq_q) {
        return;
    }
    let qi = row * params.d_head;
    var s = 0.0;
    for (var c = 0u; c < params.d_head; c = c + 1u) {
        s = s + dout[qi + c] * o_in[qi + c];
    }
    delta_out[row] = s;
}

// dq[row] = scale * sum_j P_ij (dO_i . v_j - D_i) k_j.
@compute @workgroup_size(64)
fn flash_dq(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = flat_index(gid, nwg);
    if (row >= params.batch * params.n_heads * params.seq_q) {
        return;
    }
    let d = params.d_head;
    let bh = row / params.seq_q;
    let qi = row * d;
    let n = allowed(row % params.seq_q);
    var acc: array<f32, MAX_D>;
    for (var c = 0u; c < d; c = c + 1u) {
        acc[c] = 0.0;
    }
    let lse = lse_in[row];
    let delta = delta_in[row];
    for (var j = 0u; j < n; j = j + 1u) {
        let kj = kv_row(bh, j);
        let p = exp(score(qi, kj) - lse);
        var dp = 0.0;
        for (var c = 0u; c < d; c = c + 1u) {
            dp = dp + dout[qi + c] * v[kj + c];
        }
        let ds = p * (dp * z(row, j) - delta);
        for (var c = 0u; c < d; c = c + 1u) {
            acc[c] = acc[c] + ds * k[kj + c];
        }
    }
    for (var c = 0u; c < d; c = c + 1u) {
        dq[qi + c] = params.scale * acc[c];
    }
}

// One KV row (b, kvh, j): dv = sum over the group's heads and queries of P_ij dO_i,
// dk = scale * sum of P_ij (dO_i . v_j - D_i) q_i, heads then queries in increasing order.
@compute @workgroup_size(64)
fn flash_dkv(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let kv = flat_index(gid, nwg);
    if (kv >= params.batch * params.n_kv_heads * params.seq_k) {
        return;
    }
    let d = params.d_head;
    let j = kv % params.seq_k;
    let bkv = kv / params.seq_k;
    let b = bkv / params.n_kv_heads;
    let kvh = bkv % params.n_kv_heads;
    let group = params.n_heads / params.n_kv_heads;
    let kj = kv * d;
    var acc_k: array<f32, MAX_D>;
    var acc_v: array<f32, MAX_D>;
    for (var c = 0u; c < d; c = c + 1u) {
        acc_k[c] = 0.0;
        acc_v[c] = 0.0;
    }
    for (var g = 0u; g < group; g = g + 1u) {
        let bh = b * params.n_heads + kvh * group + g;
        for (var i = 0u; i < params.seq_q; i = i + 1u) {
            if (j >= allowed(i)) {
                continue;
            }
            let row = bh * params.seq_q + i;
            let qi = row * d;
            let p = exp(score(qi, kj) - lse_in[row]);
            var dp = 0.0;
            for (var c = 0u; c < d; c = c + 1u) {
                dp = dp + dout[qi + c] * v[kj + c];
            }
            let zij = z(row, j);
            let ds = p * (dp * zij - delta_in[row]);
            let pz = p * zij;
            for (var c = 0u; c < d; c = c + 1u) {
                acc_v[c] = acc_v[c] + pz * dout[qi + c];
                acc_k[c] = acc_k[c] + ds * q[qi + c];
            }
        }
    }
    for (var c = 0u; c < d; c = c + 1u) {
        dk[kj + c] = params.scale * acc_k[c];
        dv[kj + c] = acc_v[c];
    }
}
