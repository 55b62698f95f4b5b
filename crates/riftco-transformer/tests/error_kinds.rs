//! Every variant of every core error enum has the kind the Python and C layers map: one row per
//! variant of `TensorError`, `CheckpointError`, `AutogradError` and `TransformerError`, nested
//! errors included (they take the kind of what they carry).

use riftco_autograd::{AutogradError, CheckpointError};
use riftco_tensor::{ClassifiedError, Device, ErrorKind, TensorError};
use riftco_transformer::TransformerError;

fn tensor_errors() -> Vec<(TensorError, ErrorKind)> {
    use ErrorKind as K;
    vec![
        (
            TensorError::ShapeMismatch {
                op: "add",
                expected: vec![2, 3],
                got: vec![3, 2],
            },
            K::Shape,
        ),
        (
            TensorError::BroadcastMismatch {
                op: "add",
                lhs: vec![2, 3],
                rhs: vec![4, 3],
            },
            K::Shape,
        ),
        (
            TensorError::BadAxis {
                op: "sum",
                axis: -3,
                rank: 2,
                problem: "is out of range",
            },
            K::Shape,
        ),
        (
            TensorError::LengthMismatch {
                op: "from_vec",
                shape: vec![2],
                expected: 2,
                got: 3,
            },
            K::Shape,
        ),
        (
            TensorError::ZeroSized {
                op: "linear",
                shape: vec![0, 2],
            },
            K::Shape,
        ),
        (
            TensorError::RankMismatch {
                op: "matmul",
                expected: 2,
                got: vec![2],
            },
            K::Shape,
        ),
        (
            TensorError::IndexOutOfRange {
                op: "rope",
                what: "position",
                index: 40,
                bound: 32,
            },
            K::IndexOutOfRange,
        ),
        (
            TensorError::TokenOutOfRange {
                op: "embedding",
                what: "token id",
                token: 300,
                vocab_size: 256,
            },
            K::Tokens,
        ),
        (
            TensorError::DeviceUnavailable {
                device: Device::Metal,
                reason: "not built".into(),
            },
            K::DeviceUnavailable,
        ),
        (
            TensorError::DeviceMismatch {
                op: "add",
                lhs: Device::Cpu,
                rhs: Device::Metal,
            },
            K::DeviceMismatch,
        ),
        (
            TensorError::NotOnHost {
                op: "Tensor::read",
                device: Device::PrivateUse1,
            },
            K::DeviceMismatch,
        ),
        (
            TensorError::ShapeOverflow {
                op: "reshape",
                shape: vec![1 << 62, 4],
            },
            K::Shape,
        ),
        (
            TensorError::OutOfMemory {
                op: "zeros",
                bytes: 1 << 40,
            },
            K::OutOfMemory,
        ),
        (
            TensorError::InvalidArgument {
                op: "rms_norm",
                message: "eps NaN must be positive and finite".into(),
            },
            K::InvalidArgument,
        ),
    ]
}

fn checkpoint_errors() -> Vec<CheckpointError> {
    let name = || "block 0".to_string();
    vec![
        CheckpointError::DuplicateDependency {
            name: name(),
            dependency: "w".into(),
        },
        CheckpointError::DependencyNotLeaf {
            name: name(),
            dependency: "h".into(),
            op: "add",
        },
        CheckpointError::MissingDependency {
            name: name(),
            leaf: "w2".into(),
        },
        CheckpointError::CapturedExternalNode {
            name: name(),
            node: "h".into(),
            op: "mul",
        },
        CheckpointError::UndeclaredLeaf {
            name: name(),
            leaf: "new".into(),
        },
        CheckpointError::InputUnused { name: name() },
        CheckpointError::DependencyUnused {
            name: name(),
            dependency: "w".into(),
        },
        CheckpointError::ReplayShapeChanged {
            name: name(),
            forward: vec![2],
            replay: vec![3],
        },
        CheckpointError::BackwardInsideReplay { name: name() },
        CheckpointError::ReentrantReplay { name: name() },
        CheckpointError::ReplayRunningElsewhere { name: name() },
        CheckpointError::ReplayDeviceChanged {
            name: name(),
            forward: Device::Cpu,
            replay: Device::Metal,
        },
    ]
}

/// A user error that is no riftco error (as a Python exception inside a checkpoint callable is).
#[derive(Debug)]
struct UserError;

impl std::fmt::Display for UserError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ValueError: from user code")
    }
}

impl std::error::Error for UserError {}

impl ClassifiedError for UserError {
    fn kind(&self) -> ErrorKind {
        ErrorKind::External
    }
}

