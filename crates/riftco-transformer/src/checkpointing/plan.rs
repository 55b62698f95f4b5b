//! A resolved plan: which blocks form which checkpoint, and how the training forward runs it.

use super::planner::BlockMeasurement;
use super::spec::{ActivationCheckpointing, BlockPolicy, SaveSet};
use crate::block::{block_forward_for, BlockContext, Layer};
use crate::error::{Result, TransformerError};
use crate::residency::{self, AcquireReason, BackwardHold, ResidencyUnit, SharedResidency};
use riftco_autograd::{
    checkpoint_with_options, CheckpointOptions, CheckpointPass, DeterminismCheck, Variable,
};
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// Consecutive blocks run under one per-block policy: one block for `disabled` and
/// `selective`, K blocks for a `segments:K` checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanSegment {
    /// The block indices.
    pub layers: Range<usize>,
    /// What they do.
    pub policy: BlockPolicy,
}

/// The per-block plan a policy resolves to for one input shape.
#[derive(Clone, Debug)]
pub struct CheckpointPlan {
    /// The policy asked for.
    pub policy: ActivationCheckpointing,
    /// The segments, covering every block in order.
    pub segments: Vec<PlanSegment>,
    /// The segment length K a `segments:K`, `block` or `auto` policy uses.
    pub segment_length: Option<usize>,
    /// For `auto` and budgets: the peak activation bytes of a training step the planner
    /// predicts from its measurements (see [`super::planner`]).
    pub predicted_peak_bytes: Option<u64>,
    /// For `auto` and budgets: the predicted forward + backward seconds of the blocks and the
    /// head.
    pub predicted_step_seconds: Option<f64>,
    /// For `auto` and budgets: what the planner measured.
    pub measurement: Option<Arc<BlockMeasurement>>,
}

impl CheckpointPlan {
    /// The plan of a policy that needs no measurement (everything but `auto` and budgets), for
    /// `n_layers` blocks; `None` for `auto` and budgets.
    ///
    /// # Errors
    /// [`TransformerError::Config`] when the policy does not fit `n_layers`
    /// ([`ActivationCheckpointing::validate`]).
    pub fn fixed(policy: &ActivationCheckpointing, n_layers: usize) -> Result<Option<Self>> {
        policy.validate(n_layers)?;
        let each = |p: BlockPolicy| -> Vec<PlanSegment> {
            (0..n_layers)
                .map(|i| PlanSegment {
                    layers: i..i + 1,
                    policy: p.clone(),
                })
                .collect()
        };
        let (segments, k) = match policy {
            ActivationCheckpointing::Disabled => (each(BlockPolicy::Disabled), None),
            ActivationCheckpointing::Block => (each(BlockPolicy::Checkpoint), Some(1)),
            ActivationCheckpointing::Segments(k) => (segments_of(*k, n_layers), Some(*k)),
            ActivationCheckpointing::Selective(s) => {
                (each(BlockPolicy::Selective(s.clone())), None)
            }
            ActivationCheckpointing::PerBlock(list) => (
                list.iter()
                    .enumerate()
                    .map(|(i, p)| PlanSegment {
                        layers: i..i + 1,
                        policy: p.clone(),
                    })
                    .collect(),
                None,
            ),
            ActivationCheckpointing::Auto | ActivationCheckpointing::Budget(_) => return Ok(None),
        };
        Ok(Some(Self {
            policy: policy.clone(),
            segments,
            segment_length: k,
            predicted_peak_bytes: None,
            predicted_step_seconds: None,
            measurement: None,
        }))
    }

    /// The policy of each block, in order (`block` for every block of a multi-block segment).
    pub fn per_block(&self) -> Vec<BlockPolicy> {
        self.segments
            .iter()
            .flat_map(|s| s.layers.clone().map(move |_| s.policy.clone()))
            .collect()
    }

