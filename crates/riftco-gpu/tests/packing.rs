//! Packed batches on the GPU backend: a row of three examples (`position_ids` restarting at 0
//! per example) gives, on the GPU, the loss and gradients of the examples run alone on the GPU
//! (the mean weighted by targets per example), for flash and materialized attention, with the
//! blocks checkpointed; and the packed GPU loss equals the packed CPU loss within the backend
//! tolerance of `backend_model.rs` (1e-4 of the largest magnitude).

mod common;

use common::backend_or_skip;
use riftco_transformer::{
    ActivationCheckpointingKind as Ck, DecoderOnlyTransformer, FullSequenceAttentionKind as Attn,
    TransformerConfig,
};

const SEQ1: usize = 12;
const LENS: [usize; 3] = [4, 5, 3];

fn model(attn: Attn) -> DecoderOnlyTransformer {
    let mut c = TransformerConfig::new(64, 32, 4, 2, 48, 16);
    c.seed = 5;
    DecoderOnlyTransformer::new(c, attn, Ck::TransformerBlock).unwrap()
}

fn tokens() -> Vec<u32> {
    (0..SEQ1 as u32).map(|i| (i * 7 + 3) % 64).collect()
}

fn positions() -> Vec<i64> {
    LENS.iter().flat_map(|&n| 0..n as i64).collect()
}

fn loss_and_grads(
    m: &DecoderOnlyTransformer,
    loss: riftco_autograd::Variable,
) -> (f64, Vec<Vec<f64>>) {
    loss.backward().unwrap();
    let grads = m
        .trainable_parameters()
        .iter()
        .map(|p| {
            let g = p.grad().unwrap().to_host().unwrap();
            g.iter().map(|&x| f64::from(x)).collect()
        })
        .collect();
    (f64::from(loss.value().to_host().unwrap()[0]), grads)
}

#[test]
fn a_packed_row_on_the_gpu_equals_its_examples_alone() {
    let Some(dev) = backend_or_skip("a_packed_row_on_the_gpu_equals_its_examples_alone") else {
        return;
    };
    for attn in [Attn::Flash, Attn::Materialized] {
        let mut m = model(attn);
        let cpu_loss = m
            .loss_packed(&tokens(), None, &positions(), 1, SEQ1)
            .unwrap()
            .value()
            .item()
            .unwrap();
        m.to_device(dev).unwrap();
        let packed = m
            .loss_packed(&tokens(), None, &positions(), 1, SEQ1)
            .unwrap();
        let (loss, grads) = loss_and_grads(&m, packed);
        let tol = 1e-4 * f64::from(cpu_loss).abs();
        assert!(
            (loss - f64::from(cpu_loss)).abs() <= tol,
            "{attn:?}: {loss} vs CPU {cpu_loss}"
        );
        let total: usize = LENS.iter().map(|n| n - 1).sum();
        let (mut want_loss, mut want): (f64, Vec<Vec<f64>>) =
            (0.0, grads.iter().map(|g| vec![0.0; g.len()]).collect());
        let mut start = 0;
        for n in LENS {
            let alone = m.loss(&tokens()[start..start + n], 1, n).unwrap();
            let (l, g) = loss_and_grads(&m, alone);
            let w = (n - 1) as f64 / total as f64;
            want_loss += w * l;
            for (acc, gi) in want.iter_mut().zip(&g) {
                for (a, x) in acc.iter_mut().zip(gi) {
                    *a += w * x;
                }
            }
            start += n;
        }
        let mut worst = ((loss - want_loss) / want_loss).abs();
        for (g, w) in grads.iter().zip(&want) {
            let scale = w.iter().fold(1e-30f64, |s, x| s.max(x.abs()));
            for (x, y) in g.iter().zip(w) {
                worst = worst.max((x - y).abs() / scale);
            }
        }
        println!("{attn:?}: packed vs alone on the GPU, worst relative difference {worst:e}");
        assert!(worst <= 2e-5, "{attn:?}: {worst:e}");
    }
}
