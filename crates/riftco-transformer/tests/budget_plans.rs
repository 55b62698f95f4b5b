//! The activation-memory planner (`budget:SIZE`), measured: at a small reference-like
//! configuration (vocab 256, d_model 64, 8 heads, 8 layers, d_ff 176, seq 64, batch 2) a budget
//! at 25 %, 50 % or 75 % of the way from `block`'s measured peak to `disabled`'s gives a plan
//! whose measured peak fits the budget and is within ±5 % of the plan's own prediction; a
//! budget at or above `disabled`'s peak gives the all-`disabled` plan; a budget below the
//! smallest achievable peak is a `TransformerError::Config` naming that peak.
//!
//! Memory counters are process-wide: every measuring test holds [`measure::lock`].

mod measure;
use measure::{lock, measure_step, relative_error};
use riftco_transformer::checkpointing::planner::{budget_plan, BlockMeasurement, PolicyCost};
use riftco_transformer::{
    ActivationCheckpointing as Policy, BlockPolicy, CheckpointPlan, DecoderOnlyTransformer,
    FullSequenceAttentionKind as Attn, SaveSet, TransformerConfig, TransformerError,
};
use std::sync::Arc;

const BATCH: usize = 2;
const SEQ: usize = 64;

fn planner_config() -> TransformerConfig {
    let mut c = TransformerConfig::new(256, 64, 8, 8, 176, SEQ);
    c.seed = 9;
    c
}

fn model(attn: Attn, p: Policy) -> DecoderOnlyTransformer {
    DecoderOnlyTransformer::new(planner_config(), attn, p).unwrap()
}

fn all_disabled(plan: &CheckpointPlan) -> bool {
    plan.per_block().iter().all(|p| *p == BlockPolicy::Disabled)
}

fn budgets_fit_measured(attn: Attn) {
    let _g = lock();
    let disabled = measure_step(&model(attn, Policy::Disabled), BATCH, SEQ).peak;
    let block = measure_step(&model(attn, Policy::Block), BATCH, SEQ).peak;
    eprintln!("{attn:?}: measured peak activation bytes: disabled {disabled}, block {block}");
    assert!(block < disabled);
    for frac in [0.25, 0.5, 0.75, 1.0, 1.5] {
        let budget = block + ((disabled - block) as f64 * frac) as u64;
        let m = model(attn, Policy::Budget(budget));
        let plan = m.activation_checkpointing_plan(BATCH, SEQ).unwrap();
        let predicted = plan
            .predicted_peak_bytes
            .expect("a budget plan predicts its peak");
        let peak = measure_step(&m, BATCH, SEQ).peak;
        let err = relative_error(peak, predicted);
        eprintln!(
            "{attn:?} budget at {:>3.0} %: {budget} bytes, predicted {predicted}, measured {peak} \
             ({:+.2} %): {plan}",
            100.0 * frac,
            100.0 * err
        );
        assert!(predicted <= budget, "{plan}");
        assert!(
            peak <= budget,
            "measured peak {peak} above the budget {budget}: {plan}"
        );
        assert!(
            err.abs() <= 0.05,
            "measured {peak} vs predicted {predicted}: {plan}"
        );
        if frac >= 1.0 {
            assert!(all_disabled(&plan), "disabled fits {budget}: {plan}");
            assert_eq!(peak, disabled);
        } else {
            assert!(
                !all_disabled(&plan),
                "disabled does not fit {budget}: {plan}"
            );
        }
        // The planner never predicts a plan slower than `block`, which fits every budget here.
        let meas = plan.measurement.clone().unwrap();
        let block_plan = CheckpointPlan::fixed(&Policy::Block, 8).unwrap().unwrap();
        let (_, block_seconds) = meas.predict(&block_plan.segments);
        assert!(
            plan.predicted_step_seconds.unwrap() <= block_seconds,
            "{plan}"
        );
    }
}

#[test]
fn budget_plans_fit_the_budget_and_their_prediction_flash() {
    budgets_fit_measured(Attn::Flash);
}

#[test]
fn budget_plans_fit_the_budget_and_their_prediction_materialized() {
    budgets_fit_measured(Attn::Materialized);
}

