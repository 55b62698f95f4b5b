//! Devices through the C ABI (2.5): `rt_model_to_device` / `rt_model_device`, their errors,
//! and a GPU model that trains, steps Adam, decodes, saves and loads like the CPU one.
//!
//! The GPU test opens the device named by `RIFTCO_TEST_GPU` (default `gpu`), the variable of the
//! `riftco-gpu` tests: with no adapter it prints why and passes, except under `CI=true`, where
//! it fails (CI installs Mesa's software Vulkan).

mod common;
use common::last_error;
use riftco::*;
use std::ffi::{c_char, CStr, CString};
use std::ptr::{null, null_mut};

fn config() -> rt_transformer_config {
    let mut c = std::mem::MaybeUninit::<rt_transformer_config>::uninit();
    assert_eq!(
        unsafe { rt_transformer_config_default(c.as_mut_ptr()) },
        rt_status::RT_OK
    );
    let mut c = unsafe { c.assume_init() };
    c.vocab_size = 64;
    c.d_model = 16;
    c.n_heads = 2;
    c.n_layers = 2;
    c.d_ff = 32;
    c.max_seq_len = 16;
    c.seed = 3;
    c
}

/// A model handle, freed on drop.
struct Model(*mut rt_model);

impl Model {
    fn new(attention: rt_attention_kind) -> Self {
        let mut m = null_mut();
        let s = unsafe {
            rt_model_create(
                &config(),
                attention as u32,
                rt_activation_checkpointing::RT_ACTIVATION_CHECKPOINTING_DISABLED as u32,
                &mut m,
            )
        };
        assert_eq!(s, rt_status::RT_OK, "{}", last_error());
        Self(m)
    }

    fn device(&self) -> String {
        let mut buf = [0 as c_char; 32];
        let s = unsafe { rt_model_device(self.0, buf.as_mut_ptr(), buf.len(), null_mut()) };
        assert_eq!(s, rt_status::RT_OK, "{}", last_error());
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_str()
            .unwrap()
            .to_owned()
    }

    fn to(&self, name: &str) -> rt_status {
        let name = CString::new(name).unwrap();
        unsafe { rt_model_to_device(self.0, name.as_ptr()) }
    }

    fn train_step(&self, tokens: &[u32]) -> f32 {
        let mut loss = f32::NAN;
        let s =
            unsafe { rt_model_train_step(self.0, tokens.as_ptr(), tokens.len(), 2, 9, &mut loss) };
        assert_eq!(s, rt_status::RT_OK, "{}", last_error());
        loss
    }

    /// Greedy logits of `prompt` through a fresh decode session, position by position.
    fn decode(&self, prompt: &[u32]) -> Vec<Vec<f32>> {
        let mut session = null_mut();
        let s = unsafe { rt_decode_session_create(self.0, &mut session) };
        assert_eq!(s, rt_status::RT_OK, "{}", last_error());
        let rows = prompt
            .iter()
            .map(|&t| {
                let mut logits = vec![0f32; config().vocab_size];
                let s = unsafe {
                    rt_decode_session_decode_token(session, t, logits.as_mut_ptr(), logits.len())
                };
                assert_eq!(s, rt_status::RT_OK, "{}", last_error());
                logits
            })
            .collect();
        unsafe { rt_decode_session_free(session) };
        rows
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        unsafe { rt_model_free(self.0) };
    }
}

/// An Adam optimizer, freed on drop.
struct AdamHandle(*mut rt_adam);

impl AdamHandle {
    fn new(model: &Model) -> Self {
        let mut a = null_mut();
        let s = unsafe { rt_adam_create(model.0, 1e-2, &mut a) };
        assert_eq!(s, rt_status::RT_OK, "{}", last_error());
        Self(a)
    }

    fn step(&self) {
        let s = unsafe { rt_adam_step(self.0) };
        assert_eq!(s, rt_status::RT_OK, "{}", last_error());
    }
}

impl Drop for AdamHandle {
    fn drop(&mut self) {
        unsafe { rt_adam_free(self.0) };
    }
}

fn tokens() -> Vec<u32> {
    (0..18u32).map(|i| (i * 7 + 3) % 64).collect()
}

