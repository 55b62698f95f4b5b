//! The exception hierarchy of `riftco` and the mapping of every Rust error onto it.
//!
//! `RiftcoError(Exception)` is the root. Input problems also subclass `ValueError`
//! (`ShapeError`, `ConfigError`, `TokenError`, `ModelStateError`, `LoraError`), state and device
//! problems `RuntimeError` (`DeviceUnavailableError`, `StaleGraphError`, `CheckpointError`,
//! `DecodeError`), and an allocation the allocator refused `MemoryError` (`OutOfMemoryError`). The classes are created at module import with two bases each (PyO3's
//! `create_exception!` takes one), and live in `riftco._native`.
//!
//! Every compute entry point runs through [`compute`], which releases the GIL and turns a Rust
//! panic into `RiftcoError` instead of letting it cross into Python.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::{PyException, PyMemoryError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use riftco_autograd::{AutogradError, CheckpointError};
use riftco_tensor::TensorError;
use riftco_transformer::TransformerError;

/// The exception classes, in registration order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Riftco,
    Shape,
    Config,
    Token,
    DeviceUnavailable,
    StaleGraph,
    Checkpoint,
    ModelState,
    Lora,
    Decode,
    OutOfMemory,
}

const KINDS: [Kind; 11] = [
    Kind::Riftco,
    Kind::Shape,
    Kind::Config,
    Kind::Token,
    Kind::DeviceUnavailable,
    Kind::StaleGraph,
    Kind::Checkpoint,
    Kind::ModelState,
    Kind::Lora,
    Kind::Decode,
    Kind::OutOfMemory,
];

static TYPES: [PyOnceLock<Py<PyType>>; 11] = [const { PyOnceLock::new() }; 11];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Riftco => "RiftcoError",
            Kind::Shape => "ShapeError",
            Kind::Config => "ConfigError",
            Kind::Token => "TokenError",
            Kind::DeviceUnavailable => "DeviceUnavailableError",
            Kind::StaleGraph => "StaleGraphError",
            Kind::Checkpoint => "CheckpointError",
            Kind::ModelState => "ModelStateError",
            Kind::Lora => "LoraError",
            Kind::Decode => "DecodeError",
            Kind::OutOfMemory => "OutOfMemoryError",
        }
    }

    fn doc(self) -> &'static str {
        match self {
            Kind::Riftco => "Root of every riftco error (also raised for caught Rust panics).",
            Kind::Shape => "Tensor shapes or element counts do not fit the operation.",
            Kind::Config => "An invalid configuration value or an unknown option string.",
            Kind::Token => "Token ids outside the vocabulary, or a bad token block layout.",
            Kind::DeviceUnavailable => "The requested device does not exist in this build.",
            Kind::StaleGraph => {
                "A value read by a recorded graph changed before backward (run the forward again)."
            }
            Kind::Checkpoint => {
                "A checkpoint() contract violation (boundary, dependencies, replay)."
            }
            Kind::ModelState => "A model-state or adapter file is malformed or does not match.",
            Kind::Lora => "LoRA misuse: no adapters, adapters already present, bad rank or alpha.",
            Kind::Decode => "Decode-session misuse (for example a full K/V cache).",
            Kind::OutOfMemory => {
                "A tensor, weight or cache could not be allocated (memory or an address-space \
                 limit ran out); the message names the operation and the bytes."
            }
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The Python class.
    pub(crate) fn type_object(self, py: Python<'_>) -> Option<Bound<'_, PyType>> {
        TYPES[self.index()].get(py).map(|t| t.bind(py).clone())
    }

    /// A new exception of this class with `message`.
    pub(crate) fn err(self, message: impl Into<String>) -> PyErr {
        let message = message.into();
        Python::attach(|py| match self.type_object(py) {
            Some(t) => PyErr::from_type(t, message),
            None => PyRuntimeError::new_err(message),
        })
    }
}

/// Creates the classes and adds them to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let builtins = py.import("builtins")?;
    let type_ = builtins.getattr("type")?;
    for kind in KINDS {
        let bases: Bound<'_, PyTuple> = match kind {
            Kind::Riftco => PyTuple::new(py, [py.get_type::<PyException>()])?,
            Kind::Shape | Kind::Config | Kind::Token | Kind::ModelState | Kind::Lora => {
                let root = TYPES[0]
                    .get(py)
                    .expect("RiftcoError first")
                    .bind(py)
                    .clone();
                PyTuple::new(py, [root, py.get_type::<PyValueError>()])?
            }
            Kind::DeviceUnavailable | Kind::StaleGraph | Kind::Checkpoint | Kind::Decode => {
                let root = TYPES[0]
                    .get(py)
                    .expect("RiftcoError first")
                    .bind(py)
                    .clone();
                PyTuple::new(py, [root, py.get_type::<PyRuntimeError>()])?
            }
            Kind::OutOfMemory => {
                let root = TYPES[0]
                    .get(py)
                    .expect("RiftcoError first")
                    .bind(py)
                    .clone();
                PyTuple::new(py, [root, py.get_type::<PyMemoryError>()])?
            }
        };
        let dict = PyDict::new(py);
        dict.set_item("__module__", "riftco._native")?;
        dict.set_item("__doc__", kind.doc())?;
        let cls = type_
            .call1((kind.name(), bases, dict))?
            .cast_into::<PyType>()?;
        m.add(kind.name(), &cls)?;
        let _ = TYPES[kind.index()].set(py, cls.unbind());
    }
    Ok(())
}

