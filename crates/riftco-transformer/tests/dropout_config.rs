//! Dropout configuration: validation of the three probabilities, training mode, the dropout
//! step counter, and the Hugging Face / PEFT round trips of `attention_dropout`,
//! `residual_dropout` and `lora_dropout`.

mod common;

use common::{block, lora_config, small_config};
use riftco_transformer::config::display_f32;
use riftco_transformer::state::hf_config_json;
use riftco_transformer::{
    load_lora_adapter, load_model, save_lora_adapter, save_model,
    ActivationCheckpointingKind as Ck, DecoderOnlyTransformer, FullSequenceAttentionKind as Attn,
    LoraConfig, TransformerConfig, TransformerError,
};
use std::fs;
use std::path::PathBuf;

fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("riftco-dropout-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

const BAD: [f32; 7] = [
    -0.1,
    -1e-30,
    1.0,
    1.5,
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
];

fn config_error(r: Result<impl std::fmt::Debug, TransformerError>) -> String {
    match r {
        Err(e @ TransformerError::Config { .. }) => e.to_string(),
        other => panic!("expected a Config error, got {other:?}"),
    }
}

fn new_model(c: TransformerConfig) -> Result<DecoderOnlyTransformer, TransformerError> {
    DecoderOnlyTransformer::new(c, Attn::Flash, Ck::Disabled)
}

#[test]
fn config_dropout_outside_zero_one_is_a_config_error_naming_the_field() {
    for p in BAD {
        let mut c = small_config();
        c.attention_dropout = p;
        let msg = config_error(new_model(c));
        assert!(
            msg.contains(&format!(
                "attention_dropout = {}: expected a probability in [0, 1)",
                display_f32(p)
            )),
            "{msg}"
        );
        let mut c = small_config();
        c.residual_dropout = p;
        let msg = config_error(new_model(c));
        assert!(
            msg.contains(&format!("residual_dropout = {}", display_f32(p))),
            "{msg}"
        );
    }
    for p in [0.0, 1e-30, 0.1, 0.5, 0.999_999] {
        let mut c = small_config();
        c.attention_dropout = p;
        c.residual_dropout = p;
        new_model(c).unwrap();
    }
}

#[test]
fn lora_dropout_outside_zero_one_is_a_config_error_and_leaves_no_adapters() {
    for p in BAD {
        let mut m = new_model(small_config()).unwrap();
        let lora = LoraConfig {
            dropout: p,
            ..lora_config()
        };
        let msg = config_error(m.enable_lora(&lora));
        assert!(
            msg.contains(&format!(
                "lora_dropout = {}: expected a probability in [0, 1)",
                display_f32(p)
            )),
            "{msg}"
        );
        assert!(!m.has_lora());
    }
}

#[test]
fn configs_saved_before_dropout_load_with_no_dropout() {
    let mut v = serde_json::to_value(small_config()).unwrap();
    let obj = v.as_object_mut().unwrap();
    assert!(obj.remove("attention_dropout").is_some());
    assert!(obj.remove("residual_dropout").is_some());
    let c: TransformerConfig = serde_json::from_value(v.clone()).unwrap();
    assert_eq!((c.attention_dropout, c.residual_dropout), (0.0, 0.0));
    assert_eq!(c, small_config());
    for (field, bad) in [
        ("attention_dropout", serde_json::json!("0.1")),
        ("residual_dropout", serde_json::json!(true)),
        ("residual_dropout", serde_json::Value::Null),
    ] {
        let mut w = v.clone();
        w[field] = bad.clone();
        let err = serde_json::from_value::<TransformerConfig>(w).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("{field} = {bad}: expected a probability")),
            "{err}"
        );
    }
}

#[test]
fn training_mode_defaults_to_true_and_toggles() {
    let mut m = new_model(small_config()).unwrap();
    assert!(m.is_training());
    m.set_training(false);
    assert!(!m.is_training());
    m.set_training(true);
    assert!(m.is_training());
}

