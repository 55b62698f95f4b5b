//! What a user asks for: an activation-checkpointing policy, its spellings, and the named
//! selective policies.
//!
//! Spellings (Python, CLI, `FromStr`, `Display`, stage metadata):
//! - `disabled` — every activation inside every block is retained;
//! - `block` — every block is a checkpoint (the same as `segments:1`);
//! - `segments:K` — K consecutive blocks form one checkpoint (the last may be shorter); K must
//!   be between 1 and `n_layers` (a larger K is an error, not clamped);
//! - `auto` — K from the measured per-layer bytes (Chen et al. 2016's `k* = sqrt(L·M_ckpt /
//!   M_layer)`, see [`super::planner`]);
//! - `selective` or `selective:NAME` — every block is a selective checkpoint saving the values
//!   of a named policy ([`SELECTIVE_POLICIES`]) or of value names joined by `+`
//!   ([`BLOCK_VALUE_NAMES`], e.g. `selective:q+k+v`);
//! - a comma-separated list with one per-block policy (`disabled`, `block`, `selective[:NAME]`)
//!   per layer, e.g. `disabled,block,selective:dots,block`;
//! - `budget:SIZE` — the planner picks per-block policies whose predicted peak activation bytes
//!   fit `SIZE` ([`parse_byte_size`]: `64MiB`, `1.5GB`, `1000000`).

use crate::error::{Result, TransformerError};
use std::fmt;
use std::str::FromStr;

/// The values a block's forward names (`riftco_autograd::named`), in forward order. A
/// selective policy saves some of them; the replay recomputes the others.
pub const BLOCK_VALUE_NAMES: &[(&str, &str)] = &[
    (
        "attn_norm",
        "RMSNorm of the block input, [batch, seq, d_model]",
    ),
    (
        "q",
        "query projection x·Wqᵀ (base product), [batch·seq, d_model]",
    ),
    (
        "k",
        "key projection x·Wkᵀ (base product), [batch·seq, d_model]",
    ),
    (
        "v",
        "value projection x·Wvᵀ (base product), [batch·seq, d_model]",
    ),
    (
        "q_rope",
        "RoPE of the queries, [batch, seq, n_heads, d_head]",
    ),
    (
        "k_rope",
        "RoPE of the keys, [batch, seq, n_kv_heads, d_head]",
    ),
    (
        "attention",
        "the causal attention core: its output [batch, seq, n_heads, d_head] with the \
         logsumexp (flash) or the probabilities (materialized)",
    ),
    (
        "o",
        "attention output projection (base product), [batch·seq, d_model]",
    ),
    ("mlp_norm", "RMSNorm before the MLP, [batch, seq, d_model]"),
    (
        "gate",
        "MLP gate projection (base product), [batch·seq, d_ff]",
    ),
    ("up", "MLP up projection (base product), [batch·seq, d_ff]"),
    ("swiglu", "SiLU(gate) ⊙ up, [batch·seq, d_ff]"),
];

/// A named selective policy: the block values it saves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SelectivePolicy {
    /// The name (`selective:NAME`).
    pub name: &'static str,
    /// The [`BLOCK_VALUE_NAMES`] it saves.
    pub save: &'static [&'static str],
    /// What it saves and what the replay recomputes.
    pub description: &'static str,
}

/// The named selective policies; the first is what plain `selective` means.
pub const SELECTIVE_POLICIES: &[SelectivePolicy] = &[
    SelectivePolicy {
        name: "attention_ffn",
        save: &["attention", "o", "gate", "up"],
        description: "saves the attention sublayer's output (the attention core's output with \
                      its logsumexp, and the output projection) and the MLP gate and up \
                      products; the replay recomputes the norms, the q/k/v products, RoPE and \
                      SwiGLU",
    },
    SelectivePolicy {
        name: "dots",
        save: &["q", "k", "v", "o", "gate", "up"],
        description: "saves every matrix product but the last (JAX's dots_saveable); the replay \
                      recomputes the norms, RoPE, the attention core and SwiGLU",
    },
    SelectivePolicy {
        name: "attention",
        save: &["attention"],
        description: "saves the attention output with its logsumexp; the replay recomputes \
                      everything else and skips the attention core",
    },
];

