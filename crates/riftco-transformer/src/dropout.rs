//! Dropout keys of a model's training forwards.
//!
//! A dropout mask is a pure function of `(key, stream, offset)` (the counter-based generator of
//! `riftco_autograd::ops::dropout`), so a checkpoint replay that passes the same key and stream
//! reconstructs the same mask without storing it. A model derives one key per training forward
//! from its seed and its training-forward counter ([`dropout_key`]); each dropout site of a block
//! has its own stream `[site, layer index]` ([`DropoutSite::stream`]).

use crate::config::validate_dropout;
use crate::error::{Result, TransformerError};
use crate::model::DecoderOnlyTransformer;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub use riftco_autograd::rng::splitmix64;

/// The dropout key of training forward `step` of a model seeded with `seed`:
/// `splitmix64(seed ^ splitmix64(step))` split into `[low 32 bits, high 32 bits]`. Distinct
/// `(seed, step)` pairs give unrelated keys (the mix is a bijection of 64 bits, applied twice);
/// the same pair gives the same key on every run, thread count and platform.
pub fn dropout_key(seed: u64, step: u64) -> [u32; 2] {
    let k = splitmix64(seed ^ splitmix64(step));
    [k as u32, (k >> 32) as u32]
}

/// The dropout sites of a transformer block. A site's mask stream is `[site as u32, layer]`
/// ([`DropoutSite::stream`]); the numbers are part of the replay contract and never change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum DropoutSite {
    /// The attention probabilities `softmax(q·kᵀ/√d_head)` (`attention_dropout`).
    AttentionProbabilities = 1,
    /// The attention output after `o_proj`, before the residual add (`residual_dropout`).
    AttentionResidual = 2,
    /// The MLP output after `down_proj`, before the residual add (`residual_dropout`).
    MlpResidual = 3,
    /// The LoRA input of `q_proj` (`lora_dropout`).
    LoraQ = 4,
    /// The LoRA input of `k_proj`.
    LoraK = 5,
    /// The LoRA input of `v_proj`.
    LoraV = 6,
    /// The LoRA input of `o_proj`.
    LoraO = 7,
    /// The LoRA input of `gate_proj`.
    LoraGate = 8,
    /// The LoRA input of `up_proj`.
    LoraUp = 9,
    /// The LoRA input of `down_proj`.
    LoraDown = 10,
}

impl DropoutSite {
    /// Every site, in stream order.
    pub const ALL: [DropoutSite; 10] = [
        DropoutSite::AttentionProbabilities,
        DropoutSite::AttentionResidual,
        DropoutSite::MlpResidual,
        DropoutSite::LoraQ,
        DropoutSite::LoraK,
        DropoutSite::LoraV,
        DropoutSite::LoraO,
        DropoutSite::LoraGate,
        DropoutSite::LoraUp,
        DropoutSite::LoraDown,
    ];

    /// The mask stream of this site in block `layer`: `[site number, layer]`. Layer indices
    /// above `u32::MAX` cannot occur (a model has at most [`crate::MAX_N_LAYERS`] blocks).
    pub fn stream(self, layer: usize) -> [u32; 2] {
        [self as u32, layer as u32]
    }
}

/// What a block's training forward needs to drop: the forward's key, the block's index and the
/// three probabilities (each in `[0, 1)`; 0 disables that site).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockDropout {
    /// The key of this training forward ([`dropout_key`]).
    pub key: [u32; 2],
    /// The block's index (second word of every stream).
    pub layer: usize,
    /// `attention_dropout`.
    pub attention: f32,
    /// `residual_dropout`.
    pub residual: f32,
    /// `lora_dropout`.
    pub lora: f32,
}

impl BlockDropout {
    /// Whether any site drops (some probability above 0).
    pub fn any(&self) -> bool {
        self.attention > 0.0 || self.residual > 0.0 || self.lora > 0.0
    }

    /// The stream of `site` in this block.
    pub fn stream(&self, site: DropoutSite) -> [u32; 2] {
        site.stream(self.layer)
    }

    /// This forward's dropout of block `layer` (same key and probabilities).
    pub fn for_layer(&self, layer: usize) -> Self {
        Self { layer, ..*self }
    }
}

