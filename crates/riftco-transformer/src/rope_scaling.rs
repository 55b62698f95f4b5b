//! RoPE frequency scaling: the inverse frequencies of the rotary position embedding, unscaled or
//! rescaled for a context longer than the one a model was pretrained with.
//!
//! The unscaled inverse frequency of pair `i` of a head of width `d` is
//! `f_i = θ^(−2i/d)` (Su et al. 2021, "RoFormer", eq. 15). The scalings are those of Hugging Face
//! `transformers` (`rope_type` in `config.json`):
//!
//! - `"linear"` (position interpolation, Chen et al. 2023, "Extending Context Window of Large
//!   Language Models via Positional Interpolation"): `f_i / factor`.
//! - `"llama3"` (the frequency-dependent interpolation of Llama 3.1, Meta 2024): with the
//!   wavelength `λ_i = 2π / f_i`, `L = original_max_position_embeddings`,
//!   `λ_lo = L / low_freq_factor` and `λ_hi = L / high_freq_factor`: `f_i` when `λ_i < λ_hi`,
//!   `f_i / factor` when `λ_i > λ_lo`, and in between
//!   `(1 − s)·f_i / factor + s·f_i` with `s = (L/λ_i − low_freq_factor) /
//!   (high_freq_factor − low_freq_factor)`.
//!
//! Neither changes the attention scale (Hugging Face's `attention_factor` is 1 for both).

use crate::error::{Result, TransformerError};
use serde::{Deserialize, Serialize};

/// How the RoPE inverse frequencies are scaled (`rope_type` of a Hugging Face config). Serialized
/// as `{"rope_type": "default"}`, `{"rope_type": "linear", "factor": 4.0}` or
/// `{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
/// "original_max_position_embeddings": 8192}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rope_type", rename_all = "lowercase", deny_unknown_fields)]
pub enum RopeScaling {
    /// Unscaled: `f_i = θ^(−2i/d_head)`.
    #[default]
    Default,
    /// Every inverse frequency divided by `factor` (> 0).
    Linear {
        /// The divisor of every frequency (> 0, finite).
        factor: f64,
    },
    /// Llama 3.1's frequency-dependent scaling (see the module docs).
    Llama3 {
        /// The divisor of the low frequencies (> 0, finite).
        factor: f64,
        /// `L / low_freq_factor` is the wavelength above which frequencies are divided by
        /// `factor` (> 0, finite).
        low_freq_factor: f64,
        /// `L / high_freq_factor` is the wavelength below which frequencies are unchanged
        /// (finite, > `low_freq_factor`).
        high_freq_factor: f64,
        /// `L`, the context length of pretraining (> 0).
        original_max_position_embeddings: usize,
    },
}

impl RopeScaling {
    /// The `rope_type` name (`"default"`, `"linear"`, `"llama3"`).
    pub fn rope_type(&self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Linear { .. } => "linear",
            Self::Llama3 { .. } => "llama3",
        }
    }

    /// Checks the parameters.
    ///
    /// # Errors
    /// [`TransformerError::Config`] (field `rope_scaling`) naming the parameter and its value: a
    /// factor that is not positive and finite, `high_freq_factor <= low_freq_factor`, or
    /// `original_max_position_embeddings = 0`.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str, value: String, reason: &str| {
            Err(TransformerError::Config {
                field: "rope_scaling",
                value: format!("{what} = {value}"),
                reason: format!("{} RoPE: {reason}", self.rope_type()),
            })
        };
        let positive = |what: &str, x: f64| {
            if x.is_finite() && x > 0.0 {
                Ok(())
            } else {
                bad(what, x.to_string(), "must be a positive finite number")
            }
        };
        match *self {
            Self::Default => Ok(()),
            Self::Linear { factor } => positive("factor", factor),
            Self::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                positive("factor", factor)?;
                positive("low_freq_factor", low_freq_factor)?;
                positive("high_freq_factor", high_freq_factor)?;
                if high_freq_factor <= low_freq_factor {
                    return bad(
                        "high_freq_factor",
                        high_freq_factor.to_string(),
                        &format!("must exceed low_freq_factor = {low_freq_factor}"),
                    );
                }
                if original_max_position_embeddings == 0 {
                    return bad(
                        "original_max_position_embeddings",
                        "0".into(),
                        "must be positive",
                    );
                }
                Ok(())
            }
        }
    }

    /// The `d_head / 2` inverse frequencies (radians per position) for RoPE base `theta`, in
    /// f64 (see the module docs for the formulas). Call [`RopeScaling::validate`] first.
    pub fn inverse_frequencies(&self, d_head: usize, theta: f64) -> Vec<f64> {
        let unscaled = (0..d_head / 2).map(|i| 1.0 / theta.powf((2 * i) as f64 / d_head as f64));
        match *self {
            Self::Default => unscaled.collect(),
            Self::Linear { factor } => unscaled.map(|f| f / factor).collect(),
            Self::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let context = original_max_position_embeddings as f64;
                let low_freq_wavelen = context / low_freq_factor;
                let high_freq_wavelen = context / high_freq_factor;
                unscaled
                    .map(|f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < high_freq_wavelen {
                            f
                        } else if wavelen > low_freq_wavelen {
                            f / factor
                        } else {
                            let s = (context / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - s) * f / factor + s * f
                        }
                    })
                    .collect()
            }
        }
    }
}
