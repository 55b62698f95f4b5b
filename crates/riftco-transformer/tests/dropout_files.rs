//! Dropout probabilities in saved files: the user-facing `config.json` and
//! `adapter_config.json` decide them over the copies in the weights file's metadata, every
//! value present is validated, two disagreeing copies are an error naming both, and values are
//! reported as written in the file (not as their f32).

mod common;

use common::{lora_config, small_config};
use riftco_transformer::config::validate_dropout;
use riftco_transformer::{
    load_lora_adapter, load_model, save_lora_adapter, save_model,
    ActivationCheckpointingKind as Ck, DecoderOnlyTransformer, FullSequenceAttentionKind as Attn,
    LoraConfig, TransformerConfig, TransformerError,
};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "riftco-dropout-files-{}-{name}",
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

fn new_model(c: TransformerConfig) -> DecoderOnlyTransformer {
    DecoderOnlyTransformer::new(c, Attn::Flash, Ck::Disabled).unwrap()
}

fn load(path: &Path) -> Result<DecoderOnlyTransformer, TransformerError> {
    load_model(path, Attn::Flash, Ck::Disabled)
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

fn write_json(path: &Path, v: &Value) {
    fs::write(path, serde_json::to_vec_pretty(v).unwrap()).unwrap();
}

/// The reason of a `State` error, which must name `file` (its path).
fn state_reason(r: Result<impl std::fmt::Debug, TransformerError>, file: &str) -> String {
    match r {
        Err(TransformerError::State { path, reason }) => {
            assert!(path.ends_with(file), "error names {path}, expected {file}");
            reason
        }
        other => panic!("expected a State error naming {file}, got {other:?}"),
    }
}

/// A model (attention 0.1, residual 0.2) saved into a fresh folder; returns the state's path.
fn saved_model(name: &str) -> PathBuf {
    let mut c = small_config();
    c.attention_dropout = 0.1;
    c.residual_dropout = 0.2;
    let path = tmp_dir(name).join("model.safetensors");
    save_model(&new_model(c), &path).unwrap();
    path
}

fn config_json(state: &Path) -> PathBuf {
    state.parent().unwrap().join("config.json")
}

/// What `AutoConfig.from_pretrained(d); c.attention_dropout = 0.25; c.save_pretrained(d)` leaves
/// (checked with transformers 5.24): the top-level key changed, the `"riftco"` object kept with
/// the old value. It used to load the old 0.1 silently.
#[test]
fn config_json_edited_by_hugging_face_tooling_applies_its_attention_dropout() {
    let state = saved_model("hf-edit");
    let mut hf = read_json(&config_json(&state));
    hf["attention_dropout"] = json!(0.25);
    write_json(&config_json(&state), &hf);
    let back = load(&state).unwrap();
    assert_eq!(back.config().attention_dropout, 0.25);
    assert_eq!(back.config().residual_dropout, 0.2, "untouched");
    assert_eq!(back.dropout_probabilities(), [0.25, 0.2, 0.0]);
}

#[test]
fn config_json_riftco_object_edits_apply_and_conflicting_edits_are_an_error() {
    let state = saved_model("riftco-edit");
    let path = config_json(&state);
    let saved = read_json(&path);

    let mut hf = saved.clone();
    hf["riftco"]["residual_dropout"] = json!(0.05);
    hf["riftco"]["attention_dropout"] = json!(0.3);
    write_json(&path, &hf);
    let back = load(&state).unwrap();
    assert_eq!(back.dropout_probabilities(), [0.3, 0.05, 0.0]);

    // Both copies changed to the same value: applies.
    hf["attention_dropout"] = json!(0.3);
    write_json(&path, &hf);
    assert_eq!(load(&state).unwrap().config().attention_dropout, 0.3);

    // Both changed, to different values: neither can be chosen.
    hf["attention_dropout"] = json!(0.4);
    write_json(&path, &hf);
    let reason = state_reason(load(&state), "config.json");
    for needle in [
        "attention_dropout = 0.4",
        "riftco.attention_dropout = 0.3",
        "saved with 0.1",
    ] {
        assert!(reason.contains(needle), "{needle:?} not in {reason}");
    }

    // Removing the keys leaves the state's own values (not the 0 of an absent riftco key).
    let mut hf = saved.clone();
    hf.as_object_mut().unwrap().remove("attention_dropout");
    let riftco = hf["riftco"].as_object_mut().unwrap();
    riftco.remove("attention_dropout");
    riftco.remove("residual_dropout");
    write_json(&path, &hf);
    assert_eq!(
        load(&state).unwrap().dropout_probabilities(),
        [0.1, 0.2, 0.0]
    );
}

#[test]
fn invalid_dropout_values_in_config_json_are_errors_naming_the_field_and_file() {
    let state = saved_model("invalid");
    let path = config_json(&state);
    let saved = read_json(&path);
    for bad in [
        json!(-0.1),
        json!(1.0),
        json!(1),
        json!("0.1"),
        json!(true),
        json!([0.1]),
        json!({}),
        json!(0.99999999),
        json!(1e39),
    ] {
        let mut hf = saved.clone();
        hf["attention_dropout"] = bad.clone();
        write_json(&path, &hf);
        let reason = state_reason(load(&state), "config.json");
        assert!(
            reason.contains(&format!("attention_dropout = {bad}")),
            "{bad}: {reason}"
        );
        for key in ["attention_dropout", "residual_dropout"] {
            let mut hf = saved.clone();
            hf["riftco"][key] = bad.clone();
            write_json(&path, &hf);
            let reason = state_reason(load(&state), "config.json");
            assert!(
                reason.contains(&format!("{key} = {bad}: expected a probability in [0, 1)")),
                "riftco.{key} {bad}: {reason}"
            );
        }
    }
    // Not the f32 (1 and inf): the f64 of the text.
    for (bad, shown) in [
        ("0.99999999", "attention_dropout = 0.99999999: expected"),
        ("1e39", "attention_dropout = 1e+39: expected"),
    ] {
        let mut hf = saved.clone();
        hf["attention_dropout"] = serde_json::from_str(bad).unwrap();
        write_json(&path, &hf);
        let reason = state_reason(load(&state), "config.json");
        assert!(reason.contains(shown), "{reason}");
    }
}

/// The copy in the state's metadata is reported as written too, not as its f32.
#[test]
fn metadata_probabilities_are_reported_as_written() {
    let state = saved_model("metadata");
    let bytes = fs::read(&state).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let meta = header.metadata().clone().unwrap();
    let mut c: Value = serde_json::from_str(&meta["riftco_config"]).unwrap();
    for (bad, shown) in [
        ("0.99999999", "attention_dropout = 0.99999999"),
        // The f64 as serde_json prints it, not the f32's `inf`.
        ("1e39", "attention_dropout = 1e+39"),
    ] {
        c["attention_dropout"] = serde_json::from_str(bad).unwrap();
        let mut m: HashMap<String, String> = meta.clone();
        m.insert("riftco_config".into(), c.to_string());
        let edited = state.with_file_name("edited.safetensors");
        fs::write(
            &edited,
            safetensors::serialize(st.tensors(), Some(m)).unwrap(),
        )
        .unwrap();
        let reason = state_reason(load(&edited), "edited.safetensors");
        assert!(
            reason.contains(&format!("{shown}: expected a probability in [0, 1)")),
            "{reason}"
        );
    }
}

/// A `config.json` of another architecture is not this state's (a kill between the two renames
/// of a save leaves a newer one): the state loads whole, with its own dropout.
#[test]
fn config_json_of_another_architecture_does_not_apply() {
    let state = saved_model("other-arch");
    let other = tmp_dir("other-arch-new").join("model.safetensors");
    let mut c = small_config();
    c.n_layers += 1;
    c.attention_dropout = 0.3;
    c.residual_dropout = 0.3;
    save_model(&new_model(c), &other).unwrap();
    fs::copy(config_json(&other), config_json(&state)).unwrap();
    let back = load(&state).unwrap();
    assert_eq!(back.config().n_layers, small_config().n_layers);
    assert_eq!(back.dropout_probabilities(), [0.1, 0.2, 0.0]);
    // Still validated.
    let mut hf = read_json(&config_json(&state));
    hf["attention_dropout"] = json!(2.0);
    write_json(&config_json(&state), &hf);
    let reason = state_reason(load(&state), "config.json");
    assert!(reason.contains("attention_dropout = 2.0"), "{reason}");
}

/// A state without riftco metadata reads config.json's `"riftco"` object; with no saved value
/// to tell which copy was edited, the top-level `attention_dropout` must agree with it.
#[test]
fn plain_state_with_disagreeing_copies_in_config_json_is_an_error() {
    let state = saved_model("plain");
    let bytes = fs::read(&state).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    fs::write(
        &state,
        safetensors::serialize(st.tensors(), Some(meta)).unwrap(),
    )
    .unwrap();
    assert_eq!(
        load(&state).unwrap().dropout_probabilities(),
        [0.1, 0.2, 0.0]
    );
    let mut hf = read_json(&config_json(&state));
    hf["attention_dropout"] = json!(0.25);
    write_json(&config_json(&state), &hf);
    let reason = state_reason(load(&state), "config.json");
    assert!(
        reason.contains("attention_dropout = 0.25 disagrees with riftco.attention_dropout = 0.1"),
        "{reason}"
    );
    // Shown as written, not as its f32 (0).
    hf["attention_dropout"] = json!(1e-50);
    write_json(&config_json(&state), &hf);
    let reason = state_reason(load(&state), "config.json");
    assert!(
        reason.contains("attention_dropout = 1e-50 disagrees with riftco.attention_dropout = 0.1"),
        "{reason}"
    );
    hf["attention_dropout"] = json!(0.25);
    hf["riftco"]["attention_dropout"] = json!(0.25);
    write_json(&config_json(&state), &hf);
    assert_eq!(load(&state).unwrap().config().attention_dropout, 0.25);
}

fn saved_adapter(name: &str) -> PathBuf {
    let dir = tmp_dir(name);
    let mut m = new_model(small_config());
    m.enable_lora(&LoraConfig {
        dropout: 0.1,
        ..lora_config()
    })
    .unwrap();
    save_lora_adapter(&m, &dir).unwrap();
    dir
}

fn load_adapter(dir: &Path) -> Result<DecoderOnlyTransformer, TransformerError> {
    let mut m = new_model(small_config());
    load_lora_adapter(&mut m, dir).map(|()| m)
}

/// It used to load the metadata's 0.1 for an edited 0.05, and for "nonsense".
#[test]
fn adapter_config_json_lora_dropout_edits_apply_and_are_validated() {
    let dir = saved_adapter("adapter");
    let path = dir.join("adapter_config.json");
    let saved = read_json(&path);
    let mut v = saved.clone();
    v["lora_dropout"] = json!(0.05);
    write_json(&path, &v);
    assert_eq!(load_adapter(&dir).unwrap().lora_dropout(), 0.05);
    v.as_object_mut().unwrap().remove("lora_dropout");
    write_json(&path, &v);
    assert_eq!(
        load_adapter(&dir).unwrap().lora_dropout(),
        0.0,
        "absent: 0 as in PEFT"
    );
    for bad in [
        json!("nonsense"),
        json!(-0.1),
        json!(1.0),
        json!(0.99999999),
        json!(1e39),
        json!(true),
    ] {
        // json!(0.99999999) prints as 0.99999999, json!(1e39) as 1e+39 (not 1 and inf).
        v["lora_dropout"] = bad.clone();
        write_json(&path, &v);
        let reason = state_reason(load_adapter(&dir), "adapter_config.json");
        assert!(
            reason.contains(&format!(
                "lora_dropout = {bad}: expected a probability in [0, 1)"
            )),
            "{reason}"
        );
    }
    // Another field invalid in the file: named, as on a PEFT load.
    let mut v = saved.clone();
    v["bias"] = json!("all");
    write_json(&path, &v);
    let reason = state_reason(load_adapter(&dir), "adapter_config.json");
    assert!(reason.contains("bias \"all\""), "{reason}");
}

/// An `adapter_config.json` of another adapter (a newer save's, rank 4 beside rank-2 weights)
/// does not apply: the weights' own config loads whole.
#[test]
fn adapter_config_json_of_another_adapter_does_not_apply() {
    let dir = saved_adapter("adapter-other");
    let path = dir.join("adapter_config.json");
    let mut v = read_json(&path);
    let r = v["r"].as_u64().unwrap();
    v["r"] = json!(r * 2);
    v["lora_alpha"] = json!(v["lora_alpha"].as_f64().unwrap() * 2.0);
    v["lora_dropout"] = json!(0.3);
    write_json(&path, &v);
    let back = load_adapter(&dir).unwrap();
    assert_eq!(back.lora_dropout(), 0.1);
}

#[test]
fn setter_errors_show_large_and_tiny_floats_in_exponent_form() {
    for (p, shown) in [
        (1e30f32, "lora_dropout = 1e30:"),
        (-1e-30, "lora_dropout = -1e-30:"),
        (1.5, "lora_dropout = 1.5:"),
        (f32::INFINITY, "lora_dropout = inf:"),
    ] {
        let msg = validate_dropout("lora_dropout", p).unwrap_err().to_string();
        assert!(msg.contains(shown), "{msg}");
    }
}
