//! FlashAttention-2 kernels against a naive f64 reference (forward output, logsumexp and all
//! three gradients), causal and not, with sequences that are not tile multiples and with
//! seq_q < seq_k, for multi-head and grouped-query attention (the reference repeats K/V heads
//! as Hugging Face's `repeat_kv` does: query head `h` reads key/value head
//! `h / (n_heads / n_kv_heads)`).

use riftco_kernels::attention::{
    flash_attention_backward, flash_attention_backward_with_layout, flash_attention_forward,
    flash_attention_forward_with_layout, AttentionDims, AttentionLayout,
};

/// xorshift64* uniform values in [-1, 1).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
        x as f32 / (1u64 << 23) as f32 - 1.0
    }
}

fn rand_vec(n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n).map(|_| rng.next()).collect()
}

struct Reference {
    out: Vec<f64>,
    lse: Vec<f64>,
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
}

/// Plain O(n²) attention and its gradients in f64.
fn reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dout: &[f32],
    dims: AttentionDims,
    scale: f64,
    causal: bool,
) -> Reference {
    let AttentionDims {
        batch,
        n_heads,
        n_kv_heads,
        seq_q,
        seq_k,
        d_head: d,
    } = dims;
    let pairs = batch * n_heads;
    let mut r = Reference {
        out: vec![0.0; q.len()],
        lse: vec![0.0; pairs * seq_q],
        dq: vec![0.0; q.len()],
        dk: vec![0.0; k.len()],
        dv: vec![0.0; k.len()],
    };
    for p in 0..pairs {
        // repeat_kv: query head h of batch entry b reads key/value head h / (n_heads / n_kv).
        let kv = (p / n_heads) * n_kv_heads + (p % n_heads) / (n_heads / n_kv_heads);
        let (qo, ko) = (p * seq_q * d, kv * seq_k * d);
        for i in 0..seq_q {
            let vis = if causal {
                (i + seq_k - seq_q + 1).min(seq_k)
            } else {
                seq_k
            };
            let s: Vec<f64> = (0..vis)
                .map(|j| {
                    (0..d)
                        .map(|c| q[qo + i * d + c] as f64 * k[ko + j * d + c] as f64)
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
            r.lse[p * seq_q + i] = m + z.ln();
            let pr: Vec<f64> = s.iter().map(|x| (x - m).exp() / z).collect();
            for c in 0..d {
                r.out[qo + i * d + c] = (0..vis).map(|j| pr[j] * v[ko + j * d + c] as f64).sum();
            }
            // gradients
            let g = &dout[qo + i * d..qo + (i + 1) * d];
            let dp: Vec<f64> = (0..vis)
                .map(|j| (0..d).map(|c| g[c] as f64 * v[ko + j * d + c] as f64).sum())
                .collect();
            let dot: f64 = (0..vis).map(|j| pr[j] * dp[j]).sum();
            for j in 0..vis {
                let ds = pr[j] * (dp[j] - dot) * scale;
                for c in 0..d {
                    r.dv[ko + j * d + c] += pr[j] * g[c] as f64;
                    r.dq[qo + i * d + c] += ds * k[ko + j * d + c] as f64;
                    r.dk[ko + j * d + c] += ds * q[qo + i * d + c] as f64;
                }
            }
        }
    }
    r
}

fn max_err(a: &[f32], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y).abs())
        .fold(0.0, f64::max)
}

fn check(dims: AttentionDims, causal: bool, seed: u64) {
    let mut rng = Rng::new(seed);
    let nq = dims.batch * dims.n_heads * dims.seq_q * dims.d_head;
    let nk = dims.batch * dims.n_kv_heads * dims.seq_k * dims.d_head;
    let (q, k, v, dout) = (
        rand_vec(nq, &mut rng),
        rand_vec(nk, &mut rng),
        rand_vec(nk, &mut rng),
        rand_vec(nq, &mut rng),
    );
    let scale = 1.0 / (dims.d_head as f32).sqrt();
    let mut out = vec![0.0; nq];
    let mut lse = vec![0.0; dims.batch * dims.n_heads * dims.seq_q];
    flash_attention_forward(&q, &k, &v, dims, scale, causal, &mut out, &mut lse);
    let r = reference(&q, &k, &v, &dout, dims, scale as f64, causal);
    // f32 accumulation over up to a few hundred keys: 1e-5 absolute on O(1) values.
    assert!(
        max_err(&out, &r.out) < 1e-5,
        "out {dims:?} causal {causal}: {}",
        max_err(&out, &r.out)
    );
    assert!(
        max_err(&lse, &r.lse) < 1e-5,
        "lse {dims:?}: {}",
        max_err(&lse, &r.lse)
    );
    let (mut dq, mut dk, mut dv) = (vec![1.0; nq], vec![1.0; nk], vec![1.0; nk]);
    flash_attention_backward(
        &q, &k, &v, &out, &lse, &dout, dims, scale, causal, &mut dq, &mut dk, &mut dv,
    );
    for (name, got, want) in [("dq", &dq, &r.dq), ("dk", &dk, &r.dk), ("dv", &dv, &r.dv)] {
        let e = max_err(got, want);
        assert!(e < 5e-5, "{name} {dims:?} causal {causal}: max error {e}");
    }
}

