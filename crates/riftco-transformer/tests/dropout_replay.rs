//! Dropout under every activation-checkpointing policy: with attention, residual and LoRA
//! dropout all 0.1, every policy trains BITWISE like `disabled` — the loss of each of 150 Adam
//! steps, the gradients and the parameters — for flash and materialized attention. A checkpoint
//! replay reconstructs the forward's masks because a mask is a pure function of the training
//! forward's key and the site's stream `[site, layer]` (Philox4x32-10), never of a generator
//! that advanced in between. Without that (PyTorch's `preserve_rng_state=False`), a replay
//! would draw other masks and the gradients would silently belong to another forward.
//!
//! Also: flash and materialized attention drop the same entries (their losses agree to 1e-5);
//! dropout is active only in training forwards (`loss` while training and recording a graph:
//! `no_grad`, `eval`, `logits` and decoding never drop); each
//! training forward draws new masks; `determinism_check = values` passes on every policy with
//! dropout.

mod common;
mod measure;
use common::{block, lora_config};
use measure::lock;
use riftco_autograd::{
    checkpoint_with_options, no_grad, ops, CheckpointOptions, DeterminismCheck, Variable,
};
use riftco_tensor::{MemoryCategory as C, Tensor};
use riftco_transformer::{
    ActivationCheckpointing as Policy, Adam, DecoderOnlyTransformer,
    FullSequenceAttentionKind as Attn, TransformerConfig,
};
use std::sync::Arc;

const L: usize = 4;
const BATCH: usize = 2;
const SEQ: usize = 12;
const STEPS: usize = 150;
const P: f32 = 0.1;

fn config(p: f32) -> TransformerConfig {
    let mut c = TransformerConfig::new(64, 32, 4, L, 40, 16);
    c.seed = 5;
    c.attention_dropout = p;
    c.residual_dropout = p;
    c
}

fn model(attn: Attn, policy: Policy, lora: bool, p: f32) -> DecoderOnlyTransformer {
    let mut m = DecoderOnlyTransformer::new(config(p), attn, policy).unwrap();
    if lora {
        let mut l = lora_config();
        l.dropout = p;
        m.enable_lora(&l).unwrap();
    }
    m
}

fn tokens(step: usize) -> Vec<u32> {
    let t = block(BATCH, SEQ + 1, 64);
    // A different window of the same stream each step.
    t.iter()
        .map(|&x| (x + step as u32 * 7) % 64)
        .collect::<Vec<u32>>()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// What `STEPS` Adam steps produced: every loss, the gradients of the first and last step, and
/// the final trainable parameters, as bit patterns.
struct Run {
    losses: Vec<u32>,
    first_grads: Vec<Vec<u32>>,
    last_grads: Vec<Vec<u32>>,
    params: Vec<Vec<u32>>,
}

fn train(m: &DecoderOnlyTransformer, steps: usize) -> Run {
    let params = m.trainable_parameters();
    let mut opt = Adam::new(params.clone(), 3e-3).unwrap();
    let grads = || -> Vec<Vec<u32>> {
        params
            .iter()
            .map(|p| {
                bits(
                    &p.grad()
                        .expect("trainable parameters have gradients")
                        .to_vec(),
                )
            })
            .collect()
    };
    let (mut losses, mut first_grads, mut last_grads) = (Vec::new(), Vec::new(), Vec::new());
    for s in 0..steps {
        opt.zero_grad().unwrap();
        let loss = m.loss(&tokens(s), BATCH, SEQ + 1).unwrap();
        losses.push(loss.value().item().unwrap().to_bits());
        loss.backward().unwrap();
        if s == 0 {
            first_grads = grads();
        }
        if s + 1 == steps {
            last_grads = grads();
        }
        opt.step().unwrap();
    }
    Run {
        losses,
        first_grads,
        last_grads,
        params: params.iter().map(|p| bits(&p.value().to_vec())).collect(),
    }
}

fn first_difference(a: &[u32], b: &[u32]) -> Option<(usize, f32, f32)> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .map(|i| (i, f32::from_bits(a[i]), f32::from_bits(b[i])))
}

fn assert_same_run(reference: &Run, r: &Run, what: &str) {
    if let Some((step, x, y)) = first_difference(&reference.losses, &r.losses) {
        panic!("{what}: loss of step {step}: {x} (disabled) vs {y}");
    }
    for (name, a, b) in [
        ("first-step grad", &reference.first_grads, &r.first_grads),
        ("last-step grad", &reference.last_grads, &r.last_grads),
        ("final parameter", &reference.params, &r.params),
    ] {
        assert_eq!(a.len(), b.len(), "{what}: {name} count");
        for (i, (a, b)) in a.iter().zip(b).enumerate() {
            if let Some((j, x, y)) = first_difference(a, b) {
                panic!("{what}: {name} {i}[{j}] {x} (disabled) vs {y}");
            }
        }
    }
}

const POLICIES: [&str; 10] = [
    "block",
    "segments:2",
    "segments:3",
    "auto",
    "selective",
    "selective:dots",
    "selective:attention",
    "selective:q+k+v",
    "disabled,block,selective:dots,selective:q+k+v",
    "budget:1GiB",
];

