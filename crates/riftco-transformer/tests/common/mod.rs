#![allow(dead_code)]
use riftco_transformer::{
    ActivationCheckpointingKind as Ck, DecoderOnlyTransformer, FullSequenceAttentionKind as Attn,
    LoraConfig, LoraTargets, TransformerConfig,
};

pub fn small_config() -> TransformerConfig {
    let mut c = TransformerConfig::new(64, 32, 4, 3, 48, 24);
    c.seed = 11;
    c
}

/// Rank-4 adapters on the attention and MLP projections (seed 3).
pub fn lora_config() -> LoraConfig {
    LoraConfig {
        rank: 4,
        alpha: 8.0,
        targets: LoraTargets {
            attention: true,
            mlp: true,
        },
        seed: 3,
        dropout: 0.0,
    }
}

pub fn model(attn: Attn, ck: Ck, lora: bool) -> DecoderOnlyTransformer {
    let mut m = DecoderOnlyTransformer::new(small_config(), attn, ck).unwrap();
    if lora {
        m.enable_lora(&lora_config()).unwrap();
        // B starts at zero; give it values so adapter gradients are not trivially related.
        for (_, p) in m.weights().named_lora_parameters() {
            let n = p.value().numel();
            let vals: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 17) as f32 - 8.0) * 0.01)
                .collect();
            p.value().copy_from_slice(&vals).unwrap();
        }
    }
    m
}

/// A deterministic [batch, seq + 1] token block.
pub fn block(batch: usize, seq_plus_one: usize, vocab: u32) -> Vec<u32> {
    (0..batch * seq_plus_one)
        .map(|i| ((i as u32).wrapping_mul(2654435761) >> 7) % vocab)
        .collect()
}

pub fn rel_close(a: &[f32], b: &[f32], rel: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let scale = a.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-30);
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= rel * scale,
            "{what}[{i}]: {x} vs {y} (tolerance {rel} × max |a| {scale})"
        );
    }
}