#[test]
fn matches_f64_reference_causal_and_full() {
    for (seq_q, seq_k) in [
        (1, 1),
        (7, 7),
        (64, 64),
        (65, 65),
        (130, 130),
        (3, 70),
        (1, 100),
    ] {
        for causal in [true, false] {
            let dims = AttentionDims {
                batch: 2,
                n_heads: 3,
                n_kv_heads: 3,
                seq_q,
                seq_k,
                d_head: 8,
            };
            check(dims, causal, (seq_q * 1000 + seq_k) as u64);
        }
    }
}

#[test]
fn d_head_32_at_training_size() {
    let dims = AttentionDims {
        batch: 1,
        n_heads: 2,
        n_kv_heads: 2,
        seq_q: 256,
        seq_k: 256,
        d_head: 32,
    };
    check(dims, true, 5);
}

#[test]
fn grouped_query_attention_matches_f64_reference() {
    // n_heads 4 with 2 and 1 key/value heads, odd sequence lengths, seq_q < seq_k, and one case
    // longer than a tile (several key tiles per query head in the backward).
    for n_kv_heads in [2, 1] {
        for (seq_q, seq_k) in [(1, 1), (7, 7), (5, 9), (67, 67), (3, 70)] {
            for causal in [true, false] {
                let dims = AttentionDims {
                    batch: 2,
                    n_heads: 4,
                    n_kv_heads,
                    seq_q,
                    seq_k,
                    d_head: 6,
                };
                check(dims, causal, (seq_q * 100 + seq_k + n_kv_heads) as u64);
            }
        }
    }
}

/// `[batch, heads, seq, d]` → `[batch, seq, heads, d]`.
fn to_bsh(x: &[f32], batch: usize, heads: usize, seq: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    for b in 0..batch {
        for h in 0..heads {
            for t in 0..seq {
                let src = ((b * heads + h) * seq + t) * d;
                let dst = ((b * seq + t) * heads + h) * d;
                out[dst..dst + d].copy_from_slice(&x[src..src + d]);
            }
        }
    }
    out
}

/// The `[batch, seq, heads, d_head]` layout (the one the transformer uses) maps query heads to
/// key/value heads like the head-major layout: the same values bit for bit after transposing.
#[test]
fn grouped_query_attention_batch_seq_head_layout_equals_head_major() {
    let dims = AttentionDims {
        batch: 2,
        n_heads: 4,
        n_kv_heads: 2,
        seq_q: 9,
        seq_k: 13,
        d_head: 4,
    };
    let (b, h, kvh, sq, sk, d) = (2, 4, 2, 9, 13, 4);
    let mut rng = Rng::new(77);
    let (q, k, v, dout) = (
        rand_vec(b * h * sq * d, &mut rng),
        rand_vec(b * kvh * sk * d, &mut rng),
        rand_vec(b * kvh * sk * d, &mut rng),
        rand_vec(b * h * sq * d, &mut rng),
    );
    let scale = 0.5;
    let run = |layout, q: &[f32], k: &[f32], v: &[f32], dout: &[f32]| {
        let mut out = vec![0.0; q.len()];
        let mut lse = vec![0.0; b * h * sq];
        flash_attention_forward_with_layout(q, k, v, dims, layout, scale, true, &mut out, &mut lse);
        let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; k.len()]);
        flash_attention_backward_with_layout(
            q, k, v, &out, &lse, dout, dims, layout, scale, true, &mut dq, &mut dk, &mut dv,
        );
        (out, lse, dq, dk, dv)
    };
    let hs = run(AttentionLayout::BatchHeadSeq, &q, &k, &v, &dout);
    let sh = run(
        AttentionLayout::BatchSeqHead,
        &to_bsh(&q, b, h, sq, d),
        &to_bsh(&k, b, kvh, sk, d),
        &to_bsh(&v, b, kvh, sk, d),
        &to_bsh(&dout, b, h, sq, d),
    );
    assert_eq!(to_bsh(&hs.0, b, h, sq, d), sh.0);
    assert_eq!(hs.1, sh.1);
    assert_eq!(to_bsh(&hs.2, b, h, sq, d), sh.2);
    assert_eq!(to_bsh(&hs.3, b, kvh, sk, d), sh.3);
    assert_eq!(to_bsh(&hs.4, b, kvh, sk, d), sh.4);
}
