//! Model configuration and its validation.

use crate::error::{Result, TransformerError};
use crate::rope_scaling::RopeScaling;
use serde::{Deserialize, Serialize};

/// Sizes and numerics of a LLaMA-style decoder-only transformer.
///
/// Persisted as JSON beside the model state. The activation-checkpointing policy is deliberately
/// not part of it: it changes how a training graph retains activations, not
/// the architecture. JSON without `n_kv_heads` (configs saved before grouped-query attention)
/// reads as `n_kv_heads = n_heads`; without `tie_word_embeddings` as untied.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct TransformerConfig {
    /// Vocabulary size (byte-level: 256).
    pub vocab_size: usize,
    /// Residual stream width.
    pub d_model: usize,
    /// Attention heads; `d_model` must be divisible by it and `d_head = d_model / n_heads` even.
    pub n_heads: usize,
    /// Transformer blocks.
    pub n_layers: usize,
    /// Hidden width of the SwiGLU MLP.
    pub d_ff: usize,
    /// Longest sequence (RoPE table size, K/V cache capacity).
    pub max_seq_len: usize,
    /// RMSNorm epsilon (default 1e-5).
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f32,
    /// RoPE base θ (default 10000).
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    /// Seed of the weight initialisation (and of the dropout masks, see
    /// [`crate::dropout::dropout_key`]).
    #[serde(default)]
    pub seed: u64,
    /// Dropout probability on the attention probabilities, in `[0, 1)` (default 0; Hugging
    /// Face's `attention_dropout`). Active only in training forwards that record a graph.
    #[serde(
        default,
        serialize_with = "dropout_to_json",
        deserialize_with = "attention_dropout_from_json"
    )]
    pub attention_dropout: f32,
    /// Dropout probability on the outputs of the attention and MLP output projections
    /// (`o_proj`, `down_proj`) before the residual adds, in `[0, 1)` (default 0). Active only in
    /// training forwards that record a graph.
    #[serde(
        default,
        serialize_with = "dropout_to_json",
        deserialize_with = "residual_dropout_from_json"
    )]
    pub residual_dropout: f32,
    /// RoPE frequency scaling (default unscaled; Hugging Face `rope_parameters` /
    /// `rope_scaling`), validated by [`RopeScaling::validate`].
    #[serde(default, skip_serializing_if = "is_default_rope")]
    pub rope_scaling: RopeScaling,
    /// Token id that starts a sequence (Hugging Face `bos_token_id`), below `vocab_size`;
    /// informational (riftco adds no token by itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<u32>,
    /// Token ids that end a sequence (Hugging Face `eos_token_id`, an integer or a list), each
    /// below `vocab_size`; generation stops at the first one sampled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub eos_token_ids: Vec<u32>,
    /// Key/value heads of grouped-query attention (Ainslie et al. 2023, "GQA"; Hugging Face's
    /// `num_key_value_heads`): at least 1 and a divisor of `n_heads`; query head `h` reads
    /// key/value head `h / (n_heads / n_kv_heads)`. `k_proj` and `v_proj` are
    /// `[n_kv_heads · d_head, d_model]` and the decode K/V cache holds `n_kv_heads` heads.
    /// Default `n_heads` (multi-head attention); code that changes `n_heads` of an existing
    /// config sets this field too (validation refuses a value that no longer divides it).
    #[serde(default, deserialize_with = "n_kv_heads_from_json")]
    pub n_kv_heads: usize,
    /// Whether the LM head reads the token embedding matrix (Press & Wolf 2017, "Using the
    /// Output Embedding to Improve Language Models"; Hugging Face's `tie_word_embeddings`):
    /// one parameter `model.embed_tokens.weight [vocab_size, d_model]`, whose gradient is the
    /// sum of both uses; no `lm_head.weight`. Default false.
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

impl Serialize for TransformerConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        TransformerConfig::serialize(self, s)
    }
}

impl<'de> Deserialize<'de> for TransformerConfig {
    /// The derived fields, with `n_kv_heads` defaulting to `n_heads` when absent (a default
    /// serde's attributes cannot express: it depends on another field).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let mut v = serde_json::Value::deserialize(d)?;
        if let Some(map) = v.as_object_mut() {
            if !map.contains_key("n_kv_heads") {
                if let Some(h) = map.get("n_heads").cloned() {
                    map.insert("n_kv_heads".into(), h);
                }
            }
        }
        TransformerConfig::deserialize(v).map_err(serde::de::Error::custom)
    }
}

