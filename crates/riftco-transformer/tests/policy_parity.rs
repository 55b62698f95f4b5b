//! Disabled vs TransformerBlock checkpointing: loss, every trainable gradient and the parameters
//! after one Adam step agree (1e-6 relative), for materialized and flash attention, base model and
//! active LoRA. Recompute count and graph statistics under TransformerBlock.

mod common;
use common::{block, model, rel_close};
use riftco_transformer::{
    ActivationCheckpointingKind as Ck, Adam, FullSequenceAttentionKind as Attn,
};

fn parity(attn: Attn, lora: bool) {
    let tokens = block(2, 17, 64);
    let mut results = Vec::new();
    for ck in [Ck::Disabled, Ck::TransformerBlock] {
        let m = model(attn, ck, lora);
        let loss = m.loss(&tokens, 2, 17).unwrap();
        loss.backward().unwrap();
        let params = m.trainable_parameters();
        let grads: Vec<Vec<f32>> = params.iter().map(|p| p.grad().unwrap().to_vec()).collect();
        let mut opt = Adam::new(params.clone(), 1e-2).unwrap();
        opt.step().unwrap();
        let after: Vec<Vec<f32>> = params.iter().map(|p| p.value().to_vec()).collect();
        results.push((loss.value().item().unwrap(), grads, after, params.len()));
    }
    let (a, b) = (&results[0], &results[1]);
    assert_eq!(a.3, b.3);
    if lora {
        assert_eq!(a.3, 3 * 7 * 2, "LoRA: only adapters are trainable");
    }
    assert!(
        (a.0 - b.0).abs() <= 1e-6 * a.0.abs(),
        "loss {} vs {}",
        a.0,
        b.0
    );
    for (i, (ga, gb)) in a.1.iter().zip(&b.1).enumerate() {
        rel_close(ga, gb, 1e-6, &format!("{attn:?} lora={lora} grad {i}"));
    }
    for (i, (pa, pb)) in a.2.iter().zip(&b.2).enumerate() {
        rel_close(
            pa,
            pb,
            1e-6,
            &format!("{attn:?} lora={lora} param {i} after Adam"),
        );
    }
}

#[test]
fn parity_materialized_base() {
    parity(Attn::Materialized, false);
}

#[test]
fn parity_flash_base() {
    parity(Attn::Flash, false);
}

#[test]
fn parity_materialized_lora() {
    parity(Attn::Materialized, true);
}

#[test]
fn parity_flash_lora() {
    parity(Attn::Flash, true);
}

#[test]
fn block_policy_recomputes_each_block_once_and_retains_less() {
    let tokens = block(2, 17, 64);
    for attn in [Attn::Materialized, Attn::Flash] {
        let plain = model(attn, Ck::Disabled, false);
        let loss = plain.loss(&tokens, 2, 17).unwrap();
        let s_plain = loss.graph_statistics();
        loss.backward().unwrap();
        assert_eq!(plain.block_forward_count(), 3);

        let ck = model(attn, Ck::TransformerBlock, false);
        let loss = ck.loss(&tokens, 2, 17).unwrap();
        assert_eq!(ck.block_forward_count(), 3);
        let s_ck = loss.graph_statistics();
        loss.backward().unwrap();
        assert_eq!(
            ck.block_forward_count(),
            6,
            "each block replays exactly once"
        );
        assert!(
            s_ck.node_count < s_plain.node_count,
            "{s_ck:?} vs {s_plain:?}"
        );
        assert!(
            s_ck.element_count < s_plain.element_count,
            "{s_ck:?} vs {s_plain:?}"
        );
    }
}

#[test]
fn flash_matches_materialized_logits_and_gradients() {
    let tokens = block(2, 17, 64);
    let mut out = Vec::new();
    for attn in [Attn::Materialized, Attn::Flash] {
        let m = model(attn, Ck::Disabled, false);
        let logits = m.logits(&tokens[..32], 2, 16).unwrap().value().to_vec();
        let loss = m.loss(&tokens, 2, 17).unwrap();
        loss.backward().unwrap();
        let grads: Vec<Vec<f32>> = m
            .trainable_parameters()
            .iter()
            .map(|p| p.grad().unwrap().to_vec())
            .collect();
        out.push((logits, grads));
    }
    let ((la, ga), (lb, gb)) = (&out[0], &out[1]);
    for (x, y) in la.iter().zip(lb) {
        assert!((x - y).abs() <= 1e-5, "logits {x} vs {y}");
    }
    for (i, (a, b)) in ga.iter().zip(gb).enumerate() {
        let scale = a.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        for (x, y) in a.iter().zip(b) {
            assert!(
                (x - y).abs() <= 1e-5 * scale.max(1.0),
                "grad {i}: {x} vs {y}"
            );
        }
    }
}

#[test]
fn policy_switch_between_steps() {
    let tokens = block(1, 9, 64);
    let mut m = model(Attn::Flash, Ck::Disabled, false);
    assert_eq!(*m.activation_checkpointing(), Ck::Disabled.into());
    let l1 = m.loss(&tokens, 1, 9).unwrap().value().item().unwrap();
    m.set_activation_checkpointing_kind(Ck::TransformerBlock);
    assert_eq!(m.activation_checkpointing().to_string(), "block");
    let l2 = m.loss(&tokens, 1, 9).unwrap().value().item().unwrap();
    assert_eq!(l1, l2);
}
