//! Model contracts: stale graphs after an Adam step or a changed frozen base weight, decode
//! parity and cache independence, graph lifetime after the model is dropped, config and token
//! validation, flash attention's O(seq) retained memory.

mod common;
use common::{block, model, small_config};
use riftco_autograd::AutogradError;
use riftco_transformer::{
    ActivationCheckpointingKind as Ck, Adam, DecoderOnlyTransformer,
    FullSequenceAttentionKind as Attn, TransformerConfig,
};

#[test]
fn adam_step_between_forward_and_backward_is_rejected_for_both_policies() {
    let tokens = block(2, 9, 64);
    for ck in [Ck::Disabled, Ck::TransformerBlock] {
        let m = model(Attn::Flash, ck, false);
        let mut opt = Adam::new(m.trainable_parameters(), 1e-3).unwrap();
        m.loss(&tokens, 2, 9).unwrap().backward().unwrap();
        let stale = m.loss(&tokens, 2, 9).unwrap();
        opt.step().unwrap();
        let err = stale.backward().unwrap_err();
        assert!(
            matches!(err, AutogradError::StaleGraph { .. }),
            "policy {ck}: {err}"
        );
        // The normal loop after the step works.
        m.loss(&tokens, 2, 9).unwrap().backward().unwrap();
        opt.step().unwrap();
    }
}

#[test]
fn changed_frozen_base_weight_is_rejected_under_lora() {
    let tokens = block(2, 9, 64);
    for ck in [Ck::Disabled, Ck::TransformerBlock] {
        let m = model(Attn::Materialized, ck, true);
        let loss = m.loss(&tokens, 2, 9).unwrap();
        let (name, base) = m.named_parameters().into_iter().nth(3).unwrap();
        assert!(!base.requires_grad(), "{name} should be frozen under LoRA");
        base.value().write().unwrap()[0] += 1.0;
        let err = loss.backward().unwrap_err();
        assert!(matches!(err, AutogradError::StaleGraph { .. }), "{err}");
        assert!(err.to_string().contains(&name), "{err} should name {name}");
        for p in m.trainable_parameters() {
            assert!(p.grad().is_none(), "nothing may be committed");
        }
    }
}

#[test]
fn decode_matches_full_sequence_logits_at_every_position() {
    for lora in [false, true] {
        let m = model(Attn::Flash, Ck::Disabled, lora);
        let tokens: Vec<u32> = block(1, 20, 64);
        let full = m.logits(&tokens, 1, 20).unwrap().value().to_vec();
        let mut session = m.decode_session().unwrap();
        for (pos, &t) in tokens.iter().enumerate() {
            let logits = session.decode_token(t).unwrap();
            let row = &full[pos * 64..(pos + 1) * 64];
            for (a, b) in logits.iter().zip(row) {
                assert!((a - b).abs() <= 1e-5, "lora {lora} pos {pos}: {a} vs {b}");
            }
        }
        assert_eq!(session.position(), 20);
    }
}

#[test]
fn training_and_policy_changes_between_decode_steps_leave_the_cache_alone() {
    let tokens: Vec<u32> = block(1, 12, 64);
    let reference: Vec<Vec<f32>> = {
        let m = model(Attn::Flash, Ck::Disabled, false);
        let mut s = m.decode_session().unwrap();
        tokens.iter().map(|&t| s.decode_token(t).unwrap()).collect()
    };
    let mut m = model(Attn::Flash, Ck::Disabled, false);
    let mut s = m.decode_session().unwrap();
    let train = block(2, 9, 64);
    for (i, &t) in tokens.iter().enumerate() {
        assert_eq!(s.decode_token(t).unwrap(), reference[i], "position {i}");
        // training forward + backward (no optimizer step: weights unchanged) with either policy
        m.loss(&train, 2, 9).unwrap().backward().unwrap();
        let next = if i % 2 == 0 {
            Ck::TransformerBlock
        } else {
            Ck::Disabled
        };
        m.set_activation_checkpointing_kind(next);
    }
}

#[test]
fn dropping_the_model_after_forward_keeps_backward_and_decode_working() {
    let tokens = block(2, 9, 64);
    for ck in [Ck::Disabled, Ck::TransformerBlock] {
        let m = model(Attn::Flash, ck, false);
        let params = m.trainable_parameters();
        let loss = m.loss(&tokens, 2, 9).unwrap();
        let mut session = m.decode_session().unwrap();
        drop(m);
        loss.backward().unwrap();
        assert!(params.iter().all(|p| p.grad().is_some()));
        session.decode_token(3).unwrap();
    }
}

#[test]
fn config_errors_name_the_value() {
    let base = small_config();
    let cases: Vec<(TransformerConfig, &str)> = vec![
        (
            TransformerConfig {
                vocab_size: 0,
                ..base.clone()
            },
            "vocab_size = 0",
        ),
        (
            TransformerConfig {
                d_model: 30,
                ..base.clone()
            },
            "d_model 30 is not divisible",
        ),
        (
            TransformerConfig {
                d_model: 12,
                n_heads: 4,
                ..base.clone()
            },
            "d_head = d_model / n_heads = 3",
        ),
        (
            TransformerConfig {
                n_layers: 0,
                ..base.clone()
            },
            "n_layers = 0",
        ),
        (
            TransformerConfig {
                rms_norm_eps: -1.0,
                ..base.clone()
            },
            "rms_norm_eps = -1",
        ),
    ];
    for (cfg, needle) in cases {
        let err = DecoderOnlyTransformer::new(cfg, Attn::Flash, Ck::Disabled)
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{err:?} should contain {needle:?}");
    }
}

#[test]
fn token_errors_name_the_value() {
    let m = model(Attn::Flash, Ck::Disabled, false);
    let e = m.loss(&block(1, 26, 64), 1, 26).unwrap_err().to_string();
    assert!(
        e.contains("sequence length 25 exceeds max_seq_len 24"),
        "{e}"
    );
    let mut bad = block(1, 9, 64);
    bad[4] = 64;
    let e = m.loss(&bad, 1, 9).unwrap_err().to_string();
    assert!(e.contains("token id 64 at index 4"), "{e}");
    let e = m.loss(&block(1, 9, 64), 2, 9).unwrap_err().to_string();
    assert!(e.contains("9 tokens do not form"), "{e}");
    let e = m.loss(&[1], 1, 1).unwrap_err().to_string();
    assert!(e.contains("seq + 1 >= 2"), "{e}");
    let mut s = m.decode_session().unwrap();
    assert!(s
        .decode_token(99)
        .unwrap_err()
        .to_string()
        .contains("token id 99"));
    for _ in 0..24 {
        s.decode_token(1).unwrap();
    }
    assert!(s
        .decode_token(1)
        .unwrap_err()
        .to_string()
        .contains("cache is full"));
    assert!("fast"
        .parse::<Attn>()
        .unwrap_err()
        .to_string()
        .contains("\"flash\", \"materialized\""));
    assert!("segments"
        .parse::<Ck>()
        .unwrap_err()
        .to_string()
        .contains("\"disabled\", \"block\""));
}
