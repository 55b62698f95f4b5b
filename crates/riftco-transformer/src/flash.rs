//! CPU FlashAttention-2 kernels on slices (Dao 2023, "FlashAttention-2: Faster Attention with
//! Better Parallelism and Work Partitioning", Algorithm 1 forward, Algorithm 2 backward).
//!
//! Layout `[batch, n_heads, seq, d_head]`, contiguous. Work is split over `(batch, head)` pairs on
//! the kernel thread pool; inside a pair, tiles are visited in a fixed order, so results are
//! bitwise independent of the thread count. Tile products use single-threaded `gemm`.

use rayon::prelude::*;
use riftco_kernels::matmul::matmul_serial;
use riftco_kernels::MatmulSpec;

/// Query rows per tile.
const BLOCK_Q: usize = 64;
/// Key rows per tile.
const BLOCK_K: usize = 64;

/// Sizes of one attention call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionDims {
    /// Batch size.
    pub batch: usize,
    /// Heads.
    pub n_heads: usize,
    /// Query positions.
    pub seq_q: usize,
    /// Key/value positions.
    pub seq_k: usize,
    /// Head width.
    pub d_head: usize,
}

impl AttentionDims {
    /// Number of keys query row `i` may see: all keys, or with `causal` keys
    /// `j <= i + (seq_k − seq_q)`.
    #[inline]
    fn visible(&self, i: usize, causal: bool) -> usize {
        if causal {
            (i + self.seq_k - self.seq_q + 1).min(self.seq_k)
        } else {
            self.seq_k
        }
    }
}

/// Forward: `out = softmax(scale·QKᵀ + mask)·V`, and `lse[row] = logsumexp(scale·QKᵀ + mask)`
/// per query row (`[batch, n_heads, seq_q]`), computed with the online softmax so only `out`
/// and `lse` are written. Requires `seq_q <= seq_k` when `causal`.
///
/// # Panics
/// When slice lengths disagree with `dims` (callers validate first).
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
    let AttentionDims {
        batch,
        n_heads,
        seq_q,
        seq_k,
        d_head: d,
    } = dims;
    let pairs = batch * n_heads;
    assert_eq!(q.len(), pairs * seq_q * d, "flash forward: q length");
    assert_eq!(k.len(), pairs * seq_k * d, "flash forward: k length");
    assert_eq!(v.len(), pairs * seq_k * d, "flash forward: v length");
    assert_eq!(out.len(), q.len(), "flash forward: out length");
    assert_eq!(lse.len(), pairs * seq_q, "flash forward: lse length");
    assert!(
        !causal || seq_q <= seq_k,
        "flash forward: causal needs seq_q <= seq_k"
    );
    let work = |(p, (o, l)): (usize, (&mut [f32], &mut [f32]))| {
        let qp = &q[p * seq_q * d..(p + 1) * seq_q * d];
        let kp = &k[p * seq_k * d..(p + 1) * seq_k * d];
        let vp = &v[p * seq_k * d..(p + 1) * seq_k * d];
        forward_pair(qp, kp, vp, dims, scale, causal, o, l);
    };
    riftco_kernels::thread_pool().install(|| {
        out.par_chunks_mut(seq_q * d)
            .zip(lse.par_chunks_mut(seq_q))
            .enumerate()
            .for_each(work);
    });
}