/// Training mode and dropout of a model. Dropout is active only in a forward of a model that
/// is training ([`DecoderOnlyTransformer::is_training`]) while a graph is being recorded
/// (`riftco_autograd::is_grad_enabled`); evaluation under `no_grad` and decoding never drop.
impl DecoderOnlyTransformer {
    /// Sets training mode (PyTorch's `train()` / `eval()`); a new model is training. A model
    /// that is not training never drops, even while recording a graph (gradients of an
    /// evaluation-mode forward are those of the deterministic model).
    pub fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    /// Whether the model is in training mode (default true).
    pub fn is_training(&self) -> bool {
        self.training
    }

    /// The dropout step: how many training forwards with a dropout probability above 0 have
    /// recorded a graph (starts at 0). Forward `n` (0-based) draws its masks from
    /// [`dropout_key`]`(config.seed, n)`. It is not model state (not saved with the weights);
    /// training records it in its metadata so a resumed run continues the same mask stream
    /// with [`DecoderOnlyTransformer::set_dropout_step`].
    pub fn dropout_step(&self) -> u64 {
        self.dropout_step.load(Ordering::Relaxed)
    }

    /// Sets the dropout step of the next training forward (to resume a run).
    pub fn set_dropout_step(&mut self, step: u64) {
        self.dropout_step.store(step, Ordering::Relaxed);
    }

    /// `[attention_dropout, residual_dropout, lora_dropout]`; LoRA's is 0 without active
    /// adapters.
    pub fn dropout_probabilities(&self) -> [f32; 3] {
        let c = self.config();
        [c.attention_dropout, c.residual_dropout, self.lora_dropout()]
    }

    /// The dropout probability of the active adapters' inputs (0 without active adapters).
    pub fn lora_dropout(&self) -> f32 {
        self.weights()
            .linears()
            .find_map(|(_, lin)| lin.lora.as_ref().filter(|_| lin.lora_active))
            .map_or(0.0, |a| a.dropout)
    }

    /// Changes `attention_dropout` and `residual_dropout` of later training forwards (the
    /// config's fields; saved with the model). Decode sessions and graphs recorded before are
    /// unaffected and stay valid.
    ///
    /// # Errors
    /// [`TransformerError::Config`] naming the field for a probability outside `[0, 1)`; the
    /// model is unchanged then.
    pub fn set_dropout(&mut self, attention: f32, residual: f32) -> Result<()> {
        validate_dropout("attention_dropout", attention)?;
        validate_dropout("residual_dropout", residual)?;
        let mut w = (**self.weights()).clone();
        w.config.attention_dropout = attention;
        w.config.residual_dropout = residual;
        self.swap_weights_keeping_revision(w);
        Ok(())
    }

    /// Changes the dropout probability on every adapter's input (PEFT's `lora_dropout`, saved
    /// in `adapter_config.json`) for later training forwards.
    ///
    /// # Errors
    /// [`TransformerError::Config`] naming `lora_dropout` for a probability outside `[0, 1)`,
    /// [`TransformerError::Lora`] when the model has no adapters; the model is unchanged then.
    pub fn set_lora_dropout(&mut self, p: f32) -> Result<()> {
        validate_dropout("lora_dropout", p)?;
        if !self.has_lora() {
            return Err(TransformerError::Lora {
                message: format!("lora_dropout = {p}: the model has no adapters"),
            });
        }
        let mut w = (**self.weights()).clone();
        for layer in w.layers.iter_mut() {
            Arc::make_mut(layer).try_for_each_linear_mut(|_, lin| {
                if let Some(a) = lin.lora.as_mut() {
                    a.dropout = p;
                }
                Ok(())
            })?;
        }
        self.swap_weights_keeping_revision(w);
        Ok(())
    }

    /// The dropout a training forward of this model applies (key `[0, 0]`, layer 0), without
    /// taking a dropout step: `Some` when the model is training and some probability is above
    /// 0. The planner measures blocks with it, since dropout changes what a block keeps; the
    /// masks' values do not change a block's bytes.
    pub(crate) fn planning_dropout(&self) -> Option<BlockDropout> {
        let [attention, residual, lora] = self.dropout_probabilities();
        let d = BlockDropout {
            key: [0, 0],
            layer: 0,
            attention,
            residual,
            lora,
        };
        (self.training && d.any()).then_some(d)
    }

