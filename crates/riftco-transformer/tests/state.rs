//! Model state and LoRA adapters as safetensors: bit-exact round trips, the Hugging Face
//! config, atomic writes, and rejection of corrupt or mismatching files (each with its error).

use riftco_transformer::state::{expected_base_shapes, hf_config_json};
use riftco_transformer::{
    load_lora_adapter, load_model, load_weights_into, save_lora_adapter, save_model,
    ActivationCheckpointingKind as Ck, DecoderOnlyTransformer, FullSequenceAttentionKind as Attn,
    LoraConfig, LoraTargets, TransformerConfig, TransformerError,
};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

fn config() -> TransformerConfig {
    let mut c = TransformerConfig::new(64, 32, 4, 2, 48, 16);
    c.seed = 5;
    c
}

/// A fresh, empty folder for one test.
fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("riftco-state-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

/// A model whose norm weights are not all ones (so they are checked too).
fn model(config: TransformerConfig) -> DecoderOnlyTransformer {
    let m = DecoderOnlyTransformer::new(config, Attn::Flash, Ck::Disabled).unwrap();
    for (name, p) in m.named_parameters() {
        if name.ends_with("norm.weight") {
            let n = p.value().numel();
            let v: Vec<f32> = (0..n).map(|i| 1.0 + (i as f32) * 0.013).collect();
            p.value().copy_from_slice(&v).unwrap();
        }
    }
    m
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn tokens() -> Vec<u32> {
    (0..2 * 12).map(|i| (i * 29 % 64) as u32).collect()
}

fn logits(m: &DecoderOnlyTransformer) -> Vec<u32> {
    bits(&m.logits(&tokens(), 2, 12).unwrap().value().to_vec())
}

fn assert_same_params(a: &DecoderOnlyTransformer, b: &DecoderOnlyTransformer) {
    let (pa, pb) = (a.named_parameters(), b.named_parameters());
    assert_eq!(pa.len(), pb.len());
    for ((na, va), (nb, vb)) in pa.iter().zip(&pb) {
        assert_eq!(na, nb);
        assert_eq!(va.dims(), vb.dims(), "{na}");
        assert_eq!(
            bits(&va.value().to_vec()),
            bits(&vb.value().to_vec()),
            "{na}"
        );
    }
}

/// The reason of a `State` error (panics on any other outcome).
fn state_reason<T>(r: Result<T, TransformerError>) -> String {
    match r {
        Err(TransformerError::State { reason, .. }) => reason,
        Err(e) => panic!("expected a State error, got {e:?}"),
        Ok(_) => panic!("expected a State error, got Ok"),
    }
}

fn load(path: &Path) -> Result<DecoderOnlyTransformer, TransformerError> {
    load_model(path, Attn::Flash, Ck::Disabled)
}

/// (name, dtype, shape, little-endian bytes)
type Entry = (String, Dtype, Vec<usize>, Vec<u8>);

fn f32_entries(m: &DecoderOnlyTransformer) -> Vec<Entry> {
    m.named_parameters()
        .into_iter()
        .map(|(n, p)| {
            let bytes = p
                .value()
                .to_vec()
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect();
            (n, Dtype::F32, p.dims().to_vec(), bytes)
        })
        .collect()
}

fn write_st(path: &Path, entries: &[Entry], metadata: Option<HashMap<String, String>>) {
    let views: Vec<(String, TensorView<'_>)> = entries
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    fs::write(path, safetensors::serialize(views, metadata).unwrap()).unwrap();
}

fn riftco_metadata(c: &TransformerConfig) -> Option<HashMap<String, String>> {
    Some(HashMap::from([
        ("format".to_string(), "pt".to_string()),
        (
            "riftco_config".to_string(),
            serde_json::to_string(c).unwrap(),
        ),
    ]))
}

#[test]
fn expected_shapes_match_named_parameters() {
    let m = model(config());
    let got: Vec<(String, Vec<usize>)> = m
        .named_parameters()
        .into_iter()
        .map(|(n, p)| (n, p.dims().to_vec()))
        .collect();
    assert_eq!(got, expected_base_shapes(&config()));
}

#[test]
fn round_trip_is_bit_exact() {
    let dir = tmp_dir("round-trip");
    let path = dir.join("model.safetensors");
    let m = model(config());
    save_model(&m, &path).unwrap();
    let back = load_model(&path, Attn::Materialized, Ck::TransformerBlock).unwrap();
    assert_eq!(back.config(), m.config());
    assert_eq!(back.attention_kind(), Attn::Materialized);
    assert_eq!(
        *back.activation_checkpointing(),
        Ck::TransformerBlock.into()
    );
    assert_same_params(&m, &back);
    let back = load(&path).unwrap();
    assert_eq!(logits(&m), logits(&back));
}

#[test]
fn metadata_and_config_json() {
    let dir = tmp_dir("metadata");
    let path = dir.join("model.safetensors");
    let m = model(config());
    save_model(&m, &path).unwrap();

    let bytes = fs::read(&path).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta = meta.metadata().clone().unwrap();
    assert_eq!(meta["format"], "pt");
    let saved: TransformerConfig = serde_json::from_str(&meta["riftco_config"]).unwrap();
    assert_eq!(saved, config());
    assert!(!meta["riftco_config"].contains("checkpoint"));
    let st = SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(
        st.tensor("model.layers.1.mlp.down_proj.weight")
            .unwrap()
            .shape(),
        [32, 48]
    );
    assert_eq!(st.tensor("lm_head.weight").unwrap().dtype(), Dtype::F32);

    let hf: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(hf["architectures"], serde_json::json!(["LlamaForCausalLM"]));
    assert_eq!(hf["model_type"], "llama");
    assert_eq!(hf["hidden_size"], 32);
    assert_eq!(hf["intermediate_size"], 48);
    assert_eq!(hf["num_attention_heads"], 4);
    assert_eq!(hf["num_key_value_heads"], 4);
    assert_eq!(hf["num_hidden_layers"], 2);
    assert_eq!(hf["vocab_size"], 64);
    assert_eq!(hf["max_position_embeddings"], 16);
    assert_eq!(hf["rms_norm_eps"].as_f64().unwrap() as f32, 1e-5);
    assert_eq!(hf["rope_theta"], 10000.0);
    assert_eq!(hf["tie_word_embeddings"], false);
    assert_eq!(hf["torch_dtype"], "float32");
    let riftco: TransformerConfig = serde_json::from_value(hf["riftco"].clone()).unwrap();
    assert_eq!(riftco, config());
}

#[test]
fn loads_with_a_plain_hugging_face_config_json() {
    let dir = tmp_dir("hf-config");
    let path = dir.join("model.safetensors");
    let m = model(config());
    write_st(&path, &f32_entries(&m), None);
    // No metadata and no config.json: nothing says which config.
    let reason = state_reason(load(&path));
    assert!(reason.contains("no riftco_config metadata"), "{reason}");

    let mut hf = hf_config_json(&config());
    hf.as_object_mut().unwrap().remove("riftco");
    fs::write(dir.join("config.json"), serde_json::to_vec(&hf).unwrap()).unwrap();
    let back = load(&path).unwrap();
    assert_same_params(&m, &back);

    // Grouped-query attention is read: this multi-head file's k_proj is too wide for it.
    hf["num_key_value_heads"] = 2.into();
    fs::write(dir.join("config.json"), serde_json::to_vec(&hf).unwrap()).unwrap();
    let reason = state_reason(load(&path));
    assert!(
        reason.contains("k_proj.weight") && reason.contains("n_kv_heads 2"),
        "{reason}"
    );
    // num_key_value_heads must divide num_attention_heads.
    hf["num_key_value_heads"] = 3.into();
    fs::write(dir.join("config.json"), serde_json::to_vec(&hf).unwrap()).unwrap();
    let reason = state_reason(load(&path));
    assert!(reason.contains("n_kv_heads = 3"), "{reason}");
    // A tied config: this untied file's lm_head.weight differs from its embedding.
    hf["num_key_value_heads"] = 4.into();
    hf["tie_word_embeddings"] = true.into();
    fs::write(dir.join("config.json"), serde_json::to_vec(&hf).unwrap()).unwrap();
    let reason = state_reason(load(&path));
    assert!(
        reason.contains("lm_head.weight differs from model.embed_tokens.weight"),
        "{reason}"
    );
}

/// A Hugging Face folder of a tied GQA model (config.json without the "riftco" key, no
/// lm_head.weight, no riftco metadata) loads with num_key_value_heads and tie_word_embeddings.
#[test]
fn loads_a_plain_hugging_face_gqa_tied_folder() {
    let dir = tmp_dir("hf-gqa-tied");
    let path = dir.join("model.safetensors");
    let c = config().with_n_kv_heads(2).with_tie_word_embeddings(true);
    let m = model(c.clone());
    write_st(&path, &f32_entries(&m), None);
    let mut hf = hf_config_json(&c);
    hf.as_object_mut().unwrap().remove("riftco");
    assert_eq!(hf["num_key_value_heads"], 2);
    assert_eq!(hf["tie_word_embeddings"], true);
    fs::write(dir.join("config.json"), serde_json::to_vec(&hf).unwrap()).unwrap();
    let back = load(&path).unwrap();
    assert_eq!(back.config().n_kv_heads, 2);
    assert!(back.config().tie_word_embeddings);
    assert_same_params(&m, &back);
}

#[test]
fn writes_are_atomic_and_replace_whole_files() {
    let dir = tmp_dir("atomic");
    let path = dir.join("model.safetensors");
    let mut big = config();
    big.n_layers = 3;
    big.d_ff = 96;
    save_model(&model(big), &path).unwrap();
    let big_len = fs::metadata(&path).unwrap().len();
    let small = model(config());
    save_model(&small, &path).unwrap();
    assert!(fs::metadata(&path).unwrap().len() < big_len);
    let back = load(&path).unwrap();
    assert_eq!(back.config(), &config());
    assert_same_params(&small, &back);
    let mut names: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["config.json", "model.safetensors"],
        "no temporary file left"
    );

    // A folder that does not exist: Io error naming the path.
    let missing = dir.join("no-such-folder").join("model.safetensors");
    match save_model(&small, &missing) {
        Err(TransformerError::Io { path, .. }) => {
            assert!(path.contains("no-such-folder"), "{path}")
        }
        other => panic!("expected Io, got {other:?}"),
    }

    // The rename fails (the destination is a non-empty folder): the old entry is intact and the
    // temporary file is removed.
    let blocked = dir.join("blocked.safetensors");
    fs::create_dir_all(blocked.join("inside")).unwrap();
    match save_model(&small, &blocked) {
        Err(TransformerError::Io { path, .. }) => assert!(path.contains("blocked"), "{path}"),
        other => panic!("expected Io, got {other:?}"),
    }
    assert!(blocked.join("inside").is_dir());
    let leftovers: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp."))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[cfg(unix)]
#[test]
fn failed_write_to_read_only_folder_keeps_the_old_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tmp_dir("read-only");
    let path = dir.join("model.safetensors");
    let old = model(config());
    save_model(&old, &path).unwrap();
    let before = fs::read(&path).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o555)).unwrap();
    // Root ignores folder permissions; then there is nothing to test.
    let probe = dir.join("probe");
    let writable = fs::write(&probe, b"x").is_ok();
    let mut other = config();
    other.seed = 99;
    let result = save_model(&model(other), &path);
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    if writable {
        eprintln!("skipped: the folder stays writable (running as root)");
        return;
    }
    match result {
        Err(TransformerError::Io { path: p, .. }) => assert!(p.contains("model.safetensors")),
        other => panic!("expected Io, got {other:?}"),
    }
    assert_eq!(fs::read(&path).unwrap(), before);
}