/// The set of block values a selective checkpoint saves, with the spelling it came from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SaveSet {
    spelling: String,
    names: Vec<&'static str>,
}

impl SaveSet {
    /// The save set of plain `selective` (the first of [`SELECTIVE_POLICIES`]).
    pub fn default_policy() -> Self {
        let p = &SELECTIVE_POLICIES[0];
        Self {
            spelling: p.name.to_string(),
            names: p.save.to_vec(),
        }
    }

    /// A named policy of [`SELECTIVE_POLICIES`], or block value names joined by `+`.
    ///
    /// # Errors
    /// [`TransformerError::Config`] naming the unknown name and listing the policies and the
    /// value names.
    pub fn parse(spec: &str) -> Result<Self> {
        if let Some(p) = SELECTIVE_POLICIES.iter().find(|p| p.name == spec) {
            return Ok(Self {
                spelling: p.name.to_string(),
                names: p.save.to_vec(),
            });
        }
        let mut names: Vec<&'static str> = Vec::new();
        for part in spec.split('+') {
            let Some(&(name, _)) = BLOCK_VALUE_NAMES.iter().find(|(n, _)| *n == part) else {
                return Err(TransformerError::Config {
                    field: "activation_checkpointing",
                    value: format!("\"selective:{spec}\""),
                    reason: format!(
                        "unknown selective policy or block value {part:?}; expected a policy \
                         ({}) or block value names joined by '+' ({})",
                        quoted(SELECTIVE_POLICIES.iter().map(|p| p.name)),
                        quoted(BLOCK_VALUE_NAMES.iter().map(|(n, _)| *n)),
                    ),
                });
            };
            if !names.contains(&name) {
                names.push(name);
            }
        }
        Ok(Self {
            // Each name once, in the order given (`q+q` is `q`).
            spelling: names.join("+"),
            names,
        })
    }

    /// The saved value names.
    pub fn names(&self) -> &[&'static str] {
        &self.names
    }

    /// The spelling after `selective:`.
    pub fn spelling(&self) -> &str {
        &self.spelling
    }
}

/// What one block does under a plan.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum BlockPolicy {
    /// Every activation retained.
    Disabled,
    /// The block is (part of) a checkpoint: only the boundary is retained.
    Checkpoint,
    /// The block is a selective checkpoint saving these values.
    Selective(SaveSet),
}

impl BlockPolicy {
    /// `disabled`, `block` or `selective[:NAME]`.
    ///
    /// # Errors
    /// [`TransformerError::Config`] for anything else.
    pub fn parse(s: &str) -> Result<Self> {
        let s = s.trim();
        match s {
            "disabled" => Ok(Self::Disabled),
            "block" => Ok(Self::Checkpoint),
            "selective" => Ok(Self::Selective(SaveSet::default_policy())),
            _ => match s.strip_prefix("selective:") {
                Some(name) => Ok(Self::Selective(SaveSet::parse(name)?)),
                None => Err(TransformerError::Config {
                    field: "activation_checkpointing",
                    value: format!("{s:?}"),
                    reason: "a per-block policy is \"disabled\", \"block\" or \
                             \"selective[:NAME]\""
                        .into(),
                }),
            },
        }
    }
}

impl fmt::Display for BlockPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Disabled => f.write_str("disabled"),
            Self::Checkpoint => f.write_str("block"),
            Self::Selective(s) => write!(f, "selective:{}", s.spelling),
        }
    }
}

/// An activation-checkpointing policy (see the module documentation for the spellings).
///
/// Not part of the model state: it changes how a future training graph retains activations,
/// not the architecture or the weights.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ActivationCheckpointing {
    /// Every activation retained.
    #[default]
    Disabled,
    /// Every block is a checkpoint (`segments:1`).
    Block,
    /// K consecutive blocks form one checkpoint.
    Segments(usize),
    /// K chosen from measured per-layer bytes.
    Auto,
    /// Every block is a selective checkpoint.
    Selective(SaveSet),
    /// One policy per block.
    PerBlock(Vec<BlockPolicy>),
    /// Per-block policies planned to fit this many activation bytes at peak.
    Budget(u64),
}

