// Index-mapping kernels of the GPU backend on f32 storage buffers, the GPU twins of the CPU
// backend's fill, add_assign / axpy, broadcasting `binary` and the strided
// gather / scatter of riftco-kernels (crates/riftco-gpu/src/kernels/strided.rs sets them up):
//   fill:        dst[i] = alpha
//   add_assign:  dst[i] = dst[i] + a[i]
//   axpy:        dst[i] = dst[i] + alpha * a[i]
//   binary:      dst[i] = a[ia(i)] op b[ib(i)]       (NumPy broadcasting through 0 strides)
//   gather:      dst[i] = a[offset + sum_j idx_j(i) * stride_j]   (signed strides)
//   scatter:     dst[offset + sum_j idx_j(i) * stride_j] (+)= a[i]
// `shape_meta` holds the shapes and strides (u32 words; signed strides as i32 bit patterns), laid out
// per entry as documented there. One invocation per output element on a 2-D grid (x up to 65535
// workgroups), bounds-checked against `n`; `scatter` with `flags & 2` runs in one invocation, in
// the view's row-major order (a view that addresses an element twice).

struct Params {
    n: u32,
    alpha: f32,
    op: u32,
    rank: u32,
    // gather / scatter: the view's offset; reduce_axes: the number of reduced elements per
    // output element.
    extra: u32,
    // scatter: bit 0 accumulate, bit 1 serial.
    flags: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read> shape_meta: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;

const WG: u32 = 256u;

fn flat_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

fn nan_f32() -> f32 {
    return bitcast<f32>(0x7fc00000u);
}

@compute @workgroup_size(256)
fn fill(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    dst[i] = params.alpha;
}

@compute @workgroup_size(256)
fn add_assign(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    dst[i] = dst[i] + a[i];
}

@compute @workgroup_size(256)
fn axpy(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    dst[i] = dst[i] + params.alpha * a[i];
}

fn flag(c: bool) -> f32 {
    return select(0.0, 1.0, c);
}

// The codes of riftco-kernels' BinaryOp (crates/riftco-gpu/src/kernels/strided.rs).
fn binary_op(op: u32, x: f32, y: f32) -> f32 {
    switch op {
        case 0u: { return x + y; }
        case 1u: { return x - y; }
        case 2u: { return x * y; }
        case 3u: { return x / y; }
        case 4u: { return flag(x < y); }
        case 5u: { return flag(x <= y); }
        case 6u: { return flag(x > y); }
        case 7u: { return flag(x >= y); }
        case 8u: { return flag(x == y); }
        case 9u: { return flag(x != y); }
        default: { return nan_f32(); }
    }
}

// shape_meta: out_dims[rank], a_strides[rank], b_strides[rank] (0 on broadcast axes).
@compute @workgroup_size(256)
fn binary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    let rank = params.rank;
    var rem = i;
    var ia = 0u;
    var ib = 0u;
    for (var k = rank; k > 0u; k = k - 1u) {
        let axis = k - 1u;
        let d = shape_meta[axis];
        let idx = rem % d;
        rem = rem / d;
        ia = ia + idx * shape_meta[rank + axis];
        ib = ib + idx * shape_meta[2u * rank + axis];
    }
    dst[i] = binary_op(params.op, a[ia], b[ib]);
}

// The buffer index of element `i` of the view: shape_meta = dims[rank], strides[rank] (i32 bits).
fn view_index(i: u32) -> u32 {
    let rank = params.rank;
    var rem = i;
    var pos = i32(params.extra);
    for (var k = rank; k > 0u; k = k - 1u) {
        let axis = k - 1u;
        let d = shape_meta[axis];
        pos = pos + i32(rem % d) * bitcast<i32>(shape_meta[rank + axis]);
        rem = rem / d;
    }
    return u32(pos);
}

@compute @workgroup_size(256)
fn gather(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    dst[i] = a[view_index(i)];
}

fn scatter_one(i: u32) {
    let p = view_index(i);
    if ((params.flags & 1u) != 0u) {
        dst[p] = dst[p] + a[i];
    } else {
        dst[p] = a[i];
    }
}

@compute @workgroup_size(256)
fn scatter(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat_index(gid, nwg);
    if ((params.flags & 2u) != 0u) {
        if (i == 0u) {
            for (var j = 0u; j < params.n; j = j + 1u) {
                scatter_one(j);
            }
        }
        return;
    }
    if (i >= params.n) {
        return;
    }
    scatter_one(i);
}
