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
//! Parallelism and determinism: the forward pass runs one task per (batch, head, query tile); the
//! backward pass one task per (batch, head), which iterates key tiles and, inside, query tiles in
//! a fixed order, so `dQ`, `dK` and `dV` are accumulated in the same order for any thread count.

use pulp::Simd;
use rayon::prelude::*;

use crate::matmul::{matmul_serial, MatmulSpec};
use crate::simd::{arch, exp_f32s, simd_op};

/// Queries per tile (`B_r` in the paper).
pub const BLOCK_Q: usize = 64;
/// Keys per tile (`B_c` in the paper) in the backward pass.
pub const BLOCK_K: usize = 64;
/// Keys per tile in the forward pass: larger tiles mean fewer online-softmax rescalings, and a
/// `BLOCK_Q × FORWARD_BLOCK_K` score tile (64 KiB) still fits in L2.
pub const FORWARD_BLOCK_K: usize = 256;

/// Sizes of one attention call. Layout `[batch, n_heads, seq, d_head]`, contiguous.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionDims {
    /// Batch size.
    pub batch: usize,
    /// Number of heads (keys and values have as many heads as queries).
    pub n_heads: usize,
    /// Query sequence length.
    pub seq_q: usize,
    /// Key/value sequence length.
    pub seq_k: usize,
    /// Head dimension.
    pub d_head: usize,
}

impl AttentionDims {
    fn pairs(&self) -> usize {
        self.batch * self.n_heads
    }

    /// Number of keys query `i` may attend under the mask.
    fn allowed(&self, i: usize, causal: bool) -> usize {
        if !causal {
            return self.seq_k;
        }
        // j <= i + seq_k − seq_q  ⇔  j < i + 1 + seq_k − seq_q.
        (i + 1 + self.seq_k)
            .saturating_sub(self.seq_q)
            .min(self.seq_k)
    }
}

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

/// `dst = alpha · src` (a query tile pre-multiplied by the softmax scale, so score tiles come
/// out of the matrix product already scaled).
#[inline(always)]
fn scaled_copy<S: Simd>(s: S, src: &[f32], alpha: f32, dst: &mut [f32]) {
    dst.copy_from_slice(src);
    scale_row(s, dst, alpha);
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

/// Forward for one (batch·head, query tile): Algorithm 1, lines 4–15.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn forward_tile<S: Simd>(
    s: S,
    dims: AttentionDims,
    q0: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    scale: f32,
    causal: bool,
    out: &mut [f32],
    lse: &mut [f32],
) {
    let d = dims.d_head;
    let br = lse.len();
    let mut sc = vec![0.0f32; br * FORWARD_BLOCK_K];
    let mut m = vec![f32::NEG_INFINITY; br];
    let mut l = vec![0.0f32; br];
    let mut qs = vec![0.0f32; q.len()];
    scaled_copy(s, q, scale, &mut qs);
    out.fill(0.0);
    let last_allowed = dims.allowed(q0 + br - 1, causal);
    let mut j0 = 0;
    while j0 < last_allowed {
        let bc = FORWARD_BLOCK_K.min(last_allowed - j0);
        let sc = &mut sc[..br * bc];
        // S = (scale·Q_i) K_jᵀ for the whole tile on gemm's micro-kernels.
        matmul_serial(
            MatmulSpec::new(br, d, bc).trans_b(true),
            &qs,
            &k[j0 * d..(j0 + bc) * d],
            sc,
        );
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
            if alpha != 1.0 {
                scale_row(s, &mut out[r * d..(r + 1) * d], alpha);
            }
        }
        // O_i += P_ij V_j (masked entries of P are 0).
        matmul_serial(
            MatmulSpec::new(br, bc, d).accumulate(true),
            sc,
            &v[j0 * d..(j0 + bc) * d],
            out,
        );
        j0 += bc;
    }
    for r in 0..br {
        let o = &mut out[r * d..(r + 1) * d];
        if l[r] > 0.0 {
            scale_row(s, o, 1.0 / l[r]);
            lse[r] = m[r] + l[r].ln();
        } else {
            o.fill(0.0);
            lse[r] = f32::NEG_INFINITY;
        }
    }
}

simd_op!(ForwardOp<'a> {
    dims: AttentionDims, q0: usize, q: &'a [f32], k: &'a [f32], v: &'a [f32], scale: f32,
    causal: bool, out: &'a mut [f32], lse: &'a mut [f32]
} -> () = |s| forward_tile(s, dims, q0, q, k, v, scale, causal, out, lse));