    /// Runs the blocks on `x [batch, seq, d_model]` under this plan, recording the training
    /// graph; `calls` counts block forwards (replays included). Every checkpoint the plan
    /// creates compares its replay at level `check` and preserves the generator state. With a
    /// residency owner each block is acquired before it runs and released as
    /// [`crate::residency`] describes; the unit after the last block is the final norm.
    ///
    /// # Errors
    /// Those of the block forward, of `checkpoint` and of the owner's acquire.
    pub fn forward(
        &self,
        x: Variable,
        layers: &[Arc<Layer>],
        ctx: &BlockContext,
        calls: &Arc<AtomicUsize>,
        check: DeterminismCheck,
        owner: Option<&SharedResidency>,
    ) -> Result<Variable> {
        let mut x = x;
        for (s, seg) in self.segments.iter().enumerate() {
            let residency = owner.map(|o| SegmentResidency {
                owner: o.clone(),
                after: self
                    .segments
                    .get(s + 1)
                    .map_or(ResidencyUnit::FinalNorm, |n| {
                        ResidencyUnit::Block(n.layers.start)
                    }),
                // The backward pass replays the checkpoints in reverse order: the one before
                // this segment comes next.
                replay_next: s
                    .checked_sub(1)
                    .map(|p| ResidencyUnit::Block(self.segments[p].layers.start)),
            });
            x = run_segment(
                &x,
                &layers[seg.layers.clone()],
                seg,
                ctx,
                calls,
                check,
                residency.as_ref(),
            )?;
        }
        Ok(x)
    }
}

/// The residency owner of a segment's blocks, with the units that come after them.
#[derive(Clone)]
pub(crate) struct SegmentResidency {
    pub(crate) owner: SharedResidency,
    /// The unit the forward acquires after the segment's last block.
    pub(crate) after: ResidencyUnit,
    /// The block the backward pass acquires after this segment's blocks (the first block of
    /// the segment before), if any.
    pub(crate) replay_next: Option<ResidencyUnit>,
}

impl SegmentResidency {
    /// Acquires the segment's blocks `first..first + n` in order, each naming the next unit.
    fn acquire(
        &self,
        first: usize,
        n: usize,
        reason: AcquireReason,
    ) -> riftco_autograd::Result<()> {
        for j in 0..n {
            let next = if j + 1 < n {
                Some(ResidencyUnit::Block(first + j + 1))
            } else if reason == AcquireReason::Replay {
                self.replay_next
            } else {
                Some(self.after)
            };
            self.owner
                .acquire(ResidencyUnit::Block(first + j), reason, next)?;
        }
        Ok(())
    }

    fn release(&self, first: usize, n: usize) {
        for j in 0..n {
            self.owner.release(ResidencyUnit::Block(first + j));
        }
    }
}

/// `segments:k` over `n` blocks: `ceil(n / k)` segments, the last one shorter when `k` does
/// not divide `n`.
pub(crate) fn segments_of(k: usize, n: usize) -> Vec<PlanSegment> {
    (0..n)
        .step_by(k.max(1))
        .map(|a| PlanSegment {
            layers: a..(a + k).min(n),
            policy: BlockPolicy::Checkpoint,
        })
        .collect()
}

