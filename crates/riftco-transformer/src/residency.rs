//! Parameter residency: telling a model's owner when a unit's parameters must be present, so
//! that they can live elsewhere in between (sharded over data-parallel processes, as in ZeRO-3
//! and PyTorch FSDP: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
//! Trillion Parameter Models"; Zhao et al. 2023, "PyTorch FSDP: Experiences on Scaling Fully
//! Sharded Data Parallel").
//!
//! A [`ParameterResidency`] set on a model ([`crate::DecoderOnlyTransformer::
//! set_parameter_residency`]) is asked to [`acquire`](ParameterResidency::acquire) a unit (the
//! token embedding, one block, the final norm, the LM head) before anything of the unit is
//! read, and is told when the model is done with it ([`release`](ParameterResidency::release)).
//! Between the two the unit's parameter tensors must hold their values; outside, the owner may
//! free their storage ([`riftco_tensor::Tensor::release_shared`]) and put the same bytes back
//! later ([`riftco_tensor::Tensor::restore_encoded`], which keeps the version).
//!
//! When each call comes, for a training forward that records a graph:
//!
//! | unit | acquired | released |
//! |---|---|---|
//! | embedding | before the lookup | after the lookup (a tied head acquires it again) |
//! | a block inside a checkpoint (`block`, `segments:K`, `selective`, lists) | at the checkpoint's forward run, and again at its replay in the backward pass ([`AcquireReason::Replay`]) | after the forward run, and after the replay's VJP |
//! | a block outside any checkpoint (`disabled`) | before its forward, and again when the backward pass reaches the block ([`AcquireReason::Backward`]) | after its forward, and after its VJPs |
//! | final norm | before the norm ([`AcquireReason::KeptForBackward`]) | after its VJP (when its graph node is freed: right after the VJP in a freeing backward pass, else when the graph is dropped, also without a backward pass) |
//! | LM head (tied: the embedding) | before the loss or the logits ([`AcquireReason::KeptForBackward`]) | after its VJP, as the final norm |
//! | a frozen embedding or head the owner gives by slices ([`ParameterResidency::row_slice`]) | never acquired for the lookup and the loss: every slice is fetched in order ([`ParameterResidency::fetch_rows`]) | each slice is dropped after its use; nothing is held for the backward pass |
//!
//! Without a graph (evaluation) every unit is released after its use. A block outside any
//! checkpoint is released while its graph holds its parameter tensors: the graph's handles
//! share the storage, which the backward acquire fills again before any VJP of the block reads
//! it (PyTorch FSDP frees and refills the storage its autograd graph saved in the same way).
//! The backward-pass calls come from identity nodes the forward records around such blocks,
//! the final norm and the head.
//!
//! Every acquire is matched by exactly one release (on error paths too, except when an acquire
//! itself fails), so an owner can count holds: a unit two graphs hold (two forward passes
//! before their backward passes) stays gathered until both released it. The replay of a
//! checkpoint reads the values the forward run read: the tensors' versions are compared, so an
//! owner whose shards changed in between bumps them ([`riftco_tensor::Tensor::bump_version`])
//! and the backward fails with a stale-graph error instead of mixing two values.
//!
//! `next` names the unit the model will acquire after this one (in the forward order, or for
//! a replay the block of the checkpoint the backward pass replays next): an owner with a
//! transport that can overlap may start gathering it (prefetch).
//!
//! Policies that measure the blocks to choose a plan (`auto`, memory budgets) are refused
//! under a residency owner: the measurement reads every block.

use riftco_autograd::{Saves, Variable};
use std::fmt;

/// A group of parameters that is acquired and released together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResidencyUnit {
    /// `model.embed_tokens.weight` (and, with tied embeddings, the LM head).
    Embedding,
    /// Block `i`: every parameter named `model.layers.{i}.*`, LoRA adapters included.
    Block(usize),
    /// `model.norm.weight`.
    FinalNorm,
    /// `lm_head.weight` (untied models only; a tied head is [`ResidencyUnit::Embedding`]).
    Head,
}

