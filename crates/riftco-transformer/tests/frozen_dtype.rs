//! Frozen weights in 16-bit storage (`set_frozen_weights_dtype`): a LoRA model whose frozen base
//! is stored in bfloat16 / float16 gives bitwise the logits, loss, adapter gradients and Adam
//! steps of an f32 model holding the same rounded weights; the parameter bytes of the frozen
//! weights are halved (counted exactly); float32 round-trips; saving writes the rounded values;
//! and what needs float32 weights (no frozen weights, merging, another device, writing) is a
//! clear error that changes nothing.

mod measure;
use measure::{lock, tokens};
use riftco_autograd::Variable;
use riftco_tensor::{memory_stats, MemoryCategory};
use riftco_transformer::{
    load_model, save_model, ActivationCheckpointing as Policy, Adam, DecoderOnlyTransformer,
    FullSequenceAttentionKind as Attn, LoraConfig, LoraTargets, LossChunking, TransformerConfig,
    TransformerError, WeightDtype, DEFAULT_LOSS_CHUNK_BYTES,
};

const VOCAB: usize = 80;

fn config(tied: bool) -> TransformerConfig {
    let mut c = TransformerConfig::new(VOCAB, 32, 4, 2, 48, 16).with_tie_word_embeddings(tied);
    c.seed = 8;
    c
}

fn lora() -> LoraConfig {
    LoraConfig {
        rank: 4,
        alpha: 8.0,
        targets: LoraTargets {
            attention: true,
            mlp: true,
        },
        seed: 2,
        dropout: 0.0,
    }
}

fn lora_model(tied: bool) -> DecoderOnlyTransformer {
    let mut m = DecoderOnlyTransformer::new(config(tied), Attn::Flash, Policy::Block).unwrap();
    m.enable_lora(&lora()).unwrap();
    m
}

fn bits(v: &Variable) -> Vec<u32> {
    v.value().to_vec().iter().map(|x| x.to_bits()).collect()
}

/// The bits of each adapter gradient.
fn adapter_grad_bits(m: &DecoderOnlyTransformer) -> Vec<Vec<u32>> {
    m.weights()
        .named_lora_parameters()
        .iter()
        .map(|(_, p)| {
            p.grad()
                .unwrap()
                .to_vec()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        })
        .collect()
}

/// The logits' bits, the loss's, and each adapter gradient's after one backward.
fn outputs(m: &DecoderOnlyTransformer) -> (Vec<u32>, u32, Vec<Vec<u32>>) {
    let block = tokens(2, 9, VOCAB as u32);
    let logits = riftco_autograd::no_grad(|| m.logits(&block[..8], 1, 8)).unwrap();
    let loss = m.loss(&block, 2, 9).unwrap();
    loss.backward().unwrap();
    let grads = adapter_grad_bits(m);
    (bits(&logits), loss.value().to_vec()[0].to_bits(), grads)
}

#[test]
fn sixteen_bit_frozen_weights_compute_as_f32_weights_holding_the_rounded_values() {
    let _guard = lock();
    for (dtype, tied) in [
        (WeightDtype::BFloat16, false),
        (WeightDtype::BFloat16, true),
        (WeightDtype::Float16, true),
    ] {
        let mut half = lora_model(tied);
        half.set_frozen_weights_dtype(dtype).unwrap();
        assert_eq!(half.frozen_weights_dtype(), dtype);
        // An independent f32 model (same seeds) whose base holds the rounded values.
        let reference = lora_model(tied);
        for ((name, h), (_, r)) in half
            .named_parameters()
            .iter()
            .zip(reference.named_parameters())
        {
            assert!(h.value().half_dtype().is_some(), "{name} not converted");
            r.value().copy_from_slice(&h.value().to_vec()).unwrap();
        }
        let what = format!("{dtype} tied {tied}");
        assert_eq!(outputs(&half), outputs(&reference), "{what}");
        // An Adam step on the adapters, then the same outputs again.
        for m in [&half, &reference] {
            let mut adam = Adam::new(m.trainable_parameters(), 1e-2).unwrap();
            adam.step().unwrap();
        }
        assert_eq!(
            outputs(&half),
            outputs(&reference),
            "{what} after an Adam step"
        );
    }
}

#[test]
fn the_frozen_parameter_bytes_are_halved_and_float32_round_trips() {
    let _guard = lock();
    let mut m = lora_model(false);
    let frozen_bytes: usize = m
        .named_parameters()
        .iter()
        .map(|(_, p)| 4 * p.value().numel())
        .sum();
    let params = || memory_stats().get(MemoryCategory::Parameter).current_bytes;
    let before = params();
    m.set_frozen_weights_dtype(WeightDtype::BFloat16).unwrap();
    assert_eq!(
        before - params(),
        frozen_bytes / 2,
        "half of the frozen bytes freed"
    );
    let rounded: Vec<Vec<u32>> = m.named_parameters().iter().map(|(_, p)| bits(p)).collect();
    m.set_frozen_weights_dtype(WeightDtype::Float32).unwrap();
    assert_eq!(params(), before, "float32 again");
    assert_eq!(m.frozen_weights_dtype(), WeightDtype::Float32);
    let back: Vec<Vec<u32>> = m.named_parameters().iter().map(|(_, p)| bits(p)).collect();
    assert_eq!(back, rounded, "the upcast is exact");
}

