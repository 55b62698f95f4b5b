//! The C layer's classification: every [`ErrorKind`] has its status, and core errors reach the
//! boundary with the status of their kind (nested errors included).

use super::*;
use riftco_autograd::CheckpointError;
use riftco_tensor::{Device, ErrorKind};

#[test]
fn every_error_kind_has_its_status() {
    use rt_status::*;
    let table = [
        (ErrorKind::Shape, RT_ERROR_SHAPE),
        (ErrorKind::IndexOutOfRange, RT_ERROR_INVALID_ARGUMENT),
        (ErrorKind::InvalidArgument, RT_ERROR_INVALID_ARGUMENT),
        (ErrorKind::Config, RT_ERROR_INVALID_ARGUMENT),
        (ErrorKind::UnknownOption, RT_ERROR_INVALID_ENUM),
        (ErrorKind::Tokens, RT_ERROR_INVALID_ARGUMENT),
        (ErrorKind::OutOfMemory, RT_ERROR_OUT_OF_MEMORY),
        (ErrorKind::DeviceUnavailable, RT_ERROR_DEVICE_UNAVAILABLE),
        (ErrorKind::DeviceMismatch, RT_ERROR_DEVICE_MISMATCH),
        (ErrorKind::StaleGraph, RT_ERROR_STALE_GRAPH),
        (ErrorKind::Checkpoint, RT_ERROR_CHECKPOINT),
        (ErrorKind::Backward, RT_ERROR_INVALID_STATE),
        (ErrorKind::Lora, RT_ERROR_INVALID_ARGUMENT),
        (ErrorKind::Decode, RT_ERROR_INVALID_STATE),
        (ErrorKind::State, RT_ERROR_FORMAT),
        (ErrorKind::Io, RT_ERROR_IO),
        (ErrorKind::Panic, RT_ERROR_PANIC),
        (ErrorKind::External, RT_ERROR_INTERNAL),
    ];
    assert_eq!(table.len(), ErrorKind::ALL.len(), "one row per kind");
    for (kind, want) in table {
        assert_eq!(rt_status::of_kind(kind), Some(want), "{kind}");
    }
    for kind in ErrorKind::ALL {
        assert!(
            rt_status::of_kind(kind).is_some(),
            "{kind} falls through to RT_ERROR_INTERNAL: map it"
        );
    }
}

fn status(e: impl Into<Error>) -> rt_status {
    e.into().status
}

#[test]
fn a_checkpoint_violation_is_rt_error_checkpoint() {
    let violation = || CheckpointError::MissingDependency {
        name: "block 0".into(),
        leaf: "w2".into(),
    };
    let wrapped = TransformerError::Autograd(AutogradError::Checkpoint(violation()));
    let e = Error::from(wrapped);
    assert_eq!(e.status, rt_status::RT_ERROR_CHECKPOINT);
    assert!(e.message.contains("w2"), "{}", e.message);
    assert_eq!(
        status(AutogradError::Checkpoint(violation())),
        rt_status::RT_ERROR_CHECKPOINT
    );
    assert_eq!(status(violation()), rt_status::RT_ERROR_CHECKPOINT);
    let name = unsafe { CStr::from_ptr(rt_status_name(15)) };
    assert_eq!(name.to_str().unwrap(), "RT_ERROR_CHECKPOINT");
}

#[test]
fn a_device_mismatch_is_rt_error_device_mismatch() {
    let e = TensorError::DeviceMismatch {
        op: "add",
        lhs: Device::Cpu,
        rhs: Device::Metal,
    };
    assert_eq!(
        status(TransformerError::from(e.clone())),
        rt_status::RT_ERROR_DEVICE_MISMATCH
    );
    assert_eq!(status(e), rt_status::RT_ERROR_DEVICE_MISMATCH);
    let name = unsafe { CStr::from_ptr(rt_status_name(16)) };
    assert_eq!(name.to_str().unwrap(), "RT_ERROR_DEVICE_MISMATCH");
}

#[test]
fn an_error_inside_a_checkpointed_block_keeps_its_status() {
    let inner = TransformerError::TokenOutOfVocabulary {
        token: 300,
        index: Some(2),
        vocab_size: 256,
    };
    let e = Error::from(TransformerError::Autograd(AutogradError::external(inner)));
    assert_eq!(e.status, rt_status::RT_ERROR_INVALID_ARGUMENT);
    assert!(
        e.message.contains("token id 300 at index 2"),
        "{}",
        e.message
    );
}

#[test]
fn the_statuses_callers_already_see_are_unchanged() {
    use rt_status::*;
    let rows: Vec<(TransformerError, rt_status)> = vec![
        (
            TransformerError::Config {
                field: "d_model",
                value: "0".into(),
                reason: "must be positive".into(),
            },
            RT_ERROR_INVALID_ARGUMENT,
        ),
        (
            TransformerError::Tokens {
                message: "2 tokens do not form a block".into(),
            },
            RT_ERROR_INVALID_ARGUMENT,
        ),
        (
            TransformerError::SequenceTooLong {
                seq: 17,
                max_seq_len: 16,
            },
            RT_ERROR_INVALID_ARGUMENT,
        ),
        (
            TransformerError::UnknownOption {
                what: "attention kind",
                got: "fast".into(),
                expected: "flash, materialized",
            },
            RT_ERROR_INVALID_ENUM,
        ),
        (
            TransformerError::Lora {
                message: "the model has no adapters".into(),
            },
            RT_ERROR_INVALID_ARGUMENT,
        ),
        (
            TransformerError::DecodeCacheFull { max_seq_len: 16 },
            RT_ERROR_INVALID_STATE,
        ),
        (
            TransformerError::Decode {
                message: "the model changed".into(),
            },
            RT_ERROR_INVALID_STATE,
        ),
        (
            TransformerError::State {
                path: "m.safetensors".into(),
                reason: "truncated".into(),
            },
            RT_ERROR_FORMAT,
        ),
        (
            TransformerError::Io {
                path: "/nonexistent".into(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            },
            RT_ERROR_IO,
        ),
        (
            AutogradError::StaleGraph {
                tensor: "w".into(),
                op: "linear",
                recorded: 1,
                current: 2,
            }
            .into(),
            RT_ERROR_STALE_GRAPH,
        ),
        (
            AutogradError::NoGradient {
                what: "the loss".into(),
            }
            .into(),
            RT_ERROR_INVALID_STATE,
        ),
        (
            AutogradError::NotScalar { shape: vec![2] }.into(),
            RT_ERROR_SHAPE,
        ),
        (
            AutogradError::Panic {
                during: "backward",
                message: "boom".into(),
            }
            .into(),
            RT_ERROR_PANIC,
        ),
        (
            TensorError::OutOfMemory {
                op: "zeros",
                bytes: 1 << 40,
            }
            .into(),
            RT_ERROR_OUT_OF_MEMORY,
        ),
        (
            TensorError::DeviceUnavailable {
                device: Device::Metal,
                reason: "not built".into(),
            }
            .into(),
            RT_ERROR_DEVICE_UNAVAILABLE,
        ),
        (
            TensorError::TokenOutOfRange {
                op: "embedding",
                what: "token id",
                token: 300,
                vocab_size: 256,
            }
            .into(),
            RT_ERROR_INVALID_ARGUMENT,
        ),
        (
            TensorError::ShapeMismatch {
                op: "add",
                expected: vec![2],
                got: vec![3],
            }
            .into(),
            RT_ERROR_SHAPE,
        ),
    ];
    for (e, want) in rows {
        let text = format!("{e:?}");
        assert_eq!(status(e), want, "{text}");
    }
}