#[test]
fn rejects_truncated_and_garbage_files() {
    let dir = tmp_dir("corrupt");
    let path = dir.join("model.safetensors");
    save_model(&model(config()), &path).unwrap();
    let good = fs::read(&path).unwrap();
    let bad = dir.join("bad.safetensors");

    fs::write(&bad, &good[..good.len() - 10]).unwrap();
    let reason = state_reason(load(&bad));
    assert!(reason.contains("truncated"), "{reason}");

    fs::write(&bad, &good[..5]).unwrap();
    let reason = state_reason(load(&bad));
    assert!(
        reason.contains("fewer than the 8-byte header length"),
        "{reason}"
    );

    let mut long = good.clone();
    long[..8].copy_from_slice(&(good.len() as u64 + 100).to_le_bytes());
    fs::write(&bad, &long).unwrap();
    let reason = state_reason(load(&bad));
    assert!(reason.contains("exceeds"), "{reason}");

    fs::write(&bad, b"this is not a safetensors file, just some text").unwrap();
    let reason = state_reason(load(&bad));
    assert!(reason.contains("header length"), "{reason}");

    let mut garbage = 16u64.to_le_bytes().to_vec();
    garbage.extend([0xff_u8; 16]);
    fs::write(&bad, &garbage).unwrap();
    let reason = state_reason(load(&bad));
    assert!(reason.contains("not UTF-8"), "{reason}");

    let mut not_json = 16u64.to_le_bytes().to_vec();
    not_json.extend(b"hello, world!!!!");
    fs::write(&bad, &not_json).unwrap();
    let reason = state_reason(load(&bad));
    assert!(reason.contains("not valid safetensors JSON"), "{reason}");

    match load(&dir.join("absent.safetensors")) {
        Err(TransformerError::Io { path, .. }) => assert!(path.contains("absent")),
        other => panic!("expected Io, got {other:?}"),
    }
}

