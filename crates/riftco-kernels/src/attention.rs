//! Scaled dot-product attention on the CPU with FlashAttention-2 tiling (Dao 2023,
//! "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning",
//! Algorithm 1 for the forward pass and Algorithm 2 for the backward pass).
//!
//! Tensors are laid out `[batch, n_heads, seq, d_head]`, contiguous, row-major. The forward pass
//! never materialises the `[seq_q, seq_k]` score matrix: it walks key tiles with an online
//! softmax (running row max `m` and row sum `l`) and keeps only the output and the per-row
//! logsumexp `L = m + ln l`. The backward pass recomputes `P = exp(scale·QKᵀ − L)` tile by tile
//! from `Q`, `K` and `L`, after computing `D = rowsum(dO ⊙ O)`.
//!
//! Causal masking: query `i` may attend key `j` iff `j <= i + (seq_k − seq_q)` (queries are the
//! last `seq_q` positions of the key sequence). A query row that may attend no key at all (only
//! possible when `seq_q > seq_k`) gets output 0, logsumexp `-inf` and zero gradients.
//!
//! Dropout (Srivastava et al. 2014) on the attention probabilities, as FlashAttention does
//! (Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with
//! IO-Awareness", Appendix B: forward and backward passes with dropout, the mask regenerated from
//! the RNG state): with a [`DropoutMask`] the output is
//! `(P ⊙ Z) V`, `Z = M / (1 − p)`, where `P` is the softmax above and `M` the mask over the index
//! space `[batch, n_heads, seq_q, seq_k]`, row-major: element `e = ((b·H + h)·Sq + i)·Sk + j`, in
//! both layouts. The logsumexp is that of `P`, without dropout. The mask is never stored: the
//! forward generates it for each `P` tile it multiplies with `V`, the backward regenerates it
//! tile by tile (see [`flash_attention_backward_with_dropout`] for the gradient identities).
//!
//! Grouped-query attention: keys and values have `n_kv_heads` heads (a divisor of `n_heads`);
//! query head `h` reads key/value head `h / (n_heads / n_kv_heads)` by index (see
//! [`AttentionDims`]); nothing is repeated in memory.
//!
//! Parallelism and determinism: the forward pass runs one task per (batch, head, query tile); the
//! backward pass one task per (batch, key/value head), which iterates the query heads of its
//! group in order and, for each, key tiles and, inside, query tiles in a fixed order, so `dQ`,
//! `dK` and `dV` are accumulated in the same order for any thread count.

use pulp::Simd;
use rayon::prelude::*;

pub use crate::attention_dims::{AttentionDims, AttentionLayout};
use crate::philox::DropoutMask;
use crate::simd::{arch, exp_f32s, simd_op};
use crate::strided::{gemm_into, gemm_into_shared, MatRef, SharedMut};

/// Queries per tile (`B_r` in the paper).
pub const BLOCK_Q: usize = 64;
/// Keys per tile (`B_c` in the paper) in the backward pass.
pub const BLOCK_K: usize = 64;
/// Keys per tile in the forward pass: larger tiles mean fewer online-softmax rescalings, and a
/// `BLOCK_Q × FORWARD_BLOCK_K` score tile (64 KiB) still fits in L2.
pub const FORWARD_BLOCK_K: usize = 256;

/// `v[..] *= alpha`.
#[inline(always)]
fn scale_row<S: Simd>(s: S, v: &mut [f32], alpha: f32) {
    crate::softmax::scale_in_place(s, v, alpha);
}

/// `n` rounded up to whole SIMD vectors, capped at `len`.
#[inline(always)]
fn vector_end<S: Simd>(n: usize, len: usize) -> usize {
    n.div_ceil(S::F32_LANES)
        .saturating_mul(S::F32_LANES)
        .min(len)
}

