//! FlashAttention-2 forward/backward and the masked softmax helper against a naive f64
//! attention, plus central finite differences (f64) of a scalar loss on a tiny case.
//!
//! Error bounds (U = 2^-24): a score carries `(d + 4)U·a` absolute error where
//! `a = scale·max_j Σ_d |q_d k_jd|`; probabilities add the exp and row-sum errors
//! (`(BLOCK_K + 2·tiles + 8)U` relative). We assert, per element,
//! `|err| <= K·U·(1 + a)·M` with `K = 3d + seq_k + 100` and `M` the same expression as the
//! reference evaluated on absolute values (e.g. `Σ_j p_j |v_j|` for the output).

#![allow(clippy::needless_range_loop)] // index loops mirror the math in the references

mod common;

use common::{vec_from_seed, U};
use proptest::prelude::*;
use riftco_kernels::attention::{
    causal_softmax_rows, flash_attention_backward, flash_attention_backward_with_layout,
    flash_attention_forward, flash_attention_forward_with_layout, AttentionDims, AttentionLayout,
};

/// `[batch, heads, seq, d] → [batch, seq, heads, d]` (or back, with `to_bshd == false`).
fn relayout(x: &[f32], d: AttentionDims, seq: usize, to_bshd: bool) -> Vec<f32> {
    let (h, dh) = (d.n_heads, d.d_head);
    let mut y = vec![0.0; x.len()];
    for b in 0..d.batch {
        for hh in 0..h {
            for t in 0..seq {
                let bhsd = ((b * h + hh) * seq + t) * dh;
                let bshd = ((b * seq + t) * h + hh) * dh;
                let (from, to) = if to_bshd { (bhsd, bshd) } else { (bshd, bhsd) };
                y[to..to + dh].copy_from_slice(&x[from..from + dh]);
            }
        }
    }
    y
}

/// Forward and backward in `layout`, with inputs and results in the head-major layout.
#[allow(clippy::type_complexity)]
fn run_in_layout(
    d: AttentionDims,
    layout: AttentionLayout,
    causal: bool,
    [q, k, v, dout]: [&[f32]; 4],
    scale: f32,
) -> (Vec<f32>, Vec<f32>, [Vec<f32>; 3]) {
    let (sq, sk) = (d.seq_q, d.seq_k);
    let seq_major = layout == AttentionLayout::BatchSeqHead;
    let to = |x: &[f32], seq| {
        if seq_major {
            relayout(x, d, seq, true)
        } else {
            x.to_vec()
        }
    };
    let back = |x: &[f32], seq| {
        if seq_major {
            relayout(x, d, seq, false)
        } else {
            x.to_vec()
        }
    };
    let (q, k, v, dout) = (to(q, sq), to(k, sk), to(v, sk), to(dout, sq));
    let (mut out, mut lse) = (vec![7.0; q.len()], vec![7.0; d.batch * d.n_heads * sq]);
    flash_attention_forward_with_layout(&q, &k, &v, d, layout, scale, causal, &mut out, &mut lse);
    let (mut dq, mut dk, mut dv) = (vec![9.0; q.len()], vec![9.0; k.len()], vec![9.0; k.len()]);
    flash_attention_backward_with_layout(
        &q, &k, &v, &out, &lse, &dout, d, layout, scale, causal, &mut dq, &mut dk, &mut dv,
    );
    (
        back(&out, sq),
        lse,
        [back(&dq, sq), back(&dk, sk), back(&dv, sk)],
    )
}

struct Ref {
    out: Vec<f64>,
    out_abs: Vec<f64>,
    lse: Vec<f64>,
    probs: Vec<f64>,
    a: Vec<f64>,
}

fn allowed(d: AttentionDims, i: usize, j: usize, causal: bool) -> bool {
    !causal || (j as isize) <= i as isize + d.seq_k as isize - d.seq_q as isize
}

