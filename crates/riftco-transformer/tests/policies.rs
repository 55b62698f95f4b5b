//! Every activation-checkpointing policy against `disabled`: loss, every trainable gradient and
//! the parameters after one Adam step are equal BITWISE, for flash and materialized attention,
//! base model and active LoRA, with the recompute count each policy implies. Bitwise is the
//! right bar: a checkpoint replay runs the same kernels on the same inputs in the same order,
//! and a selective checkpoint rebuilds the saved nodes with the values of its forward run, so
//! no accumulation order changes.
//!
//! Also: bad spellings and policies that do not fit the model are `TransformerError::Config`
//! naming the value and what is accepted (at `new`, at `set_activation_checkpointing`, at the
//! first training forward of `from_weights`); plan caching; the policy is not model state;
//! evaluation under `no_grad` ignores the policy and never plans.
//!
//! `auto` and budgets plan from the process-wide memory counters, so every test that runs a
//! model holds [`measure::lock`]: under `cargo test` (threads) another test's allocations would
//! otherwise enter the planner's measurements.

mod common;
mod measure;
use common::{block, lora_config};
use measure::lock;
use riftco_autograd::no_grad;
use riftco_transformer::checkpointing::BLOCK_VALUE_NAMES;
use riftco_transformer::{
    load_model, save_model, ActivationCheckpointing as Policy, Adam, BlockPolicy, CheckpointPlan,
    DecoderOnlyTransformer, FullSequenceAttentionKind as Attn, TransformerConfig, TransformerError,
};
use std::sync::Arc;

const L: usize = 5;
const BATCH: usize = 2;
const SEQ: usize = 16;

fn config() -> TransformerConfig {
    // 5 blocks: segments:2 is 2+2+1 and segments:3 is 3+2 (the last segment shorter).
    let mut c = TransformerConfig::new(64, 32, 4, L, 48, 24);
    c.seed = 11;
    c
}

