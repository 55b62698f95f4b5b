//! A LLaMA-style decoder-only transformer with activation checkpointing.
//!
//! - [`DecoderOnlyTransformer`]: materialized or flash attention
//!   ([`FullSequenceAttentionKind`]), activation-checkpointing policy
//!   ([`ActivationCheckpointing`]: disabled, block, segments:K, auto, selective, per-block
//!   lists, memory budgets; [`checkpointing`]), LoRA adapters, training loss on `[batch, seq + 1]`
//!   token blocks (LM head + cross-entropy fused in chunks of tokens: [`head`]).
//! - [`Adam`]: Adam/AdamW with bias correction (PyTorch defaults).
//! - [`DecodeSession`]: incremental `decode_token()` with a per-layer K/V cache; never
//!   checkpointed, builds no graph.
//! - [`layout`]: the parameter table (Hugging Face names, shapes, roles, init, LoRA targets).
//! - [`state`]: model state and LoRA adapters as safetensors (Hugging Face Llama / PEFT names);
//!   GGUF files (llama.cpp) read, and loaded for the `llama` architecture.

pub mod block;
pub mod checkpointing;
pub mod config;
pub mod decode;
pub mod device;
pub mod dropout;
pub mod error;
pub mod frozen_dtype;
pub mod head;
pub mod layout;
pub mod linear;
pub mod loss;
pub mod model;
pub mod optim;
pub mod packing;
pub mod policy;
pub mod residency;
pub mod rope_scaling;
pub mod state;

pub use checkpointing::{
    ActivationCheckpointing, BlockPolicy, CheckpointPlan, SaveSet, SELECTIVE_POLICIES,
};
pub use config::{MemoryFootprint, TransformerConfig, MAX_MODEL_BYTES, MAX_N_LAYERS};
pub use decode::DecodeSession;
pub use dropout::{dropout_key, BlockDropout, DropoutSite};
pub use error::{Result, TransformerError};
pub use frozen_dtype::WeightDtype;
pub use head::{LossChunking, DEFAULT_LOSS_CHUNK_BYTES};
pub use linear::{LoraConfig, LoraTargets};
pub use model::{DecoderOnlyTransformer, Weights, IGNORE_INDEX};
pub use optim::{Adam, AdamParamState, AdamState};
pub use packing::SequenceLayout;
pub use policy::{
    ActivationCheckpointingKind, FullSequenceAttentionKind, OptionRow, OptionTable,
    ACTIVATION_CHECKPOINTING_POLICIES, ATTENTION_KINDS,
};
pub use residency::{AcquireReason, ParameterResidency, ResidencyUnit, SharedResidency};
pub use rope_scaling::RopeScaling;
pub use state::{
    load_lora_adapter, load_model, load_model_as, load_model_as_stored, load_optimizer_state,
    load_weights_into, save_lora_adapter, save_model, save_optimizer_state,
};
