//! The exception hierarchy of `riftco` and the mapping of every Rust error onto it.
//!
//! `RiftcoError(Exception)` is the root. Input problems also subclass `ValueError`
//! (`ShapeError`, `ConfigError`, `TokenError`, `ModelStateError`, `LoraError`), state and device
//! problems `RuntimeError` (`DeviceUnavailableError`, `DeviceMismatchError`, `StaleGraphError`,
//! `CheckpointError`, `DecodeError`), and an allocation the allocator refused `MemoryError`
//! (`OutOfMemoryError`). The classes are created at module import with two bases each (PyO3's
//! `create_exception!` takes one), and live in `riftco._native`. A filesystem error is the
//! built-in `OSError` subclass of its errno.
//!
//! A Rust error is raised as the class of its [`ErrorKind`] ([`class_of`], one match); messages
//! are never inspected.
//!
//! Every compute entry point runs through [`compute`], which releases the GIL and turns a Rust
//! panic into `RiftcoError` instead of letting it cross into Python.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::{PyException, PyMemoryError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use riftco_autograd::AutogradError;
use riftco_tensor::{ClassifiedError, ErrorKind, TensorError};
use riftco_transformer::TransformerError;

/// The exception classes: the riftco ones in registration order, then the built-in `OSError`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exc {
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
    DeviceMismatch,
    /// The built-in `OSError` (not registered by riftco).
    Os,
}

/// The classes riftco creates, in registration order (the root first).
const REGISTERED: [Exc; 12] = [
    Exc::Riftco,
    Exc::Shape,
    Exc::Config,
    Exc::Token,
    Exc::DeviceUnavailable,
    Exc::StaleGraph,
    Exc::Checkpoint,
    Exc::ModelState,
    Exc::Lora,
    Exc::Decode,
    Exc::OutOfMemory,
    Exc::DeviceMismatch,
];

static TYPES: [PyOnceLock<Py<PyType>>; 12] = [const { PyOnceLock::new() }; 12];

/// The built-in base (besides `RiftcoError`) of a registered class.
enum Base {
    Value,
    Runtime,
    Memory,
}

impl Exc {
    fn name(self) -> &'static str {
        match self {
            Exc::Riftco => "RiftcoError",
            Exc::Shape => "ShapeError",
            Exc::Config => "ConfigError",
            Exc::Token => "TokenError",
            Exc::DeviceUnavailable => "DeviceUnavailableError",
            Exc::StaleGraph => "StaleGraphError",
            Exc::Checkpoint => "CheckpointError",
            Exc::ModelState => "ModelStateError",
            Exc::Lora => "LoraError",
            Exc::Decode => "DecodeError",
            Exc::OutOfMemory => "OutOfMemoryError",
            Exc::DeviceMismatch => "DeviceMismatchError",
            Exc::Os => "OSError",
        }
    }

    fn doc(self) -> &'static str {
        match self {
            Exc::Riftco => "Root of every riftco error (also raised for caught Rust panics).",
            Exc::Shape => "Tensor shapes or element counts do not fit the operation.",
            Exc::Config => "An invalid configuration value or an unknown option string.",
            Exc::Token => "Token ids outside the vocabulary, or a bad token block layout.",
            Exc::DeviceUnavailable => "The requested device does not exist in this build.",
            Exc::StaleGraph => {
                "A value read by a recorded graph changed before backward (run the forward again)."
            }
            Exc::Checkpoint => {
                "A checkpoint() contract violation (boundary, dependencies, replay)."
            }
            Exc::ModelState => "A model-state or adapter file is malformed or does not match.",
            Exc::Lora => "LoRA misuse: no adapters, adapters already present, bad rank or alpha.",
            Exc::Decode => "Decode-session misuse (for example a full K/V cache).",
            Exc::OutOfMemory => {
                "A tensor, weight or cache could not be allocated (memory or an address-space \
                 limit ran out); the message names the operation and the bytes."
            }
            Exc::DeviceMismatch => {
                "The operands of one operation live on different devices; the message names both."
            }
            Exc::Os => "",
        }
    }

    /// `None` for the root and for `OSError`.
    fn base(self) -> Option<Base> {
        match self {
            Exc::Riftco | Exc::Os => None,
            Exc::Shape | Exc::Config | Exc::Token | Exc::ModelState | Exc::Lora => {
                Some(Base::Value)
            }
            Exc::DeviceUnavailable
            | Exc::DeviceMismatch
            | Exc::StaleGraph
            | Exc::Checkpoint
            | Exc::Decode => Some(Base::Runtime),
            Exc::OutOfMemory => Some(Base::Memory),
        }
    }

    /// The Python class.
    pub(crate) fn type_object(self, py: Python<'_>) -> Option<Bound<'_, PyType>> {
        if self == Exc::Os {
            return Some(py.get_type::<PyOSError>());
        }
        let index = REGISTERED.iter().position(|c| *c == self)?;
        TYPES[index].get(py).map(|t| t.bind(py).clone())
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
    for (index, class) in REGISTERED.into_iter().enumerate() {
        let bases: Bound<'_, PyTuple> = match class.base() {
            None => PyTuple::new(py, [py.get_type::<PyException>()])?,
            Some(base) => {
                let root = TYPES[0]
                    .get(py)
                    .expect("RiftcoError first")
                    .bind(py)
                    .clone();
                let base = match base {
                    Base::Value => py.get_type::<PyValueError>(),
                    Base::Runtime => py.get_type::<PyRuntimeError>(),
                    Base::Memory => py.get_type::<PyMemoryError>(),
                };
                PyTuple::new(py, [root, base])?
            }
        };
        let dict = PyDict::new(py);
        dict.set_item("__module__", "riftco._native")?;
        dict.set_item("__doc__", class.doc())?;
        let cls = type_
            .call1((class.name(), bases, dict))?
            .cast_into::<PyType>()?;
        m.add(class.name(), &cls)?;
        let _ = TYPES[index].set(py, cls.unbind());
    }
    // A private test hook: set as an attribute so that it stays out of `__all__`.
    m.setattr(
        "_error_kind_classes",
        wrap_pyfunction!(_error_kind_classes, m)?,
    )?;
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

impl ClassifiedError for PythonError {
    /// User code's exception, re-raised unchanged (its class is its own).
    fn kind(&self) -> ErrorKind {
        ErrorKind::External
    }
}

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
            Error::Panic(m) => exception(
                ErrorKind::Panic,
                format!("internal error (Rust panic): {m}"),
                None,
            ),
        }
    }
}

