//! `rt_model_set_frozen_weights_dtype`: a LoRA model's frozen base stored quantized (NF4, Q8_0,
//! Q4_K) or in 16 bits and back, and bad input refused with the status and a message naming the
//! value and what is accepted (a model without frozen weights, an unknown name, NULL).

mod common;
use common::last_error;
use riftco::*;
use std::ffi::CString;
use std::ptr::null_mut;

fn lora_model() -> *mut rt_model {
    let mut c = std::mem::MaybeUninit::<rt_transformer_config>::uninit();
    assert_eq!(
        unsafe { rt_transformer_config_default(c.as_mut_ptr()) },
        rt_status::RT_OK
    );
    let mut c = unsafe { c.assume_init() };
    (
        c.vocab_size,
        c.d_model,
        c.n_heads,
        c.n_layers,
        c.d_ff,
        c.max_seq_len,
    ) = (64, 256, 2, 1, 512, 8);
    let mut model = null_mut();
    let s = unsafe {
        rt_model_create(
            &c,
            rt_attention_kind::RT_ATTENTION_FLASH as u32,
            rt_activation_checkpointing::RT_ACTIVATION_CHECKPOINTING_DISABLED as u32,
            &mut model,
        )
    };
    assert_eq!(s, rt_status::RT_OK, "{}", last_error());
    model
}

fn enable_lora(model: *mut rt_model) {
    let lora = rt_lora_config {
        rank: 4,
        alpha: 8.0,
        targets: rt_lora_target::RT_LORA_TARGET_ATTENTION as u32,
        seed: 1,
    };
    let s = unsafe { rt_model_enable_lora(model, &lora) };
    assert_eq!(s, rt_status::RT_OK, "{}", last_error());
}

fn set(model: *mut rt_model, dtype: &str) -> rt_status {
    let d = CString::new(dtype).unwrap();
    unsafe { rt_model_set_frozen_weights_dtype(model, d.as_ptr()) }
}

#[test]
fn a_lora_base_is_stored_quantized_and_bad_names_are_refused() {
    let model = lora_model();
    // Nothing is frozen before LoRA.
    assert_eq!(set(model, "nf4"), rt_status::RT_ERROR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("enable LoRA first"),
        "{}",
        last_error()
    );
    enable_lora(model);
    for dtype in ["nf4", "Q8_0", "q4_k", "bfloat16", "float32"] {
        assert_eq!(
            set(model, dtype),
            rt_status::RT_OK,
            "{dtype}: {}",
            last_error()
        );
    }
    assert_eq!(set(model, "int4"), rt_status::RT_ERROR_INVALID_ARGUMENT);
    let message = last_error();
    assert!(
        message.contains("int4") && message.contains("nf4") && message.contains("q4_k"),
        "{message}"
    );
    let null = unsafe { rt_model_set_frozen_weights_dtype(model, std::ptr::null()) };
    assert_eq!(null, rt_status::RT_ERROR_NULL_POINTER);
    unsafe { rt_model_free(model) };
}