/// `n_kv_heads` from a JSON non-negative integer; another type (a bool, a float, a string) is an
/// error naming the field and the value (serde's own message names neither). Whether it
/// divides `n_heads` is checked by [`TransformerConfig::validate`].
fn n_kv_heads_from_json<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<usize, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    v.as_u64()
        .and_then(|x| usize::try_from(x).ok())
        .ok_or_else(|| {
            serde::de::Error::custom(format!(
                "n_kv_heads = {v}: expected a positive integer dividing n_heads"
            ))
        })
}

fn is_default_rope(r: &RopeScaling) -> bool {
    *r == RopeScaling::Default
}

/// A dropout probability as the f64 of its shortest f32 decimal (`0.1`, not
/// `0.10000000149011612`), which reads back as the same f32.
fn dropout_to_json<S: serde::Serializer>(p: &f32, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(p.to_string().parse().unwrap_or(f64::from(*p)))
}

/// A dropout probability from a JSON number; another type is an error naming `field` (serde's
/// own message does not name it). The range is checked by [`TransformerConfig::validate`].
fn dropout_from_json<'de, D: serde::Deserializer<'de>>(
    field: &str,
    d: D,
) -> std::result::Result<f32, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    probability_from_json(field, &v).map_err(serde::de::Error::custom)
}

/// A dropout probability from a JSON value, checked before it is converted to f32 and reported
/// as written: `v` must be a number in `[0, 1)` whose f32 is below 1 (`0.99999999` rounds to
/// `1.0f32` and is refused as `0.99999999`, `1e39` as `1e39`, not `inf`).
///
/// # Errors
/// `"{field} = {v}: expected a probability in [0, 1)"` for another type or value.
pub(crate) fn probability_from_json(
    field: &str,
    v: &serde_json::Value,
) -> std::result::Result<f32, String> {
    match v.as_f64() {
        Some(p) if (0.0..1.0).contains(&p) && (p as f32) < 1.0 => Ok(p as f32),
        _ => Err(format!("{field} = {v}: expected a probability in [0, 1)")),
    }
}

/// `x` as its shortest decimal (`0.1`, `1.5`, `NaN`, `inf`), in exponent form when that is
/// longer than 12 characters (`1e30`, not `1000000000000000000000000000000`; `1e-30`), for
/// error messages.
pub fn display_f32(x: f32) -> String {
    let plain = x.to_string();
    if plain.len() > 12 {
        format!("{x:e}")
    } else {
        plain
    }
}

fn attention_dropout_from_json<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<f32, D::Error> {
    dropout_from_json("attention_dropout", d)
}

fn residual_dropout_from_json<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<f32, D::Error> {
    dropout_from_json("residual_dropout", d)
}

/// Checks a dropout probability: `p` must be finite and in `[0, 1)` (`p = 1` would drop every
/// element and scale by `1 / 0`).
///
/// # Errors
/// [`TransformerError::Config`] naming `field` and `p` ("attention_dropout = 1.5: expected a
/// probability in [0, 1)").
pub fn validate_dropout(field: &'static str, p: f32) -> Result<()> {
    if (0.0..1.0).contains(&p) {
        Ok(())
    } else {
        Err(TransformerError::Config {
            field,
            value: display_f32(p),
            reason: "expected a probability in [0, 1)".into(),
        })
    }
}

/// The most bytes a model may need: 2^47 bytes (128 TiB), the user address space of x86_64
/// with 4-level paging (AArch64 Linux with 48-bit addresses has more). A config whose
/// [`MemoryFootprint::total`] exceeds it can never be built, so [`TransformerConfig::validate`]
/// rejects it up front; a smaller one that still does not fit this machine fails when its
/// tensors are allocated, with an out-of-memory error.
pub const MAX_MODEL_BYTES: u128 = 1 << 47;

/// The most transformer blocks a model may have (16,384; the largest LLaMA models have 126). Each
/// block owns a few dozen small bookkeeping allocations (parameter leaves, names, adapters)
/// beside its weights, so a config of many tiny blocks could pass [`MAX_MODEL_BYTES`] and still
/// exhaust memory in allocations too small to fail gracefully; this bound keeps that overhead to
/// a few hundred MiB.
pub const MAX_N_LAYERS: usize = 1 << 14;

