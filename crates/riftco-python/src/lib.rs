//! `riftco._native`: the PyO3 extension module behind the `riftco` Python package.
//!
//! One file per API area; this file only registers them. The pure-Python layer in
//! `python/riftco/` re-exports what is public, and `python/riftco/_native/*.pyi` types it.
//!
//! - `errors`: the exception hierarchy, error mapping, GIL release and panic guard.
//! - `variable`: `Variable` and NumPy conversions; `functional`: differentiable ops
//!   (`functional_math`: broadcasting arithmetic, maps, reductions, `Variable`'s operators);
//!   `checkpoint`: `checkpoint()` with a Python callable and `named()`; `rng`: the thread's
//!   generator state (`manual_seed`, `get_rng_state`, `set_rng_state`); `draws`: `uniform` and
//!   `normal` leaves drawn from it; `embedding`: `functional.embedding`; `grad_mode`: the
//!   thread's graph-recording switch; `discovery`: node identities for checkpoint dependency
//!   discovery.
//! - `config`, `model`: `TransformerConfig`, `DecoderOnlyTransformer`, `DecodeSession`;
//!   `policy`: activation-checkpointing policy arguments, plans as dicts, the policy tables.
//! - `gguf`: GGUF metadata, tensor infos and dequantized tensors (`read_gguf_metadata`, ...).
//! - `optim`: `Adam`, `AdamW`; `memory`: `memory_stats()`; `kernels`: raw kernels on NumPy;
//!   `devices`: the test backend switch.

use pyo3::prelude::*;

mod checkpoint;
mod config;
mod decode_session;
mod devices;
mod discovery;
mod draws;
mod embedding;
mod errors;
mod functional;
mod functional_layout;
mod functional_math;
mod gguf;
mod grad_mode;
mod kernels;
mod memory;
mod model;
mod model_lora;
mod model_state;
mod optim;
mod optim_state;
mod policy;
mod quant;
mod residency;
mod rng;
mod tokens;
mod transfer;
mod variable;

/// The native half of `riftco`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    kernels::register(m)?;
    variable::register(m)?;
    functional::register(m)?;
    embedding::register(m)?;
    grad_mode::register(m)?;
    draws::register(m)?;
    discovery::register(m)?;
    checkpoint::register(m)?;
    rng::register(m)?;
    config::register(m)?;
    model::register(m)?;
    gguf::register(m)?;
    policy::register(m)?;
    optim::register(m)?;
    memory::register(m)?;
    devices::register(m)?;
    quant::register(m)?;
    Ok(())
}
