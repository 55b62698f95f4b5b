//! Grouped-query attention (K and V with fewer heads than Q, query head `h` reading key/value
//! head `h / (heads / kv_heads)`): VJPs of both attention kinds in both layouts against central
//! finite differences, flash against materialized (with and without dropout), against
//! multi-head attention on K and V repeated per head (Hugging Face's `repeat_kv`), the mirror
//! backend, and the shape errors.

mod common;

use common::{bits, gradcheck, rand};
use riftco_autograd::ops::{self, AttentionKind, AttentionLayout, DropoutMask};
use riftco_autograd::{AutogradError, Variable};
use riftco_tensor::backend::mirror;
use riftco_tensor::{Device, MemoryCategory as C, Tensor, TensorError};

const LAYOUTS: [AttentionLayout; 2] =
    [AttentionLayout::BatchHeadSeq, AttentionLayout::BatchSeqHead];
const KINDS: [AttentionKind; 2] = [AttentionKind::Flash, AttentionKind::Materialized];

/// The shape of a tensor with `heads` heads of `seq` rows in `layout`.
fn shape(layout: AttentionLayout, batch: usize, heads: usize, seq: usize, d: usize) -> Vec<usize> {
    match layout {
        AttentionLayout::BatchHeadSeq => vec![batch, heads, seq, d],
        AttentionLayout::BatchSeqHead => vec![batch, seq, heads, d],
    }
}

/// `x` with each of its `kv` heads repeated `group` times (`repeat_kv`), in `layout`.
fn repeat_kv(x: &Tensor, layout: AttentionLayout, group: usize) -> Tensor {
    let d = x.dims().to_vec();
    let v = x.to_vec();
    let (b, kv, s, dh) = match layout {
        AttentionLayout::BatchHeadSeq => (d[0], d[1], d[2], d[3]),
        AttentionLayout::BatchSeqHead => (d[0], d[2], d[1], d[3]),
    };
    let h = kv * group;
    let mut out = vec![0.0f32; b * h * s * dh];
    for bi in 0..b {
        for hi in 0..h {
            for t in 0..s {
                let (src, dst) = match layout {
                    AttentionLayout::BatchHeadSeq => (
                        ((bi * kv + hi / group) * s + t) * dh,
                        ((bi * h + hi) * s + t) * dh,
                    ),
                    AttentionLayout::BatchSeqHead => (
                        ((bi * s + t) * kv + hi / group) * dh,
                        ((bi * s + t) * h + hi) * dh,
                    ),
                };
                out[dst..dst + dh].copy_from_slice(&v[src..src + dh]);
            }
        }
    }
    Tensor::from_vec(out, shape(layout, b, h, s, dh), C::Workspace).unwrap()
}

#[test]
fn gqa_vjps_match_finite_differences_in_both_kinds_and_layouts() {
    for kv in [2, 1] {
        for layout in LAYOUTS {
            for kind in KINDS {
                for (sq, sk) in [(5, 5), (3, 7)] {
                    let inputs = [
                        rand(&shape(layout, 1, 4, sq, 3), 1),
                        rand(&shape(layout, 1, kv, sk, 3), 2),
                        rand(&shape(layout, 1, kv, sk, 3), 3),
                    ];
                    gradcheck(
                        |v| ops::causal_attention(&v[0], &v[1], &v[2], layout, kind),
                        &inputs,
                        &[true, true, true],
                    );
                }
            }
        }
    }
}

/// Output and gradients of `Σ out ⊙ w` for one attention call.
fn run(
    layout: AttentionLayout,
    kind: AttentionKind,
    dropout: Option<DropoutMask>,
    ts: &[Tensor; 3],
    w: &Tensor,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let leaves: Vec<Variable> = ts
        .iter()
        .map(|t| Variable::leaf(t.deep_clone(C::Workspace), true))
        .collect();
    let out = ops::causal_attention_with_dropout(
        &leaves[0], &leaves[1], &leaves[2], layout, kind, dropout,
    )
    .unwrap();
    let loss = ops::sum(&ops::mul(&out, &Variable::constant(w.clone())).unwrap()).unwrap();
    loss.backward().unwrap();
    (
        out.value().to_vec(),
        leaves.iter().map(|l| l.grad().unwrap().to_vec()).collect(),
    )
}

fn close(a: &[f32], b: &[f32], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (e, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol, "{what}[{e}]: {x} vs {y}");
    }
}

