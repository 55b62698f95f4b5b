// Tiled matrix product C[m, n] (+)= op(A)[m, k] . op(B)[k, n] for `batch` independent products
// (riftco-kernels' MatmulSpec / batched_matmul): op(A) = A stored [m, k] row-major, or A^T with
// A stored [k, m] (trans_a = 1); op(B) = B stored [k, n], or B^T with B stored [n, k]
// (trans_b = 1); accumulate = 1 adds into C. Batch z uses A at z*m*k, B at z*k*n, C at z*m*n.
//
// Workgroup 16x16 computes a 16x16 tile of C; k is walked in 16-wide steps through workgroup
// memory, each product summed in increasing k (fixed order: deterministic). Loads past m, n or
// k read 0 and stores past m or n are skipped (bounds checks: any size works).
// Grid: x = ceil(n/16), y = ceil(m/16), z = batch.

struct Params {
    m: u32,
    k: u32,
    n: u32,
    trans_a: u32,
    trans_b: u32,
    accumulate: u32,
    batch: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

const TILE: u32 = 16u;
var<workgroup> tile_a: array<array<f32, 16>, 16>;
var<workgroup> tile_b: array<array<f32, 16>, 16>;

fn load_a(base: u32, i: u32, kk: u32) -> f32 {
    if (i >= params.m || kk >= params.k) {
        return 0.0;
    }
    if (params.trans_a != 0u) {
        return a[base + kk * params.m + i];
    }
    return a[base + i * params.k + kk];
}

fn load_b(base: u32, kk: u32, j: u32) -> f32 {
    if (kk >= params.k || j >= params.n) {
        return 0.0;
    }
    if (params.trans_b != 0u) {
        return b[base + j * params.k + kk];
    }
    return b[base + kk * params.n + j];
}

@compute @workgroup_size(16, 16)
fn matmul(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    let z = wid.z;
    let row = wid.y * TILE + lid.y;
    let col = wid.x * TILE + lid.x;
    let a_base = z * params.m * params.k;
    let b_base = z * params.k * params.n;
    let c_base = z * params.m * params.n;

    var acc = 0.0;
    let steps = (params.k + TILE - 1u) / TILE;
    for (var s = 0u; s < steps; s = s + 1u) {
        let k0 = s * TILE;
        tile_a[lid.y][lid.x] = load_a(a_base, row, k0 + lid.x);
        tile_b[lid.y][lid.x] = load_b(b_base, k0 + lid.y, col);
        workgroupBarrier();
        for (var q = 0u; q < TILE; q = q + 1u) {
            acc = acc + tile_a[lid.y][q] * tile_b[q][lid.x];
        }
        workgroupBarrier();
    }
    if (row < params.m && col < params.n && z < params.batch) {
        let idx = c_base + row * params.n + col;
        if (params.accumulate != 0u) {
            c[idx] = c[idx] + acc;
        } else {
            c[idx] = acc;
        }
    }
}