fn reference(q: &[f32], k: &[f32], v: &[f32], d: AttentionDims, scale: f64, causal: bool) -> Ref {
    let (sq, sk, dh) = (d.seq_q, d.seq_k, d.d_head);
    let pairs = d.batch * d.n_heads;
    let mut r = Ref {
        out: vec![0.0; pairs * sq * dh],
        out_abs: vec![0.0; pairs * sq * dh],
        lse: vec![f64::NEG_INFINITY; pairs * sq],
        probs: vec![0.0; pairs * sq * sk],
        a: vec![0.0; pairs * sq],
    };
    for p in 0..pairs {
        for i in 0..sq {
            let row = p * sq + i;
            let qi = &q[row * dh..(row + 1) * dh];
            let mut s = vec![f64::NEG_INFINITY; sk];
            for j in 0..sk {
                let kj = &k[(p * sk + j) * dh..(p * sk + j + 1) * dh];
                let abs: f64 = qi
                    .iter()
                    .zip(kj)
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum();
                r.a[row] = r.a[row].max(scale * abs);
                if allowed(d, i, j, causal) {
                    s[j] = scale
                        * qi.iter()
                            .zip(kj)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>();
                }
            }
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            if m == f64::NEG_INFINITY {
                continue;
            }
            let z: f64 = s.iter().map(|&x| (x - m).exp()).sum();
            r.lse[row] = m + z.ln();
            for j in 0..sk {
                let pj = (s[j] - m).exp() / z;
                r.probs[row * sk + j] = pj;
                for c in 0..dh {
                    let vv = v[(p * sk + j) * dh + c] as f64;
                    r.out[row * dh + c] += pj * vv;
                    r.out_abs[row * dh + c] += pj * vv.abs();
                }
            }
        }
    }
    r
}

/// Reference gradients and their absolute-value counterparts (for the bounds).
#[allow(clippy::type_complexity)]
fn reference_grads(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dout: &[f32],
    d: AttentionDims,
    scale: f64,
    r: &Ref,
) -> [(Vec<f64>, Vec<f64>); 3] {
    let (sq, sk, dh) = (d.seq_q, d.seq_k, d.d_head);
    let pairs = d.batch * d.n_heads;
    let mut g = [(); 3].map(|_| (vec![0.0; 0], vec![0.0; 0]));
    g[0] = (vec![0.0; q.len()], vec![0.0; q.len()]);
    g[1] = (vec![0.0; k.len()], vec![0.0; k.len()]);
    g[2] = (vec![0.0; v.len()], vec![0.0; v.len()]);
    let f = |x: &[f32], i: usize| x[i] as f64;
    for p in 0..pairs {
        for i in 0..sq {
            let row = p * sq + i;
            let dp: Vec<f64> = (0..sk)
                .map(|j| {
                    (0..dh)
                        .map(|c| f(dout, row * dh + c) * f(v, (p * sk + j) * dh + c))
                        .sum()
                })
                .collect();
            let dp_abs: Vec<f64> = (0..sk)
                .map(|j| {
                    (0..dh)
                        .map(|c| (f(dout, row * dh + c) * f(v, (p * sk + j) * dh + c)).abs())
                        .sum()
                })
                .collect();
            let pr = &r.probs[row * sk..(row + 1) * sk];
            let delta: f64 = (0..sk).map(|j| pr[j] * dp[j]).sum();
            let delta_abs: f64 = (0..sk).map(|j| pr[j] * dp_abs[j]).sum();
            for j in 0..sk {
                let ds = pr[j] * (dp[j] - delta);
                let ds_abs = pr[j] * (dp_abs[j] + delta_abs);
                for c in 0..dh {
                    let (qi, kj) = (row * dh + c, (p * sk + j) * dh + c);
                    g[0].0[qi] += scale * ds * f(k, kj);
                    g[0].1[qi] += scale * ds_abs * f(k, kj).abs();
                    g[1].0[kj] += scale * ds * f(q, qi);
                    g[1].1[kj] += scale * ds_abs * f(q, qi).abs();
                    g[2].0[kj] += pr[j] * f(dout, qi);
                    g[2].1[kj] += pr[j] * f(dout, qi).abs();
                }
            }
        }
    }
    g
}

