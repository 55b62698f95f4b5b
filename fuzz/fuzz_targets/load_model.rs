//! `cargo +nightly fuzz run load_model`: every loader (load_model, load_weights_into,
//! load_lora_adapter) on a model or adapter folder built from the input (layout in
//! `fuzz/harness.rs`). A panic, an abort or an out-of-memory is a crash.
#![no_main]

#[path = "../harness.rs"]
mod harness;

use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use std::sync::OnceLock;

fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = std::env::var_os("RIFTCO_FUZZ_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        base.join(format!("riftco-fuzz-{}", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    harness::run_case(scratch(), data);
});