/// `max(p[..n])` after setting `p[n..end]` to `-inf`, where `end` is `n` rounded up to whole
/// vectors: the masked lanes of the last vector then take part harmlessly, and no element is
/// handled by a scalar tail loop unless the row itself ends mid-vector.
#[inline(always)]
fn masked_row_max<S: Simd>(s: S, p: &mut [f32], n: usize) -> f32 {
    let end = vector_end::<S>(n, p.len());
    p[n..end].fill(f32::NEG_INFINITY);
    crate::simd::max(s, &p[..end])
}

/// `p[c] = exp(p[c] − shift)` for `c < n`, exactly 0 beyond; returns `Σ p` (in place). Masked
/// entries inside the last vector are set to `-inf`, whose exponential is exactly 0, so whole
/// vectors run through the SIMD `exp`.
#[inline(always)]
fn exp_row<S: Simd>(s: S, p: &mut [f32], n: usize, shift: f32) -> f32 {
    let end = vector_end::<S>(n, p.len());
    let (head, tail) = p.split_at_mut(end);
    tail.fill(0.0);
    head[n..].fill(f32::NEG_INFINITY);
    let sh = s.splat_f32s(shift);
    let (hv, ht) = S::as_mut_simd_f32s(head);
    let mut acc = s.splat_f32s(0.0);
    for x in hv.iter_mut() {
        *x = exp_f32s(s, s.sub_f32s(*x, sh));
        acc = s.add_f32s(acc, *x);
    }
    let mut sum = s.reduce_sum_f32s(acc);
    for x in ht.iter_mut() {
        *x = exp_f32s(pulp::Scalar, *x - shift);
        sum += *x;
    }
    sum
}

/// `ds[c] = p[c] · (ds[c] − delta)`, in place on `ds` (Algorithm 2, line 14).
#[inline(always)]
fn ds_row<S: Simd>(s: S, p: &[f32], ds: &mut [f32], delta: f32) {
    let dl = s.splat_f32s(delta);
    let (pv, pt) = S::as_simd_f32s(p);
    let (dv, dt) = S::as_mut_simd_f32s(ds);
    for (d, &pp) in dv.iter_mut().zip(pv) {
        *d = s.mul_f32s(pp, s.sub_f32s(*d, dl));
    }
    for (d, &pp) in dt.iter_mut().zip(pt) {
        *d = pp * (*d - delta);
    }
}

/// `dst[r] = alpha · src[offset + r·stride ..][..d]` for `rows` rows: one head's query rows
/// gathered into a contiguous tile, pre-multiplied by the softmax scale.
#[inline(always)]
fn gather_scaled<S: Simd>(
    s: S,
    src: &[f32],
    (offset, stride): (usize, usize),
    d: usize,
    alpha: f32,
    dst: &mut [f32],
) {
    for (r, row) in dst.chunks_exact_mut(d).enumerate() {
        let at = offset + r * stride;
        crate::simd::map1!(S, s, &src[at..at + d], row, |x| s
            .mul_f32s(x, s.splat_f32s(alpha)));
    }
}

/// Per-thread scratch of the forward pass (score tile, scaled queries, output accumulator,
/// running max and sum), reused across tiles so no task allocates.
#[derive(Default)]
struct ForwardScratch {
    sc: Vec<f32>,
    qs: Vec<f32>,
    o: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
}

thread_local! {
    static FORWARD_SCRATCH: std::cell::RefCell<ForwardScratch> = Default::default();
}

/// `v` resized to `n` elements, each set to `value`.
fn reset(v: &mut Vec<f32>, n: usize, value: f32) -> &mut [f32] {
    v.clear();
    v.resize(n, value);
    v
}

