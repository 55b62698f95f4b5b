//! Activation-checkpointing policies from Python: the argument forms the model accepts (a
//! spelling, a per-block list, an activation-memory budget), the resolved plan as a dict, and
//! the tables behind them (`SELECTIVE_POLICIES`, `BLOCK_VALUE_NAMES`, `parse_byte_size`).

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyList, PyString, PyTuple};
use riftco_transformer::checkpointing::{
    parse_byte_size as parse_size, parse_byte_size_for, ActivationCheckpointing, BlockPolicy,
    CheckpointPlan, BLOCK_VALUE_NAMES, POLICY_FORMS, SELECTIVE_POLICIES,
};
use riftco_transformer::TransformerError;

use crate::errors::{transformer_err, Exc};

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add(
        "DEFAULT_LOSS_CHUNK_BYTES",
        riftco_transformer::DEFAULT_LOSS_CHUNK_BYTES,
    )?;
    let selective = PyDict::new(py);
    for p in SELECTIVE_POLICIES {
        selective.set_item(p.name, PyTuple::new(py, p.save)?)?;
    }
    m.add("SELECTIVE_POLICIES", selective)?;
    m.add(
        "BLOCK_VALUE_NAMES",
        PyTuple::new(py, BLOCK_VALUE_NAMES.iter().map(|(n, _)| *n))?,
    )?;
    m.add(
        "ACTIVATION_CHECKPOINTING_POLICIES",
        PyTuple::new(py, simple_policy_names()?)?,
    )?;
    m.add("ACTIVATION_CHECKPOINTING_FORMS", POLICY_FORMS)?;
    m.add_function(wrap_pyfunction!(parse_byte_size, m)?)?;
    m.add_function(wrap_pyfunction!(parse_activation_checkpointing, m)?)?;
    Ok(())
}

/// The policies spelled by a name alone (no parameter), default first: `disabled`, `block`,
/// `auto`, `selective` (which means the first named selective policy). Each is checked to parse.
fn simple_policy_names() -> PyResult<Vec<&'static str>> {
    let names = ["disabled", "block", "auto", "selective"];
    for n in names {
        n.parse::<ActivationCheckpointing>()
            .map_err(transformer_err)?;
    }
    Ok(names.to_vec())
}

fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr()
        .map_or_else(|_| "<unprintable>".into(), |r| r.to_string())
}

fn config_err(field: &'static str, value: String, reason: String) -> PyErr {
    transformer_err(TransformerError::Config {
        field,
        value,
        reason,
    })
}

/// A policy argument: a spelling, or a list or tuple of per-block spellings (one per layer).
fn policy_of(obj: &Bound<'_, PyAny>) -> PyResult<ActivationCheckpointing> {
    if let Ok(s) = obj.cast::<PyString>() {
        return s.to_str()?.parse().map_err(transformer_err);
    }
    let items: Option<Vec<Bound<'_, PyAny>>> = if let Ok(l) = obj.cast::<PyList>() {
        Some(l.iter().collect())
    } else if let Ok(t) = obj.cast::<PyTuple>() {
        Some(t.iter().collect())
    } else {
        None
    };
    let Some(items) = items else {
        return Err(config_err(
            "activation_checkpointing",
            repr(obj),
            format!(
                "expected a policy string ({POLICY_FORMS}) or a list or tuple of per-block \
                 policy strings, one per layer"
            ),
        ));
    };
    if items.is_empty() {
        return Err(config_err(
            "activation_checkpointing",
            repr(obj),
            "a per-block list needs one policy (\"disabled\", \"block\" or \
             \"selective[:NAME]\") per layer; got an empty list"
                .into(),
        ));
    }
    let mut list = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Ok(s) = item.cast::<PyString>() else {
            return Err(config_err(
                "activation_checkpointing",
                repr(obj),
                format!(
                    "item {i} of the per-block list is {}, not a string; a per-block policy is \
                     \"disabled\", \"block\" or \"selective[:NAME]\"",
                    repr(item)
                ),
            ));
        };
        list.push(BlockPolicy::parse(s.to_str()?).map_err(transformer_err)?);
    }
    Ok(ActivationCheckpointing::PerBlock(list))
}

/// An activation-memory budget argument: an integer of bytes (a Python int or anything with
/// `__index__`, such as a NumPy integer; not a bool) or a size string (`"64MiB"`).
fn budget_of(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    byte_size_of("activation_memory_budget", obj)
}

