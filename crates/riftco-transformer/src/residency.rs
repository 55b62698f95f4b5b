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
//! | embedding | before the lookup | after the lookup, unless the head is tied to it |
//! | a block inside a checkpoint (`block`, `segments:K`, `selective`, lists) | at the checkpoint's forward run, and again at its replay in the backward pass ([`AcquireReason::Replay`]) | after the forward run, and after the replay's VJP |
//! | a block outside any checkpoint (`disabled`) | before its forward ([`AcquireReason::KeptForBackward`]) | never by the model: the graph reads the values in the backward pass, so the owner releases them after it |
//! | final norm | before the norm ([`AcquireReason::KeptForBackward`]) | never by the model |
//! | LM head (tied: the embedding) | before the loss or the logits ([`AcquireReason::KeptForBackward`]) | never by the model |
//!
//! Without a graph (evaluation) every unit is released after its use. The replay of a
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
    /// For a forward whose graph reads the values again in the backward pass: the model does
    /// not release the unit; its owner does, once the backward pass is done.
    KeptForBackward,
    /// For a checkpoint's replay in the backward pass; the model releases the unit after the
    /// replay's VJP.
    Replay,
}

impl AcquireReason {
    /// `"forward"`, `"kept_for_backward"` or `"replay"`.
    pub fn name(self) -> &'static str {
        match self {
            AcquireReason::Forward => "forward",
            AcquireReason::KeptForBackward => "kept_for_backward",
            AcquireReason::Replay => "replay",
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
