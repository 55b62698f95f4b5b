//! Layout changes between `[batch, seq, heads, d_head]` and `[batch, heads, seq, d_head]`.

/// `out[a, c, b, d] = x[a, b, c, d]` for `x` of shape `[d0, d1, d2, d3]` (swap axes 1 and 2).
pub fn transpose_0213(x: &[f32], dims: [usize; 4], out: &mut [f32]) {
    let [d0, d1, d2, d3] = dims;
    assert_eq!(x.len(), d0 * d1 * d2 * d3, "transpose_0213: input length");
    assert_eq!(out.len(), x.len(), "transpose_0213: output length");
    for a in 0..d0 {
        for b in 0..d1 {
            for c in 0..d2 {
                let src = ((a * d1 + b) * d2 + c) * d3;
                let dst = ((a * d2 + c) * d1 + b) * d3;
                out[dst..dst + d3].copy_from_slice(&x[src..src + d3]);
            }
        }
    }
}