#[test]
fn a_new_model_is_on_the_cpu_and_the_name_follows_the_buffer_convention() {
    let m = Model::new(rt_attention_kind::RT_ATTENTION_FLASH);
    assert_eq!(m.device(), "cpu");
    let mut needed = 0;
    let s = unsafe { rt_model_device(m.0, null_mut(), 0, &mut needed) };
    assert_eq!(s, rt_status::RT_ERROR_BUFFER_TOO_SMALL);
    assert_eq!(needed, 4);
    let mut small = [1 as c_char; 3];
    let s = unsafe { rt_model_device(m.0, small.as_mut_ptr(), small.len(), &mut needed) };
    assert_eq!(s, rt_status::RT_ERROR_BUFFER_TOO_SMALL);
    assert_eq!(unsafe { CStr::from_ptr(small.as_ptr()) }.to_bytes(), b"cp");
    assert!(last_error().contains("needs 4 bytes"), "{}", last_error());
    let s = unsafe { rt_model_device(null(), small.as_mut_ptr(), 3, null_mut()) };
    assert_eq!(s, rt_status::RT_ERROR_NULL_POINTER);
    let s = unsafe { rt_model_device(m.0, null_mut(), 3, null_mut()) };
    assert_eq!(s, rt_status::RT_ERROR_NULL_POINTER);
    // "cpu" in any case is the CPU; a move there is a no-op.
    assert_eq!(m.to("CPU"), rt_status::RT_OK, "{}", last_error());
    assert_eq!(m.device(), "cpu");
}

#[test]
fn unknown_null_and_non_utf8_device_names_are_errors_naming_the_value() {
    let m = Model::new(rt_attention_kind::RT_ATTENTION_FLASH);
    assert_eq!(m.to("tpu"), rt_status::RT_ERROR_INVALID_ARGUMENT);
    let message = last_error();
    assert!(message.starts_with("rt_model_to_device: "), "{message}");
    assert!(message.contains("\"tpu\""), "{message}");
    for accepted in [
        "\"cpu\"",
        "\"vulkan\"",
        "\"metal\"",
        "\"gpu\"",
        "\"privateuseone\"",
    ] {
        assert!(message.contains(accepted), "{message} lacks {accepted}");
    }
    assert_eq!(m.to(""), rt_status::RT_ERROR_INVALID_ARGUMENT);
    let s = unsafe { rt_model_to_device(m.0, null()) };
    assert_eq!(s, rt_status::RT_ERROR_NULL_POINTER);
    assert_eq!(last_error(), "rt_model_to_device: device is NULL");
    let s = unsafe { rt_model_to_device(null_mut(), c"cpu".as_ptr()) };
    assert_eq!(s, rt_status::RT_ERROR_NULL_POINTER);
    assert_eq!(last_error(), "rt_model_to_device: model is NULL");
    let bad = [0x76u8, 0xff, 0x6b, 0]; // "v\xffk"
    let s = unsafe { rt_model_to_device(m.0, bad.as_ptr().cast()) };
    assert_eq!(s, rt_status::RT_ERROR_INVALID_STRING);
    assert!(last_error().contains("is not UTF-8"), "{}", last_error());
    assert_eq!(
        m.device(),
        "cpu",
        "a failed move leaves the model where it was"
    );
}

/// The GPU device name of this run, or `None` (the reason printed) when the test must skip.
fn gpu_or_skip(test: &str, m: &Model) -> Option<String> {
    let name = std::env::var("RIFTCO_TEST_GPU").unwrap_or_else(|_| "gpu".to_owned());
    match m.to(&name) {
        rt_status::RT_OK => Some(m.device()),
        rt_status::RT_ERROR_DEVICE_UNAVAILABLE
            if std::env::var("CI").is_ok_and(|v| v == "true") =>
        {
            panic!(
                "{test}: CI=true and no GPU could be opened (install mesa-vulkan-drivers: \
                 scripts/gpu_setup.sh): {}",
                last_error()
            )
        }
        rt_status::RT_ERROR_DEVICE_UNAVAILABLE => {
            eprintln!(
                "SKIPPED {test}: no GPU ({}); set CI=true to make this a failure",
                last_error()
            );
            None
        }
        s => panic!("{test}: RIFTCO_TEST_GPU={name:?}: {s:?}: {}", last_error()),
    }
}

fn assert_close(what: &str, gpu: &[f32], cpu: &[f32]) {
    let scale = cpu.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    for (i, (g, c)) in gpu.iter().zip(cpu).enumerate() {
        assert!(
            (g - c).abs() <= 1e-4 * scale,
            "{what}[{i}]: gpu {g} vs cpu {c} (tolerance 1e-4 of {scale})"
        );
    }
}