/// A Python exception raised inside a Python callable that Rust code called (a checkpoint
/// function), carried through [`AutogradError::External`] so the binding re-raises the very same
/// exception object.
pub(crate) struct PythonError {
    pub(crate) err: PyErr,
    message: String,
}

impl PythonError {
    pub(crate) fn new(py: Python<'_>, err: PyErr) -> Self {
        let message = err
            .value(py)
            .str()
            .map(|s| s.to_string())
            .unwrap_or_else(|_| "<exception>".into());
        let type_name = err
            .get_type(py)
            .name()
            .map(|s| s.to_string())
            .unwrap_or_else(|_| "Exception".into());
        Self {
            err,
            message: format!("{type_name}: {message}"),
        }
    }
}

impl fmt::Debug for PythonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PythonError({})", self.message)
    }
}

impl fmt::Display for PythonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for PythonError {}

/// Any error of the Rust crates, before conversion to a Python exception (conversion needs the
/// GIL, so compute closures return this and convert after re-attaching).
#[derive(Debug)]
pub(crate) enum Error {
    Transformer(TransformerError),
    Autograd(AutogradError),
    Tensor(TensorError),
    Panic(String),
}

impl From<TransformerError> for Error {
    fn from(e: TransformerError) -> Self {
        Error::Transformer(e)
    }
}
impl From<AutogradError> for Error {
    fn from(e: AutogradError) -> Self {
        Error::Autograd(e)
    }
}
impl From<TensorError> for Error {
    fn from(e: TensorError) -> Self {
        Error::Tensor(e)
    }
}

impl From<Error> for PyErr {
    fn from(e: Error) -> Self {
        match e {
            Error::Transformer(e) => transformer_err(e),
            Error::Autograd(e) => autograd_err(e),
            Error::Tensor(e) => tensor_err(e),
            Error::Panic(m) => Kind::Riftco.err(format!("internal error (Rust panic): {m}")),
        }
    }
}

pub(crate) fn tensor_err(e: TensorError) -> PyErr {
    let kind = match &e {
        TensorError::ShapeMismatch { .. }
        | TensorError::LengthMismatch { .. }
        | TensorError::ZeroSized { .. }
        | TensorError::RankMismatch { .. }
        | TensorError::ShapeOverflow { .. } => Kind::Shape,
        TensorError::OutOfMemory { .. } => Kind::OutOfMemory,
        TensorError::IndexOutOfRange { what, .. } => {
            if what.contains("token") || what.contains("target") {
                Kind::Token
            } else {
                Kind::Shape
            }
        }
        TensorError::DeviceUnavailable { .. } | TensorError::DeviceMismatch { .. } => {
            Kind::DeviceUnavailable
        }
        TensorError::InvalidArgument { .. } => Kind::Config,
        #[allow(unreachable_patterns)]
        _ => Kind::Riftco,
    };
    kind.err(e.to_string())
}