fn smallest_peak_in(e: &TransformerError) -> u64 {
    let text = e.to_string();
    text.split("smallest achievable peak activation at batch ")
        .nth(1)
        .and_then(|t| t.split(" is ").nth(1))
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no smallest peak in {text:?}"))
}

#[test]
fn a_budget_below_the_smallest_achievable_peak_names_it() {
    let _g = lock();
    let attn = Attn::Flash;
    let block = measure_step(&model(attn, Policy::Block), BATCH, SEQ).peak;
    let m = model(attn, Policy::Budget(block / 4));
    let e = m.activation_checkpointing_plan(BATCH, SEQ).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, TransformerError::Config { .. }), "{text}");
    assert!(text.contains("activation_memory_budget"), "{text}");
    assert!(text.contains(&format!("{} bytes", block / 4)), "{text}");
    assert!(
        text.contains(&format!("batch {BATCH}, seq {SEQ}")),
        "{text}"
    );
    let smallest = smallest_peak_in(&e);
    eprintln!("smallest achievable peak {smallest} (block measured {block}): {text}");
    // `block` is a candidate plan, so the smallest is no larger than its peak, and it is
    // achieved.
    assert!(smallest <= block, "{smallest} vs block {block}");
    let m = model(attn, Policy::Budget(smallest));
    let plan = m.activation_checkpointing_plan(BATCH, SEQ).unwrap();
    let peak = measure_step(&m, BATCH, SEQ).peak;
    assert!(peak <= smallest, "{peak} vs {smallest}: {plan}");
    // The training forward reports it too, before any block runs.
    let m = model(attn, Policy::Budget(smallest - 1));
    let t = measure::tokens(BATCH, SEQ + 1, 256);
    let e = m.loss(&t, BATCH, SEQ + 1).unwrap_err();
    assert_eq!(smallest_peak_in(&e), smallest);
    assert_eq!(m.block_forward_count(), 0);
}

/// A measurement of 4 blocks in which a selective policy timed faster than `disabled` (timing
/// noise at small shapes: a checkpoint runs everything `disabled` runs plus a replay).
fn noisy_measurement() -> Arc<BlockMeasurement> {
    let cost = |policy: BlockPolicy, retained, transient, seconds| PolicyCost {
        policy,
        retained_bytes: retained,
        transient_bytes: transient,
        // A forward holds no more than the backward's replay.
        forward_peak_bytes: transient.max(retained),
        seconds,
    };
    let selective = |name: &str| BlockPolicy::Selective(SaveSet::parse(name).unwrap());
    Arc::new(BlockMeasurement {
        batch: 1,
        seq: 8,
        n_layers: 4,
        boundary_bytes: 10,
        layer_bytes: 100,
        head_retained_bytes: 20,
        head_transient_bytes: 5,
        embedding_bytes: 10,
        head_kept_bytes: 4,
        head_forward_peak_bytes: 5,
        head_seconds: 0.5,
        costs: vec![
            cost(BlockPolicy::Disabled, 100, 100, 1.0),
            cost(selective("attention_ffn"), 60, 70, 1.1),
            cost(selective("dots"), 70, 60, 1.2),
            cost(selective("attention"), 50, 80, 0.99),
            cost(BlockPolicy::Checkpoint, 10, 100, 1.5),
        ],
    })
}

#[test]
fn a_budget_disabled_fits_plans_disabled_even_when_a_checkpoint_timed_faster() {
    let m = noisy_measurement();
    let disabled = CheckpointPlan::fixed(&Policy::Disabled, 4)
        .unwrap()
        .unwrap();
    let (disabled_peak, _) = m.predict(&disabled.segments);
    // The last block's backward: the embedding output, four blocks' values, the block's
    // transient and what the head's backward left.
    assert_eq!(disabled_peak, 10 + 4 * 100 + 100 + 4);
    for budget in [disabled_peak, disabled_peak + 1, 10 * disabled_peak] {
        let plan = budget_plan(m.clone(), budget).unwrap();
        assert!(all_disabled(&plan), "budget {budget}: {plan}");
        assert_eq!(plan.predicted_peak_bytes, Some(disabled_peak));
    }
    // Below it, a plan that recomputes no more than it must: only as many selective blocks as
    // the budget needs (`attention` saves 50 bytes a block and its replay peaks at 80).
    let plan = budget_plan(m.clone(), disabled_peak - 50).unwrap();
    let checkpointed = plan
        .per_block()
        .iter()
        .filter(|p| **p != BlockPolicy::Disabled)
        .count();
    assert_eq!(checkpointed, 1, "{plan}");
}

