//! `TransformerConfig`: sizes and numerics of a model, validated on construction.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict};
use riftco_transformer::config::validate_dropout;
use riftco_transformer::{
    DecoderOnlyTransformer, RopeScaling, TransformerConfig, TransformerError,
};

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
///     seed: seed of the weight initialisation (and of the dropout masks).
///     attention_dropout: dropout probability on the attention probabilities, in ``[0, 1)``
///         (Hugging Face's ``attention_dropout``).
///     residual_dropout: dropout probability on the outputs of ``o_proj`` and ``down_proj``
///         before the residual adds, in ``[0, 1)`` (saved in the ``"riftco"`` key of
///         ``config.json``: ``LlamaConfig`` has no such field).
///     n_kv_heads: key/value heads of grouped-query attention (Ainslie et al. 2023; Hugging
///         Face's ``num_key_value_heads``): an int, at least 1, dividing ``n_heads``; query head
///         ``h`` reads key/value head ``h // (n_heads // n_kv_heads)``. ``k_proj`` and
///         ``v_proj`` are ``[n_kv_heads * d_head, d_model]``. Default (``None``): ``n_heads``.
///     tie_word_embeddings: whether the LM head reads the token embedding matrix (one
///         parameter ``model.embed_tokens.weight``, no ``lm_head.weight``; its gradient sums
///         both uses); a bool. Default (``None``): False.
///
/// Dropout is active only in the training forwards of ``loss`` / ``logits`` while the model is
/// training (``model.train()``, the default); after ``model.eval()``, and in decoding, nothing
/// is dropped.
///
/// Raises:
///     ConfigError: naming the first invalid field and its value (a dropout probability that is
///         not a number, is a bool, or lies outside ``[0, 1)``, NaN and infinities included;
///         an ``n_kv_heads`` that is a bool, not an int, 0 or does not divide ``n_heads``).
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

/// The `n_kv_heads` argument: `None` is `n_heads`; otherwise a Python int (not a bool).
///
/// # Errors
/// `ConfigError` naming `n_kv_heads` and the value for a bool, a non-int or a negative int
/// (0 and non-divisors are reported by the config's validation).
fn kv_heads(v: Option<Bound<'_, PyAny>>, n_heads: usize) -> PyResult<usize> {
    let Some(v) = v.filter(|v| !v.is_none()) else {
        return Ok(n_heads);
    };
    let repr = || v.repr().map_or_else(|_| "?".to_string(), |r| r.to_string());
    let err = |reason: &str| {
        transformer_err(TransformerError::Config {
            field: "n_kv_heads",
            value: repr(),
            reason: reason.into(),
        })
    };
    if v.is_instance_of::<PyBool>() {
        return Err(err("expected an int dividing n_heads, not a bool"));
    }
    let n: i64 = v
        .extract()
        .map_err(|_| err("expected an int dividing n_heads"))?;
    usize::try_from(n).map_err(|_| err("must be at least 1 and divide n_heads"))
}

/// The `tie_word_embeddings` argument: a Python bool.
///
/// # Errors
/// `ConfigError` naming `tie_word_embeddings` and the value for anything else (`1`, `"yes"`).
fn tie_flag(v: &Bound<'_, PyAny>) -> PyResult<bool> {
    v.cast::<PyBool>().map(|b| b.is_true()).map_err(|_| {
        transformer_err(TransformerError::Config {
            field: "tie_word_embeddings",
            value: v.repr().map_or_else(|_| "?".to_string(), |r| r.to_string()),
            reason: "expected a bool".into(),
        })
    })
}

/// A dropout probability argument named `field`: an int or float (or any object with
/// `__float__`, such as a NumPy scalar) in `[0, 1)`.
///
/// # Errors
/// `ConfigError` naming `field` and the value for a bool (``True`` is not a probability), a
/// non-number (``None``, a string) or a value outside `[0, 1)`.
pub(crate) fn probability(field: &'static str, v: &Bound<'_, PyAny>) -> PyResult<f32> {
    probability_f64(field, v).map(|p| p as f32)
}

