//! Flash attention retains O(seq) activations, materialized attention O(seq²): measured with the
//! memory accounting (its own test binary: counters are process-wide).

use riftco_tensor::{memory_stats, MemoryCategory};
use riftco_transformer::{
    ActivationCheckpointingKind as Ck, DecoderOnlyTransformer, FullSequenceAttentionKind as Attn,
    TransformerConfig,
};

fn retained_after_forward(attn: Attn, seq: usize) -> usize {
    let model = DecoderOnlyTransformer::new(
        TransformerConfig::new(64, 32, 4, 1, 48, 256),
        attn,
        Ck::Disabled,
    )
    .unwrap();
    let tokens: Vec<u32> = (0..seq + 1).map(|i| (i * 7 % 64) as u32).collect();
    let base = memory_stats().get(MemoryCategory::Activation).current_bytes;
    let loss = model.loss(&tokens, 1, seq + 1).unwrap();
    let bytes = memory_stats().get(MemoryCategory::Activation).current_bytes - base;
    drop(loss);
    bytes
}

#[test]
fn flash_retains_linear_materialized_quadratic_memory() {
    let (f1, f2) = (
        retained_after_forward(Attn::Flash, 128),
        retained_after_forward(Attn::Flash, 256),
    );
    let (m1, m2) = (
        retained_after_forward(Attn::Materialized, 128),
        retained_after_forward(Attn::Materialized, 256),
    );
    println!("retained activation bytes: flash {f1} -> {f2}, materialized {m1} -> {m2}");
    // Doubling seq doubles everything flash keeps (ratio exactly 2 up to the scalar loss).
    assert!((f2 as f64 / f1 as f64) < 2.01, "flash {f1} -> {f2}");
    // Materialized keeps the [heads, seq, seq] probabilities (the scores before the softmax are
    // released: its VJP reads only its output): the ratio approaches 4.
    assert!((m2 as f64 / m1 as f64) > 3.0, "materialized {m1} -> {m2}");
    // At seq 256 the probabilities alone (4 heads × 256² × 4 B = 1 MiB) exceed all of flash's
    // retained activations; materialized keeps them in place of flash's [seq, heads]
    // logsumexp.
    assert!(
        m2 - f2 >= 4 * 256 * 256 * 4 - 4 * 256 * 4,
        "materialized {m2} vs flash {f2}"
    );
}

#[test]
fn flash_attention_rejects_a_zero_head_dimension_with_an_error() {
    use riftco_autograd::ops::{flash_attention_with_layout, AttentionLayout};
    use riftco_autograd::Variable;
    use riftco_tensor::Tensor;
    let z = Variable::leaf(Tensor::zeros([1, 4, 2, 0], MemoryCategory::Workspace), true);
    for layout in [AttentionLayout::BatchSeqHead, AttentionLayout::BatchHeadSeq] {
        let err = flash_attention_with_layout(&z, &z, &z, layout, 1.0, true).unwrap_err();
        assert!(err.to_string().contains("d_head is 0"), "{err}");
    }
}
