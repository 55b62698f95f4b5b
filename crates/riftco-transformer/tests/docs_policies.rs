//! The Rust snippets of docs/checkpointing.md ("The primitive in Rust"), compiled and run as written there.

use riftco_transformer::{
    ActivationCheckpointing, DecoderOnlyTransformer, FullSequenceAttentionKind, TransformerConfig,
};

#[test]
fn docs_policy_snippet() -> Result<(), Box<dyn std::error::Error>> {
    let config = TransformerConfig::new(256, 64, 4, 4, 172, 64);
    let block: Vec<u32> = (0..18).map(|i| (i * 37 % 256) as u32).collect();
    // --- docs snippet: policies ---
    let mut model = DecoderOnlyTransformer::new(
        config,
        FullSequenceAttentionKind::Flash,
        "segments:2".parse::<ActivationCheckpointing>()?, // any spelling; or the enum
    )?;
    println!("{}", model.activation_checkpointing_plan(2, 8)?); // for [batch 2, seq 8] inputs
    model.set_activation_checkpointing("selective:attention_ffn".parse()?)?;
    model.set_activation_checkpointing(ActivationCheckpointing::Budget(1 << 20))?; // bytes
    let plan = model.activation_checkpointing_plan(2, 8)?; // measured once per shape
    println!("{plan}"); // budget:1048576 → ...; predicted peak activation ...
    let loss = model.loss(&block, 2, 9)?; // runs that plan
    loss.backward()?;
    // --- end ---
    assert!(plan.predicted_peak_bytes.unwrap() <= 1 << 20);
    Ok(())
}

#[test]
fn docs_selective_primitive_snippet() -> Result<(), Box<dyn std::error::Error>> {
    // --- docs snippet: selective primitive ---
    use riftco_autograd::{checkpoint_with_options, named, ops, CheckpointOptions, Variable};
    use riftco_tensor::{MemoryCategory, Tensor};

    let x = Variable::leaf(
        Tensor::randn(vec![3, 4], 0.0, 1.0, 1, MemoryCategory::Workspace),
        true,
    );
    let w = Variable::leaf(
        Tensor::randn(vec![5, 4], 0.0, 0.1, 2, MemoryCategory::Parameter),
        true,
    );
    let w2 = w.clone();
    // The forward run keeps the value named "mm"; the replay rebuilds it instead of
    // recomputing x·wᵀ, and recomputes only the SiLU.
    let save = CheckpointOptions::saving(["mm"]);
    let deps = std::slice::from_ref(&w);
    let y = checkpoint_with_options("mlp", &x, deps, &save, move |x, _pass| {
        let h = named("mm", &[x], || ops::linear(x, &w2))?; // kept; not recomputed at replay
        ops::silu(&h) // recomputed
    })?;
    ops::sum(&y)?.backward()?;
    // --- end ---
    assert!(x.grad().is_some() && w.grad().is_some());
    Ok(())
}
