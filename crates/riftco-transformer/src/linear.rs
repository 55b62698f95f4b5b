//! Bias-free linear layers with optional LoRA adapters (Hu et al. 2021, "LoRA", eq. 3):
//! `y = x·Wᵀ + (alpha/r) · (x·Aᵀ)·Bᵀ`, `A [r, in]`, `B [out, r]`.

use crate::error::{Result, TransformerError};
use riftco_autograd::{ops, Variable};
use riftco_tensor::{MemoryCategory, Rng, Tensor};

/// A LoRA adapter of one linear layer.
#[derive(Clone, Debug)]
pub struct LoraAdapter {
    /// Down projection `A [r, in]`, initialised like PEFT (Kaiming-uniform with a = √5, i.e.
    /// `U(−1/√in, 1/√in)`).
    pub a: Variable,
    /// Up projection `B [out, r]`, initialised to zero so the adapter starts as the identity
    /// change.
    pub b: Variable,
    /// `alpha / r`.
    pub scale: f32,
    /// Dropout probability on the adapter's input `x` (PEFT's `lora_dropout`: `B·A·dropout(x)`),
    /// in `[0, 1)`; 0 from [`LoraAdapter::new`], set from [`LoraConfig::dropout`] by
    /// `enable_lora`. Active only in training forwards that record a graph.
    pub dropout: f32,
}

impl LoraAdapter {
    /// A fresh adapter for a `[out, in]` weight named `name`.
    ///
    /// # Errors
    /// `TensorError::ShapeOverflow` / `TensorError::OutOfMemory` when `A [rank, in]` or
    /// `B [out, rank]` cannot be built or allocated.
    pub fn new(
        name: &str,
        out_f: usize,
        in_f: usize,
        rank: usize,
        alpha: f32,
        rng: &mut Rng,
    ) -> crate::error::Result<Self> {
        let bound = 1.0 / (in_f as f32).sqrt();
        let a = Tensor::try_rand_uniform_with(
            [rank, in_f],
            -bound,
            bound,
            rng,
            MemoryCategory::Parameter,
        )?;
        let b = Tensor::try_zeros([out_f, rank], MemoryCategory::Parameter)?;
        let base = name.trim_end_matches(".weight");
        Ok(Self {
            a: Variable::named_leaf(a, true, format!("{base}.lora_A.weight")),
            b: Variable::named_leaf(b, true, format!("{base}.lora_B.weight")),
            scale: alpha / rank as f32,
            dropout: 0.0,
        })
    }
}

/// A linear layer: weight `[out, in]` (Hugging Face layout) and an optional adapter.
#[derive(Clone, Debug)]
pub struct Linear {
    /// The base weight leaf (frozen while an adapter is active).
    pub weight: Variable,
    /// The adapter, when LoRA is enabled for this layer.
    pub lora: Option<LoraAdapter>,
    /// Whether the adapter takes part in the forward pass.
    pub lora_active: bool,
}

impl Linear {
    /// A plain linear layer around a weight leaf.
    pub fn new(weight: Variable) -> Self {
        Self {
            weight,
            lora: None,
            lora_active: false,
        }
    }

    /// `(out, in)`.
    pub fn dims(&self) -> (usize, usize) {
        let d = self.weight.dims();
        (d[0], d[1])
    }

    /// `x [..., in] → [..., out]`.
    ///
    /// # Errors
    /// Shape mismatch on `x`'s last axis.
    pub fn forward(&self, x: &Variable) -> Result<Variable> {
        self.forward_impl(None, x, true, None)
    }

    /// [`Linear::forward`] whose base product `x·Wᵀ` is the named value `name`
    /// (`riftco_autograd::named`): a selective checkpoint saving `name` keeps it and its replay
    /// skips the product; the adapter's path (rank `r`, cheap) is recomputed.
    ///
    /// # Errors
    /// As [`Linear::forward`].
    pub fn forward_named(&self, name: &str, x: &Variable) -> Result<Variable> {
        self.forward_impl(Some(name), x, true, None)
    }

    /// [`Linear::forward`] (with the base product named `name` when given, as
    /// [`Linear::forward_named`]) whose adapter reads `dropout(x)` (PEFT's `lora_dropout`:
    /// `y = x·Wᵀ + scale·(dropout(x)·Aᵀ)·Bᵀ`; the base product reads `x` itself). The mask is
    /// `lora_dropout`'s key and stream with the adapter's own probability
    /// ([`LoraAdapter::dropout`]); without an active adapter it is ignored.
    ///
    /// # Errors
    /// As [`Linear::forward`].
    pub fn forward_with_lora_dropout(
        &self,
        name: Option<&str>,
        x: &Variable,
        lora_dropout: Option<ops::DropoutMask>,
    ) -> Result<Variable> {
        self.forward_impl(name, x, true, lora_dropout)
    }

    /// [`Linear::forward`] recorded for the VJP only, for the tail of a checkpoint replay whose
    /// output value nothing reads (see `riftco_autograd::ops`, "Graph-only variants"): the base
    /// product, the adapter's up projection, its scaling and the sum are not evaluated (their
    /// values are unspecified); the adapter's down projection `x·Aᵀ` is, because the VJP of the up
    /// projection reads it.
    ///
    /// # Errors
    /// Shape mismatch on `x`'s last axis.
    pub fn forward_graph_only(&self, x: &Variable) -> Result<Variable> {
        self.forward_impl(None, x, false, None)
    }