#[test]
fn rejects_wrong_names_dtypes_and_shapes() {
    let dir = tmp_dir("names");
    let path = dir.join("model.safetensors");
    let m = model(config());
    let meta = riftco_metadata(&config());

    let mut entries = f32_entries(&m);
    entries.retain(|(n, ..)| n != "model.layers.1.self_attn.v_proj.weight");
    write_st(&path, &entries, meta.clone());
    let reason = state_reason(load(&path));
    assert!(reason.contains("missing"), "{reason}");
    assert!(
        reason.contains("model.layers.1.self_attn.v_proj.weight"),
        "{reason}"
    );

    let mut entries = f32_entries(&m);
    entries.push((
        "model.layers.0.extra.weight".into(),
        Dtype::F32,
        vec![1],
        vec![0; 4],
    ));
    write_st(&path, &entries, meta.clone());
    let reason = state_reason(load(&path));
    assert!(reason.contains("unknown"), "{reason}");
    assert!(reason.contains("model.layers.0.extra.weight"), "{reason}");

    let mut entries = f32_entries(&m);
    let norm = entries
        .iter_mut()
        .find(|e| e.0 == "model.norm.weight")
        .unwrap();
    *norm = (norm.0.clone(), Dtype::F32, vec![33], vec![0; 33 * 4]);
    write_st(&path, &entries, meta.clone());
    let reason = state_reason(load(&path));
    assert!(reason.contains("model.norm.weight"), "{reason}");
    assert!(
        reason.contains("[33]") && reason.contains("[32]"),
        "{reason}"
    );

    let mut entries = f32_entries(&m);
    let norm = entries
        .iter_mut()
        .find(|e| e.0 == "model.norm.weight")
        .unwrap();
    let f64s: Vec<u8> = (0..32).flat_map(|_| 1.0f64.to_le_bytes()).collect();
    *norm = (norm.0.clone(), Dtype::F64, vec![32], f64s);
    write_st(&path, &entries, meta.clone());
    let reason = state_reason(load(&path));
    assert!(
        reason.contains("model.norm.weight") && reason.contains("F64"),
        "{reason}"
    );

    let mut entries = f32_entries(&m);
    let norm = entries
        .iter_mut()
        .find(|e| e.0 == "model.norm.weight")
        .unwrap();
    // F16 and BF16 are read (tests/hf_files.rs); an integer dtype is not.
    *norm = (norm.0.clone(), Dtype::I8, vec![32], vec![0; 32]);
    write_st(&path, &entries, meta);
    let reason = state_reason(load(&path));
    assert!(
        reason.contains("I8") && reason.contains("model.norm.weight"),
        "{reason}"
    );
}

