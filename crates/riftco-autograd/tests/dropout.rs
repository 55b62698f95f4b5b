//! Dropout and attention with dropout: VJPs against central finite differences with the mask
//! held fixed, flash against materialized attention, the mirror backend, and argument errors.

#![allow(clippy::needless_range_loop)] // index loops mirror the math in the reference

mod common;

use common::{bits, gradcheck, rand};
use riftco_autograd::ops::{self, AttentionKind, AttentionLayout, DropoutMask};
use riftco_autograd::{AutogradError, Variable};
use riftco_tensor::backend::mirror;
use riftco_tensor::{Device, MemoryCategory as C, Tensor, TensorError};

fn mask(p: f32, seed: u32) -> DropoutMask {
    DropoutMask {
        p,
        key: [0xdead_beef, seed],
        stream: [3, seed],
        offset: 5,
    }
}

const LAYOUTS: [AttentionLayout; 2] =
    [AttentionLayout::BatchHeadSeq, AttentionLayout::BatchSeqHead];
const KINDS: [AttentionKind; 2] = [AttentionKind::Flash, AttentionKind::Materialized];

#[test]
fn dropout_vjp_matches_finite_differences() {
    for (shape, p) in [
        (&[3usize, 5][..], 0.3f32),
        (&[2, 3, 7][..], 0.5),
        (&[1][..], 0.1),
    ] {
        let m = mask(p, 1);
        gradcheck(|v| ops::dropout(&v[0], m), &[rand(shape, 2)], &[true]);
    }
}

/// Forward `x ⊙ M / (1 − p)` element by element, and the VJP `g ⊙ M / (1 − p)` exactly.
#[test]
fn dropout_forward_and_vjp_apply_the_mask() {
    let m = mask(0.4, 2);
    let x = Variable::leaf(rand(&[4, 33], 3), true);
    let y = ops::dropout(&x, m).unwrap();
    let g = rand(&[4, 33], 4);
    y.backward_with_grad(g.clone()).unwrap();
    let (xs, ys, gs, dx) = (
        x.value().to_vec(),
        y.value().to_vec(),
        g.to_vec(),
        x.grad().unwrap().to_vec(),
    );
    let mut dropped = 0;
    for e in 0..xs.len() {
        if m.keep(e as u64) {
            assert_eq!(ys[e], xs[e] * m.scale(), "y[{e}]");
            assert_eq!(dx[e], gs[e] * m.scale(), "dx[{e}]");
        } else {
            dropped += 1;
            assert_eq!((ys[e], dx[e]), (0.0, 0.0), "dropped element {e}");
        }
    }
    assert!(
        dropped > 20 && dropped < 110,
        "{dropped} of 132 dropped at p = 0.4"
    );
}

#[test]
fn dropout_with_p_zero_returns_the_input() {
    let x = Variable::leaf(rand(&[3, 4], 5), true);
    let y = ops::dropout(&x, mask(0.0, 3)).unwrap();
    assert_eq!(y.id(), x.id(), "p = 0 must not record a node");
}

fn assert_bad_p(r: Result<Variable, AutogradError>, p: f32, what: &str) {
    match r {
        Err(AutogradError::Tensor(TensorError::InvalidArgument { message, .. })) => {
            assert!(
                message.contains(&format!("p = {p}")) && message.contains("0 <= p < 1"),
                "{what}: message {message:?} does not name p = {p}"
            );
        }
        other => panic!("{what}: p = {p} gave {other:?}, expected InvalidArgument"),
    }
}

#[test]
fn invalid_p_is_an_invalid_argument_naming_p() {
    let x = Variable::leaf(rand(&[2, 3], 6), true);
    let q = Variable::leaf(rand(&[1, 2, 3, 4], 7), true);
    for p in [
        -0.1f32,
        1.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1.5,
    ] {
        assert_bad_p(ops::dropout(&x, mask(p, 1)), p, "dropout");
        for kind in KINDS {
            assert_bad_p(
                ops::causal_attention_with_dropout(
                    &q,
                    &q,
                    &q,
                    AttentionLayout::BatchHeadSeq,
                    kind,
                    Some(mask(p, 1)),
                ),
                p,
                &format!("{kind:?} attention"),
            );
        }
        assert_bad_p(
            ops::flash_attention_with_dropout(
                &q,
                &q,
                &q,
                AttentionLayout::BatchSeqHead,
                0.5,
                false,
                Some(mask(p, 1)),
            ),
            p,
            "flash_attention_with_dropout",
        );
    }
}

