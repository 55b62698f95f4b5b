//! Activation-checkpointing policies: what a user asks for ([`ActivationCheckpointing`], its
//! spellings and the named selective policies in [`spec`]), the per-block plan it resolves to
//! for one input shape ([`CheckpointPlan`], run by the training forward), and the measured
//! planner behind `auto` and activation-memory budgets ([`planner`]).
//!
//! A new policy lands here: its spelling in [`spec`], its plan in [`plan`] (or [`planner`]
//! when it needs measurements). Policies sit above autograd's `checkpoint` and never reach a
//! backend.

pub mod plan;
pub mod planner;
pub mod spec;

pub use plan::{CheckpointPlan, PlanSegment};
pub use planner::{BlockMeasurement, PolicyCost};
pub use spec::{
    parse_byte_size, parse_byte_size_for, ActivationCheckpointing, BlockPolicy, SaveSet,
    SelectivePolicy, BLOCK_VALUE_NAMES, POLICY_FORMS, SELECTIVE_POLICIES,
};