/// Forward for one (batch·head, query tile): Algorithm 1, lines 4–15. The output tile is
/// accumulated in a contiguous scratch and written to its strided rows at the end.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn forward_tile<S: Simd>(
    s: S,
    dims: AttentionDims,
    layout: AttentionLayout,
    pair: usize,
    q0: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    scale: f32,
    causal: bool,
    dropout: Option<DropoutMask>,
    out: SharedMut,
    lse: &mut [f32],
    scratch: &mut ForwardScratch,
) {
    let d = dims.d_head;
    let br = lse.len();
    let (qb, qrs) = layout.head_rows(d, dims.n_heads, pair, dims.seq_q);
    let kv_pair = dims.kv_pair_of(pair);
    let (kb, krs) = layout.head_rows(d, dims.n_kv_heads, kv_pair, dims.seq_k);
    // The score tile is overwritten by its product before any read: no need to clear it.
    if scratch.sc.len() < br * FORWARD_BLOCK_K {
        scratch.sc.resize(br * FORWARD_BLOCK_K, 0.0);
    }
    let sc = &mut scratch.sc[..br * FORWARD_BLOCK_K];
    let m = reset(&mut scratch.m, br, f32::NEG_INFINITY);
    let l = reset(&mut scratch.l, br, 0.0);
    let qs = reset(&mut scratch.qs, br * d, 0.0);
    gather_scaled(s, q, (qb + q0 * qrs, qrs), d, scale, qs);
    let o = reset(&mut scratch.o, br * d, 0.0);
    let last_allowed = dims.allowed(q0 + br - 1, causal);
    let mut j0 = 0;
    while j0 < last_allowed {
        let bc = FORWARD_BLOCK_K.min(last_allowed - j0);
        let sc = &mut sc[..br * bc];
        // S = (scale·Q_i) K_jᵀ for the whole tile on gemm's micro-kernels.
        let k_tile = MatRef::rows(k, kb + j0 * krs, bc, d, krs);
        gemm_into(sc, false, MatRef::rows(qs, 0, br, d, d), k_tile.t());
        for r in 0..br {
            let row = &mut sc[r * bc..(r + 1) * bc];
            let n = dims.allowed(q0 + r, causal).saturating_sub(j0).min(bc);
            if n == 0 {
                row.fill(0.0);
                continue;
            }
            let row_max = masked_row_max(s, row, n);
            let m_new = m[r].max(row_max);
            let alpha = exp_f32s(pulp::Scalar, m[r] - m_new);
            let sum = exp_row(s, row, n, m_new);
            l[r] = l[r] * alpha + sum;
            m[r] = m_new;
            if let Some(mask) = dropout {
                // The row sum above is that of P; only the product with V sees P ⊙ Z.
                let e = ((pair * dims.seq_q + q0 + r) * dims.seq_k + j0) as u64;
                mask.apply_in_place(e, &mut row[..n]);
            }
            if alpha != 1.0 {
                scale_row(s, &mut o[r * d..(r + 1) * d], alpha);
            }
        }
        // O_i += P_ij V_j (masked entries of P are 0).
        gemm_into(
            o,
            true,
            MatRef::rows(sc, 0, br, bc, bc),
            MatRef::rows(v, kb + j0 * krs, bc, d, krs),
        );
        j0 += bc;
    }
    for r in 0..br {
        let row = &mut o[r * d..(r + 1) * d];
        if l[r] > 0.0 {
            scale_row(s, row, 1.0 / l[r]);
            lse[r] = m[r] + l[r].ln();
        } else {
            row.fill(0.0);
            lse[r] = f32::NEG_INFINITY;
        }
        // SAFETY: row (pair, q0 + r) of `out` belongs to this task alone: tasks are distinct
        // (pair, query tile) pairs and rows of different heads or positions never overlap.
        unsafe { out.write_row(qb + (q0 + r) * qrs, row) };
    }
}

simd_op!(ForwardOp<'a> {
    dims: AttentionDims, layout: AttentionLayout, pair: usize, q0: usize, q: &'a [f32],
    k: &'a [f32], v: &'a [f32], scale: f32, causal: bool, dropout: Option<DropoutMask>,
    out: SharedMut, lse: &'a mut [f32], scratch: &'a mut ForwardScratch
} -> () = |s| forward_tile(
    s, dims, layout, pair, q0, q, k, v, scale, causal, dropout, out, lse, scratch
));

fn check(name: &str, what: &str, got: usize, want: usize) {
    assert!(
        got == want,
        "{name}: {what} has {got} elements, expected {want}"
    );
}