    /// [`Linear::forward_graph_only`] whose adapter reads `dropout(x)` (see
    /// [`Linear::forward_with_lora_dropout`]).
    ///
    /// # Errors
    /// As [`Linear::forward`].
    pub fn forward_graph_only_with_lora_dropout(
        &self,
        x: &Variable,
        lora_dropout: Option<ops::DropoutMask>,
    ) -> Result<Variable> {
        self.forward_impl(None, x, false, lora_dropout)
    }

    /// `y = x·Wᵀ (+ scale·(x·Aᵀ)·Bᵀ)`, with the plain ops when `evaluate`, else their graph-only
    /// variants (except `x·Aᵀ`, always evaluated), the adapter reading `x` through
    /// `lora_dropout` when given.
    fn forward_impl(
        &self,
        name: Option<&str>,
        x: &Variable,
        evaluate: bool,
        lora_dropout: Option<ops::DropoutMask>,
    ) -> Result<Variable> {
        type Binary = fn(&Variable, &Variable) -> riftco_autograd::Result<Variable>;
        type Scale = fn(&Variable, f32) -> riftco_autograd::Result<Variable>;
        let (linear, add, scale): (Binary, Binary, Scale) = if evaluate {
            (ops::linear, ops::add, ops::scale)
        } else {
            (
                ops::linear_graph_only,
                ops::add_graph_only,
                ops::scale_graph_only,
            )
        };
        let y = match name {
            Some(name) => riftco_autograd::named(name, &[x], || linear(x, &self.weight))?,
            None => linear(x, &self.weight)?,
        };
        match (&self.lora, self.lora_active) {
            (Some(l), true) => {
                let x = match lora_dropout {
                    Some(mask) => &ops::dropout(
                        x,
                        ops::DropoutMask {
                            p: l.dropout,
                            ..mask
                        },
                    )?,
                    None => x,
                };
                let down = ops::linear(x, &l.a)?;
                let up = linear(&down, &l.b)?;
                Ok(add(&y, &scale(&up, l.scale)?)?)
            }
            _ => Ok(y),
        }
    }

    /// The leaves this layer reads in the forward pass (base weight, plus A and B when active).
    pub fn forward_leaves(&self) -> Vec<Variable> {
        let mut v = vec![self.weight.clone()];
        if let (Some(l), true) = (&self.lora, self.lora_active) {
            v.push(l.a.clone());
            v.push(l.b.clone());
        }
        v
    }

    /// The effective weight `W + scale·B·A` as a new tensor (used to merge and by decoding).
    ///
    /// # Errors
    /// Never in practice; shapes are consistent by construction.
    pub fn effective_weight(&self) -> Result<Tensor> {
        let w = self
            .weight
            .value()
            .try_deep_clone(MemoryCategory::Parameter)?;
        if let (Some(l), true) = (&self.lora, self.lora_active) {
            let (out_f, in_f) = self.dims();
            let r = l.a.dims()[0];
            let op = "merge LoRA";
            let (a, b) = (l.a.value(), l.b.value());
            let be = riftco_tensor::backend_of(op, &[&w, a, b])?;
            let spec = riftco_tensor::backend::MatmulSpec::new(out_f, r, in_f);
            let delta = be.matmul(
                op,
                spec,
                b,
                a,
                [out_f, in_f].into(),
                MemoryCategory::Workspace,
            )?;
            be.axpy(op, l.scale, &delta, &w)?;
        }
        Ok(w)
    }
}

/// Which linear layers get adapters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoraTargets {
    /// q, k, v, o projections (default true).
    pub attention: bool,
    /// gate, up, down projections (default false).
    pub mlp: bool,
}

impl Default for LoraTargets {
    fn default() -> Self {
        Self {
            attention: true,
            mlp: false,
        }
    }
}

/// LoRA hyper-parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraConfig {
    /// Rank `r` (> 0).
    pub rank: usize,
    /// Scaling numerator `alpha` (scale = alpha / r).
    pub alpha: f32,
    /// Target layers.
    pub targets: LoraTargets,
    /// Seed of the `A` initialisation.
    pub seed: u64,
    /// Dropout probability on each adapter's input, in `[0, 1)` (PEFT's `lora_dropout`,
    /// usually 0.05–0.1; 0 disables it).
    pub dropout: f32,
}

impl LoraConfig {
    /// Validates rank, alpha, targets and dropout.
    ///
    /// # Errors
    /// [`TransformerError::Lora`] for rank 0 or a non-finite alpha;
    /// [`TransformerError::Config`] naming `lora_dropout` for a dropout outside `[0, 1)` (NaN and
    /// infinities included).
    pub fn validate(&self, d_model: usize) -> Result<()> {
        if self.rank == 0 || self.rank > d_model {
            return Err(TransformerError::Lora {
                message: format!("rank {} must be in 1..={d_model} (d_model)", self.rank),
            });
        }
        if !self.alpha.is_finite() || self.alpha <= 0.0 {
            return Err(TransformerError::Lora {
                message: format!("alpha {} must be a positive finite number", self.alpha),
            });
        }
        if !self.targets.attention && !self.targets.mlp {
            return Err(TransformerError::Lora {
                message: "no target layers selected (attention and mlp both false)".into(),
            });
        }
        crate::config::validate_dropout("lora_dropout", self.dropout)
    }
}