/// [`probability`] as the value given (an `f64`, not rounded to the model's `f32`).
fn probability_f64(field: &'static str, v: &Bound<'_, PyAny>) -> PyResult<f64> {
    let config_err = |value: String, reason: &str| {
        transformer_err(TransformerError::Config {
            field,
            value,
            reason: reason.into(),
        })
    };
    let repr = || v.repr().map_or_else(|_| "?".to_string(), |r| r.to_string());
    // A Python bool, or a NumPy boolean scalar or array (dtype kind "b"): never a probability.
    let numpy_bool = || -> bool {
        v.getattr("dtype")
            .and_then(|d| d.getattr("kind"))
            .and_then(|k| k.extract::<String>())
            .is_ok_and(|k| k == "b")
    };
    if v.is_instance_of::<PyBool>() || numpy_bool() {
        return Err(config_err(
            repr(),
            "expected a probability in [0, 1), not a bool",
        ));
    }
    let p: f64 = v
        .extract()
        .map_err(|_| config_err(repr(), "expected a probability in [0, 1) (a number)"))?;
    if !(0.0..1.0).contains(&p) {
        return Err(config_err(repr(), "expected a probability in [0, 1)"));
    }
    if validate_dropout(field, p as f32).is_err() {
        return Err(config_err(
            repr(),
            "rounds to 1 as a 32-bit float; expected a probability in [0, 1)",
        ));
    }
    Ok(p)
}

/// The field names [`check_probability`] reports (errors carry a static field name); any other
/// name is reported as `probability`.
const PROBABILITY_FIELDS: [&str; 5] = [
    "attention_dropout",
    "residual_dropout",
    "lora_dropout",
    "p",
    "probability",
];

/// A dropout probability checked by the rule every riftco config applies: a real number (NumPy
/// scalars included; not a bool), finite, ``0 <= p < 1`` and below 1 also as a 32-bit float.
///
/// Args:
///     field: the name errors give the value (``attention_dropout``, ``residual_dropout``,
///         ``lora_dropout``, ``p``; anything else reads ``probability``).
///     value: the value to check.
///
/// Returns:
///     float: the value as a Python float (not rounded to float32).
///
/// Raises:
///     ConfigError: naming the field and the value as given.
#[pyfunction]
fn check_probability(field: &str, value: &Bound<'_, PyAny>) -> PyResult<f64> {
    let field = PROBABILITY_FIELDS
        .iter()
        .find(|f| **f == field)
        .copied()
        .unwrap_or("probability");
    probability_f64(field, value)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(check_probability, m)?)
}

/// `model.set_dropout(...)`: each probability given (not `None`) is checked, then set; nothing
/// changes on error.
///
/// # Errors
/// `ConfigError` naming the field ([`probability`]), `LoraError` for `lora_dropout` on a model
/// without adapters.
pub(crate) fn set_model_dropout(
    m: &mut DecoderOnlyTransformer,
    attention_dropout: Option<Bound<'_, PyAny>>,
    residual_dropout: Option<Bound<'_, PyAny>>,
    lora_dropout: Option<Bound<'_, PyAny>>,
) -> PyResult<()> {
    let [a, r, _] = m.dropout_probabilities();
    let p = |field, v: Option<Bound<'_, PyAny>>, old| v.map_or(Ok(old), |v| probability(field, &v));
    let a = p("attention_dropout", attention_dropout, a)?;
    let r = p("residual_dropout", residual_dropout, r)?;
    let lora = lora_dropout
        .map(|v| probability("lora_dropout", &v))
        .transpose()?;
    if let Some(l) = lora {
        if !m.has_lora() {
            return Err(transformer_err(TransformerError::Lora {
                message: format!("lora_dropout = {l}: the model has no adapters"),
            }));
        }
    }
    m.set_dropout(a, r).map_err(transformer_err)?;
    if let Some(l) = lora {
        m.set_lora_dropout(l).map_err(transformer_err)?;
    }
    Ok(())
}

/// The f64 with the f32's shortest decimal spelling, so `1e-5` reads back as `1e-5`.
pub(crate) fn f32_as_python_float(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}

