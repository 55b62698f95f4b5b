//! Measured planning: `auto` (segment length from measured bytes) and activation-memory
//! budgets (per-block policies that fit a byte budget at the least recompute time).
//!
//! # What is measured
//! For one input shape `[batch, seq]`, on the model's device, block 0 runs once per candidate
//! per-block policy (`disabled`, every named selective policy, `block`), the candidates
//! interleaved, [`PROBE_ROUNDS`] times each:
//! - **retained bytes** `R(p)`: activation bytes alive after the block's forward (its output
//!   included, its input excluded) — for `disabled` this is `M_layer`, for `block` `M_ckpt`
//!   (the boundary tensor);
//! - **transient bytes** `T(p)`: the activation peak of the block's backward above what was
//!   alive before it (the replay's recomputed activations);
//! - **forward peak bytes** `F(p)`: the activation peak of the block's forward above its input
//!   (a checkpoint's forward run holds the whole block graph for a moment, and computes the
//!   values its replay leaves out);
//! - **seconds**: forward + backward wall time until the device has finished the work
//!   ([`riftco_tensor::backend::synchronize`]; the fastest run), kept between `disabled`'s and
//!   `block`'s for a selective policy (its replay does part of `block`'s work).
//!
//! The head (embedding output, final RMSNorm, LM head, cross-entropy) is measured the same way.
//! The bytes are this thread's own allocations ([`riftco_tensor::ThreadMemoryScope`]): other
//! threads allocating meanwhile do not disturb a plan. Planning never resets the process-wide
//! counters of `memory_stats`; its probes' allocations count in them like any other (one block
//! and the head at a time, below what a training step of the whole model allocates).
//!
//! # The model
//! A training step's backward frees each node's values as soon as its VJP ran
//! (`retain_graph = false`, as the stages and PyTorch do), so what a segment retains stays
//! alive until backward has passed it, and the segments after it are gone by the time its
//! backward runs. A plan's activation peak is the largest of
//! - its forward peak: `max_s (E + Σ_{segments before s} R + F_s)` and `E + Σ R + F_head`
//!   (`E` the embedding output);
//! - the head's backward: `R_head + Σ_segments R + T_head`;
//! - each segment's backward: `E + Σ_{segments up to s} R + T_s + K_head` (`K_head` what the
//!   head's backward leaves, the loss),
//!
//! where a K-block checkpoint segment retains `M_ckpt` and its replay (and forward run) holds
//! `T(block) + (K − 1)·M_layer`. For `segments:K` the last segment's term is Chen et al.
//! 2016's `L/K · M_ckpt + K · M_layer` plus the head. A backward that keeps the graph
//! (`retain_graph = true`, the default of `backward()`) peaks higher, at up to
//! `R_head + Σ R + max(T_head, max_s T_s)`.
//!
//! - **auto**: K from the optimum of that formula, `k* = sqrt(L · M_ckpt / M_layer)`, the better
//!   of `floor(k*)` and `ceil(k*)` by the formula (clamped to `1..=L`).
//! - **budget**: among plans mixing at most two per-block policies (exact for the linear
//!   relaxation, whose optimum uses at most two) and the `segments:K` plans (K >= 2, which on
//!   deep models reach lower peaks than any per-block plan), the one with the least predicted
//!   time whose predicted peak fits the budget; the block policies that save more memory go to
//!   the lower layers. A checkpointed block is predicted no faster than a plain one (it runs everything
//!   `disabled` runs plus a replay: a faster measurement is timing noise), and among plans
//!   predicted equally fast the one checkpointing fewer blocks wins, so a budget `disabled`
//!   fits gives the all-`disabled` plan. No plan fitting is a [`TransformerError::Config`]
//!   naming the smallest achievable peak.

use super::plan::{human_bytes, run_segment, segments_of, CheckpointPlan, PlanSegment};
use super::spec::{ActivationCheckpointing, BlockPolicy, SaveSet, SELECTIVE_POLICIES};
use crate::block::BlockContext;
use crate::dropout::BlockDropout;
use crate::error::{Result, TransformerError};
use crate::head::{head_loss, LossChunking};
use crate::model::Weights;
use crate::policy::FullSequenceAttentionKind;
use riftco_autograd::{enable_grad, ops, GradientContext, Variable};
use riftco_tensor::{Device, MemoryCategory, Tensor, ThreadMemoryScope};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Instant;