/// Two training steps with Adam between them, then decode, on the GPU and on the CPU from the
/// same seed (flash and materialized attention); the GPU model saved (read back to the host) and
/// loaded onto the CPU decodes like it once moved back to the GPU.
#[test]
fn a_gpu_model_trains_steps_adam_decodes_and_saves_like_the_cpu() {
    let dir = std::env::temp_dir().join(format!("riftco-capi-device-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for attention in [
        rt_attention_kind::RT_ATTENTION_FLASH,
        rt_attention_kind::RT_ATTENTION_MATERIALIZED,
    ] {
        let gpu = Model::new(attention);
        let Some(device) = gpu_or_skip("a_gpu_model_trains_steps_adam_decodes_...", &gpu) else {
            return;
        };
        assert!(device == "vulkan" || device == "metal", "{device}");
        let cpu = Model::new(attention);
        let (gpu_adam, cpu_adam) = (AdamHandle::new(&gpu), AdamHandle::new(&cpu));
        for step in 0..2 {
            let (g, c) = (gpu.train_step(&tokens()), cpu.train_step(&tokens()));
            assert!(
                (g - c).abs() <= 1e-4 * c.abs(),
                "{attention:?} step {step}: gpu loss {g} vs cpu {c}"
            );
            gpu_adam.step();
            cpu_adam.step();
        }
        let prompt = [1u32, 5, 9, 2];
        let (gpu_rows, cpu_rows) = (gpu.decode(&prompt), cpu.decode(&prompt));
        for (p, (g, c)) in gpu_rows.iter().zip(&cpu_rows).enumerate() {
            assert_close(&format!("{attention:?} logits at position {p}"), g, c);
        }

        let path = CString::new(dir.join("model.safetensors").to_str().unwrap()).unwrap();
        let s = unsafe { rt_model_save(gpu.0, path.as_ptr()) };
        assert_eq!(s, rt_status::RT_OK, "{}", last_error());
        assert_eq!(
            gpu.device(),
            device,
            "saving leaves the model on its device"
        );
        let mut loaded = null_mut();
        let s = unsafe {
            rt_model_load(
                path.as_ptr(),
                attention as u32,
                rt_activation_checkpointing::RT_ACTIVATION_CHECKPOINTING_DISABLED as u32,
                &mut loaded,
            )
        };
        assert_eq!(s, rt_status::RT_OK, "{}", last_error());
        let loaded = Model(loaded);
        assert_eq!(loaded.device(), "cpu");
        assert_eq!(loaded.to(&device), rt_status::RT_OK, "{}", last_error());
        assert_eq!(
            loaded.decode(&prompt),
            gpu_rows,
            "{attention:?}: the saved and reloaded weights decode bitwise like the GPU model"
        );
        // And back: the model moves to the CPU with its weights.
        assert_eq!(gpu.to("cpu"), rt_status::RT_OK, "{}", last_error());
        assert_eq!(gpu.device(), "cpu");
        let back = gpu.decode(&prompt);
        for (p, (b, g)) in back.iter().zip(&gpu_rows).enumerate() {
            assert_close(
                &format!("{attention:?} back on the cpu, position {p}"),
                b,
                g,
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// An optimizer built before the move keeps its moments on the CPU: its step is a device
/// mismatch (documented: build it after the move), not a crash.
#[test]
fn an_adam_built_before_the_move_reports_a_device_mismatch() {
    let m = Model::new(rt_attention_kind::RT_ATTENTION_FLASH);
    let adam = AdamHandle::new(&m);
    if gpu_or_skip("an_adam_built_before_the_move_...", &m).is_none() {
        return;
    }
    m.train_step(&tokens());
    let s = unsafe { rt_adam_step(adam.0) };
    assert_eq!(s, rt_status::RT_ERROR_DEVICE_MISMATCH, "{}", last_error());
    let message = last_error();
    assert!(message.starts_with("rt_adam_step: "), "{message}");
    assert!(message.contains("first moment is on cpu"), "{message}");
}

fn stats_for(device: &str) -> (rt_status, rt_memory_stats) {
    let name = CString::new(device).unwrap();
    let mut out = rt_memory_stats::default();
    let s = unsafe { rt_get_memory_stats_for_device(name.as_ptr(), &mut out) };
    (s, out)
}

#[test]
fn memory_stats_for_a_device_count_the_bytes_a_moved_model_holds_there() {
    let (s, _) = stats_for("tpu");
    assert_eq!(s, rt_status::RT_ERROR_INVALID_ARGUMENT);
    assert!(last_error().contains("\"tpu\""), "{}", last_error());
    let mut out = rt_memory_stats::default();
    let s = unsafe { rt_get_memory_stats_for_device(null(), &mut out) };
    assert_eq!(s, rt_status::RT_ERROR_NULL_POINTER);
    let s = unsafe { rt_get_memory_stats_for_device(c"cpu".as_ptr(), null_mut()) };
    assert_eq!(s, rt_status::RT_ERROR_NULL_POINTER);
    assert_eq!(stats_for("CPU").0, rt_status::RT_OK, "case-insensitive");

    let m = Model::new(rt_attention_kind::RT_ATTENTION_FLASH);
    let (_, before) = stats_for("cpu");
    let Some(device) = gpu_or_skip("memory_stats_for_a_device_count_...", &m) else {
        return;
    };
    let (_, after) = stats_for("cpu");
    let (s, gpu) = stats_for(&device);
    assert_eq!(s, rt_status::RT_OK, "{}", last_error());
    // Each test runs in its own process (nextest), so the GPU holds this model only: the bytes
    // that left the host's parameter counter are the GPU's.
    let moved = before.parameter.current_bytes - after.parameter.current_bytes;
    assert!(moved > 0, "{before:?} {after:?}");
    assert_eq!(gpu.parameter.current_bytes, moved, "{gpu:?}");
}
