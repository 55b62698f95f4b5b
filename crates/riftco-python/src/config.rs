//! `TransformerConfig`: sizes and numerics of a model, validated on construction.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use riftco_transformer::{TransformerConfig, TransformerError};

use crate::errors::transformer_err;

/// Sizes and numerics of a LLaMA-style decoder-only transformer (immutable).
///
/// The activation-checkpointing policy is deliberately not part of it: it changes how a
/// training graph retains activations, not the architecture.
///
/// Args:
///     vocab_size: vocabulary size (256 for byte-level tokens).
///     d_model: residual stream width; divisible by ``n_heads`` with an even ``d_head``.
///     n_heads: attention heads.
///     n_layers: transformer blocks.
///     d_ff: hidden width of the SwiGLU MLP.
///     max_seq_len: longest sequence (RoPE table size, K/V cache capacity).
///     rms_norm_eps: RMSNorm epsilon (positive).
///     rope_theta: RoPE base (positive).
///     seed: seed of the weight initialisation.
///
/// Raises:
///     ConfigError: naming the first invalid field and its value.
///
/// Example:
///     >>> import riftco
///     >>> riftco.TransformerConfig(256, 32, 4, 2, 64, 16).d_head
///     8
#[pyclass(name = "TransformerConfig", module = "riftco._native", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct PyTransformerConfig(pub(crate) TransformerConfig);

fn size(field: &'static str, v: i64) -> PyResult<usize> {
    usize::try_from(v).map_err(|_| {
        transformer_err(TransformerError::Config {
            field,
            value: v.to_string(),
            reason: "must be positive".into(),
        })
    })
}

/// The f64 with the f32's shortest decimal spelling, so `1e-5` reads back as `1e-5`.
pub(crate) fn f32_as_python_float(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}

#[pymethods]
impl PyTransformerConfig {
    #[new]
    #[pyo3(signature = (vocab_size, d_model, n_heads, n_layers, d_ff, max_seq_len,
                        rms_norm_eps = 1e-5, rope_theta = 10000.0, seed = 0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        vocab_size: i64,
        d_model: i64,
        n_heads: i64,
        n_layers: i64,
        d_ff: i64,
        max_seq_len: i64,
        rms_norm_eps: f32,
        rope_theta: f64,
        seed: u64,
    ) -> PyResult<Self> {
        let c = TransformerConfig {
            vocab_size: size("vocab_size", vocab_size)?,
            d_model: size("d_model", d_model)?,
            n_heads: size("n_heads", n_heads)?,
            n_layers: size("n_layers", n_layers)?,
            d_ff: size("d_ff", d_ff)?,
            max_seq_len: size("max_seq_len", max_seq_len)?,
            rms_norm_eps,
            rope_theta,
            seed,
        };
        c.validate().map_err(transformer_err)?;
        Ok(Self(c))
    }

    /// A config from a mapping with the constructor's keyword names (for example the output of
    /// ``to_dict()`` or a saved ``riftco_config``).
    ///
    /// Raises:
    ///     ConfigError: for invalid values; TypeError for missing or unknown keys.
    #[staticmethod]
    fn from_dict(py: Python<'_>, d: &Bound<'_, PyDict>) -> PyResult<Self> {
        let cls = py.get_type::<Self>();
        Ok(cls.call((), Some(d))?.cast_into::<Self>()?.get().clone())
    }

    /// Vocabulary size (256 for byte-level tokens).
    #[getter]
    fn vocab_size(&self) -> usize {
        self.0.vocab_size
    }
    /// Residual stream width (``d_model``).
    #[getter]
    fn d_model(&self) -> usize {
        self.0.d_model
    }
    /// Number of attention heads.
    #[getter]
    fn n_heads(&self) -> usize {
        self.0.n_heads
    }
    /// Number of transformer blocks.
    #[getter]
    fn n_layers(&self) -> usize {
        self.0.n_layers
    }
    /// Hidden width of the SwiGLU MLP.
    #[getter]
    fn d_ff(&self) -> usize {
        self.0.d_ff
    }
    /// Longest sequence (RoPE table size, K/V cache capacity).
    #[getter]
    fn max_seq_len(&self) -> usize {
        self.0.max_seq_len
    }
    /// RMSNorm epsilon (default 1e-5).
    #[getter]
    fn rms_norm_eps(&self) -> f64 {
        f32_as_python_float(self.0.rms_norm_eps)
    }
    /// RoPE base theta (default 10000).
    #[getter]
    fn rope_theta(&self) -> f64 {
        self.0.rope_theta
    }
    /// Seed of the weight initialisation.
    #[getter]
    fn seed(&self) -> u64 {
        self.0.seed
    }
    /// Head width, ``d_model // n_heads``.
    #[getter]
    fn d_head(&self) -> usize {
        self.0.d_head()
    }

    /// The constructor arguments as a dict (JSON-serialisable).
    ///
    /// Returns:
    ///     dict[str, int | float]: keys ``vocab_size``, ``d_model``, ``n_heads``, ``n_layers``,
    ///     ``d_ff``, ``max_seq_len``, ``rms_norm_eps``, ``rope_theta``, ``seed``.
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyDict>> {
        let c = &self.0;
        let d = PyDict::new(py);
        d.set_item("vocab_size", c.vocab_size)?;
        d.set_item("d_model", c.d_model)?;
        d.set_item("n_heads", c.n_heads)?;
        d.set_item("n_layers", c.n_layers)?;
        d.set_item("d_ff", c.d_ff)?;
        d.set_item("max_seq_len", c.max_seq_len)?;
        d.set_item("rms_norm_eps", f32_as_python_float(c.rms_norm_eps))?;
        d.set_item("rope_theta", c.rope_theta)?;
        d.set_item("seed", c.seed)?;
        Ok(d.unbind())
    }

    pub(crate) fn __repr__(&self) -> String {
        let c = &self.0;
        format!(
            "TransformerConfig(vocab_size={}, d_model={}, n_heads={}, n_layers={}, d_ff={}, \
             max_seq_len={}, rms_norm_eps={:?}, rope_theta={:?}, seed={})",
            c.vocab_size,
            c.d_model,
            c.n_heads,
            c.n_layers,
            c.d_ff,
            c.max_seq_len,
            f32_as_python_float(c.rms_norm_eps),
            c.rope_theta,
            c.seed
        )
    }

    fn __reduce__(&self, py: Python<'_>) -> PyResult<(Py<PyAny>, (Py<PyDict>,))> {
        let from_dict = py.get_type::<Self>().getattr("from_dict")?.unbind();
        Ok((from_dict, (self.to_dict(py)?,)))
    }
}
