//! Crafted and special files, bounded reads, atomic pair saves and the Hugging Face RoPE
//! config. Tests that could allocate without bound or block run in a child process under a
//! memory limit and a timeout (`limited`).

mod limited;

use serde_json::json;

use limited::limited;
use riftco_transformer::state::{
    config_json_pairing, fnv1a64_hex, ConfigJsonPairing, ADAPTER_CONFIG_METADATA_KEY,
    HF_CONFIG_HASH_KEY, MAX_HEADER_BYTES, MAX_JSON_BYTES,
};
use riftco_transformer::{
    load_lora_adapter, load_model, save_lora_adapter, save_model,
    ActivationCheckpointingKind as Ck, DecoderOnlyTransformer, FullSequenceAttentionKind as Attn,
    LoraConfig, LoraTargets, TransformerConfig, TransformerError,
};
use std::fs;
use std::path::{Path, PathBuf};

fn config(n_layers: usize) -> TransformerConfig {
    let mut c = TransformerConfig::new(64, 32, 4, n_layers, 48, 16);
    c.seed = 7 + n_layers as u64;
    c
}

fn model(c: TransformerConfig) -> DecoderOnlyTransformer {
    DecoderOnlyTransformer::new(c, Attn::Flash, Ck::Disabled).unwrap()
}

fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("riftco-files-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

fn load(path: &Path) -> Result<DecoderOnlyTransformer, TransformerError> {
    load_model(path, Attn::Flash, Ck::Disabled)
}

fn error_text<T>(r: Result<T, TransformerError>) -> String {
    match r {
        Err(e) => e.to_string(),
        Ok(_) => panic!("expected an error, got Ok"),
    }
}

fn state_reason<T>(r: Result<T, TransformerError>) -> String {
    match r {
        Err(TransformerError::State { reason, .. }) => reason,
        Err(e) => panic!("expected a State error, got {e:?}"),
        Ok(_) => panic!("expected a State error, got Ok"),
    }
}

fn values(m: &DecoderOnlyTransformer) -> Vec<Vec<u32>> {
    m.named_parameters()
        .iter()
        .map(|(_, p)| p.value().to_vec().iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// The header JSON and data section of a safetensors file.
fn split(bytes: &[u8]) -> (serde_json::Value, Vec<u8>) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (header, bytes[8 + n..].to_vec())
}

fn join(header: &serde_json::Value, data: &[u8]) -> Vec<u8> {
    let mut h = serde_json::to_vec(header).unwrap();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    out
}

/// `src` with one field of its `riftco_config` metadata replaced (or the metadata key removed
/// when `value` is `None`).
fn edit_riftco_config(src: &Path, dst: &Path, field: &str, value: Option<serde_json::Value>) {
    let (mut header, data) = split(&fs::read(src).unwrap());
    let meta = &mut header["__metadata__"];
    match value {
        Some(v) => {
            let mut c: serde_json::Value =
                serde_json::from_str(meta["riftco_config"].as_str().unwrap()).unwrap();
            c[field] = v;
            meta["riftco_config"] = serde_json::to_string(&c).unwrap().into();
        }
        None => {
            meta.as_object_mut().unwrap().remove("riftco_config");
        }
    }
    fs::write(dst, join(&header, &data)).unwrap();
}

#[cfg(unix)]
fn mkfifo(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
}

#[cfg(unix)]
#[test]
fn special_files_are_refused_without_reading_or_blocking() {
    limited(
        "special_files_are_refused_without_reading_or_blocking",
        || {
            use std::os::unix::fs::symlink;
            let dir = tmp_dir("special");
            for (name, target) in [("zero", "/dev/zero"), ("urandom", "/dev/urandom")] {
                let link = dir.join(format!("{name}.safetensors"));
                symlink(target, &link).unwrap();
                let reason = state_reason(load(&link));
                assert!(reason.contains("character device"), "{name}: {reason}");
                assert!(reason.contains("not a regular file"), "{name}: {reason}");
            }
            let fifo = dir.join("fifo.safetensors");
            mkfifo(&fifo);
            let reason = state_reason(load(&fifo));
            assert!(reason.contains("FIFO"), "{reason}");
            let sub = dir.join("dir.safetensors");
            fs::create_dir(&sub).unwrap();
            match load(&sub) {
                Err(TransformerError::Io { path, source }) => {
                    assert!(path.contains("dir.safetensors"), "{path}");
                    assert_eq!(source.raw_os_error(), Some(libc::EISDIR));
                }
                other => panic!("expected Io EISDIR, got {other:?}"),
            }

            // config.json beside a state without riftco_config: a FIFO and /dev/zero.
            let ok = dir.join("ok");
            fs::create_dir(&ok).unwrap();
            save_model(&model(config(1)), &ok.join("model.safetensors")).unwrap();
            let plain = ok.join("plain.safetensors");
            edit_riftco_config(&ok.join("model.safetensors"), &plain, "", None);
            fs::remove_file(ok.join("config.json")).unwrap();
            mkfifo(&ok.join("config.json"));
            let reason = state_reason(load(&plain));
            assert!(reason.contains("FIFO"), "{reason}");
            fs::remove_file(ok.join("config.json")).unwrap();
            symlink("/dev/zero", ok.join("config.json")).unwrap();
            let reason = state_reason(load(&plain));
            assert!(reason.contains("character device"), "{reason}");

            // Adapter folders: the weights a FIFO, then adapter_config.json /dev/zero.
            let adapter = dir.join("adapter");
            fs::create_dir(&adapter).unwrap();
            mkfifo(&adapter.join("adapter_model.safetensors"));
            let mut m = model(config(1));
            let reason = state_reason(load_lora_adapter(&mut m, &adapter));
            assert!(reason.contains("FIFO"), "{reason}");
            assert!(!m.has_lora());
        },
    );
}

#[test]
fn crafted_max_seq_len_is_a_clear_error_with_bounded_memory() {
    limited(
        "crafted_max_seq_len_is_a_clear_error_with_bounded_memory",
        || {
            let dir = tmp_dir("crafted");
            let good = dir.join("model.safetensors");
            save_model(&model(config(2)), &good).unwrap();
            for exp in [40u32, 62] {
                let v = serde_json::Value::from(1u64 << exp);
                let bad = dir.join(format!("seq{exp}.safetensors"));
                edit_riftco_config(&good, &bad, "max_seq_len", Some(v.clone()));
                let text = error_text(load(&bad));
                assert!(text.contains("max_seq_len"), "2**{exp}: {text}");

                // The same through max_position_embeddings of a plain Hugging Face config.json.
                let sub = dir.join(format!("hf{exp}"));
                fs::create_dir(&sub).unwrap();
                let plain = sub.join("model.safetensors");
                edit_riftco_config(&good, &plain, "", None);
                let mut hf: serde_json::Value =
                    serde_json::from_slice(&fs::read(dir.join("config.json")).unwrap()).unwrap();
                hf.as_object_mut().unwrap().remove("riftco");
                hf["max_position_embeddings"] = v;
                fs::write(sub.join("config.json"), hf.to_string()).unwrap();
                let text = error_text(load(&plain));
                assert!(text.contains("max_seq_len"), "hf 2**{exp}: {text}");
                assert!(
                    text.contains("max_position_embeddings"),
                    "hf 2**{exp}: {text}"
                );
            }
        },
    );
}

#[test]
fn oversized_headers_and_json_configs_are_refused_before_reading() {
    limited(
        "oversized_headers_and_json_configs_are_refused_before_reading",
        || {
            let dir = tmp_dir("oversized");
            // A sparse file larger than the header limit, declaring a header beyond it.
            let big = dir.join("big.safetensors");
            let f = fs::File::create(&big).unwrap();
            f.set_len(MAX_HEADER_BYTES + 1024).unwrap();
            drop(f);
            let mut bytes = (MAX_HEADER_BYTES + 8).to_le_bytes().to_vec();
            bytes.extend([b' '; 8]);
            {
                use std::io::{Seek, Write};
                let mut f = fs::OpenOptions::new().write(true).open(&big).unwrap();
                f.seek(std::io::SeekFrom::Start(0)).unwrap();
                f.write_all(&bytes).unwrap();
            }
            let reason = state_reason(load(&big));
            assert!(reason.contains("exceeds the limit"), "{reason}");

            // A config.json beyond the JSON bound.
            let sub = dir.join("json");
            fs::create_dir(&sub).unwrap();
            save_model(&model(config(1)), &sub.join("model.safetensors")).unwrap();
            let plain = sub.join("plain.safetensors");
            edit_riftco_config(&sub.join("model.safetensors"), &plain, "", None);
            let f = fs::File::create(sub.join("config.json")).unwrap();
            f.set_len(MAX_JSON_BYTES + 1).unwrap();
            let reason = state_reason(load(&plain));
            assert!(reason.contains(&MAX_JSON_BYTES.to_string()), "{reason}");
        },
    );
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The pid of a process that has exited.
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

#[test]
fn save_names_its_config_json_and_removes_stale_temporaries() {
    let dir = tmp_dir("pair");
    let path = dir.join("model.safetensors");
    let dead = dead_pid();
    let me = std::process::id();
    let stale = [
        format!(".model.safetensors.tmp.{dead}.0"),
        format!(".config.json.tmp.{dead}.3"),
    ];
    let kept = [
        format!(".model.safetensors.tmp.{me}.999"), // this process: maybe a save in progress
        ".tmpAbC123".to_string(),                   // not our naming
        format!(".other.safetensors.tmp.{dead}.0"), // another file's
        format!(".config.json.tmp.{dead}.x"),       // not our shape
    ];
    for n in stale.iter().chain(&kept) {
        fs::write(dir.join(n), b"left by a killed save").unwrap();
    }
    save_model(&model(config(2)), &path).unwrap();
    let mut want: Vec<String> = kept.to_vec();
    want.extend(["config.json".into(), "model.safetensors".into()]);
    want.sort();
    assert_eq!(names_in(&dir), want);

    let (header, _) = split(&fs::read(&path).unwrap());
    let named = header["__metadata__"][HF_CONFIG_HASH_KEY].as_str().unwrap();
    assert_eq!(
        named,
        fnv1a64_hex(&fs::read(dir.join("config.json")).unwrap())
    );

    // Saving the same config again leaves config.json alone (the state's rename alone commits
    // the pair); another config replaces it.
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let ino = || fs::metadata(dir.join("config.json")).unwrap().ino();
        let before = ino();
        save_model(&model(config(2)), &path).unwrap();
        assert_eq!(ino(), before, "an identical config.json is not rewritten");
        save_model(&model(config(1)), &path).unwrap();
        assert_ne!(ino(), before, "a different config.json is replaced");
    }
}

#[test]
fn a_newer_config_json_beside_an_older_state_loads_the_state() {
    // What a kill between the two renames of a save leaves: config.json of the new save (2
    // layers) beside the state of the old one (1 layer). The state is authoritative.
    let dir = tmp_dir("window");
    let old = model(config(1));
    save_model(&old, &dir.join("model.safetensors")).unwrap();
    let other = tmp_dir("window-new");
    save_model(&model(config(2)), &other.join("model.safetensors")).unwrap();
    fs::copy(other.join("config.json"), dir.join("config.json")).unwrap();
    let back = load(&dir.join("model.safetensors")).unwrap();
    assert_eq!(back.config(), old.config());
    assert_eq!(values(&back), values(&old));
    let (header, _) = split(&fs::read(dir.join("model.safetensors")).unwrap());
    let named = header["__metadata__"][HF_CONFIG_HASH_KEY].as_str().unwrap();
    assert_ne!(
        named,
        fnv1a64_hex(&fs::read(dir.join("config.json")).unwrap()),
        "the stale config.json is told apart by the state's hash"
    );
    let state = dir.join("model.safetensors");
    assert_eq!(
        config_json_pairing(&state).unwrap(),
        ConfigJsonPairing::Mismatched
    );
    save_model(&old, &state).unwrap();
    assert_eq!(
        config_json_pairing(&state).unwrap(),
        ConfigJsonPairing::Paired,
        "the next save rewrites config.json"
    );
    fs::remove_file(dir.join("config.json")).unwrap();
    assert_eq!(
        config_json_pairing(&state).unwrap(),
        ConfigJsonPairing::Missing
    );
}

fn with_lora(rank: usize) -> DecoderOnlyTransformer {
    let mut m = model(config(1));
    m.enable_lora(&LoraConfig {
        rank,
        alpha: 2.0 * rank as f32,
        targets: LoraTargets {
            attention: true,
            mlp: true,
        },
        seed: rank as u64,
        dropout: 0.0,
    })
    .unwrap();
    for (_, p) in m.weights().named_lora_parameters() {
        let n = p.value().numel();
        let v: Vec<f32> = (0..n)
            .map(|i| (i % 7) as f32 * 0.01 + rank as f32)
            .collect();
        p.value().copy_from_slice(&v).unwrap();
    }
    m
}

#[test]
fn adapter_weights_carry_their_config_and_win_over_a_stale_adapter_config() {
    let dir = tmp_dir("adapter-pair");
    let new_dir = tmp_dir("adapter-pair-new");
    let rank2 = with_lora(2);
    save_lora_adapter(&rank2, &dir).unwrap();
    save_lora_adapter(&with_lora(4), &new_dir).unwrap();
    let (header, _) = split(&fs::read(dir.join("adapter_model.safetensors")).unwrap());
    let embedded = header["__metadata__"][ADAPTER_CONFIG_METADATA_KEY]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        embedded.as_bytes(),
        fs::read(dir.join("adapter_config.json")).unwrap()
    );
    // A kill between the renames: rank-4 adapter_config.json beside rank-2 weights.
    fs::copy(
        new_dir.join("adapter_config.json"),
        dir.join("adapter_config.json"),
    )
    .unwrap();
    let mut back = model(config(1));
    load_lora_adapter(&mut back, &dir).unwrap();
    let got: Vec<_> = back.weights().named_lora_parameters();
    let want: Vec<_> = rank2.weights().named_lora_parameters();
    assert_eq!(got.len(), want.len());
    for ((n, a), (_, b)) in got.iter().zip(&want) {
        assert_eq!(a.dims(), b.dims(), "{n}");
        assert_eq!(a.value().to_vec(), b.value().to_vec(), "{n}");
    }

    // Stale adapter temporaries of a dead process are removed by the next save.
    let dead = dead_pid();
    let stale = format!(".adapter_model.safetensors.tmp.{dead}.1");
    fs::write(dir.join(&stale), b"x").unwrap();
    save_lora_adapter(&rank2, &dir).unwrap();
    assert_eq!(
        names_in(&dir),
        ["adapter_config.json", "adapter_model.safetensors"]
    );
}

/// A state without `riftco_config` beside a plain Hugging Face config.json edited by `edit`.
fn hf_folder(name: &str, theta: f64, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let dir = tmp_dir(name);
    let mut c = config(1);
    c.rope_theta = theta;
    let path = dir.join("model.safetensors");
    save_model(&model(c), &path).unwrap();
    let plain = dir.join("plain.safetensors");
    edit_riftco_config(&path, &plain, "", None);
    let mut hf: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.join("config.json")).unwrap()).unwrap();
    let obj = hf.as_object_mut().unwrap();
    for key in ["riftco", "rope_theta", "rope_scaling", "rope_parameters"] {
        obj.remove(key);
    }
    edit(&mut hf);
    fs::write(dir.join("config.json"), hf.to_string()).unwrap();
    plain
}

