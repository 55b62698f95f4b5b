//! Oversized configs are rejected up front, naming the field and the byte count, and a model
//! that passes validation but does not fit this machine is an out-of-memory error, not an
//! abort. Tests that really allocate run in a child copy of this test binary under a 4 GB
//! address-space limit (`ulimit -v`), so they cannot take the machine's memory, and they check
//! that the child exited normally.

use riftco_tensor::TensorError;
use riftco_transformer::{
    ActivationCheckpointingKind as Ck, DecoderOnlyTransformer, FullSequenceAttentionKind as Attn,
    MemoryFootprint, TransformerConfig, TransformerError, MAX_MODEL_BYTES,
};
use std::process::Command;

fn small() -> TransformerConfig {
    TransformerConfig::new(256, 64, 4, 2, 128, 64)
}

fn config_field(c: &TransformerConfig) -> Option<(&'static str, String)> {
    match c.validate() {
        Err(TransformerError::Config { field, reason, .. }) => Some((field, reason)),
        _ => None,
    }
}

#[test]
fn each_oversized_size_is_a_config_error_naming_it() {
    type Set = fn(&mut TransformerConfig);
    let cases: [(&str, Set); 6] = [
        ("d_model", |c| {
            c.d_model = 1 << 40;
            c.n_heads = 1;
            c.n_kv_heads = 1;
        }),
        ("d_model", |c| {
            c.d_model = 1 << 62;
            c.n_heads = 1;
            c.n_kv_heads = 1;
        }),
        ("d_ff", |c| c.d_ff = 1 << 40),
        ("n_layers", |c| c.n_layers = 1 << 40),
        ("max_seq_len", |c| c.max_seq_len = 1 << 40),
        ("max_seq_len", |c| c.max_seq_len = 1 << 62),
    ];
    for (field, set) in cases {
        let mut c = small();
        set(&mut c);
        let (got, reason) = config_field(&c).unwrap_or_else(|| panic!("{c:?} was accepted"));
        assert_eq!(got, field, "{c:?}: {reason}");
        assert!(
            reason.contains("bytes") && reason.contains("2^47"),
            "{reason}"
        );
        // Also through the model constructor, which validates before allocating anything (the
        // old max_seq_len = 2^62 filled a wrapped-capacity RoPE table without end).
        let err = DecoderOnlyTransformer::new(c.clone(), Attn::Flash, Ck::Disabled).unwrap_err();
        assert!(matches!(err, TransformerError::Config { field: f, .. } if f == field));
    }
}

#[test]
fn the_footprint_is_counted_exactly() {
    let c = small();
    let (v, d, l, ff, t) = (256u128, 64u128, 2u128, 128u128, 64u128);
    let params = 2 * v * d + l * (4 * d * d + 3 * d * ff + 2 * d) + d;
    assert_eq!(
        c.memory_footprint(),
        Some(MemoryFootprint {
            parameter_bytes: 4 * params,
            gradient_bytes: 4 * params,
            optimizer_state_bytes: 8 * params,
            rope_table_bytes: 4 * t * (d / 4),
            kv_cache_bytes: 4 * 2 * l * t * d,
        })
    );
    // The parameter count agrees with the model's.
    let m = DecoderOnlyTransformer::new(c, Attn::Flash, Ck::Disabled).unwrap();
    let counted: usize = m
        .named_parameters()
        .iter()
        .map(|(_, p)| p.value().numel())
        .sum();
    assert_eq!(counted as u128, params);
    let mut huge = small();
    huge.d_model = 1 << 62;
    huge.n_heads = 1;
    huge.n_kv_heads = 1;
    assert_eq!(
        huge.memory_footprint(),
        None,
        "a count beyond u128 is None, not wrapped"
    );
    // A config just under the bound passes, one over it fails.
    let mut c = small();
    c.max_seq_len = 1 << 30; // K/V cache 2^40 bytes, RoPE 2^36
    assert!(c.validate().is_ok());
    assert!(c.memory_footprint().unwrap().total().unwrap() <= MAX_MODEL_BYTES);
}

#[test]
fn token_counts_that_wrap_are_rejected() {
    let c = small();
    // batch · seq = 2^64 wraps to 0, which an empty buffer would match.
    assert!(matches!(
        c.validate_tokens(&[], 1 << 32, 1 << 32),
        Err(TransformerError::Tokens { .. })
    ));
}

/// Runs `test` of this binary in a child under a 4 GB address-space limit, with
/// `RIFTCO_SIZES_CHILD=1`; returns its stdout after checking it exited with status 0.
fn run_limited(test: &str) -> String {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 4000000 && exec \"$0\" \"$@\"")
        .arg(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env("RIFTCO_SIZES_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "child {test} ended with {:?} (a signal means an abort or crash)\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("1 passed"),
        "the child did not run {test}:\n{stdout}"
    );
    stdout
}

fn in_child() -> bool {
    std::env::var_os("RIFTCO_SIZES_CHILD").is_some()
}

#[test]
fn weights_that_do_not_fit_are_out_of_memory() {
    if !in_child() {
        run_limited("weights_that_do_not_fit_are_out_of_memory");
        return;
    }
    // Passes validation (4 TiB with gradients and Adam) but the 512 GiB embedding is refused.
    let mut c = small();
    c.vocab_size = 1 << 31;
    c.validate().unwrap();
    let err = DecoderOnlyTransformer::new(c, Attn::Flash, Ck::Disabled).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(
            err,
            TransformerError::Autograd(riftco_autograd::AutogradError::Tensor(
                TensorError::OutOfMemory { bytes, .. }
            )) if bytes == 1 << 39
        ),
        "{msg}"
    );
}

#[test]
fn a_kv_cache_that_does_not_fit_is_out_of_memory() {
    if !in_child() {
        run_limited("a_kv_cache_that_does_not_fit_is_out_of_memory");
        return;
    }
    // Weights and RoPE table (d_head 2: 128 MiB) fit in 4 GB; each 4 GiB cache layer does not.
    let mut c = small();
    c.n_heads = 32;
    c.n_kv_heads = 32;
    c.max_seq_len = 1 << 24;
    let m = DecoderOnlyTransformer::new(c, Attn::Flash, Ck::Disabled).unwrap();
    let err = m.decode_session().unwrap_err();
    assert!(
        err.to_string().contains("decode K/V cache: out of memory"),
        "{err}"
    );
}

#[test]
fn many_tiny_layers_are_a_config_error_not_an_abort() {
    // 10^7 blocks of d_model 2 fit the byte bound but used to abort in millions of small
    // bookkeeping allocations (and a crafted model file declaring 10^9 such blocks aborted the
    // loader while it listed the expected tensor names).
    for n_layers in [
        riftco_transformer::MAX_N_LAYERS + 1,
        10_000_000,
        1_000_000_000,
    ] {
        let c = TransformerConfig::new(1, 2, 1, n_layers, 1, 1);
        let (field, reason) = config_field(&c).unwrap_or_else(|| panic!("{c:?} was accepted"));
        assert_eq!(field, "n_layers", "{reason}");
        assert!(reason.contains("16384"), "{reason}");
    }
    let c = TransformerConfig::new(1, 2, 1, riftco_transformer::MAX_N_LAYERS, 1, 1);
    assert!(c.validate().is_ok());
}