fn every_policy_trains_like_disabled(attn: Attn, lora: bool) {
    let _g = lock();
    let reference = train(&model(attn, Policy::Disabled, lora, P), STEPS);
    // Dropout is really on: the same steps without it give other losses.
    let plain = train(&model(attn, Policy::Disabled, lora, 0.0), 1);
    assert_ne!(
        plain.losses[0], reference.losses[0],
        "dropout changed nothing"
    );
    for policy in POLICIES {
        let what = format!("{attn:?} lora={lora} {policy}");
        let m = model(attn, policy.parse().unwrap(), lora, P);
        let r = train(&m, STEPS);
        assert_eq!(m.dropout_step(), STEPS as u64, "{what}: dropout steps");
        assert_same_run(&reference, &r, &what);
    }
}

#[test]
fn every_policy_trains_bitwise_like_disabled_with_dropout_flash_lora() {
    every_policy_trains_like_disabled(Attn::Flash, true);
}

#[test]
fn every_policy_trains_bitwise_like_disabled_with_dropout_materialized_lora() {
    every_policy_trains_like_disabled(Attn::Materialized, true);
}

#[test]
fn every_policy_trains_bitwise_like_disabled_with_dropout_flash_base() {
    every_policy_trains_like_disabled(Attn::Flash, false);
}

#[test]
fn every_policy_trains_bitwise_like_disabled_with_dropout_materialized_base() {
    every_policy_trains_like_disabled(Attn::Materialized, false);
}

fn rel_diff(a: f32, b: f32) -> f32 {
    (a - b).abs() / a.abs().max(b.abs()).max(1e-30)
}

#[test]
fn flash_and_materialized_attention_drop_the_same_entries() {
    let _g = lock();
    for lora in [false, true] {
        let flash = train(&model(Attn::Flash, Policy::Block, lora, P), 20);
        let mat = train(&model(Attn::Materialized, Policy::Block, lora, P), 20);
        for (s, (a, b)) in flash.losses.iter().zip(&mat.losses).enumerate() {
            let (a, b) = (f32::from_bits(*a), f32::from_bits(*b));
            assert!(
                rel_diff(a, b) <= 1e-5,
                "lora={lora} step {s}: flash {a} vs materialized {b}"
            );
        }
        // Gradients of the first step, within 1e-4 of the largest (summation orders differ).
        for (i, (a, b)) in flash.first_grads.iter().zip(&mat.first_grads).enumerate() {
            let a: Vec<f32> = a.iter().map(|&x| f32::from_bits(x)).collect();
            let b: Vec<f32> = b.iter().map(|&x| f32::from_bits(x)).collect();
            common::rel_close(&a, &b, 1e-4, &format!("lora={lora} grad {i}"));
        }
    }
    // With another attention dropout only, the two kinds still agree: the mask is one function.
    let mut c = config(0.0);
    c.attention_dropout = 0.5;
    let mk = |attn| DecoderOnlyTransformer::new(c.clone(), attn, Policy::Disabled).unwrap();
    let (f, m) = (
        train(&mk(Attn::Flash), 1),
        train(&mk(Attn::Materialized), 1),
    );
    let (a, b) = (f32::from_bits(f.losses[0]), f32::from_bits(m.losses[0]));
    assert!(
        rel_diff(a, b) <= 1e-5,
        "p=0.5: flash {a} vs materialized {b}"
    );
}

#[test]
fn dropout_is_active_only_in_training_forwards() {
    let _g = lock();
    for attn in [Attn::Flash, Attn::Materialized] {
        let mut dropped = model(attn, Policy::Block, true, P);
        let plain = model(attn, Policy::Block, true, 0.0);
        let t = tokens(0);
        let value = |m: &DecoderOnlyTransformer| m.loss(&t, BATCH, SEQ + 1).unwrap();
        let loss_bits = |m: &DecoderOnlyTransformer| value(m).value().item().unwrap().to_bits();
        // Evaluation (no graph) never drops and takes no dropout step.
        let eval = no_grad(|| loss_bits(&dropped));
        assert_eq!(eval, no_grad(|| loss_bits(&plain)), "{attn:?}: no_grad");
        assert_eq!(dropped.dropout_step(), 0, "{attn:?}: no_grad took a step");
        let logits = |m: &DecoderOnlyTransformer| {
            bits(
                &no_grad(|| m.logits(&t[..SEQ], 1, SEQ).unwrap())
                    .value()
                    .to_vec(),
            )
        };
        assert_eq!(logits(&dropped), logits(&plain), "{attn:?}: logits");
        // logits() never drops, also while recording a graph in training mode.
        let graph_logits = |m: &DecoderOnlyTransformer| {
            bits(&m.logits(&t[..SEQ], 1, SEQ).unwrap().value().to_vec())
        };
        assert_eq!(
            graph_logits(&dropped),
            graph_logits(&plain),
            "{attn:?}: logits"
        );
        assert_eq!(dropped.dropout_step(), 0, "{attn:?}: logits took a step");
        // Training forwards drop, each with new masks.
        let (a, b) = (loss_bits(&dropped), loss_bits(&dropped));
        assert_ne!(a, eval, "{attn:?}: a training forward did not drop");
        assert_ne!(a, b, "{attn:?}: two training forwards drew the same masks");
        assert_eq!(dropped.dropout_step(), 2);
        // The step is the stream: rewinding it redraws the same masks.
        dropped.set_dropout_step(0);
        assert_eq!(loss_bits(&dropped), a, "{attn:?}: step 0 again");
        // Evaluation mode records a graph without dropping; the gradients are the plain model's.
        dropped.set_training(false);
        let (le, lp) = (value(&dropped), value(&plain));
        assert_eq!(
            le.value().item().unwrap().to_bits(),
            eval,
            "{attn:?}: eval()"
        );
        le.backward().unwrap();
        lp.backward().unwrap();
        for (p, q) in dropped
            .trainable_parameters()
            .iter()
            .zip(plain.trainable_parameters())
        {
            assert_eq!(
                bits(&p.grad().unwrap().to_vec()),
                bits(&q.grad().unwrap().to_vec()),
                "{attn:?}: eval() gradients"
            );
        }
        // Decoding never drops.
        dropped.set_training(true);
        let decode = |m: &DecoderOnlyTransformer| {
            let mut s = m.decode_session().unwrap();
            t[..6]
                .iter()
                .map(|&tok| bits(&s.decode_token(tok).unwrap()))
                .collect::<Vec<_>>()
        };
        assert_eq!(decode(&dropped), decode(&plain), "{attn:?}: decoding");
    }
}