impl ResidencyUnit {
    /// The prefix of the Hugging Face names of the unit's parameters: `model.embed_tokens`,
    /// `model.layers.{i}`, `model.norm`, `lm_head`.
    pub fn prefix(self) -> String {
        match self {
            ResidencyUnit::Embedding => "model.embed_tokens".into(),
            ResidencyUnit::Block(i) => format!("model.layers.{i}"),
            ResidencyUnit::FinalNorm => "model.norm".into(),
            ResidencyUnit::Head => "lm_head".into(),
        }
    }

    /// The unit of the parameter named `name` (a Hugging Face name, or a PEFT adapter name
    /// `base_model.model.<module>.lora_A.weight`), `None` for a name outside the model's
    /// layout.
    pub fn of_parameter(name: &str) -> Option<Self> {
        let name = name.strip_prefix("base_model.model.").unwrap_or(name);
        if name.starts_with("model.embed_tokens.") {
            return Some(ResidencyUnit::Embedding);
        }
        if name.starts_with("model.norm.") {
            return Some(ResidencyUnit::FinalNorm);
        }
        if name.starts_with("lm_head.") {
            return Some(ResidencyUnit::Head);
        }
        let rest = name.strip_prefix("model.layers.")?;
        let (index, _) = rest.split_once('.')?;
        index.parse().ok().map(ResidencyUnit::Block)
    }
}

impl fmt::Display for ResidencyUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.prefix())
    }
}

/// Why a unit is acquired.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AcquireReason {
    /// For a forward computation; the model releases the unit after it.
    Forward,
    /// For a forward whose graph reads the values again in the backward pass: the model
    /// releases the unit when the graph node that reads it is freed (after its VJP, or with
    /// the graph).
    KeptForBackward,
    /// For a checkpoint's replay in the backward pass; the model releases the unit after the
    /// replay's VJP.
    Replay,
    /// For the backward pass of a block outside any checkpoint (its graph reads the values
    /// again); the model releases the unit after the block's VJPs.
    Backward,
}

impl AcquireReason {
    /// `"forward"`, `"kept_for_backward"` or `"replay"`.
    pub fn name(self) -> &'static str {
        match self {
            AcquireReason::Forward => "forward",
            AcquireReason::KeptForBackward => "kept_for_backward",
            AcquireReason::Replay => "replay",
            AcquireReason::Backward => "backward",
        }
    }
}

/// The owner of a model's parameters between uses (see the module documentation for when
/// each call comes). Calls come from the thread running the forward or the backward pass, in
/// the model's order; a unit may be acquired again while resident (the call then only
/// confirms it).
pub trait ParameterResidency: Send + Sync {
    /// Makes `unit`'s parameter tensors hold their values before the model reads them.
    ///
    /// # Errors
    /// The owner's own (a collective that failed, a shard that does not fit), wrapped with
    /// [`riftco_autograd::AutogradError::external`]: the forward or backward pass stops with it unchanged.
    fn acquire(
        &self,
        unit: ResidencyUnit,
        reason: AcquireReason,
        next: Option<ResidencyUnit>,
    ) -> riftco_autograd::Result<()>;

    /// The model is done reading `unit` for now: its storage may be freed. It cannot fail the
    /// model's pass (it may come at the end of a replay, where nothing can return an error): an
    /// owner whose release fails keeps the error and returns it from its next acquire.
    fn release(&self, unit: ResidencyUnit);

    /// Rows per slice in which the owner gives the frozen `[vocab, d_model]` table of the
    /// token embedding or the LM head ([`ResidencyUnit::Embedding`], [`ResidencyUnit::Head`])
    /// through [`ParameterResidency::fetch_rows`] instead of being asked to acquire the unit
    /// whole; `None` (the default): the unit is acquired whole. With slices, the training loss
    /// and the embedding lookup never hold the whole table: the loss runs in one pass over the
    /// slices with an online logsumexp (within f32 rounding of the whole-table loss, not
    /// bitwise; the lookup is bitwise), and nothing is held for the backward pass. The model
    /// uses slices only for a table that needs no gradient, on the host, and only for the
    /// lookup and the chunked loss; other reads of the table (full logits, an unfused loss)
    /// still acquire the unit whole. The owner must store the table row by row (f32, 16-bit or
    /// a GGML format; not NF4, whose block maxima follow all the codes).
    fn row_slice(&self, unit: ResidencyUnit) -> Option<usize> {
        let _ = unit;
        None
    }

