//! The activation-checkpointing policies of ABI 2.2 through the exported functions: every
//! setter's error mapping (status, a message naming the bad value, the policy left unchanged),
//! the integer forms, the string getters' buffer convention, and training parity with
//! `disabled`.

use riftco::*;
use std::ffi::{c_char, CStr, CString};
use std::ptr::{null, null_mut};

const N_LAYERS: usize = 2;
const MAX_SEQ: usize = 16;

fn config() -> rt_transformer_config {
    let mut c = std::mem::MaybeUninit::<rt_transformer_config>::uninit();
    assert_eq!(
        unsafe { rt_transformer_config_default(c.as_mut_ptr()) },
        rt_status::RT_OK
    );
    let mut c = unsafe { c.assume_init() };
    c.d_model = 16;
    c.n_heads = 2;
    c.n_layers = N_LAYERS;
    c.d_ff = 32;
    c.max_seq_len = MAX_SEQ;
    c.seed = 11;
    c
}

/// A fresh model (flash attention, `disabled`); freed by the guard.
struct Model(*mut rt_model);

impl Model {
    fn new() -> Self {
        Self::with(rt_activation_checkpointing::RT_ACTIVATION_CHECKPOINTING_DISABLED as u32)
            .unwrap()
    }

    fn with(policy: u32) -> Result<Self, rt_status> {
        let mut m = null_mut();
        let s = unsafe {
            rt_model_create(
                &config(),
                rt_attention_kind::RT_ATTENTION_FLASH as u32,
                policy,
                &mut m,
            )
        };
        if s == rt_status::RT_OK {
            Ok(Self(m))
        } else {
            assert!(m.is_null());
            Err(s)
        }
    }

    fn form(&self) -> u32 {
        let mut out = 99;
        assert_eq!(
            unsafe { rt_model_activation_checkpointing(self.0, &mut out) },
            rt_status::RT_OK
        );
        out
    }

    fn policy(&self) -> String {
        let mut buf = [0 as c_char; 256];
        let mut needed = 0;
        let s = unsafe {
            rt_model_activation_checkpointing_policy(
                self.0,
                buf.as_mut_ptr(),
                buf.len(),
                &mut needed,
            )
        };
        assert_eq!(s, rt_status::RT_OK);
        let text = unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_str()
            .unwrap()
            .to_string();
        assert_eq!(needed, text.len() + 1);
        text
    }

    fn plan(&self, batch: usize, seq: usize) -> Result<String, rt_status> {
        let mut needed = 0;
        let s = unsafe {
            rt_model_activation_checkpointing_plan(self.0, batch, seq, null_mut(), 0, &mut needed)
        };
        if s != rt_status::RT_ERROR_BUFFER_TOO_SMALL {
            return Err(s);
        }
        let mut buf = vec![0 as c_char; needed];
        let s = unsafe {
            rt_model_activation_checkpointing_plan(
                self.0,
                batch,
                seq,
                buf.as_mut_ptr(),
                buf.len(),
                &mut needed,
            )
        };
        assert_eq!(s, rt_status::RT_OK, "{}", last_error());
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_str()
            .unwrap()
            .to_string())
    }

    fn set_policy(&self, spec: &str) -> rt_status {
        let spec = CString::new(spec).unwrap();
        unsafe { rt_model_set_activation_checkpointing_policy(self.0, spec.as_ptr()) }
    }

    /// The loss of one training step on a fixed block `[2, 9]`, then an Adam step.
    fn train_step(&self) -> Result<f32, rt_status> {
        let tokens: Vec<u32> = (0..18).map(|i| (i * 31 + 5) % 256).collect();
        let mut loss = 0.0;
        let s =
            unsafe { rt_model_train_step(self.0, tokens.as_ptr(), tokens.len(), 2, 9, &mut loss) };
        if s != rt_status::RT_OK {
            return Err(s);
        }
        let mut adam = null_mut();
        assert_eq!(
            unsafe { rt_adam_create(self.0, 1e-2, &mut adam) },
            rt_status::RT_OK
        );
        assert_eq!(unsafe { rt_adam_step(adam) }, rt_status::RT_OK);
        unsafe { rt_adam_free(adam) };
        Ok(loss)
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        unsafe { rt_model_free(self.0) };
    }
}

fn last_error() -> String {
    let mut buf = [0 as c_char; 2048];
    unsafe { rt_last_error_message(buf.as_mut_ptr(), buf.len(), null_mut()) };
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_str()
        .unwrap()
        .to_string()
}

