//! The optimizer's state as data (`Adam::state` / `Adam::restore`): a run continued from a
//! snapshot (weights and optimizer state put into fresh objects) gives bitwise the losses and
//! weights of the uninterrupted run, for full training and LoRA; a state for other parameters
//! is refused naming the first mismatch, and nothing is half-applied.

mod measure;
use measure::tokens;
use riftco_transformer::{
    load_optimizer_state, save_model, save_optimizer_state, ActivationCheckpointing as Policy,
    Adam, AdamState, DecoderOnlyTransformer, FullSequenceAttentionKind as Attn, LoraConfig,
    LoraTargets, TransformerConfig, TransformerError,
};

fn model(lora: bool) -> DecoderOnlyTransformer {
    let mut c = TransformerConfig::new(64, 16, 2, 2, 32, 16);
    c.seed = 7;
    let mut m = DecoderOnlyTransformer::new(c, Attn::Flash, Policy::Block).unwrap();
    if lora {
        m.enable_lora(&LoraConfig {
            rank: 2,
            alpha: 4.0,
            targets: LoraTargets {
                attention: true,
                mlp: true,
            },
            seed: 1,
            dropout: 0.0,
        })
        .unwrap();
    }
    m
}

fn params(m: &DecoderOnlyTransformer) -> Vec<(String, riftco_autograd::Variable)> {
    let mut v = m.named_parameters();
    v.extend(m.weights().named_lora_parameters());
    v
}

/// `n` steps of loss, backward and AdamW; the losses' bits.
fn train(m: &DecoderOnlyTransformer, opt: &mut Adam, n: usize, first: usize) -> Vec<u32> {
    (0..n)
        .map(|i| {
            // Another batch every step (the data a resumed run must continue with).
            let block: Vec<u32> = tokens(2, 9, 64)
                .iter()
                .map(|t| (t + (first + i) as u32) % 64)
                .collect();
            opt.zero_grad().unwrap();
            let loss = m.loss(&block, 2, 9).unwrap();
            loss.backward().unwrap();
            opt.step().unwrap();
            loss.value().to_vec()[0].to_bits()
        })
        .collect()
}

fn weight_bits(m: &DecoderOnlyTransformer) -> Vec<Vec<u32>> {
    params(m)
        .iter()
        .map(|(_, p)| p.value().to_vec().iter().map(|x| x.to_bits()).collect())
        .collect()
}

#[test]
fn a_run_continued_from_a_snapshot_is_bitwise_the_uninterrupted_one() {
    for lora in [false, true] {
        let a = model(lora);
        let mut opt_a = Adam::adamw(a.trainable_parameters(), 1e-2, 0.01).unwrap();
        let losses_a = train(&a, &mut opt_a, 5, 0);

        let b = model(lora);
        let mut opt_b = Adam::adamw(b.trainable_parameters(), 1e-2, 0.01).unwrap();
        let mut losses_b = train(&b, &mut opt_b, 3, 0);
        let snapshot = opt_b.state().unwrap();
        assert_eq!(snapshot.steps, 3);
        assert!(snapshot.params.iter().all(|p| p.steps == 3));
        // Frozen parameters (the base under LoRA) have no state.
        assert_eq!(snapshot.params.len(), b.trainable_parameters().len());

        // Fresh objects: the weights copied over, the optimizer restored.
        let c = model(lora);
        for ((_, from), (_, to)) in params(&b).iter().zip(params(&c)) {
            to.value().copy_from_slice(&from.value().to_vec()).unwrap();
        }
        let mut opt_c = Adam::adamw(c.trainable_parameters(), 1.0, 0.5).unwrap();
        opt_c.restore(&snapshot).unwrap();
        assert_eq!(opt_c.state().unwrap(), snapshot);
        losses_b.extend(train(&c, &mut opt_c, 2, 3));
        assert_eq!(losses_a, losses_b, "lora {lora}");
        assert_eq!(weight_bits(&a), weight_bits(&c), "lora {lora}");
    }
}

