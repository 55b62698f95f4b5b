//! Full-sequence attention kinds and activation-checkpointing policies.
//!
//! Each option enum has one [`OptionTable`] ([`ATTENTION_KINDS`],
//! [`ACTIVATION_CHECKPOINTING_POLICIES`]): per value its name (the Python and CLI spelling),
//! its C ABI integer and constant, and a description. Parsing, printing, the error messages
//! listing the valid values, the C ABI's integer validation and the Python layer's name lists
//! all read the table.

use crate::error::{Result, TransformerError};
use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

/// One value of an option enum with its spellings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionRow<T> {
    /// The value.
    pub value: T,
    /// The string spelling (Python, CLI, `FromStr`, `Display`).
    pub name: &'static str,
    /// The C ABI integer.
    pub c_value: u32,
    /// The C ABI constant (an enumerator of the header).
    pub c_name: &'static str,
    /// What the value does, in one line.
    pub description: &'static str,
}

/// The values of one option enum, in the order error messages and the Python layer list them
/// (the default first).
#[derive(Debug)]
pub struct OptionTable<T: 'static> {
    /// The option's name in string errors (`"attention"`, the Python keyword).
    pub what: &'static str,
    /// The option's name in integer (C ABI) errors.
    pub c_what: &'static str,
    /// One row per value.
    pub rows: &'static [OptionRow<T>],
    names: OnceLock<String>,
    integers: OnceLock<String>,
}

impl<T: Copy + PartialEq + fmt::Debug + 'static> OptionTable<T> {
    const fn new(what: &'static str, c_what: &'static str, rows: &'static [OptionRow<T>]) -> Self {
        Self {
            what,
            c_what,
            rows,
            names: OnceLock::new(),
            integers: OnceLock::new(),
        }
    }

    /// The row of `value`.
    ///
    /// # Panics
    /// Never for a value of the enum: every variant has a row (checked by the tests).
    pub fn row(&self, value: T) -> &'static OptionRow<T> {
        self.rows
            .iter()
            .find(|r| r.value == value)
            .unwrap_or_else(|| panic!("{value:?} has no row in the {} table", self.what))
    }

    /// The names, in table order.
    pub fn names(&self) -> impl Iterator<Item = &'static str> {
        self.rows.iter().map(|r| r.name)
    }

    /// The valid names as an error message lists them: `"flash", "materialized"`.
    pub fn expected_names(&'static self) -> &'static str {
        self.names.get_or_init(|| {
            let quoted: Vec<String> = self.names().map(|n| format!("{n:?}")).collect();
            quoted.join(", ")
        })
    }

    /// The valid integers in increasing order, each with its name: `0 (materialized), 1 (flash)`.
    pub fn expected_integers(&'static self) -> &'static str {
        self.integers.get_or_init(|| {
            let listed: Vec<String> = self
                .by_c_value()
                .map(|r| format!("{} ({})", r.c_value, r.name))
                .collect();
            listed.join(", ")
        })
    }

    /// The rows in increasing C integer order.
    pub fn by_c_value(&self) -> impl Iterator<Item = &'static OptionRow<T>> {
        let mut rows: Vec<&'static OptionRow<T>> = self.rows.iter().collect();
        rows.sort_by_key(|r| r.c_value);
        rows.into_iter()
    }

    /// The value named `name`.
    ///
    /// # Errors
    /// [`TransformerError::UnknownOption`] naming `name` and listing the valid names.
    pub fn parse(&'static self, name: &str) -> Result<T> {
        match self.rows.iter().find(|r| r.name == name) {
            Some(r) => Ok(r.value),
            None => Err(TransformerError::UnknownOption {
                what: self.what,
                got: name.to_string(),
                expected: self.expected_names(),
            }),
        }
    }

    /// The value of C ABI integer `v`.
    ///
    /// # Errors
    /// [`TransformerError::UnknownOption`] naming `v` and listing the valid integers.
    pub fn from_c(&'static self, v: u32) -> Result<T> {
        match self.rows.iter().find(|r| r.c_value == v) {
            Some(r) => Ok(r.value),
            None => Err(TransformerError::UnknownOption {
                what: self.c_what,
                got: v.to_string(),
                expected: self.expected_integers(),
            }),
        }
    }
}