fn check_groups(name: &str, dims: &AttentionDims) {
    assert!(
        dims.n_kv_heads >= 1 && dims.n_heads % dims.n_kv_heads == 0,
        "{name}: n_kv_heads {} must be >= 1 and divide n_heads {}",
        dims.n_kv_heads,
        dims.n_heads
    );
}

/// FlashAttention-2 forward in the `[batch, n_heads, seq, d_head]` layout; see
/// [`flash_attention_forward_with_layout`].
///
/// # Panics
/// When a slice length disagrees with `dims` or `n_kv_heads` does not divide `n_heads`
/// (callers validate shapes first).
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_forward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dims: AttentionDims,
    scale: f32,
    causal: bool,
    out: &mut [f32],
    lse: &mut [f32],
) {
    flash_attention_forward_with_layout(
        q,
        k,
        v,
        dims,
        AttentionLayout::BatchHeadSeq,
        scale,
        causal,
        out,
        lse,
    );
}

/// FlashAttention-2 forward: `out = softmax(scale · Q Kᵀ + mask) V` and the per-row logsumexp
/// `lse = log Σ_j exp(scale · q·k_j)` over allowed keys. Dao 2023, Algorithm 1.
///
/// `q`, `out`: `seq_q` rows per head, `k`, `v`: `seq_k` rows per head, in `layout`;
/// `lse`: `[batch, n_heads, seq_q]`.
///
/// # Panics
/// When a slice length disagrees with `dims` or `n_kv_heads` does not divide `n_heads`
/// (callers validate shapes first).
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_forward_with_layout(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dims: AttentionDims,
    layout: AttentionLayout,
    scale: f32,
    causal: bool,
    out: &mut [f32],
    lse: &mut [f32],
) {
    flash_attention_forward_with_dropout(q, k, v, dims, layout, scale, causal, None, out, lse);
}

/// [`flash_attention_forward_with_layout`] with dropout on the attention probabilities:
/// `out = (P ⊙ M / (1 − p)) V` with `P = softmax(scale · Q Kᵀ + mask)` and `M` the keep mask of
/// `dropout` over the index space `[batch, n_heads, seq_q, seq_k]` (module docs); `lse` is the
/// logsumexp of `P` (no dropout). `None` or `p == 0` is exactly
/// [`flash_attention_forward_with_layout`] (no random words are generated).
///
/// # Panics
/// When a slice length disagrees with `dims` or `n_kv_heads` does not divide `n_heads`
/// (callers validate shapes first).
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_forward_with_dropout(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dims: AttentionDims,
    layout: AttentionLayout,
    scale: f32,
    causal: bool,
    dropout: Option<&DropoutMask>,
    out: &mut [f32],
    lse: &mut [f32],
) {
    let dropout = dropout.filter(|m| !m.is_identity()).copied();
    let (p, kvp, d) = (dims.pairs(), dims.kv_pairs(), dims.d_head);
    let name = "flash_attention_forward";
    check_groups(name, &dims);
    check(name, "q", q.len(), p * dims.seq_q * d);
    check(name, "k", k.len(), kvp * dims.seq_k * d);
    check(name, "v", v.len(), kvp * dims.seq_k * d);
    check(name, "out", out.len(), p * dims.seq_q * d);
    check(name, "lse", lse.len(), p * dims.seq_q);
    if p == 0 || dims.seq_q == 0 {
        return;
    }
    let sq = dims.seq_q;
    let tiles = sq.div_ceil(BLOCK_Q);
    let out = SharedMut::new(out);
    let task = |(t, l): (usize, &mut [f32])| {
        let (pair, tile) = (t / tiles, t % tiles);
        // The scratch is borrowed here, outside the SIMD-dispatched code (see `simd::map1`).
        FORWARD_SCRATCH.with_borrow_mut(|scratch| {
            arch().dispatch(ForwardOp {
                dims,
                layout,
                pair,
                q0: tile * BLOCK_Q,
                q,
                k,
                v,
                scale,
                causal,
                dropout,
                out,
                lse: l,
                scratch,
            })
        })
    };
    // One task per (pair, query tile), each owning its lse piece and its output rows.
    let pieces: Vec<&mut [f32]> = lse
        .chunks_mut(sq)
        .flat_map(|l| l.chunks_mut(BLOCK_Q))
        .collect();
    if p * sq * dims.seq_k * d.max(1) < 64 * 64 * 16 {
        pieces.into_iter().enumerate().for_each(task);
    } else {
        crate::par::install(|| pieces.into_par_iter().enumerate().for_each(task));
    }
}

