//! `manual_seed`, `get_rng_state`, `set_rng_state`: the calling thread's random-number
//! generator state (a seed and an offset in generator blocks), which random ops and checkpoint
//! replays draw from, with `torch`'s names.

use pyo3::prelude::*;
use pyo3::types::PyBool;
use riftco_autograd::{rng, RngState};

use crate::errors::Exc;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(manual_seed, m)?)?;
    m.add_function(wrap_pyfunction!(get_rng_state, m)?)?;
    m.add_function(wrap_pyfunction!(set_rng_state, m)?)?;
    Ok(())
}

/// An int in `[0, 2**64)` (not a bool), or a `ConfigError` naming `what` and the value.
pub(crate) fn u64_arg(value: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    let repr = || value.repr().map_or_else(|_| "?".into(), |r| r.to_string());
    if value.is_instance_of::<PyBool>() {
        return Err(Exc::Config.err(format!(
            "{what} must be an int in [0, 2**64), not a bool; got {}",
            repr()
        )));
    }
    value.extract::<u64>().map_err(|_| {
        Exc::Config.err(format!(
            "{what} must be an int in [0, 2**64); got {}",
            repr()
        ))
    })
}

/// Seeds the calling thread's generator: the state becomes ``(seed, 0)``.
///
/// The state is per thread (a forward, its backward and every checkpoint replay run on the
/// calling thread, so other threads never change what a graph draws); a new thread starts at
/// ``(0, 0)``.
///
/// Args:
///     seed: an int in ``[0, 2**64)``.
///
/// Raises:
///     ConfigError: a seed that is not such an int (a bool, a negative or too large int, a
///         float), naming the value.
///
/// Example:
///     >>> import riftco
///     >>> riftco.manual_seed(42)
///     >>> riftco.get_rng_state()
///     (42, 0)
#[pyfunction]
fn manual_seed(seed: &Bound<'_, PyAny>) -> PyResult<()> {
    rng::manual_seed(u64_arg(seed, "manual_seed: seed")?);
    Ok(())
}

/// The calling thread's generator state as ``(seed, offset)``: the seed (key) and how many
/// generator blocks (a Philox4x32 block is four 32-bit words) have been drawn since it was set.
///
/// Returns:
///     tuple[int, int]: ``(seed, offset)``, both in ``[0, 2**64)``.
#[pyfunction]
fn get_rng_state() -> (u64, u64) {
    let s = rng::rng_state();
    (s.seed, s.offset)
}

/// Sets the calling thread's generator state, for example to one ``get_rng_state()``
/// returned earlier (then the same draws follow).
///
/// Args:
///     state: a ``(seed, offset)`` pair of ints in ``[0, 2**64)``.
///
/// Raises:
///     ConfigError: anything else, naming the value.
///
/// Example:
///     >>> import riftco
///     >>> state = riftco.get_rng_state()
///     >>> riftco.set_rng_state(state)
#[pyfunction]
fn set_rng_state(state: &Bound<'_, PyAny>) -> PyResult<()> {
    let pair = state
        .extract::<(Bound<'_, PyAny>, Bound<'_, PyAny>)>()
        .map_err(|_| {
            Exc::Config.err(format!(
                "set_rng_state: state must be a (seed, offset) pair of ints; got {}",
                state.repr().map_or_else(|_| "?".into(), |r| r.to_string())
            ))
        })?;
    let seed = u64_arg(&pair.0, "set_rng_state: seed")?;
    let offset = u64_arg(&pair.1, "set_rng_state: offset")?;
    rng::set_rng_state(RngState { seed, offset });
    Ok(())
}