/// The dropout step advances once per training forward that records a graph with a
/// probability above 0, and never for evaluation, eval mode or p = 0.
#[test]
fn dropout_step_counts_dropping_training_forwards_only() {
    let tokens = block(2, 9, 64);
    let mut c = small_config();
    c.residual_dropout = 0.1;
    // Block checkpointing: the replays of the backward are not new forwards.
    let mut m = DecoderOnlyTransformer::new(c, Attn::Flash, Ck::TransformerBlock).unwrap();
    assert_eq!(m.dropout_step(), 0);
    m.loss(&tokens, 2, 9).unwrap().backward().unwrap();
    assert_eq!(m.dropout_step(), 1);
    m.loss(&tokens, 2, 9).unwrap().backward().unwrap();
    assert_eq!(m.dropout_step(), 2);
    riftco_autograd::no_grad(|| m.loss(&tokens, 2, 9).unwrap());
    assert_eq!(m.dropout_step(), 2, "no graph: no dropout");
    m.set_training(false);
    m.loss(&tokens, 2, 9).unwrap();
    assert_eq!(m.dropout_step(), 2, "eval mode: no dropout");
    m.set_training(true);
    m.set_dropout_step(1000);
    m.loss(&tokens, 2, 9).unwrap();
    assert_eq!(m.dropout_step(), 1001);

    let plain = new_model(small_config()).unwrap();
    plain.loss(&tokens, 2, 9).unwrap();
    assert_eq!(plain.dropout_step(), 0, "p = 0: no dropout step");
}

#[test]
fn set_dropout_validates_and_keeps_decode_sessions_valid() {
    let mut m = new_model(small_config()).unwrap();
    let mut session = m.decode_session().unwrap();
    session.decode_token(3).unwrap();
    let msg = config_error(m.set_dropout(0.1, 1.0));
    assert!(msg.contains("residual_dropout = 1"), "{msg}");
    assert_eq!(
        m.dropout_probabilities(),
        [0.0, 0.0, 0.0],
        "unchanged on error"
    );
    m.set_dropout(0.1, 0.2).unwrap();
    assert_eq!(m.dropout_probabilities(), [0.1, 0.2, 0.0]);
    assert_eq!(m.config().attention_dropout, 0.1);
    // Dropout is no structural change: the session opened before still decodes.
    session.decode_token(4).unwrap();
}

#[test]
fn lora_dropout_follows_the_active_adapters() {
    let mut m = new_model(small_config()).unwrap();
    assert!(matches!(
        m.set_lora_dropout(0.1),
        Err(TransformerError::Lora { .. })
    ));
    m.enable_lora(&LoraConfig {
        dropout: 0.05,
        ..lora_config()
    })
    .unwrap();
    assert_eq!(m.lora_dropout(), 0.05);
    assert_eq!(m.dropout_probabilities()[2], 0.05);
    let msg = config_error(m.set_lora_dropout(f32::NAN));
    assert!(msg.contains("lora_dropout = NaN"), "{msg}");
    assert_eq!(m.lora_dropout(), 0.05);
    m.set_lora_dropout(0.1).unwrap();
    assert_eq!(m.lora_dropout(), 0.1);
    m.set_lora_active(false).unwrap();
    assert_eq!(m.lora_dropout(), 0.0, "inactive adapters drop nothing");
}

#[test]
fn config_json_carries_attention_dropout_and_residual_dropout() {
    let dir = tmp_dir("hf");
    let mut c = small_config();
    c.attention_dropout = 0.1;
    c.residual_dropout = 0.2;
    let m = new_model(c.clone()).unwrap();
    let path = dir.join("model.safetensors");
    save_model(&m, &path).unwrap();
    let hf: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.join("config.json")).unwrap()).unwrap();
    // Written as the shortest decimal of the f32, as Hugging Face configs hold it.
    assert_eq!(hf["attention_dropout"], serde_json::json!(0.1));
    assert_eq!(hf["riftco"]["residual_dropout"], serde_json::json!(0.2));
    assert!(hf.get("residual_dropout").is_none());
    let back = load_model(&path, Attn::Flash, Ck::Disabled).unwrap();
    assert_eq!(back.config(), &c);
}