impl ActivationCheckpointing {
    /// The form's C ABI integer (`rt_activation_checkpointing`): 0 disabled, 1 block,
    /// 2 segments, 3 auto, 4 selective, 5 per-block list, 6 budget.
    pub fn c_kind(&self) -> u32 {
        match self {
            Self::Disabled => 0,
            Self::Block => 1,
            Self::Segments(_) => 2,
            Self::Auto => 3,
            Self::Selective(_) => 4,
            Self::PerBlock(_) => 5,
            Self::Budget(_) => 6,
        }
    }

    /// Checks the policy against a model of `n_layers` blocks.
    ///
    /// # Errors
    /// [`TransformerError::Config`] for `segments:K` with K of 0 or above `n_layers`, and for
    /// a per-block list whose length is not `n_layers`.
    pub fn validate(&self, n_layers: usize) -> Result<()> {
        match self {
            Self::Segments(k) if *k == 0 || *k > n_layers => Err(TransformerError::Config {
                field: "activation_checkpointing",
                value: format!("\"{self}\""),
                reason: format!(
                    "segments:K needs 1 <= K <= n_layers = {n_layers} (K is not clamped)"
                ),
            }),
            Self::PerBlock(list) if list.len() != n_layers => Err(TransformerError::Config {
                field: "activation_checkpointing",
                value: format!("\"{self}\""),
                reason: format!(
                    "a per-block list needs one policy per layer: {} given, n_layers = \
                     {n_layers}",
                    list.len()
                ),
            }),
            _ => Ok(()),
        }
    }
}

fn quoted<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The accepted forms, as error messages list them.
pub const POLICY_FORMS: &str = "\"disabled\", \"block\", \"segments:K\" (1 <= K <= n_layers), \
    \"auto\", \"selective\", \"selective:NAME\", a comma-separated per-block list of \
    \"disabled\" / \"block\" / \"selective[:NAME]\" (one per layer), or \"budget:SIZE\"";

impl FromStr for ActivationCheckpointing {
    type Err = TransformerError;

    fn from_str(s: &str) -> Result<Self> {
        // Surrounding whitespace is ignored, around the whole spelling and each list item.
        let s = s.trim();
        let bad = |reason: String| TransformerError::Config {
            field: "activation_checkpointing",
            value: format!("{s:?}"),
            reason,
        };
        if s.contains(',') {
            let list = s
                .split(',')
                .map(|p| BlockPolicy::parse(p.trim()))
                .collect::<Result<Vec<_>>>()?;
            return Ok(Self::PerBlock(list));
        }
        match s {
            "disabled" => return Ok(Self::Disabled),
            "block" => return Ok(Self::Block),
            "auto" => return Ok(Self::Auto),
            "selective" => return Ok(Self::Selective(SaveSet::default_policy())),
            _ => {}
        }
        if let Some(name) = s.strip_prefix("selective:") {
            return Ok(Self::Selective(SaveSet::parse(name)?));
        }
        if let Some(k) = s.strip_prefix("segments:") {
            let digits = !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit());
            return match k.parse::<usize>() {
                Ok(k) if k >= 1 && digits => Ok(Self::Segments(k)),
                // All digits but past usize: the number is fine, its size is not.
                Err(_) if digits => Err(bad(format!(
                    "segments:K needs 1 <= K <= n_layers, got K = {k}, too large"
                ))),
                _ => Err(bad(format!(
                    "segments:K needs an integer K >= 1 (at most n_layers), got {k:?}"
                ))),
            };
        }
        if let Some(size) = s.strip_prefix("budget:") {
            return Ok(Self::Budget(parse_byte_size(size)?));
        }
        Err(bad(format!("expected one of {POLICY_FORMS}")))
    }
}