#[test]
fn a_larger_budget_never_predicts_a_slower_plan() {
    let _g = lock();
    let m = model(Attn::Flash, Policy::Auto);
    let meas = m
        .activation_checkpointing_plan(BATCH, SEQ)
        .unwrap()
        .measurement
        .clone()
        .unwrap();
    let peak_of = |p: &Policy| {
        let fixed = CheckpointPlan::fixed(p, 8).unwrap().unwrap();
        meas.predict(&fixed.segments).0
    };
    let (lo, hi) = (peak_of(&Policy::Block), peak_of(&Policy::Disabled));
    let mut last: Option<(u64, f64)> = None;
    for i in 0..=16 {
        let budget = lo + (hi - lo) * i / 16;
        let plan = budget_plan(meas.clone(), budget).unwrap();
        let (peak, seconds) = (
            plan.predicted_peak_bytes.unwrap(),
            plan.predicted_step_seconds.unwrap(),
        );
        assert!(peak <= budget);
        if let Some((b, s)) = last {
            assert!(
                seconds <= s,
                "budget {b}: {s} s, budget {budget}: {seconds} s: {plan}"
            );
        }
        last = Some((budget, seconds));
    }
    assert!(all_disabled(&budget_plan(meas.clone(), hi).unwrap()));
}

/// On a deep model whose block activations dwarf its boundary tensor, `segments:2` reaches a
/// lower peak than any per-block plan; a budget between the two is planned with segments
/// (it was refused, naming `block`'s peak as the smallest achievable), and the smallest
/// achievable peak the error names is the segments plan's.
#[test]
fn a_budget_only_multi_block_segments_meet_is_planned_with_them() {
    let cost = |policy: BlockPolicy, retained, transient, seconds| PolicyCost {
        policy,
        retained_bytes: retained,
        transient_bytes: transient,
        // A forward holds no more than the backward's replay.
        forward_peak_bytes: transient.max(retained),
        seconds,
    };
    let l = 64;
    let m = Arc::new(BlockMeasurement {
        batch: 2,
        seq: 16,
        n_layers: l,
        boundary_bytes: 1024,
        layer_bytes: 8192,
        head_retained_bytes: 500,
        head_transient_bytes: 0,
        embedding_bytes: 0,
        head_kept_bytes: 0,
        head_forward_peak_bytes: 0,
        head_seconds: 0.1,
        costs: vec![
            cost(BlockPolicy::Disabled, 8192, 0, 1.0),
            cost(BlockPolicy::Checkpoint, 1024, 8192, 1.3),
        ],
    });
    let fixed = |p: Policy| CheckpointPlan::fixed(&p, l).unwrap().unwrap();
    let (block_peak, _) = m.predict(&fixed(Policy::Block).segments);
    let (seg2_peak, _) = m.predict(&fixed(Policy::Segments(2)).segments);
    // The first replay's: every boundary and one replay (the head's 500 bytes are freed by
    // then: its backward ran first).
    assert_eq!(block_peak, 64 * 1024 + 8192);
    assert_eq!(seg2_peak, 32 * 1024 + 8192 + 8192);
    assert!(seg2_peak < block_peak);
    let plan = budget_plan(m.clone(), seg2_peak).unwrap();
    assert_eq!(plan.predicted_peak_bytes, Some(seg2_peak), "{plan}");
    assert!(plan.segments.iter().any(|s| s.layers.len() > 1), "{plan}");
    let smallest = (2..=l)
        .map(|k| m.predict(&fixed(Policy::Segments(k)).segments).0)
        .min()
        .unwrap();
    let e = budget_plan(m, smallest - 1).unwrap_err().to_string();
    assert!(e.contains(&format!("is {smallest} bytes")), "{e}");
    assert!(e.contains("segments of"), "{e}");
}
