//! The checked-in header `include/riftco.h` must be exactly what the pinned cbindgen (0.29.4,
//! see Cargo.toml) generates from this crate with `cbindgen.toml`.
//!
//! Regenerate after changing the ABI with
//! `RIFTCO_BLESS_HEADER=1 cargo test -p riftco-capi --test header`.

use std::path::Path;

fn generate() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen failed to generate the header");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("the header is UTF-8")
}

#[test]
fn checked_in_header_matches_cbindgen_output() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("include/riftco.h");
    let generated = generate();
    if std::env::var_os("RIFTCO_BLESS_HEADER").is_some() {
        std::fs::write(&path, &generated).expect("write include/riftco.h");
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    if checked_in != generated {
        let first = checked_in
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| checked_in.lines().count().min(generated.lines().count()));
        panic!(
            "{} differs from the cbindgen output (first difference at line {}); regenerate with \
             RIFTCO_BLESS_HEADER=1 cargo test -p riftco-capi --test header",
            path.display(),
            first + 1
        );
    }
}

#[test]
fn header_declares_the_seed_names_and_version() {
    let h = generate();
    for name in [
        "#define RT_ABI_VERSION_MAJOR 2",
        "#define RT_ABI_VERSION_MINOR 10",
        "RT_ACTIVATION_CHECKPOINTING_DISABLED = 0",
        "RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK = 1",
        "RT_ACTIVATION_CHECKPOINTING_SEGMENTS = 2",
        "RT_ACTIVATION_CHECKPOINTING_AUTO = 3",
        "RT_ACTIVATION_CHECKPOINTING_SELECTIVE = 4",
        "RT_ACTIVATION_CHECKPOINTING_PER_BLOCK = 5",
        "RT_ACTIVATION_CHECKPOINTING_BUDGET = 6",
        "rt_model_set_activation_checkpointing_segments(",
        "rt_model_set_activation_checkpointing_selective(",
        "rt_model_set_activation_memory_budget(",
        "rt_model_set_activation_checkpointing_policy(",
        "rt_model_activation_checkpointing_policy(",
        "rt_model_activation_checkpointing_plan(",
        "rt_model_set_activation_checkpointing(",
        "rt_model_activation_checkpointing(",
        "rt_abi_version(",
        "typedef struct rt_transformer_config {",
        "rt_status rt_model_set_dropout(struct rt_model *model,",
        "rt_status rt_model_dropout(const struct rt_model *model,",
        "rt_status rt_model_set_training(struct rt_model *model, bool training);",
        "rt_status rt_model_training(const struct rt_model *model, bool *out);",
        "rt_status rt_model_dropout_step(const struct rt_model *model, uint64_t *out);",
        "rt_status rt_model_set_dropout_step(struct rt_model *model, uint64_t step);",
        "rt_status rt_model_to_device(struct rt_model *model, const char *device);",
        "rt_status rt_model_device(const struct rt_model *model,",
    ] {
        assert!(h.contains(name), "the header lacks {name:?}");
    }
    let config = &h[h.find("typedef struct rt_transformer_config {").unwrap()..];
    let config = &config[..config.find('}').unwrap()];
    assert!(
        !config.contains("checkpoint"),
        "rt_transformer_config must not carry the checkpointing policy"
    );
    // ABI 2.x is additive: dropout is set through functions, the 2.0 structs keep their layout.
    assert!(
        !config.contains("dropout"),
        "rt_transformer_config must keep its 2.0 layout (dropout has setters)"
    );
}

/// The 2.0 layouts of the config structs, which a 2.x library must keep (LP64).
#[cfg(target_pointer_width = "64")]
#[test]
fn config_structs_keep_their_abi_2_0_layout() {
    use riftco::{rt_lora_config, rt_transformer_config};
    use std::mem::{align_of, offset_of, size_of};
    assert_eq!(size_of::<rt_transformer_config>(), 72);
    assert_eq!(align_of::<rt_transformer_config>(), 8);
    assert_eq!(offset_of!(rt_transformer_config, rms_norm_eps), 48);
    assert_eq!(offset_of!(rt_transformer_config, rope_theta), 56);
    assert_eq!(offset_of!(rt_transformer_config, seed), 64);
    assert_eq!(size_of::<rt_lora_config>(), 24);
    assert_eq!(offset_of!(rt_lora_config, seed), 16);
}
