//! Whole-folder atomic saves through the public API: the other entries of the folder survive a
//! save (hard links, subfolders, symlinks), a new folder is created, and the temporary folders
//! left by killed saves are removed by the next save.
#![cfg(any(target_os = "linux", target_os = "macos"))]

use riftco_transformer::{
    load_lora_adapter, load_model, save_lora_adapter, save_model,
    ActivationCheckpointingKind as Ck, DecoderOnlyTransformer, FullSequenceAttentionKind as Attn,
    LoraConfig, LoraTargets, TransformerConfig,
};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

fn config(n_layers: usize) -> TransformerConfig {
    let mut c = TransformerConfig::new(64, 32, 4, n_layers, 48, 16);
    c.seed = 7 + n_layers as u64;
    c
}

fn model(n_layers: usize) -> DecoderOnlyTransformer {
    DecoderOnlyTransformer::new(config(n_layers), Attn::Flash, Ck::Disabled).unwrap()
}

fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("riftco-folder-it-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn a_save_keeps_the_other_entries_of_the_folder() {
    let root = tmp_dir("keep");
    let dir = root.join("model");
    fs::create_dir_all(dir.join("checkpoints/step-10")).unwrap();
    let path = dir.join("model.safetensors");
    save_model(&model(2), &path).unwrap();
    fs::write(dir.join("tokenizer.json"), "{\"tok\": 1}").unwrap();
    fs::write(dir.join("README.md"), "# mine\n").unwrap();
    fs::write(dir.join("checkpoints/step-10/model.safetensors"), "w").unwrap();
    std::os::unix::fs::symlink("README.md", dir.join("card.md")).unwrap();
    let before = fs::metadata(&path).unwrap().ino();
    let tokenizer_ino = fs::metadata(dir.join("tokenizer.json")).unwrap().ino();

    save_model(&model(3), &path).unwrap();

    assert_eq!(
        load_model(&path, Attn::Flash, Ck::Disabled)
            .unwrap()
            .config(),
        &config(3)
    );
    assert_ne!(
        fs::metadata(&path).unwrap().ino(),
        before,
        "a new state file"
    );
    assert_eq!(
        fs::metadata(dir.join("tokenizer.json")).unwrap().ino(),
        tokenizer_ino,
        "the same tokenizer.json (hard-linked, not copied)"
    );
    assert_eq!(
        fs::read_to_string(dir.join("README.md")).unwrap(),
        "# mine\n"
    );
    assert_eq!(
        fs::read_to_string(dir.join("checkpoints/step-10/model.safetensors")).unwrap(),
        "w"
    );
    assert_eq!(
        fs::read_link(dir.join("card.md")).unwrap(),
        Path::new("README.md")
    );
    assert_eq!(names_in(&root), ["model"], "no temporary beside the folder");
    assert_eq!(
        names_in(&dir),
        [
            "README.md",
            "card.md",
            "checkpoints",
            "config.json",
            "model.safetensors",
            "tokenizer.json"
        ]
    );
}

#[test]
fn a_lora_save_creates_the_folder_and_keeps_other_entries() {
    let root = tmp_dir("lora");
    let dir = root.join("nested/adapter");
    let with_rank = |rank| {
        let mut m = model(2);
        m.enable_lora(&LoraConfig {
            rank,
            alpha: 8.0,
            targets: LoraTargets::default(),
            seed: 9,
            dropout: 0.0,
        })
        .unwrap();
        m
    };
    save_lora_adapter(&with_rank(4), &dir).unwrap();
    fs::write(dir.join("README.md"), "card").unwrap();
    save_lora_adapter(&with_rank(8), &dir).unwrap();
    let mut back = model(2);
    load_lora_adapter(&mut back, &dir).unwrap();
    let a = back
        .weights()
        .named_lora_parameters()
        .into_iter()
        .find(|(n, _)| n.ends_with("lora_A.weight"))
        .unwrap();
    assert_eq!(a.1.value().dims()[0], 8);
    assert_eq!(fs::read_to_string(dir.join("README.md")).unwrap(), "card");
    assert_eq!(names_in(&root.join("nested")), ["adapter"]);
}

#[test]
fn the_next_save_removes_temporary_folders_of_killed_saves() {
    let root = tmp_dir("stale");
    let dir = root.join("model");
    fs::create_dir(&dir).unwrap();
    let dead = dead_pid();
    // What a save killed while building its new folder leaves beside the live one.
    let stale = root.join(format!(".model.tmp.{dead}.4"));
    fs::create_dir_all(stale.join("checkpoints")).unwrap();
    fs::write(stale.join("config.json"), "{}").unwrap();
    let live = root.join(format!(".model.tmp.{}.999", std::process::id()));
    fs::create_dir(&live).unwrap();
    let foreign = root.join(".model.tmp.mine");
    fs::create_dir(&foreign).unwrap();

    save_model(&model(2), &dir.join("model.safetensors")).unwrap();

    assert!(
        !stale.exists(),
        "a dead process's temporary folder is removed"
    );
    assert!(
        live.exists(),
        "this process's may be a save in progress: kept"
    );
    assert!(foreign.exists(), "another naming is never touched");
}

#[test]
fn a_folder_given_through_a_symlink_is_replaced_at_its_target() {
    let root = tmp_dir("link");
    let target = root.join("real");
    fs::create_dir(&target).unwrap();
    fs::write(target.join("tokenizer.json"), "t").unwrap();
    std::os::unix::fs::symlink(&target, root.join("via")).unwrap();
    save_model(&model(2), &root.join("via/model.safetensors")).unwrap();
    assert!(fs::symlink_metadata(root.join("via"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(target.join("model.safetensors").is_file());
    assert_eq!(
        fs::read_to_string(target.join("tokenizer.json")).unwrap(),
        "t"
    );
    assert_eq!(names_in(&root), ["real", "via"]);
}