/// Backward for one (batch, key/value head): Algorithm 2 for each query head of its group in
/// order (grouped-query attention sums `dK`, `dV` over them in that fixed order), with the
/// rows of `dK`, `dV` of the key/value pair and `dQ` of its query heads owned by the task. Key tiles are the outer loop, query tiles the inner one, in a fixed order. The
/// tile products (`QKᵀ`, `PᵀdO`, `dO·Vᵀ`, `dS·K`, `dSᵀQ`) run on `gemm`'s micro-kernels through
/// strided views; the element-wise parts (exp, `dS = P ⊙ (dP − D)`) use the SIMD helpers.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn backward_kv_pair<S: Simd>(
    s: S,
    dims: AttentionDims,
    layout: AttentionLayout,
    kv_pair: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &[f32],
    lse: &[f32],
    dout: &[f32],
    scale: f32,
    causal: bool,
    dropout: Option<DropoutMask>,
    grads: [SharedMut; 3],
) {
    let g = dims.group();
    let (b, kvh) = (kv_pair / dims.n_kv_heads, kv_pair % dims.n_kv_heads);
    for j in 0..g {
        let pair = b * dims.n_heads + kvh * g + j;
        let lse = &lse[pair * dims.seq_q..(pair + 1) * dims.seq_q];
        backward_pair(
            s, dims, layout, pair, kv_pair, q, k, v, out, lse, dout, scale, causal, dropout, grads,
        );
    }
}