#[allow(clippy::too_many_arguments)]
fn forward_pair(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dims: AttentionDims,
    scale: f32,
    causal: bool,
    out: &mut [f32],
    lse: &mut [f32],
) {
    let d = dims.d_head;
    let mut s = vec![0.0f32; BLOCK_Q * BLOCK_K];
    let mut acc = vec![0.0f32; BLOCK_Q * d];
    let mut m = [0.0f32; BLOCK_Q];
    let mut l = [0.0f32; BLOCK_Q];
    for q0 in (0..dims.seq_q).step_by(BLOCK_Q) {
        let bq = BLOCK_Q.min(dims.seq_q - q0);
        let q_tile = &q[q0 * d..(q0 + bq) * d];
        m[..bq].fill(f32::NEG_INFINITY);
        l[..bq].fill(0.0);
        acc[..bq * d].fill(0.0);
        // Keys visible to the last row of this tile bound the key loop.
        let k_end = dims.visible(q0 + bq - 1, causal);
        for k0 in (0..k_end).step_by(BLOCK_K) {
            let bk = BLOCK_K.min(k_end - k0);
            let s_tile = &mut s[..bq * bk];
            matmul_serial(
                MatmulSpec::new(bq, d, bk).trans_b(true),
                q_tile,
                &k[k0 * d..(k0 + bk) * d],
                s_tile,
            );
            for r in 0..bq {
                let row = &mut s_tile[r * bk..(r + 1) * bk];
                let vis = dims.visible(q0 + r, causal).saturating_sub(k0).min(bk);
                let mut row_max = f32::NEG_INFINITY;
                for x in row[..vis].iter_mut() {
                    *x *= scale;
                    row_max = row_max.max(*x);
                }
                let m_new = m[r].max(row_max);
                let mut sum = 0.0f32;
                if m_new == f32::NEG_INFINITY {
                    row.fill(0.0);
                } else {
                    for x in row[..vis].iter_mut() {
                        *x = (*x - m_new).exp();
                        sum += *x;
                    }
                    row[vis..].fill(0.0);
                }
                let correction = if m[r] == f32::NEG_INFINITY {
                    0.0
                } else {
                    (m[r] - m_new).exp()
                };
                l[r] = l[r] * correction + sum;
                m[r] = m_new;
                if correction != 1.0 {
                    for a in acc[r * d..(r + 1) * d].iter_mut() {
                        *a *= correction;
                    }
                }
            }
            // acc += P · V_tile
            matmul_serial(
                MatmulSpec::new(bq, bk, d).accumulate(true),
                s_tile,
                &v[k0 * d..(k0 + bk) * d],
                &mut acc[..bq * d],
            );
        }
        for r in 0..bq {
            let inv = if l[r] > 0.0 { 1.0 / l[r] } else { 0.0 };
            let o = &mut out[(q0 + r) * d..(q0 + r + 1) * d];
            for (o, a) in o.iter_mut().zip(&acc[r * d..(r + 1) * d]) {
                *o = a * inv;
            }
            lse[q0 + r] = if l[r] > 0.0 {
                m[r] + l[r].ln()
            } else {
                f32::NEG_INFINITY
            };
        }
    }
}

/// Backward: given the forward's `out` and `lse` and upstream `dout`, overwrites `dq`, `dk`, `dv`.
/// Scores and probabilities are recomputed tile by tile: `P = exp(scale·QKᵀ − lse)`,
/// `dV = Pᵀ·dO`, `dP = dO·Vᵀ`, `dS = P ⊙ (dP − D)` with `D = rowsum(dO ⊙ O)`,
/// `dQ = scale·dS·K`, `dK = scale·dSᵀ·Q`.
///
/// # Panics
/// When slice lengths disagree with `dims`.
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
    let AttentionDims {
        batch,
        n_heads,
        seq_q,
        seq_k,
        d_head: d,
    } = dims;
    let pairs = batch * n_heads;
    let (nq, nk) = (seq_q * d, seq_k * d);
    assert!(
        q.len() == pairs * nq
            && out.len() == q.len()
            && dout.len() == q.len()
            && dq.len() == q.len(),
        "flash backward: q-shaped lengths"
    );
    assert!(
        k.len() == pairs * nk && v.len() == k.len() && dk.len() == k.len() && dv.len() == k.len(),
        "flash backward: k-shaped lengths"
    );
    assert_eq!(lse.len(), pairs * seq_q, "flash backward: lse length");
    riftco_kernels::thread_pool().install(|| {
        dq.par_chunks_mut(nq)
            .zip(dk.par_chunks_mut(nk))
            .zip(dv.par_chunks_mut(nk))
            .enumerate()
            .for_each(|(p, ((dq, dk), dv))| {
                let qs = p * nq..(p + 1) * nq;
                let ks = p * nk..(p + 1) * nk;
                backward_pair(
                    &q[qs.clone()],
                    &k[ks.clone()],
                    &v[ks],
                    &out[qs.clone()],
                    &lse[p * seq_q..(p + 1) * seq_q],
                    &dout[qs],
                    dims,
                    scale,
                    causal,
                    dq,
                    dk,
                    dv,
                );
            });
    });
}