    /// The dropout of the next forward, taking a dropout step: `Some` only when the model is
    /// training, a graph is being recorded and some probability is above 0 (`layer` 0; the
    /// block forward sets its own index with [`BlockDropout::for_layer`]).
    ///
    /// The step is drawn with [`riftco_autograd::draw_counter`]: a training forward inside a
    /// checkpoint callable (with `preserve_rng_state`) is replayed with the step, and so the
    /// masks, of its forward run.
    ///
    /// # Errors
    /// [`riftco_autograd::AutogradError::CounterOverflow`] when the step is `u64::MAX` (it never
    /// wraps to reuse the masks of step 0).
    pub(crate) fn next_training_dropout(&self) -> Result<Option<BlockDropout>> {
        let Some(d) = self
            .planning_dropout()
            .filter(|_| riftco_autograd::is_grad_enabled())
        else {
            return Ok(None);
        };
        let step = riftco_autograd::draw_counter(&self.dropout_step, "dropout_step")?;
        Ok(Some(BlockDropout {
            key: dropout_key(self.config().seed, step),
            ..d
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// The first five outputs of SplitMix64 seeded with 1234567, as published by Rosetta Code's
    /// "Pseudo-random numbers/Splitmix64" task (computed there with the reference algorithm of
    /// Steele, Lea and Flood / Vigna's `splitmix64.c`): each call advances the state by γ and
    /// applies the mix, so output `i` is `splitmix64(seed + i·γ)`.
    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;
        let seed: u64 = 1_234_567;
        let expected: [u64; 5] = [
            6_457_827_717_110_365_317,
            3_203_168_211_198_807_973,
            9_817_491_932_198_370_423,
            4_593_380_528_125_082_431,
            16_408_922_859_458_223_821,
        ];
        for (i, want) in expected.iter().enumerate() {
            let got = splitmix64(seed.wrapping_add(GAMMA.wrapping_mul(i as u64)));
            assert_eq!(got, *want, "output {i}");
        }
    }

    #[test]
    fn keys_differ_by_seed_and_step() {
        let mut seen = HashSet::new();
        for seed in 0..32u64 {
            for step in 0..32u64 {
                assert!(
                    seen.insert(dropout_key(seed, step)),
                    "seed {seed} step {step} repeats a key"
                );
            }
        }
        // Swapping seed and step does not give the same key (the mix is not symmetric).
        assert_ne!(dropout_key(1, 2), dropout_key(2, 1));
        assert_ne!(dropout_key(0, 0), dropout_key(0, 1));
        assert_ne!(dropout_key(0, 0), dropout_key(1, 0));
    }

    #[test]
    fn keys_are_the_documented_function_of_seed_and_step() {
        for (seed, step) in [(0u64, 0u64), (7, 3), (u64::MAX, 1 << 40)] {
            let k = splitmix64(seed ^ splitmix64(step));
            assert_eq!(dropout_key(seed, step), [k as u32, (k >> 32) as u32]);
            assert_eq!(dropout_key(seed, step), dropout_key(seed, step));
        }
    }

    #[test]
    fn site_streams_are_fixed_and_distinct() {
        let numbers: Vec<u32> = DropoutSite::ALL.iter().map(|&s| s as u32).collect();
        assert_eq!(numbers, (1..=10).collect::<Vec<u32>>());
        assert_eq!(DropoutSite::AttentionProbabilities.stream(3), [1, 3]);
        assert_eq!(DropoutSite::MlpResidual.stream(0), [3, 0]);
        assert_eq!(DropoutSite::LoraDown.stream(7), [10, 7]);
        let d = BlockDropout {
            key: [1, 2],
            layer: 5,
            attention: 0.0,
            residual: 0.1,
            lora: 0.0,
        };
        assert!(d.any());
        assert_eq!(d.stream(DropoutSite::LoraQ), [4, 5]);
        assert_eq!(d.for_layer(2).stream(DropoutSite::LoraQ), [4, 2]);
        assert!(!BlockDropout { residual: 0.0, ..d }.any());
    }
}