/// [`backward_kv_pair`] for query pair `pair` (reading key/value pair `kv_pair`); `lse` is the
/// pair's `seq_q` logsumexps.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn backward_pair<S: Simd>(
    s: S,
    dims: AttentionDims,
    layout: AttentionLayout,
    pair: usize,
    kv_pair: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &[f32],
    lse: &[f32],
    dout: &[f32],
    scale: f32,
    causal: bool,
    dropout: Option<DropoutMask>,
    grads: [SharedMut; 3],
) {
    let [dq, dk, dv] = grads;
    let (d, sq, sk) = (dims.d_head, dims.seq_q, dims.seq_k);
    let (qb, qrs) = layout.head_rows(d, dims.n_heads, pair, sq);
    let (kb, krs) = layout.head_rows(d, dims.n_kv_heads, kv_pair, sk);
    // D_i = rowsum(dO ⊙ O) (Algorithm 2, line 4).
    let delta: Vec<f32> = (0..sq)
        .map(|i| {
            let at = qb + i * qrs;
            let (o, g) = (&out[at..at + d], &dout[at..at + d]);
            o.iter().zip(g).map(|(a, b)| a * b).sum()
        })
        .collect();
    // Q pre-multiplied by the scale: P = exp((scale·Q) Kᵀ − L) exactly as the forward pass
    // computed its scores.
    let mut qs = vec![0.0f32; sq * d];
    gather_scaled(s, q, (qb, qrs), d, scale, &mut qs);
    let mut p = vec![0.0f32; BLOCK_Q * BLOCK_K];
    let mut dp = vec![0.0f32; BLOCK_Q * BLOCK_K];
    // P ⊙ Z, only with dropout.
    let mut pz = vec![
        0.0f32;
        if dropout.is_some() {
            BLOCK_Q * BLOCK_K
        } else {
            0
        }
    ];
    for k0 in (0..sk).step_by(BLOCK_K) {
        let bk = BLOCK_K.min(sk - k0);
        let k_tile = MatRef::rows(k, kb + k0 * krs, bk, d, krs);
        let v_tile = MatRef::rows(v, kb + k0 * krs, bk, d, krs);
        // The first query that may attend key k0, rounded down to its tile.
        let first = if causal {
            (k0 + sq).saturating_sub(sk)
        } else {
            0
        };
        for q0 in (first - first % BLOCK_Q..sq).step_by(BLOCK_Q) {
            let bq = BLOCK_Q.min(sq - q0);
            let q_tile = MatRef::rows(q, qb + q0 * qrs, bq, d, qrs);
            let do_tile = MatRef::rows(dout, qb + q0 * qrs, bq, d, qrs);
            let p_tile = &mut p[..bq * bk];
            gemm_into(
                p_tile,
                false,
                MatRef::rows(&qs, q0 * d, bq, d, d),
                k_tile.t(),
            );
            // P = exp(scale·S − L) on the allowed keys, 0 on masked ones.
            for r in 0..bq {
                let n = dims.allowed(q0 + r, causal).saturating_sub(k0).min(bk);
                let row = &mut p_tile[r * bk..(r + 1) * bk];
                if n > 0 {
                    exp_row(s, row, n, lse[q0 + r]); // zero-fills row[n..]
                } else {
                    row.fill(0.0);
                }
            }
            // dP = dO_i · V_jᵀ (with dropout, the gradient with respect to P ⊙ Z for now).
            let dp_tile = &mut dp[..bq * bk];
            gemm_into(dp_tile, false, do_tile, v_tile.t());
            let p_view = match dropout {
                None => MatRef::rows(p_tile, 0, bq, bk, bk),
                Some(mask) => {
                    // One pass over the regenerated mask: P ⊙ Z for dV, and dP ⊙ Z, the
                    // gradient with respect to P.
                    let (sc, pz_tile) = (mask.scale(), &mut pz[..bq * bk]);
                    for r in 0..bq {
                        let n = dims.allowed(q0 + r, causal).saturating_sub(k0).min(bk);
                        let e = ((pair * sq + q0 + r) * sk + k0) as u64;
                        let at = r * bk;
                        let (pr, zr) = (&p_tile[at..at + bk], &mut pz_tile[at..at + bk]);
                        let dr = &mut dp_tile[at..at + bk];
                        zr[n..].fill(0.0);
                        mask.for_each_chunk(e, n, |c0, keep| {
                            let c1 = c0 + keep.len();
                            let it = zr[c0..c1].iter_mut().zip(&pr[c0..c1]);
                            for (((z, &p), d), &m) in it.zip(&mut dr[c0..c1]).zip(keep) {
                                *z = f32::from_bits((p * sc).to_bits() & m);
                                *d = f32::from_bits((*d * sc).to_bits() & m);
                            }
                        });
                    }
                    MatRef::rows(pz_tile, 0, bq, bk, bk)
                }
            };
            // SAFETY (all three accumulations below): the rows of this query pair in dQ and of
            // its key/value pair in dK and dV belong to this task alone (one task per key/value
            // pair, which alone handles the query heads of its group; different pairs are
            // different heads or batch entries, whose rows never overlap), and the gradient
            // buffers are distinct from every input.
            // dV_j += (P ⊙ Z)ᵀ · dO_i
            unsafe { gemm_into_shared(dv, kb + k0 * krs, krs, true, p_view.t(), do_tile) };
            // dS = P ⊙ (dP − D_i), pre-multiplied by the softmax scale.
            for r in 0..bq {
                let range = r * bk..(r + 1) * bk;
                ds_row(
                    s,
                    &p_tile[range.clone()],
                    &mut dp_tile[range.clone()],
                    delta[q0 + r],
                );
                scale_row(s, &mut dp_tile[range], scale);
            }
            let ds_view = MatRef::rows(dp_tile, 0, bq, bk, bk);
            // dQ_i += dS · K_j ;  dK_j += dSᵀ · Q_i
            unsafe { gemm_into_shared(dq, qb + q0 * qrs, qrs, true, ds_view, k_tile) };
            unsafe { gemm_into_shared(dk, kb + k0 * krs, krs, true, ds_view.t(), q_tile) };
        }
    }
}