/// The memory a model of a config needs, in bytes (f32, 4 bytes per element).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryFootprint {
    /// Every parameter: embedding and LM head `2·vocab·d_model` (`vocab·d_model` when tied),
    /// per layer the attention projections `2·d_model² + 2·d_model·d_kv` (q, o and the
    /// `d_kv = n_kv_heads·d_head` wide k, v), the SwiGLU MLP `3·d_model·d_ff` and two RMSNorm
    /// weights, plus the final norm.
    pub parameter_bytes: u128,
    /// One gradient per parameter (training).
    pub gradient_bytes: u128,
    /// Adam's two moments per parameter (training).
    pub optimizer_state_bytes: u128,
    /// The RoPE cos/sin tables, `2 · max_seq_len · d_head/2` elements.
    pub rope_table_bytes: u128,
    /// A decode session's K/V cache, `2 · n_layers · max_seq_len · n_kv_heads · d_head`
    /// elements (`n_heads / n_kv_heads` times smaller than multi-head attention's).
    pub kv_cache_bytes: u128,
}

impl MemoryFootprint {
    /// The sum of the parts, `None` if it overflows `u128`.
    pub fn total(&self) -> Option<u128> {
        self.parameter_bytes
            .checked_add(self.gradient_bytes)?
            .checked_add(self.optimizer_state_bytes)?
            .checked_add(self.rope_table_bytes)?
            .checked_add(self.kv_cache_bytes)
    }
}

#[derive(Clone, Copy)]
enum TermKind {
    Parameters,
    RopeTable,
    KvCache,
}

/// One part of the footprint: its bytes (f32 elements · 4, checked) and the config sizes it is
/// the product of.
struct Term {
    what: &'static str,
    kind: TermKind,
    bytes: Option<u128>,
    factors: Vec<(&'static str, usize)>,
}

fn footprint_terms(c: &TransformerConfig) -> [Term; 6] {
    let product = |coefficient: u128, factors: &[usize]| {
        factors
            .iter()
            .try_fold(coefficient * 4, |acc, &f| acc.checked_mul(f as u128))
    };
    let (v, d, l, ff, t) = (c.vocab_size, c.d_model, c.n_layers, c.d_ff, c.max_seq_len);
    let kv = c.d_kv();
    let embeddings = if c.tie_word_embeddings { 1 } else { 2 };
    let attention = product(2, &[l, d, d]).and_then(|qo| qo.checked_add(product(2, &[l, d, kv])?));
    let norms = (l as u128)
        .checked_mul(2)
        .and_then(|n| n.checked_add(1))
        .and_then(|n| n.checked_mul(d as u128))
        .and_then(|n| n.checked_mul(4));
    [
        Term {
            what: "token embedding and LM head (2 · vocab_size · d_model, half when tied)",
            kind: TermKind::Parameters,
            bytes: product(embeddings, &[v, d]),
            factors: vec![("vocab_size", v), ("d_model", d)],
        },
        Term {
            what:
                "attention projections (2 · n_layers · d_model · (d_model + n_kv_heads · d_head))",
            kind: TermKind::Parameters,
            bytes: attention,
            factors: vec![("n_layers", l), ("d_model", d)],
        },
        Term {
            what: "MLP weights (3 · n_layers · d_model · d_ff)",
            kind: TermKind::Parameters,
            bytes: product(3, &[l, d, ff]),
            factors: vec![("n_layers", l), ("d_model", d), ("d_ff", ff)],
        },
        Term {
            what: "RMSNorm weights ((2 · n_layers + 1) · d_model)",
            kind: TermKind::Parameters,
            bytes: norms,
            factors: vec![("n_layers", l), ("d_model", d)],
        },
        Term {
            what: "RoPE table (max_seq_len · d_head)",
            kind: TermKind::RopeTable,
            bytes: product(1, &[t, c.d_head()]),
            factors: vec![("max_seq_len", t), ("d_model", d)],
        },
        Term {
            what: "decode K/V cache (2 · n_layers · max_seq_len · n_kv_heads · d_head)",
            kind: TermKind::KvCache,
            bytes: product(2, &[l, t, kv]),
            factors: vec![("n_layers", l), ("max_seq_len", t), ("d_model", d)],
        },
    ]
}

fn default_eps() -> f32 {
    1e-5
}

fn default_theta() -> f64 {
    10000.0
}

impl TransformerConfig {
    /// A config with the default `rms_norm_eps`, `rope_theta`, seed 0, no dropout, multi-head
    /// attention (`n_kv_heads = n_heads`) and an untied LM head.
    pub fn new(
        vocab_size: usize,
        d_model: usize,
        n_heads: usize,
        n_layers: usize,
        d_ff: usize,
        max_seq_len: usize,
    ) -> Self {
        Self {
            vocab_size,
            d_model,
            n_heads,
            n_layers,
            d_ff,
            max_seq_len,
            rms_norm_eps: default_eps(),
            rope_theta: default_theta(),
            seed: 0,
            attention_dropout: 0.0,
            residual_dropout: 0.0,
            rope_scaling: RopeScaling::Default,
            bos_token_id: None,
            eos_token_ids: Vec::new(),
            n_kv_heads: n_heads,
            tie_word_embeddings: false,
        }
    }