#[test]
fn values_determinism_check_passes_on_every_policy_with_dropout() {
    let _g = lock();
    for attn in [Attn::Flash, Attn::Materialized] {
        let reference = train(&model(attn, Policy::Disabled, true, P), 3);
        for policy in POLICIES {
            let mut m = model(attn, policy.parse().unwrap(), true, P);
            m.set_determinism_check(DeterminismCheck::Values);
            let r = train(&m, 3);
            assert_same_run(&reference, &r, &format!("{attn:?} {policy} values"));
        }
    }
}

/// `x + model.loss(tokens)` through a checkpoint of the caller's (not a model policy): the
/// replay runs the model's training forward again, which must draw the forward run's dropout
/// step (and so its masks) when the checkpoint preserves the RNG state.
fn model_inside_a_checkpoint(preserve: bool) -> (Vec<Vec<u32>>, u64) {
    let t = tokens(0);
    let m = Arc::new(model(Attn::Flash, Policy::Disabled, false, 0.3));
    let params = m.trainable_parameters();
    let x = Variable::leaf(
        Tensor::from_vec(vec![0.0], Vec::<usize>::new(), C::Parameter).unwrap(),
        true,
    );
    let m2 = m.clone();
    let options = CheckpointOptions {
        preserve_rng_state: preserve,
        ..CheckpointOptions::default()
    };
    let y = checkpoint_with_options("model inside", &x, &params, &options, move |h, _| {
        let loss = m2
            .loss(&t, BATCH, SEQ + 1)
            .map_err(riftco_autograd::AutogradError::external)?;
        ops::add(h, &loss)
    })
    .unwrap();
    y.backward().unwrap();
    let grads = params
        .iter()
        .map(|p| bits(&p.grad().unwrap().to_vec()))
        .collect();
    (grads, m.dropout_step())
}

#[test]
fn a_training_forward_inside_a_checkpoint_replays_its_masks() {
    let _g = lock();
    let plain_model = model(Attn::Flash, Policy::Disabled, false, 0.3);
    let loss = plain_model.loss(&tokens(0), BATCH, SEQ + 1).unwrap();
    loss.backward().unwrap();
    let plain: Vec<Vec<u32>> = plain_model
        .trainable_parameters()
        .iter()
        .map(|p| bits(&p.grad().unwrap().to_vec()))
        .collect();
    let (preserved, steps) = model_inside_a_checkpoint(true);
    assert_eq!(steps, 1, "the replay took a dropout step of its own");
    assert_eq!(preserved, plain, "replayed with other masks");
    // Without preserving the RNG state the replay is another training forward (step 1): its
    // masks differ, and so do the gradients (what PyTorch's preserve_rng_state=False does).
    let (fresh, steps) = model_inside_a_checkpoint(false);
    assert_eq!(steps, 2);
    assert_ne!(fresh, plain);
}

#[test]
fn the_dropout_step_never_wraps() {
    let _g = lock();
    let mut m = model(Attn::Flash, Policy::Block, false, P);
    m.set_dropout_step(u64::MAX);
    let err = m.loss(&tokens(0), BATCH, SEQ + 1).unwrap_err().to_string();
    assert!(
        err.contains("dropout_step") && err.contains("wrap"),
        "{err}"
    );
    assert_eq!(m.dropout_step(), u64::MAX);
    m.set_dropout_step(u64::MAX - 1);
    m.loss(&tokens(0), BATCH, SEQ + 1).unwrap();
    assert_eq!(m.dropout_step(), u64::MAX);
}
