//! The counter-based dropout mask (Philox4x32-10), the dropout kernel, and FlashAttention-2 with
//! attention dropout against an f64 reference that applies the same mask.

#![allow(clippy::needless_range_loop)] // index loops mirror the math in the reference

mod common;

use common::{hash, vec_from_seed};
use riftco_kernels::attention::{
    flash_attention_backward_with_dropout, flash_attention_backward_with_layout,
    flash_attention_forward_with_dropout, flash_attention_forward_with_layout, AttentionDims,
    AttentionLayout,
};
use riftco_kernels::{dropout, philox4x32_10, DropoutMask};

const CHILD_ENV: &str = "RIFTCO_DROPOUT_DETERMINISM_CHILD";

fn mask(p: f32, seed: u32) -> DropoutMask {
    DropoutMask {
        p,
        key: [0x1234_5678 ^ seed, 0x9abc_def0],
        stream: [seed, 7],
        offset: 11,
    }
}

/// The three philox4x32 10 vectors of Random123's known-answer file (`examples/kat_vectors` in
/// the Random123 distribution, github.com/DEShawResearch/random123), columns CTR (4 words),
/// KEY (2 words), EXPECTED (4 words):
/// ```text
/// philox4x32 10 00000000 00000000 00000000 00000000 00000000 00000000   6627e8d5 e169c58d bc57ac4c 9b00dbd8
/// philox4x32 10 ffffffff ffffffff ffffffff ffffffff ffffffff ffffffff   408f276d 41c83b0e a20bc7c6 6d5451fd
/// philox4x32 10 243f6a88 85a308d3 13198a2e 03707344 a4093822 299f31d0   d16cfe09 94fdcceb 5001e420 24126ea1
/// ```
#[test]
fn philox_matches_random123_known_answers() {
    let kats: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
        (
            [0; 4],
            [0; 2],
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8],
        ),
        (
            [u32::MAX; 4],
            [u32::MAX; 2],
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd],
        ),
        (
            [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
            [0xa4093822, 0x299f31d0],
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1],
        ),
    ];
    for (counter, key, want) in kats {
        assert_eq!(philox4x32_10(counter, key), want, "counter {counter:08x?}");
    }
}

/// Element `e` reads word `e % 4` of block `offset + e / 4` with counter
/// `[n lo, n hi, stream0, stream1]`, and is kept iff `(x >> 8) · 2⁻²⁴ >= p`.
#[test]
fn keep_follows_the_mask_contract() {
    let m = DropoutMask {
        p: 0.3,
        key: [5, 6],
        stream: [8, 9],
        offset: (1 << 32) - 1,
    };
    for e in [0u64, 1, 3, 4, 5, 6, 7, 1001, u32::MAX as u64 * 4 + 3] {
        let n = m.offset + e / 4;
        let x = philox4x32_10([n as u32, (n >> 32) as u32, 8, 9], [5, 6])[(e % 4) as usize];
        let u = (x >> 8) as f64 / (1u64 << 24) as f64;
        assert_eq!(m.keep(e), u >= 0.3f32 as f64, "element {e}");
    }
    // Shifting the offset by one block shifts the mask by four elements.
    let shifted = DropoutMask {
        offset: m.offset + 1,
        ..m
    };
    for e in 0..64 {
        assert_eq!(m.keep(e + 4), shifted.keep(e), "element {e}");
    }
    // Keys and streams select different masks.
    for other in [
        DropoutMask { key: [5, 7], ..m },
        DropoutMask {
            stream: [8, 10],
            ..m
        },
    ] {
        let differ = (0..256).filter(|&e| m.keep(e) != other.keep(e)).count();
        assert!(differ > 50, "{differ} of 256 elements differ for {other:?}");
    }
}