fn autograd_errors() -> Vec<(AutogradError, ErrorKind)> {
    use ErrorKind as K;
    let mut rows: Vec<(AutogradError, ErrorKind)> = tensor_errors()
        .into_iter()
        .map(|(e, k)| (AutogradError::Tensor(e), k))
        .collect();
    rows.extend(
        checkpoint_errors()
            .into_iter()
            .map(|e| (AutogradError::Checkpoint(e), K::Checkpoint)),
    );
    rows.extend([
        (
            AutogradError::StaleGraph {
                tensor: "w".into(),
                op: "linear",
                recorded: 1,
                current: 2,
            },
            K::StaleGraph,
        ),
        (AutogradError::NotScalar { shape: vec![2, 3] }, K::Shape),
        (
            AutogradError::NoGradient {
                what: "the loss".into(),
            },
            K::Backward,
        ),
        (
            AutogradError::Panic {
                during: "backward",
                message: "boom".into(),
            },
            K::Panic,
        ),
        (AutogradError::external(UserError), K::External),
        // A transformer error raised inside a checkpointed block keeps its own kind.
        (
            AutogradError::external(TransformerError::TokenOutOfVocabulary {
                token: 300,
                index: Some(4),
                vocab_size: 256,
            }),
            K::Tokens,
        ),
        (
            AutogradError::external(TransformerError::Autograd(AutogradError::Checkpoint(
                CheckpointError::InputUnused { name: "b".into() },
            ))),
            K::Checkpoint,
        ),
    ]);
    rows
}

fn transformer_errors() -> Vec<(TransformerError, ErrorKind)> {
    use ErrorKind as K;
    let mut rows = vec![
        (
            TransformerError::Config {
                field: "d_model",
                value: "0".into(),
                reason: "must be positive".into(),
            },
            K::Config,
        ),
        (
            TransformerError::Tokens {
                message: "a token block needs seq + 1 >= 2 columns, got 1".into(),
            },
            K::Tokens,
        ),
        (
            TransformerError::TokenOutOfVocabulary {
                token: 64,
                index: Some(4),
                vocab_size: 64,
            },
            K::Tokens,
        ),
        (
            TransformerError::SequenceTooLong {
                seq: 25,
                max_seq_len: 24,
            },
            K::Tokens,
        ),
        (
            TransformerError::UnknownOption {
                what: "attention kind",
                got: "fast".into(),
                expected: "\"flash\", \"materialized\"",
            },
            K::UnknownOption,
        ),
        (
            TransformerError::Lora {
                message: "the model has no adapters".into(),
            },
            K::Lora,
        ),
        (
            TransformerError::Decode {
                message: "the model changed".into(),
            },
            K::Decode,
        ),
        (
            TransformerError::DecodeCacheFull { max_seq_len: 16 },
            K::Decode,
        ),
        (
            TransformerError::State {
                path: "m.safetensors".into(),
                reason: "truncated".into(),
            },
            K::State,
        ),
        (
            TransformerError::Io {
                path: "/nonexistent".into(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            },
            K::Io,
        ),
    ];
    rows.extend(
        autograd_errors()
            .into_iter()
            .map(|(e, k)| (TransformerError::Autograd(e), k)),
    );
    rows
}

#[test]
fn every_tensor_error_variant_has_its_kind() {
    for (e, kind) in tensor_errors() {
        assert_eq!(e.kind(), kind, "{e:?}");
        assert_eq!(ClassifiedError::kind(&e), kind, "{e:?} through the trait");
    }
}

#[test]
fn every_checkpoint_violation_is_a_checkpoint_error() {
    let all = checkpoint_errors();
    assert_eq!(all.len(), 12, "one row per CheckpointError variant");
    for e in all {
        assert_eq!(e.kind(), ErrorKind::Checkpoint, "{e:?}");
    }
}

#[test]
fn every_autograd_error_variant_has_its_kind_nested_ones_delegate() {
    for (e, kind) in autograd_errors() {
        assert_eq!(e.kind(), kind, "{e:?}");
    }
}

#[test]
fn every_transformer_error_variant_has_its_kind_nested_ones_delegate() {
    let rows = transformer_errors();
    for (e, kind) in &rows {
        assert_eq!(e.kind(), *kind, "{e:?}");
    }
    // Every kind but the binding-only ones is reached by some core error.
    for kind in ErrorKind::ALL {
        assert!(
            rows.iter().any(|(_, k)| *k == kind),
            "no core error has kind {kind}"
        );
    }
}

#[test]
fn restructured_variants_keep_their_messages() {
    let cases: [(TransformerError, &str); 6] = [
        (
            TransformerError::TokenOutOfVocabulary {
                token: 64,
                index: Some(4),
                vocab_size: 64,
            },
            "invalid tokens: token id 64 at index 4 is outside the vocabulary (vocab_size 64)",
        ),
        (
            TransformerError::TokenOutOfVocabulary {
                token: 99,
                index: None,
                vocab_size: 64,
            },
            "invalid tokens: token id 99 is outside the vocabulary (vocab_size 64)",
        ),
        (
            TransformerError::SequenceTooLong {
                seq: 25,
                max_seq_len: 24,
            },
            "invalid tokens: sequence length 25 exceeds max_seq_len 24",
        ),
        (
            TransformerError::DecodeCacheFull { max_seq_len: 16 },
            "decode: the K/V cache is full (16 positions = max_seq_len); reset the session",
        ),
        (
            TransformerError::Lora {
                message: "rank 0 must be in 1..=16 (d_model)".into(),
            },
            "LoRA: rank 0 must be in 1..=16 (d_model)",
        ),
        (
            TransformerError::from(TensorError::TokenOutOfRange {
                op: "cross_entropy",
                what: "target",
                token: 7,
                vocab_size: 4,
            }),
            "cross_entropy: target 7 is out of range (must be < 4)",
        ),
    ];
    for (e, want) in cases {
        assert_eq!(e.to_string(), want);
    }
}