/// A byte-size argument of the setting `field`: an integer of bytes (a Python int or anything
/// with `__index__`, such as a NumPy integer; not a bool, not a float) or a size string
/// (`"64MiB"`). Errors are `ConfigError`s naming `field` and the value.
pub(crate) fn byte_size_of(field: &'static str, obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Ok(s) = obj.cast::<PyString>() {
        return parse_byte_size_for(field, s.to_str()?).map_err(transformer_err);
    }
    let range = || {
        config_err(
            field,
            repr(obj),
            "a size in bytes must be between 0 and 2^64 - 1".into(),
        )
    };
    if !obj.is_instance_of::<PyBool>() {
        match obj.extract::<i128>() {
            Ok(v) => return u64::try_from(v).ok().ok_or_else(range),
            Err(_) if obj.is_instance_of::<PyInt>() => return Err(range()),
            Err(_) => {}
        }
    }
    Err(config_err(
        field,
        repr(obj),
        "expected an int (bytes) or a size string with a unit B, kB, MB, GB, TB, KiB, MiB, GiB \
         or TiB (e.g. \"64MiB\")"
            .into(),
    ))
}

/// The policy of `activation_checkpointing` (`None`: `disabled`) and `activation_memory_budget`
/// (`None`: no budget) together: a budget is the `budget:SIZE` policy, and combining it with any
/// policy other than `disabled` is a `ConfigError`.
pub(crate) fn policy_from(
    policy: Option<&Bound<'_, PyAny>>,
    budget: Option<&Bound<'_, PyAny>>,
) -> PyResult<ActivationCheckpointing> {
    let p = match policy {
        Some(obj) if !obj.is_none() => policy_of(obj)?,
        _ => ActivationCheckpointing::Disabled,
    };
    let Some(budget) = budget.filter(|b| !b.is_none()) else {
        return Ok(p);
    };
    let bytes = budget_of(budget)?;
    if p != ActivationCheckpointing::Disabled {
        return Err(config_err(
            "activation_memory_budget",
            repr(budget),
            format!(
                "a budget lets the planner choose the per-block policies, so it cannot be \
                 combined with activation_checkpointing = \"{p}\"; pick one: a policy, or \
                 activation_memory_budget with activation_checkpointing \"disabled\" (the \
                 default)"
            ),
        ));
    }
    Ok(ActivationCheckpointing::Budget(bytes))
}

/// Parses a byte size: an integer or decimal number with an optional unit, ``B``, ``kB``,
/// ``MB``, ``GB``, ``TB`` (powers of 1000) or ``KiB``, ``MiB``, ``GiB``, ``TiB`` (powers of
/// 1024), case-insensitive, spaces allowed (``"64MiB"``, ``"1.5 GB"``, ``"1000000"``), rounded
/// down to whole bytes.
///
/// Args:
///     text: the size.
///
/// Returns:
///     int: bytes, below 2**64 (a decimal number with a unit rounded down: ``"0.3 KiB"`` is 307).
///
/// Raises:
///     ConfigError: naming ``text``, for an unknown unit, a missing or negative number, a
///         fraction of a byte (``"1.5B"``), or a size of 2**64 bytes or more.
///
/// Example:
///     >>> import riftco
///     >>> riftco.parse_byte_size("64MiB")
///     67108864
#[pyfunction]
fn parse_byte_size(text: &str) -> PyResult<u64> {
    parse_size(text).map_err(transformer_err)
}

/// Checks an activation-checkpointing policy the way ``DecoderOnlyTransformer`` does and
/// returns its canonical spelling (what ``model.activation_checkpointing`` would be).
///
/// Args:
///     policy: ``"disabled"``, ``"block"``, ``"segments:K"``, ``"auto"``, ``"selective"``,
///         ``"selective:NAME"`` (a name of ``SELECTIVE_POLICIES`` or ``BLOCK_VALUE_NAMES`` joined
///         by ``+``), a comma-separated per-block list, ``"budget:SIZE"``, or a list or tuple of
///         per-block strings (``"disabled"``, ``"block"``, ``"selective[:NAME]"``); ``None``
///         means ``"disabled"``.
///     activation_memory_budget: bytes (int) or a size string (``"64MiB"``): the ``budget``
///         policy. ``None``: no budget.
///     n_layers: also check the policy against a model of this many blocks (``segments:K``
///         needs ``1 <= K <= n_layers``, a per-block list ``n_layers`` entries).
///
/// Returns:
///     str: the canonical spelling (``"selective"`` becomes ``"selective:attention_ffn"``, a
///     budget ``"budget:BYTES"``, a list its comma-separated form).
///
/// Raises:
///     ConfigError: naming the value and what is accepted; also when both a policy other than
///         ``"disabled"`` and a budget are given, and for ``n_layers`` not an int ``>= 1`` (a
///         bool is not one).
#[pyfunction]
#[pyo3(signature = (policy = None, activation_memory_budget = None, *, n_layers = None))]
fn parse_activation_checkpointing(
    policy: Option<Bound<'_, PyAny>>,
    activation_memory_budget: Option<Bound<'_, PyAny>>,
    n_layers: Option<Bound<'_, PyAny>>,
) -> PyResult<String> {
    let n_layers = match n_layers.filter(|n| !n.is_none()) {
        Some(n) => Some(count_arg(
            &n,
            "n_layers",
            "a model has n_layers >= 1 blocks",
            |n| n >= 1,
        )?),
        None => None,
    };
    let p = policy_from(policy.as_ref(), activation_memory_budget.as_ref())?;
    if let Some(n) = n_layers {
        p.validate(n).map_err(transformer_err)?;
    }
    Ok(p.to_string())
}