/// The exception class of an error kind: the one place the Python layer classifies core
/// errors. `None` for a kind added after this match was written (raised as `RiftcoError`).
fn class_of(kind: ErrorKind) -> Option<Exc> {
    Some(match kind {
        ErrorKind::Shape | ErrorKind::IndexOutOfRange => Exc::Shape,
        ErrorKind::InvalidArgument | ErrorKind::Config | ErrorKind::UnknownOption => Exc::Config,
        ErrorKind::Tokens => Exc::Token,
        ErrorKind::OutOfMemory => Exc::OutOfMemory,
        ErrorKind::DeviceUnavailable => Exc::DeviceUnavailable,
        ErrorKind::DeviceMismatch => Exc::DeviceMismatch,
        ErrorKind::StaleGraph => Exc::StaleGraph,
        ErrorKind::Checkpoint => Exc::Checkpoint,
        ErrorKind::Lora => Exc::Lora,
        ErrorKind::Decode => Exc::Decode,
        ErrorKind::State => Exc::ModelState,
        ErrorKind::Io => Exc::Os,
        ErrorKind::Backward | ErrorKind::Panic | ErrorKind::External => Exc::Riftco,
        _ => return None,
    })
}

/// The exception of `kind` with `message`; `os` (errno, filename) makes an `OSError` pick the
/// errno's subclass (`FileNotFoundError`, `PermissionError`, ...) and keep the path.
fn exception(kind: ErrorKind, message: String, os: Option<(i32, String)>) -> PyErr {
    match (class_of(kind).unwrap_or(Exc::Riftco), os) {
        (Exc::Os, Some((errno, path))) => PyOSError::new_err((errno, message, path)),
        (class, _) => class.err(message),
    }
}

/// The Python exception raised inside a callable that `e` carries, however deep (a checkpoint
/// callable's exception inside a transformer error inside an autograd error).
fn python_error(e: &AutogradError) -> Option<&PythonError> {
    let AutogradError::External(inner) = e else {
        return None;
    };
    let inner: &(dyn std::error::Error + Send + Sync + 'static) = &**inner;
    if let Some(p) = inner.downcast_ref::<PythonError>() {
        return Some(p);
    }
    match inner.downcast_ref::<TransformerError>() {
        Some(TransformerError::Autograd(a)) => python_error(a),
        _ => inner.downcast_ref::<AutogradError>().and_then(python_error),
    }
}

pub(crate) fn tensor_err(e: TensorError) -> PyErr {
    exception(e.kind(), e.to_string(), None)
}

pub(crate) fn autograd_err(e: AutogradError) -> PyErr {
    if let Some(p) = python_error(&e) {
        return Python::attach(|py| p.err.clone_ref(py));
    }
    exception(e.kind(), e.to_string(), None)
}

pub(crate) fn transformer_err(e: TransformerError) -> PyErr {
    match e {
        TransformerError::Autograd(a) => autograd_err(a),
        TransformerError::Io { path, source } => {
            let message = format!("I/O error on {path}: {source}");
            let os = source.raw_os_error().map(|errno| (errno, path));
            exception(ErrorKind::Io, message, os)
        }
        other => exception(other.kind(), other.to_string(), None),
    }
}

/// `{kind name: exception class}` for every [`ErrorKind`] (the classification table, for tests).
#[pyfunction]
pub(crate) fn _error_kind_classes(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    for kind in ErrorKind::ALL {
        let class = class_of(kind).unwrap_or(Exc::Riftco);
        out.set_item(kind.name(), class.type_object(py))?;
    }
    Ok(out)
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