#[test]
fn rejects_a_config_that_disagrees_with_the_tensors() {
    let dir = tmp_dir("disagree");
    let path = dir.join("model.safetensors");
    let m = model(config());
    let mut wrong = config();
    wrong.d_ff = 40;
    write_st(&path, &f32_entries(&m), riftco_metadata(&wrong));
    let reason = state_reason(load(&path));
    assert!(
        reason.contains("model.layers.0.mlp.gate_proj.weight"),
        "{reason}"
    );
    assert!(
        reason.contains("[48, 32]") && reason.contains("[40, 32]"),
        "{reason}"
    );

    let mut invalid = config();
    invalid.n_heads = 3;
    write_st(&path, &f32_entries(&m), riftco_metadata(&invalid));
    let reason = state_reason(load(&path));
    assert!(reason.contains("n_heads"), "{reason}");

    let mut meta = riftco_metadata(&config()).unwrap();
    meta.insert("riftco_config".into(), "{not json".into());
    write_st(&path, &f32_entries(&m), Some(meta));
    let reason = state_reason(load(&path));
    assert!(reason.contains("riftco_config"), "{reason}");
}

#[test]
fn load_weights_into_copies_in_place() {
    let dir = tmp_dir("into");
    let path = dir.join("model.safetensors");
    let source = model(config());
    save_model(&source, &path).unwrap();

    let mut other = config();
    other.seed = 77;
    let target = model(other);
    let before: Vec<u64> = target
        .named_parameters()
        .iter()
        .map(|(_, p)| p.value().version())
        .collect();
    let ids: Vec<usize> = target
        .named_parameters()
        .iter()
        .map(|(_, p)| p.value().storage_id())
        .collect();
    load_weights_into(&target, &path).unwrap();
    assert_same_params(&source, &target);
    for (i, (name, p)) in target.named_parameters().iter().enumerate() {
        assert_eq!(p.value().storage_id(), ids[i], "{name}: same tensor");
        assert!(p.value().version() > before[i], "{name}: version bumped");
    }

    // Another architecture with equal shapes (rope_theta): rejected, nothing copied.
    let mut theta = config();
    theta.rope_theta = 500000.0;
    let fresh = model(theta.clone());
    let snapshot: Vec<Vec<f32>> = fresh
        .named_parameters()
        .iter()
        .map(|(_, p)| p.value().to_vec())
        .collect();
    let reason = state_reason(load_weights_into(&fresh, &path));
    assert!(reason.contains("differs"), "{reason}");
    // A wrong shape in the middle of the file: nothing copied either.
    let mut entries = f32_entries(&source);
    entries.last_mut().unwrap().2 = vec![32, 64];
    let bad = dir.join("bad.safetensors");
    write_st(&bad, &entries, None);
    let reason = state_reason(load_weights_into(&fresh, &bad));
    assert!(reason.contains("lm_head.weight"), "{reason}");
    for ((name, p), old) in fresh.named_parameters().iter().zip(&snapshot) {
        assert_eq!(bits(&p.value().to_vec()), bits(old), "{name} unchanged");
    }
}