#[pymethods]
impl PyTransformerConfig {
    #[new]
    #[pyo3(signature = (vocab_size, d_model, n_heads, n_layers, d_ff, max_seq_len,
                        rms_norm_eps = 1e-5, rope_theta = 10000.0, seed = 0,
                        attention_dropout = None, residual_dropout = None, rope_scaling = None,
                        bos_token_id = None, eos_token_ids = None, n_kv_heads = None,
                        tie_word_embeddings = None))]
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
        attention_dropout: Option<Bound<'_, PyAny>>,
        residual_dropout: Option<Bound<'_, PyAny>>,
        rope_scaling: Option<Bound<'_, PyDict>>,
        bos_token_id: Option<Bound<'_, PyAny>>,
        eos_token_ids: Option<Bound<'_, PyAny>>,
        n_kv_heads: Option<Bound<'_, PyAny>>,
        tie_word_embeddings: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        // `None` is the default (0); an explicit None is accepted as "no dropout" like omission.
        let p = |field, v: Option<Bound<'_, PyAny>>| v.map_or(Ok(0.0), |v| probability(field, &v));
        let n_heads = size("n_heads", n_heads)?;
        let c = TransformerConfig {
            vocab_size: size("vocab_size", vocab_size)?,
            d_model: size("d_model", d_model)?,
            n_heads,
            n_layers: size("n_layers", n_layers)?,
            d_ff: size("d_ff", d_ff)?,
            max_seq_len: size("max_seq_len", max_seq_len)?,
            rms_norm_eps,
            rope_theta,
            seed,
            attention_dropout: p("attention_dropout", attention_dropout)?,
            residual_dropout: p("residual_dropout", residual_dropout)?,
            rope_scaling: rope_scaling
                .map(|d| rope_scaling_from_dict(&d))
                .transpose()?
                .unwrap_or_default(),
            bos_token_id: bos_token_id
                .map(|v| token_id_arg("bos_token_id", &v))
                .transpose()?,
            eos_token_ids: match eos_token_ids {
                None => Vec::new(),
                Some(v) if v.extract::<i128>().is_ok() => vec![token_id_arg("eos_token_ids", &v)?],
                Some(v) => v
                    .try_iter()
                    .map_err(|_| token_ids_type_err(&v))?
                    .map(|x| token_id_arg("eos_token_ids", &x?))
                    .collect::<PyResult<Vec<u32>>>()?,
            },
            n_kv_heads: kv_heads(n_kv_heads, n_heads)?,
            tie_word_embeddings: tie_word_embeddings.map_or(Ok(false), |v| tie_flag(&v))?,
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
    /// Dropout probability on the attention probabilities (default 0).
    #[getter]
    fn attention_dropout(&self) -> f64 {
        f32_as_python_float(self.0.attention_dropout)
    }
    /// Dropout probability on the attention and MLP outputs before the residual adds (default
    /// 0).
    #[getter]
    fn residual_dropout(&self) -> f64 {
        f32_as_python_float(self.0.residual_dropout)
    }
    /// RoPE frequency scaling as a dict: ``{"rope_type": "default"}``, ``{"rope_type":
    /// "linear", "factor": f}`` or ``{"rope_type": "llama3", "factor", "low_freq_factor",
    /// "high_freq_factor", "original_max_position_embeddings"}`` (Hugging Face's
    /// ``rope_parameters`` without ``rope_theta``).
    #[getter]
    fn rope_scaling<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        rope_scaling_to_dict(py, &self.0.rope_scaling)
    }
    /// Token id that starts a sequence (Hugging Face ``bos_token_id``), or None.
    #[getter]
    fn bos_token_id(&self) -> Option<u32> {
        self.0.bos_token_id
    }
    /// Token ids that end a sequence (Hugging Face ``eos_token_id``; empty when none):
    /// ``riftco.generate`` stops at the first one sampled.
    #[getter]
    fn eos_token_ids(&self) -> Vec<u32> {
        self.0.eos_token_ids.clone()
    }
    /// Head width, ``d_model // n_heads``.
    #[getter]
    fn d_head(&self) -> usize {
        self.0.d_head()
    }
    /// Key/value heads (grouped-query attention; ``n_heads`` for multi-head attention).
    #[getter]
    fn n_kv_heads(&self) -> usize {
        self.0.n_kv_heads
    }
    /// Whether the LM head reads the token embedding matrix.
    #[getter]
    fn tie_word_embeddings(&self) -> bool {
        self.0.tie_word_embeddings
    }

    /// The constructor arguments as a dict (JSON-serialisable).
    ///
    /// Returns:
    ///     dict[str, int | float]: keys ``vocab_size``, ``d_model``, ``n_heads``, ``n_layers``,
    ///     ``d_ff``, ``max_seq_len``, ``rms_norm_eps``, ``rope_theta``, ``seed``,
    ///     ``attention_dropout``, ``residual_dropout``, ``n_kv_heads``,
    ///     ``tie_word_embeddings``; and ``rope_scaling`` (dict), ``bos_token_id``,
    ///     ``eos_token_ids`` (list) when they are not the defaults.
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
        d.set_item(
            "attention_dropout",
            f32_as_python_float(c.attention_dropout),
        )?;
        d.set_item("residual_dropout", f32_as_python_float(c.residual_dropout))?;
        if c.rope_scaling != RopeScaling::Default {
            d.set_item("rope_scaling", rope_scaling_to_dict(py, &c.rope_scaling)?)?;
        }
        if let Some(id) = c.bos_token_id {
            d.set_item("bos_token_id", id)?;
        }
        if !c.eos_token_ids.is_empty() {
            d.set_item("eos_token_ids", c.eos_token_ids.clone())?;
        }
        d.set_item("n_kv_heads", c.n_kv_heads)?;
        d.set_item("tie_word_embeddings", c.tie_word_embeddings)?;
        Ok(d.unbind())
    }

    pub(crate) fn __repr__(&self) -> String {
        let c = &self.0;
        format!(
            "TransformerConfig(vocab_size={}, d_model={}, n_heads={}, n_layers={}, d_ff={}, \
             max_seq_len={}, rms_norm_eps={:?}, rope_theta={:?}, seed={}, \
             attention_dropout={:?}, residual_dropout={:?}, n_kv_heads={}, \
             tie_word_embeddings={})",
            c.vocab_size,
            c.d_model,
            c.n_heads,
            c.n_layers,
            c.d_ff,
            c.max_seq_len,
            f32_as_python_float(c.rms_norm_eps),
            c.rope_theta,
            c.seed,
            f32_as_python_float(c.attention_dropout),
            f32_as_python_float(c.residual_dropout),
            c.n_kv_heads,
            if c.tie_word_embeddings {
                "True"
            } else {
                "False"
            }
        )
    }

    fn __reduce__(&self, py: Python<'_>) -> PyResult<(Py<PyAny>, (Py<PyDict>,))> {
        let from_dict = py.get_type::<Self>().getattr("from_dict")?.unbind();
        Ok((from_dict, (self.to_dict(py)?,)))
    }
}