fn refused(opt: &mut Adam, state: &AdamState, needle: &str) {
    let before = opt.state().unwrap();
    let e = opt.restore(state).unwrap_err();
    assert!(matches!(e, TransformerError::Config { .. }), "{e}");
    assert!(e.to_string().contains(needle), "{needle:?} not in {e}");
    assert_eq!(opt.state().unwrap(), before, "nothing applied");
}

#[test]
fn a_state_for_other_parameters_is_refused_naming_the_first_mismatch() {
    let m = model(false);
    let mut opt = Adam::new(m.trainable_parameters(), 1e-2).unwrap();
    train(&m, &mut opt, 1, 0);
    let good = opt.state().unwrap();

    let lora = model(true);
    let mut lora_opt = Adam::new(lora.trainable_parameters(), 1e-2).unwrap();
    refused(&mut lora_opt, &good, "trainable parameters");

    let mut s = good.clone();
    s.params.swap(0, 1);
    refused(&mut opt, &s, &format!("{:?}", good.params[1].name));

    let mut s = good.clone();
    s.params[2].shape = vec![1, 2, 3];
    refused(&mut opt, &s, "[1, 2, 3]");

    let mut s = good.clone();
    s.params[1].exp_avg.pop();
    refused(&mut opt, &s, "exp_avg of");

    let mut s = good.clone();
    s.params[3].exp_avg_sq[5] = -1.0;
    refused(&mut opt, &s, "exp_avg_sq[5] = -1");

    let mut s = good.clone();
    s.params[0].exp_avg[0] = f32::NAN;
    refused(&mut opt, &s, "exp_avg[0] = NaN");

    let mut s = good.clone();
    s.params[0].steps = 9;
    refused(&mut opt, &s, "steps = 9");

    let mut s = good.clone();
    s.hyper.lr = -1.0;
    refused(&mut opt, &s, "lr");

    // The good state still loads.
    opt.restore(&good).unwrap();
}

#[test]
fn the_state_round_trips_through_a_safetensors_file_and_bad_files_change_nothing() {
    let dir = std::env::temp_dir().join(format!("riftco-optimizer-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("optimizer.safetensors");
    let m = model(true);
    let mut opt = Adam::adamw(m.trainable_parameters(), 1e-2, 0.01).unwrap();
    train(&m, &mut opt, 2, 0);
    save_optimizer_state(&opt, &path).unwrap();
    let mut fresh = Adam::new(m.trainable_parameters(), 0.5).unwrap();
    load_optimizer_state(&mut fresh, &path).unwrap();
    assert_eq!(fresh.state().unwrap(), opt.state().unwrap());

    // Another model's optimizer (full training): refused, unchanged.
    let full = model(false);
    let mut other = Adam::new(full.trainable_parameters(), 1e-2).unwrap();
    let before = other.state().unwrap();
    let e = load_optimizer_state(&mut other, &path).unwrap_err();
    assert!(e.to_string().contains("optimizer state"), "{e}");
    assert_eq!(other.state().unwrap(), before);

    // A model file is not an optimizer state.
    let weights = dir.join("model.safetensors");
    save_model(&m, &weights).unwrap();
    let e = load_optimizer_state(&mut fresh, &weights).unwrap_err();
    assert!(e.to_string().contains("riftco_optimizer"), "{e}");
    // A missing folder is an I/O error naming it.
    let e = save_optimizer_state(&opt, &dir.join("missing").join("o.safetensors")).unwrap_err();
    assert!(e.to_string().contains("missing"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_loaded_step_count_at_the_maximum_is_refused_by_the_next_step_before_any_update() {
    let m = model(false);
    let mut opt = Adam::new(m.trainable_parameters(), 1e-2).unwrap();
    train(&m, &mut opt, 1, 0);
    let mut s = opt.state().unwrap();
    s.steps = u64::MAX;
    s.params[1].steps = u64::MAX;
    opt.restore(&s).unwrap();
    let loss = m.loss(&tokens(2, 9, 64), 2, 9).unwrap();
    loss.backward().unwrap();
    let before = weight_bits(&m);
    let e = opt.step().unwrap_err();
    assert!(e.to_string().contains("u64::MAX"), "{e}");
    assert_eq!(weight_bits(&m), before, "no parameter was updated");
    assert_eq!(opt.state().unwrap(), s);
}