    /// Rows `rows` of `unit`'s table as a new `[rows.len(), d_model]` host tensor in the
    /// table's storage (f32, 16-bit or quantized), for an owner that gives `unit` by slices
    /// ([`ParameterResidency::row_slice`]). The model fetches every slice of the table in order
    /// (`0..n`, `n..2n`, ...), whatever the tokens are, so that processes sharing the shards make
    /// the same calls; `next` is the unit the model acquires after the last slice (prefetch).
    ///
    /// # Errors
    /// The owner's own, as [`ParameterResidency::acquire`]; the default refuses (an owner that
    /// offers slices implements it).
    fn fetch_rows(
        &self,
        unit: ResidencyUnit,
        rows: std::ops::Range<usize>,
        next: Option<ResidencyUnit>,
    ) -> riftco_autograd::Result<riftco_tensor::Tensor> {
        let _ = next;
        Err(riftco_tensor::TensorError::InvalidArgument {
            op: "ParameterResidency::fetch_rows",
            message: format!(
                "this owner gives no slices of {unit} (rows {}..{} asked): it offers none \
                 (row_slice is None)",
                rows.start, rows.end
            ),
        }
        .into())
    }
}

/// The rows per slice `owner` gives `table` (of `unit`) in, when the model may read the table
/// by slices: an owner that offers them, a table that needs no gradient, on the host.
pub(crate) fn row_slices(
    owner: Option<&SharedResidency>,
    unit: ResidencyUnit,
    table: &Variable,
) -> Option<usize> {
    let owner = owner?;
    if table.requires_grad() || table.value().device() != riftco_tensor::Device::Cpu {
        return None;
    }
    owner.row_slice(unit).filter(|&n| n > 0)
}

/// A fetch of rows of `unit` from `owner`, naming `next` at the last slice.
pub(crate) fn fetcher<'a>(
    owner: &'a SharedResidency,
    unit: ResidencyUnit,
    vocab: usize,
    next: Option<ResidencyUnit>,
) -> impl FnMut(std::ops::Range<usize>) -> riftco_autograd::Result<riftco_tensor::Tensor> + 'a {
    move |rows| {
        let last = rows.end >= vocab;
        owner.fetch_rows(unit, rows, if last { next } else { None })
    }
}

/// A shared residency owner, as a model holds it.
pub type SharedResidency = std::sync::Arc<dyn ParameterResidency>;

/// The owner's acquire (none: nothing to do).
pub(crate) fn acquire(
    owner: Option<&SharedResidency>,
    unit: ResidencyUnit,
    reason: AcquireReason,
    next: Option<ResidencyUnit>,
) -> riftco_autograd::Result<()> {
    owner.map_or(Ok(()), |o| o.acquire(unit, reason, next))
}

/// The owner's release (none: nothing to do).
pub(crate) fn release(owner: Option<&SharedResidency>, unit: ResidencyUnit) {
    if let Some(o) = owner {
        o.release(unit);
    }
}

/// Releases a unit when dropped (the hold a graph node keeps).
struct Hold {
    owner: SharedResidency,
    unit: ResidencyUnit,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.owner.release(self.unit);
    }
}

/// `x` again (the same value), handing the caller's hold of `unit` (acquired before) to the
/// graph, when a graph is being recorded and an owner is set: an identity node whose record
/// releases `unit` when it is freed. Placed on the input of a computation, the record goes
/// right after the computation's VJPs ran in a freeing backward pass, or with the graph. Without
/// a graph (or an owner) it returns `x` and the caller keeps its hold.
pub(crate) fn hold_until_backward(
    x: &Variable,
    owner: Option<&SharedResidency>,
    unit: ResidencyUnit,
) -> Option<Variable> {
    match owner {
        Some(o) if riftco_autograd::is_grad_enabled() => {
            let hold = Hold {
                owner: o.clone(),
                unit,
            };
            Some(Variable::from_op_saving(
                "hold until backward",
                x.value().clone(),
                vec![x.clone()],
                Saves::NOTHING,
                move |_, _, g| {
                    let _ = &hold;
                    Ok(vec![Some(g.clone())])
                },
            ))
        }
        _ => None,
    }
}