/// How full-sequence (training) attention is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum FullSequenceAttentionKind {
    /// Scores and probabilities `[batch, heads, seq, seq]` are materialized and kept for backward.
    Materialized,
    /// FlashAttention-2 (Dao 2023): tiled online softmax keeping only the per-row logsumexp;
    /// backward rematerializes probabilities. Retained memory O(seq) per head.
    #[default]
    Flash,
}

/// The attention kinds.
pub static ATTENTION_KINDS: OptionTable<FullSequenceAttentionKind> = OptionTable::new(
    "attention",
    "attention kind",
    &[
        OptionRow {
            value: FullSequenceAttentionKind::Flash,
            name: "flash",
            c_value: 1,
            c_name: "RT_ATTENTION_FLASH",
            description: "FlashAttention-2: tiled online softmax, O(seq) retained memory per head",
        },
        OptionRow {
            value: FullSequenceAttentionKind::Materialized,
            name: "materialized",
            c_value: 0,
            c_name: "RT_ATTENTION_MATERIALIZED",
            description: "scores and probabilities [batch, heads, seq, seq] are materialized",
        },
    ],
);

impl FullSequenceAttentionKind {
    /// The name in [`ATTENTION_KINDS`]: `"materialized"` or `"flash"`.
    pub fn name(self) -> &'static str {
        ATTENTION_KINDS.row(self).name
    }

    /// The C ABI integer in [`ATTENTION_KINDS`] (0 materialized, 1 flash).
    pub fn to_int(self) -> u32 {
        ATTENTION_KINDS.row(self).c_value
    }

    /// Parses the C ABI integer.
    ///
    /// # Errors
    /// [`TransformerError::UnknownOption`] for other values.
    pub fn from_int(v: u32) -> Result<Self> {
        ATTENTION_KINDS.from_c(v)
    }
}

impl FromStr for FullSequenceAttentionKind {
    type Err = TransformerError;
    fn from_str(s: &str) -> Result<Self> {
        ATTENTION_KINDS.parse(s)
    }
}

impl fmt::Display for FullSequenceAttentionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which activations a training forward pass retains.
///
/// Not part of the model state: it changes how a future training graph retains activations,
/// not the architecture or weights. Built to grow (multi-block segments come later).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ActivationCheckpointingKind {
    /// Ordinary graph: every op inside every block is retained (compatibility default).
    #[default]
    Disabled,
    /// Every transformer block is wrapped in `checkpoint()`: only block boundaries and parameter
    /// leaves are retained; each block's forward runs again during backward.
    TransformerBlock,
}

/// The activation-checkpointing policies.
pub static ACTIVATION_CHECKPOINTING_POLICIES: OptionTable<ActivationCheckpointingKind> =
    OptionTable::new(
        "activation_checkpointing",
        "activation checkpointing policy",
        &[
            OptionRow {
                value: ActivationCheckpointingKind::Disabled,
                name: "disabled",
                c_value: 0,
                c_name: "RT_ACTIVATION_CHECKPOINTING_DISABLED",
                description: "every activation inside every block is retained",
            },
            OptionRow {
                value: ActivationCheckpointingKind::TransformerBlock,
                name: "block",
                c_value: 1,
                c_name: "RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK",
                description: "every transformer block is checkpointed: only block boundaries are \
                              retained and each block's forward runs again during backward",
            },
        ],
    );