#[test]
fn kept_fraction_and_values() {
    let n = 1_000_000;
    let x = vec_from_seed(n, 3, 4.0);
    for p in [0.1f32, 0.5] {
        let m = mask(p, 1);
        let mut out = vec![f32::NAN; n];
        dropout(&x, &mut out, &m);
        let scale = 1.0f32 / (1.0 - p);
        let mut kept = 0usize;
        for e in 0..n {
            if m.keep(e as u64) {
                kept += 1;
                assert_eq!(out[e].to_bits(), (x[e] * scale).to_bits(), "p {p} e {e}");
            } else {
                assert_eq!(out[e].to_bits(), 0f32.to_bits(), "p {p} e {e} dropped");
            }
        }
        let frac = kept as f64 / n as f64;
        let want = 1.0 - p as f64;
        let se = (p as f64 * want / n as f64).sqrt();
        assert!(
            (frac - want).abs() <= 4.0 * se,
            "p {p}: kept fraction {frac}, expected {want} ± 4·{se}"
        );
    }
}

#[test]
fn p_zero_is_the_identity() {
    let x = vec_from_seed(10_001, 4, 3.0);
    let mut out = vec![f32::NAN; x.len()];
    dropout(&x, &mut out, &mask(0.0, 2));
    assert_eq!(
        out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        x.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}

/// `apply` from any start, and the kernel over any length, agree with `keep` element by element:
/// the result cannot depend on how work is split.
#[test]
fn every_split_gives_the_same_mask() {
    let m = mask(0.5, 3);
    let x = vec_from_seed(70_003, 5, 1.0);
    let mut whole = vec![0.0; x.len()];
    dropout(&x, &mut whole, &m);
    for (start, len) in [(0, 1), (1, 2), (3, 5), (4, 4), (6, 13), (40_001, 30_002)] {
        let mut part = vec![0.0; len];
        m.apply(start as u64, &x[start..start + len], &mut part);
        assert_eq!(part, whole[start..start + len], "start {start} len {len}");
    }
}

fn dims(batch: usize, n_heads: usize, seq_q: usize, seq_k: usize, d_head: usize) -> AttentionDims {
    AttentionDims {
        batch,
        n_heads,
        n_kv_heads: n_heads,
        seq_q,
        seq_k,
        d_head,
    }
}

/// Row offset of `(b, h, t)` with `seq` rows per head in `layout`.
fn row(d: AttentionDims, layout: AttentionLayout, pair: usize, t: usize, seq: usize) -> usize {
    let (b, h) = (pair / d.n_heads, pair % d.n_heads);
    match layout {
        AttentionLayout::BatchHeadSeq => (pair * seq + t) * d.d_head,
        AttentionLayout::BatchSeqHead => ((b * seq + t) * d.n_heads + h) * d.d_head,
    }
}

/// f64 attention with dropout in `layout` (same layout in and out): `(out, dq, dk, dv)` for
/// upstream `dout`, with `dS = P ⊙ (dP − Σ_j P dP)` computed directly (not through
/// `rowsum(dO ⊙ O)`).
#[allow(clippy::too_many_arguments)]
fn reference(
    d: AttentionDims,
    layout: AttentionLayout,
    causal: bool,
    m: &DropoutMask,
    [q, k, v, dout]: [&[f32]; 4],
    scale: f64,
) -> [Vec<f64>; 4] {
    let (sq, sk, dh) = (d.seq_q, d.seq_k, d.d_head);
    let z = m.scale() as f64;
    let (mut out, mut dq) = (vec![0.0; q.len()], vec![0.0; q.len()]);
    let (mut dk, mut dv) = (vec![0.0; k.len()], vec![0.0; k.len()]);
    for pair in 0..d.batch * d.n_heads {
        for i in 0..sq {
            let qi = row(d, layout, pair, i, sq);
            let allowed = |j: usize| !causal || j + sq <= i + sk;
            let s: Vec<f64> = (0..sk)
                .map(|j| {
                    let kj = row(d, layout, pair, j, sk);
                    if allowed(j) {
                        scale
                            * (0..dh)
                                .map(|c| q[qi + c] as f64 * k[kj + c] as f64)
                                .sum::<f64>()
                    } else {
                        f64::NEG_INFINITY
                    }
                })
                .collect();
            let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            if mx == f64::NEG_INFINITY {
                continue;
            }
            let den: f64 = s.iter().map(|x| (x - mx).exp()).sum();
            let p: Vec<f64> = s.iter().map(|x| (x - mx).exp() / den).collect();
            let zz: Vec<f64> = (0..sk)
                .map(|j| {
                    let e = ((pair * sq + i) * sk + j) as u64;
                    if m.keep(e) {
                        z
                    } else {
                        0.0
                    }
                })
                .collect();
            let mut dp = vec![0.0; sk];
            for j in 0..sk {
                let kj = row(d, layout, pair, j, sk);
                for c in 0..dh {
                    out[qi + c] += p[j] * zz[j] * v[kj + c] as f64;
                    dv[kj + c] += p[j] * zz[j] * dout[qi + c] as f64;
                    dp[j] += dout[qi + c] as f64 * v[kj + c] as f64 * zz[j];
                }
            }
            let delta: f64 = (0..sk).map(|j| p[j] * dp[j]).sum();
            for j in 0..sk {
                let ds = p[j] * (dp[j] - delta) * scale;
                let kj = row(d, layout, pair, j, sk);
                for c in 0..dh {
                    dq[qi + c] += ds * k[kj + c] as f64;
                    dk[kj + c] += ds * q[qi + c] as f64;
                }
            }
        }
    }
    [out, dq, dk, dv]
}

#[allow(clippy::type_complexity)]
fn flash(
    d: AttentionDims,
    layout: AttentionLayout,
    causal: bool,
    m: Option<&DropoutMask>,
    [q, k, v, dout]: [&[f32]; 4],
    scale: f32,
) -> ([Vec<f32>; 4], Vec<f32>) {
    let (mut out, mut lse) = (vec![7.0; q.len()], vec![7.0; d.batch * d.n_heads * d.seq_q]);
    flash_attention_forward_with_dropout(q, k, v, d, layout, scale, causal, m, &mut out, &mut lse);
    let (mut dq, mut dk, mut dv) = (vec![9.0; q.len()], vec![9.0; k.len()], vec![9.0; k.len()]);
    flash_attention_backward_with_dropout(
        q, k, v, &out, &lse, dout, d, layout, scale, causal, m, &mut dq, &mut dk, &mut dv,
    );
    ([out, dq, dk, dv], lse)
}

fn inputs(d: AttentionDims, seed: u64) -> [Vec<f32>; 4] {
    let nq = d.batch * d.n_heads * d.seq_q * d.d_head;
    let nk = d.batch * d.n_heads * d.seq_k * d.d_head;
    [
        vec_from_seed(nq, seed, 1.0),
        vec_from_seed(nk, seed + 1, 1.0),
        vec_from_seed(nk, seed + 2, 1.0),
        vec_from_seed(nq, seed + 3, 1.0),
    ]
}

#[test]
fn flash_with_dropout_matches_the_f64_reference() {
    let cases = [
        (dims(1, 1, 1, 1, 1), true),
        (dims(2, 3, 5, 7, 3), true),
        (dims(1, 2, 7, 7, 5), false),
        (dims(1, 1, 1, 9, 4), true),
        // Query and key counts that are not multiples of the tiles (64 and 256).
        (dims(1, 2, 70, 300, 8), true),
        (dims(2, 1, 130, 130, 16), true),
    ];
    for (d, causal) in cases {
        for layout in [AttentionLayout::BatchHeadSeq, AttentionLayout::BatchSeqHead] {
            for p in [0.1f32, 0.5] {
                let m = mask(p, 9);
                let [q, k, v, g] = inputs(d, 21);
                let scale = 1.0 / (d.d_head as f32).sqrt();
                let x = [&q[..], &k[..], &v[..], &g[..]];
                let (got, lse) = flash(d, layout, causal, Some(&m), x, scale);
                let want = reference(d, layout, causal, &m, x, scale as f64);
                for (name, g, w) in ["out", "dq", "dk", "dv"]
                    .iter()
                    .zip(&got)
                    .zip(&want)
                    .map(|((n, g), w)| (n, g, w))
                {
                    let big = w.iter().fold(1.0f64, |a, x| a.max(x.abs()));
                    for (e, (&a, &b)) in g.iter().zip(w).enumerate() {
                        assert!(
                            (a as f64 - b).abs() <= 1e-4 * big,
                            "{d:?} {layout:?} causal {causal} p {p}: {name}[{e}] = {a}, \
                             reference {b}"
                        );
                    }
                }
                // The logsumexp is that of the undropped probabilities.
                let (_, lse0) = flash(d, layout, causal, None, x, scale);
                assert_eq!(lse, lse0, "{d:?} {layout:?}: lse with dropout");
            }
        }
    }
}

/// `None` and `p == 0` run the no-dropout kernels, bitwise.
#[test]
fn no_dropout_is_bitwise_the_plain_kernel() {
    let d = dims(2, 2, 70, 90, 8);
    let [q, k, v, g] = inputs(d, 31);
    for layout in [AttentionLayout::BatchHeadSeq, AttentionLayout::BatchSeqHead] {
        let (mut out, mut lse) = (vec![0.0; q.len()], vec![0.0; 2 * 2 * 70]);
        flash_attention_forward_with_layout(&q, &k, &v, d, layout, 0.3, true, &mut out, &mut lse);
        let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; k.len()]);
        flash_attention_backward_with_layout(
            &q, &k, &v, &out, &lse, &g, d, layout, 0.3, true, &mut dq, &mut dk, &mut dv,
        );
        let x = [&q[..], &k[..], &v[..], &g[..]];
        for m in [None, Some(&mask(0.0, 4))] {
            let (got, got_lse) = flash(d, layout, true, m, x, 0.3);
            assert_eq!(got, [out.clone(), dq.clone(), dk.clone(), dv.clone()]);
            assert_eq!(got_lse, lse);
        }
        // A real mask changes the output (the test above is not vacuous).
        let (got, _) = flash(d, layout, true, Some(&mask(0.5, 4)), x, 0.3);
        assert_ne!(got[0], out);
    }
}