/// The holds the backward passes of one block outside any checkpoint take: acquired when a
/// pass reaches the block's output, released when it has gone through the block's input, and
/// any still outstanding when the graph is freed (a block whose input needs no gradient, the
/// first one under LoRA, is never gone through: its node is freed after the block's VJPs).
pub(crate) struct BackwardHold {
    owner: SharedResidency,
    unit: ResidencyUnit,
    outstanding: std::sync::atomic::AtomicUsize,
}

impl BackwardHold {
    /// The holds of `unit`'s backward passes, when a graph is being recorded and an owner set.
    pub(crate) fn new(
        owner: Option<&SharedResidency>,
        unit: ResidencyUnit,
    ) -> Option<std::sync::Arc<Self>> {
        owner
            .filter(|_| riftco_autograd::is_grad_enabled())
            .map(|o| {
                std::sync::Arc::new(Self {
                    owner: o.clone(),
                    unit,
                    outstanding: std::sync::atomic::AtomicUsize::new(0),
                })
            })
    }

    fn release_one(&self) {
        use std::sync::atomic::Ordering;
        let took = self
            .outstanding
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        if took.is_ok() {
            self.owner.release(self.unit);
        }
    }
}

impl Drop for BackwardHold {
    fn drop(&mut self) {
        for _ in 0..*self.outstanding.get_mut() {
            self.owner.release(self.unit);
        }
    }
}

/// `x` again (the same value), through an identity node whose VJP releases one of `hold`'s
/// holds: placed on the input of a block, it runs once every VJP of the block has.
pub(crate) fn release_after_backward(
    x: &Variable,
    hold: &std::sync::Arc<BackwardHold>,
) -> Variable {
    let hold = hold.clone();
    Variable::from_op_saving(
        "release after backward",
        x.value().clone(),
        vec![x.clone()],
        Saves::NOTHING,
        move |_, _, g| {
            hold.release_one();
            Ok(vec![Some(g.clone())])
        },
    )
}

/// `y` again, through an identity node whose VJP acquires `hold`'s unit
/// ([`AcquireReason::Backward`], naming `next`): placed on the output of a block, it runs
/// before any VJP of the block.
pub(crate) fn acquire_before_backward(
    y: &Variable,
    hold: std::sync::Arc<BackwardHold>,
    next: Option<ResidencyUnit>,
) -> Variable {
    Variable::from_op_saving(
        "acquire before backward",
        y.value().clone(),
        vec![y.clone()],
        Saves::NOTHING,
        move |_, _, g| {
            hold.owner
                .acquire(hold.unit, AcquireReason::Backward, next)?;
            hold.outstanding
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            Ok(vec![Some(g.clone())])
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_of_parameter_names() {
        let cases = [
            ("model.embed_tokens.weight", Some(ResidencyUnit::Embedding)),
            (
                "model.layers.12.mlp.up_proj.weight",
                Some(ResidencyUnit::Block(12)),
            ),
            (
                "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
                Some(ResidencyUnit::Block(0)),
            ),
            ("model.norm.weight", Some(ResidencyUnit::FinalNorm)),
            ("lm_head.weight", Some(ResidencyUnit::Head)),
            ("model.layers.x.mlp.up_proj.weight", None),
            ("zero_shard", None),
        ];
        for (name, unit) in cases {
            assert_eq!(ResidencyUnit::of_parameter(name), unit, "{name}");
            if let Some(u) = unit {
                let hf = name.trim_start_matches("base_model.model.");
                assert!(hf.starts_with(&format!("{}.", u.prefix())));
            }
        }
    }
}