/// How many times each candidate runs, interleaved; its seconds are the fastest run (other
/// work on the machine only ever slows a run down).
pub const PROBE_ROUNDS: usize = 5;

/// What one candidate per-block policy costs for one block, measured.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyCost {
    /// The per-block policy.
    pub policy: BlockPolicy,
    /// Activation bytes alive after the forward (output included, input excluded).
    pub retained_bytes: u64,
    /// Activation peak of the backward above what was alive before it.
    pub transient_bytes: u64,
    /// Activation peak of the forward above what was alive before it.
    pub forward_peak_bytes: u64,
    /// Forward + backward wall seconds (the fastest of [`PROBE_ROUNDS`] runs).
    pub seconds: f64,
}

/// The planner's measurements for one input shape.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockMeasurement {
    /// Batch size measured.
    pub batch: usize,
    /// Sequence length measured.
    pub seq: usize,
    /// Blocks in the model.
    pub n_layers: usize,
    /// `M_ckpt`: the retained bytes of a checkpointed block (its boundary tensor).
    pub boundary_bytes: u64,
    /// `M_layer`: the retained bytes of a block without checkpointing.
    pub layer_bytes: u64,
    /// Activation bytes the head retains (embedding output, what the final norm and the loss
    /// keep).
    pub head_retained_bytes: u64,
    /// The part of `head_retained_bytes` alive before the first block: the embedding output.
    pub embedding_bytes: u64,
    /// Activation peak of the head's forward (final norm and loss) above what was alive
    /// before it.
    pub head_forward_peak_bytes: u64,
    /// Activation peak of the head's backward above what was alive before it.
    pub head_transient_bytes: u64,
    /// Activation bytes of the head left after its backward (the loss).
    pub head_kept_bytes: u64,
    /// Head forward + backward seconds.
    pub head_seconds: f64,
    /// One entry per candidate per-block policy, `disabled` first and `block` last.
    pub costs: Vec<PolicyCost>,
}

impl BlockMeasurement {
    fn cost(&self, p: &BlockPolicy) -> &PolicyCost {
        self.costs
            .iter()
            .find(|c| &c.policy == p)
            .unwrap_or(&self.costs[self.costs.len() - 1])
    }

    /// Predicted `(retained, transient, forward peak, seconds)` of one plan segment.
    fn segment(&self, s: &PlanSegment) -> (u64, u64, u64, f64) {
        let k = s.layers.len() as u64;
        let c = self.cost(&s.policy);
        let seconds = self.block_seconds(c);
        if k <= 1 {
            return (
                c.retained_bytes,
                c.transient_bytes,
                c.forward_peak_bytes,
                seconds,
            );
        }
        match s.policy {
            BlockPolicy::Checkpoint => (
                self.boundary_bytes,
                c.transient_bytes + (k - 1) * self.layer_bytes,
                c.forward_peak_bytes + (k - 1) * self.layer_bytes,
                seconds * k as f64,
            ),
            _ => (
                c.retained_bytes * k,
                c.transient_bytes,
                c.forward_peak_bytes + (k - 1) * c.retained_bytes,
                seconds * k as f64,
            ),
        }
    }

    /// Predicted seconds of one block under `c`'s policy: its measured seconds, kept within
    /// what the work implies — never less than `disabled`'s (a checkpoint runs everything
    /// `disabled` runs plus a replay), and for a selective checkpoint never more than `block`'s
    /// (its replay recomputes a part of what `block`'s recomputes).
    fn block_seconds(&self, c: &PolicyCost) -> f64 {
        let disabled = self.cost(&BlockPolicy::Disabled).seconds;
        let block = self.cost(&BlockPolicy::Checkpoint).seconds.max(disabled);
        match c.policy {
            BlockPolicy::Disabled => c.seconds,
            BlockPolicy::Checkpoint => block,
            BlockPolicy::Selective(_) => c.seconds.clamp(disabled, block),
        }
    }

    /// Predicted peak activation bytes and seconds of a plan's segments.
    pub fn predict(&self, segments: &[PlanSegment]) -> (u64, f64) {
        let mut alive = self.embedding_bytes;
        let mut forward_peak = 0;
        let mut seconds = self.head_seconds;
        for s in segments {
            let (r, _, f, sec) = self.segment(s);
            forward_peak = forward_peak.max(alive + f);
            alive += r;
            seconds += sec;
        }
        forward_peak = forward_peak.max(alive + self.head_forward_peak_bytes);
        let head = self
            .head_retained_bytes
            .saturating_sub(self.embedding_bytes);
        let mut backward_peak = alive + head + self.head_transient_bytes;
        let mut prefix = self.embedding_bytes;
        for s in segments {
            let (r, t, _, _) = self.segment(s);
            prefix += r;
            backward_peak = backward_peak.max(prefix + t + self.head_kept_bytes);
        }
        (forward_peak.max(backward_peak), seconds)
    }