simd_op!(BackwardOp<'a> {
    dims: AttentionDims, layout: AttentionLayout, kv_pair: usize, q: &'a [f32], k: &'a [f32],
    v: &'a [f32], out: &'a [f32], lse: &'a [f32], dout: &'a [f32], scale: f32, causal: bool,
    dropout: Option<DropoutMask>, grads: [SharedMut; 3]
} -> () = |s| backward_kv_pair(
    s, dims, layout, kv_pair, q, k, v, out, lse, dout, scale, causal, dropout, grads
));

/// FlashAttention-2 backward in the `[batch, n_heads, seq, d_head]` layout; see
/// [`flash_attention_backward_with_layout`].
///
/// # Panics
/// When a slice length disagrees with `dims` or `n_kv_heads` does not divide `n_heads`
/// (callers validate shapes first).
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_backward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &[f32],
    lse: &[f32],
    dout: &[f32],
    dims: AttentionDims,
    scale: f32,
    causal: bool,
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
) {
    flash_attention_backward_with_layout(
        q,
        k,
        v,
        out,
        lse,
        dout,
        dims,
        AttentionLayout::BatchHeadSeq,
        scale,
        causal,
        dq,
        dk,
        dv,
    );
}

/// FlashAttention-2 backward: given the forward's inputs, `out` and `lse`, and the upstream
/// gradient `dout`, overwrites `dq`, `dk`, `dv` with the gradients of `out` with respect to
/// `q`, `k`, `v`. Shapes and layout as in [`flash_attention_forward_with_layout`]. Dao 2023,
/// Algorithm 2.
///
/// # Panics
/// When a slice length disagrees with `dims` or `n_kv_heads` does not divide `n_heads`
/// (callers validate shapes first).
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_backward_with_layout(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &[f32],
    lse: &[f32],
    dout: &[f32],
    dims: AttentionDims,
    layout: AttentionLayout,
    scale: f32,
    causal: bool,
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
) {
    flash_attention_backward_with_dropout(
        q, k, v, out, lse, dout, dims, layout, scale, causal, None, dq, dk, dv,
    );
}