/// The plan as the Python dict documented on `activation_checkpointing_plan`.
pub(crate) fn plan_dict<'py>(
    py: Python<'py>,
    plan: &CheckpointPlan,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("policy", plan.policy.to_string())?;
    d.set_item("summary", plan.to_string())?;
    let per_block: Vec<String> = plan.per_block().iter().map(ToString::to_string).collect();
    d.set_item("per_block", per_block)?;
    let segments = PyList::empty(py);
    for s in &plan.segments {
        let seg = PyDict::new(py);
        seg.set_item("layers", vec![s.layers.start, s.layers.end])?;
        seg.set_item("policy", s.policy.to_string())?;
        segments.append(seg)?;
    }
    d.set_item("segments", segments)?;
    d.set_item("segment_length", plan.segment_length)?;
    d.set_item("predicted_peak_bytes", plan.predicted_peak_bytes)?;
    d.set_item("predicted_step_seconds", plan.predicted_step_seconds)?;
    match &plan.measurement {
        None => d.set_item("measurement", py.None())?,
        Some(m) => {
            let md = PyDict::new(py);
            md.set_item("batch", m.batch)?;
            md.set_item("seq", m.seq)?;
            md.set_item("n_layers", m.n_layers)?;
            md.set_item("boundary_bytes", m.boundary_bytes)?;
            md.set_item("layer_bytes", m.layer_bytes)?;
            md.set_item("head_retained_bytes", m.head_retained_bytes)?;
            md.set_item("head_transient_bytes", m.head_transient_bytes)?;
            md.set_item("head_forward_peak_bytes", m.head_forward_peak_bytes)?;
            md.set_item("embedding_bytes", m.embedding_bytes)?;
            md.set_item("head_kept_bytes", m.head_kept_bytes)?;
            md.set_item("head_seconds", m.head_seconds)?;
            md.set_item("optimal_segment_length", m.optimal_segment_length())?;
            let costs = PyList::empty(py);
            for c in &m.costs {
                let cd = PyDict::new(py);
                cd.set_item("policy", c.policy.to_string())?;
                cd.set_item("retained_bytes", c.retained_bytes)?;
                cd.set_item("transient_bytes", c.transient_bytes)?;
                cd.set_item("forward_peak_bytes", c.forward_peak_bytes)?;
                cd.set_item("seconds", c.seconds)?;
                costs.append(cd)?;
            }
            md.set_item("costs", costs)?;
            d.set_item("measurement", md)?;
        }
    }
    Ok(d)
}

/// A count argument (a plan's `batch` or `seq`, `n_layers`): a Python int or anything with `__index__` (not a bool),
/// in range per `ok`; anything else a `ConfigError` naming the value and `expected`.
pub(crate) fn count_arg(
    obj: &Bound<'_, PyAny>,
    name: &str,
    expected: &str,
    ok: impl Fn(usize) -> bool,
) -> PyResult<usize> {
    let shown = obj
        .repr()
        .map_or_else(|_| "<unprintable>".into(), |r| r.to_string());
    if obj.is_instance_of::<PyBool>() {
        return Err(Exc::Config.err(format!(
            "invalid config: {name} = {shown}: expected an int, not a bool; {expected}"
        )));
    }
    let v = match obj.extract::<i128>() {
        Ok(v) => v,
        // An int too large for i128 is out of range like any other.
        Err(_) if obj.is_instance_of::<PyInt>() => -1,
        Err(_) => {
            return Err(Exc::Config.err(format!(
                "invalid config: {name} = {shown}: expected an int; {expected}"
            )))
        }
    };
    usize::try_from(v)
        .ok()
        .filter(|&v| ok(v))
        .ok_or_else(|| Exc::Config.err(format!("invalid config: {name} = {shown}: {expected}")))
}
