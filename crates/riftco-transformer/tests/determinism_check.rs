//! The model's `determinism_check`: every checkpoint a policy creates compares its replay at
//! the model's level; `"values"` passes silently on every policy, with a loss and gradients
//! bitwise equal to `"metadata"`'s (and to `disabled`'s).
//!
//! `auto` plans from the process-wide memory counters: every test that runs a model holds
//! [`measure::lock`].

mod common;
mod measure;
use common::block;
use measure::lock;
use riftco_autograd::DeterminismCheck;
use riftco_transformer::{
    ActivationCheckpointing as Policy, DecoderOnlyTransformer, FullSequenceAttentionKind as Attn,
    TransformerConfig,
};

const L: usize = 3;
const BATCH: usize = 2;
const SEQ: usize = 12;

fn config() -> TransformerConfig {
    let mut c = TransformerConfig::new(64, 32, 4, L, 48, 24);
    c.seed = 5;
    c
}

/// Loss and every trainable gradient of one training step, as bit patterns.
fn step(attn: Attn, policy: &str, check: DeterminismCheck) -> (u32, Vec<Vec<u32>>) {
    let mut m =
        DecoderOnlyTransformer::new(config(), attn, policy.parse::<Policy>().unwrap()).unwrap();
    assert_eq!(
        m.determinism_check(),
        DeterminismCheck::Metadata,
        "the default"
    );
    m.set_determinism_check(check);
    assert_eq!(m.determinism_check(), check);
    let loss = m.loss(&block(BATCH, SEQ + 1, 64), BATCH, SEQ + 1).unwrap();
    loss.backward().unwrap();
    let grads = m
        .trainable_parameters()
        .iter()
        .map(|p| {
            p.grad()
                .unwrap()
                .to_vec()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        })
        .collect();
    (loss.value().item().unwrap().to_bits(), grads)
}

#[test]
fn values_passes_silently_on_every_policy_with_the_metadata_gradients() {
    let _guard = lock();
    for attn in [Attn::Flash, Attn::Materialized] {
        let reference = step(attn, "disabled", DeterminismCheck::Metadata);
        for policy in [
            "disabled",
            "block",
            "segments:2",
            "auto",
            "selective",
            "selective:dots",
            "block,selective:dots,disabled",
        ] {
            for check in DeterminismCheck::ALL {
                let s = step(attn, policy, check);
                assert_eq!(s.0, reference.0, "{attn:?} {policy} {check}: loss");
                assert!(s.1 == reference.1, "{attn:?} {policy} {check}: gradients");
            }
        }
    }
}