/// [`flash_attention_backward_with_layout`] for [`flash_attention_forward_with_dropout`] with
/// the same `dropout` mask (regenerated tile by tile, never stored); `out` is the forward's
/// (dropped) output and `lse` its logsumexp of the undropped probabilities. `None` or `p == 0`
/// is exactly [`flash_attention_backward_with_layout`].
///
/// The gradients, with `P` the undropped probabilities, `Z = M / (1 − p)` and `O = (P ⊙ Z) V`:
/// - `dV = (P ⊙ Z)ᵀ dO`, since `O` is linear in `V` with coefficients `P ⊙ Z`;
/// - `dP = (dO Vᵀ) ⊙ Z`, the gradient with respect to `P` (chain rule through `P ⊙ Z`);
/// - `dS = P ⊙ (dP − D)` with `D_i = Σ_j P_ij dP_ij` (softmax VJP), and
///   `Σ_j P_ij dP_ij = Σ_j P_ij Z_ij (dO_i · V_j) = dO_i · Σ_j (P ⊙ Z)_ij V_j = dO_i · O_i`, so
///   `D = rowsum(dO ⊙ O)` still holds with the dropped output `O` (FlashAttention-2,
///   Algorithm 2, line 4, unchanged);
/// - `dQ = scale · dS K`, `dK = scale · dSᵀ Q` as without dropout.
///
/// # Panics
/// When a slice length disagrees with `dims` or `n_kv_heads` does not divide `n_heads`
/// (callers validate shapes first).
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_backward_with_dropout(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &[f32],
    lse: &[f32],
    dout: &[f32],
    dims: AttentionDims,
    layout: AttentionLayout,
    scale: f32,
    causal: bool,
    dropout: Option<&DropoutMask>,
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
) {
    let dropout = dropout.filter(|m| !m.is_identity()).copied();
    let (p, kvp, d, sq, sk) = (
        dims.pairs(),
        dims.kv_pairs(),
        dims.d_head,
        dims.seq_q,
        dims.seq_k,
    );
    let name = "flash_attention_backward";
    check_groups(name, &dims);
    for (what, got, want) in [
        ("q", q.len(), p * sq * d),
        ("k", k.len(), kvp * sk * d),
        ("v", v.len(), kvp * sk * d),
        ("out", out.len(), p * sq * d),
        ("lse", lse.len(), p * sq),
        ("dout", dout.len(), p * sq * d),
        ("dq", dq.len(), p * sq * d),
        ("dk", dk.len(), kvp * sk * d),
        ("dv", dv.len(), kvp * sk * d),
    ] {
        check(name, what, got, want);
    }
    dq.fill(0.0);
    dk.fill(0.0);
    dv.fill(0.0);
    if p == 0 || sq == 0 || sk == 0 || d == 0 {
        return;
    }
    let grads = [SharedMut::new(dq), SharedMut::new(dk), SharedMut::new(dv)];
    let task = |kv_pair: usize| {
        arch().dispatch(BackwardOp {
            dims,
            layout,
            kv_pair,
            q,
            k,
            v,
            out,
            lse,
            dout,
            scale,
            causal,
            dropout,
            grads,
        })
    };
    crate::par::install(|| (0..kvp).into_par_iter().for_each(task));
}

simd_op!(MaskedSoftmaxOp<'a> {
    scores: &'a [f32], dims: AttentionDims, r0: usize, scale: f32, causal: bool,
    probs: &'a mut [f32]
} -> () = |s| {
    let sk = dims.seq_k;
    for (t, (sr, pr)) in scores.chunks_exact(sk).zip(probs.chunks_exact_mut(sk)).enumerate() {
        let i = (r0 + t) % dims.seq_q;
        let n = dims.allowed(i, causal);
        if n == 0 {
            pr.fill(0.0);
            continue;
        }
        crate::simd::map1!(S, s, sr, pr, |x| s.mul_f32s(x, s.splat_f32s(scale)));
        let m = masked_row_max(s, pr, n);
        let sum = exp_row(s, pr, n, m);
        scale_row(s, &mut pr[..n], 1.0 / sum);
    }
});

/// Materialised-attention helper: for scores `[batch·n_heads·seq_q, seq_k]` (row `r` is query
/// `r mod seq_q`), writes `probs = softmax(scale · scores)` per row, with the causal mask of the
/// module docs (masked entries exactly 0; a row with no allowed key is all 0).
///
/// # Panics
/// When `scores` or `probs` is not `batch·n_heads·seq_q·seq_k` long.
pub fn causal_softmax_rows(
    scores: &[f32],
    dims: AttentionDims,
    scale: f32,
    causal: bool,
    probs: &mut [f32],
) {
    let rows = dims.pairs() * dims.seq_q;
    let sk = dims.seq_k;
    check("causal_softmax_rows", "scores", scores.len(), rows * sk);
    check("causal_softmax_rows", "probs", probs.len(), rows * sk);
    if rows == 0 || sk == 0 {
        return;
    }
    let serial = |r0: usize, scores: &[f32], probs: &mut [f32]| {
        arch().dispatch(MaskedSoftmaxOp {
            scores,
            dims,
            r0,
            scale,
            causal,
            probs,
        })
    };
    match crate::par::rows_per_task(rows, sk) {
        None => serial(0, scores, probs),
        Some(n) => crate::par::install(|| {
            scores
                .par_chunks(n * sk)
                .zip(probs.par_chunks_mut(n * sk))
                .enumerate()
                .for_each(|(b, (sc, pr))| serial(b * n, sc, pr));
        }),
    }
}