pub(crate) fn autograd_err(e: AutogradError) -> PyErr {
    match e {
        AutogradError::Tensor(t) => tensor_err(t),
        AutogradError::StaleGraph { .. } => Kind::StaleGraph.err(e.to_string()),
        AutogradError::NotScalar { .. } => Kind::Shape.err(e.to_string()),
        AutogradError::NoGradient { .. } => Kind::Riftco.err(e.to_string()),
        AutogradError::Checkpoint(c) => checkpoint_err(c),
        AutogradError::Panic { .. } => Kind::Riftco.err(e.to_string()),
        AutogradError::External(ref inner) => {
            if let Some(p) = inner.downcast_ref::<PythonError>() {
                return Python::attach(|py| p.err.clone_ref(py));
            }
            if let Some(t) = inner.downcast_ref::<TransformerError>() {
                return transformer_ref_err(t).unwrap_or_else(|| Kind::Riftco.err(e.to_string()));
            }
            Kind::Riftco.err(e.to_string())
        }
        #[allow(unreachable_patterns)]
        _ => Kind::Riftco.err(e.to_string()),
    }
}

fn checkpoint_err(c: CheckpointError) -> PyErr {
    Kind::Checkpoint.err(c.to_string())
}

/// A transformer error seen by reference (inside an `External` payload): the owned variants are
/// rebuilt from their messages.
fn transformer_ref_err(e: &TransformerError) -> Option<PyErr> {
    let kind = match e {
        TransformerError::Config { .. } | TransformerError::UnknownOption { .. } => Kind::Config,
        TransformerError::Tokens(_) => Kind::Token,
        TransformerError::Lora(_) => Kind::Lora,
        TransformerError::Decode(_) => Kind::Decode,
        TransformerError::State { .. } => Kind::ModelState,
        TransformerError::Io { .. } => return Some(PyOSError::new_err(e.to_string())),
        TransformerError::Autograd(a) => return Some(autograd_err(a.clone())),
        #[allow(unreachable_patterns)]
        _ => Kind::Riftco,
    };
    Some(kind.err(e.to_string()))
}

pub(crate) fn transformer_err(e: TransformerError) -> PyErr {
    match e {
        TransformerError::Autograd(a) => autograd_err(a),
        TransformerError::Io { path, source } => {
            let message = format!("I/O error on {path}: {source}");
            match source.raw_os_error() {
                // OSError(errno, strerror, filename) picks the errno's subclass
                // (FileNotFoundError, PermissionError, ...) and keeps the path in `.filename`.
                Some(errno) => PyOSError::new_err((errno, message, path)),
                None => PyOSError::new_err(message),
            }
        }
        other => transformer_ref_err(&other).unwrap_or_else(|| Kind::Riftco.err(other.to_string())),
    }
}

/// Runs `f` with the GIL released, turning a panic into `RiftcoError` and a Rust error into its
/// Python exception (after re-attaching).
pub(crate) fn compute<T, E>(py: Python<'_>, f: impl FnOnce() -> Result<T, E> + Send) -> PyResult<T>
where
    T: Send,
    E: Into<Error> + Send,
{
    let out = py.detach(|| catch_unwind(AssertUnwindSafe(f)));
    match out {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.into().into()),
        Err(payload) => Err(Error::Panic(riftco_autograd::panic_message(&*payload)).into()),
    }
}

/// Like [`compute`] for code that needs the GIL (calls back into Python): panics still become
/// `RiftcoError`.
pub(crate) fn guarded<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => Err(Error::Panic(riftco_autograd::panic_message(&*payload)).into()),
    }
}