fn check(name: &str, what: &str, got: usize, want: usize) {
    assert!(
        got == want,
        "{name}: {what} has {got} elements, expected {want}"
    );
}

/// FlashAttention-2 forward: `out = softmax(scale · Q Kᵀ + mask) V` and the per-row logsumexp
/// `lse = log Σ_j exp(scale · q·k_j)` over allowed keys.
///
/// `q`, `out`: `[batch, n_heads, seq_q, d_head]`; `k`, `v`: `[batch, n_heads, seq_k, d_head]`;
/// `lse`: `[batch, n_heads, seq_q]`. Dao 2023, Algorithm 1.
///
/// # Panics
/// When a slice length disagrees with `dims` (callers validate shapes first).
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
    let (p, d) = (dims.pairs(), dims.d_head);
    let name = "flash_attention_forward";
    check(name, "q", q.len(), p * dims.seq_q * d);
    check(name, "k", k.len(), p * dims.seq_k * d);
    check(name, "v", v.len(), p * dims.seq_k * d);
    check(name, "out", out.len(), p * dims.seq_q * d);
    check(name, "lse", lse.len(), p * dims.seq_q);
    if p == 0 || dims.seq_q == 0 {
        return;
    }
    let tiles = dims.seq_q.div_ceil(BLOCK_Q);
    let (sq, sk) = (dims.seq_q, dims.seq_k);
    let task = |(t, (o, l)): (usize, (&mut [f32], &mut [f32]))| {
        let (pair, tile) = (t / tiles, t % tiles);
        let q0 = tile * BLOCK_Q;
        let br = BLOCK_Q.min(sq - q0);
        let qo = (pair * sq + q0) * d;
        arch().dispatch(ForwardOp {
            dims,
            q0,
            q: &q[qo..qo + br * d],
            k: &k[pair * sk * d..(pair + 1) * sk * d],
            v: &v[pair * sk * d..(pair + 1) * sk * d],
            scale,
            causal,
            out: o,
            lse: l,
        })
    };
    // Split `out`/`lse` into per-(pair, tile) pieces, in order.
    let mut pieces: Vec<(&mut [f32], &mut [f32])> = Vec::with_capacity(p * tiles);
    for (o, l) in out.chunks_mut(sq * d).zip(lse.chunks_mut(sq)) {
        for (ot, lt) in o.chunks_mut(BLOCK_Q * d).zip(l.chunks_mut(BLOCK_Q)) {
            pieces.push((ot, lt));
        }
    }
    if p * sq * sk * d.max(1) < 64 * 64 * 16 {
        pieces.into_iter().enumerate().for_each(task);
    } else {
        crate::par::install(|| pieces.into_par_iter().enumerate().for_each(task));
    }
}