/// `status` is `want` and the last error message contains every needle.
#[track_caller]
fn expect_error(status: rt_status, want: rt_status, needles: &[&str]) {
    let message = last_error();
    assert_eq!(status, want, "{message}");
    for n in needles {
        assert!(message.contains(n), "{n:?} not in {message:?}");
    }
}

#[test]
fn segments_setter_validates_k() {
    let m = Model::new();
    for (k, needle) in [(0, "\"segments:0\""), (3, "\"segments:3\"")] {
        let s = unsafe { rt_model_set_activation_checkpointing_segments(m.0, k) };
        expect_error(
            s,
            rt_status::RT_ERROR_INVALID_ARGUMENT,
            &[
                "rt_model_set_activation_checkpointing_segments: ",
                needle,
                "n_layers = 2",
            ],
        );
        assert_eq!(m.policy(), "disabled", "unchanged after segments {k}");
    }
    let s = unsafe { rt_model_set_activation_checkpointing_segments(m.0, 2) };
    assert_eq!(s, rt_status::RT_OK);
    assert_eq!(m.form(), 2);
    assert_eq!(m.policy(), "segments:2");
    assert_eq!(m.plan(2, 8).unwrap(), "segments:2 → block[0-1]");
    let s = unsafe { rt_model_set_activation_checkpointing_segments(null_mut(), 1) };
    expect_error(s, rt_status::RT_ERROR_NULL_POINTER, &["model is NULL"]);
}

#[test]
fn selective_setter_names_unknown_policies() {
    let m = Model::new();
    let s = unsafe { rt_model_set_activation_checkpointing_selective(m.0, null()) };
    assert_eq!(s, rt_status::RT_OK);
    assert_eq!(
        (m.form(), m.policy().as_str()),
        (4, "selective:attention_ffn")
    );
    let s = unsafe { rt_model_set_activation_checkpointing_selective(m.0, c"dots".as_ptr()) };
    assert_eq!(s, rt_status::RT_OK);
    assert_eq!(m.policy(), "selective:dots");
    let s = unsafe { rt_model_set_activation_checkpointing_selective(m.0, c"fast".as_ptr()) };
    expect_error(
        s,
        rt_status::RT_ERROR_INVALID_ARGUMENT,
        &[
            "\"fast\"",
            "\"attention_ffn\"",
            "\"dots\"",
            "\"attention\"",
            "\"swiglu\"",
        ],
    );
    assert_eq!(m.policy(), "selective:dots", "unchanged");
    let bad = [0xffu8, 0];
    let s = unsafe { rt_model_set_activation_checkpointing_selective(m.0, bad.as_ptr().cast()) };
    expect_error(s, rt_status::RT_ERROR_INVALID_STRING, &["name", "UTF-8"]);
    let s = unsafe { rt_model_set_activation_checkpointing_selective(null_mut(), null()) };
    expect_error(s, rt_status::RT_ERROR_NULL_POINTER, &["model is NULL"]);
}

#[test]
fn policy_setter_accepts_every_spelling_and_names_bad_ones() {
    let m = Model::new();
    for (spec, form, read_back) in [
        ("block", 1, "block"),
        ("segments:1", 2, "segments:1"),
        ("auto", 3, "auto"),
        ("selective", 4, "selective:attention_ffn"),
        ("selective:q+k+v", 4, "selective:q+k+v"),
        (
            "disabled,selective:attention",
            5,
            "disabled,selective:attention",
        ),
        ("budget:1KiB", 6, "budget:1024"),
        ("disabled", 0, "disabled"),
    ] {
        assert_eq!(
            m.set_policy(spec),
            rt_status::RT_OK,
            "{spec}: {}",
            last_error()
        );
        assert_eq!((m.form(), m.policy().as_str()), (form, read_back), "{spec}");
    }
    assert_eq!(m.set_policy("block"), rt_status::RT_OK);
    for (spec, needles) in [
        ("segments:0", &["\"segments:0\""][..]),
        ("segments:3", &["\"segments:3\"", "n_layers = 2"]),
        ("segments:-1", &["\"segments:-1\""]),
        ("block,disabled,block", &["3 given", "n_layers = 2"]),
        ("block,full", &["\"full\""]),
        ("selective:fast", &["\"fast\"", "\"dots\""]),
        ("budget:12XB", &["\"12XB\"", "unknown unit", "MiB"]),
        ("full", &["\"full\"", "\"segments:K\"", "\"budget:SIZE\""]),
    ] {
        let s = m.set_policy(spec);
        expect_error(s, rt_status::RT_ERROR_INVALID_ARGUMENT, needles);
        assert_eq!(m.policy(), "block", "unchanged after {spec:?}");
    }
    let s = unsafe { rt_model_set_activation_checkpointing_policy(m.0, null()) };
    expect_error(s, rt_status::RT_ERROR_NULL_POINTER, &["spec is NULL"]);
    let s = unsafe { rt_model_set_activation_checkpointing_policy(null_mut(), c"auto".as_ptr()) };
    expect_error(s, rt_status::RT_ERROR_NULL_POINTER, &["model is NULL"]);
}