/// Prints `HASH name value` lines for the dropout kernel and flash attention with dropout at
/// sizes that take the parallel paths (only when launched as the child).
#[test]
fn dropout_determinism_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let x = vec_from_seed(1_000_003, 1, 2.0);
    let mut out = vec![0.0; x.len()];
    dropout(&x, &mut out, &mask(0.25, 5));
    println!("HASH dropout {:016x}", hash(&out));
    let d = dims(2, 4, 200, 200, 32);
    let [q, k, v, g] = inputs(d, 41);
    for layout in [AttentionLayout::BatchHeadSeq, AttentionLayout::BatchSeqHead] {
        let (r, lse) = flash(d, layout, true, Some(&mask(0.2, 6)), [&q, &k, &v, &g], 0.2);
        let h = r.iter().enumerate().fold(hash(&lse), |a, (i, t)| {
            a ^ hash(t).rotate_left(7 * i as u32 + 1)
        });
        println!("HASH flash_dropout_{layout:?} {h:016x}");
    }
}

fn child_hashes(threads: usize) -> Vec<String> {
    let lines = common::child_hashes("dropout_determinism_child", CHILD_ENV, threads);
    assert_eq!(lines.len(), 3, "child printed {lines:?}");
    lines
}

/// The kernel pool's size is fixed per process (`RIFTCO_NUM_THREADS`; installing the kernels
/// inside another rayon pool would not change it), so the mask's thread independence is checked
/// on child processes with 1 and 2 kernel threads.
#[test]
fn dropout_bitwise_identical_with_one_and_two_threads() {
    assert_eq!(child_hashes(1), child_hashes(2));
}
