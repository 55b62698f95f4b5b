//! The thread's random-number generator state, which random ops (dropout) and checkpoint
//! callables draw from, like PyTorch's default generator.
//!
//! The state is a counter, not a stream: [`RngState`] is a seed (the key of a counter-based
//! generator such as Philox4x32-10) and an offset counted in generator blocks. An op that needs
//! `n` blocks calls [`reserve`]`(n)`, gets the state before the call and uses the blocks
//! `offset..offset + n` of that seed; the next op gets the following ones. A draw is therefore a
//! pure function of the state it reserved, never of how many threads compute it or in which
//! order tiles run.
//!
//! The state is per thread: a forward pass, its backward and every checkpoint replay run on the
//! thread that called them, so a graph's draws never depend on what other threads do
//! (two threads training two models do not perturb each other's streams). A new thread starts at
//! seed 0, offset 0.
//!
//! [`crate::checkpoint_with_options`] with `preserve_rng_state` (the default) records the state
//! before the forward run of its callable, sets it again for the replay, and afterwards restores
//! the state the thread had before the replay, so a replay draws what the forward drew and
//! leaves the user's stream untouched ([`fork_rng`] is the same save-and-restore).

use crate::error::{AutogradError, Result};
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A generator position: the seed (key) and the offset in generator blocks (a Philox4x32 block
/// is four 32-bit words).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RngState {
    /// The key of the counter-based generator.
    pub seed: u64,
    /// How many generator blocks have been reserved since the seed was set.
    pub offset: u64,
}

thread_local! {
    static STATE: Cell<RngState> = const { Cell::new(RngState { seed: 0, offset: 0 }) };
}

/// Seeds this thread's generator: the state becomes `{ seed, offset: 0 }`.
pub fn manual_seed(seed: u64) {
    set_rng_state(RngState { seed, offset: 0 });
}

/// This thread's generator state.
pub fn rng_state() -> RngState {
    STATE.with(Cell::get)
}

/// Sets this thread's generator state (for example one returned by [`rng_state`] earlier).
pub fn set_rng_state(state: RngState) {
    STATE.with(|s| s.set(state));
}

/// Reserves `blocks` generator blocks: returns the state before the call (the caller uses the
/// blocks `offset..offset + blocks` of `seed`) and advances this thread's offset by `blocks`.
///
/// # Errors
/// [`AutogradError::RngOffsetOverflow`] when `offset + blocks` does not fit in a `u64`; the
/// state is left unchanged (the counter never wraps, so no block is ever handed out twice).
pub fn reserve(blocks: u64) -> Result<RngState> {
    STATE.with(|s| {
        let before = s.get();
        let offset = before
            .offset
            .checked_add(blocks)
            .ok_or(AutogradError::RngOffsetOverflow {
                offset: before.offset,
                blocks,
            })?;
        s.set(RngState { offset, ..before });
        Ok(before)
    })
}

/// SplitMix64's output function (Steele, Lea and Flood 2014, "Fast Splittable Pseudorandom
/// Number Generators", OOPSLA; the `mix64` finaliser of Java's `SplittableRandom`) applied to
/// `z + γ` with the golden-ratio increment `γ = 0x9e3779b97f4a7c15`: the first output of a
/// SplitMix64 generator seeded with `z`. Keys of the counter-based generator are derived with it.
pub fn splitmix64(z: u64) -> u64 {
    let mut z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What the checkpoints running on this thread record of, or replay from, [`draw_counter`].
enum CounterFrame {
    /// A checkpoint's forward run (with `preserve_rng_state`): the values it drew, in order.
    Record(Vec<u64>),
    /// A checkpoint's replay: the values its forward run drew, handed out again in order.
    Replay { values: Arc<[u64]>, cursor: usize },
}

thread_local! {
    static COUNTER_FRAMES: RefCell<Vec<CounterFrame>> = const { RefCell::new(Vec::new()) };
}

/// The next value of `counter` (the value before it advances by 1), for keys of random ops that
/// a counter rather than the thread's generator selects — a model's dropout step, whose key
/// picks the masks of one training forward. Like the generator, it is replay-exact: inside a
/// checkpoint with `preserve_rng_state`, the forward run's draws are recorded and the replay is
/// handed the same values in the same order (and `counter` does not advance), so a checkpoint
/// callable that runs a whole model's training forward replays that forward's masks.
///
/// # Errors
/// [`AutogradError::CounterOverflow`] naming `what` when `counter` is `u64::MAX` (it never
/// wraps); the counter is unchanged.
pub fn draw_counter(counter: &AtomicU64, what: &'static str) -> Result<u64> {
    COUNTER_FRAMES.with(|frames| {
        let mut frames = frames.borrow_mut();
        let replay = frames
            .iter()
            .rposition(|f| matches!(f, CounterFrame::Replay { .. }));
        let replayed = replay.and_then(|i| match &mut frames[i] {
            CounterFrame::Replay { values, cursor } => {
                let v = values.get(*cursor).copied();
                *cursor += 1;
                v
            }
            CounterFrame::Record(_) => None,
        });
        let value = match replayed {
            Some(v) => v,
            None => counter
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_add(1))
                .map_err(|_| AutogradError::CounterOverflow { what })?,
        };
        // Every checkpoint recording above the innermost replay (nested forward runs) saw it.
        for f in frames[replay.map_or(0, |i| i + 1)..].iter_mut() {
            if let CounterFrame::Record(values) = f {
                values.push(value);
            }
        }
        Ok(value)
    })
}