fn with_lora(rank: usize, alpha: f32, targets: LoraTargets) -> DecoderOnlyTransformer {
    let mut m = model(config());
    m.enable_lora(&LoraConfig {
        rank,
        alpha,
        targets,
        seed: 9,
        dropout: 0.0,
    })
    .unwrap();
    for (k, (_, p)) in m.weights().named_lora_parameters().iter().enumerate() {
        let n = p.value().numel();
        let v: Vec<f32> = (0..n)
            .map(|i| ((i * 31 + k * 7) % 23) as f32 * 0.01 - 0.11)
            .collect();
        p.value().copy_from_slice(&v).unwrap();
    }
    m
}

fn both() -> LoraTargets {
    LoraTargets {
        attention: true,
        mlp: true,
    }
}

fn assert_same_adapters(a: &DecoderOnlyTransformer, b: &DecoderOnlyTransformer) {
    let (pa, pb) = (
        a.weights().named_lora_parameters(),
        b.weights().named_lora_parameters(),
    );
    assert_eq!(pa.len(), pb.len());
    for ((na, va), (nb, vb)) in pa.iter().zip(&pb) {
        assert_eq!(na, nb);
        assert_eq!(va.dims(), vb.dims(), "{na}");
        assert_eq!(
            bits(&va.value().to_vec()),
            bits(&vb.value().to_vec()),
            "{na}"
        );
    }
}