#[allow(clippy::too_many_arguments)]
fn backward_pair(
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
    let d = dims.d_head;
    dq.fill(0.0);
    dk.fill(0.0);
    dv.fill(0.0);
    // D_i = rowsum(dO_i ⊙ O_i)
    let dsum: Vec<f32> = out
        .chunks_exact(d)
        .zip(dout.chunks_exact(d))
        .map(|(o, g)| o.iter().zip(g).map(|(a, b)| a * b).sum())
        .collect();
    let mut p = vec![0.0f32; BLOCK_Q * BLOCK_K];
    let mut dp = vec![0.0f32; BLOCK_Q * BLOCK_K];
    for k0 in (0..dims.seq_k).step_by(BLOCK_K) {
        let bk = BLOCK_K.min(dims.seq_k - k0);
        let (k_tile, v_tile) = (&k[k0 * d..(k0 + bk) * d], &v[k0 * d..(k0 + bk) * d]);
        // First query row that sees key k0 under the causal mask.
        let q_start = if causal {
            (k0 + dims.seq_q).saturating_sub(dims.seq_k)
        } else {
            0
        };
        let q_start = q_start - q_start % BLOCK_Q;
        for q0 in (q_start..dims.seq_q).step_by(BLOCK_Q) {
            let bq = BLOCK_Q.min(dims.seq_q - q0);
            let (q_tile, do_tile) = (&q[q0 * d..(q0 + bq) * d], &dout[q0 * d..(q0 + bq) * d]);
            let p_tile = &mut p[..bq * bk];
            matmul_serial(
                MatmulSpec::new(bq, d, bk).trans_b(true),
                q_tile,
                k_tile,
                p_tile,
            );
            for r in 0..bq {
                let vis = dims.visible(q0 + r, causal).saturating_sub(k0).min(bk);
                let row = &mut p_tile[r * bk..(r + 1) * bk];
                let l = lse[q0 + r];
                for x in row[..vis].iter_mut() {
                    *x = (*x * scale - l).exp();
                }
                row[vis..].fill(0.0);
            }
            // dV_tile += Pᵀ · dO
            matmul_serial(
                MatmulSpec::new(bk, bq, d).trans_a(true).accumulate(true),
                p_tile,
                do_tile,
                &mut dv[k0 * d..(k0 + bk) * d],
            );
            // dP = dO · V_tileᵀ
            let dp_tile = &mut dp[..bq * bk];
            matmul_serial(
                MatmulSpec::new(bq, d, bk).trans_b(true),
                do_tile,
                v_tile,
                dp_tile,
            );
            // dS = P ⊙ (dP − D), pre-multiplied by scale
            for r in 0..bq {
                let di = dsum[q0 + r];
                for (ds, &pv) in dp_tile[r * bk..(r + 1) * bk]
                    .iter_mut()
                    .zip(&p_tile[r * bk..(r + 1) * bk])
                {
                    *ds = pv * (*ds - di) * scale;
                }
            }
            // dQ_tile += dS · K_tile
            matmul_serial(
                MatmulSpec::new(bq, bk, d).accumulate(true),
                dp_tile,
                k_tile,
                &mut dq[q0 * d..(q0 + bq) * d],
            );
            // dK_tile += dSᵀ · Q_tile
            matmul_serial(
                MatmulSpec::new(bk, bq, d).trans_a(true).accumulate(true),
                dp_tile,
                q_tile,
                &mut dk[k0 * d..(k0 + bk) * d],
            );
        }
    }
}
