//! A decode session follows the values of its model's weights but not structural changes:
//! after enable_lora, set_lora_active, merge_lora or replace_weights the session opened before
//! refuses to decode (before: it decoded silently with the old weight set, logits off by
//! 0.08–0.23), and a new session matches the model's full-sequence logits.

mod common;
use common::{block, model};
use riftco_transformer::{
    ActivationCheckpointingKind as Ck, Adam, DecoderOnlyTransformer,
    FullSequenceAttentionKind as Attn, LoraConfig, LoraTargets, TransformerError,
};

fn lora_config() -> LoraConfig {
    LoraConfig {
        rank: 4,
        alpha: 8.0,
        targets: LoraTargets::default(),
        seed: 5,
        dropout: 0.0,
    }
}

/// A fresh session over `m` decodes `tokens` exactly as the full-sequence forward does.
fn assert_fresh_session_matches_logits(m: &DecoderOnlyTransformer, tokens: &[u32], what: &str) {
    let full = m.logits(tokens, 1, tokens.len()).unwrap().value().to_vec();
    let mut s = m.decode_session().unwrap();
    for (pos, &t) in tokens.iter().enumerate() {
        let logits = s.decode_token(t).unwrap();
        for (a, b) in logits.iter().zip(&full[pos * 64..(pos + 1) * 64]) {
            assert!((a - b).abs() <= 1e-5, "{what} pos {pos}: {a} vs {b}");
        }
    }
}

#[test]
fn structural_changes_make_the_old_session_refuse_to_decode() {
    type Change = fn(&mut DecoderOnlyTransformer);
    let changes: [(&str, bool, Change); 4] = [
        ("merge_lora", true, |m| m.merge_lora().unwrap()),
        ("set_lora_active", true, |m| {
            m.set_lora_active(false).unwrap()
        }),
        ("enable_lora", false, |m| {
            m.enable_lora(&lora_config()).unwrap()
        }),
        ("replace_weights", false, |m| {
            let w = (**m.weights()).clone();
            m.replace_weights(w)
        }),
    ];
    let tokens = block(1, 6, 64);
    for (name, lora, change) in changes {
        let mut m = model(Attn::Flash, Ck::Disabled, lora);
        let mut session = m.decode_session().unwrap();
        session.decode_token(tokens[0]).unwrap();
        session.decode_token(tokens[1]).unwrap();
        change(&mut m);
        let err = session.decode_token(tokens[2]).unwrap_err();
        assert!(
            matches!(err, TransformerError::Decode { .. }),
            "{name}: {err:?}"
        );
        let msg = err.to_string();
        assert!(msg.contains(name) && msg.contains("new session"), "{msg}");
        session.reset();
        assert!(
            session.decode_token(tokens[0]).is_err(),
            "{name}: reset lifts it"
        );
        assert_fresh_session_matches_logits(&m, &tokens, name);
    }
}

#[test]
fn value_changes_and_no_op_calls_keep_the_session_open() {
    let mut m = model(Attn::Flash, Ck::Disabled, true);
    let mut session = m.decode_session().unwrap();
    session.decode_token(1).unwrap();
    // Setting the state the adapters already have is not a change.
    m.set_lora_active(true).unwrap();
    session.decode_token(2).unwrap();
    // Training changes values in place: the session reads them at the next token.
    let mut opt = Adam::new(m.trainable_parameters(), 1e-2).unwrap();
    m.loss(&block(2, 9, 64), 2, 9).unwrap().backward().unwrap();
    opt.step().unwrap();
    session.decode_token(3).unwrap();
    assert_eq!(session.position(), 3);
}

/// Decoding runs the block's own forward against the K/V cache, so it follows the model's
/// attention kind: materialized attention (queries of one position against `pos + 1` cached
/// keys, the causal mask offset by `seq_k − seq_q`) matches the full-sequence logits too.
#[test]
fn decode_with_materialized_attention_matches_full_sequence_logits() {
    for lora in [false, true] {
        let m = common::model(Attn::Materialized, Ck::Disabled, lora);
        let tokens = common::block(1, 24, 64);
        let full = m.logits(&tokens, 1, 24).unwrap().value().to_vec();
        let mut session = m.decode_session().unwrap();
        for (pos, &t) in tokens.iter().enumerate() {
            let logits = session.decode_token(t).unwrap();
            common::rel_close(
                &logits,
                &full[pos * 64..(pos + 1) * 64],
                1e-5,
                &format!("lora {lora} pos {pos}"),
            );
        }
        // The cache is full at max_seq_len (24 here): the next token is refused.
        assert!(session.decode_token(0).is_err());
    }
}
