//! Dropout with a counter-based mask (Srivastava et al. 2014, "Dropout: A Simple Way to Prevent
//! Neural Networks from Overfitting", with inverted scaling): the mask is a pure function of the
//! [`DropoutMask`] parameters and the element index (Philox4x32-10, see
//! [`riftco_tensor::backend::DropoutMask`]), so the VJP — and any replay of the forward, such as
//! a checkpoint recomputation — regenerates exactly the same mask without storing it.

use super::{backend, evaluate_value, placeholder, ACT, GRAD};
use crate::error::Result;
use crate::variable::{Saves, Variable};
use riftco_tensor::backend::check_dropout;
pub use riftco_tensor::backend::DropoutMask;

/// `y[e] = x[e] / (1 − p)` where `mask` keeps element `e` (its row-major linear index in `x`),
/// exactly 0 where it drops it; any shape, `f32`. VJP: the same mask applied to the gradient,
/// `dx = g ⊙ M / (1 − p)`. With `p == 0` the input itself is returned (no node, no kernel).
///
/// # Errors
/// [`riftco_tensor::TensorError::InvalidArgument`] naming `p` when `mask.p` is not finite or not
/// in `[0, 1)`.
pub fn dropout(x: &Variable, mask: DropoutMask) -> Result<Variable> {
    dropout_impl(x, mask, true)
}

/// [`dropout()`] recorded for the VJP only (see the module of [`crate::ops`], "Graph-only
/// variants"): the node and its VJP are [`dropout()`]'s, whose VJP reads only the mask, but the
/// forward kernel is skipped and the value is a placeholder holding no data — for the tail of a
/// checkpoint replay, whose output value nothing reads.
///
/// # Errors
/// As [`dropout()`].
pub fn dropout_graph_only(x: &Variable, mask: DropoutMask) -> Result<Variable> {
    dropout_impl(x, mask, false)
}

fn dropout_impl(x: &Variable, mask: DropoutMask, evaluate: bool) -> Result<Variable> {
    check_dropout("dropout", Some(&mask))?;
    if mask.is_identity() {
        return Ok(x.clone());
    }
    let be = backend("dropout", &[x])?;
    let value = if evaluate_value(evaluate, &[x]) {
        be.dropout("dropout", x.value(), &mask, ACT)?
    } else {
        // Never read (graph-only): a placeholder without memory.
        placeholder(be, x.value().shape().clone())?
    };
    Ok(Variable::from_op_saving(
        "dropout",
        value,
        vec![x.clone()],
        Saves::NOTHING,
        move |_, _, g| Ok(vec![Some(be.dropout("dropout (vjp)", g, &mask, GRAD)?)]),
    ))
}

/// The stream of masks drawn through [`dropout_random`] and [`dropout_seeded`] (a transformer
/// model's own sites use streams whose first word is 1 or more).
const FUNCTIONAL_STREAM: [u32; 2] = [0, 0];

/// The Philox key of a `u64` seed: [`crate::rng::splitmix64`] of the seed split into
/// `[low 32 bits, high 32 bits]`, so nearby seeds give unrelated keys.
pub fn philox_key(seed: u64) -> [u32; 2] {
    let z = crate::rng::splitmix64(seed);
    [z as u32, (z >> 32) as u32]
}

/// [`dropout()`] with probability `p` whose mask is drawn from this thread's generator
/// ([`crate::rng`]): it reserves `ceil(numel / 4)` Philox blocks and uses the key of the
/// generator's seed ([`philox_key`]) at the reserved offset. Inside a checkpoint with
/// `preserve_rng_state` (the default) the replay reserves the same blocks, so it draws the same
/// mask; `p == 0` draws nothing.
///
/// # Errors
/// `InvalidArgument` naming `p` outside `[0, 1)` or not finite;
/// [`crate::AutogradError::RngOffsetOverflow`] when the generator's offset would overflow.
pub fn dropout_random(x: &Variable, p: f32) -> Result<Variable> {
    let mask = DropoutMask {
        p,
        key: [0, 0],
        stream: FUNCTIONAL_STREAM,
        offset: 0,
    };
    check_dropout("dropout", Some(&mask))?;
    if mask.is_identity() {
        return Ok(x.clone());
    }
    let blocks = (x.value().numel() as u64).div_ceil(4);
    let state = crate::rng::reserve(blocks)?;
    dropout(
        x,
        DropoutMask {
            key: philox_key(state.seed),
            offset: state.offset,
            ..mask
        },
    )
}

/// [`dropout()`] with probability `p` and the mask of `seed` alone (key [`philox_key`]`(seed)`,
/// offset 0): the same seed gives the same mask for the same shape on every call, independent of
/// the thread's generator.
///
/// # Errors
/// `InvalidArgument` naming `p` outside `[0, 1)` or not finite.
pub fn dropout_seeded(x: &Variable, p: f32, seed: u64) -> Result<Variable> {
    dropout(
        x,
        DropoutMask {
            p,
            key: philox_key(seed),
            stream: FUNCTIONAL_STREAM,
            offset: 0,
        },
    )
}
