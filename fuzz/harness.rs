//! One fuzz case of the model-file loaders, shared by the `cargo fuzz` target
//! (`fuzz/fuzz_targets/load_model.rs`) and the deterministic mutation test that CI runs
//! (`crates/riftco-transformer/tests/state_mutations.rs`).
//!
//! An input is a folder of two files in one byte string ([`encode`] / [`decode`]):
//! byte 0 selects the folder (even: a model folder, `model.safetensors` + `config.json`; odd: an
//! adapter folder, `adapter_model.safetensors` + `adapter_config.json`), bytes 1..5 are the
//! first file's length `n` (u32, little endian; clamped to what remains), then come the first
//! file's `n` bytes and, in the rest, the second file. An empty second file means "absent".
//!
//! [`run_case`] writes the folder and runs every loader on it; each must return `Ok` or a
//! `State`, `Io`, `Config` or `Lora` error with a message, never panic, abort or report an
//! internal error. A successful load must give a model that computes finite-shaped logits.
#![allow(dead_code)]

use riftco_transformer::{
    load_lora_adapter, load_model, load_weights_into, ActivationCheckpointingKind as Ck,
    DecoderOnlyTransformer, FullSequenceAttentionKind as Attn, TransformerConfig, TransformerError,
};
use std::fs;
use std::path::Path;

/// The base model every adapter of the corpus belongs to (and every model file of the corpus
/// describes): vocab 16, d_model 8, 2 heads, 1 layer, d_ff 12, max_seq_len 8, seed 1.
pub fn base_config() -> TransformerConfig {
    let mut c = TransformerConfig::new(16, 8, 2, 1, 12, 8);
    c.seed = 1;
    c
}

pub fn base_model() -> DecoderOnlyTransformer {
    DecoderOnlyTransformer::new(base_config(), Attn::Flash, Ck::Disabled)
        .expect("the base config is valid")
}

/// Model folder (even selector) or adapter folder (odd).
pub const MODEL: u8 = 0;
pub const ADAPTER: u8 = 1;

pub fn encode(kind: u8, first: &[u8], second: &[u8]) -> Vec<u8> {
    let mut out = vec![kind];
    out.extend((first.len() as u32).to_le_bytes());
    out.extend(first);
    out.extend(second);
    out
}

pub fn decode(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&kind, rest) = input.split_first()?;
    let len = rest.get(..4)?;
    let n = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
    let rest = &rest[4..];
    let n = n.min(rest.len());
    Some((kind % 2, &rest[..n], &rest[n..]))
}

/// What the loaders said, for the caller to check (the corpus must load).
#[derive(Debug, Default)]
pub struct Outcome {
    pub loaded: usize,
    pub errors: Vec<String>,
}

fn check<T>(what: &str, r: Result<T, TransformerError>, out: &mut Outcome) -> Option<T> {
    match r {
        Ok(v) => {
            out.loaded += 1;
            Some(v)
        }
        Err(e) => {
            let clear = matches!(
                e,
                TransformerError::State { .. }
                    | TransformerError::Io { .. }
                    | TransformerError::Config { .. }
                    | TransformerError::Lora { .. }
            );
            let text = e.to_string();
            assert!(clear, "{what}: unexpected error kind {e:?}");
            assert!(!text.is_empty(), "{what}: empty message");
            assert!(!text.contains("internal"), "{what}: internal error: {text}");
            out.errors.push(format!("{what}: {text}"));
            None
        }
    }
}

/// Writes the folder of `input` into `dir` (emptied first) and runs the loaders.
pub fn run_case(dir: &Path, input: &[u8]) -> Outcome {
    let mut out = Outcome::default();
    let Some((kind, first, second)) = decode(input) else {
        return out;
    };
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).expect("a scratch folder");
    let (first_name, second_name) = if kind == MODEL {
        ("model.safetensors", "config.json")
    } else {
        ("adapter_model.safetensors", "adapter_config.json")
    };
    fs::write(dir.join(first_name), first).expect("write the first file");
    if !second.is_empty() {
        fs::write(dir.join(second_name), second).expect("write the second file");
    }
    let tokens: Vec<u32> = (0..4).collect();
    if kind == MODEL {
        let path = dir.join(first_name);
        if let Some(m) = check(
            "load_model",
            load_model(&path, Attn::Flash, Ck::Disabled),
            &mut out,
        ) {
            let seq = 4.min(m.config().max_seq_len);
            let ok = tokens.iter().all(|&t| (t as usize) < m.config().vocab_size);
            if ok {
                let logits = m
                    .logits(&tokens[..seq], 1, seq)
                    .expect("a loaded model runs");
                assert_eq!(logits.dims(), [seq, m.config().vocab_size]);
            }
        }
        let base = base_model();
        check(
            "load_weights_into",
            load_weights_into(&base, &path),
            &mut out,
        );
    } else {
        let mut base = base_model();
        if check(
            "load_lora_adapter",
            load_lora_adapter(&mut base, dir),
            &mut out,
        )
        .is_some()
        {
            assert!(base.has_lora());
            let logits = base.logits(&tokens, 1, 4).expect("an adapted model runs");
            assert_eq!(logits.dims(), [4, 16]);
        } else {
            assert!(!base.has_lora(), "a failed load leaves no adapters");
        }
    }
    out
}