#[test]
fn integer_forms_with_parameters_name_their_setter() {
    let m = Model::new();
    for (v, setter) in [
        (2, "rt_model_set_activation_checkpointing_segments"),
        (4, "rt_model_set_activation_checkpointing_selective"),
        (5, "rt_model_set_activation_checkpointing_policy"),
        (6, "rt_model_set_activation_memory_budget"),
    ] {
        let s = unsafe { rt_model_set_activation_checkpointing(m.0, v) };
        expect_error(
            s,
            rt_status::RT_ERROR_INVALID_ENUM,
            &[&format!("policy {v} ("), setter],
        );
        assert_eq!(m.form(), 0, "unchanged after {v}");
        expect_error(
            Model::with(v).err().unwrap(),
            rt_status::RT_ERROR_INVALID_ENUM,
            &["rt_model_create: ", setter],
        );
    }
    for v in [7, u32::MAX] {
        let s = unsafe { rt_model_set_activation_checkpointing(m.0, v) };
        expect_error(
            s,
            rt_status::RT_ERROR_INVALID_ENUM,
            &[
                &format!("policy {v} is unknown"),
                "RT_ACTIVATION_CHECKPOINTING_AUTO (3)",
            ],
        );
    }
    let auto = rt_activation_checkpointing::RT_ACTIVATION_CHECKPOINTING_AUTO as u32;
    assert_eq!(
        unsafe { rt_model_set_activation_checkpointing(m.0, auto) },
        rt_status::RT_OK
    );
    assert_eq!((m.form(), m.policy().as_str()), (3, "auto"));
    let created = Model::with(auto).unwrap();
    assert_eq!(created.policy(), "auto");
    let plan = created.plan(2, 8).unwrap();
    assert!(
        plan.starts_with("auto → block[") && plan.contains("predicted peak"),
        "{plan}"
    );
}

#[test]
fn budgets_fail_at_plan_time_naming_the_smallest_peak() {
    let m = Model::new();
    let s = unsafe { rt_model_set_activation_memory_budget(m.0, 1) };
    assert_eq!(s, rt_status::RT_OK);
    assert_eq!((m.form(), m.policy().as_str()), (6, "budget:1"));
    let s = unsafe { rt_model_activation_checkpointing_plan(m.0, 2, 8, null_mut(), 0, null_mut()) };
    expect_error(
        s,
        rt_status::RT_ERROR_INVALID_ARGUMENT,
        &[
            "rt_model_activation_checkpointing_plan: ",
            "activation_memory_budget = 1 bytes",
            "smallest achievable peak activation at batch 2, seq 8 is ",
        ],
    );
    // The same error from a training step.
    expect_error(
        m.train_step().unwrap_err(),
        rt_status::RT_ERROR_INVALID_ARGUMENT,
        &["rt_model_train_step: ", "smallest achievable peak"],
    );
    let s = unsafe { rt_model_set_activation_memory_budget(m.0, 1 << 40) };
    assert_eq!(s, rt_status::RT_OK);
    let plan = m.plan(2, 8).unwrap();
    assert!(
        plan.starts_with("budget:1099511627776 → ") && plan.contains("predicted peak"),
        "{plan}"
    );
    let s = unsafe { rt_model_set_activation_memory_budget(null_mut(), 1) };
    expect_error(s, rt_status::RT_ERROR_NULL_POINTER, &["model is NULL"]);
}

#[test]
fn plan_shapes_are_checked_before_planning() {
    let m = Model::new();
    assert_eq!(m.set_policy("auto"), rt_status::RT_OK);
    for (batch, seq, needle) in [
        (0, 8, "[batch 0, seq 8]"),
        (2, 0, "[batch 2, seq 0]"),
        (2, MAX_SEQ + 1, "max_seq_len 16"),
        (usize::MAX, MAX_SEQ, "above the bound"),
        (1 << 40, MAX_SEQ, "above the bound"),
    ] {
        let mut buf = [0 as c_char; 64];
        let s = unsafe {
            rt_model_activation_checkpointing_plan(
                m.0,
                batch,
                seq,
                buf.as_mut_ptr(),
                64,
                null_mut(),
            )
        };
        expect_error(s, rt_status::RT_ERROR_SHAPE, &[needle]);
    }
    let s =
        unsafe { rt_model_activation_checkpointing_plan(null(), 2, 8, null_mut(), 0, null_mut()) };
    expect_error(s, rt_status::RT_ERROR_NULL_POINTER, &["model is NULL"]);
}