fn check_case(d: AttentionDims, causal: bool, seed: u64) {
    let (nq, nk) = (
        d.batch * d.n_heads * d.seq_q * d.d_head,
        d.batch * d.n_heads * d.seq_k * d.d_head,
    );
    let q = vec_from_seed(nq, seed, 1.5);
    let k = vec_from_seed(nk, seed ^ 1, 1.5);
    let v = vec_from_seed(nk, seed ^ 2, 1.0);
    let dout = vec_from_seed(nq, seed ^ 3, 1.0);
    let scale = 1.0 / (d.d_head as f32).sqrt();
    let r = reference(&q, &k, &v, d, scale as f64, causal);
    let g = reference_grads(&q, &k, &v, &dout, d, scale as f64, &r);
    let kc = (3 * d.d_head + d.seq_k + 100) as f64 * U;
    let dh = d.d_head;
    let amax = r.a.iter().cloned().fold(0.0, f64::max);
    // Both memory layouts against the same f64 reference.
    for layout in [AttentionLayout::BatchHeadSeq, AttentionLayout::BatchSeqHead] {
        let (out, lse, grads) = run_in_layout(d, layout, causal, [&q, &k, &v, &dout], scale);
        let tag = |what: &str| format!("{what} ({layout:?})");
        common::assert_close(&tag("flash.out"), &out, &r.out, |i| {
            kc * (1.0 + r.a[i / dh]) * r.out_abs[i] + 1e-30
        });
        common::assert_close(&tag("flash.lse"), &lse, &r.lse, |i| {
            kc * (1.0 + r.a[i]) + U * r.lse[i].abs()
        });
        for (name, got, (want, abs)) in [
            ("dq", &grads[0], &g[0]),
            ("dk", &grads[1], &g[1]),
            ("dv", &grads[2], &g[2]),
        ] {
            common::assert_close(&tag(name), got, want, |i| {
                2.0 * kc * (1.0 + amax) * abs[i] + 1e-30
            });
        }
    }
    // The materialised helper on the same scores.
    let rows = d.batch * d.n_heads * d.seq_q;
    let mut scores = vec![0.0f32; rows * d.seq_k];
    for row in 0..rows {
        let p = row / d.seq_q;
        for j in 0..d.seq_k {
            scores[row * d.seq_k + j] = (0..dh)
                .map(|c| q[row * dh + c] * k[(p * d.seq_k + j) * dh + c])
                .sum();
        }
    }
    let mut probs = vec![0.0; scores.len()];
    causal_softmax_rows(&scores, d, scale, causal, &mut probs);
    let sk = d.seq_k;
    common::assert_close("causal_softmax_rows", &probs, &r.probs, |i| {
        kc * (1.0 + r.a[i / sk]) * r.probs[i]
    });
    for (i, &p) in probs.iter().enumerate() {
        let (row, j) = (i / sk, i % sk);
        if !allowed(d, row % d.seq_q, j, causal) {
            assert_eq!(p, 0.0, "masked probability must be exactly 0");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn flash_attention_matches_reference(batch in 1usize..3, heads in 1usize..3, seq_q in 1usize..140,
                                         seq_k in 1usize..140, d_head in prop_oneof![Just(1usize), Just(8), Just(13), Just(32), Just(64)],
                                         causal in any::<bool>(), seed in any::<u64>()) {
        check_case(AttentionDims { batch, n_heads: heads, n_kv_heads: heads, seq_q, seq_k, d_head }, causal, seed);
    }
}

#[test]
fn fixed_cases() {
    let mk = |seq_q, seq_k, d_head| AttentionDims {
        batch: 2,
        n_heads: 2,
        n_kv_heads: 2,
        seq_q,
        seq_k,
        d_head,
    };
    for (dims, causal) in [
        (mk(64, 64, 32), true),
        (mk(130, 130, 32), true), // not a multiple of the tile
        (mk(130, 130, 16), false),
        (mk(37, 150, 32), true), // seq_q < seq_k: the offset shifts the diagonal
        (mk(150, 37, 8), true),  // seq_q > seq_k: the first rows see no key
        (mk(1, 1, 4), true),
    ] {
        check_case(dims, causal, 42);
    }
}

/// Central finite differences (f64, on the naive f64 forward) of `L = Σ out ⊙ W` against the
/// kernel's gradients on a tiny causal case. Tolerance: FD truncation `O(h²)` with `h = 1e-4`
/// plus the f32 kernel's roundoff, `2e-4·(1 + |g|)`.
#[test]
fn gradients_match_finite_differences() {
    let d = AttentionDims {
        batch: 1,
        n_heads: 2,
        n_kv_heads: 2,
        seq_q: 5,
        seq_k: 7,
        d_head: 3,
    };
    let (nq, nk) = (2 * 5 * 3, 2 * 7 * 3);
    let q = vec_from_seed(nq, 7, 1.0);
    let k = vec_from_seed(nk, 8, 1.0);
    let v = vec_from_seed(nk, 9, 1.0);
    let w = vec_from_seed(nq, 10, 1.0);
    let scale = 0.6f32;
    let (mut out, mut lse) = (vec![0.0; nq], vec![0.0; 10]);
    flash_attention_forward(&q, &k, &v, d, scale, true, &mut out, &mut lse);
    let (mut dq, mut dk, mut dv) = (vec![0.0; nq], vec![0.0; nk], vec![0.0; nk]);
    flash_attention_backward(
        &q, &k, &v, &out, &lse, &w, d, scale, true, &mut dq, &mut dk, &mut dv,
    );
    // f64 forward on f64 inputs (the reference takes f32, so evaluate through a tiny f64 copy).
    let loss = |q: &[f64], k: &[f64], v: &[f64]| -> f64 {
        let mut total = 0.0;
        for p in 0..2 {
            for i in 0..5 {
                let row = p * 5 + i;
                let s: Vec<f64> = (0..7)
                    .map(|j| {
                        if j <= i + 2 {
                            scale as f64
                                * (0..3)
                                    .map(|c| q[row * 3 + c] * k[(p * 7 + j) * 3 + c])
                                    .sum::<f64>()
                        } else {
                            f64::NEG_INFINITY
                        }
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|&x| (x - m).exp()).sum();
                for c in 0..3 {
                    let o: f64 = (0..7)
                        .map(|j| (s[j] - m).exp() / z * v[(p * 7 + j) * 3 + c])
                        .sum();
                    total += o * w[row * 3 + c] as f64;
                }
            }
        }
        total
    };
    let to64 = |x: &[f32]| x.iter().map(|&a| a as f64).collect::<Vec<f64>>();
    let (q64, k64, v64) = (to64(&q), to64(&k), to64(&v));
    let h = 1e-4;
    for (which, grad) in [(0, &dq), (1, &dk), (2, &dv)] {
        for idx in 0..grad.len() {
            let mut args = [q64.clone(), k64.clone(), v64.clone()];
            args[which][idx] += h;
            let up = loss(&args[0], &args[1], &args[2]);
            args[which][idx] -= 2.0 * h;
            let down = loss(&args[0], &args[1], &args[2]);
            let fd = (up - down) / (2.0 * h);
            let g = grad[idx] as f64;
            assert!(
                (g - fd).abs() <= 2e-4 * (1.0 + fd.abs()),
                "grad {which}[{idx}]: kernel {g} vs fd {fd}"
            );
        }
    }
}