/// Backward for one (batch·head): Algorithm 2, with the whole `dQ`, `dK`, `dV` of the pair owned
/// by the task. Key tiles are the outer loop, query tiles the inner one, in a fixed order. The
/// tile products (`QKᵀ`, `PᵀdO`, `dO·Vᵀ`, `dS·K`, `dSᵀQ`) run on `gemm`'s micro-kernels through
/// [`matmul_serial`]; the element-wise parts (exp, `dS = P ⊙ (dP − D)`) use the SIMD helpers.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn backward_pair<S: Simd>(
    s: S,
    dims: AttentionDims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &[f32],
    lse: &[f32],
    dout: &[f32],
    scale: f32,
    causal: bool,
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
) {
    let (d, sq, sk) = (dims.d_head, dims.seq_q, dims.seq_k);
    dq.fill(0.0);
    dk.fill(0.0);
    dv.fill(0.0);
    // D_i = rowsum(dO ⊙ O) (Algorithm 2, line 4).
    let delta: Vec<f32> = out
        .chunks_exact(d)
        .zip(dout.chunks_exact(d))
        .map(|(o, g)| o.iter().zip(g).map(|(a, b)| a * b).sum())
        .collect();
    let mut p = vec![0.0f32; BLOCK_Q * BLOCK_K];
    let mut dp = vec![0.0f32; BLOCK_Q * BLOCK_K];
    // Q pre-multiplied by the scale: P = exp((scale·Q) Kᵀ − L) exactly as the forward pass
    // computed its scores.
    let mut qs = vec![0.0f32; q.len()];
    scaled_copy(s, q, scale, &mut qs);
    for k0 in (0..sk).step_by(BLOCK_K) {
        let bk = BLOCK_K.min(sk - k0);
        let (k_tile, v_tile) = (&k[k0 * d..(k0 + bk) * d], &v[k0 * d..(k0 + bk) * d]);
        // The first query that may attend key k0, rounded down to its tile.
        let first = if causal {
            (k0 + sq).saturating_sub(sk)
        } else {
            0
        };
        for q0 in (first - first % BLOCK_Q..sq).step_by(BLOCK_Q) {
            let bq = BLOCK_Q.min(sq - q0);
            let (q_tile, do_tile) = (&q[q0 * d..(q0 + bq) * d], &dout[q0 * d..(q0 + bq) * d]);
            let p_tile = &mut p[..bq * bk];
            matmul_serial(
                MatmulSpec::new(bq, d, bk).trans_b(true),
                &qs[q0 * d..(q0 + bq) * d],
                k_tile,
                p_tile,
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
            // dV_j += Pᵀ · dO_i
            matmul_serial(
                MatmulSpec::new(bk, bq, d).trans_a(true).accumulate(true),
                p_tile,
                do_tile,
                &mut dv[k0 * d..(k0 + bk) * d],
            );
            // dP = dO_i · V_jᵀ, then dS = P ⊙ (dP − D_i), pre-multiplied by the softmax scale.
            let dp_tile = &mut dp[..bq * bk];
            matmul_serial(
                MatmulSpec::new(bq, d, bk).trans_b(true),
                do_tile,
                v_tile,
                dp_tile,
            );
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
            // dQ_i += dS · K_j ;  dK_j += dSᵀ · Q_i
            matmul_serial(
                MatmulSpec::new(bq, bk, d).accumulate(true),
                dp_tile,
                k_tile,
                &mut dq[q0 * d..(q0 + bq) * d],
            );
            matmul_serial(
                MatmulSpec::new(bk, bq, d).trans_a(true).accumulate(true),
                dp_tile,
                q_tile,
                &mut dk[k0 * d..(k0 + bk) * d],
            );
        }
    }
}

/// One (batch·head)'s `((dq, dk), dv)` output slices.
type GradPieces<'a> = ((&'a mut [f32], &'a mut [f32]), &'a mut [f32]);

simd_op!(BackwardOp<'a> {
    dims: AttentionDims, q: &'a [f32], k: &'a [f32], v: &'a [f32], out: &'a [f32],
    lse: &'a [f32], dout: &'a [f32], scale: f32, causal: bool, dq: &'a mut [f32],
    dk: &'a mut [f32], dv: &'a mut [f32]
} -> () = |s| backward_pair(s, dims, q, k, v, out, lse, dout, scale, causal, dq, dk, dv));

/// FlashAttention-2 backward: given the forward's inputs, `out` and `lse`, and the upstream
/// gradient `dout`, overwrites `dq`, `dk`, `dv` with the gradients of `out` with respect to
/// `q`, `k`, `v`. Shapes as in [`flash_attention_forward`]. Dao 2023, Algorithm 2.
///
/// # Panics
/// When a slice length disagrees with `dims` (callers validate shapes first).
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
    let (p, d, sq, sk) = (dims.pairs(), dims.d_head, dims.seq_q, dims.seq_k);
    let name = "flash_attention_backward";
    for (what, got, want) in [
        ("q", q.len(), p * sq * d),
        ("k", k.len(), p * sk * d),
        ("v", v.len(), p * sk * d),
        ("out", out.len(), p * sq * d),
        ("lse", lse.len(), p * sq),
        ("dout", dout.len(), p * sq * d),
        ("dq", dq.len(), p * sq * d),
        ("dk", dk.len(), p * sk * d),
        ("dv", dv.len(), p * sk * d),
    ] {
        check(name, what, got, want);
    }
    if p == 0 {
        return;
    }
    let (nq, nk) = (sq * d, sk * d);
    let task = |(i, ((dq, dk), dv)): (usize, GradPieces<'_>)| {
        arch().dispatch(BackwardOp {
            dims,
            q: &q[i * nq..(i + 1) * nq],
            k: &k[i * nk..(i + 1) * nk],
            v: &v[i * nk..(i + 1) * nk],
            out: &out[i * nq..(i + 1) * nq],
            lse: &lse[i * sq..(i + 1) * sq],
            dout: &dout[i * nq..(i + 1) * nq],
            scale,
            causal,
            dq,
            dk,
            dv,
        })
    };
    if nq == 0 || nk == 0 {
        dq.fill(0.0);
        dk.fill(0.0);
        dv.fill(0.0);
        return;
    }
    crate::par::install(|| {
        dq.par_chunks_mut(nq)
            .zip(dk.par_chunks_mut(nk))
            .zip(dv.par_chunks_mut(nk))
            .enumerate()
            .for_each(task)
    });
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