#[test]
fn lora_adapter_round_trip() {
    for (rank, alpha, targets, modules) in
        [(4, 8.0, both(), 7), (3, 5.0, LoraTargets::default(), 4)]
    {
        let dir = tmp_dir(&format!("lora-{rank}"));
        let adapted = with_lora(rank, alpha, targets.clone());
        save_lora_adapter(&adapted, &dir.join("adapter")).unwrap();

        let cfg: serde_json::Value =
            serde_json::from_slice(&fs::read(dir.join("adapter/adapter_config.json")).unwrap())
                .unwrap();
        assert_eq!(cfg["peft_type"], "LORA");
        assert_eq!(cfg["task_type"], "CAUSAL_LM");
        assert_eq!(cfg["bias"], "none");
        assert_eq!(cfg["r"], rank);
        assert_eq!(cfg["lora_alpha"].as_f64().unwrap() as f32, alpha);
        assert_eq!(cfg["target_modules"].as_array().unwrap().len(), modules);
        assert_eq!(
            cfg["target_modules"][0],
            if targets.attention {
                "q_proj"
            } else {
                "gate_proj"
            }
        );
        let bytes = fs::read(dir.join("adapter/adapter_model.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let a = st
            .tensor("base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight")
            .unwrap();
        assert_eq!(a.shape(), [rank, 32]);
        let b = st
            .tensor("base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight")
            .unwrap();
        assert_eq!(b.shape(), [32, rank]);
        assert_eq!(st.len(), 2 * 2 * modules);

        let mut fresh = model(config());
        load_lora_adapter(&mut fresh, &dir.join("adapter")).unwrap();
        assert!(fresh.has_lora() && fresh.lora_active());
        assert_same_adapters(&adapted, &fresh);
        assert_eq!(fresh.trainable_parameters().len(), 2 * 2 * modules);
        assert_eq!(logits(&adapted), logits(&fresh));
    }
}

/// An adapter file re-serialized with only `{"format": "pt"}` metadata, as PEFT writes it.
fn peft_style(bytes: &[u8]) -> Vec<u8> {
    let st = SafeTensors::deserialize(bytes).unwrap();
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize(st.tensors(), Some(meta)).unwrap()
}

#[test]
fn lora_adapter_errors_leave_the_model_without_adapters() {
    let dir = tmp_dir("lora-errors");
    let adapter = dir.join("adapter");
    let plain = model(config());
    assert!(matches!(
        save_lora_adapter(&plain, &adapter),
        Err(TransformerError::Lora { .. })
    ));
    save_lora_adapter(&with_lora(4, 8.0, both()), &adapter).unwrap();
    let cfg_path = adapter.join("adapter_config.json");
    let good_cfg = fs::read(&cfg_path).unwrap();
    let model_path = adapter.join("adapter_model.safetensors");
    // As PEFT writes it (no riftco_adapter_config metadata): adapter_config.json is read.
    let good_model = peft_style(&fs::read(&model_path).unwrap());
    fs::write(&model_path, &good_model).unwrap();
    let check = |what: &str, reason: String, needle: &str| {
        assert!(reason.contains(needle), "{what}: {reason}");
    };

    // Rank 2 in the config, rank-4 tensors in the file.
    let mut cfg: serde_json::Value = serde_json::from_slice(&good_cfg).unwrap();
    cfg["r"] = 2.into();
    fs::write(&cfg_path, serde_json::to_vec(&cfg).unwrap()).unwrap();
    let mut m = model(config());
    check(
        "rank",
        state_reason(load_lora_adapter(&mut m, &adapter)),
        "[2, 32]",
    );
    assert!(!m.has_lora());

    // Unsupported target set.
    cfg["r"] = 4.into();
    cfg["target_modules"] = serde_json::json!(["q_proj", "v_proj"]);
    fs::write(&cfg_path, serde_json::to_vec(&cfg).unwrap()).unwrap();
    check(
        "targets",
        state_reason(load_lora_adapter(&mut m, &adapter)),
        "target_modules",
    );
    assert!(!m.has_lora());

    // PEFT options that change what the adapter computes or where it applies (they loaded as a
    // plain LoRA, silently), and a module named twice.
    for (key, value, needle) in [
        ("use_dora", serde_json::json!(true), "use_dora"),
        ("lora_bias", serde_json::json!(true), "lora_bias"),
        (
            "layers_to_transform",
            serde_json::json!([5]),
            "layers_to_transform",
        ),
        (
            "exclude_modules",
            serde_json::json!(["q_proj"]),
            "exclude_modules",
        ),
        (
            "modules_to_save",
            serde_json::json!(["lm_head"]),
            "modules_to_save",
        ),
        (
            "target_modules",
            serde_json::json!([
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
                "q_proj"
            ]),
            "twice",
        ),
    ] {
        let mut cfg: serde_json::Value = serde_json::from_slice(&good_cfg).unwrap();
        cfg[key] = value;
        fs::write(&cfg_path, serde_json::to_vec(&cfg).unwrap()).unwrap();
        check(
            key,
            state_reason(load_lora_adapter(&mut m, &adapter)),
            needle,
        );
        assert!(!m.has_lora());
    }
    // Unset forms of the same options are the plain LoRA PEFT writes.
    let mut cfg: serde_json::Value = serde_json::from_slice(&good_cfg).unwrap();
    for key in ["layers_to_transform", "exclude_modules", "modules_to_save"] {
        cfg[key] = serde_json::Value::Null;
    }
    cfg["use_dora"] = false.into();
    cfg["layers_pattern"] = serde_json::json!([]);
    fs::write(&cfg_path, serde_json::to_vec(&cfg).unwrap()).unwrap();
    load_lora_adapter(&mut m, &adapter).unwrap();
    m = model(config());
    fs::write(&cfg_path, &good_cfg).unwrap();

    // A missing tensor.
    let st = SafeTensors::deserialize(&good_model).unwrap();
    let dropped = "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight";
    let kept: Vec<(String, TensorView<'_>)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != dropped)
        .collect();
    fs::write(&model_path, safetensors::serialize(kept, None).unwrap()).unwrap();
    check(
        "missing",
        state_reason(load_lora_adapter(&mut m, &adapter)),
        dropped,
    );
    assert!(!m.has_lora());

    // Truncated adapter file.
    fs::write(&model_path, &good_model[..good_model.len() / 2]).unwrap();
    check(
        "truncated",
        state_reason(load_lora_adapter(&mut m, &adapter)),
        "truncated",
    );
    assert!(!m.has_lora());

    // The unchanged model still computes the plain logits, and a valid load still works.
    assert_eq!(logits(&m), logits(&plain));
    fs::write(&model_path, &good_model).unwrap();
    load_lora_adapter(&mut m, &adapter).unwrap();
    assert!(m.has_lora());
    assert!(matches!(
        load_lora_adapter(&mut m, &adapter),
        Err(TransformerError::Lora { .. })
    ));
}

#[cfg(unix)]
#[test]
fn saved_files_are_world_readable() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("riftco-state-mode-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let model = DecoderOnlyTransformer::new(
        TransformerConfig::new(64, 32, 4, 2, 48, 16),
        Attn::Flash,
        Ck::Disabled,
    )
    .unwrap();
    let path = dir.join("model.safetensors");
    save_model(&model, &path).unwrap();
    for f in [path, dir.join("config.json")] {
        let mode = fs::metadata(&f).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & 0o644, 0o644, "{} has mode {mode:o}", f.display());
    }
    let _ = fs::remove_dir_all(&dir);
}