    /// This config with `n_kv_heads` key/value heads (grouped-query attention).
    pub fn with_n_kv_heads(mut self, n_kv_heads: usize) -> Self {
        self.n_kv_heads = n_kv_heads;
        self
    }

    /// This config with the LM head tied to the token embedding (or not).
    pub fn with_tie_word_embeddings(mut self, tie: bool) -> Self {
        self.tie_word_embeddings = tie;
        self
    }

    /// The reference configuration of the benchmarks (vocab 256, d_model 256, 8 heads, 8 layers,
    /// d_ff 688, max_seq_len 256).
    pub fn reference() -> Self {
        Self::new(256, 256, 8, 8, 688, 256)
    }

    /// Head width, `d_model / n_heads`.
    pub fn d_head(&self) -> usize {
        self.d_model / self.n_heads.max(1)
    }

    /// Output width of `k_proj` and `v_proj`, `n_kv_heads · d_head`.
    pub fn d_kv(&self) -> usize {
        self.n_kv_heads.saturating_mul(self.d_head())
    }

    /// Bytes this model needs in memory (see [`MemoryFootprint`]), computed with checked
    /// arithmetic: `None` when a count does not even fit in `u128`.
    pub fn memory_footprint(&self) -> Option<MemoryFootprint> {
        footprint_terms(self)
            .iter()
            .try_fold(MemoryFootprint::default(), |acc, t| {
                let bytes = t.bytes?;
                let mut acc = acc;
                match t.kind {
                    TermKind::Parameters => {
                        acc.parameter_bytes = acc.parameter_bytes.checked_add(bytes)?;
                    }
                    TermKind::RopeTable => acc.rope_table_bytes = bytes,
                    TermKind::KvCache => acc.kv_cache_bytes = bytes,
                }
                Some(acc)
            })
            .and_then(|mut f| {
                f.gradient_bytes = f.parameter_bytes;
                f.optimizer_state_bytes = f.parameter_bytes.checked_mul(2)?;
                f.total()?;
                Some(f)
            })
    }