#[test]
fn string_getters_follow_the_last_error_buffer_convention() {
    let m = Model::new();
    assert_eq!(m.set_policy("selective:dots"), rt_status::RT_OK);
    let want = "selective:dots";
    let mut needed = 0;
    let s = unsafe { rt_model_activation_checkpointing_policy(m.0, null_mut(), 0, &mut needed) };
    expect_error(
        s,
        rt_status::RT_ERROR_BUFFER_TOO_SMALL,
        &["cap 0 is too small: the policy needs 15 bytes"],
    );
    assert_eq!(needed, want.len() + 1);
    let mut small = [1 as c_char; 5];
    let s = unsafe {
        rt_model_activation_checkpointing_policy(m.0, small.as_mut_ptr(), 5, &mut needed)
    };
    expect_error(s, rt_status::RT_ERROR_BUFFER_TOO_SMALL, &["cap 5"]);
    assert_eq!(
        unsafe { CStr::from_ptr(small.as_ptr()) }.to_bytes(),
        b"sele"
    );
    let s = unsafe { rt_model_activation_checkpointing_policy(m.0, null_mut(), 5, null_mut()) };
    expect_error(
        s,
        rt_status::RT_ERROR_NULL_POINTER,
        &["buf is NULL but cap is 5"],
    );
    let mut exact = [1 as c_char; 15];
    let s = unsafe {
        rt_model_activation_checkpointing_policy(m.0, exact.as_mut_ptr(), 15, null_mut())
    };
    assert_eq!(s, rt_status::RT_OK);
    assert_eq!(
        unsafe { CStr::from_ptr(exact.as_ptr()) }.to_str().unwrap(),
        want
    );
    let s = unsafe { rt_model_activation_checkpointing_policy(null(), null_mut(), 0, null_mut()) };
    expect_error(s, rt_status::RT_ERROR_NULL_POINTER, &["model is NULL"]);

    let plan = m.plan(2, 8).unwrap();
    assert_eq!(plan, "selective:dots → selective:dots[0] selective:dots[1]");
    let mut small = [1 as c_char; 8];
    let s = unsafe {
        rt_model_activation_checkpointing_plan(m.0, 2, 8, small.as_mut_ptr(), 8, &mut needed)
    };
    expect_error(
        s,
        rt_status::RT_ERROR_BUFFER_TOO_SMALL,
        &["cap 8", "the plan needs"],
    );
    assert_eq!(needed, plan.len() + 1);
    assert_eq!(
        unsafe { CStr::from_ptr(small.as_ptr()) }.to_bytes(),
        b"selecti"
    );
    // A cut inside a multi-byte character ("→" is 3 bytes after "selective:dots ", 15 bytes)
    // ends before it: the prefix stays valid UTF-8.
    for cap in [16, 17, 18] {
        let mut buf = vec![1 as c_char; cap];
        let s = unsafe {
            rt_model_activation_checkpointing_plan(m.0, 2, 8, buf.as_mut_ptr(), cap, null_mut())
        };
        assert_eq!(s, rt_status::RT_ERROR_BUFFER_TOO_SMALL);
        let got = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
        assert_eq!(got, "selective:dots ", "cap {cap}");
    }
    let mut buf = vec![1 as c_char; 19];
    let s = unsafe {
        rt_model_activation_checkpointing_plan(m.0, 2, 8, buf.as_mut_ptr(), 19, null_mut())
    };
    assert_eq!(s, rt_status::RT_ERROR_BUFFER_TOO_SMALL);
    let got = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
    assert_eq!(got, "selective:dots →");
}

/// A training step's loss under every policy form is `disabled`'s, bit for bit: the forward
/// computes the same values whatever is retained (checkpoints change what is kept for
/// backward, not the forward's arithmetic).
#[test]
fn every_policy_trains_with_the_disabled_loss() {
    let reference = Model::new().train_step().unwrap();
    for spec in [
        "block",
        "segments:2",
        "auto",
        "selective",
        "selective:dots",
        "selective:attention",
        "block,selective:dots",
        "budget:1GiB",
    ] {
        let m = Model::new();
        assert_eq!(m.set_policy(spec), rt_status::RT_OK, "{spec}");
        let loss = m.train_step().unwrap();
        assert_eq!(
            loss.to_bits(),
            reference.to_bits(),
            "{spec}: {loss} vs {reference}"
        );
    }
}