impl fmt::Display for ActivationCheckpointing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Disabled => f.write_str("disabled"),
            Self::Block => f.write_str("block"),
            Self::Segments(k) => write!(f, "segments:{k}"),
            Self::Auto => f.write_str("auto"),
            Self::Selective(s) => write!(f, "selective:{}", s.spelling),
            Self::PerBlock(list) => {
                let parts: Vec<String> = list.iter().map(ToString::to_string).collect();
                f.write_str(&parts.join(","))
            }
            Self::Budget(bytes) => write!(f, "budget:{bytes}"),
        }
    }
}

impl From<crate::policy::ActivationCheckpointingKind> for ActivationCheckpointing {
    fn from(kind: crate::policy::ActivationCheckpointingKind) -> Self {
        match kind {
            crate::policy::ActivationCheckpointingKind::Disabled => Self::Disabled,
            crate::policy::ActivationCheckpointingKind::TransformerBlock => Self::Block,
        }
    }
}

/// Parses a byte size: an integer or decimal number followed by an optional unit, `B`, `kB`,
/// `MB`, `GB`, `TB` (powers of 1000) or `KiB`, `MiB`, `GiB`, `TiB` (powers of 1024), case
/// insensitive, spaces allowed between (`"64MiB"`, `"1.5 GB"`, `"1000000"`). A decimal number
/// with a unit is rounded down to whole bytes (`"0.3 KiB"` is 307); without one (or with `B`) it
/// must be whole.
///
/// # Errors
/// [`TransformerError::Config`] (field `activation_memory_budget`) naming the text, for an
/// unknown unit, a missing or negative number, a fraction of a byte (`"1.5B"`), or a size of
/// 2^64 bytes or more (the limit of an integer budget too).
pub fn parse_byte_size(text: &str) -> Result<u64> {
    parse_byte_size_for("activation_memory_budget", text)
}

