//! The chunked LM head + cross-entropy on the GPU (`Backend::linear_cross_entropy`'s composed
//! default: per chunk a row gather, the products and the cross-entropy kernels): a tiny model
//! (vocab 64, d_model 32, 2 layers, batch 2, seq 9) with 1 token a chunk, 5 (chunks that do not
//! divide the 18 tokens) and the default, against the GPU's unfused loss and the CPU's fused
//! one — loss and every gradient within 1e-4 of each tensor's largest magnitude (the GPU's
//! reduction orders differ from the CPU's; chunk means are combined in f32), untied and tied.

mod common;

use common::backend_or_skip;
use riftco_transformer::{
    ActivationCheckpointingKind as Ck, DecoderOnlyTransformer, FullSequenceAttentionKind as Attn,
    LossChunking, TransformerConfig,
};

const VOCAB: usize = 64;

fn step(
    tied: bool,
    device: riftco_tensor::Device,
    chunking: LossChunking,
) -> (f32, Vec<(String, Vec<f32>)>) {
    let mut c = TransformerConfig::new(VOCAB, 32, 4, 2, 48, 16).with_tie_word_embeddings(tied);
    c.seed = 9;
    let mut m = DecoderOnlyTransformer::new(c, Attn::Flash, Ck::TransformerBlock).unwrap();
    m.to_device(device).unwrap();
    m.set_loss_chunking(chunking).unwrap();
    let block: Vec<u32> = (0..20u32).map(|i| (i * 13 + 5) % VOCAB as u32).collect();
    let loss = m.loss(&block, 2, 10).unwrap();
    loss.backward().unwrap();
    let grads = m
        .named_parameters()
        .into_iter()
        .map(|(n, p)| (n, p.grad().unwrap().to_host().unwrap()))
        .collect();
    (loss.value().to_host().unwrap()[0], grads)
}

fn assert_close(
    what: &str,
    a: &(f32, Vec<(String, Vec<f32>)>),
    b: &(f32, Vec<(String, Vec<f32>)>),
) {
    assert!(
        (a.0 - b.0).abs() <= 1e-4 * b.0.abs(),
        "{what}: loss {} vs {}",
        a.0,
        b.0
    );
    assert_eq!(a.1.len(), b.1.len());
    for ((name, x), (_, y)) in a.1.iter().zip(&b.1) {
        let scale = y.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-30);
        for (i, (p, q)) in x.iter().zip(y).enumerate() {
            assert!(
                (p - q).abs() <= 1e-4 * scale,
                "{what}: {name}[{i}] {p} vs {q} (scale {scale})"
            );
        }
    }
}

#[test]
fn the_chunked_loss_on_the_gpu_matches_unfused_and_the_cpu() {
    let Some(dev) = backend_or_skip("the_chunked_loss_on_the_gpu_matches_unfused_and_the_cpu")
    else {
        return;
    };
    let per_token = 4 * (VOCAB as u64 + 1);
    for tied in [false, true] {
        let unfused = step(tied, dev, LossChunking::Unfused);
        let cpu = step(tied, riftco_tensor::Device::Cpu, LossChunking::default());
        assert_close(&format!("tied {tied}: GPU unfused vs CPU"), &unfused, &cpu);
        for tokens in [1, 5, 1 << 20] {
            let chunking = LossChunking::chunked(tokens * per_token).unwrap();
            let gpu = step(tied, dev, chunking);
            let what = format!("tied {tied}, {tokens} tokens a chunk");
            assert_close(&format!("{what}: GPU vs GPU unfused"), &gpu, &unfused);
            assert_close(&format!("{what}: GPU vs CPU"), &gpu, &cpu);
        }
    }
}