#[test]
fn gqa_flash_matches_materialized_with_and_without_dropout() {
    let mask = DropoutMask {
        p: 0.3,
        key: [7, 8],
        stream: [1, 2],
        offset: 0,
    };
    for kv in [2, 1] {
        for layout in LAYOUTS {
            for (sq, sk) in [(33, 33), (5, 71), (67, 67)] {
                let ts = [
                    rand(&shape(layout, 2, 4, sq, 8), 11),
                    rand(&shape(layout, 2, kv, sk, 8), 12),
                    rand(&shape(layout, 2, kv, sk, 8), 13),
                ];
                let w = rand(&shape(layout, 2, 4, sq, 8), 14);
                for dropout in [None, Some(mask)] {
                    let (of, gf) = run(layout, AttentionKind::Flash, dropout, &ts, &w);
                    let (om, gm) = run(layout, AttentionKind::Materialized, dropout, &ts, &w);
                    let what =
                        format!("kv {kv} {layout:?} {sq}x{sk} dropout {}", dropout.is_some());
                    close(&of, &om, 1e-5, &format!("{what} out"));
                    for (i, (a, b)) in gf.iter().zip(&gm).enumerate() {
                        close(a, b, 2e-5, &format!("{what} grad {i}"));
                    }
                }
            }
        }
    }
}

/// GQA is multi-head attention on K and V repeated per query head: the same output (bitwise
/// for flash, whose per-head work is identical), the same dQ, and dK, dV the repeated heads'
/// gradients summed over each group.
#[test]
fn gqa_equals_mha_on_repeated_kv() {
    for kv in [2, 1] {
        let g = 4 / kv;
        for layout in LAYOUTS {
            for kind in KINDS {
                let (q, k, v) = (
                    rand(&shape(layout, 2, 4, 13, 6), 21),
                    rand(&shape(layout, 2, kv, 13, 6), 22),
                    rand(&shape(layout, 2, kv, 13, 6), 23),
                );
                let w = rand(&shape(layout, 2, 4, 13, 6), 24);
                let (og, gg) = run(layout, kind, None, &[q.clone(), k.clone(), v.clone()], &w);
                let rep = [q, repeat_kv(&k, layout, g), repeat_kv(&v, layout, g)];
                let (om, gm) = run(layout, kind, None, &rep, &w);
                let what = format!("kv {kv} {layout:?} {kind:?}");
                if kind == AttentionKind::Flash {
                    assert_eq!(og, om, "{what}: out");
                    assert_eq!(gg[0], gm[0], "{what}: dq");
                } else {
                    close(&og, &om, 1e-6, &format!("{what} out"));
                    close(&gg[0], &gm[0], 1e-6, &format!("{what} dq"));
                }
                for i in [1, 2] {
                    // The VJP of repeat_kv: the repeated heads' gradients summed per group.
                    let summed = sum_groups(&gm[i], &shape(layout, 2, kv, 13, 6), layout, g);
                    close(&gg[i], &summed, 1e-5, &format!("{what} grad {i}"));
                }
            }
        }
    }
}

/// The gradient of `repeat_kv`'s input: `g` (of the repeated tensor) summed over each group.
fn sum_groups(g: &[f32], kv_shape: &[usize], layout: AttentionLayout, group: usize) -> Vec<f32> {
    let (b, kv, s, dh) = match layout {
        AttentionLayout::BatchHeadSeq => (kv_shape[0], kv_shape[1], kv_shape[2], kv_shape[3]),
        AttentionLayout::BatchSeqHead => (kv_shape[0], kv_shape[2], kv_shape[1], kv_shape[3]),
    };
    let h = kv * group;
    let mut out = vec![0.0f32; b * kv * s * dh];
    for bi in 0..b {
        for hi in 0..h {
            for t in 0..s {
                let (dst, src) = match layout {
                    AttentionLayout::BatchHeadSeq => (
                        ((bi * kv + hi / group) * s + t) * dh,
                        ((bi * h + hi) * s + t) * dh,
                    ),
                    AttentionLayout::BatchSeqHead => (
                        ((bi * s + t) * kv + hi / group) * dh,
                        ((bi * s + t) * h + hi) * dh,
                    ),
                };
                for c in 0..dh {
                    out[dst + c] += g[src + c];
                }
            }
        }
    }
    out
}

#[test]
fn gqa_on_the_mirror_backend_is_bitwise_the_cpu() {
    mirror::install();
    for kind in KINDS {
        let run = |device: Device| {
            let leaves: Vec<Variable> = [[1, 9, 4, 4], [1, 9, 2, 4], [1, 9, 2, 4]]
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let mut t = rand(s, 41 + i as u64);
                    t.transfer_to(device).unwrap();
                    Variable::leaf(t, true)
                })
                .collect();
            let out = ops::causal_attention(
                &leaves[0],
                &leaves[1],
                &leaves[2],
                AttentionLayout::BatchSeqHead,
                kind,
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

#[test]
fn kv_heads_that_do_not_divide_the_query_heads_are_an_error_naming_both() {
    let q = Variable::leaf(rand(&[1, 4, 5, 2], 1), true);
    let k = Variable::leaf(rand(&[1, 3, 5, 2], 2), true);
    for kind in KINDS {
        match ops::causal_attention(&q, &k, &k, AttentionLayout::BatchHeadSeq, kind) {
            Err(AutogradError::Tensor(TensorError::InvalidArgument { message, .. })) => {
                assert!(
                    message.contains("3 heads") && message.contains("4 query heads"),
                    "{message}"
                );
            }
            other => panic!("{kind:?}: {other:?}"),
        }
    }
}
