//! `rt_model_load` on a GGUF file: the `llama` GGUF file of the fuzz corpus
//! (`fuzz/corpus/load_model/gguf_llama_f32`, the fuzz harness's base model as llama.cpp's
//! converter writes it) loads with its config, and a truncated copy is RT_ERROR_FORMAT with a
//! message naming the file and what is wrong.

mod common;
use common::last_error;
use riftco::*;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::ptr::null_mut;

/// The GGUF file of the corpus entry (byte 0 the kind, bytes 1..5 the file's length).
fn corpus_file() -> Vec<u8> {
    let entry = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/load_model/gguf_llama_f32"),
    )
    .unwrap();
    let n = u32::from_le_bytes(entry[1..5].try_into().unwrap()) as usize;
    entry[5..5 + n].to_vec()
}

fn load(path: &Path) -> (rt_status, *mut rt_model) {
    let c = CString::new(path.to_str().unwrap()).unwrap();
    let mut out = null_mut();
    let s = unsafe {
        rt_model_load(
            c.as_ptr(),
            rt_attention_kind::RT_ATTENTION_FLASH as u32,
            rt_activation_checkpointing::RT_ACTIVATION_CHECKPOINTING_DISABLED as u32,
            &mut out,
        )
    };
    (s, out)
}

#[test]
fn a_gguf_file_loads_and_a_truncated_one_is_a_format_error() {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("riftco-capi-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bytes = corpus_file();
    let path = dir.join("model.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let (s, model) = load(&path);
    assert_eq!(s, rt_status::RT_OK, "{}", last_error());
    let mut c = std::mem::MaybeUninit::<rt_transformer_config>::uninit();
    assert_eq!(
        unsafe { rt_model_config(model, c.as_mut_ptr()) },
        rt_status::RT_OK
    );
    let c = unsafe { c.assume_init() };
    // The harness's base model: vocab 16, d_model 8, 2 heads, 1 block, d_ff 12, 8 positions.
    assert_eq!(
        (
            c.vocab_size,
            c.d_model,
            c.n_heads,
            c.n_layers,
            c.d_ff,
            c.max_seq_len
        ),
        (16, 8, 2, 1, 12, 8)
    );
    unsafe { rt_model_free(model) };
    let cut = dir.join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let (s, model) = load(&cut);
    assert_eq!(s, rt_status::RT_ERROR_FORMAT);
    assert!(model.is_null());
    let message = last_error();
    assert!(
        message.contains("cut.gguf") && message.contains("past the end of the file"),
        "{message}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