fn logits(m: &DecoderOnlyTransformer) -> Vec<f32> {
    let tokens: Vec<u32> = (0..12).map(|i| (i * 5 % 64) as u32).collect();
    m.logits(&tokens, 1, 12).unwrap().value().to_vec()
}

#[test]
fn hugging_face_rope_parameters_give_theta_and_unsupported_rope_types_are_refused() {
    // transformers 5: rope_parameters, no top-level rope_theta.
    let path = hf_folder("rope5", 50000.0, |hf| {
        hf["rope_parameters"] = json!({"rope_theta": 50000.0, "rope_type": "default"});
    });
    let back = load(&path).unwrap();
    assert_eq!(back.config().rope_theta, 50000.0);
    let reference = load(&path.with_file_name("model.safetensors")).unwrap();
    assert_eq!(reference.config().rope_theta, 50000.0);
    assert_eq!(logits(&back), logits(&reference));

    // Older files: top-level rope_theta, rope_scaling null or {"rope_type": "default"}.
    let path = hf_folder("rope4", 50000.0, |hf| {
        hf["rope_theta"] = json!(50000.0);
        hf["rope_scaling"] = json!({"rope_type": "default"});
    });
    assert_eq!(load(&path).unwrap().config().rope_theta, 50000.0);
    let path = hf_folder("rope-none", 10000.0, |_| {});
    assert_eq!(load(&path).unwrap().config().rope_theta, 10000.0);

    for (key, params, needle) in [
        (
            "rope_parameters",
            json!({"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0}),
            "\"llama3\"",
        ),
        (
            "rope_scaling",
            json!({"type": "dynamic", "factor": 2.0}),
            "\"dynamic\"",
        ),
        (
            "rope_scaling",
            json!({"rope_type": "yarn", "factor": 4.0}),
            "\"yarn\"",
        ),
        ("rope_scaling", json!({"factor": 2.0}), "no rope_type"),
        (
            "rope_parameters",
            json!({"rope_type": "default", "rope_theta": 50000.0, "partial_rotary_factor": 0.5}),
            "partial_rotary_factor",
        ),
        (
            "rope_parameters",
            json!({"full_attention": {"rope_type": "default", "rope_theta": 1.0e4}}),
            "per layer type",
        ),
    ] {
        let path = hf_folder("rope-bad", 50000.0, |hf| hf[key] = params.clone());
        let reason = state_reason(load(&path));
        assert!(reason.contains(needle), "{params}: {reason}");
        assert!(reason.contains(key), "{params}: {reason}");
    }

    // Two sources disagreeing on theta.
    let path = hf_folder("rope-conflict", 50000.0, |hf| {
        hf["rope_theta"] = json!(10000.0);
        hf["rope_parameters"] = json!({"rope_theta": 50000.0, "rope_type": "default"});
    });
    let reason = state_reason(load(&path));
    assert!(reason.contains("disagrees"), "{reason}");
    let path = hf_folder("rope-type", 50000.0, |hf| hf["rope_theta"] = json!("50000"));
    let reason = state_reason(load(&path));
    assert!(reason.contains("rope_theta"), "{reason}");
}

#[test]
fn other_architectures_in_config_json_are_refused_by_name() {
    // A Mistral config (sliding-window attention) or another model_type loaded silently as
    // Llama with full attention; a head_dim given as a string was ignored.
    for (edit, needle) in [
        (json!({"model_type": "mistral"}), "model_type \"mistral\""),
        (json!({"model_type": "gpt2"}), "model_type \"gpt2\""),
        (json!({"sliding_window": 4}), "sliding_window = 4"),
        (json!({"head_dim": "4"}), "head_dim \"4\" is not an integer"),
    ] {
        let path = hf_folder("arch", 10000.0, |hf| {
            for (k, v) in edit.as_object().unwrap() {
                hf[k] = v.clone();
            }
        });
        let reason = state_reason(load(&path));
        assert!(reason.contains(needle), "{edit}: {reason}");
    }
    let path = hf_folder("arch-ok", 10000.0, |hf| {
        hf["model_type"] = json!("llama");
        hf["sliding_window"] = serde_json::Value::Null;
    });
    assert!(load(&path).is_ok());
}

#[test]
fn written_config_json_states_rope_parameters_for_transformers_5() {
    let dir = tmp_dir("rope-written");
    let mut c = config(1);
    c.rope_theta = 25000.0;
    save_model(&model(c), &dir.join("model.safetensors")).unwrap();
    let hf: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(hf["rope_theta"], 25000.0);
    assert_eq!(
        hf["rope_parameters"],
        json!({"rope_type": "default", "rope_theta": 25000.0})
    );
}

/// Saving to a folder (or a path ending in a separator) used to rename the new `config.json`
/// over the one in the folder's parent before the state's own rename failed on the folder,
/// destroying a file outside the destination. Now the save is refused before any rename.
#[test]
fn a_save_to_a_folder_is_refused_before_anything_is_replaced() {
    let d = tmp_dir("save-to-folder");
    let mine = b"{\"mine\": true}";
    fs::write(d.join("config.json"), mine).unwrap();
    fs::create_dir(d.join("out")).unwrap();
    let m = model(config(1));
    for target in [
        d.join("out"),
        PathBuf::from(format!("{}/out/", d.display())),
    ] {
        let msg = error_text(save_model(&m, &target));
        assert!(msg.contains("is a folder, not a file"), "{msg}");
        assert_eq!(
            fs::read(d.join("config.json")).unwrap(),
            mine,
            "{}",
            target.display()
        );
        assert!(
            fs::read_dir(d.join("out")).unwrap().next().is_none(),
            "nothing written inside"
        );
        let leftovers: Vec<_> = fs::read_dir(&d)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp."))
            .collect();
        assert!(leftovers.is_empty(), "temporaries left: {leftovers:?}");
    }
    // A missing folder named with a trailing separator is refused the same way.
    let msg = error_text(save_model(&m, &d.join("new/")));
    assert!(msg.contains("is a folder, not a file"), "{msg}");
    assert_eq!(fs::read(d.join("config.json")).unwrap(), mine);
}