fn model(attn: Attn, policy: Policy, lora: bool) -> DecoderOnlyTransformer {
    let mut m = DecoderOnlyTransformer::new(config(), attn, policy).unwrap();
    if lora {
        m.enable_lora(&lora_config()).unwrap();
        // B starts at zero; give every adapter values so its gradients are not trivial.
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

fn tokens() -> Vec<u32> {
    block(BATCH, SEQ + 1, 64)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// What one training step under a policy produced, as bit patterns.
struct Step {
    policy: String,
    per_block: Vec<BlockPolicy>,
    loss: u32,
    grads: Vec<Vec<u32>>,
    after_adam: Vec<Vec<u32>>,
    /// Block forwards after the forward and after the backward.
    calls: (usize, usize),
}

fn step(attn: Attn, lora: bool, policy: Policy) -> Step {
    let m = model(attn, policy.clone(), lora);
    // Planning (measured for auto and budgets) runs its own block forwards, not counted.
    let plan = m.activation_checkpointing_plan(BATCH, SEQ).unwrap();
    assert_eq!(m.block_forward_count(), 0, "{policy}: planning counted");
    let loss = m.loss(&tokens(), BATCH, SEQ + 1).unwrap();
    let forward_calls = m.block_forward_count();
    loss.backward().unwrap();
    let backward_calls = m.block_forward_count();
    let params = m.trainable_parameters();
    let grads = params
        .iter()
        .map(|p| {
            bits(
                &p.grad()
                    .expect("every trainable parameter has a gradient")
                    .to_vec(),
            )
        })
        .collect();
    let mut opt = Adam::new(params.clone(), 1e-2).unwrap();
    opt.step().unwrap();
    Step {
        policy: policy.to_string(),
        per_block: plan.per_block(),
        loss: loss.value().item().unwrap().to_bits(),
        grads,
        after_adam: params.iter().map(|p| bits(&p.value().to_vec())).collect(),
        calls: (forward_calls, backward_calls),
    }
}

fn first_difference(a: &[u32], b: &[u32]) -> Option<(usize, f32, f32)> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .map(|i| (i, f32::from_bits(a[i]), f32::from_bits(b[i])))
}

fn assert_bitwise(reference: &Step, s: &Step, what: &str) {
    assert_eq!(
        reference.loss,
        s.loss,
        "{what}: loss {} vs {}",
        f32::from_bits(reference.loss),
        f32::from_bits(s.loss)
    );
    assert_eq!(reference.grads.len(), s.grads.len(), "{what}: trainables");
    for (i, (a, b)) in reference.grads.iter().zip(&s.grads).enumerate() {
        assert_eq!(a.len(), b.len(), "{what}: grad {i} length");
        if let Some((j, x, y)) = first_difference(a, b) {
            panic!("{what}: grad {i}[{j}] {x} (disabled) vs {y}");
        }
    }
    for (i, (a, b)) in reference.after_adam.iter().zip(&s.after_adam).enumerate() {
        if let Some((j, x, y)) = first_difference(a, b) {
            panic!("{what}: param {i}[{j}] after Adam {x} (disabled) vs {y}");
        }
    }
}

/// A budget halfway between the predicted peaks of `block` and `disabled` at the test shape
/// (from the planner's measurement of this model).
fn middle_budget(attn: Attn, lora: bool) -> u64 {
    let mut m = model(attn, Policy::Auto, lora);
    let plan = m.activation_checkpointing_plan(BATCH, SEQ).unwrap();
    let meas = plan.measurement.clone().expect("auto is measured");
    let peak = |p: &Policy| {
        let fixed = CheckpointPlan::fixed(p, L).unwrap().unwrap();
        meas.predict(&fixed.segments).0
    };
    let (lo, hi) = (peak(&Policy::Block), peak(&Policy::Disabled));
    assert!(lo < hi, "block {lo} vs disabled {hi}");
    let budget = lo + (hi - lo) / 2;
    // The budget plan of the same model mixes policies (neither extreme).
    m.set_activation_checkpointing(Policy::Budget(budget))
        .unwrap();
    let plan = m.activation_checkpointing_plan(BATCH, SEQ).unwrap();
    let per_block = plan.per_block();
    assert!(
        per_block.iter().any(|p| *p != BlockPolicy::Disabled),
        "budget {budget} between {lo} and {hi}: {plan}"
    );
    budget
}

fn parity_of_every_policy(attn: Attn, lora: bool) {
    let what = |p: &str| format!("{attn:?} lora={lora} {p}");
    let reference = step(attn, lora, Policy::Disabled);
    assert_eq!(reference.calls, (L, L), "disabled: one forward per block");
    if lora {
        assert_eq!(
            reference.grads.len(),
            L * 7 * 2,
            "LoRA: only adapters train"
        );
    }
    let mut policies: Vec<Policy> = [
        "block",
        "segments:1",
        "segments:2",
        "segments:3",
        "segments:5",
        "auto",
        "selective",
        "selective:attention_ffn",
        "selective:dots",
        "selective:attention",
        "selective:q+k+v",
        "disabled,block,selective:dots,selective:q+k+v,block",
    ]
    .iter()
    .map(|s| s.parse().unwrap())
    .collect();
    policies.push(Policy::Budget(middle_budget(attn, lora)));
    for policy in policies {
        let s = step(attn, lora, policy.clone());
        assert_bitwise(&reference, &s, &what(&s.policy));
        // Each block runs once in the forward; every block inside a checkpoint (whole,
        // segment or selective) replays exactly once in the backward.
        let checkpointed = s
            .per_block
            .iter()
            .filter(|p| **p != BlockPolicy::Disabled)
            .count();
        assert_eq!(s.calls, (L, L + checkpointed), "{}", what(&s.policy));
        let expected_checkpointed = match &policy {
            Policy::PerBlock(_) => 4,
            Policy::Budget(_) => checkpointed,
            _ => L,
        };
        assert_eq!(checkpointed, expected_checkpointed, "{}", what(&s.policy));
    }
}

#[test]
fn every_policy_is_bitwise_disabled_flash_base() {
    let _g = lock();
    parity_of_every_policy(Attn::Flash, false);
}

#[test]
fn every_policy_is_bitwise_disabled_materialized_base() {
    let _g = lock();
    parity_of_every_policy(Attn::Materialized, false);
}

#[test]
fn every_policy_is_bitwise_disabled_flash_lora() {
    let _g = lock();
    parity_of_every_policy(Attn::Flash, true);
}

#[test]
fn every_policy_is_bitwise_disabled_materialized_lora() {
    let _g = lock();
    parity_of_every_policy(Attn::Materialized, true);
}

/// Every block value name saved alone, and all of them together, as custom selective sets:
/// each is used by the block forward (an unused name would be `SaveNameUnused`) and keeps the
/// step bitwise `disabled`'s.
#[test]
fn every_block_value_name_is_a_selective_set_bitwise_disabled() {
    let _g = lock();
    let all: Vec<&str> = BLOCK_VALUE_NAMES.iter().map(|(n, _)| *n).collect();
    let mut sets: Vec<String> = all.iter().map(|n| n.to_string()).collect();
    sets.push(all.join("+"));
    for attn in [Attn::Flash, Attn::Materialized] {
        for lora in [false, true] {
            let reference = step(attn, lora, Policy::Disabled);
            for set in &sets {
                let policy: Policy = format!("selective:{set}").parse().unwrap();
                let s = step(attn, lora, policy);
                assert_bitwise(
                    &reference,
                    &s,
                    &format!("{attn:?} lora={lora} {}", s.policy),
                );
                assert_eq!(s.calls, (L, 2 * L), "{}", s.policy);
            }
        }
    }
}

/// A graph recorded under one policy stays valid after the policy changes; two losses under
/// different policies, backward after the switch, accumulate the gradients two `disabled`
/// losses do.
#[test]
fn graphs_recorded_before_a_policy_switch_keep_their_policy() {
    let _g = lock();
    let run = |first: &str, second: &str| {
        let mut m = model(Attn::Flash, first.parse().unwrap(), false);
        let a = m.loss(&tokens(), BATCH, SEQ + 1).unwrap();
        m.set_activation_checkpointing(second.parse().unwrap())
            .unwrap();
        let b = m.loss(&tokens(), BATCH, SEQ + 1).unwrap();
        a.backward().unwrap();
        b.backward().unwrap();
        let grads: Vec<Vec<u32>> = m
            .trainable_parameters()
            .iter()
            .map(|p| bits(&p.grad().unwrap().to_vec()))
            .collect();
        (grads, m.block_forward_count())
    };
    let (reference, calls) = run("disabled", "disabled");
    assert_eq!(calls, 2 * L);
    for (first, second, replays) in [
        ("block", "disabled", L),
        ("segments:2", "selective:dots", 2 * L),
        ("auto", "disabled,block,disabled,block,disabled", L + 2),
    ] {
        let (grads, calls) = run(first, second);
        assert_eq!(calls, 2 * L + replays, "{first} then {second}");
        for (i, (a, b)) in reference.iter().zip(&grads).enumerate() {
            if let Some((j, x, y)) = first_difference(a, b) {
                panic!("{first} then {second}: grad {i}[{j}] {x} (disabled) vs {y}");
            }
        }
    }
}

#[test]
fn segment_plans_cover_every_block_with_a_shorter_last_segment() {
    let layers = |s: &str| -> Vec<(usize, usize)> {
        let plan = CheckpointPlan::fixed(&s.parse().unwrap(), L)
            .unwrap()
            .unwrap();
        plan.segments
            .iter()
            .map(|s| (s.layers.start, s.layers.end))
            .collect()
    };
    assert_eq!(layers("segments:2"), [(0, 2), (2, 4), (4, 5)]);
    assert_eq!(layers("segments:3"), [(0, 3), (3, 5)]);
    assert_eq!(layers("segments:5"), [(0, 5)]);
    assert_eq!(layers("block"), layers("segments:1"));
    assert_eq!(
        CheckpointPlan::fixed(&"segments:3".parse().unwrap(), L)
            .unwrap()
            .unwrap()
            .segment_length,
        Some(3)
    );
}

// ---------------------------------------------------------------------------------------------
// Bad input

fn config_error(e: TransformerError, needles: &[&str]) {
    let text = e.to_string();
    assert!(
        matches!(e, TransformerError::Config { .. }),
        "not a Config error: {text}"
    );
    for n in needles {
        assert!(text.contains(n), "{text:?} does not name {n:?}");
    }
}

#[test]
fn bad_spellings_are_config_errors_naming_the_value_and_the_accepted_forms() {
    for (s, needles) in [
        ("segments:0", &["\"segments:0\"", "K >= 1"][..]),
        ("segments:-1", &["\"segments:-1\"", "K >= 1"]),
        ("segments:", &["\"segments:\"", "K >= 1"]),
        ("segments:two", &["\"segments:two\"", "K >= 1"]),
        (
            "selective:fast",
            &[
                "\"selective:fast\"",
                "\"fast\"",
                "\"dots\"",
                "\"attention_ffn\"",
            ],
        ),
        ("selective:q+kk", &["\"kk\"", "\"q\"", "\"swiglu\""]),
        ("selective:", &["\"selective:\"", "\"dots\""]),
        ("full", &["\"full\"", "segments:K", "budget:SIZE"]),
        ("block,segments:2", &["\"segments:2\"", "\"disabled\""]),
        ("budget:12XB", &["\"12XB\"", "MiB", "unit"]),
        ("budget:", &["activation_memory_budget", "no number"]),
    ] {
        let e = s.parse::<Policy>().unwrap_err();
        config_error(e, needles);
    }
}

#[test]
fn policies_that_do_not_fit_the_model_are_errors_at_new_and_at_set() {
    let _g = lock();
    let too_long = format!("segments:{}", L + 1);
    let wrong_length: Policy = "block,disabled,block".parse().unwrap();
    let n_layers = format!("n_layers = {L}");
    let cases: Vec<(Policy, Vec<String>)> = vec![
        (
            too_long.parse().unwrap(),
            vec![
                format!("\"{too_long}\""),
                n_layers.clone(),
                "not clamped".into(),
            ],
        ),
        (
            Policy::Segments(0),
            vec!["\"segments:0\"".into(), n_layers.clone()],
        ),
        (
            wrong_length,
            vec![
                "\"block,disabled,block\"".into(),
                "3 given".into(),
                n_layers.clone(),
            ],
        ),
    ];
    for (policy, needles) in cases {
        let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
        let e = DecoderOnlyTransformer::new(config(), Attn::Flash, policy.clone()).unwrap_err();
        config_error(e, &needles);

        let mut m = model(Attn::Flash, "segments:2".parse().unwrap(), false);
        let e = m.set_activation_checkpointing(policy.clone()).unwrap_err();
        config_error(e, &needles);
        assert_eq!(
            m.activation_checkpointing().to_string(),
            "segments:2",
            "{policy}: a failed set changed the policy"
        );
        // The model still trains under its old policy.
        let loss = m.loss(&tokens(), BATCH, SEQ + 1).unwrap();
        loss.backward().unwrap();
        assert_eq!(m.block_forward_count(), 2 * L);

        // A model built around existing weights reports it at the first training forward.
        let w = (**m.weights()).clone();
        let m = DecoderOnlyTransformer::from_weights(w, Attn::Flash, policy.clone());
        let e = m.loss(&tokens(), BATCH, SEQ + 1).unwrap_err();
        config_error(e, &needles);
        assert_eq!(m.block_forward_count(), 0, "{policy}: a block ran");
    }
    // The largest segment length fits.
    let mut m = model(Attn::Flash, Policy::Disabled, false);
    m.set_activation_checkpointing(Policy::Segments(L)).unwrap();
    assert_eq!(*m.activation_checkpointing(), Policy::Segments(L));
}

#[test]
fn a_budget_below_the_smallest_peak_is_an_error_naming_it() {
    let _g = lock();
    let m = model(Attn::Flash, Policy::Budget(1), false);
    let e = m.activation_checkpointing_plan(BATCH, SEQ).unwrap_err();
    let text = e.to_string();
    config_error(
        e,
        &[
            "activation_memory_budget",
            "1 bytes",
            "smallest achievable peak",
        ],
    );
    // The named peak is achievable: a budget of exactly that many bytes plans, one byte less
    // does not.
    let smallest: u64 = text
        .split("smallest achievable peak activation at batch 2, seq 16 is ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no peak in {text:?}"));
    let mut m = model(Attn::Flash, Policy::Budget(smallest), false);
    let plan = m.activation_checkpointing_plan(BATCH, SEQ).unwrap();
    assert!(plan.predicted_peak_bytes.unwrap() <= smallest, "{plan}");
    m.set_activation_checkpointing(Policy::Budget(smallest - 1))
        .unwrap();
    let e = m.loss(&tokens(), BATCH, SEQ + 1).unwrap_err();
    config_error(
        e,
        &[
            &format!("{} bytes", smallest - 1),
            &format!("is {smallest} bytes"),
        ],
    );
}

#[test]
fn planning_an_impossible_shape_is_an_error_not_a_panic() {
    let _g = lock();
    // Fixed policies need no measurement but check the shape the same way.
    for policy in [
        Policy::Auto,
        Policy::Budget(1 << 30),
        Policy::Disabled,
        Policy::Block,
        Policy::Segments(2),
    ] {
        let m = model(Attn::Flash, policy.clone(), false);
        for (batch, seq) in [(BATCH, 0), (0, SEQ)] {
            let e = m.activation_checkpointing_plan(batch, seq).unwrap_err();
            assert!(
                matches!(e, TransformerError::Tokens { .. }),
                "{policy} [{batch}, {seq}]: {e}"
            );
            assert!(
                e.to_string()
                    .contains(&format!("batch {batch} and seq {seq}")),
                "{e}"
            );
        }
        let e = m.activation_checkpointing_plan(BATCH, 25).unwrap_err();
        assert!(
            matches!(
                e,
                TransformerError::SequenceTooLong {
                    seq: 25,
                    max_seq_len: 24
                }
            ),
            "{policy}: {e}"
        );
        // Nothing was kept: the model still plans and trains at a valid shape.
        let loss = m.loss(&tokens(), BATCH, SEQ + 1).unwrap();
        loss.backward().unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// Plan caching and state

#[test]
fn the_plan_is_kept_until_shape_attention_policy_or_weights_change() {
    let _g = lock();
    let mut m = model(Attn::Flash, Policy::Auto, false);
    let a = m.activation_checkpointing_plan(BATCH, SEQ).unwrap();
    let same = |x: &Arc<CheckpointPlan>, y: &Arc<CheckpointPlan>| Arc::ptr_eq(x, y);
    assert!(same(
        &a,
        &m.activation_checkpointing_plan(BATCH, SEQ).unwrap()
    ));
    // A training forward at the same shape uses the kept plan.
    let loss = m.loss(&tokens(), BATCH, SEQ + 1).unwrap();
    assert!(same(
        &a,
        &m.activation_checkpointing_plan(BATCH, SEQ).unwrap()
    ));
    drop(loss);
    // Setting what it already is keeps the plan.
    m.set_activation_checkpointing(Policy::Auto).unwrap();
    m.set_attention_kind(Attn::Flash);
    assert!(same(
        &a,
        &m.activation_checkpointing_plan(BATCH, SEQ).unwrap()
    ));

    // Shape.
    let b = m.activation_checkpointing_plan(BATCH, SEQ / 2).unwrap();
    assert!(!same(&a, &b));
    assert_eq!(b.measurement.as_ref().unwrap().seq, SEQ / 2);
    let b2 = m.activation_checkpointing_plan(1, SEQ / 2).unwrap();
    assert!(!same(&b, &b2));
    assert_eq!(b2.measurement.as_ref().unwrap().batch, 1);
    // Going back to a shape planned before reuses its plan (the model keeps its last 8).
    let c = m.activation_checkpointing_plan(BATCH, SEQ).unwrap();
    assert!(same(&a, &c));
    assert!(same(
        &b,
        &m.activation_checkpointing_plan(BATCH, SEQ / 2).unwrap()
    ));
    assert!(same(
        &c,
        &m.activation_checkpointing_plan(BATCH, SEQ).unwrap()
    ));

    // Attention kind: materialized attention retains the probabilities, so a block retains
    // more.
    m.set_attention_kind(Attn::Materialized);
    let d = m.activation_checkpointing_plan(BATCH, SEQ).unwrap();
    assert!(!same(&c, &d));
    let (mc, md) = (
        c.measurement.clone().unwrap(),
        d.measurement.clone().unwrap(),
    );
    assert!(md.layer_bytes > mc.layer_bytes, "{mc:?} vs {md:?}");

    // Policy.
    m.set_activation_checkpointing(Policy::Block).unwrap();
    let e = m.activation_checkpointing_plan(BATCH, SEQ).unwrap();
    assert!(!same(&d, &e));
    assert_eq!(e.policy, Policy::Block);
    assert!(e.measurement.is_none());
    m.set_activation_checkpointing(Policy::Auto).unwrap();
    let f = m.activation_checkpointing_plan(BATCH, SEQ).unwrap();
    assert!(!same(&e, &f));
    assert_eq!(f.policy, Policy::Auto);

    // Weight set: LoRA adds the adapters' activations to every block.
    m.enable_lora(&lora_config()).unwrap();
    let g = m.activation_checkpointing_plan(BATCH, SEQ).unwrap();
    assert!(!same(&f, &g));
    let (mf, mg) = (
        f.measurement.clone().unwrap(),
        g.measurement.clone().unwrap(),
    );
    assert!(mg.layer_bytes > mf.layer_bytes, "{mf:?} vs {mg:?}");
    assert!(same(
        &g,
        &m.activation_checkpointing_plan(BATCH, SEQ).unwrap()
    ));
    m.set_lora_active(false).unwrap();
    let h = m.activation_checkpointing_plan(BATCH, SEQ).unwrap();
    assert!(!same(&g, &h));
    assert_eq!(h.measurement.as_ref().unwrap().layer_bytes, mf.layer_bytes);
}

#[test]
fn a_fixed_plan_is_replanned_when_the_weights_change() {
    let _g = lock();
    let mut m = model(Attn::Flash, "segments:2".parse().unwrap(), false);
    let a = m.activation_checkpointing_plan(BATCH, SEQ).unwrap();
    assert!(Arc::ptr_eq(
        &a,
        &m.activation_checkpointing_plan(BATCH, SEQ).unwrap()
    ));
    m.enable_lora(&lora_config()).unwrap();
    let b = m.activation_checkpointing_plan(BATCH, SEQ).unwrap();
    assert!(!Arc::ptr_eq(&a, &b));
    assert_eq!(a.per_block(), b.per_block());
}

#[test]
fn the_policy_is_not_model_state() {
    let _g = lock();
    let dir = std::env::temp_dir().join(format!("riftco-policies-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.safetensors");
    let m = model(Attn::Flash, "segments:3".parse().unwrap(), false);
    save_model(&m, &path).unwrap();
    for policy in [
        "disabled",
        "block",
        "auto",
        "selective:dots",
        "budget:64MiB",
    ] {
        let p: Policy = policy.parse().unwrap();
        let loaded = load_model(&path, Attn::Flash, p.clone()).unwrap();
        assert_eq!(*loaded.activation_checkpointing(), p);
    }
    // The policy given at load is checked against the loaded model.
    let e = load_model(&path, Attn::Flash, Policy::Segments(L + 1)).unwrap_err();
    config_error(e, &[&format!("segments:{}", L + 1)]);
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Evaluation

#[test]
fn evaluation_ignores_the_policy_and_never_plans() {
    let _g = lock();
    let input = &tokens()[..BATCH * SEQ];
    for attn in [Attn::Flash, Attn::Materialized] {
        let eval = |policy: Policy| {
            let m = model(attn, policy, false);
            let logits = no_grad(|| m.logits(input, BATCH, SEQ)).unwrap();
            assert!(!logits.requires_grad());
            assert_eq!(
                m.block_forward_count(),
                L,
                "{attn:?}: one forward per block"
            );
            (bits(&logits.value().to_vec()), m)
        };
        let (reference, _) = eval(Policy::Disabled);
        for s in [
            "block",
            "segments:2",
            "auto",
            "selective:dots",
            "disabled,block,selective,block,disabled",
            // Far below any achievable peak: an error if anything planned.
            "budget:1",
        ] {
            let (logits, m) = eval(s.parse().unwrap());
            if let Some((j, x, y)) = first_difference(&reference, &logits) {
                panic!("{attn:?} {s}: logit {j} {x} (disabled) vs {y}");
            }
            if s == "auto" {
                // Asked for explicitly, a plan is measured with recording on, also inside
                // `no_grad`.
                let plan = no_grad(|| m.activation_checkpointing_plan(BATCH, SEQ)).unwrap();
                let meas = plan.measurement.clone().unwrap();
                assert!(meas.layer_bytes > meas.boundary_bytes, "{meas:?}");
                assert_eq!(m.block_forward_count(), L);
            }
            // With recording on, the policy applies again (the budget fails to plan).
            match m.loss(&tokens(), BATCH, SEQ + 1) {
                Ok(loss) => {
                    loss.backward().unwrap();
                    assert!(m.block_forward_count() > 2 * L, "{attn:?} {s}: no replay");
                }
                Err(e) => {
                    assert_eq!(s, "budget:1", "{e}");
                    config_error(e, &["smallest achievable peak"]);
                }
            }
        }
    }
}

/// The model keeps the plans of its last 8 shapes: a 9th evicts the least recently used.
#[test]
fn the_plan_cache_keeps_the_last_eight_shapes() {
    let m = model(Attn::Flash, Policy::Block, false);
    let first = m.activation_checkpointing_plan(1, 1).unwrap();
    for seq in 2..=8 {
        m.activation_checkpointing_plan(1, seq).unwrap();
    }
    let again = m.activation_checkpointing_plan(1, 1).unwrap();
    assert!(Arc::ptr_eq(&first, &again), "8 shapes fit");
    // Touch seq 2 then 3..=8: seq 1 is the least recently used, and the 9th shape evicts it;
    // one more new shape evicts seq 2.
    let second = m.activation_checkpointing_plan(1, 2).unwrap();
    for seq in 3..=9 {
        m.activation_checkpointing_plan(1, seq).unwrap();
    }
    let kept = m.activation_checkpointing_plan(1, 2).unwrap();
    assert!(Arc::ptr_eq(&second, &kept), "seq 2 was used more recently");
    m.activation_checkpointing_plan(2, 9).unwrap();
    assert!(!Arc::ptr_eq(
        &first,
        &m.activation_checkpointing_plan(1, 1).unwrap()
    ));
}