/// Flash attention with dropout refuses sizes whose `[b, h, sq, sk]` index space overflows
/// (the shapes are placeholders: no memory is allocated and no kernel runs).
#[test]
fn attention_dropout_index_overflow_is_an_error() {
    let big = 1usize << 33;
    let q = Variable::leaf(
        Tensor::placeholder([1, 1, big, 1], Device::Cpu, C::Activation).unwrap(),
        false,
    );
    let r = ops::causal_attention_with_dropout(
        &q,
        &q,
        &q,
        AttentionLayout::BatchHeadSeq,
        AttentionKind::Flash,
        Some(mask(0.1, 1)),
    );
    match r {
        Err(AutogradError::Tensor(TensorError::InvalidArgument { message, .. })) => {
            assert!(message.contains("8589934592"), "{message}")
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

/// Attention dimensions `(batch, heads, seq_q, seq_k, d_head)` and the tensor shapes in
/// `layout`.
type Dims = (usize, usize, usize, usize, usize);

fn shape(layout: AttentionLayout, (b, h, _, _, d): Dims, seq: usize) -> Vec<usize> {
    match layout {
        AttentionLayout::BatchHeadSeq => vec![b, h, seq, d],
        AttentionLayout::BatchSeqHead => vec![b, seq, h, d],
    }
}

/// Element offset of row `(pair, t)` with `seq` rows per head.
fn row(layout: AttentionLayout, (_, h, _, _, d): Dims, pair: usize, t: usize, seq: usize) -> usize {
    match layout {
        AttentionLayout::BatchHeadSeq => (pair * seq + t) * d,
        AttentionLayout::BatchSeqHead => (((pair / h) * seq + t) * h + pair % h) * d,
    }
}

/// f64 causal attention with the dropout mask `m` over `[b, h, sq, sk]`, scale `1/√d`, in
/// `layout`: `L = Σ out ⊙ w`.
fn reference_loss(
    layout: AttentionLayout,
    dims: Dims,
    m: &DropoutMask,
    [q, k, v]: [&[f64]; 3],
    w: &[f64],
) -> f64 {
    let (b, h, sq, sk, d) = dims;
    let scale = 1.0 / (d as f64).sqrt();
    let z = m.scale() as f64;
    let mut loss = 0.0;
    for pair in 0..b * h {
        for i in 0..sq {
            let qi = row(layout, dims, pair, i, sq);
            let s: Vec<f64> = (0..sk)
                .map(|j| {
                    let kj = row(layout, dims, pair, j, sk);
                    if j + sq <= i + sk {
                        scale * (0..d).map(|c| q[qi + c] * k[kj + c]).sum::<f64>()
                    } else {
                        f64::NEG_INFINITY
                    }
                })
                .collect();
            let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let den: f64 = s.iter().map(|x| (x - mx).exp()).sum();
            for j in 0..sk {
                let e = ((pair * sq + i) * sk + j) as u64;
                if !m.keep(e) {
                    continue;
                }
                let pz = (s[j] - mx).exp() / den * z;
                let vj = row(layout, dims, pair, j, sk);
                loss += (0..d).map(|c| pz * v[vj + c] * w[qi + c]).sum::<f64>();
            }
        }
    }
    loss
}

/// `(out, [dq, dk, dv])` of riftco's causal attention with dropout for `L = Σ out ⊙ w`.
fn riftco_attention(
    layout: AttentionLayout,
    kind: AttentionKind,
    m: Option<DropoutMask>,
    inputs: &[Tensor; 3],
    w: &Tensor,
) -> (Vec<f32>, [Vec<f32>; 3]) {
    let leaves: Vec<Variable> = inputs
        .iter()
        .map(|t| Variable::leaf(t.deep_clone(C::Workspace), true))
        .collect();
    let out =
        ops::causal_attention_with_dropout(&leaves[0], &leaves[1], &leaves[2], layout, kind, m)
            .unwrap();
    let loss = ops::sum(&ops::mul(&out, &Variable::constant(w.clone())).unwrap()).unwrap();
    loss.backward().unwrap();
    let g = |i: usize| leaves[i].grad().unwrap().to_vec();
    (out.value().to_vec(), [g(0), g(1), g(2)])
}

const CASES: [Dims; 6] = [
    (1, 1, 1, 1, 1),
    (2, 2, 5, 5, 3),
    (1, 3, 1, 6, 4),
    (1, 2, 4, 9, 5),
    (2, 1, 7, 7, 2),
    // More than one 64-row tile of queries and keys.
    (1, 1, 67, 67, 3),
];

/// The VJPs of flash and materialized attention with dropout (mask held fixed) against central
/// finite differences (f64, `h = 1e-5`) of an f64 reference attention applying the same mask.
#[test]
fn attention_with_dropout_vjp_matches_finite_differences() {
    for (ci, dims) in CASES.into_iter().enumerate() {
        let (_, _, sq, sk, _) = dims;
        for layout in LAYOUTS {
            let m = mask(0.3, 10 + ci as u32);
            let ts = [
                rand(&shape(layout, dims, sq), 20),
                rand(&shape(layout, dims, sk), 21),
                rand(&shape(layout, dims, sk), 22),
            ];
            let w = rand(&shape(layout, dims, sq), 23);
            let x64: Vec<Vec<f64>> = ts
                .iter()
                .map(|t| t.to_vec().iter().map(|&v| v as f64).collect())
                .collect();
            let w64: Vec<f64> = w.to_vec().iter().map(|&v| v as f64).collect();
            let h = 1e-5;
            let numeric: Vec<Vec<f64>> = (0..3)
                .map(|a| {
                    (0..x64[a].len())
                        .map(|e| {
                            let mut x = x64.clone();
                            x[a][e] += h;
                            let plus =
                                reference_loss(layout, dims, &m, [&x[0], &x[1], &x[2]], &w64);
                            x[a][e] -= 2.0 * h;
                            let minus =
                                reference_loss(layout, dims, &m, [&x[0], &x[1], &x[2]], &w64);
                            (plus - minus) / (2.0 * h)
                        })
                        .collect()
                })
                .collect();
            for kind in KINDS {
                let (_, grads) = riftco_attention(layout, kind, Some(m), &ts, &w);
                for (a, name) in ["dq", "dk", "dv"].iter().enumerate() {
                    for (e, (&g, &n)) in grads[a].iter().zip(&numeric[a]).enumerate() {
                        assert!(
                            (g as f64 - n).abs() <= 1e-4 + 1e-4 * n.abs(),
                            "{dims:?} {layout:?} {kind:?}: {name}[{e}] = {g}, finite \
                             difference {n}"
                        );
                    }
                }
            }
        }
    }
}

/// Flash and materialized attention drop the same entries: outputs and gradients agree.
#[test]
fn flash_and_materialized_dropout_agree() {
    for dims in [(2, 3, 33, 33, 8), (1, 2, 70, 70, 16), (1, 2, 5, 130, 4)] {
        let (_, _, sq, sk, _) = dims;
        for layout in LAYOUTS {
            for p in [0.1f32, 0.5] {
                let m = mask(p, 30);
                let ts = [
                    rand(&shape(layout, dims, sq), 31),
                    rand(&shape(layout, dims, sk), 32),
                    rand(&shape(layout, dims, sk), 33),
                ];
                let w = rand(&shape(layout, dims, sq), 34);
                let (of, gf) = riftco_attention(layout, AttentionKind::Flash, Some(m), &ts, &w);
                let (om, gm) =
                    riftco_attention(layout, AttentionKind::Materialized, Some(m), &ts, &w);
                let (o0, _) = riftco_attention(layout, AttentionKind::Flash, None, &ts, &w);
                let diff = of.iter().zip(&o0).filter(|(a, b)| a != b).count();
                assert!(
                    diff > of.len() / 2,
                    "{dims:?}: dropout changed {diff} outputs"
                );
                for (name, a, b) in [("out", &of, &om)].into_iter().chain(
                    ["dq", "dk", "dv"]
                        .into_iter()
                        .zip(&gf)
                        .zip(&gm)
                        .map(|((n, a), b)| (n, a, b)),
                ) {
                    for (e, (&x, &y)) in a.iter().zip(b.iter()).enumerate() {
                        assert!(
                            (x - y).abs() <= 1e-5,
                            "{dims:?} {layout:?} p {p}: {name}[{e}] flash {x} vs materialized {y}"
                        );
                    }
                }
            }
        }
    }
}

/// The mirror backend (CPU kernels on copies) gives bitwise the CPU's dropout and attention
/// with dropout, forward and backward.
#[test]
fn mirror_backend_is_bitwise_the_cpu() {
    mirror::install();
    let m = mask(0.25, 40);
    for kind in KINDS {
        let run = |device: Device| {
            let leaves: Vec<Variable> = (0..3)
                .map(|i| {
                    let mut t = rand(&[1, 9, 2, 4], 41 + i);
                    t.transfer_to(device).unwrap();
                    Variable::leaf(t, true)
                })
                .collect();
            let x = ops::dropout(&leaves[0], m).unwrap();
            let out = ops::causal_attention_with_dropout(
                &x,
                &leaves[1],
                &leaves[2],
                AttentionLayout::BatchSeqHead,
                kind,
                Some(m),
            )
            .unwrap();
            let loss = ops::sum(&ops::mul(&out, &out).unwrap()).unwrap();
            loss.backward().unwrap();
            let mut r = vec![bits(out.value())];
            r.extend(leaves.iter().map(|l| bits(&l.grad().unwrap())));
            r
        };
        assert_eq!(run(Device::Cpu), run(Device::PrivateUse1), "{kind:?}");
    }
}