    /// Chen et al. 2016's memory of `segments:k` over `n_layers` blocks,
    /// `ceil(L/k) · M_ckpt + k · M_layer` (without the head).
    pub fn segment_formula_bytes(&self, k: usize) -> u64 {
        let n = self.n_layers.div_ceil(k.max(1)) as u64;
        n * self.boundary_bytes + k as u64 * self.layer_bytes
    }

    /// The continuous optimum `k* = sqrt(L · M_ckpt / M_layer)`.
    pub fn optimal_segment_length(&self) -> f64 {
        (self.n_layers as f64 * self.boundary_bytes as f64 / self.layer_bytes.max(1) as f64).sqrt()
    }
}

/// The candidate per-block policies, in measurement order: `disabled`, the named selective
/// policies, `block`.
fn candidates() -> Vec<BlockPolicy> {
    let mut v = vec![BlockPolicy::Disabled];
    v.extend(SELECTIVE_POLICIES.iter().map(|p| {
        BlockPolicy::Selective(SaveSet::parse(p.name).expect("the named policies parse"))
    }));
    v.push(BlockPolicy::Checkpoint);
    v
}

/// What one probe measured (bytes above what was alive before it).
struct Probe {
    retained: u64,
    transient: u64,
    /// Left after the backward (the output included).
    kept: u64,
    forward_peak: u64,
    seconds: f64,
}

/// Runs `forward`, then a backward from its output, returning retained, transient and
/// forward-peak bytes and the wall seconds. Counts only this thread's activation allocations
/// ([`ThreadMemoryScope`]), so other threads allocating meanwhile do not disturb it.
fn probe(device: Device, forward: impl FnOnce() -> Result<Variable>) -> Result<Probe> {
    let scope = ThreadMemoryScope::new(device, MemoryCategory::Activation);
    let t0 = Instant::now();
    let y = forward()?;
    let after = scope.current_bytes();
    let forward_peak = scope.peak_bytes().max(0) as u64;
    scope.reset_peak();
    let transient = if y.requires_grad() {
        let seed = Tensor::try_full_on(y.dims().to_vec(), 1.0, MemoryCategory::Gradient, device)?;
        // As a training step: each node's values go as soon as its VJP ran.
        let grads = GradientContext::compute_with(&y, seed, false)?;
        let peak = scope.peak_bytes();
        drop(grads);
        (peak - after).max(0) as u64
    } else {
        0
    };
    let kept = scope.current_bytes().max(0) as u64;
    // A GPU backend batches its commands: without waiting for them the clock would measure
    // their recording, not their execution.
    riftco_tensor::backend::synchronize(device)?;
    let seconds = t0.elapsed().as_secs_f64();
    drop(y);
    Ok(Probe {
        retained: after.max(0) as u64,
        transient,
        kept,
        forward_peak,
        seconds,
    })
}

/// Checks a training input shape `[batch, seq]` for planning: both positive, `seq` at most
/// `max_seq_len` (the shapes a training forward accepts).
///
/// # Errors
/// [`TransformerError::Tokens`] when `batch` or `seq` is 0,
/// [`TransformerError::SequenceTooLong`] when `seq` exceeds `max_seq_len`.
pub(crate) fn check_shape(cfg: &crate::TransformerConfig, batch: usize, seq: usize) -> Result<()> {
    if batch == 0 || seq == 0 {
        return Err(TransformerError::Tokens {
            message: format!("planning needs batch {batch} and seq {seq} both positive"),
        });
    }
    if seq > cfg.max_seq_len {
        return Err(TransformerError::SequenceTooLong {
            seq,
            max_seq_len: cfg.max_seq_len,
        });
    }
    Ok(())
}

