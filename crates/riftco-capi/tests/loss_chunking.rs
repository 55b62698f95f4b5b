//! The chunked loss's setting through the C ABI (2.6): the default budget, setting and reading
//! it, `0` refused with the setting unchanged, the unfused form, and the same loss either way.

mod common;
use common::last_error;
use riftco::*;
use std::ptr::{null, null_mut};

fn model() -> *mut rt_model {
    let mut c = std::mem::MaybeUninit::<rt_transformer_config>::uninit();
    assert_eq!(
        unsafe { rt_transformer_config_default(c.as_mut_ptr()) },
        rt_status::RT_OK
    );
    let mut c = unsafe { c.assume_init() };
    (c.vocab_size, c.d_model, c.n_heads, c.n_layers, c.d_ff) = (200, 16, 2, 2, 32);
    (c.max_seq_len, c.seed) = (16, 3);
    let mut m = null_mut();
    let s = unsafe {
        rt_model_create(
            &c,
            rt_attention_kind::RT_ATTENTION_FLASH as u32,
            rt_activation_checkpointing::RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK as u32,
            &mut m,
        )
    };
    assert_eq!(s, rt_status::RT_OK, "{}", last_error());
    m
}

fn budget(m: *mut rt_model) -> u64 {
    let mut out = 7;
    assert_eq!(
        unsafe { rt_model_loss_chunk_bytes(m, &mut out) },
        rt_status::RT_OK
    );
    out
}

fn loss(m: *mut rt_model) -> f32 {
    let tokens: Vec<u32> = (0..30u32).map(|i| i * 37 % 200).collect();
    let mut g = null_mut();
    let s = unsafe { rt_model_loss(m, tokens.as_ptr(), tokens.len(), 3, 10, &mut g) };
    assert_eq!(s, rt_status::RT_OK, "{}", last_error());
    let mut value = f32::NAN;
    assert_eq!(unsafe { rt_graph_loss(g, &mut value) }, rt_status::RT_OK);
    unsafe { rt_graph_free(g) };
    value
}

#[test]
fn the_setting_reads_back_and_zero_is_refused() {
    let m = model();
    assert_eq!(budget(m), 64 << 20, "the default");
    let chunked = loss(m);
    assert_eq!(
        unsafe { rt_model_set_loss_chunk_bytes(m, 4 * 201 * 2) },
        rt_status::RT_OK
    );
    assert_eq!(budget(m), 4 * 201 * 2);
    assert_eq!(loss(m).to_bits(), chunked.to_bits(), "2 tokens a chunk");
    assert_eq!(
        unsafe { rt_model_set_loss_chunk_bytes(m, 0) },
        rt_status::RT_ERROR_INVALID_ARGUMENT
    );
    assert!(
        last_error().contains("loss_chunk_bytes"),
        "{}",
        last_error()
    );
    assert_eq!(budget(m), 4 * 201 * 2, "unchanged after the error");
    assert_eq!(unsafe { rt_model_set_loss_unfused(m) }, rt_status::RT_OK);
    assert_eq!(budget(m), 0);
    assert_eq!(loss(m).to_bits(), chunked.to_bits(), "unfused");
    unsafe { rt_model_free(m) };
}

#[test]
fn null_pointers_are_errors() {
    let mut out = 0;
    assert_eq!(
        unsafe { rt_model_set_loss_chunk_bytes(null_mut(), 1) },
        rt_status::RT_ERROR_NULL_POINTER
    );
    assert_eq!(
        unsafe { rt_model_set_loss_unfused(null_mut()) },
        rt_status::RT_ERROR_NULL_POINTER
    );
    assert_eq!(
        unsafe { rt_model_loss_chunk_bytes(null(), &mut out) },
        rt_status::RT_ERROR_NULL_POINTER
    );
    let m = model();
    assert_eq!(
        unsafe { rt_model_loss_chunk_bytes(m, null_mut()) },
        rt_status::RT_ERROR_NULL_POINTER
    );
    unsafe { rt_model_free(m) };
}