/// [`parse_byte_size`] for the setting `field` (named in its errors).
///
/// # Errors
/// As [`parse_byte_size`], with `field`.
pub fn parse_byte_size_for(field: &'static str, text: &str) -> Result<u64> {
    let bad = |reason: &str| TransformerError::Config {
        field,
        value: format!("{text:?}"),
        reason: format!(
            "{reason}; expected a number of bytes with an optional unit B, kB, MB, GB, TB, \
             KiB, MiB, GiB or TiB (e.g. \"64MiB\")"
        ),
    };
    let t = text.trim();
    if t.starts_with('-') {
        return Err(bad("a negative size"));
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = (&t[..split], t[split..].trim());
    if number.is_empty() {
        return Err(bad("no number"));
    }
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => return Err(bad(&format!("unknown unit {unit:?}"))),
    };
    let too_large = || {
        bad(&format!(
            "too large (at most 2^64 - 1 = {} bytes)",
            u64::MAX
        ))
    };
    // Whole numbers exactly (every u64 round-trips through its spelling); decimals in f64.
    if number.bytes().all(|b| b.is_ascii_digit()) {
        let value: u64 = number.parse().map_err(|_| too_large())?;
        return value.checked_mul(scale).ok_or_else(too_large);
    }
    let value: f64 = number.parse().map_err(|_| bad("not a number"))?;
    if scale == 1 && value.fract() != 0.0 {
        return Err(bad("a fraction of a byte"));
    }
    let bytes = value * scale as f64;
    // 2^64 as f64: anything at or above it does not fit.
    if !bytes.is_finite() || bytes >= 18_446_744_073_709_551_616.0 {
        return Err(too_large());
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_round_trip() {
        for s in [
            "disabled",
            "block",
            "segments:3",
            "auto",
            "selective:attention_ffn",
            "selective:dots",
            "selective:q+k+v",
            "disabled,block,selective:attention",
            "budget:1048576",
        ] {
            let p: ActivationCheckpointing = s.parse().unwrap();
            assert_eq!(p.to_string(), s);
        }
        let p: ActivationCheckpointing = "selective".parse().unwrap();
        assert_eq!(p.to_string(), "selective:attention_ffn");
        // Whitespace around the spelling and around list items is ignored; repeated value
        // names are one.
        for (given, canonical) in [
            (" block ", "block"),
            ("\tsegments:2\n", "segments:2"),
            (
                " block, disabled ,selective:dots ",
                "block,disabled,selective:dots",
            ),
            ("selective:q+q+k", "selective:q+k"),
            ("budget: 1 MiB", "budget:1048576"),
        ] {
            let p: ActivationCheckpointing = given.parse().unwrap();
            assert_eq!(p.to_string(), canonical, "{given:?}");
        }
    }

    #[test]
    fn bad_spellings_name_the_value() {
        for (s, needle) in [
            ("segments:0", "segments:0"),
            ("segments:-1", "segments:-1"),
            ("segments:", "segments:"),
            ("segments:+2", "segments:+2"),
            ("segments: 2", "segments: 2"),
            ("segments:99999999999999999999", "too large"),
            ("selective:fast", "\"fast\""),
            ("selective:q+nope", "\"nope\""),
            ("selective:q+", "\"\""),
            ("full", "\"full\""),
            ("block,full", "\"full\""),
            ("budget:12XB", "\"12XB\""),
        ] {
            let e = s.parse::<ActivationCheckpointing>().unwrap_err();
            assert!(matches!(e, TransformerError::Config { .. }), "{s}: {e}");
            assert!(e.to_string().contains(needle), "{s}: {e}");
        }
    }

    #[test]
    fn validation_against_n_layers() {
        let p = ActivationCheckpointing::Segments(9);
        let e = p.validate(8).unwrap_err().to_string();
        assert!(
            e.contains("segments:9") && e.contains("n_layers = 8"),
            "{e}"
        );
        assert!(ActivationCheckpointing::Segments(8).validate(8).is_ok());
        let list: ActivationCheckpointing = "block,disabled".parse().unwrap();
        let e = list.validate(3).unwrap_err().to_string();
        assert!(e.contains("2 given") && e.contains("n_layers = 3"), "{e}");
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_byte_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_byte_size("1.5 GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_byte_size("1000").unwrap(), 1000);
        assert_eq!(parse_byte_size("2kib").unwrap(), 2048);
        for bad in [
            "12XB",
            "",
            "MiB",
            "-5MiB",
            "1e99TB",
            "1.2.3MB",
            "18446744073709551616",
            "1.5B",
            "0.1",
            "0.5 b",
        ] {
            let e = parse_byte_size(bad).unwrap_err().to_string();
            assert!(e.contains("activation_memory_budget"), "{bad}: {e}");
        }
        assert!(parse_byte_size("-5")
            .unwrap_err()
            .to_string()
            .contains("negative"));
        assert!(parse_byte_size("1.5B")
            .unwrap_err()
            .to_string()
            .contains("a fraction of a byte"));
        assert_eq!(parse_byte_size("0.3 KiB").unwrap(), 307);
        assert_eq!(parse_byte_size("2.0").unwrap(), 2);
        assert!(parse_byte_size("16777216TiB")
            .unwrap_err()
            .to_string()
            .contains("too large"));
        // Whole numbers are exact, up to u64::MAX, and a budget's spelling parses back.
        assert_eq!(
            parse_byte_size("9007199254740993").unwrap(),
            9007199254740993
        );
        assert_eq!(parse_byte_size(&u64::MAX.to_string()).unwrap(), u64::MAX);
        for b in [u64::MAX, (1 << 60) + 1, 9223372036854775807] {
            let p = ActivationCheckpointing::Budget(b);
            assert_eq!(p.to_string().parse::<ActivationCheckpointing>().unwrap(), p);
        }
    }

    #[test]
    fn named_policies_save_known_values() {
        for p in SELECTIVE_POLICIES {
            for n in p.save {
                assert!(BLOCK_VALUE_NAMES.iter().any(|(v, _)| v == n), "{n}");
            }
        }
    }
}