/// A [`RopeScaling`] from a Python dict (through its JSON form).
///
/// # Errors
/// `ConfigError` naming the dict for an unknown `rope_type`, a missing or unknown key, or a
/// value of the wrong type; `TypeError` when it is not JSON-serialisable.
fn rope_scaling_from_dict(d: &Bound<'_, PyDict>) -> PyResult<RopeScaling> {
    let json = d.py().import("json")?;
    let text: String = json.call_method1("dumps", (d,))?.extract()?;
    serde_json::from_str(&text).map_err(|e| {
        crate::errors::Exc::Config.err(format!(
            "rope_scaling = {text}: {e} (expected {{\"rope_type\": \"default\"}}, \
             {{\"rope_type\": \"linear\", \"factor\": ...}} or {{\"rope_type\": \"llama3\", \
             \"factor\", \"low_freq_factor\", \"high_freq_factor\", \
             \"original_max_position_embeddings\"}})"
        ))
    })
}

fn rope_scaling_to_dict<'py>(py: Python<'py>, r: &RopeScaling) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(r)
        .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
    py.import("json")?.call_method1("loads", (text,))
}

/// A token id argument: a Python int in `[0, 2^32)` (a bool is not one); the range below
/// `vocab_size` is checked by the config's validation.
fn token_id_arg(field: &str, v: &Bound<'_, PyAny>) -> PyResult<u32> {
    let bad = || {
        crate::errors::Exc::Config.err(format!(
            "{field} = {}: expected a token id, an int in [0, vocab_size)",
            v.repr().map_or_else(|_| "?".into(), |r| r.to_string())
        ))
    };
    if v.is_instance_of::<PyBool>() {
        return Err(bad());
    }
    v.extract::<i128>()
        .ok()
        .and_then(|x| u32::try_from(x).ok())
        .ok_or_else(bad)
}

fn token_ids_type_err(v: &Bound<'_, PyAny>) -> PyErr {
    crate::errors::Exc::Config.err(format!(
        "eos_token_ids = {}: expected a token id or a list of them",
        v.repr().map_or_else(|_| "?".into(), |r| r.to_string())
    ))
}