/// Pops the counter frame it pushed when dropped (also on errors and panics).
pub(crate) struct CounterFrameGuard {
    popped: bool,
}

impl CounterFrameGuard {
    /// Starts recording the values [`draw_counter`] hands out (a checkpoint's forward run).
    pub(crate) fn record() -> Self {
        COUNTER_FRAMES.with(|f| f.borrow_mut().push(CounterFrame::Record(Vec::new())));
        Self { popped: false }
    }

    /// Hands out `values` again, in order (a checkpoint's replay).
    pub(crate) fn replay(values: Arc<[u64]>) -> Self {
        COUNTER_FRAMES.with(|f| {
            f.borrow_mut()
                .push(CounterFrame::Replay { values, cursor: 0 })
        });
        Self { popped: false }
    }

    /// Ends a recording: the values drawn since [`CounterFrameGuard::record`].
    pub(crate) fn finish(mut self) -> Arc<[u64]> {
        self.popped = true;
        match COUNTER_FRAMES.with(|f| f.borrow_mut().pop()) {
            Some(CounterFrame::Record(values)) => values.into(),
            _ => Arc::from(Vec::new()),
        }
    }
}

impl Drop for CounterFrameGuard {
    fn drop(&mut self) {
        if !self.popped {
            COUNTER_FRAMES.with(|f| {
                f.borrow_mut().pop();
            });
        }
    }
}

/// Sets the thread's state back to the one it had when created (also on errors and panics).
pub(crate) struct RestoreRng(RngState);

impl RestoreRng {
    /// Remembers the current state.
    pub(crate) fn save() -> Self {
        RestoreRng(rng_state())
    }
}

impl Drop for RestoreRng {
    fn drop(&mut self) {
        set_rng_state(self.0);
    }
}

/// Runs `f` and then restores this thread's generator state to what it was before, whatever
/// `f` drew or seeded (also when `f` panics), like `torch.random.fork_rng`.
pub fn fork_rng<T>(f: impl FnOnce() -> T) -> T {
    let _restore = RestoreRng::save();
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_hands_out_consecutive_blocks_and_seed_resets_the_offset() {
        manual_seed(7);
        assert_eq!(reserve(3).unwrap(), RngState { seed: 7, offset: 0 });
        assert_eq!(reserve(0).unwrap(), RngState { seed: 7, offset: 3 });
        assert_eq!(reserve(5).unwrap(), RngState { seed: 7, offset: 3 });
        assert_eq!(rng_state(), RngState { seed: 7, offset: 8 });
        manual_seed(9);
        assert_eq!(rng_state(), RngState { seed: 9, offset: 0 });
    }

    #[test]
    fn the_state_is_per_thread_and_starts_at_zero() {
        manual_seed(11);
        reserve(4).unwrap();
        let other = std::thread::spawn(rng_state).join().unwrap();
        assert_eq!(other, RngState::default());
        assert_eq!(
            rng_state(),
            RngState {
                seed: 11,
                offset: 4
            }
        );
    }

    #[test]
    fn fork_rng_restores_the_state() {
        manual_seed(1);
        reserve(2).unwrap();
        let inner = fork_rng(|| {
            manual_seed(5);
            reserve(10).unwrap()
        });
        assert_eq!(inner, RngState { seed: 5, offset: 0 });
        assert_eq!(rng_state(), RngState { seed: 1, offset: 2 });
    }
}