#[test]
fn saving_writes_the_rounded_values() {
    let _guard = lock();
    let mut m = lora_model(true);
    m.set_frozen_weights_dtype(WeightDtype::BFloat16).unwrap();
    let dir = std::env::temp_dir().join(format!("riftco-frozen-dtype-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.safetensors");
    save_model(&m, &path).unwrap();
    let loaded = load_model(&path, Attn::Flash, Policy::Disabled).unwrap();
    for ((name, a), (_, b)) in m.named_parameters().iter().zip(loaded.named_parameters()) {
        assert_eq!(bits(a), bits(&b), "{name}");
        assert!(b.value().half_dtype().is_none(), "{name}: loads as float32");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn what_needs_float32_weights_is_a_clear_error() {
    let _guard = lock();
    // No frozen weights: nothing to convert, trainable weights stay float32.
    let mut plain =
        DecoderOnlyTransformer::new(config(false), Attn::Flash, Policy::Disabled).unwrap();
    let err = plain
        .set_frozen_weights_dtype(WeightDtype::BFloat16)
        .unwrap_err();
    assert!(
        matches!(err, TransformerError::Config { field: "dtype", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("enable LoRA first"), "{err}");
    plain
        .set_frozen_weights_dtype(WeightDtype::Float32)
        .unwrap();

    let mut m = lora_model(false);
    m.set_frozen_weights_dtype(WeightDtype::BFloat16).unwrap();
    // Merging writes the base and makes it trainable.
    let err = m.merge_lora().unwrap_err();
    assert!(
        err.to_string().contains("bfloat16") && err.to_string().contains("float32"),
        "{err}"
    );
    assert!(m.has_lora());
    // Another device.
    riftco_tensor::backend::mirror::install();
    let err = m.to_device(riftco_tensor::Device::PrivateUse1).unwrap_err();
    assert!(err.to_string().contains("privateuseone"), "{err}");
    assert_eq!(m.device(), riftco_tensor::Device::Cpu);
    // Writing a 16-bit tensor.
    let (name, p) = &m.named_parameters()[0];
    let err = p
        .value()
        .copy_from_slice(&vec![0.0; p.value().numel()])
        .unwrap_err();
    assert!(err.to_string().contains("bfloat16"), "{name}: {err}");
    // float16 cannot hold a weight past 65504: an error naming it, nothing converted.
    let mut big = lora_model(false);
    let (_, p) = &big.named_parameters()[1];
    let mut values = p.value().to_vec();
    values[3] = 1e5;
    p.value().copy_from_slice(&values).unwrap();
    let err = big
        .set_frozen_weights_dtype(WeightDtype::Float16)
        .unwrap_err();
    assert!(err.to_string().contains("element 3 = 100000"), "{err}");
    assert_eq!(big.frozen_weights_dtype(), WeightDtype::Float32);
    big.set_frozen_weights_dtype(WeightDtype::BFloat16).unwrap();
    // Loading weights in place needs float32 ones.
    let dir = std::env::temp_dir().join(format!("riftco-frozen-inplace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    save_model(&big, &dir.join("m.safetensors")).unwrap();
    let err = riftco_transformer::load_weights_into(&big, &dir.join("m.safetensors")).unwrap_err();
    assert!(
        err.to_string()
            .contains("set_frozen_weights_dtype(float32)"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    // Names.
    let err = "float64".parse::<WeightDtype>().unwrap_err();
    assert!(
        err.to_string().contains("float64") && err.to_string().contains("bfloat16"),
        "{err}"
    );
    assert_eq!(
        "BFloat16".parse::<WeightDtype>().unwrap(),
        WeightDtype::BFloat16
    );
}

#[test]
fn a_16_bit_file_loads_straight_into_16_bit_storage() {
    let _guard = lock();
    use riftco_transformer::load_model_as;
    use riftco_transformer::state::{save_model_as, StateDtype};
    let m = DecoderOnlyTransformer::new(config(true), Attn::Flash, Policy::Disabled).unwrap();
    let dir = std::env::temp_dir().join(format!("riftco-frozen-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (f32_path, bf16_path) = (dir.join("f32.safetensors"), dir.join("bf16.safetensors"));
    save_model(&m, &f32_path).unwrap();
    save_model_as(&m, &bf16_path, StateDtype::BF16).unwrap();
    let frozen_bytes: usize = m
        .named_parameters()
        .iter()
        .map(|(_, p)| 2 * p.value().numel())
        .sum();
    let want: Vec<Vec<u32>> = {
        let r = load_model(&bf16_path, Attn::Flash, Policy::Disabled).unwrap();
        r.named_parameters().iter().map(|(_, p)| bits(p)).collect()
    };
    for path in [&bf16_path, &f32_path] {
        let params = || memory_stats().get(MemoryCategory::Parameter).current_bytes;
        let before = params();
        let mut loaded =
            load_model_as(path, Attn::Flash, Policy::Disabled, WeightDtype::BFloat16).unwrap();
        // The RoPE table is not a parameter: the 16-bit weights are all the parameter bytes.
        assert_eq!(params() - before, frozen_bytes, "{path:?}");
        assert_eq!(loaded.frozen_weights_dtype(), WeightDtype::BFloat16);
        let got: Vec<Vec<u32>> = loaded
            .named_parameters()
            .iter()
            .map(|(_, p)| bits(p))
            .collect();
        assert_eq!(
            got, want,
            "{path:?}: the file's bits, or the f32 values rounded as a save"
        );
        assert!(
            loaded.trainable_parameters().is_empty(),
            "16-bit weights are frozen"
        );
        loaded.enable_lora(&lora()).unwrap();
        assert_eq!(loaded.frozen_weights_dtype(), WeightDtype::BFloat16);
        let block = tokens(2, 9, VOCAB as u32);
        let loss = loaded.loss(&block, 2, 9).unwrap();
        loss.backward().unwrap();
        assert!(loss.value().to_vec()[0].is_finite());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A tied 16-bit head over several vocabulary blocks (`vocab_block_rows(64)` = 32768 rows of
/// 100 000): the
/// loss and adapter gradients are bitwise those of the f32 model holding the rounded weights
/// (the same blocks), and neither the embedding lookup nor the chunked loss upcasts the whole
/// `[vocab, d_model]` matrix: the workspace peak of a step stays below its f32 bytes.
#[test]
fn a_16_bit_head_is_upcast_a_block_of_rows_at_a_time() {
    let _guard = lock();
    let vocab = 100_000;
    let d = 64;
    assert!(riftco_kernels::linear_loss::vocab_block_rows(d) < vocab);
    let make = || {
        let mut c = TransformerConfig::new(vocab, d, 4, 1, 32, 16).with_tie_word_embeddings(true);
        c.seed = 3;
        let mut m = DecoderOnlyTransformer::new(c, Attn::Flash, Policy::Block).unwrap();
        m.enable_lora(&lora()).unwrap();
        m
    };
    let mut half = make();
    half.set_frozen_weights_dtype(WeightDtype::BFloat16)
        .unwrap();
    let reference = make();
    for ((_, h), (_, r)) in half
        .named_parameters()
        .iter()
        .zip(reference.named_parameters())
    {
        r.value().copy_from_slice(&h.value().to_vec()).unwrap();
    }
    let block = tokens(2, 9, vocab as u32);
    let step = |m: &DecoderOnlyTransformer| {
        riftco_tensor::reset_peak_memory_stats();
        let before = memory_stats().get(MemoryCategory::Workspace).current_bytes;
        let loss = m.loss(&block, 2, 9).unwrap();
        loss.backward().unwrap();
        let peak = memory_stats().get(MemoryCategory::Workspace).peak_bytes - before;
        (
            loss.value().to_vec()[0].to_bits(),
            adapter_grad_bits(m),
            peak,
        )
    };
    let (loss_h, grads_h, peak_h) = step(&half);
    let (loss_r, grads_r, _) = step(&reference);
    assert_eq!(loss_h, loss_r);
    assert_eq!(grads_h, grads_r);
    // The workspace peak is the chunked loss's, exactly: one chunk's logits, one block of them
    // and one block of upcast rows — well below the whole head in f32.
    let chunk = LossChunking::chunk_tokens(DEFAULT_LOSS_CHUNK_BYTES, vocab);
    let block_rows = riftco_kernels::linear_loss::vocab_block_rows(d);
    let expected =
        4 * riftco_kernels::linear_loss::workspace_len(16, vocab, d, chunk, block_rows, true);
    assert_eq!(peak_h, expected);
    let whole = vocab * d * 4;
    assert!(
        peak_h < whole * 3 / 4,
        "workspace peak {peak_h} vs the f32 head's {whole} bytes"
    );
}

/// A weight beyond float16's range is refused naming the weight, and nothing is converted.
#[test]
fn a_weight_beyond_float16_is_refused_naming_it() {
    let _guard = lock();
    let mut m = lora_model(false);
    let (name, w) = m
        .named_parameters()
        .into_iter()
        .find(|(n, _)| n.ends_with("mlp.up_proj.weight"))
        .unwrap();
    let mut values = w.value().to_vec();
    values[3] = 1e6;
    w.value().copy_from_slice(&values).unwrap();
    let e = m
        .set_frozen_weights_dtype(WeightDtype::Float16)
        .unwrap_err();
    assert!(e.to_string().contains(&name), "{e}");
    assert!(e.to_string().contains("float16"), "{e}");
    assert_eq!(m.frozen_weights_dtype(), WeightDtype::Float32);
}
