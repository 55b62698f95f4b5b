//! Files for the GGUF tests (`gguf_reader.rs`, `gguf_llama.rs`): a scratch folder per test, a
//! file written there, and the `State` error a load must give.
#![allow(dead_code)]

use riftco_transformer::TransformerError;
use std::fs;
use std::path::{Path, PathBuf};

pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("riftco-gguf-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

pub fn write(name: &str, bytes: &[u8]) -> PathBuf {
    let path = scratch(name).join("model.gguf");
    fs::write(&path, bytes).unwrap();
    path
}

/// The `State` error of `r`, as text, checked to name `path`.
pub fn state_error<T: std::fmt::Debug>(r: Result<T, TransformerError>, path: &Path) -> String {
    match r {
        Err(e @ TransformerError::State { .. }) => {
            let text = e.to_string();
            assert!(text.contains(&path.display().to_string()), "{text}");
            text
        }
        other => panic!("expected a State error, got {other:?}"),
    }
}