/// Measures the head and block 0 of `weights` for inputs `[batch, seq]` (see the module
/// documentation).
///
/// # Errors
/// [`TransformerError::Tokens`] when `batch` or `seq` is 0,
/// [`TransformerError::SequenceTooLong`] when `seq` exceeds `max_seq_len` (the shapes a
/// training forward refuses); those of the forward and backward passes (out of memory,
/// devices).
pub fn measure(
    weights: &Weights,
    attention: FullSequenceAttentionKind,
    batch: usize,
    seq: usize,
    dropout: Option<BlockDropout>,
    loss_chunking: LossChunking,
) -> Result<BlockMeasurement> {
    enable_grad(|| measure_impl(weights, attention, batch, seq, dropout, loss_chunking))
}

fn measure_impl(
    weights: &Weights,
    attention: FullSequenceAttentionKind,
    batch: usize,
    seq: usize,
    dropout: Option<BlockDropout>,
    loss_chunking: LossChunking,
) -> Result<BlockMeasurement> {
    let cfg = &weights.config;
    check_shape(cfg, batch, seq)?;
    let device = weights.embed.value().device();
    let mut ctx = BlockContext::new(cfg, &weights.rope, batch, seq, attention);
    // Dropout changes what a block keeps (a dropped LoRA input or attention probabilities are
    // saved for the next product's VJP): measure with the training forward's probabilities.
    ctx.dropout = dropout;
    let layer = weights
        .layers
        .first()
        .ok_or_else(|| TransformerError::Config {
            field: "n_layers",
            value: "0".into(),
            reason: "planning needs at least one block".into(),
        })?;
    let input = || -> Result<Variable> {
        let shape = vec![batch, seq, cfg.d_model];
        let t = Tensor::try_full_on(shape, 0.5, MemoryCategory::Activation, device)?;
        Ok(Variable::leaf(t, true))
    };
    let calls = Arc::new(AtomicUsize::new(0));
    let policies = candidates();
    let mut costs: Vec<Option<PolicyCost>> = vec![None; policies.len()];
    for _ in 0..PROBE_ROUNDS {
        for (i, p) in policies.iter().enumerate() {
            let x = input()?;
            let seg = PlanSegment {
                layers: 0..1,
                policy: p.clone(),
            };
            let layers = std::slice::from_ref(layer);
            let m = probe(device, || {
                run_segment(&x, layers, &seg, &ctx, &calls, Default::default(), None)
            })?;
            let seconds = costs[i]
                .as_ref()
                .map_or(m.seconds, |c| c.seconds.min(m.seconds));
            costs[i] = Some(PolicyCost {
                policy: p.clone(),
                retained_bytes: m.retained,
                transient_bytes: m.transient,
                forward_peak_bytes: m.forward_peak,
                seconds,
            });
        }
    }
    let costs: Vec<PolicyCost> = costs.into_iter().flatten().collect();
    // The head: the embedding output, then final norm → LM head → cross-entropy from a leaf
    // standing for the last block's output (counted with the blocks).
    let tokens = vec![0u32; batch * seq];
    let mut head = (0, 0, 0, 0, 0, f64::INFINITY);
    for _ in 0..2 {
        let scope = ThreadMemoryScope::new(device, MemoryCategory::Activation);
        let t0 = Instant::now();
        let embedded = ops::embedding(&weights.embed, &tokens)?;
        let embedded_bytes = scope.current_bytes().max(0) as u64;
        let h = input()?;
        let m = probe(device, || {
            // As the model's forward: the norm's own handle goes first, so the graph releases
            // its value when the loss reads none (the chunked loss).
            let x = ops::reshape(
                &ops::rms_norm(&h, &weights.final_norm, cfg.rms_norm_eps)?,
                [batch * seq, cfg.d_model],
            )?;
            head_loss(&x, &weights.lm_head, &tokens, loss_chunking)
        })?;
        let seconds = t0.elapsed().as_secs_f64();
        drop(embedded);
        head = (
            m.retained + embedded_bytes,
            m.transient,
            m.forward_peak,
            embedded_bytes,
            m.kept,
            head.5.min(seconds),
        );
    }
    let retained = |p: &BlockPolicy| {
        costs
            .iter()
            .find(|c| &c.policy == p)
            .map_or(0, |c| c.retained_bytes)
    };
    Ok(BlockMeasurement {
        batch,
        seq,
        n_layers: cfg.n_layers,
        boundary_bytes: retained(&BlockPolicy::Checkpoint),
        layer_bytes: retained(&BlockPolicy::Disabled),
        head_retained_bytes: head.0,
        head_transient_bytes: head.1,
        head_forward_peak_bytes: head.2,
        embedding_bytes: head.3,
        head_kept_bytes: head.4,
        head_seconds: head.5,
        costs,
    })
}