impl ActivationCheckpointingKind {
    /// The name in [`ACTIVATION_CHECKPOINTING_POLICIES`]: `"disabled"` or `"block"` (the Python
    /// and CLI spelling).
    pub fn name(self) -> &'static str {
        ACTIVATION_CHECKPOINTING_POLICIES.row(self).name
    }

    /// The C ABI integer in [`ACTIVATION_CHECKPOINTING_POLICIES`]
    /// (`RT_ACTIVATION_CHECKPOINTING_DISABLED = 0`,
    /// `RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK = 1`).
    pub fn to_int(self) -> u32 {
        ACTIVATION_CHECKPOINTING_POLICIES.row(self).c_value
    }

    /// Parses the C ABI integer.
    ///
    /// # Errors
    /// [`TransformerError::UnknownOption`] for other values.
    pub fn from_int(v: u32) -> Result<Self> {
        ACTIVATION_CHECKPOINTING_POLICIES.from_c(v)
    }
}

impl FromStr for ActivationCheckpointingKind {
    type Err = TransformerError;
    fn from_str(s: &str) -> Result<Self> {
        ACTIVATION_CHECKPOINTING_POLICIES.parse(s)
    }
}

impl fmt::Display for ActivationCheckpointingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant has exactly one row, names and C integers are unique (the match fails to
    /// compile when a variant is added without a row here).
    #[test]
    fn every_variant_has_one_row_and_spellings_are_unique() {
        fn check<T: Copy + PartialEq + fmt::Debug>(table: &'static OptionTable<T>, all: &[T]) {
            assert_eq!(table.rows.len(), all.len(), "{}", table.what);
            for &v in all {
                assert_eq!(
                    table.rows.iter().filter(|r| r.value == v).count(),
                    1,
                    "{v:?}"
                );
                let row = table.row(v);
                assert_eq!(table.parse(row.name).ok(), Some(v));
                assert_eq!(table.from_c(row.c_value).ok(), Some(v));
                assert!(!row.description.is_empty());
            }
            let mut names: Vec<_> = table.names().collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), all.len(), "{}", table.what);
            let ints: Vec<u32> = table.by_c_value().map(|r| r.c_value).collect();
            assert!(ints.windows(2).all(|w| w[0] < w[1]), "{ints:?}");
        }
        let attention = |k: FullSequenceAttentionKind| match k {
            FullSequenceAttentionKind::Materialized | FullSequenceAttentionKind::Flash => k,
        };
        check(
            &ATTENTION_KINDS,
            &[
                FullSequenceAttentionKind::Materialized,
                FullSequenceAttentionKind::Flash,
            ]
            .map(attention),
        );
        let policy = |k: ActivationCheckpointingKind| match k {
            ActivationCheckpointingKind::Disabled
            | ActivationCheckpointingKind::TransformerBlock => k,
        };
        check(
            &ACTIVATION_CHECKPOINTING_POLICIES,
            &[
                ActivationCheckpointingKind::Disabled,
                ActivationCheckpointingKind::TransformerBlock,
            ]
            .map(policy),
        );
    }

    #[test]
    fn the_default_is_listed_first() {
        assert_eq!(
            ATTENTION_KINDS.rows[0].value,
            FullSequenceAttentionKind::default()
        );
        assert_eq!(
            ACTIVATION_CHECKPOINTING_POLICIES.rows[0].value,
            ActivationCheckpointingKind::default()
        );
    }

    /// The messages the Python and C layers (and their tests) show.
    #[test]
    fn errors_list_the_table() {
        let e = "fast".parse::<FullSequenceAttentionKind>().unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"unknown attention "fast"; expected one of "flash", "materialized""#
        );
        let e = "full".parse::<ActivationCheckpointingKind>().unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"unknown activation_checkpointing "full"; expected one of "disabled", "block""#
        );
        let e = FullSequenceAttentionKind::from_int(2).unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"unknown attention kind "2"; expected one of 0 (materialized), 1 (flash)"#
        );
        let e = ActivationCheckpointingKind::from_int(7).unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"unknown activation checkpointing policy "7"; expected one of 0 (disabled), 1 (block)"#
        );
    }
}