    /// Checks every field.
    ///
    /// # Errors
    /// [`TransformerError::Config`] naming the first invalid field and its value: zero sizes,
    /// `d_model` not divisible by `n_heads`, `n_kv_heads` 0 or not dividing `n_heads`, odd
    /// `d_head` (RoPE pairs dimensions), non-positive
    /// or non-finite `rms_norm_eps` / `rope_theta`, a dropout probability outside `[0, 1)`
    /// (NaN and infinities included), invalid [`RopeScaling`] parameters, a `bos_token_id` or
    /// `eos_token_ids` entry not below `vocab_size`, `n_layers` above [`MAX_N_LAYERS`], or sizes whose [`MemoryFootprint`] exceeds
    /// [`MAX_MODEL_BYTES`] (naming the largest size of the largest part, and the byte count).
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &'static str, value: String, reason: &str| {
            Err(TransformerError::Config {
                field,
                value,
                reason: reason.to_string(),
            })
        };
        for (field, v) in [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("n_heads", self.n_heads),
            ("n_layers", self.n_layers),
            ("d_ff", self.d_ff),
            ("max_seq_len", self.max_seq_len),
        ] {
            if v == 0 {
                return bad(field, v.to_string(), "must be positive");
            }
        }
        if self.vocab_size > u32::MAX as usize {
            return bad(
                "vocab_size",
                self.vocab_size.to_string(),
                "token ids are u32",
            );
        }
        if self.d_model % self.n_heads != 0 {
            return bad(
                "n_heads",
                self.n_heads.to_string(),
                &format!("d_model {} is not divisible by n_heads", self.d_model),
            );
        }
        if self.n_kv_heads == 0 || self.n_heads % self.n_kv_heads != 0 {
            return bad(
                "n_kv_heads",
                self.n_kv_heads.to_string(),
                &format!(
                    "must be at least 1 and divide n_heads {} (grouped-query attention: each \
                     key/value head serves n_heads / n_kv_heads query heads)",
                    self.n_heads
                ),
            );
        }
        if self.d_head() % 2 != 0 {
            return bad(
                "d_model",
                self.d_model.to_string(),
                &format!(
                    "d_head = d_model / n_heads = {} must be even for RoPE's rotate-half pairing",
                    self.d_head()
                ),
            );
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return bad(
                "rms_norm_eps",
                self.rms_norm_eps.to_string(),
                "must be a positive finite number",
            );
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return bad(
                "rope_theta",
                self.rope_theta.to_string(),
                "must be a positive finite number",
            );
        }
        self.rope_scaling.validate()?;
        for (field, id) in self
            .bos_token_id
            .iter()
            .map(|&id| ("bos_token_id", id))
            .chain(self.eos_token_ids.iter().map(|&id| ("eos_token_ids", id)))
        {
            if id as usize >= self.vocab_size {
                return bad(
                    field,
                    id.to_string(),
                    &format!("a token id must be below vocab_size = {}", self.vocab_size),
                );
            }
        }
        validate_dropout("attention_dropout", self.attention_dropout)?;
        validate_dropout("residual_dropout", self.residual_dropout)?;
        self.validate_footprint()?;
        if self.n_layers > MAX_N_LAYERS {
            return bad(
                "n_layers",
                self.n_layers.to_string(),
                &format!("at most {MAX_N_LAYERS} transformer blocks are supported"),
            );
        }
        Ok(())
    }

    fn validate_footprint(&self) -> Result<()> {
        let footprint = self.memory_footprint();
        if let Some(total) = footprint.as_ref().and_then(MemoryFootprint::total) {
            if total <= MAX_MODEL_BYTES {
                return Ok(());
            }
        }
        // The part that needs the most bytes (one whose count overflows counts as the largest),
        // and its largest size.
        let terms = footprint_terms(self);
        let largest = terms
            .iter()
            .max_by_key(|t| t.bytes.map_or((1, 0), |b| (0, b)))
            .expect("at least one term");
        let (field, value) = largest
            .factors
            .iter()
            .copied()
            .max_by_key(|&(_, v)| v)
            .expect("every term has a factor");
        let needed = match footprint {
            Some(f) => format!(
                "{} bytes (parameters {}, gradients {}, Adam state {}, RoPE table {}, decode K/V \
                 cache {})",
                f.total().unwrap_or(u128::MAX),
                f.parameter_bytes,
                f.gradient_bytes,
                f.optimizer_state_bytes,
                f.rope_table_bytes,
                f.kv_cache_bytes
            ),
            None => "more than 2^128 bytes".to_string(),
        };
        Err(TransformerError::Config {
            field,
            value: value.to_string(),
            reason: format!(
                "the model would need {needed}, more than the {MAX_MODEL_BYTES} bytes (2^47, \
                 128 TiB) of addressable memory; the largest part is the {}",
                largest.what
            ),
        })
    }

    /// Checks a `[batch, seq]` token buffer against this config.
    ///
    /// # Errors
    /// [`TransformerError::Tokens`] for an empty batch or sequence or a length that is not
    /// `batch·seq`, [`TransformerError::SequenceTooLong`] for a sequence longer than
    /// `max_seq_len`, [`TransformerError::TokenOutOfVocabulary`] for an id `>= vocab_size` (named
    /// with its position).
    pub fn validate_tokens(&self, tokens: &[u32], batch: usize, seq: usize) -> Result<()> {
        if batch == 0 || seq == 0 {
            return Err(TransformerError::Tokens {
                message: format!("batch {batch} and seq {seq} must both be positive"),
            });
        }
        if batch.checked_mul(seq) != Some(tokens.len()) {
            return Err(TransformerError::Tokens {
                message: format!(
                    "{} tokens do not form [batch {batch}, seq {seq}] ({} expected)",
                    tokens.len(),
                    batch as u128 * seq as u128
                ),
            });
        }
        if seq > self.max_seq_len {
            return Err(TransformerError::SequenceTooLong {
                seq,
                max_seq_len: self.max_seq_len,
            });
        }
        if let Some((i, &t)) = tokens
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize >= self.vocab_size)
        {
            return Err(TransformerError::TokenOutOfVocabulary {
                token: t,
                index: Some(i),
                vocab_size: self.vocab_size,
            });
        }
        Ok(())
    }
}