#[test]
fn a_plain_hugging_face_config_json_maps_attention_dropout() {
    let mut c = small_config();
    c.attention_dropout = 0.25;
    let mut hf = hf_config_json(&c);
    hf.as_object_mut().unwrap().remove("riftco");
    let dir = tmp_dir("hf-plain");
    let path = dir.join("model.safetensors");
    save_model(&new_model(c.clone()).unwrap(), &path).unwrap();
    // A weights file without riftco metadata, as transformers writes it.
    let bytes = fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    fs::write(
        &path,
        safetensors::serialize(st.tensors(), Some(meta)).unwrap(),
    )
    .unwrap();
    let write_hf = |v: &serde_json::Value| {
        fs::write(dir.join("config.json"), serde_json::to_vec(v).unwrap()).unwrap()
    };
    write_hf(&hf);
    let back = load_model(&path, Attn::Flash, Ck::Disabled).unwrap();
    assert_eq!(back.config().attention_dropout, 0.25);
    assert_eq!(back.config().residual_dropout, 0.0);
    for (bad, needle) in [
        (
            serde_json::json!(1.5),
            "attention_dropout = 1.5: expected a probability",
        ),
        (serde_json::json!(-0.5), "attention_dropout = -0.5"),
        (
            serde_json::json!("0.1"),
            "attention_dropout = \"0.1\" is not a number",
        ),
    ] {
        let mut v = hf.clone();
        v["attention_dropout"] = bad;
        write_hf(&v);
        let err = load_model(&path, Attn::Flash, Ck::Disabled).unwrap_err();
        assert!(
            matches!(err, TransformerError::State { .. }) && err.to_string().contains(needle),
            "{err}"
        );
    }
    hf.as_object_mut().unwrap().remove("attention_dropout");
    write_hf(&hf);
    let back = load_model(&path, Attn::Flash, Ck::Disabled).unwrap();
    assert_eq!(
        back.config().attention_dropout,
        0.0,
        "absent: 0 as in LlamaConfig"
    );
}

#[test]
fn adapter_config_json_carries_lora_dropout() {
    let dir = tmp_dir("peft");
    let mut m = new_model(small_config()).unwrap();
    m.enable_lora(&LoraConfig {
        dropout: 0.05,
        ..lora_config()
    })
    .unwrap();
    save_lora_adapter(&m, &dir).unwrap();
    let cfg_path = dir.join("adapter_config.json");
    let peft: serde_json::Value = serde_json::from_slice(&fs::read(&cfg_path).unwrap()).unwrap();
    assert_eq!(peft["lora_dropout"], serde_json::json!(0.05));
    let mut back = new_model(small_config()).unwrap();
    load_lora_adapter(&mut back, &dir).unwrap();
    assert_eq!(back.lora_dropout(), 0.05);

    // As PEFT writes it: no riftco metadata in the weights file, adapter_config.json is read.
    let model_path = dir.join("adapter_model.safetensors");
    let bytes = fs::read(&model_path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    fs::write(
        &model_path,
        safetensors::serialize(st.tensors(), Some(meta)).unwrap(),
    )
    .unwrap();
    for (bad, needle) in [
        (
            serde_json::json!(1.0),
            // As written in the file (the JSON number 1.0).
            "lora_dropout = 1.0: expected a probability in [0, 1)",
        ),
        (
            serde_json::json!("x"),
            "lora_dropout = \"x\": expected a probability",
        ),
    ] {
        let mut v = peft.clone();
        v["lora_dropout"] = bad;
        fs::write(&cfg_path, serde_json::to_vec(&v).unwrap()).unwrap();
        let mut target = new_model(small_config()).unwrap();
        let err = load_lora_adapter(&mut target, &dir).unwrap_err();
        assert!(
            matches!(err, TransformerError::State { .. }) && err.to_string().contains(needle),
            "{err}"
        );
        assert!(!target.has_lora());
    }
    let mut v = peft.clone();
    v.as_object_mut().unwrap().remove("lora_dropout");
    fs::write(&cfg_path, serde_json::to_vec(&v).unwrap()).unwrap();
    let mut target = new_model(small_config()).unwrap();
    load_lora_adapter(&mut target, &dir).unwrap();
    assert_eq!(target.lora_dropout(), 0.0, "absent: 0 as in PEFT");
}

/// Dropout probabilities are training settings, not architecture: weights saved with one set
/// load into a model with another, which keeps its own.
#[test]
fn weights_load_into_a_model_with_other_dropout() {
    let dir = tmp_dir("weights");
    let path = dir.join("model.safetensors");
    save_model(&new_model(small_config()).unwrap(), &path).unwrap();
    let mut c = small_config();
    c.attention_dropout = 0.1;
    c.residual_dropout = 0.1;
    let m = new_model(c).unwrap();
    riftco_transformer::load_weights_into(&m, &path).unwrap();
    assert_eq!(m.dropout_probabilities(), [0.1, 0.1, 0.0]);
}