/// One segment of the plan on `x`: plain blocks for `disabled`, one checkpoint over the
/// segment's blocks (dependencies: the union of their leaves) otherwise, named `block N
/// (model.layers.N)` or `blocks N-M (model.layers.N-M)` and comparing its replay at level
/// `check`.
pub(crate) fn run_segment(
    x: &Variable,
    layers: &[Arc<Layer>],
    seg: &PlanSegment,
    ctx: &BlockContext,
    calls: &Arc<AtomicUsize>,
    check: DeterminismCheck,
    residency: Option<&SegmentResidency>,
) -> Result<Variable> {
    let first = seg.layers.start;
    let options = match &seg.policy {
        BlockPolicy::Disabled => {
            let mut x = x.clone();
            for (i, layer) in layers.iter().enumerate() {
                let unit = ResidencyUnit::Block(first + i);
                let hold = residency.and_then(|r| BackwardHold::new(Some(&r.owner), unit));
                if let Some(r) = residency {
                    r.acquire(first + i, 1, AcquireReason::Forward)?;
                }
                if let Some(h) = &hold {
                    // Released once the block's VJPs ran (the identity's VJP on its input).
                    x = residency::release_after_backward(&x, h);
                }
                calls.fetch_add(1, Ordering::Relaxed);
                let ctx = ctx.at_layer(first + i);
                let out = block_forward_for(&x, layer, &ctx, CheckpointPass::Forward);
                if let Some(r) = residency {
                    // The graph's handles keep the storage, without elements until the backward
                    // pass reaches the block and acquires it again (the identity on its output).
                    r.release(first + i, 1);
                }
                x = out?;
                if let (Some(r), Some(h)) = (residency, hold) {
                    let next = (i == 0)
                        .then_some(r.replay_next)
                        .flatten()
                        .or_else(|| i.checked_sub(1).map(|j| ResidencyUnit::Block(first + j)));
                    x = residency::acquire_before_backward(&x, h, next);
                }
            }
            return Ok(x);
        }
        BlockPolicy::Checkpoint => CheckpointOptions::default(),
        BlockPolicy::Selective(s) => saving(s),
    }
    .with_determinism_check(check);
    let n = layers.len();
    let options = match residency {
        // Released after each replay's VJP.
        Some(r) => {
            let r = r.clone();
            options.with_replay_end(move || r.release(first, n))
        }
        None => options,
    };
    let deps: Vec<Variable> = layers.iter().flat_map(|l| l.forward_leaves()).collect();
    let name = match seg.layers.len() {
        1 => format!("block {0} (model.layers.{0})", seg.layers.start),
        _ => {
            let (a, b) = (seg.layers.start, seg.layers.end.saturating_sub(1));
            format!("blocks {a}-{b} (model.layers.{a}-{b})")
        }
    };
    let (layers, ctx, calls) = (layers.to_vec(), ctx.clone(), calls.clone());
    let inner = residency.cloned();
    // The first run is the forward; every later one a replay in a backward pass.
    let ran = AtomicBool::new(false);
    let out = checkpoint_with_options(&name, x, &deps, &options, move |x, pass| {
        if let Some(r) = &inner {
            let reason = if ran.swap(true, Ordering::AcqRel) {
                AcquireReason::Replay
            } else {
                AcquireReason::Forward
            };
            r.acquire(first, n, reason)?;
        }
        let mut x = x.clone();
        let last = layers.len() - 1;
        for (j, layer) in layers.iter().enumerate() {
            calls.fetch_add(1, Ordering::Relaxed);
            // Only the segment's output value is never read at replay; the inner blocks'
            // outputs feed the next block.
            let pass = if j == last {
                pass
            } else {
                CheckpointPass::Forward
            };
            let ctx = ctx.at_layer(first + j);
            x = block_forward_for(&x, layer, &ctx, pass).map_err(into_autograd)?;
        }
        Ok(x)
    });
    // Released after the forward run, whether it succeeded or not.
    if let Some(r) = residency {
        r.release(first, n);
    }
    Ok(out?)
}

fn saving(s: &SaveSet) -> CheckpointOptions {
    CheckpointOptions::saving(s.names().iter().copied())
}

pub(crate) fn into_autograd(e: TransformerError) -> riftco_autograd::AutogradError {
    match e {
        TransformerError::Autograd(a) => a,
        other => riftco_autograd::AutogradError::external(other),
    }
}

/// `123 B`, `12.1 KiB`, `3.5 MiB`, `1.2 GiB`.
pub(crate) fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

impl fmt::Display for CheckpointPlan {
    /// `auto → block[0-1] block[2-3]; predicted peak activation 12.0 MiB, predicted step 80.1 ms`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} →", self.policy)?;
        for s in &self.segments {
            let (a, b) = (s.layers.start, s.layers.end.saturating_sub(1));
            if a == b {
                write!(f, " {}[{a}]", s.policy)?;
            } else {
                write!(f, " {}[{a}-{b}]", s.policy)?;
            }
        }
        if let Some(p) = self.predicted_peak_bytes {
            write!(f, "; predicted peak activation {}", human_bytes(p))?;
        }
        if let Some(t) = self.predicted_step_seconds {
            write!(f, ", predicted step {:.1} ms", t * 1e3)?;
        }
        Ok(())
    }
}