/// The `auto` plan: K from the measured `M_ckpt` and `M_layer` (see the module documentation).
pub fn auto_plan(m: Arc<BlockMeasurement>) -> CheckpointPlan {
    let l = m.n_layers.max(1);
    let k_star = m.optimal_segment_length();
    let lo = (k_star.floor() as usize).clamp(1, l);
    let hi = (k_star.ceil() as usize).clamp(1, l);
    let k = if m.segment_formula_bytes(hi) < m.segment_formula_bytes(lo) {
        hi
    } else {
        lo
    };
    let segments = segments_of(k, l);
    let (peak, seconds) = m.predict(&segments);
    CheckpointPlan {
        policy: ActivationCheckpointing::Auto,
        segments,
        segment_length: Some(k),
        predicted_peak_bytes: Some(peak),
        predicted_step_seconds: Some(seconds),
        measurement: Some(m),
    }
}

/// The budget plan: the least predicted time with a predicted peak `<= budget` (see the module
/// documentation).
///
/// # Errors
/// [`TransformerError::Config`] (field `activation_memory_budget`) naming the budget and the
/// smallest achievable peak when no plan fits.
pub fn budget_plan(m: Arc<BlockMeasurement>, budget: u64) -> Result<CheckpointPlan> {
    let l = m.n_layers;
    // Candidates ordered by retained bytes, most memory-saving first.
    let mut order: Vec<&PolicyCost> = m.costs.iter().collect();
    order.sort_by_key(|c| c.retained_bytes);
    let plan_of = |a: &BlockPolicy, b: &BlockPolicy, n_a: usize| -> Vec<PlanSegment> {
        (0..l)
            .map(|i| PlanSegment {
                layers: i..i + 1,
                policy: if i < n_a { a.clone() } else { b.clone() },
            })
            .collect()
    };
    // Per-block mixes of at most two policies, and multi-block checkpoint segments
    // (`segments:K`, K >= 2), which on deep models reach peaks no per-block plan does.
    let mut candidates: Vec<Vec<PlanSegment>> = Vec::new();
    for (i, a) in order.iter().enumerate() {
        for b in &order[i..] {
            for n_a in 0..=l {
                candidates.push(plan_of(&a.policy, &b.policy, n_a));
            }
        }
    }
    candidates.extend((2..=l).map(|k| segments_of(k, l)));
    let mut best: Option<((f64, usize, u64), Vec<PlanSegment>)> = None;
    let mut smallest: Option<(u64, Vec<PlanSegment>)> = None;
    for segments in candidates {
        let (peak, seconds) = m.predict(&segments);
        if smallest.as_ref().is_none_or(|(p, _)| peak < *p) {
            smallest = Some((peak, segments.clone()));
        }
        // Least time, then fewest checkpointed blocks, then least memory.
        let checkpointed: usize = segments
            .iter()
            .filter(|s| s.policy != BlockPolicy::Disabled)
            .map(|s| s.layers.len())
            .sum();
        let rank = (seconds, checkpointed, peak);
        if peak <= budget && best.as_ref().is_none_or(|(r, _)| rank < *r) {
            best = Some((rank, segments));
        }
    }
    match best {
        Some(((seconds, _, peak), segments)) => Ok(CheckpointPlan {
            policy: ActivationCheckpointing::Budget(budget),
            segments,
            segment_length: None,
            predicted_peak_bytes: Some(peak),
            predicted_step_seconds: Some(seconds),
            measurement: Some(m),
        }),
        None => {
            let (peak, segments) = smallest.unwrap_or_default();
            let mut distinct: Vec<String> = segments
                .iter()
                .map(|s| match s.layers.len() {
                    1 => s.policy.to_string(),
                    k => format!("segments of {k} blocks"),
                })
                .collect();
            distinct.dedup();
            Err(TransformerError::Config {
                field: "activation_memory_budget",
                value: if budget < 1024 {
                    format!("{budget} bytes")
                } else {
                    format!("{budget} bytes ({})", human_bytes(budget))
                },
                reason: format!(
                    "no plan fits: the smallest achievable peak activation at batch {}, seq {} \
                     is {peak} bytes ({}, per-block {}); raise the budget or lower the batch \
                     size or sequence length",
                    m.batch,
                    m.seq,
                    human_bytes(peak),
                    distinct.join(" then ")
                ),
            })
        }
    }
}
